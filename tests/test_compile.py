"""The committed pipeline YAML is fresh, and it is what OpenShift AI needs: documented parameters, a per-run
ReadWriteMany PVC mounted where the stages expect it, no run-time installs, one runtime image, no secrets."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_module

from common.run_layout import CLUSTER_WORKSPACE
from common.tracking import SECRET_KEYS as MLFLOW_SECRET_KEYS
from components.run_form.table import PIPELINE_NAME, RUN_PARAMETERS
from components.runtime_image import DEFAULT_IMAGE, IMAGE_ENV_VAR, runtime_image
from pipelines.compile import DEFAULT_OUTPUT
from pipelines.fine_tune import DATA_CONNECTION_KEYS
from tests.yaml_files import read_yaml_documents

COMMITTED = REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml"
ROOT = None  # owner of the root DAG in the helpers below
PVC_STUB_PREFIXES = ("exec-createpvc", "exec-deletepvc")  # kfp-kubernetes tasks the backend driver runs itself
PVC_TASKS = {
    "resolve-storage-class",
    "createpvc",
    "use-existing-pvc",
    "workspace-pvc",
    "deletepvc",
    "deletepvc-2",
    "deletepvc-3",
    "deletepvc-4",
}
CHANNEL = re.compile(r"inputs\.parameter_values\['([^']+)'\]")
TOKEN_NAME = re.compile(r"(^|_)token($|_)", re.IGNORECASE)  # hf_token_secret, api_token; not max_new_tokens


def compile_cli(*args, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m pipelines.compile`` in a real subprocess; LLM_FT_IMAGE is unset unless ``env`` sets it."""
    full_env = {k: v for k, v in os.environ.items() if k != IMAGE_ENV_VAR}
    full_env.update(env or {})
    return run_module("pipelines.compile", *args, env=full_env, timeout=timeout)


def is_pvc_stub(label: str) -> bool:
    return label.startswith(PVC_STUB_PREFIXES)


def load(path: Path) -> tuple[dict, dict]:
    """The pipeline spec and the kubernetes platform spec of a compiled YAML."""
    pipeline, platform = read_yaml_documents(path)
    return pipeline, platform["platforms"]["kubernetes"]


def executor_images(path: Path) -> dict[str, str]:
    pipeline, _ = load(path)
    return {
        label: executor["container"]["image"] for label, executor in pipeline["deploymentSpec"]["executors"].items()
    }


@pytest.fixture(scope="module")
def spec():
    return load(COMMITTED)[0]


@pytest.fixture(scope="module")
def platform():
    return load(COMMITTED)[1]


def dags(spec):
    """(owner, dag) for the root DAG (owner ROOT) and every DAG component."""
    yield ROOT, spec["root"]["dag"]
    for name, component in spec["components"].items():
        if "dag" in component:
            yield name, component["dag"]


def all_tasks(spec):
    """(owner, task name, task) for every task at every nesting level."""
    for owner, dag in dags(spec):
        for name, task in dag["tasks"].items():
            yield owner, name, task


def find_task(spec, wanted):
    (found,) = [(owner, task) for owner, name, task in all_tasks(spec) if name == wanted]
    return found


def parent_of(spec, component):
    """The (owner, task name, task) that runs DAG component ``component``."""
    (found,) = [
        (owner, name, task) for owner, name, task in all_tasks(spec) if task["componentRef"]["name"] == component
    ]
    return found


def source(spec, owner, task, input_name):
    """Where a task input comes from, followed up to the root: ('param', name), ('task', producer, key)
    or ('constant', v)."""
    binding = task["inputs"]["parameters"][input_name]
    if "componentInputParameter" in binding:
        if owner is ROOT:
            return ("param", binding["componentInputParameter"])
        parent_owner, _, parent_task = parent_of(spec, owner)
        return source(spec, parent_owner, parent_task, binding["componentInputParameter"])
    if "taskOutputParameter" in binding:
        return (
            "task",
            binding["taskOutputParameter"]["producerTask"],
            binding["taskOutputParameter"]["outputParameterKey"],
        )
    return ("constant", binding["runtimeValue"]["constant"])


def guards(spec, task_name) -> set[str]:
    """Every condition a task runs under, written in terms of pipeline parameters and task outputs."""
    found = set()
    owner, _ = find_task(spec, task_name)
    while owner is not ROOT:
        owner, _, condition_task = parent_of(spec, owner)
        condition = condition_task.get("triggerPolicy", {}).get("condition")
        if condition:

            def name(match, owner=owner, condition_task=condition_task):
                origin = source(spec, owner, condition_task, match.group(1))
                return origin[1] if origin[0] == "param" else ".".join(origin[1:])

            found.add(CHANNEL.sub(name, condition))
    return found


def outermost(spec, task_name):
    """The root-level task (the task itself or its enclosing condition) that ``task_name`` runs inside."""
    owner, task = find_task(spec, task_name)
    name = task_name
    while owner is not ROOT:
        owner, name, task = parent_of(spec, owner)
    return name, task


def workspace_tasks(spec):
    """Tasks that read or write the workspace: those given a workspace_root."""
    return {
        name: (owner, task)
        for owner, name, task in all_tasks(spec)
        if "workspace_root" in task.get("inputs", {}).get("parameters", {})
    }


def test_committed_yaml_is_fresh():
    """Users upload compiled/fine_tune_pipeline.yaml; it must be exactly what the current code compiles to."""
    assert DEFAULT_OUTPUT == COMMITTED
    result = compile_cli("--check")
    assert result.returncode == 0, result.stderr
    assert f"{COMMITTED} is up to date" in result.stdout


