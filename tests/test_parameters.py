"""Run parameters are checked up front, each problem naming its parameter; the local CLI rejects bad input cleanly."""

from __future__ import annotations

import subprocess

import pytest
from conftest import run_module

from common.errors import UserError
from components.export.options import PIPELINE_OUTTYPES
from components.run_form import command_line as run_params
from components.run_form.checks import check_in_pipeline, problems, validate
from components.run_form.table import RUN_PARAMETERS
from pipelines import run
from pipelines.fine_tune import fine_tune_pipeline
from pipelines.first_step import validate_parameters

GOOD = {
    "eval_fraction": [0.001, 0.1, 0.5, 0.999999],
    "max_reject_fraction": [0.0, 0.05, 0.999],
    "split_seed": [0, 42, 2**64 - 1],
    "pvc_name": ["", "a", "my-pvc", "pvc1", "0abc", "a" * 63],
    "pvc_size": ["20Gi", "500Mi", "1", "0.5Gi", "1.5Ti", "100k", "2G", "3Ei"],
    "pvc_storage_class": ["", "standard", "ocs-storagecluster-cephfs", "nfs.example.com", "a" * 253],
}
BAD = {
    "eval_fraction": [0.0, 1.0, 1.5, -0.01, float("nan"), float("inf")],
    "max_reject_fraction": [1.0, 2.0, -0.5, float("nan")],
    "split_seed": [-1, 2**64, 2**70],
    "pvc_name": ["My-PVC", "-pvc", "pvc-", "my_pvc", "my.pvc", "pvc name", "a" * 64, " pvc"],
    "pvc_size": ["", "0", "0Gi", "0.0Mi", "-1Gi", "20GB", "20gi", "Gi", "20 Gi", " 20Gi", "20Gi ", "ten"],
    "pvc_storage_class": ["Standard", "-sc", "sc-", "sc_name", "sc..x", ".sc", "a" * 254, "sc class"],
}


def cases(table):
    return [
        pytest.param(name, value, id=f"{name}={value!r}"[:60]) for name, values in table.items() for value in values
    ]


def run_cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_module("pipelines.run", *args, timeout=timeout)


@pytest.mark.parametrize("name,value", cases(GOOD))
def test_good_values_pass(name, value):
    """Values the cluster and the data stage accept must not be refused, or users could not start valid runs."""
    assert problems({name: value}) == []
    validate({name: value})


@pytest.mark.parametrize("name,value", cases(BAD))
def test_bad_values_are_named(name, value):
    """Each bad value yields exactly one problem that names its parameter, so the user knows which field to fix."""
    found = problems({name: value})
    assert len(found) == 1
    assert found[0].startswith(f"parameter '{name}' ")
    with pytest.raises(UserError, match=f"parameter '{name}'"):
        validate({name: value})


def test_messages_show_the_value_and_the_rule():
    """The message must say what was given and what is allowed, not just "invalid"."""
    assert problems({"eval_fraction": 1.5}) == [
        (
            "parameter 'eval_fraction' must be above 0 and below 1 (got 1.5): "
            "the evaluation stage compares the models on the held-out rows"
        )
    ]
    assert problems({"split_seed": -1}) == ["parameter 'split_seed' must be between 0 and 2**64 - 1 (got -1)"]
    (size,) = problems({"pvc_size": "20GB"})
    assert "'20GB'" in size and "20Gi" in size
    (pvc,) = problems({"pvc_name": "My_PVC"})
    assert "'My_PVC'" in pvc and "63" in pvc and "empty" in pvc
    (storage,) = problems({"pvc_storage_class": "Fast_SSD"})
    assert "'Fast_SSD'" in storage and "StorageClass" in storage


CHOSEN = [parameter for parameter in RUN_PARAMETERS if "choices" in parameter.declaration.metadata]


