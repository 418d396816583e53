"""``python -m pipelines.training_job render``: the training job a run would create, shown without a cluster.

Each rendered manifest is validated against the published CRD schemas vendored in
``tests/schemas`` (Training Operator v1.9.0, Trainer v2.3.0), for the job
shapes users run: one CPU pod, two single-GPU pods, four 8-GPU pods, each with
and without a Kueue queue and priority.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_module
from crd_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, schema_errors
from fake_run import training_summary
from test_train_cluster import Scenario, start_replicas, step_arguments, succeed, workspace_with_data
from train_jobs import JOB_OWNER, LAUNCHER_POD, RUN_ID, WORKFLOW

from common.errors import UserError
from common.run_layout import CLUSTER_WORKSPACE, TOKEN_CACHE
from components.train.kinds import PRIORITY_LABEL, PYTORCHJOB, QUEUE_LABEL
from components.train.owner import POD_NAME_ENV
from components.train.stage import run_in_pipeline
from pipelines.training_job import CREATED_PVC, TOKENS_KEY, render

pytestmark = pytest.mark.usefixtures("no_hub")

IMAGE = "quay.io/example/llm-finetune-pipeline:0.1.0"
SHAPES = [(1, 0), (2, 1), (4, 8)]
QUEUES = [(), ("queue_name=team-a", "priority_class=high")]


def rendered(*pairs: str, namespace: str = "ml-team") -> dict:
    text = render(list(pairs), namespace=namespace, run_id=RUN_ID, image=IMAGE)
    return yaml.safe_load(text)


def pod_templates(manifest: dict) -> list[dict]:
    if manifest["kind"] == "PyTorchJob":
        return [replica["template"] for replica in manifest["spec"]["pytorchReplicaSpecs"].values()]
    (patch,) = manifest["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return [node["template"]["spec"]["template"]]


@pytest.mark.parametrize("queue", QUEUES, ids=["no-queue", "queue"])
@pytest.mark.parametrize(("nodes", "gpus"), SHAPES, ids=[f"{n}x{g}" for n, g in SHAPES])
def test_pytorchjob_renders_valid_for_every_shape(nodes, gpus, queue):
    manifest = rendered("training_backend=pytorchjob", f"training_nodes={nodes}", f"gpus_per_node={gpus}", *queue)
    assert schema_errors(manifest, PYTORCHJOB_CRD) == []
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert sum(replica["replicas"] for replica in replicas.values()) == nodes
    assert manifest["spec"]["nprocPerNode"] == str(max(gpus, 1))
    for replica in replicas.values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
        command = container["command"]
        assert command[command.index("--expected-world-size") + 1] == str(nodes * max(gpus, 1))
    check_queue_labels(manifest, queue)


@pytest.mark.parametrize("queue", QUEUES, ids=["no-queue", "queue"])
@pytest.mark.parametrize(("nodes", "gpus"), SHAPES, ids=[f"{n}x{g}" for n, g in SHAPES])
def test_trainjob_renders_valid_for_every_shape(nodes, gpus, queue):
    manifest = rendered("training_backend=trainjob", f"training_nodes={nodes}", f"gpus_per_node={gpus}", *queue)
    assert schema_errors(manifest, TRAINJOB_CRD) == []
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (nodes, max(gpus, 1))
    assert trainer["resourcesPerNode"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    check_queue_labels(manifest, queue)


def check_queue_labels(manifest: dict, queue: tuple[str, ...]) -> None:
    """Kueue reads the labels on the job; the pods carry none (Kueue admits jobs, not their pods)."""
    labels = manifest["metadata"]["labels"]
    expected = {QUEUE_LABEL: "team-a", PRIORITY_LABEL: "high"} if queue else {}
    assert {key: labels[key] for key in labels if key.startswith("kueue.x-k8s.io/")} == expected
    for template in pod_templates(manifest):
        assert not [key for key in template["metadata"]["labels"] if key.startswith("kueue.x-k8s.io/")]


def test_render_uses_the_run_form_defaults_and_names_the_stand_ins():
    """No parameters: the pipeline's own defaults (a 2-node, 1-GPU PyTorchJob of the cluster default model), and
    the comment says which values only a run knows."""
    text = render([], namespace="ml-team", run_id=RUN_ID, image=IMAGE)
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any(RUN_ID in line and "ml-team" in line and CREATED_PVC in line for line in comments), comments
    assert any("ownerReference" in line for line in comments)
    manifest = yaml.safe_load(text)
    assert manifest["kind"] == "PyTorchJob" and manifest["metadata"]["namespace"] == "ml-team"
    assert "ownerReferences" not in manifest["metadata"]
    (template, *_) = pod_templates(manifest)
    (workspace,) = [volume for volume in template["spec"]["volumes"] if "persistentVolumeClaim" in volume]
    assert workspace["persistentVolumeClaim"]["claimName"] == CREATED_PVC
    assert (
        rendered("pvc_name=team-workspace")["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"][0][
            "persistentVolumeClaim"
        ]["claimName"]
        == "team-workspace"
    )


@pytest.mark.parametrize(
    ("pairs", "named"),
    [
        (["training_nodes=0"], "parameter 'training_nodes'"),
        (["queue_name=Team_A"], "parameter 'queue_name'"),
        (["priority_class=high"], "parameter 'priority_class'"),
        (["training_nodes=two"], "training_nodes must be a whole number"),
        (["trainin_nodes=2"], "did you mean training_nodes"),
        (["training_backend=local"], "training_backend is local"),
    ],
)
def test_bad_parameters_are_refused_like_a_run_refuses_them(pairs, named):
    with pytest.raises(UserError, match=named):
        render(pairs, namespace="ml-team", run_id=RUN_ID, image=IMAGE)


def test_the_command_prints_yaml_or_one_paragraph_and_exit_2(tmp_path):
    """The real command line: YAML on stdout for good parameters; exit 2, one paragraph, no traceback otherwise."""
    env = {"KUBECONFIG": str(tmp_path / "none"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    good = run_module(
        "pipelines.training_job",
        "render",
        "--param",
        "training_backend=trainjob",
        "--param",
        "queue_name=team-a",
        env=env,
    )
    assert good.returncode == 0, good.stderr
    manifest = yaml.safe_load(good.stdout)
    assert manifest["kind"] == "TrainJob" and manifest["metadata"]["namespace"] == "default"
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    # The default base model is on the Hub, which the test machine cannot reach: the estimate is skipped, saying why.
    assert "\n# fit check skipped: could not download config.json of HuggingFaceTB/SmolLM3-3B" in good.stdout
    bad = run_module("pipelines.training_job", "render", "--param", "training_memory=48GB", env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: The run parameters are invalid: parameter 'training_memory'")
    assert "Traceback" not in bad.stderr


def test_render_shows_exactly_what_the_train_step_creates(fake, tmp_path, monkeypatch):
    """The train step runs against the fake Kubernetes API (tests/fake_kube.py; no cluster runs here) with a
    Kueue queue and a KFP step pod owned by its Workflow; the manifest it records (what it POSTed) is the rendered
    one plus the Workflow as owner. The step's workspace is a temporary directory, the cluster's /mnt/workspace."""
    workspace, data, train_dir = workspace_with_data(tmp_path)
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "team-a"}}
    fake.handle("POST", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{fake.namespace}/localqueues", {}, queue)
    fake.add_step_pod(LAUNCHER_POD, [WORKFLOW])
    monkeypatch.setenv(POD_NAME_ENV, LAUNCHER_POD)

    def script(fake):
        name = fake.wait_for("pytorchjobs")["metadata"]["name"]
        fake.admit("pytorchjobs", name)
        job, pods = start_replicas(fake, PYTORCHJOB)
        (train_dir / "merged").mkdir(parents=True)
        training_summary(world_size=2).write(train_dir / "training_summary.json")
        succeed(fake, PYTORCHJOB, job, pods)

    scenario = Scenario(fake, script)
    scenario.start()
    arguments = step_arguments(workspace, data, tmp_path, queue_name="team-a")
    run_in_pipeline(**arguments)
    scenario.check()

    # The step reads the token-cache entry it was given; the render stands in for its key (named by the data).
    created = yaml.safe_load(
        Path(arguments["manifest_artifact"].path)
        .read_text()
        .replace(str(workspace), CLUSTER_WORKSPACE)
        .replace(str(data.relative_to(workspace)), f"{TOKEN_CACHE}/{TOKENS_KEY}")
    )
    expected = rendered("epochs=1", "training_nodes=2", "gpus_per_node=1", "pvc_name=ws-pvc", "queue_name=team-a")
    expected["metadata"]["ownerReferences"] = [JOB_OWNER]
    assert created == expected
