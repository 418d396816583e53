"""`python -m pipelines.run` executes the real DAG through kfp.local on this machine, end to end.

Three runs share one output directory, as scheduled runs share a PVC:

1. the whole pipeline on the bundled data with SmolLM2-135M: prepare, train with
   two local torchrun processes, evaluate, export a verified GGUF, publish (a dry
   run, since no repository is set), and store a copy in S3 (moto's S3 server on
   127.0.0.1, reached as an S3-compatible store through AWS_ENDPOINT_URL) and a
   modelcar image in an OCI registry (Debian's docker-registry on 127.0.0.1), and
   register the version in the Model Registry (the fake one, which validates
   every exchange against the published spec);
2. the same data again: its fingerprint matches the published model's, so
   training, evaluation and every step after are skipped;
3. the same data with ``force``, fine-tuning a tiny model and a quality gate no
   model can meet: it trains and evaluates (against the base and the first run's
   published model), then skips export and every step after it.

Training is cut short (a few steps of short sequences) so the runs fit a CI
budget; everything else runs as in ``make run``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import boto3
import pytest
from conftest import REPO_ROOT, read_split, read_stats, run_module, write_jsonl
from fake_model_registry import FakeModelRegistry

from common.records import SampleAnswers, StoredCopies
from common.run_layout import PUBLISHED
from components.champion.record import DRY_RUN_NAME
from pipelines.run import LOCAL_DEFAULTS

pytestmark = pytest.mark.slow

BUNDLED_RECORDS = 324  # lines of components/sample_data/practical_skills.jsonl, all valid, no duplicates
# 3% held out: 10 of the bundled 324 conversations, enough for the runs' two scored rows. Every model is scored on
# all of them (eval loss), which at the default 10% took SmolLM2 about 10 s a model.
DATA_PARAMS = ("--param", "split_seed=7", "--param", "system_prompt=Answer briefly.", "--param", "eval_fraction=0.03")
SHORT_TRAINING = (
    "--param",
    "max_steps=2",
    "--param",
    "max_length=256",
    "--param",
    "per_device_batch_size=1",
    "--param",
    "logging_steps=1",
    "--param",
    "save_steps=1",
)
# 10 of the bundled benchmark's 40 questions: these runs check that the default benchmark is scored on every model
# and reported, not what it scores, and each SmolLM2 model took 12-18 s to score all 40.
BENCHMARK_LIMIT = 10
SHORT_EVALUATION = (
    "--param",
    f"benchmark_limit={BENCHMARK_LIMIT}",
    "--param",
    "eval_score_rows=2",
    "--param",
    "eval_max_new_tokens=24",
    "--param",
    'extra_questions=["What is a bowline?"]',
)
# Two steps of a LoRA barely move a model: let the first run's gate pass whatever they did (on 10 questions, one
# answer that changes moves the score by 0.1).
LENIENT_GATE = ("--param", "min_eval_loss_improvement=-100", "--param", "max_benchmark_drop=1")
STAGES = ("data", "train", "evaluate", "export", "publish", "store")
# Every task of a run that trains and passes its gate, in the order kfp.local executes them.
EVERY_STEP = (
    "validate-parameters",
    "prepare-dataset",
    "check-data-changed",
    "tokenise-data",
    "train-model",
    "evaluate-model",
    "export-gguf",
    "publish-model",
    "store-model",
    "register-model",
    "serve-model",
)
MODELS_BUCKET = "models"
MODELS_URI = f"s3://{MODELS_BUCKET}/local"
REGISTRY_TOKEN = "local-run-registry-token"
EXPERIMENT = "local-runs"


def run_pipeline(*args, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``python -m pipelines.run``; the result's ``log`` is the run.log it wrote (every step's full output)."""
    result = run_module("pipelines.run", *args, env=env, timeout=timeout)
    log = Path(args[list(args).index("--output-dir") + 1]) / "run.log"
    result.log = log.read_text() if log.is_file() else ""
    return result


def squash(text: str) -> str:
    return "".join(text.split())


def run_dirs(output_dir: Path) -> dict[str, Path]:
    """Run id -> that run's directory on the workspace (runs/<run id>/)."""
    return {path.name: path for path in (output_dir / "workspace" / "runs").iterdir()}


def executed(result: subprocess.CompletedProcess) -> list[str]:
    """The tasks kfp.local executed, in order."""
    return re.findall(r"Executing task \W*'([\w-]+)'", re.sub(r"\x1b\[[0-9;]*m", "", result.log))