@pytest.mark.parametrize("parameter", CHOSEN, ids=lambda parameter: parameter.name)
def test_every_parameter_with_choices_is_refused_outside_them_in_one_phrasing(parameter):
    """The check is derived from the choices declared on the field (common.cli_options.choice_problems), as the
    flag's choices are, so no stage phrases it its own way or forgets it."""
    choices = ", ".join(map(str, parameter.declaration.metadata["choices"]))
    assert problems({parameter.name: "nonsense"}) == [
        f"parameter '{parameter.name}' must be one of {choices} (got 'nonsense')"
    ]


def test_every_problem_is_reported_at_once():
    """A run form with several mistakes must list all of them, not one per failed attempt."""
    bad = {
        "eval_fraction": 1.0,
        "split_seed": -3,
        "max_reject_fraction": 7.0,
        "pvc_name": "X",
        "pvc_size": "0",
        "pvc_storage_class": "A",
    }
    with pytest.raises(UserError) as raised:
        validate({**bad, "dataset_uri": "whatever", "force": True})
    message = str(raised.value)
    for name in bad:
        assert f"parameter '{name}'" in message
    assert message.startswith("The run parameters are invalid: ")
    assert message.endswith("Fix them and start the run again.")


# One invalid value for every run parameter the first step checks beyond GOOD/BAD above: the stages' own checks.
BAD_STAGE_OPTIONS = {
    "method": "qlora4",
    "sharding": "zero3",
    "attention": "flash",
    "epochs": 0.0,
    "max_steps": 0,
    "learning_rate": -1e-4,
    "warmup_ratio": 1.5,
    "weight_decay": -0.1,
    "lora_r": 0,
    "lora_alpha": -2,
    "lora_dropout": 1.0,
    "per_device_batch_size": 0,
    "gradient_accumulation_steps": 0,
    "max_length": 0,
    "loss_on": "prompt",
    "save_steps": 0,
    "save_total_limit": 1,
    "logging_steps": 0,
    "eval_steps": -1,
    "collective_timeout_minutes": 0.0,
    "training_backend": "slurm",
    "training_nodes": 0,
    "gpus_per_node": -1,
    "gpu_memory": "80 GB",
    "training_cpu": "eight",
    "training_memory": "48GB",
    "training_shm_size": "0",
    "node_selector": "gpu",
    "tolerations": "nvidia.com/gpu:Sometimes",
    "training_timeout_minutes": 0.0,
    "training_start_timeout_minutes": -5.0,
    "training_backoff_limit": -1,
    "queue_name": "Team_A",
    "priority_class": "x" * 64,
    "training_grace_period_seconds": 5,
    "extra_questions": ["  "],
    "eval_max_new_tokens": 0,
    "eval_score_rows": 0,
    "eval_batch_size": 0,
    "min_eval_loss_improvement": float("nan"),
    "model_name": "my model",
    "gguf_outtype": "q3",
    "gguf_thresholds": {"top1": 0.5},
    "hub_repo_id": "no-owner",
    "data_connection_secret": "my secret",
    "prepare_cpu": "two",
    "prepare_memory": "0",
    "train_launcher_cpu": "-1",
    "train_launcher_memory": "1 Gi",
    "evaluate_cpu": "",
    "evaluate_memory": "32GB",
    "export_cpu": "0m",
    "export_memory": "lots",
    "publish_cpu": "1 cpu",
    "publish_memory": "2 Gi",
}


def test_checks_cover_real_parameters_and_reach_the_pipeline_task():
    """A check keyed by a misspelt name would silently never run; every parameter the first step receives
    is a pipeline parameter and has a check that names it, so a bad value stops the run in seconds."""
    declared = run_params.declared_parameters(fine_tune_pipeline)
    checked = set(validate_parameters.component_spec.inputs)
    assert checked <= set(declared)
    assert checked >= set(BAD) | set(BAD_STAGE_OPTIONS)
    for name, value in BAD_STAGE_OPTIONS.items():
        found = problems({name: value, "epochs": 1.0} if name == "max_steps" else {name: value})
        assert len(found) == 1 and found[0].startswith(f"parameter '{name}'"), (name, found)