def test_building_the_pipeline_reads_no_frames_source_and_kfps_errors_still_name_the_setter(monkeypatch):
    """kfp's task setters ask ``inspect.stack()`` for their own name (pipelines/caller_names.py). Building the
    pipeline must walk no frame's source or module, and the error a setter raises on a task that is not a container
    must still name that setter."""
    import inspect

    from kfp import dsl

    from pipelines.fine_tune import build_pipeline
    from pipelines.workspace import ClusterWorkspace

    def refuse(*args, **kwargs):
        raise AssertionError("inspect read the stack's sources while the pipeline was built")

    for name in ("getouterframes", "getframeinfo", "getmodule"):
        monkeypatch.setattr(inspect, name, refuse)
    assert build_pipeline(ClusterWorkspace()).name == PIPELINE_NAME
    monkeypatch.undo()

    errors = []

    @dsl.pipeline
    def with_an_importer():
        task = dsl.importer(artifact_uri="s3://bucket/model", artifact_class=dsl.Model)
        with pytest.raises(ValueError) as error:
            task.set_cpu_limit("1")
        errors.append(str(error.value))

    assert errors == [
        "set_cpu_limit can only be used on single-step components, not pipelines used as components, or special "
        "components like importers."
    ]


def test_check_fails_on_a_stale_copy_without_touching_it(tmp_path):
    """--check must catch a hand-edited or outdated YAML, say how to fix it, and never rewrite the file."""
    fresh = tmp_path / "fresh.yaml"
    result = compile_cli("--output", fresh)
    assert result.returncode == 0, result.stderr
    assert f"wrote {fresh}" in result.stdout
    assert fresh.read_text() == COMMITTED.read_text()

    stale = tmp_path / "stale.yaml"
    stale.write_text(fresh.read_text().replace("defaultValue: 20Gi", "defaultValue: 10Gi"))
    before = stale.read_bytes()
    result = compile_cli("--check", "--output", stale)
    assert result.returncode == 1
    assert f"{stale} is stale" in result.stderr
    assert "python -m pipelines.compile" in result.stderr
    assert stale.read_bytes() == before

    result = compile_cli("--check", "--output", fresh)
    assert result.returncode == 0, result.stderr


def test_check_names_a_yaml_compiled_by_another_kfp(tmp_path):
    """A kfp release other than the lock's writes its own sdkVersion: --check names both versions and points at
    the environment (`make install`) before the pipeline, since recompiling there would commit the wrong kfp's YAML."""
    installed = f"kfp-{importlib.metadata.version('kfp')}"
    other = tmp_path / "other-kfp.yaml"
    other.write_text(COMMITTED.read_text().replace(f"sdkVersion: {installed}\n", "sdkVersion: kfp-2.17.0rc9\n"))
    assert other.read_text() != COMMITTED.read_text()
    result = compile_cli("--check", "--output", other)
    assert result.returncode == 1
    assert f"{other} was compiled with kfp-2.17.0rc9 and this environment has {installed}" in result.stderr
    assert "`make install`" in result.stderr and "python -m pipelines.compile" in result.stderr


def test_check_fails_when_the_file_is_missing(tmp_path):
    """A missing YAML is stale too, not a crash."""
    result = compile_cli("--check", "--output", tmp_path / "absent.yaml")
    assert result.returncode == 1
    assert "is stale" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "absent.yaml").exists()


def test_image_flag_sets_every_runtime_executor(tmp_path):
    """--image is how users point the pipeline at the image they pushed; every step must run in it."""
    out = tmp_path / "p.yaml"
    result = compile_cli("--image", "registry.example.com/me/ft:1.2", "--output", out)
    assert result.returncode == 0, result.stderr
    images = executor_images(out)
    assert {images[label] for label in images if not is_pvc_stub(label)} == {"registry.example.com/me/ft:1.2"}
    pipeline, _ = load(out)
    owner, train = find_task(pipeline, "train-model")
    assert source(pipeline, owner, train, "image") == (
        "constant",
        "registry.example.com/me/ft:1.2",
    )  # the training pods' image too


def test_image_env_var_and_flag_precedence(tmp_path):
    """LLM_FT_IMAGE overrides the default; an explicit --image beats the environment."""
    by_env = tmp_path / "env.yaml"
    result = compile_cli("--output", by_env, env={IMAGE_ENV_VAR: "registry.example.com/env/ft:2"})
    assert result.returncode == 0, result.stderr
    assert {img for label, img in executor_images(by_env).items() if not is_pvc_stub(label)} == {
        "registry.example.com/env/ft:2"
    }

    both = tmp_path / "both.yaml"
    result = compile_cli(
        "--image",
        "registry.example.com/flag/ft:3",
        "--output",
        both,
        env={IMAGE_ENV_VAR: "registry.example.com/env/ft:2"},
    )
    assert result.returncode == 0, result.stderr
    assert {img for label, img in executor_images(both).items() if not is_pvc_stub(label)} == {
        "registry.example.com/flag/ft:3"
    }


def test_runtime_image_default_and_blank_env(monkeypatch):
    """An unset or blank LLM_FT_IMAGE means the project's image, never an empty image reference."""
    monkeypatch.delenv(IMAGE_ENV_VAR, raising=False)
    assert runtime_image() == DEFAULT_IMAGE
    monkeypatch.setenv(IMAGE_ENV_VAR, "   ")
    assert runtime_image() == DEFAULT_IMAGE
    monkeypatch.setenv(IMAGE_ENV_VAR, " quay.io/x/y:1 ")
    assert runtime_image() == "quay.io/x/y:1"