@pytest.fixture(scope="module")
def s3_bucket(s3_server):
    """A bucket on moto's S3 server, and the environment that reaches it: (client, env)."""
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_server, "AWS_DEFAULT_REGION": "us-east-1"}
    env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=MODELS_BUCKET)
    return client, env


@pytest.fixture(scope="module")
def model_registry():
    """The fake Model Registry (no real one installs here; tests/fake_model_registry.py) for the module's runs."""
    with FakeModelRegistry(token=REGISTRY_TOKEN) as fake:
        yield fake
        assert fake.violations == []


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_whole_vocabulary_dir, s3_bucket, oci_registry, model_registry, mlflow_server):
    """The three runs, in order, in one output directory: (output_dir, [(result, new run directory)])."""
    output_dir = tmp_path_factory.mktemp("local-run") / "out"
    env = {**s3_bucket[1], "REGISTRY_AUTH_FILE": str(oci_registry.auth_file), "MODEL_REGISTRY_TOKEN": REGISTRY_TOKEN}
    storage = (
        *("--param", f"model_s3_uri={MODELS_URI}"),
        *("--param", f"model_oci_uri=oci://{oci_registry.host}/models/smol"),
        *("--param", f"model_registry_url={model_registry.url}"),
        *("--param", f"mlflow_tracking_uri={mlflow_server.url}", "--param", f"mlflow_experiment={EXPERIMENT}"),
    )
    arguments = [
        (*DATA_PARAMS, *SHORT_TRAINING, *SHORT_EVALUATION, *LENIENT_GATE, *storage),
        (*DATA_PARAMS, *SHORT_TRAINING, *SHORT_EVALUATION),
        (
            *DATA_PARAMS,
            *SHORT_TRAINING,
            *SHORT_EVALUATION,
            "--param",
            "force=true",
            "--param",
            f"base_model={tiny_whole_vocabulary_dir}",
            "--param",
            "min_eval_loss_improvement=100",
        ),
    ]
    done, seen = [], set()
    for args in arguments:
        result = run_pipeline("--output-dir", output_dir, *args, env=env)
        new = set(run_dirs(output_dir)) - seen if (output_dir / "workspace" / "runs").is_dir() else set()
        (run_id,) = new or {None}
        seen |= new
        done.append((result, run_dirs(output_dir).get(run_id)))
    return output_dir, done


def succeeded(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]


