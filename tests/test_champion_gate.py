"""Scheduled retraining never publishes a worse model: the champion/challenger gate, end to end.

Runs of a tiny Llama (conftest's ``tiny_model_dir``) are prepared and trained by
the real data stage and ``python -m trainer``, evaluated by the real evaluation
CLI and published by the real publish CLI, one after another on one workspace,
as scheduled runs share a PVC. The published model is loaded the way the
evaluation step loads it: downloaded from the Hub (the LoRA adapter on its
base), or read from the upload folder a dry run's publish record names.

No real Hugging Face Hub can be reached here, so the Hub is ``tests/fake_hub.py``
on 127.0.0.1, which speaks the endpoints huggingface_hub uses (``snapshot_download``
included) and refuses a commit whose parent is no longer the head with 412, as the
Hub does. The export stage's GGUF and Modelfile are placeholders of the right
names: publishing only uploads them, and the export stage has its own tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_module, tokenised
from fake_hub import FakeHub
from huggingface_hub import ModelCard

from common.records import SampleAnswers
from common.run_layout import PUBLISHED, stage_dir
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.sample_data import SAMPLE_TASK

pytestmark = pytest.mark.slow

TOKEN = "hf_champion_test_token_0123456789"
REPO = "me/practical-skills"
GGUF = "practical-skills-q8_0.gguf"
BUNDLED = REPO_ROOT / "components" / "sample_data" / "practical_skills.jsonl"
# The standard benchmarks are not what these tests are about either (test_evaluate_stage.py runs them).
QUICK_EVALUATION = ("--score-rows", 2, "--max-new-tokens", 8, "--batch-size", 8, "--benchmark-tasks", "")
BENCHMARKED = ("--benchmark-tasks", SAMPLE_TASK, "--max-benchmark-drop", 1)
# The base comparison is not what these tests are about: let every model pass it.
LENIENT_BASE_GATE = ("--min-eval-loss-improvement", -100)


def records(count: int) -> str:
    return "".join(BUNDLED.read_text(encoding="utf-8").splitlines(keepends=True)[:count])


def trained_run(workspace: Path, run_id: str, base: Path, rows: int, *training: object) -> None:
    """Prepare ``rows`` bundled records, train on them with ``training`` options, and leave export placeholders."""
    data = stage_dir(workspace, run_id, "data")
    source = workspace / f"{run_id}.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(records(rows), encoding="utf-8")
    prepare(str(source), data, PrepareOptions(eval_fraction=0.25))
    result = run_module(
        "trainer",
        "--model",
        base,
        "--tokens-dir",
        tokenised(base, data),
        "--output-dir",
        stage_dir(workspace, run_id, "train"),
        "--max-length",
        128,
        "--per-device-batch-size",
        4,
        "--logging-steps",
        1,
        *training,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    export = stage_dir(workspace, run_id, "export")
    export.mkdir(parents=True)
    (export / GGUF).write_bytes(b"GGUF placeholder of " + run_id.encode())
    (export / "Modelfile").write_text(f"FROM ./{GGUF}\n")


def evaluate(workspace: Path, run_id: str, base: Path, env: dict, *extra: object):
    train = stage_dir(workspace, run_id, "train")
    return run_module(
        "components.evaluate",
        "--base-model",
        base,
        "--fine-tuned-model",
        train / "merged",
        "--data-dir",
        stage_dir(workspace, run_id, "data"),
        "--train-dir",
        train,
        "--output-dir",
        stage_dir(workspace, run_id, "evaluate"),
        "--workspace-root",
        workspace,
        *QUICK_EVALUATION,
        *extra,
        env=env,
        timeout=900,
    )


def publish(workspace: Path, run_id: str, env: dict, *extra: object):
    return run_module(
        "components.publish.stage",
        "--workspace-root",
        workspace,
        "--run-id",
        run_id,
        "--first-retry-wait-s",
        0,
        *extra,
        env=env,
        timeout=300,
    )


def evaluation_of(workspace: Path, run_id: str) -> dict:
    return json.loads((stage_dir(workspace, run_id, "evaluate") / "evaluation.json").read_text())


def squash(text: str) -> str:
    return " ".join(text.split())


def succeeded(result) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def hub():
    with FakeHub({TOKEN}) as fake:
        yield fake


@pytest.fixture(scope="module")
def history(hub, tiny_model_dir, tmp_path_factory):
    """Four runs publishing to one Hub repository, in order; each step's results by name.

    1. ``first``: barely trained; nothing is published yet, so it is published.
    2. ``better``: more data, trained for longer: beats the first and is published.
    3. ``worse``: trained at a learning rate too small to learn anything: loses to ``better``, is not published;
       then evaluated again with force, and published.
    """
    workspace = tmp_path_factory.mktemp("champion") / "workspace"
    env = hub.client_env(tmp_path_factory.mktemp("hf-home"), TOKEN)
    hub_args = ("--repo-id", REPO)
    done: dict[str, object] = {"workspace": workspace, "env": env}
    trained_run(workspace, "first", tiny_model_dir, 60, "--max-steps", 1, "--learning-rate", "1e-4")
    done["first_evaluation"] = evaluate(workspace, "first", tiny_model_dir, env, *hub_args, *LENIENT_BASE_GATE)
    done["first_publish"] = publish(workspace, "first", env, *hub_args)
    done["first_card"] = hub.repos[("model", REPO)].files["README.md"].decode()
    done["first_head"] = hub.repos[("model", REPO)].head
    done["first_commit"] = hub.repos[("model", REPO)].commits[-1]

    trained_run(workspace, "better", tiny_model_dir, 240, "--max-steps", 40, "--learning-rate", "1e-2")
    # This one also scores the three models on the bundled benchmark (the random tiny model's scores are near chance,
    # so any drop is allowed: the test is that the published model is scored like the others).
    done["better_evaluation"] = evaluate(workspace, "better", tiny_model_dir, env, *hub_args, *BENCHMARKED)
    done["better_publish"] = publish(workspace, "better", env, *hub_args)
    done["better_head"] = hub.repos[("model", REPO)].head
    done["better_commit"] = hub.repos[("model", REPO)].commits[-1]
    done["better_card"] = hub.repos[("model", REPO)].files["README.md"].decode()

    trained_run(workspace, "worse", tiny_model_dir, 200, "--max-steps", 2, "--learning-rate", "1e-7")
    done["worse_evaluation"] = evaluate(workspace, "worse", tiny_model_dir, env, *hub_args, *LENIENT_BASE_GATE)
    done["worse_json"] = evaluation_of(workspace, "worse")
    done["worse_report"] = (stage_dir(workspace, "worse", "evaluate") / "report.md").read_text()
    done["worse_publish"] = publish(workspace, "worse", env, *hub_args)
    done["worse_head"] = hub.repos[("model", REPO)].head
    done["forced_evaluation"] = evaluate(
        workspace, "worse", tiny_model_dir, env, *hub_args, *LENIENT_BASE_GATE, "--force"
    )
    done["forced_publish"] = publish(workspace, "worse", env, *hub_args)
    return done


def test_a_first_run_with_nothing_published_is_gated_on_its_base_alone_and_published(history, hub):
    succeeded(history["first_evaluation"])
    assert "published model: none yet" in history["first_evaluation"].stdout
    evaluation = evaluation_of(history["workspace"], "first")
    assert "published" not in evaluation and "published_model" not in evaluation
    assert [comparison["against"] for comparison in evaluation["gate"]["comparisons"]] == ["base"]
    succeeded(history["first_publish"])
    assert history["first_commit"]["summary"] == "Publish the model of pipeline run first"
    card = ModelCard(history["first_card"])
    (entry,) = card.data.published_history
    assert entry["run_id"] == "first" and entry["eval_loss"] == pytest.approx(evaluation["fine_tuned"]["eval_loss"])
    assert entry["data_fingerprint"] == card.data.data_fingerprint


def test_a_better_model_beats_the_published_one_and_the_card_lists_both(history, hub):
    """The second run loads the first's published adapter from the Hub, scores all three on its own split."""
    succeeded(history["better_evaluation"])
    evaluation = evaluation_of(history["workspace"], "better")
    published = evaluation["published_model"]
    assert published["run_id"] == "first" and published["revision"] == history["first_head"]
    assert published["loaded_as"].startswith("LoRA adapter on ")
    assert evaluation["published"]["eval_loss"] > evaluation["fine_tuned"]["eval_loss"]
    assert evaluation["deltas_vs_published"]["eval_loss"] == pytest.approx(
        evaluation["fine_tuned"]["eval_loss"] - evaluation["published"]["eval_loss"]
    )
    gate = evaluation["gate"]
    assert gate["passed"] and not gate["forced"]
    assert [(c["against"], c["passed"], c.get("benchmark")) for c in gate["comparisons"]] == [
        ("base", True, None),
        ("published", True, None),
        ("base", True, SAMPLE_TASK),
        ("published", True, SAMPLE_TASK),
    ]
    assert "Against the published model (run first): The eval loss improved by" in gate["reason"]
    # The published model is scored on the benchmark like the base and the new one, on the same 40 questions.
    scores = evaluation["benchmarks"]["scores"]
    assert set(scores) == {"base", "published", "fine_tuned"}
    assert {scores[role][SAMPLE_TASK]["examples"] for role in scores} == {40}

    succeeded(history["better_publish"])
    assert history["better_commit"]["summary"] == "Publish the model of pipeline run better"
    card_text = history["better_card"]
    card = ModelCard(card_text)
    first, second = card.data.published_history
    assert (first["run_id"], first["revision"]) == ("first", history["first_head"])
    assert second["run_id"] == "better" and "revision" not in second
    assert f"hf download {REPO} --revision {history['first_head']}" in card_text
    assert f'subfolder="adapter", revision="{history["first_head"]}"' in card_text
    assert "| 2 | `better` |" in card_text and "| 1 | `first` |" in card_text
    assert "| metric | base | published before | fine-tuned |" in card_text
    assert "the model published before this one (pipeline run `first`)" in squash(card_text)