def test_every_executor_uses_the_runtime_image(spec):
    """One image for every step: a step in another image would run different code or lack the project.
    Only the kfp-kubernetes PVC stubs, which the backend handles without a container, differ."""
    executors = spec["deploymentSpec"]["executors"]
    stubs = {
        label
        for label, e in executors.items()
        if "command" not in e["container"] and e["container"]["image"].startswith("argostub/")
    }
    assert (
        stubs == {label for label in executors if is_pvc_stub(label)} and len(stubs) == 5
    )  # create, and delete on each of 4 paths
    assert {e["container"]["image"] for label, e in executors.items() if label not in stubs} == {DEFAULT_IMAGE}
    assert len(executors) - len(stubs) >= 5


def test_no_package_installs_at_run_time(spec):
    """Steps must use what the image has; a pip install at run time is slow, needs network and drifts."""
    pip = re.compile(r"pip3?\s+install|-m\s+pip\b")
    for label, executor in spec["deploymentSpec"]["executors"].items():
        container = executor["container"]
        text = " ".join(container.get("command", []) + container.get("args", []))
        assert not pip.search(text), label
    assert not pip.search(COMMITTED.read_text())


def test_hub_token_comes_only_from_the_secret(tmp_path, platform):
    """A Hub token must come from the Kubernetes Secret at run time, never be baked into the uploaded YAML:
    a canary token in the compiling environment appears nowhere in it, and HF_TOKEN is only ever a Secret mapping."""
    canary = "hf_CANARY_compile_0123456789"
    out = tmp_path / "p.yaml"
    result = compile_cli("--output", out, env={"HF_TOKEN": canary})
    assert result.returncode == 0, result.stderr
    assert canary not in out.read_text() + result.stdout + result.stderr
    assert "hf_" not in COMMITTED.read_text().replace("hf_token", "")  # no token-looking string at all
    pipeline, _ = load(COMMITTED)
    assert not [name for name in pipeline["root"]["inputDefinitions"]["parameters"] if TOKEN_NAME.search(name)]
    token_inputs = [
        (name, task)
        for owner, name, task in all_tasks(pipeline)
        for key in task.get("inputs", {}).get("parameters", {})
        if TOKEN_NAME.search(key)
    ]
    assert [(name, source(pipeline, *find_task(pipeline, name), "hf_token_secret")) for name, _ in token_inputs] == [
        ("train-model", ("constant", "hf-read-token"))  # the Secret's name, for the training pods
    ]
    # The only literal environment is the Hub cache on the PVC of the steps that read the benchmarks (the data step
    # checks the training rows against them, the evaluate step scores them); no token is a literal value.
    hub_cache = [{"name": "HF_HOME", "value": "/mnt/workspace/.cache/huggingface"}]
    assert {
        label: e["container"]["env"]
        for label, e in pipeline["deploymentSpec"]["executors"].items()
        if "env" in e.get("container", {})
    } == {"exec-evaluate-model": hub_cache, "exec-prepare-dataset": hub_cache}
    # Each Hub token is an optional Secret reference (which steps get which: SECRET_MOUNTS below).
    for label, executor in platform["deploymentSpec"]["executors"].items():
        for secret in executor.get("secretAsEnv", []):
            if secret.get("secretName") in ("hf-token", "hf-read-token"):
                assert secret["optional"] is True and secret["keyToEnv"][0]["secretKey"] == "HF_TOKEN", label


# Every Secret of the pipeline -> the steps that get it (executor labels without "exec-"; "-2" is the same step on
# the path that finishes a published version) -> how: the environment variables it fills, or the folder it is
# mounted at. A Secret a run parameter names is "param:NAME", one a task output names "output:TASK-OUTPUT".
# "train-model pods" are the training job's pods, which get the Secret the train step's hf_token_secret names.
# Each step gets only the Secrets it reads: hf-token, which may write to the Hub, reaches the publish step alone
# (and the first step, which checks that it exists).
AWS_KEYS = DATA_CONNECTION_KEYS  # an OpenShift AI data connection's keys
OCI_MOUNT = "/var/run/secrets/model-oci-registry"
OCI_PULL_MOUNT = "/var/run/secrets/model-oci-pull"
SECRET_MOUNTS = {
    "hf-token": {"validate-parameters": ("HF_TOKEN",), "publish-model": ("HF_TOKEN",)},
    "hf-read-token": {
        "validate-parameters": ("HF_READ_TOKEN",),  # the first step's presence check: HF_TOKEN there is hf-token
        "prepare-dataset": ("HF_TOKEN",),
        "check-data-changed": ("HF_TOKEN",),
        "tokenise-data": ("HF_TOKEN",),
        "train-model": ("HF_TOKEN",),  # the launcher's fit check reads the base model's config.json
        "train-model pods": ("HF_TOKEN",),
        "evaluate-model": ("HF_TOKEN",),
    },
    "param:data_connection_secret": {
        "validate-parameters": ("DATASET_URL",),
        "prepare-dataset": (*AWS_KEYS, "DATASET_URL"),
    },
    "param:model_s3_secret": {"store-model": AWS_KEYS, "store-model-2": AWS_KEYS},
    "param:model_oci_secret": {"store-model": OCI_MOUNT, "store-model-2": OCI_MOUNT},
    # model_oci_pull_secret, as the first step passes it on (a placeholder when it is empty): pull-only, for the
    # serve step's check that KServe can pull the image.
    "output:validate-parameters-pull_secret_volume": {"serve-model": OCI_PULL_MOUNT, "serve-model-2": OCI_PULL_MOUNT},
    # MLflow's credentials: the first step checks the server with them, the training pods (rank 0) and the evaluate
    # step log to it.
    "param:mlflow_secret": {
        step: MLFLOW_SECRET_KEYS for step in ("validate-parameters", "train-model pods", "evaluate-model")
    },
    "param:model_registry_secret": {
        step: ("MODEL_REGISTRY_TOKEN",)
        for step in ("register-model", "register-model-2", "serve-model", "serve-model-2")
    },
}


