"""`python -m pipelines.run` executes the real DAG through kfp.local on this machine, end to end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, read_split, read_stats, run_module, write_jsonl

pytestmark = pytest.mark.slow

BUNDLED_RECORDS = 324  # lines of components/sample_data/practical_skills.jsonl, all valid, no duplicates
BUNDLED_TRAIN, BUNDLED_EVAL = 298, 26  # with the default eval_fraction 0.1 and split_seed 42


def run_pipeline(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_module("pipelines.run", *args, timeout=timeout)


def squash(text: str) -> str:
    return "".join(text.split())


def data_dirs(output_dir: Path) -> list[Path]:
    """The data stage's directory of each run under ``output_dir`` (workspace/runs/<run id>/data)."""
    return sorted((output_dir / "workspace" / "runs").glob("*/data"))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One default run on the bundled dataset, shared by the tests that inspect it."""
    output_dir = tmp_path_factory.mktemp("local-run") / "out"
    return output_dir, run_pipeline("--output-dir", output_dir)


def test_default_run_succeeds_and_says_where_outputs_went(default_run):
    """`make run` on a fresh machine must succeed and tell the user where to look, listing real files."""
    output_dir, result = default_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"running pipeline locally; outputs go to {output_dir}" in result.stdout
    assert "pipeline finished; outputs:" in result.stdout
    listed = [Path(line.strip()) for line in result.stdout.split("pipeline finished; outputs:")[1].splitlines() if line.strip()]
    (data_dir,) = data_dirs(output_dir)
    for name in ("train.parquet", "eval.parquet", "rejects.jsonl", "stats.json"):
        assert data_dir / name in listed
    assert all(path.is_file() and output_dir in path.parents for path in listed)
    assert not any(path.name == "executor_output.json" for path in listed)


def test_default_run_prepares_the_bundled_dataset(default_run):
    """The bundled sample is the default data: every record ends up in train or eval, none rejected."""
    output_dir, result = default_run
    assert result.returncode == 0, result.stderr[-3000:]
    (data_dir,) = data_dirs(output_dir)
    train, evaluation = read_split(data_dir, "train"), read_split(data_dir, "eval")
    assert (len(train), len(evaluation)) == (BUNDLED_TRAIN, BUNDLED_EVAL)
    assert len(train) + len(evaluation) == BUNDLED_RECORDS
    assert not {row["id"] for row in train} & {row["id"] for row in evaluation}
    stats = read_stats(data_dir)
    assert stats["records"] == BUNDLED_RECORDS and stats["rejected"] == 0
    assert stats["inputs"] == [str(REPO_ROOT / "components" / "sample_data" / "practical_skills.jsonl")]
    assert train[0]["messages"][0]["role"] == "user" and train[0]["messages"][-1]["role"] == "assistant"


def test_fingerprint_reaches_the_log_and_the_artifacts(default_run):
    """The data fingerprint ties a run's log, its stats.json and its KFP artifacts to the same data."""
    output_dir, result = default_run
    assert result.returncode == 0, result.stderr[-3000:]
    (data_dir,) = data_dirs(output_dir)
    fingerprint = read_stats(data_dir)["fingerprint"]
    assert fingerprint.startswith("sha256:") and len(fingerprint) == len("sha256:") + 64
    assert f"fingerprint {fingerprint}" in result.stdout
    (train_artifact,) = (output_dir / "artifacts").glob("*/prepare-dataset/train_data")
    assert train_artifact.read_bytes() == (data_dir / "train.parquet").read_bytes()
    (eval_artifact,) = (output_dir / "artifacts").glob("*/prepare-dataset/eval_data")
    assert eval_artifact.read_bytes() == (data_dir / "eval.parquet").read_bytes()


def test_parameters_reach_the_data_stage(tmp_path):
    """--param values must arrive in the step: a changed split, a system prompt, a different dataset."""
    data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(50)])
    out = tmp_path / "out"
    result = run_pipeline(
        "--output-dir", out,
        "--param", f"dataset_uri={data}",
        "--param", "eval_fraction=0",
        "--param", "system_prompt=Be brief.",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (data_dir,) = data_dirs(out)
    stats = read_stats(data_dir)
    assert stats["options"]["eval_fraction"] == 0 and stats["options"]["system_prompt"] == "Be brief."
    assert stats["rows"] == {"train": 50, "eval": 0}
    assert read_split(data_dir, "train")[0]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_bad_dataset_fails_with_the_data_stage_paragraph(tmp_path):
    """A user's garbage file is a user mistake: the run fails (non-zero), the step's one "error:" paragraph
    says what was wrong and where the rejects are, the runner adds which step failed, and there is no traceback."""
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\n{\"half\": \nstill not json\n")
    out = tmp_path / "out"
    result = run_pipeline("--output-dir", out, "--param", f"dataset_uri={garbage}")
    assert result.returncode == 1
    # Compared without whitespace: the paragraph is wrapped at 100 columns (and kfp indents the step's log).
    log = squash(result.stdout)
    assert squash(f"error: No valid records remain in {garbage}: 3 of 3 were rejected") in log
    assert squash(f"{garbage} line 1: invalid JSON") in log
    assert squash(f"listed in {out}/workspace/runs/") in log and "/data/rejects.failed.jsonl." in log
    assert "Inner task failed" in result.stderr and "prepare-dataset" in result.stderr
    assert "The failing step's log above says why; nothing after it ran." in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (data_dir,) = data_dirs(out)
    assert not (data_dir / "stats.json").exists()
    rejects = [json.loads(line) for line in (data_dir / "rejects.failed.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["invalid_json"] * 3


def test_missing_dataset_fails_cleanly(tmp_path):
    """A dataset_uri that matches nothing names the path, without a traceback."""
    missing = tmp_path / "nowhere" / "data.jsonl"
    result = run_pipeline("--output-dir", tmp_path / "out", "--param", f"dataset_uri={missing}")
    assert result.returncode == 1
    assert squash(f"error: Input '{missing}' does not exist.") in squash(result.stdout)
    assert "Traceback" not in result.stdout + result.stderr


def test_url_of_an_unsupported_scheme_is_refused_with_the_fix(tmp_path):
    """https://, s3:// and hf://datasets/ are fetched (tests/test_sources.py); any other scheme is told which ones work."""
    result = run_pipeline("--output-dir", tmp_path / "out", "--param", "dataset_uri=ftp://host/data.jsonl")
    assert result.returncode == 1
    assert squash("error: dataset_uri 'ftp://host/data.jsonl' uses the scheme 'ftp', which this pipeline cannot fetch.") in squash(result.stdout)
    assert "Traceback" not in result.stdout + result.stderr


def test_two_runs_share_an_output_dir_without_collision(tmp_path):
    """Runs sharing a workspace write under their own run id; the same data gives the same fingerprint."""
    out = tmp_path / "out"
    first = run_pipeline("--output-dir", out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (first_dir,) = data_dirs(out)
    first_train = (first_dir / "train.parquet").read_bytes()
    second = run_pipeline("--output-dir", out)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    dirs = data_dirs(out)
    assert len(dirs) == 2 and first_dir in dirs
    assert (first_dir / "train.parquet").read_bytes() == first_train
    assert {read_stats(d)["fingerprint"] for d in dirs} == {read_stats(first_dir)["fingerprint"]}
