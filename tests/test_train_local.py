"""The train step's local backend (real torchrun, two ranks on gloo) and its parameters.

The local backend is what ``make run`` and kfp.local runs use: the same trainer
and the same environment contract as a training pod, as N local processes.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import tokenised
from fake_trainer_status import FakeTrainerStatus
from mlflow_server import DyingProxy
from train_jobs import stand_in_artifacts

import components.train.progress as progress_module
from common.errors import UserError
from components.default_base_model import resolve_base_model
from components.local_model import CLUSTER_BASE_MODEL, LOCAL_MODEL_NAME
from components.pipeline_steps.train_step import train_model
from components.train.options import LaunchOptions, parse_node_selector, parse_tolerations
from components.train.stage import run_in_pipeline
from trainer.config import TrainConfig

pytestmark = pytest.mark.usefixtures("no_hub")

FAST = dict(
    max_steps=3,
    max_length=128,
    per_device_batch_size=2,
    logging_steps=1,
    save_steps=2,
    method="lora",
    lora_r=4,
    lora_alpha=8,
)
SET_BY_THE_STEP = {"model", "tokens_dir", "output_dir", "require_cuda", "expected_world_size"}
# A command-line switch the pipeline never sets: the tests' and the GPU check's way onto the compiled path on CPU.
LEFT_AT_ITS_DEFAULT = {"compile_backend"}


def local_run(tmp_path: Path, tokens_dir: Path, base_model: Path, training: dict, **launch) -> tuple[str, dict]:
    workspace = tmp_path / "workspace"
    artifacts = stand_in_artifacts(tmp_path / "artifacts")
    train_dir, resolved_base_model = run_in_pipeline(
        workspace_root=str(workspace),
        run_id="run-1",
        tokens_dir=str(tokens_dir),
        base_model=str(base_model),
        training=training,
        launch={"backend": "local", "nodes": 2, "gpus_per_node": 0, **launch},
        pvc_name="",
        image="",
        pipeline_name="llm-finetune",
        **artifacts,
    )
    assert resolved_base_model == str(base_model)
    return train_dir, artifacts


@pytest.mark.slow
def test_local_backend_trains_with_two_processes_and_records_the_outputs(
    tiny_model_dir, prepared_data_dir, tmp_path, capsys, monkeypatch, mlflow_server
):
    monkeypatch.setattr(progress_module, "CHECK_SECONDS", 0.05)  # a line for every record the trainer writes
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.0)
    # MLflow dies mid-run: it answers until the run's parameters are logged, then nothing more.
    dies = DyingProxy(mlflow_server.url, lambda path, body: path.endswith("/runs/log-batch"))
    tracked = FAST | {"mlflow_tracking_uri": dies.url, "mlflow_experiment": "dies-mid-run"}
    with FakeTrainerStatus(tmp_path / "trainer-status") as status_server, dies:  # a TrainJob with the gate on
        for name, value in status_server.environment().items():
            monkeypatch.setenv(name, value)
        train_dir, artifacts = local_run(
            tmp_path, tokenised(tiny_model_dir, prepared_data_dir), tiny_model_dir, tracked
        )

    assert train_dir == str(tmp_path / "workspace" / "runs" / "run-1" / "train")
    summary = json.loads((Path(train_dir) / "training_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 3 and summary["config"]["expected_world_size"] == 2
    assert (Path(train_dir) / "merged" / "config.json").is_file() and (
        Path(train_dir) / "adapter" / "adapter_config.json"
    ).is_file()

    model = artifacts["model_artifact"]
    assert (
        model.metadata["merged_dir"] == f"{train_dir}/merged"
        and model.metadata["adapter_dir"] == f"{train_dir}/adapter"
    )
    assert model.metadata["checkpoints_dir"] == f"{train_dir}/checkpoints" and model.metadata["world_size"] == 2
    assert json.loads(Path(model.path).read_text())["merged_dir"] == f"{train_dir}/merged"
    metrics = artifacts["metrics"].metrics
    assert metrics["global_step"] == 3 and metrics["world_size"] == 2 and metrics["final_train_loss"] > 0

    launched = yaml.safe_load(Path(artifacts["manifest_artifact"].path).read_text())
    assert launched["backend"] == "local" and launched["processes"] == 2
    assert launched["command"][1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    out = capsys.readouterr().out
    assert "step 3/3" in out  # the trainer's own lines reached the step's log

    # The step's progress lines, read from the progress file rank 0 rewrites: steps that only go up, a plausible
    # ETA, and 100% at the end with the last checkpoint; the last record's numbers in the KFP metrics. (A line at
    # each checkpoint: tests/test_progress.py, where the reads are not left to the timing of three quick steps.)
    lines = [line for line in out.splitlines() if line.startswith("progress: ")]
    steps = [int(re.search(r"step (\d+)/3 ", line)[1]) for line in lines]
    assert steps == sorted(steps) and steps[-1] == 3 and len(lines) >= 2, lines
    etas = [re.search(r"ETA (\d+):(\d\d):(\d\d)", line) for line in lines]
    assert all(int(eta[1]) * 3600 + int(eta[2]) * 60 + int(eta[3]) < 600 for eta in etas if eta)
    assert lines[-1].startswith("progress: step 3/3 (100.0%)") and ", done, last checkpoint checkpoint-3" in lines[-1]
    assert metrics["progress_percent"] == 100.0 and metrics["total_steps"] == 3 and metrics["final_learning_rate"] > 0
    assert "mfu" not in metrics  # on CPU: no peak to measure against

    # Rank 0 alone posted the progress into the (fake) TrainJob status, each update as the CRD takes it: the first
    # at 0%, the last at 100% (transformers' own callback, which the same variables would turn on, stayed off).
    assert status_server.refused == [] and len(status_server.updates) >= 2
    assert (
        status_server.updates[0]["progressPercentage"] == 0 and status_server.updates[-1]["progressPercentage"] == 100
    )
    assert (
        summary["trainjob_status"]["reported"] == len(status_server.updates)
        and not summary["trainjob_status"]["failed"]
    )

    # Training finished although MLflow died: rank 0 alone created the run (named by the pipeline run) and logged
    # its parameters; the metrics it could not send are counted in the summary, and the log says so.
    tracked_run = summary["mlflow"]
    assert tracked_run["failed"] >= 1 and tracked_run["metrics_unsent"] > 0 and tracked_run["metrics_logged"] == 0
    assert "did not answer" in tracked_run["last_error"] and "MLflow: request 1 failed" in out
    assert sum(path.endswith("/runs/create") for path in dies.requests) == 1
    stored = mlflow_server.client().get_run(tracked_run["run_id"])
    assert stored.info.run_name == "run-1" and stored.data.params["lora_r"] == "4"


@pytest.mark.slow
def test_local_training_failure_fails_the_step_with_the_last_lines(prepared_data_dir, tiny_model_dir, tmp_path, capsys):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(SystemExit) as exit_info:
        local_run(tmp_path, tokenised(tiny_model_dir, prepared_data_dir), broken, FAST)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "error: training failed." in err
    assert "the local trainer (torchrun, 2 processes) exited with code 1" in err
    assert "failing rank: " in err and "exit code 1: the trainer raised an error" in err
    report_tail = err[err.index("last 50 lines of the trainer:") :]
    assert (
        "no-such-architecture" in report_tail and "ChildFailedError" not in report_tail
    )  # the trainer's error, not torchrun's


def test_bad_parameters_are_all_named_before_anything_runs(prepared_data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        local_run(
            tmp_path,
            prepared_data_dir,
            Path("unused"),
            {"lora_r": 0, "method": "dora"},
            nodes=0,
            memory="lots",
            tolerations="gpu:Sometimes",
            node_selector="{not json",
        )
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    for name in ("nodes", "memory", "tolerations", "node_selector", "lora_r", "method"):
        assert f"parameter '{name}'" in err, name
    assert "Traceback" not in err and not (tmp_path / "workspace").exists()


def test_missing_data_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        local_run(tmp_path, tmp_path / "no-data", Path("unused"), FAST)
    assert "no-data holds no manifest.json" in " ".join(capsys.readouterr().err.split())


def test_cluster_backends_need_the_pvc_and_the_image(prepared_data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_in_pipeline(
            workspace_root=str(tmp_path),
            run_id="r",
            tokens_dir=str(prepared_data_dir),
            base_model="m",
            training={},
            launch={"backend": "pytorchjob"},
            pvc_name="",
            image="",
            pipeline_name="p",
            **stand_in_artifacts(tmp_path),
        )
    err = " ".join(capsys.readouterr().err.split())
    assert "(pvc_name)" in err and "(image)" in err


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", {}),
        ("nvidia.com/gpu.present=true", {"nvidia.com/gpu.present": "true"}),
        ("a=1, b=2", {"a": "1", "b": "2"}),
        ('{"node-role.kubernetes.io/gpu": ""}', {"node-role.kubernetes.io/gpu": ""}),
    ],
)
def test_node_selector_forms(text, expected):
    assert parse_node_selector(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", []),
        ("nvidia.com/gpu:NoSchedule", [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
        (
            "team=ml:NoExecute,spot",
            [
                {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
                {"key": "spot", "operator": "Exists"},
            ],
        ),
        (
            '[{"key": "a", "operator": "Equal", "value": "b", "effect": "NoSchedule"}]',
            [{"key": "a", "operator": "Equal", "value": "b", "effect": "NoSchedule"}],
        ),
    ],
)
def test_toleration_forms(text, expected):
    assert parse_tolerations(text) == expected


@pytest.mark.parametrize("text", ["a:Never", '[{"key": "a", "operator": "Maybe"}]', '[{"key": "a"', '["a"]'])
def test_bad_tolerations_are_refused(text):
    with pytest.raises(UserError, match="parameter 'tolerations'"):
        parse_tolerations(text)


def test_empty_base_model_resolves_per_backend(tmp_path, monkeypatch):
    cached = tmp_path / "models" / LOCAL_MODEL_NAME
    cached.mkdir(parents=True)  # a cache hit: local_base_model returns the materialised checkpoint's directory
    monkeypatch.setenv("LLM_FT_CACHE", str(tmp_path))
    assert resolve_base_model("", "local") == str(cached)
    assert resolve_base_model("  ", "pytorchjob") == resolve_base_model("", "trainjob") == CLUSTER_BASE_MODEL
    assert resolve_base_model("org/model", "local") == "org/model"


def test_the_step_takes_every_option_and_passes_each_on(monkeypatch):
    """The component's options are exactly the LaunchOptions and TrainConfig fields, without defaults of its own.

    KFP runs the component's source in the pod, where it cannot refer to the
    dataclasses; the pipeline passes every value (see test_compile for where
    those values come from), and the body must hand each one on: each input
    gets a value of its own here, and each must arrive in its group.
    """
    import components.train.stage as stage

    parameters = inspect.signature(train_model.python_func).parameters
    fields = [spec for spec in dataclasses.fields(LaunchOptions)] + [
        spec for spec in dataclasses.fields(TrainConfig) if spec.name not in SET_BY_THE_STEP | LEFT_AT_ITS_DEFAULT
    ]
    assert {spec.name for spec in fields} <= set(parameters)
    assert all(parameter.default is inspect.Parameter.empty for parameter in parameters.values())
    received = {}
    monkeypatch.setattr(stage, "run_in_pipeline", lambda **kwargs: received.update(kwargs) or ("dir", "base"))
    train_model.python_func(**{name: f"value of {name}" for name in parameters})
    passed_on = {**received["training"], **received["launch"]}
    assert passed_on == {spec.name: f"value of {spec.name}" for spec in fields}, (
        "every option must be passed on to run_in_pipeline"
    )