def secret_mounts(spec, platform) -> dict[str, dict[str, tuple[str, ...] | str]]:
    """Every Secret the compiled pipeline gives a step, in the shape of ``SECRET_MOUNTS``: the kubernetes platform
    spec's Secrets as environment variables and as volumes, and the Secret the train step's job pods get."""
    found: dict[str, dict[str, tuple[str, ...] | str]] = {}

    parameters = spec["root"]["inputDefinitions"]["parameters"]

    def add(name_of: dict, step: str, how) -> None:
        if "runtimeValue" in name_of:
            secret = name_of["runtimeValue"]["constant"]
        else:  # a run parameter, or a task's output passed down as "pipelinechannel--TASK-OUTPUT"
            channel = name_of["componentInputParameter"].removeprefix("pipelinechannel--")
            secret = f"param:{channel}" if channel in parameters else f"output:{channel}"
        assert step not in found.setdefault(secret, {}), (secret, step)  # one mount of a Secret per step
        found[secret][step] = how

    for label, executor in platform["deploymentSpec"]["executors"].items():
        step = label.removeprefix("exec-")
        for mounted in executor.get("secretAsEnv", []):
            add(mounted["secretNameParameter"], step, tuple(pair["envVar"] for pair in mounted["keyToEnv"]))
        for mounted in executor.get("secretAsVolume", []):
            add(mounted["secretNameParameter"], step, mounted["mountPath"])
    _, train = find_task(spec, "train-model")
    add(train["inputs"]["parameters"]["hf_token_secret"], "train-model pods", ("HF_TOKEN",))
    add(train["inputs"]["parameters"]["mlflow_secret"], "train-model pods", MLFLOW_SECRET_KEYS)
    return found


def test_each_secret_is_mounted_only_in_the_steps_that_read_it(spec, platform):
    """Least privilege, as compiled: the table of every Secret and the steps that get it is exactly
    ``SECRET_MOUNTS``, so a Secret added to a step that does not read it (or the write token anywhere but publish)
    fails here. All are optional: a missing one the run needs is named by the first step."""
    assert secret_mounts(spec, platform) == SECRET_MOUNTS
    for executor in platform["deploymentSpec"]["executors"].values():
        for mounted in executor.get("secretAsEnv", []) + executor.get("secretAsVolume", []):
            assert mounted["optional"] is True, mounted


def test_every_parameter_has_default_and_description(spec):
    """The run form shows these; a parameter without a default blocks one-click runs, one without a description
    is a guess."""
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert set(parameters) == {parameter.name for parameter in RUN_PARAMETERS}
    for name, definition in parameters.items():
        assert "defaultValue" in definition, name
        assert definition.get("isOptional") is True, name
        assert len(definition.get("description", "").split()) >= 4, name
    assert parameters["pvc_size"]["defaultValue"] == "20Gi"
    assert parameters["keep_pvc"]["defaultValue"] == "auto"


def test_the_docs_document_every_parameter(spec):
    """The run-parameter guide's table is what users read before filling the form."""
    page = (REPO_ROOT / "docs" / "guides" / "run-parameters.md").read_text()
    for name in spec["root"]["inputDefinitions"]["parameters"]:
        assert f"| `{name}` |" in page, name


def test_kfp_loads_the_yaml():
    """The file must be loadable by KFP itself (what an upload does), with its parameters intact."""
    from kfp import components

    loaded = components.load_component_from_file(str(COMMITTED))
    assert loaded.name == "llm-finetune"
    assert loaded.component_spec.inputs["pvc_size"].default == "20Gi"
    assert "kubernetes" in loaded.platform_spec.platforms


def test_create_pvc_is_read_write_many_sized_by_parameter(spec):
    """Training pods on several nodes share the workspace, so it must be RWX, sized by pvc_size,
    use the resolved StorageClass, and only be created when no existing PVC is named."""
    owner, task = find_task(spec, "createpvc")
    assert spec["components"][task["componentRef"]["name"]]["executorLabel"] == "exec-createpvc"
    assert source(spec, owner, task, "access_modes") == ("constant", ["ReadWriteMany"])
    assert source(spec, owner, task, "size") == ("param", "pvc_size")
    assert source(spec, owner, task, "storage_class_name") == ("task", "resolve-storage-class", "Output")
    owner, resolve = find_task(spec, "resolve-storage-class")
    assert source(spec, owner, resolve, "requested") == ("param", "pvc_storage_class")
    assert guards(spec, "createpvc") == {"pvc_name == ''"}
    assert guards(spec, "use-existing-pvc") == {"!(pvc_name == '')"}


def test_delete_pvc_guarded_by_keep_pvc_and_runs_last_on_every_path(spec):
    """The per-run PVC is deleted only when this run created it and the first step decided not to keep it
    (keep_pvc false, or auto with the model delivered elsewhere: ``keeps_workspace``), after the last stage of
    whichever path the run took: published, stopped by the quality gate, finishing the published version's steps
    on unchanged data, or skipped for unchanged data."""
    last = {
        "deletepvc": ({"data_changed", "gate_passed"}, "serve-model"),
        "deletepvc-2": ({"data_changed", "!gate_passed"}, "report-skipped"),
        "deletepvc-3": ({"finish"}, "serve-model-2"),
        "deletepvc-4": ({"unchanged"}, "report-skipped-2"),
    }
    for name, (path, after) in last.items():
        owner, task = find_task(spec, name)
        assert spec["components"][task["componentRef"]["name"]]["executorLabel"].startswith("exec-deletepvc")
        assert source(spec, owner, task, "pvc_name") == ("task", "workspace-pvc", "Output")
        assert guards(spec, name) == {"pvc_name == ''", "validate-parameters.keep_workspace == false"} | {
            PATHS[step] for step in path
        }, name
        assert after in waits_for(spec, name), name