def test_stage_problems_name_the_run_parameter_and_the_rule():
    """Stage options carry their run-form names in the message, with the value and what is allowed."""
    assert problems({"training_nodes": 0}) == ["parameter 'training_nodes' must be at least 1 (got 0)"]
    assert problems({"eval_batch_size": 0}) == ["parameter 'eval_batch_size' must be at least 1 (got 0)"]
    (outtype,) = problems({"gguf_outtype": "q3"})
    assert "'q3' is not supported" in outtype and "q8_0" in outtype
    (repo,) = problems({"hub_repo_id": "no-owner"})
    assert "owner/name" in repo


def test_pipeline_defaults_are_valid():
    """Starting a run without touching the form must pass validation."""
    defaults = run_params.defaults_of(fine_tune_pipeline)
    assert set(BAD) <= set(defaults)
    assert problems(defaults) == []


@pytest.mark.parametrize(
    ("nodes", "gpus", "refused"), [(1, 1, True), (1, 0, True), (2, 0, False), (1, 2, False), (2, 8, False)]
)
def test_fsdp_needs_two_training_processes(nodes, gpus, refused):
    """One process has nothing to shard across: refused by the first step, before any pod is asked for."""
    defaults = run_params.defaults_of(fine_tune_pipeline)
    found = problems({**defaults, "sharding": "fsdp", "training_nodes": nodes, "gpus_per_node": gpus})
    if refused:
        assert found == [
            f"parameter 'sharding' is fsdp, but the job has {nodes} training process (training_nodes x "
            "gpus_per_node): FSDP shards the model across processes and needs at least 2; use sharding none, or "
            "more nodes or GPUs"
        ]
    else:
        assert found == []


def test_in_pipeline_check_exits_2_with_one_paragraph(capsys):
    """Inside the pod a bad value must end the task with the error paragraph (exit 2), not a traceback."""
    with pytest.raises(SystemExit) as exited:
        check_in_pipeline({"eval_fraction": 0.1, "pvc_size": "lots"})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: The run parameters are invalid: parameter 'pvc_size'")
    check_in_pipeline({"eval_fraction": 0.1, "pvc_size": "1Gi"})
    assert capsys.readouterr().out == "run parameters are valid\n"


def test_qlora_is_refused_in_an_image_without_bitsandbytes(capsys, monkeypatch):
    """The first step runs the training pods' image: QLoRA without bitsandbytes fails there, before any GPU pod."""
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def image_with(bitsandbytes: bool):
        return lambda name, *rest: (
            (object() if bitsandbytes else None) if name == "bitsandbytes" else real_find_spec(name)
        )

    monkeypatch.setattr(importlib.util, "find_spec", image_with(bitsandbytes=False))
    with pytest.raises(SystemExit) as exited:
        check_in_pipeline({"method": "qlora"})
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "parameter 'method' is qlora" in err and "does not install it: use method lora" in err
    assert err.endswith("or build the image with bitsandbytes.")  # it needs no CUDA build
    monkeypatch.setattr(importlib.util, "find_spec", image_with(bitsandbytes=True))
    check_in_pipeline({"method": "qlora"})
    assert capsys.readouterr().out == "run parameters are valid\n"


def test_parse_params_types_values():
    """--param values are typed by the pipeline's own declarations; a value may itself contain '='."""
    declared = run_params.declared_parameters(fine_tune_pipeline)
    parsed = run_params.parse_params(
        ["force=TRUE", "split_seed=7", "eval_fraction=0.25", "dataset_uri=data/a=b.jsonl", "system_prompt="],
        declared,
    )
    assert parsed == {
        "force": True,
        "split_seed": 7,
        "eval_fraction": 0.25,
        "dataset_uri": "data/a=b.jsonl",
        "system_prompt": "",
    }
    assert type(parsed["split_seed"]) is int and type(parsed["eval_fraction"]) is float
    assert run_params.parse_params(["force= false "], declared) == {"force": False}


def test_cli_rejects_bad_value_before_running_anything(tmp_path):
    """The local run validates first: exit 2, one "error:" paragraph naming the parameter, no traceback,
    and nothing started or written under --output-dir."""
    out = tmp_path / "out"
    result = run_cli("--param", "eval_fraction=1.5", "--output-dir", out)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ")
    assert "parameter 'eval_fraction'" in result.stderr and "1.5" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "running pipeline locally" not in result.stdout
    assert not out.exists()