def test_whole_pipeline_runs_locally_and_says_where_outputs_went(runs):
    """`make run` on a fresh machine: every stage runs, training with two processes, and the user is told
    where to look."""
    output_dir, [(result, run_dir), *_] = runs
    succeeded(result)
    assert executed(result) == list(EVERY_STEP)
    assert f"running pipeline locally; outputs go to {output_dir}" in result.stdout
    assert f"local defaults: epochs={LOCAL_DEFAULTS['epochs']}" in result.stdout
    # The terminal shows a line per stage and the summary; the steps' own output is in run.log.
    for task in executed(result):
        assert re.search(rf"^  {task} \.\.\. done \(\d+(m \d+)?s\)$", result.stdout, re.MULTILINE), task
    assert "Streamed logs" not in result.stdout and "Streamed logs" in result.log
    # The tokenise step wrote an entry of the workspace's token cache, which training read.
    (tokens_dir,) = re.findall(r"^\s*tokens -> (\S+)$", result.log, re.MULTILINE)
    assert "tokenised now" in result.log and Path(tokens_dir).parent == output_dir / "workspace" / "token-cache"
    training = json.loads((run_dir / "train" / "training_summary.json").read_text())
    assert training["tokens_dir"] == tokens_dir and (Path(tokens_dir) / "manifest.json").is_file()
    evaluation = json.loads((run_dir / "evaluate" / "evaluation.json").read_text())
    assert evaluation["held_out"]["tokenised"] == evaluation["held_out"]["split_conversations"] > 0
    base, tuned = evaluation["base"]["eval_loss"], evaluation["fine_tuned"]["eval_loss"]
    (gguf,) = (run_dir / "export").glob("*.gguf")
    for fact in (
        f"run {run_dir.name} ({run_dir})",
        f"eval loss:  base {base:.3f} -> fine-tuned {tuned:.3f}",
        # The local default benchmark: the bundled lm-eval task, scored on both models.
        f"benchmark practical_skills_mc: acc_norm, higher is better, {BENCHMARK_LIMIT} examples: base "
        f"{evaluation['benchmarks']['scores']['base']['practical_skills_mc']['value']:.4f}",
        f"gate:       passed: {evaluation['gate']['reason']}",
        f"report:     {run_dir / 'evaluate' / 'report.html'}",
        f"GGUF:       {gguf}",
        "llama.cpp:  verification passed",
        f"Modelfile:  {run_dir / 'export' / 'Modelfile'}",
        f"model card: {run_dir / 'publish' / 'upload' / 'README.md'} (a dry run: set repo_id to publish)",
        f"python -m gguf_export.chat {gguf}",
    ):
        assert fact in result.stdout, fact

    summary = json.loads((run_dir / "train" / "training_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    assert summary["trained_weights_dtype"] == "float32"  # the LoRA adapters, read before merging
    assert summary["config"]["model"].endswith(
        "SmolLM2-135M-Instruct"
    )  # the empty base_model resolved to the local model


def test_data_parameters_reach_the_data_stage(runs):
    """--param values arrive in the step: the bundled data, split with the given seed, with the given system prompt."""
    _, [(result, run_dir), *_] = runs
    succeeded(result)
    stats = read_stats(run_dir / "data")
    assert stats["records"] == BUNDLED_RECORDS and stats["rejected"] == 0
    assert stats["inputs"] == [str(REPO_ROOT / "components" / "sample_data" / "practical_skills.jsonl")]
    assert stats["options"]["seed"] == 7 and stats["options"]["system_prompt"] == "Answer briefly."
    train = read_split(run_dir / "data", "train")
    assert train[0]["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert f"fingerprint {stats['fingerprint']}" in result.log


def test_evaluation_compares_both_models_on_every_question(runs):
    """The report a user opens in the run page: both models' answers to the built-in and the extra questions."""
    output_dir, [(result, run_dir), *_] = runs
    succeeded(result)
    evaluation = json.loads((run_dir / "evaluate" / "evaluation.json").read_text())
    assert evaluation["gate"]["passed"] is True and evaluation["scored_rows"] == 2
    samples = SampleAnswers.read(run_dir / "evaluate" / "demo_outputs" / "sample_responses.json").answers
    assert len(samples) == 6 and samples[-1].question == "What is a bowline?"
    assert all(sample.base.strip() and sample.fine_tuned.strip() for sample in samples)
    first_run_html = sorted((output_dir / "artifacts").glob("*/evaluate-model/report_html"))[
        0
    ]  # artifact dirs are named by start time
    assert "What is a bowline?" in first_run_html.read_text()


def test_export_writes_a_verified_gguf_and_a_modelfile(runs):
    """The GGUF was checked in llama.cpp before anything was published."""
    _, [(result, run_dir), *_] = runs
    succeeded(result)
    export_dir = run_dir / "export"
    (gguf,) = export_dir.glob("*.gguf")
    assert gguf.name.endswith("-q8_0.gguf") and gguf.read_bytes()[:4] == b"GGUF"
    assert f"FROM ./{gguf.name}" in (export_dir / "Modelfile").read_text()
    assert json.loads((export_dir / "verification.json").read_text())["passed"] is True


def test_the_exported_gguf_answers_in_the_terminal_chat(runs):
    """What make run tells the user to try next: python -m gguf_export.chat on the exported GGUF."""
    _, [(result, run_dir), *_] = runs
    succeeded(result)
    (gguf,) = (run_dir / "export").glob("*.gguf")
    chat = run_module("gguf_export.chat", gguf, "--prompt", "Hello!", "--max-tokens", "16", "--temperature", "0")
    assert chat.returncode == 0 and chat.stdout.strip() and chat.stderr == "", chat.stderr


def test_publish_dry_run_writes_the_upload_folder_and_the_record(runs):
    """Without a repository the publish step writes exactly what it would upload, and records the data fingerprint."""
    output_dir, [(result, run_dir), *_] = runs
    succeeded(result)
    upload = run_dir / "publish" / "upload"
    card = (upload / "README.md").read_text()
    fingerprint = read_stats(run_dir / "data")["fingerprint"]
    assert f"data_fingerprint: {fingerprint}" in card and "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert {path.name for path in upload.iterdir()} >= {"README.md", "Modelfile", "training_summary.json"}
    # The benchmark table.
    assert f"| practical_skills_mc: acc_norm, higher is better, {BENCHMARK_LIMIT} examples | " in card
    assert any(path.suffix == ".gguf" for path in upload.iterdir())
    record = json.loads((output_dir / "workspace" / PUBLISHED / f"{DRY_RUN_NAME}.json").read_text())
    assert record["data_fingerprint"] == fingerprint and record["run_id"] == run_dir.name


def test_the_store_step_copies_the_published_version_to_s3(runs, s3_bucket):
    """With model_s3_uri set, the version the publish step laid out lands under <model>/<run id>/ in the bucket,
    its completion marker last, and the summary says where."""
    from components.store.s3_target import COMPLETE_MARKER

    _, [(result, run_dir), *_] = runs
    succeeded(result)
    client, _ = s3_bucket
    (stored, _) = StoredCopies.read(run_dir / "store" / "stored.json").copies
    assert stored.uri == f"{MODELS_URI}/SmolLM2-135M-Instruct-ft/{run_dir.name}/"
    prefix = stored.uri[len(f"s3://{MODELS_BUCKET}/") :]
    upload = run_dir / "publish" / "upload"
    local = sorted(path.relative_to(upload).as_posix() for path in upload.rglob("*") if path.is_file())
    listed = client.list_objects_v2(Bucket=MODELS_BUCKET, Prefix=prefix)["Contents"]
    assert sorted(item["Key"][len(prefix) :] for item in listed) == sorted([*local, COMPLETE_MARKER])
    gguf = next(name for name in local if name.endswith(".gguf"))
    assert client.get_object(Bucket=MODELS_BUCKET, Key=prefix + gguf)["Body"].read() == (upload / gguf).read_bytes()
    assert f"stored:     {stored.uri} ({len(local)} files, complete)" in result.stdout


def test_the_store_step_pushes_the_published_version_as_a_modelcar_image(runs, oci_registry, tmp_path):
    """With model_oci_uri set, the same version is an image tagged with the run id, its files under /models."""
    from tests.test_storage_oci import pull_and_unpack

    _, [(result, run_dir), *_] = runs
    succeeded(result)
    (_, pushed) = StoredCopies.read(run_dir / "store" / "stored.json").copies
    assert pushed.uri == f"oci://{oci_registry.host}/models/smol:{run_dir.name}"
    _, rootfs = pull_and_unpack(oci_registry, pushed.uri, tmp_path)
    upload = run_dir / "publish" / "upload"
    local = {path.relative_to(upload).as_posix(): path.read_bytes() for path in upload.rglob("*") if path.is_file()}
    models = rootfs / "models"
    assert {
        path.relative_to(models).as_posix(): path.read_bytes() for path in models.rglob("*") if path.is_file()
    } == local
    assert f"stored:     {pushed.uri} ({len(local)} files, complete)" in result.stdout


def test_the_register_step_catalogues_the_stored_version(runs, model_registry):
    """With model_registry_url set, the first run is a version of its model with an artifact per copy and its
    provenance; the runs that published nothing registered nothing."""
    _, [(result, run_dir), *_] = runs
    succeeded(result)
    (model,) = model_registry.registered_models.values()
    (version,) = model_registry.model_versions.values()
    assert (model["name"], version["name"]) == ("SmolLM2-135M-Instruct-ft", run_dir.name)
    stored = StoredCopies.read(run_dir / "store" / "stored.json").copies
    artifacts = model_registry.version_artifacts(version["id"])
    assert sorted(a["uri"] for a in artifacts) == sorted(copy.uri for copy in stored)
    properties = version["customProperties"]
    assert properties["gate_passed"]["bool_value"] is True and properties["gguf_verified"]["bool_value"] is True
    assert properties["pipeline_run_id"]["string_value"] == run_dir.name
    fingerprint = json.loads((run_dir / "data" / "stats.json").read_text())["fingerprint"]
    assert properties["data_fingerprint"]["string_value"] == fingerprint
    assert f"registered: model {model['id']}, version {version['id']} ({run_dir.name})" in result.stdout


def test_the_first_run_is_one_mlflow_run_with_the_training_per_step_the_evaluation_and_its_report(
    runs, mlflow_server, model_registry, tmp_path
):
    """With mlflow_tracking_uri set: one MLflow run named by the pipeline run, holding the trainer's parameters and
    its loss at every logged step, the evaluation's numbers and gate, and the report; ended by the evaluation, and
    linked from the evaluation, the report, the model card and the Model Registry version."""
    _, [(result, run_dir), *_] = runs
    succeeded(result)
    client = mlflow_server.client()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id])  # the runs without mlflow_tracking_uri logged nothing
    assert run.info.run_name == run_dir.name and run.data.tags["kfp.run_id"] == run_dir.name
    assert run.info.status == "FINISHED"
    assert run.data.params["method"] == "lora" and run.data.params["max_steps"] == "2"
    assert (run.data.params["world_size"], run.data.params["precision"]) == ("2", "fp32")
    history = json.loads((run_dir / "train" / "training_history.json").read_text())
    logged = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    assert [(entry.step, entry.value) for entry in client.get_metric_history(run.info.run_id, "loss")] == logged
    assert [entry.step for entry in client.get_metric_history(run.info.run_id, "tokens_seen")] == [1, 2]
    evaluation = json.loads((run_dir / "evaluate" / "evaluation.json").read_text())
    assert run.data.metrics["fine_tuned_eval_loss"] == pytest.approx(evaluation["fine_tuned"]["eval_loss"])
    assert run.data.metrics["gate_passed"] == 1 and run.data.tags["gate.reason"] == evaluation["gate"]["reason"]
    names = {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
    assert {"report.html", "report.md", "evaluation.json", "sample_responses.json"} <= names
    report = Path(client.download_artifacts(run.info.run_id, "report.html", str(tmp_path)))
    assert report.read_bytes() == (run_dir / "evaluate" / "report.html").read_bytes()

    url = f"{mlflow_server.url}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
    training = json.loads((run_dir / "train" / "training_summary.json").read_text())["mlflow"]
    assert training["url"] == url and training["failed"] == 0 and training["metrics_unsent"] == 0
    assert evaluation["mlflow_run_url"] == url and f'<a href="{url}">' in report.read_text()
    assert f"- MLflow run: <{url}>" in (run_dir / "publish" / "upload" / "README.md").read_text()
    (version,) = model_registry.model_versions.values()
    assert version["customProperties"]["mlflow_run_url"]["string_value"] == url
    assert f"MLflow run: {url}" in result.log


def test_a_stopped_mlflow_server_fails_the_first_step_with_one_paragraph(tmp_path):
    from mlflow_server import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    result = run_pipeline("--output-dir", tmp_path / "out", "--param", f"mlflow_tracking_uri={uri}", timeout=300)
    assert result.returncode == 1 and executed(result) == ["validate-parameters"]
    assert squash(
        f"parameter 'mlflow_tracking_uri' is {uri}, but the MLflow server there cannot track this run "
        f"(experiments/get-by-name: {uri} did not answer"
    ) in squash(result.stderr)
    assert squash("or clear mlflow_tracking_uri to run without MLflow") in squash(result.stderr)
    assert "Traceback" not in result.stderr


def test_unchanged_data_skips_training_export_and_publish(runs):
    """A scheduled run on the data the published model was trained on costs one preparation step."""
    _, [(first, first_dir), (second, second_dir), _] = runs
    succeeded(second)
    assert executed(second) == ["validate-parameters", "prepare-dataset", "check-data-changed", "report-skipped-2"]
    assert "data unchanged: training is skipped" in second.log
    assert "training:   not run: the data has not changed since the last publish" in second.stdout
    assert (
        "skipped: training, evaluation, export, publish, store, register and serve. Why: the prepared data has the "
        "fingerprint" in second.log
    )
    assert sorted(path.name for path in second_dir.iterdir()) == ["data"]
    # The runs share the workspace without touching each other's files.
    assert read_stats(second_dir / "data")["fingerprint"] == read_stats(first_dir / "data")["fingerprint"]
    assert (first_dir / "export").is_dir()


def test_force_trains_again_and_a_failed_gate_skips_export_and_publish(runs):
    """force retrains on unchanged data; a fine-tune that misses the quality gate is evaluated but never exported."""
    output_dir, [(first, first_dir), _, (third, third_dir)] = runs
    succeeded(third)
    assert executed(third) == [*EVERY_STEP[: EVERY_STEP.index("evaluate-model") + 1], "report-skipped"]
    assert "force is set" in third.log
    assert not list((output_dir / "workspace" / "token-cache").glob(".building-*"))
    gate = json.loads((third_dir / "evaluate" / "evaluation.json").read_text())["gate"]
    assert squash(f"skipped: export, publish, store, register and serve. Why: {gate['reason']}") in squash(third.log)
    assert "gate:       FAILED" in third.stdout and "export:     not run: the quality gate failed" in third.stdout
    assert sorted(path.name for path in third_dir.iterdir()) == ["data", "evaluate", "train"]
    assert gate["passed"] is False and "100" in gate["reason"]
    # The first run's dry-run publish is the model to beat: the step scored it too, on this run's split.
    evaluation = json.loads((third_dir / "evaluate" / "evaluation.json").read_text())
    assert evaluation["published_model"]["run_id"] == first_dir.name
    assert evaluation["published_model"]["loaded_as"].startswith("LoRA adapter on ")
    assert f"Against the published model (run {first_dir.name})" in gate["reason"]
    assert "force does not override the comparison with the base model" in gate["reason"]
    base, published, tuned = (evaluation[role]["eval_loss"] for role in ("base", "published", "fine_tuned"))
    assert f"eval loss:  base {base:.3f}, published {published:.3f} -> fine-tuned {tuned:.3f}" in third.stdout
    record = json.loads((output_dir / "workspace" / PUBLISHED / f"{DRY_RUN_NAME}.json").read_text())
    assert record["run_id"] == first_dir.name  # the published model is still the first run's


def test_bad_dataset_fails_with_the_data_stage_paragraph(tmp_path):
    """A user's garbage file is a user mistake: the run fails (non-zero), the step's one "error:" paragraph
    says what was wrong and where the rejects are, the runner adds which step failed, and there is no traceback."""
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('this is not json\n{"half": \nstill not json\n')
    out = tmp_path / "out"
    result = run_pipeline("--output-dir", out, "--param", f"dataset_uri={garbage}", timeout=300)
    assert result.returncode == 1
    # Compared without whitespace: the paragraph is wrapped at 100 columns (and kfp indents the step's log).
    log = squash(result.stderr)  # the failing step's last lines, on the terminal
    assert squash(f"error: No valid records remain in {garbage}: 3 of 3 were rejected") in log
    assert squash(f"{garbage} line 1: invalid JSON") in log
    assert squash(f"listed in {out}/workspace/runs/") in log and "/data/rejects.failed.jsonl." in log
    assert "Inner task failed" in result.stderr and "prepare-dataset" in result.stderr
    assert f"nothing after it ran. Its last lines (all of them are in {out}/run.log)" in result.stderr
    assert "  prepare-dataset ... failed (" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    (run_dir,) = run_dirs(out).values()
    assert not (run_dir / "data" / "stats.json").exists() and not (run_dir / "train").exists()
    rejects = [json.loads(line) for line in (run_dir / "data" / "rejects.failed.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["invalid_json"] * 3


def test_missing_dataset_fails_cleanly(tmp_path):
    """A dataset_uri that matches nothing names the path, without a traceback."""
    missing = tmp_path / "nowhere" / "data.jsonl"
    result = run_pipeline("--output-dir", tmp_path / "out", "--param", f"dataset_uri={missing}", timeout=300)
    assert result.returncode == 1
    assert squash(f"error: Input '{missing}' does not exist.") in squash(result.stderr)
    assert "Traceback" not in result.stdout + result.stderr


def test_url_of_an_unsupported_scheme_is_refused_with_the_fix(tmp_path):
    """https://, s3:// and hf://datasets/ are fetched (tests/test_sources.py); any other scheme is told
    which ones work, by the run parameters' check, before any step runs."""
    result = run_pipeline("--output-dir", tmp_path / "out", "--param", "dataset_uri=ftp://host/data.jsonl", timeout=300)
    assert result.returncode == 2
    assert squash(
        "error: The run parameters are invalid: parameter 'dataset_uri' is 'ftp://host/data.jsonl', whose scheme "
        "'ftp' this pipeline cannot fetch. Use a path on the workspace PVC, an https:// or s3:// URL"
    ) in squash(result.stderr)
    assert "Traceback" not in result.stdout + result.stderr and not (tmp_path / "out").exists()


def test_a_bad_training_option_fails_before_any_data_is_prepared(tmp_path):
    """Run-form mistakes in later stages are caught by the first step, in seconds, not after hours of training."""
    data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(20)])
    result = run_pipeline(
        "--output-dir", tmp_path / "out", "--param", f"dataset_uri={data}", "--param", "gguf_outtype=q3", timeout=300
    )
    assert result.returncode == 2
    assert "parameter 'gguf_outtype'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