def waits_for(spec, task_name) -> set[str]:
    """Every task ``task_name`` waits for, itself or through the condition groups enclosing it."""
    owner, task = find_task(spec, task_name)
    found = set(task.get("dependentTasks", []))
    while owner is not ROOT:
        owner, _, task = parent_of(spec, owner)
        found |= set(task.get("dependentTasks", []))
    return found


PATHS = {
    "data_changed": "check-data-changed.changed == true",
    # dsl.Elif / dsl.Else after it: the data has not changed, and the published version's steps after publish
    # are to be finished, or are not.
    "finish": "!(check-data-changed.changed == true) && check-data-changed.finish == true",
    "unchanged": "!(check-data-changed.changed == true) && !(check-data-changed.finish == true)",
    "gate_passed": "evaluate-model.gate_passed == true",
    "!gate_passed": "!(evaluate-model.gate_passed == true)",
}


def test_stages_run_in_order_under_their_decisions(spec):
    """Training runs only on changed data (or force); export and publish only after a passed quality gate;
    each skip leaves a node in the run graph that says why."""
    expected = {
        "prepare-dataset": set(),
        "check-data-changed": set(),
        "train-model": {"data_changed"},
        "evaluate-model": {"data_changed"},
        "export-gguf": {"data_changed", "gate_passed"},
        "publish-model": {"data_changed", "gate_passed"},
        "report-skipped": {"data_changed", "!gate_passed"},
        "store-model-2": {"finish"},
        "register-model-2": {"finish"},
        "serve-model-2": {"finish"},
        "report-skipped-2": {"unchanged"},
    }
    for name, path in expected.items():
        assert guards(spec, name) == {PATHS[step] for step in path}, name
    owner, check = find_task(spec, "check-data-changed")
    assert source(spec, owner, check, "fingerprint") == ("task", "prepare-dataset", "fingerprint")
    assert source(spec, owner, check, "force") == ("param", "force")
    owner, evaluate = find_task(spec, "evaluate-model")
    assert source(spec, owner, evaluate, "base_model") == (
        "task",
        "train-model",
        "base_model",
    )  # compared with what was trained
    assert source(spec, owner, evaluate, "train_dir") == ("task", "train-model", "train_dir")
    owner, publish = find_task(spec, "publish-model")
    assert "export-gguf" in publish["dependentTasks"]
    owner, skipped = find_task(spec, "report-skipped")
    assert source(spec, owner, skipped, "reason") == ("task", "evaluate-model", "gate_reason")
    owner, skipped = find_task(spec, "report-skipped-2")
    assert source(spec, owner, skipped, "reason") == ("task", "check-data-changed", "reason")


def test_unchanged_data_finishes_the_published_versions_steps_after_publish_without_training(spec, platform):
    """When the run that published the model failed after publishing, a run on the same data runs store, register
    and serve on that version (the check's run id and train directory), wired as after a publish, with the same
    Secrets and sizes, and nothing that trains."""
    for step in ("store-model", "register-model", "serve-model"):
        owner, task = find_task(spec, f"{step}-2")
        assert source(spec, owner, task, "run_id") == ("task", "check-data-changed", "version_run_id"), step
        assert source(spec, owner, task, "train_dir") == ("task", "check-data-changed", "version_train_dir"), step
        assert source(spec, owner, task, "model_name") == ("param", "model_name"), step
        executors = platform["deploymentSpec"]["executors"]
        first, second = (executors[f"exec-{name}"] for name in (step, f"{step}-2"))
        assert first == second, step  # the same Secrets and the PVC as after a publish
    assert "store-model-2" in waits_for(spec, "register-model-2")
    assert "register-model-2" in waits_for(spec, "serve-model-2")
    trains = {"tokenise-data", "train-model", "evaluate-model", "export-gguf", "publish-model"}
    assert not any(PATHS["finish"] in guards(spec, name) for name in trains)


def test_the_steps_after_publish_and_only_they_are_retried_besides_training(spec):
    """A network blip after publish must not leave the model on the Hub and nowhere else: store, register and serve
    (on both paths) have the retry policy of AFTER_PUBLISH_RETRY; the train step keeps its own; nothing else is
    retried (a retried publish could commit twice)."""
    from pipelines.fine_tune import TRAIN_STEP_RETRIES
    from pipelines.workspace import AFTER_PUBLISH_RETRY

    retried = {name: task["retryPolicy"] for _, name, task in all_tasks(spec) if "retryPolicy" in task}
    after_publish = {
        f"{step}{suffix}" for step in ("store-model", "register-model", "serve-model") for suffix in ("", "-2")
    }
    assert set(retried) == after_publish | {"train-model"}
    expected = {
        "maxRetryCount": AFTER_PUBLISH_RETRY["num_retries"],
        "backoffDuration": AFTER_PUBLISH_RETRY["backoff_duration"],
        "backoffFactor": AFTER_PUBLISH_RETRY["backoff_factor"],
        "backoffMaxDuration": AFTER_PUBLISH_RETRY["backoff_max_duration"],
    }
    assert expected == {
        "maxRetryCount": 2,
        "backoffDuration": "30s",
        "backoffFactor": 2.0,
        "backoffMaxDuration": "300s",
    }
    for name in after_publish:
        assert retried[name] == expected, name
    assert retried["train-model"]["maxRetryCount"] == TRAIN_STEP_RETRIES