def test_the_report_shows_base_published_and_new_side_by_side(history):
    evaluate_dir = stage_dir(history["workspace"], "better", "evaluate")
    markdown = (evaluate_dir / "report.md").read_text()
    assert "| Metric | Base | Published | New | Change vs base | Change vs published |" in markdown
    assert "| Task | Base | Published | New | Change vs base | Change vs published | Gate |" in markdown
    assert "**Published**" in markdown and "**New**" in markdown
    html = (evaluate_dir / "report.html").read_text()
    assert "<th>Base</th><th>Published</th><th>New</th>" in html
    samples = SampleAnswers.read(evaluate_dir / "demo_outputs" / "sample_responses.json").answers
    assert samples and all(sample.published is not None for sample in samples)  # each question: three answers
    stdout = history["better_evaluation"].stdout
    assert "published   eval loss" in stdout or "published  eval loss" in stdout


def test_a_worse_model_is_not_published_and_the_gate_says_which_comparison_failed(history, hub):
    succeeded(history["worse_evaluation"])
    evaluation = history["worse_json"]
    assert evaluation["published_model"]["run_id"] == "better"
    # The published adapter is applied: it scores better than the base it was trained from, the new model worse.
    assert evaluation["published"]["eval_loss"] < evaluation["base"]["eval_loss"]
    assert evaluation["fine_tuned"]["eval_loss"] > evaluation["published"]["eval_loss"]
    gate = evaluation["gate"]
    assert not gate["passed"] and not gate["forced"]
    assert [(c["against"], c["passed"]) for c in gate["comparisons"]] == [("base", True), ("published", False)]
    worse_by = evaluation["fine_tuned"]["eval_loss"] - evaluation["published"]["eval_loss"]
    assert (
        f"Against the published model (run better): The eval loss got worse by {worse_by:.4f} "
        f"(published {evaluation['published']['eval_loss']:.4f}, new {evaluation['fine_tuned']['eval_loss']:.4f}), "
        "which falls short of the required minimum improvement of 0.0000." in gate["reason"]
    )
    assert squash(
        f"quality gate FAILED (export, publish, store, register and serve are skipped): {gate['reason']}"
    ) in squash(history["worse_evaluation"].stdout)
    report = history["worse_report"]
    assert "Quality gate failed" in report and "got worse by" in report
    # The publish step refuses it too (the pipeline does not even run it), and the Hub is untouched.
    assert history["worse_publish"].returncode == 2 and "evaluation gate of this run failed" in squash(
        history["worse_publish"].stderr
    )
    assert history["worse_head"] == history["better_head"]