def test_cli_lists_every_bad_parameter(tmp_path):
    """Several bad --param values are all named in one go, and an existing output dir is left empty."""
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli("--param", "split_seed=-1", "--param", "pvc_size=0Gi", "--output-dir", out)
    assert result.returncode == 2
    assert "parameter 'split_seed'" in result.stderr and "parameter 'pvc_size'" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "param,expected",
    [
        ("eval_fraction", "--param 'eval_fraction' is not NAME=VALUE, e.g. --param eval_fraction=0.2."),
        (
            "evil_fraction=0.2",
            (
                "--param 'evil_fraction' is not a pipeline parameter (did you mean eval_fraction?); "
                "the parameters are: attention, base_model, base_model_revision, benchmark_allow_code, "
                "benchmark_batch_size, benchmark_fewshot, benchmark_limit, benchmark_tasks, checkpoint_every,"
            ),
        ),
        ("split_seed=abc", "--param split_seed='abc': split_seed must be a whole number."),
        ("split_seed=1.5", "--param split_seed='1.5': split_seed must be a whole number."),
        ("eval_fraction=ten", "--param eval_fraction='ten': eval_fraction must be a number."),
        ("force=yes", "--param force='yes': force is true or false."),
        ("eval_fraction=nan", "parameter 'eval_fraction' must be above 0 and below 1 (got nan)"),
        ("split_seed=18446744073709551616", "parameter 'split_seed' must be between 0 and 2**64 - 1"),
    ],
    ids=["no-equals", "unknown-name", "int-text", "int-decimal", "float-text", "bool-text", "nan", "seed-2**64"],
)
def test_cli_bad_param_exits_2_with_clear_message(tmp_path, capsys, param, expected):
    """Typos on the command line get a one-line explanation and exit status 2 before anything is created."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        run.main(["--param", param, "--output-dir", str(out)])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ")
    assert expected in " ".join(captured.err.split())
    assert "running pipeline locally" not in captured.out
    assert not out.exists()


@pytest.mark.parametrize(
    ("setting", "module", "alternative"),
    [
        ({"attention": "flash_attention_2"}, "flash_attn", "use attention auto"),
        ({"liger_kernels": True}, "liger_kernel", "set liger_kernels false"),
    ],
)
def test_gpu_kernels_the_image_lacks_are_refused_by_the_first_step(capsys, monkeypatch, setting, module, alternative):
    """Never a silent fall-back to the default kernels: a kernel package the image lacks stops the run at once."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == module else real_find_spec(name)
    )
    with pytest.raises(SystemExit):
        check_in_pipeline(setting)
    err = " ".join(capsys.readouterr().err.split())
    ((name, value),) = setting.items()
    assert f"parameter '{name}' is {value}, which needs the {module} package" in err
    assert f"does not install it: {alternative}, or build the image with {module} for CUDA" in err


@pytest.mark.parametrize(
    ("setting", "alternative"),
    [
        ({"liger_kernels": True}, "set liger_kernels false"),
        ({"attention": "flash_attention_2"}, "use attention auto"),
    ],
)
def test_gpu_only_options_on_a_job_without_gpus_are_refused(setting, alternative):
    """Whatever the image installs, these run only on NVIDIA GPUs: a CPU-only job is refused before its pods."""
    found = " ".join(problems({**setting, "gpus_per_node": 0}))
    (name,) = setting
    assert f"parameter '{name}' is {setting[name]}, which runs only on NVIDIA GPUs" in found
    assert alternative in found and "or give the training pods GPUs" in found
    assert problems({**setting, "gpus_per_node": 1}) == []


def test_qlora_is_accepted_on_a_job_without_gpus():
    """bitsandbytes 0.50 runs 4-bit layers on CPUs too: slow, but what the user asked for, so not refused."""
    assert problems({"method": "qlora", "gpus_per_node": 0}) == []