def test_every_stage_option_defaults_to_its_dataclass(spec):
    """One source of truth: each stage option reaches its step from a run parameter whose default is the stage's
    options dataclass default, or, where the run form does not show it, as that default itself."""
    from components.evaluate.options import EvaluateOptions
    from components.export.options import ExportStageOptions
    from components.publish.options import PublishOptions
    from components.run_form.table import RUN_PARAMETERS
    from components.train.options import LaunchOptions
    from trainer.config import TrainConfig

    parameters = spec["root"]["inputDefinitions"]["parameters"]
    checked = 0
    for task_name, options in (
        ("train-model", TrainConfig()),
        ("train-model", LaunchOptions()),
        ("evaluate-model", EvaluateOptions()),
        ("export-gguf", ExportStageOptions()),
        ("publish-model", PublishOptions()),
    ):
        renamed = {p.name: p.field for p in RUN_PARAMETERS if p.options is type(options)}
        option_to_parameter = {option: parameter for parameter, option in renamed.items()}
        owner, task = find_task(spec, task_name)
        for name, binding in task["inputs"]["parameters"].items():
            if name not in options.__dataclass_fields__:
                continue
            default = getattr(options, name)
            default = list(default) if isinstance(default, tuple) else default
            origin = source(spec, owner, task, name)
            if origin[0] == "task":  # an earlier step's result (data_dir, the trained base model), not an option
                continue
            if origin[0] == "param":
                assert origin[1] == option_to_parameter.get(name, name), (task_name, name)
                assert parameters[origin[1]].get("defaultValue", "") == default, (task_name, name)
            else:
                assert origin == ("constant", default), (task_name, name)
            checked += 1
    assert checked >= 45


RESOURCE_CHANNEL = re.compile(r"^\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}$")
# Each stage step's pod size comes from its run parameters (request = limit); the rest have fixed small sizes.
STEP_RESOURCES = {
    "prepare-dataset": ("prepare_cpu", "prepare_memory"),
    "tokenise-data": ("tokenise_cpu", "tokenise_memory"),
    "train-model": ("train_launcher_cpu", "train_launcher_memory"),
    "evaluate-model": ("evaluate_cpu", "evaluate_memory"),
    "export-gguf": ("export_cpu", "export_memory"),
    "publish-model": ("publish_cpu", "publish_memory"),
    "store-model": ("publish_cpu", "publish_memory"),  # it uploads the same files, to the storage targets
    "store-model-2": ("publish_cpu", "publish_memory"),  # the same, finishing the published version's steps
}


def resource_source(spec, task_name, value):
    """Where a resource value comes from: ('param', name) or ('task', producer, key) through the task's own
    ``pipelinechannel--`` input, or ('constant', value)."""
    channel = RESOURCE_CHANNEL.match(value)
    if not channel:
        return ("constant", value)
    owner, task = find_task(spec, task_name)
    return source(spec, owner, task, channel.group(1))


def executor_of(spec, task_name):
    _, task = find_task(spec, task_name)
    label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
    return label, spec["deploymentSpec"]["executors"][label]


def test_every_step_has_cpu_and_memory_requests_and_limits(spec):
    """Namespaces with a ResourceQuota refuse pods without requests and limits, and a step without a memory
    limit can take a node's memory: every container step has both, for CPU and memory; the five stages take
    theirs from their run parameters, the bookkeeping steps have fixed small ones."""
    from components.run_form.table import RUN_PARAMETERS
    from pipelines.tasks import SMALL_STEP_CPU, SMALL_STEP_MEMORY

    parameters = {parameter.name for parameter in RUN_PARAMETERS}
    for _, name, task in all_tasks(spec):
        if "dag" in spec["components"][task["componentRef"]["name"]]:
            continue
        label, executor = executor_of(spec, name)
        if is_pvc_stub(label):
            continue
        resources = executor["container"]["resources"]
        cpu, memory = STEP_RESOURCES.get(name, (None, None))
        for field, parameter, fixed in (
            ("CpuRequest", cpu, SMALL_STEP_CPU),
            ("CpuLimit", cpu, SMALL_STEP_CPU),
            ("MemoryRequest", memory, SMALL_STEP_MEMORY),
            ("MemoryLimit", memory, SMALL_STEP_MEMORY),
        ):
            found = resource_source(spec, name, resources[f"resource{field}"])
            expected = ("param", parameter) if parameter else ("constant", fixed)
            assert found == expected, (name, field, found)
            if parameter:
                assert parameter in parameters, parameter


def test_every_dag_declares_the_inputs_its_tasks_read(spec):
    """A task that reads a parameter its DAG was never given fails at run time in the backend's driver;
    kfp 2.17 compiles such references for resource settings unless pipelines.tasks.consumes registers them."""
    for owner, dag in dags(spec):
        declared = (
            (spec["root"] if owner is ROOT else spec["components"][owner])
            .get("inputDefinitions", {})
            .get("parameters", {})
        )
        for name, task in dag["tasks"].items():
            for binding in task.get("inputs", {}).get("parameters", {}).values():
                if "componentInputParameter" in binding:
                    assert binding["componentInputParameter"] in declared, (owner, name, binding)