def test_force_publishes_the_worse_model_and_says_so(history, hub):
    succeeded(history["forced_evaluation"])
    evaluation = evaluation_of(history["workspace"], "worse")
    gate = evaluation["gate"]
    assert gate["passed"] and gate["forced"]
    assert "force is set, so the new model is published although it does not beat the published model" in gate["reason"]
    report = (stage_dir(history["workspace"], "worse", "evaluate") / "report.md").read_text()
    assert "Quality gate passed because force is set. Against the base model" in report
    succeeded(history["forced_publish"])
    card_text = hub.repos[("model", REPO)].files["README.md"].decode()
    assert "Quality gate: **passed, forced**" in card_text
    assert [entry["run_id"] for entry in ModelCard(card_text).data.published_history] == ["first", "better", "worse"]


def test_a_published_model_with_missing_files_is_a_clear_error_unless_forced(history, hub, tiny_model_dir):
    """A repository whose adapter was deleted cannot be compared: the evaluation stops and names the fix; with
    force it goes on, and the report says the comparison was skipped."""
    workspace, env = history["workspace"], history["env"]
    repo = hub.repos[("model", REPO)]
    lost = [name for name in repo.files if name.startswith("adapter/")]
    assert lost
    for name in lost:
        del repo.files[name]
    hub._commit(repo, "Delete the adapter", "", [{"key": "deletedFile", "path": name} for name in lost], {}, set())

    refused = evaluate(workspace, "better", tiny_model_dir, env, "--repo-id", REPO)
    assert refused.returncode == 2, refused.stderr[-3000:]
    error = squash(refused.stderr)
    assert "Traceback" not in refused.stderr
    assert (
        f"error: The published model cannot be loaded to compare the new one with it: the model card of {REPO} at "
        f"commit {repo.head[:12]} holds neither a merged checkpoint" in error
    )
    assert "set force=true for this run to publish the new model without comparing it" in error

    forced = evaluate(workspace, "better", tiny_model_dir, env, "--repo-id", REPO, "--force")
    succeeded(forced)
    evaluation = evaluation_of(workspace, "better")
    assert "published" not in evaluation and evaluation["gate"]["passed"] and evaluation["gate"]["forced"]
    assert "holds neither a merged checkpoint" in evaluation["published_model"]["problem"]
    assert "force is set, so the new model is published without that comparison" in evaluation["gate"]["reason"]