def test_local_defaults_are_valid_run_parameters_that_differ_from_the_run_forms():
    """make run's own defaults (README Quick start) are run parameters, valid, and really different."""
    from pipelines.run import LOCAL_DEFAULTS

    defaults = run_params.defaults_of(fine_tune_pipeline)
    assert LOCAL_DEFAULTS and set(LOCAL_DEFAULTS) <= set(defaults)
    assert all(defaults[name] != value for name, value in LOCAL_DEFAULTS.items())
    assert problems({**defaults, **LOCAL_DEFAULTS}) == []


@pytest.mark.parametrize(
    ("setting", "refused"),
    [
        ({"method": "full", "publish_merged": "false"}, "method is full, whose only weights are the merged checkpoint"),
        ({"publish_adapter": False, "publish_merged": "false"}, "publish_adapter is false too"),
        ({"method": "full", "publish_merged": "true"}, None),
        ({"method": "full"}, None),  # publish_merged auto follows the method
        ({"publish_adapter": False}, None),  # and the adapter's absence
        ({"method": "lora", "publish_merged": "false"}, None),
    ],
)
def test_a_publish_the_next_run_could_not_compare_with_is_refused(setting, refused):
    """Only GGUF files published: the next scheduled run's evaluation would have no model to load and compare."""
    found = problems({**run_params.defaults_of(fine_tune_pipeline), **setting})
    matching = [line for line in found if line.startswith("parameter 'publish_merged'")]
    if refused is None:
        assert matching == []
    else:
        (line,) = matching
        assert refused in line and "Set publish_merged to auto or true" in line


@pytest.mark.parametrize(
    ("setting", "parameter", "refused"),
    [
        ({"deploy": True}, "deploy", "stored nowhere KServe can read it: set model_oci_uri"),
        ({"deploy": True, "model_oci_uri": "oci://quay.io/t/m"}, "deploy", "set publish_merged to true"),
        ({"deploy": True, "model_s3_uri": "s3://b", "publish_merged": "true"}, "deploy", None),
        ({"deploy": True, "model_oci_uri": "oci://quay.io/t/m", "method": "full"}, "deploy", None),
        ({"model_registry_url": "https://r:8443"}, "model_registry_url", "goes nowhere a registry entry could point"),
        ({"model_registry_url": "https://r:8443", "hub_repo_id": "me/m"}, "model_registry_url", None),
        ({"model_registry_url": "https://r:8443", "model_s3_uri": "s3://b"}, "model_registry_url", None),
    ],
)
def test_registering_and_deploying_what_is_stored_nowhere_is_refused_before_training(setting, parameter, refused):
    """The register and serve steps come last: what they will lack is named by the first step, not hours later."""
    found = problems({**run_params.defaults_of(fine_tune_pipeline), **setting})
    matching = [line for line in found if line.startswith(f"parameter '{parameter}'")]
    assert matching == [] if refused is None else refused in matching[0]


# Every value of every enumerated run parameter: its choices, each boolean flipped, each GGUF type alone.
ENUMERATED = {
    **{p.name: p.declaration.metadata["choices"] for p in RUN_PARAMETERS if "choices" in p.declaration.metadata},
    **{p.name: (not p.default,) for p in RUN_PARAMETERS if p.type is bool},
    "gguf_outtype": tuple(PIPELINE_OUTTYPES),
}
# What a refusal of one changed value may rest on: the hardware or the backend, named in its message, or, for
# deploy and keep_pvc false, a storage target (the user's own repository, bucket or registry: no default can name
# one).
HARDWARE_OR_BACKEND = (
    "GPU",
    "CUDA",
    "gpus_per_node",
    "package",
    "set model_oci_uri (a modelcar image)",
    "Set keep_pvc to auto or true, or set one of those targets",
)


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in ENUMERATED.items() for value in values],
    ids=lambda value: str(value),
)
def test_any_one_choice_with_the_other_defaults_is_a_valid_run(name, value):
    """A user who picks a method (or any one choice) expects the other defaults to follow it, not to be refused."""
    found = problems({**run_params.defaults_of(fine_tune_pipeline), name: value})
    assert [line for line in found if not any(word in line for word in HARDWARE_OR_BACKEND)] == []