def test_evaluation_is_placed_like_the_training_pods(spec, platform):
    """The evaluate step's GPU count, node selector and tolerations come from the parameter check's outputs,
    which it derives from gpus_per_node, node_selector and tolerations: no hard-wired GPU or toleration, so
    gpus_per_node=0 evaluates on a CPU node. The same GPU count tells the step whether CUDA must work."""
    _, executor = executor_of(spec, "evaluate-model")
    accelerator = executor["container"]["resources"]["accelerator"]
    assert accelerator["resourceType"] == "nvidia.com/gpu"
    assert resource_source(spec, "evaluate-model", accelerator["resourceCount"]) == (
        "task",
        "validate-parameters",
        "evaluate_gpus",
    )
    owner, evaluate = find_task(spec, "evaluate-model")
    assert source(spec, owner, evaluate, "gpus") == ("task", "validate-parameters", "evaluate_gpus")
    settings = platform["deploymentSpec"]["executors"]["exec-evaluate-model"]
    assert pvc_source(spec, owner, settings["nodeSelector"]["nodeSelectorJson"]) == (
        "task",
        "validate-parameters",
        "node_selector",
    )
    (toleration,) = settings["tolerations"]
    assert set(toleration) == {"tolerationJson"}
    assert pvc_source(spec, owner, toleration["tolerationJson"]) == ("task", "validate-parameters", "tolerations")
    _, validate = find_task(spec, "validate-parameters")
    for name in ("gpus_per_node", "node_selector", "tolerations"):
        assert source(spec, ROOT, validate, name) == ("param", name)


@pytest.mark.parametrize(
    ("gpus_per_node", "node_selector", "tolerations", "expected"),
    [
        (
            1,
            "",
            "nvidia.com/gpu:NoSchedule",
            (1, {}, [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
        ),
        (8, "gpu=a100,zone=b", "", (1, {"gpu": "a100", "zone": "b"}, [])),
        (0, '{"pool": "cpu"}', "", (0, {"pool": "cpu"}, [])),
    ],
)
def test_the_parameter_check_derives_the_evaluation_placement(gpus_per_node, node_selector, tolerations, expected):
    """What the first step returns for the evaluate step's pod, from the same parsers the training pods use."""
    from components.run_form.table import RUN_PARAMETERS
    from pipelines.first_step import validate_parameters

    values = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}
    values.update(gpus_per_node=gpus_per_node, node_selector=node_selector, tolerations=tolerations)
    placement = validate_parameters.python_func(**values)
    assert (placement.evaluate_gpus, placement.node_selector, placement.tolerations) == expected


@pytest.mark.parametrize(
    ("step", "parameter"), [("prepare-dataset", "data_connection_secret"), ("store-model", "model_s3_secret")]
)
def test_the_data_connection_secret_is_a_run_parameter(spec, platform, step, parameter):
    """The prepare and store steps read S3 credentials from the Secret the run names, optional so a run without
    S3 data or an S3 target needs none; no credential is a parameter."""
    owner, task = find_task(spec, step)
    (connection,) = [
        secret
        for secret in platform["deploymentSpec"]["executors"][f"exec-{step}"]["secretAsEnv"]
        if "secretName" not in secret
    ]
    channel = connection["secretNameParameter"]["componentInputParameter"]
    assert channel == (parameter if owner is ROOT else f"pipelinechannel--{parameter}")
    if owner is not ROOT:
        assert source(spec, owner, task, "s3_secret") == ("param", parameter)
    assert connection["optional"] is True
    assert {entry["envVar"] for entry in connection["keyToEnv"]} >= {"AWS_ACCESS_KEY_ID", "AWS_S3_ENDPOINT"}


def test_no_storage_credential_in_the_compiling_environment_reaches_the_yaml(tmp_path):
    """S3 keys, registry credentials and the Model Registry token set where the pipeline is compiled stay out of
    the YAML and the output."""
    auth_file = tmp_path / "auth.json"
    auth_file.write_text('{"auths": {"quay.io": {"auth": "Q0FOQVJZLXJlZ2lzdHJ5"}}}')
    out = tmp_path / "p.yaml"
    canaries = {"AWS_SECRET_ACCESS_KEY": "CANARY-s3-key-compile", "REGISTRY_AUTH_FILE": str(auth_file)}
    canaries["MODEL_REGISTRY_TOKEN"] = "CANARY-model-registry-token"
    result = compile_cli("--output", out, env=canaries)
    assert result.returncode == 0, result.stderr
    text = out.read_text() + result.stdout + result.stderr
    assert "CANARY-s3-key-compile" not in text and "Q0FOQVJZLXJlZ2lzdHJ5" not in text and str(auth_file) not in text
    assert "CANARY-model-registry-token" not in text


def test_the_registry_secret_is_mounted_where_the_store_step_reads_it(spec, platform):
    """The push credentials of model_oci_secret (a dockerconfigjson Secret) reach the store step as files at the
    path it reads, optional so a run without an OCI target needs none; never as a parameter or variable."""
    from components.store.oci_target import SECRET_MOUNT

    owner, task = find_task(spec, "store-model")
    (mounted,) = platform["deploymentSpec"]["executors"]["exec-store-model"]["secretAsVolume"]
    assert mounted["mountPath"] == str(SECRET_MOUNT) and mounted["optional"] is True
    assert mounted["secretNameParameter"]["componentInputParameter"] == "pipelinechannel--model_oci_secret"
    assert source(spec, owner, task, "oci_secret") == ("param", "model_oci_secret")


def test_the_pull_secret_is_mounted_in_the_serve_steps_only(spec, platform):
    """model_oci_pull_secret, the read-only credential KServe's pods pull the modelcar with, reaches the serve steps
    (after publish, and in the branch that finishes a published version) as files where the pull check reads them,
    optional, and no other step; the serve steps get nothing of the push Secret model_oci_secret. KFP cannot mount
    a Secret of no name, so the name comes through the first step, which puts a placeholder for an empty one."""
    from components.serve.options import NO_PULL_SECRET
    from components.serve.pull_check import PULL_SECRET_MOUNT
    from components.store.oci_target import SECRET_MOUNT

    executors = platform["deploymentSpec"]["executors"]
    serve_tasks = [(owner, name, task) for owner, name, task in all_tasks(spec) if name.startswith("serve-model")]
    assert len(serve_tasks) == 2  # the new version's, and the finishing branch's
    serve_executors = {spec["components"][task["componentRef"]["name"]]["executorLabel"] for _, _, task in serve_tasks}
    pulls = {
        label: mount
        for label, executor in executors.items()
        for mount in executor.get("secretAsVolume", [])
        if mount["mountPath"] == str(PULL_SECRET_MOUNT)
    }
    assert set(pulls) == serve_executors
    for owner, name, task in serve_tasks:
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        (mounted,) = executors[label]["secretAsVolume"]  # the pull Secret, and no other
        assert mounted["optional"] is True and "secretName" not in mounted, name
        assert pvc_source(spec, owner, mounted["secretNameParameter"]) == (
            "task", "validate-parameters", "pull_secret_volume"
        ), name  # fmt: skip
        assert source(spec, owner, task, "pull_secret") == ("param", "model_oci_pull_secret"), name
        inputs = task["inputs"]["parameters"]
        assert not [key for key in inputs if source(spec, owner, task, key) == ("param", "model_oci_secret")], name
        assert "model_oci_secret" not in str(executors[label]), name
    push_mounts = {
        label
        for label, executor in executors.items()
        for mount in executor.get("secretAsVolume", [])
        if mount["mountPath"] == str(SECRET_MOUNT)
    }
    assert push_mounts and not push_mounts & serve_executors
    from pipelines.first_step import validate_parameters

    values = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}
    assert values["model_oci_pull_secret"] == ""  # by default, none: the placeholder, never created, is mounted
    assert validate_parameters.python_func(**values).pull_secret_volume == NO_PULL_SECRET
    values["model_oci_pull_secret"] = "oci-pull-models"
    assert validate_parameters.python_func(**values).pull_secret_volume == "oci-pull-models"