def test_the_publish_step_refuses_a_model_that_was_not_compared_with_what_is_published_now(history, hub):
    """Another run published between this run's evaluation and its publish step: nothing is committed."""
    workspace, env = history["workspace"], history["env"]
    repo = hub.repos[("model", REPO)]
    other_card = "---\npublished_history:\n- run_id: other\n---\n# Published by another run\n"
    repo.files["README.md"] = other_card.encode()
    hub._commit(repo, "Publish the model of pipeline run other", "", [{"key": "file", "path": "README.md"}], {}, set())
    head = repo.head
    result = publish(workspace, "worse", env, "--repo-id", REPO)
    assert result.returncode == 2 and repo.head == head
    error = squash(result.stderr)
    assert "This run's evaluation compared the new model with the model card of" in error
    assert f"but the model card of {REPO} at commit {head[:12]} is published now" in error
    assert "The new model was never compared with it, so it is not published. Start the run again" in error


@pytest.fixture(scope="module")
def dry_runs(history, tiny_model_dir, tmp_path_factory):
    """The first and better runs again on a workspace without a repository or a token: the publish record and
    the upload folder it names are what the next run compares with."""
    workspace = tmp_path_factory.mktemp("dry") / "workspace"
    for run_id in ("first", "better"):
        for stage in ("data", "train", "export"):
            shutil.copytree(stage_dir(history["workspace"], run_id, stage), stage_dir(workspace, run_id, stage))
    env = {key: value for key, value in history["env"].items() if key != "HF_TOKEN"}
    done = {"workspace": workspace, "env": env}
    done["first_evaluation"] = evaluate(workspace, "first", tiny_model_dir, env, *LENIENT_BASE_GATE)
    done["first_publish"] = publish(workspace, "first", env)
    done["better_evaluation"] = evaluate(workspace, "better", tiny_model_dir, env)
    done["better_json"] = evaluation_of(workspace, "better")
    done["better_publish"] = publish(workspace, "better", env)
    return done


def test_a_dry_run_publish_is_the_champion_of_the_next_local_run(dry_runs):
    for step in ("first_evaluation", "first_publish", "better_evaluation", "better_publish"):
        succeeded(dry_runs[step])
    workspace = dry_runs["workspace"]
    evaluation = dry_runs["better_json"]
    assert evaluation["published_model"]["run_id"] == "first" and evaluation["published_model"]["revision"] is None
    assert str(stage_dir(workspace, "first", "publish") / "upload") in evaluation["published_model"]["description"]
    assert evaluation["gate"]["passed"] and evaluation["published"]["eval_loss"] > evaluation["fine_tuned"]["eval_loss"]
    record = json.loads((workspace / PUBLISHED / "dry-run.json").read_text())
    assert record["run_id"] == "better"
    card = ModelCard((stage_dir(workspace, "better", "publish") / "upload" / "README.md").read_text())
    assert [entry["run_id"] for entry in card.data.published_history] == ["first", "better"]


def test_a_recorded_publish_whose_folder_is_gone_is_a_clear_error(dry_runs, tiny_model_dir):
    workspace = dry_runs["workspace"]
    shutil.rmtree(stage_dir(workspace, "better", "publish"))
    result = evaluate(workspace, "first", tiny_model_dir, dry_runs["env"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = squash(result.stderr)
    assert "the publish of run better recorded in" in error and "but that folder is gone" in error
    assert "delete the publish record" in error