def test_the_registry_token_comes_from_the_secret_the_run_names(spec, platform):
    """The register step's token is MODEL_REGISTRY_TOKEN from key 'token' of model_registry_secret, optional (the
    service account's token stands in); it runs after the store step, whose artifacts it registers."""
    from components.register.stage import TOKEN_ENV, TOKEN_KEY

    owner, task = find_task(spec, "register-model")
    (token,) = platform["deploymentSpec"]["executors"]["exec-register-model"]["secretAsEnv"]
    assert token["keyToEnv"] == [{"secretKey": TOKEN_KEY, "envVar": TOKEN_ENV}] and token["optional"] is True
    assert token["secretNameParameter"]["componentInputParameter"] == "pipelinechannel--model_registry_secret"
    assert source(spec, owner, task, "url") == ("param", "model_registry_url")
    assert "store-model" in waits_for(spec, "register-model")
    # The serve step records its endpoint in the same registry, with the same token.
    owner, task = find_task(spec, "serve-model")
    assert platform["deploymentSpec"]["executors"]["exec-serve-model"]["secretAsEnv"] == [token]
    assert source(spec, owner, task, "registry_url") == ("param", "model_registry_url")
    for field in ("use_service_account", "allow_http"):  # the token's rules reach both steps
        assert source(spec, owner, task, f"registry_{field}") == ("param", f"model_registry_{field}")
        register = find_task(spec, "register-model")
        assert source(spec, *register, field) == ("param", f"model_registry_{field}")
    assert source(spec, owner, task, "deploy") == ("param", "deploy")
    assert "register-model" in waits_for(spec, "serve-model")


def test_a_lost_train_launcher_is_retried(spec):
    """The train step runs again when its pod is lost; the job it started is found by name and followed
    (tests/test_train_cluster.py shows the re-attaching)."""
    from pipelines.fine_tune import TRAIN_STEP_RETRIES

    _, train = find_task(spec, "train-model")
    assert train["retryPolicy"]["maxRetryCount"] == TRAIN_STEP_RETRIES >= 1


def test_workspace_stages_mount_the_pvc(spec, platform):
    """Every stage that touches the workspace gets the run's PVC at CLUSTER_WORKSPACE and is told that path;
    nothing else mounts it."""
    touching = workspace_tasks(spec)
    assert "prepare-dataset" in touching
    mounted = set()
    for name, (owner, task) in touching.items():
        assert source(spec, owner, task, "workspace_root") == ("constant", CLUSTER_WORKSPACE), name
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        mounted.add(label)
        (mount,) = platform["deploymentSpec"]["executors"][label]["pvcMount"]
        assert mount["mountPath"] == CLUSTER_WORKSPACE == "/mnt/workspace"
        assert pvc_source(spec, owner, mount["pvcNameParameter"]) == ("task", "workspace-pvc", "Output"), name
    executors = platform["deploymentSpec"]["executors"]
    assert {label for label, executor in executors.items() if "pvcMount" in executor} == mounted


def pvc_source(spec, owner, binding):
    """Where a mount's PVC name comes from: a task output directly, or one passed into a condition branch."""
    if "taskOutputParameter" in binding:
        return (
            "task",
            binding["taskOutputParameter"]["producerTask"],
            binding["taskOutputParameter"]["outputParameterKey"],
        )
    parent_owner, _, parent_task = parent_of(spec, owner)
    return source(spec, parent_owner, parent_task, binding["componentInputParameter"])


def test_pvc_tasks_are_not_cached(spec):
    """A cached PVC or workspace step would be skipped and leave the new run's volume missing or empty."""
    for name in PVC_TASKS | set(workspace_tasks(spec)):
        _, task = find_task(spec, name)
        assert task["cachingOptions"].get("enableCache", False) is False, name
