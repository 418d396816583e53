"""The evaluation stage end to end: real SmolLM2-135M generation on CPU, a real fine-tune, real files.

The fine-tuned model comes from ``python -m trainer`` itself (LoRA, two steps,
short sequences, one process) on a 40-record slice of the bundled data, so the
stage reads exactly what the training stage writes: merged/,
training_summary.json, loss_curve.png. Generation is kept short (few scored
rows, few new tokens) to bound the run time; the code paths are the full ones.
The standard benchmark is the bundled lm-eval task (40 practical-skills questions),
scored for real by lm-eval on both models.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_module, tokenised
from kfp import dsl
from markupsafe import escape as escape_html

from common.records import SampleAnswers
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.evaluate.options import DEFAULT_QUESTIONS
from components.pipeline_steps.stages import evaluate_model
from components.sample_data import SAMPLE_TASK, bundled_task_dir

pytestmark = pytest.mark.slow

EXTRA_QUESTION = "How do I tie a bowline?"
QUESTIONS = [*DEFAULT_QUESTIONS, EXTRA_QUESTION]
SCORED_ROWS, MAX_NEW_TOKENS = 2, 24
# A loss threshold any fine-tune meets, for the runs that are about something else.
LENIENT_LOSS = ("--min-eval-loss-improvement", -10)
METRIC_NAMES = {
    "base_eval_loss",
    "fine_tuned_eval_loss",
    "eval_loss_delta",
    "base_perplexity",
    "fine_tuned_perplexity",
    "perplexity_delta",
    "base_rouge_l",
    "fine_tuned_rouge_l",
    "rouge_l_delta",
    "gate_passed",
    "gate_forced",
}


def prepared(records: list[str], target: Path, eval_fraction: float) -> Path:
    source = target.parent / f"{target.name}.jsonl"
    source.write_text("".join(records), encoding="utf-8")
    prepare(str(source), target, PrepareOptions(eval_fraction=eval_fraction))
    return target


@pytest.fixture(scope="module")
def bundled_records() -> list[str]:
    return (
        (REPO_ROOT / "components" / "sample_data" / "practical_skills.jsonl")
        .read_text(encoding="utf-8")
        .splitlines(keepends=True)
    )


@pytest.fixture(scope="module")
def data_dir(bundled_records, tmp_path_factory) -> Path:
    return prepared(bundled_records[:40], tmp_path_factory.mktemp("eval-data") / "data", eval_fraction=0.25)


@pytest.fixture(scope="module")
def train_dir(smollm2_dir, data_dir, tmp_path_factory) -> Path:
    """A real LoRA fine-tune of SmolLM2 by the training stage: two optimizer steps on 64-token sequences."""
    output = tmp_path_factory.mktemp("train") / "train"
    result = run_module(
        "trainer",
        "--model",
        smollm2_dir,
        "--tokens-dir",
        tokenised(smollm2_dir, data_dir, max_length=64),
        "--output-dir",
        output,
        "--max-steps",
        2,
        "--max-length",
        64,
        "--per-device-batch-size",
        2,
        "--learning-rate",
        "1e-3",
        "--logging-steps",
        1,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def assert_refused_before_scoring(result: subprocess.CompletedProcess, message: str, out: Path) -> None:
    """The stage's command exited 2 with one paragraph matching ``message``, before any model was scored."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    error = " ".join(result.stderr.split("error: ", 1)[1].split())
    assert re.search(message, error), error
    assert "base:" not in result.stdout and not out.exists()


def evaluate_cli(
    base: Path,
    fine_tuned: Path,
    data_dir: Path,
    train_dir: Path,
    output_dir: Path,
    *extra,
    score_rows: int = SCORED_ROWS,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> subprocess.CompletedProcess:
    return run_module(
        "components.evaluate",
        "--base-model",
        base,
        "--fine-tuned-model",
        fine_tuned,
        "--data-dir",
        data_dir,
        "--train-dir",
        train_dir,
        "--output-dir",
        output_dir,
        "--score-rows",
        score_rows,
        "--max-new-tokens",
        max_new_tokens,
        "--batch-size",
        8,
        "--benchmark-tasks",
        SAMPLE_TASK,
        *extra,
        timeout=900,
    )


@pytest.fixture(scope="module")
def cli_run(smollm2_dir, data_dir, train_dir, tmp_path_factory):
    """One CLI evaluation with a threshold any fine-tune meets: the gate passes."""
    output_dir = tmp_path_factory.mktemp("evaluate") / "evaluate"
    result = evaluate_cli(
        smollm2_dir,
        train_dir / "merged",
        data_dir,
        train_dir,
        output_dir,
        "--extra-questions",
        EXTRA_QUESTION,
        *LENIENT_LOSS,
        "--max-benchmark-drop",
        1,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output_dir, result


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_metrics_are_finite_and_the_deltas_are_the_differences(cli_run, train_dir):
    output_dir, _ = cli_run
    evaluation = read_json(output_dir / "evaluation.json")
    assert evaluation["base_model"] and evaluation["fine_tuned_model"] == str(train_dir / "merged")
    assert evaluation["scored_rows"] == SCORED_ROWS
    for role in ("base", "fine_tuned"):
        entry = evaluation[role]
        assert set(entry) == {"eval_loss", "perplexity", "rouge_l", "eval_tokens"}
        assert all(math.isfinite(entry[key]) for key in ("eval_loss", "perplexity", "rouge_l"))
        assert entry["perplexity"] == pytest.approx(math.exp(entry["eval_loss"]), rel=1e-12)
        assert 0.0 <= entry["rouge_l"] <= 1.0
    assert evaluation["base"]["eval_tokens"] == evaluation["fine_tuned"]["eval_tokens"] > 0
    assert evaluation["deltas"] == {
        key: evaluation["fine_tuned"][key] - evaluation["base"][key] for key in ("eval_loss", "perplexity", "rouge_l")
    }
    # LoRA changed the model, so the losses differ; and the fine-tuned loss is the one the trainer
    # measured at its end on the same split and truncation (it averages per-batch means, hence the tolerance).
    assert evaluation["deltas"]["eval_loss"] != 0.0
    trainer_eval_loss = read_json(train_dir / "training_summary.json")["final_eval_loss"]
    assert evaluation["fine_tuned"]["eval_loss"] == pytest.approx(trainer_eval_loss, rel=0.05)


def test_passing_gate_is_recorded_with_its_numbers(cli_run):
    output_dir, result = cli_run
    evaluation = read_json(output_dir / "evaluation.json")
    gate = evaluation["gate"]
    assert gate["passed"] is True and gate["min_eval_loss_improvement"] == -10.0
    assert (
        f"base {evaluation['base']['eval_loss']:.4f}, fine-tuned {evaluation['fine_tuned']['eval_loss']:.4f}"
        in gate["reason"]
    )
    assert "which meets the required minimum improvement of -10.0000" in gate["reason"]
    assert f"quality gate passed: {gate['reason']}" in result.stdout


def test_every_question_has_two_answers_in_the_samples_and_both_reports(cli_run):
    output_dir, _ = cli_run
    samples = SampleAnswers.read(output_dir / "demo_outputs" / "sample_responses.json").answers
    assert [sample.question for sample in samples] == QUESTIONS
    assert all(sample.base.strip() and sample.fine_tuned.strip() for sample in samples), samples
    assert all(sample.published is None for sample in samples)  # nothing published was compared
    assert all(
        "<|im_end|>" not in answer and "<|im_start|>" not in answer
        for sample in samples
        for answer in (sample.base, sample.fine_tuned)
    )

    markdown = (output_dir / "report.md").read_text(encoding="utf-8")
    html = (output_dir / "report.html").read_text(encoding="utf-8")
    for sample in samples:
        section = markdown.split(f". {escape(sample.question, quote=False)}\n", 1)[1].split("\n### ", 1)[0]
        base_part, tuned_part = section.split("**Fine-tuned**")
        assert escape(sample.base, quote=False).splitlines()[0] in base_part
        assert escape(sample.fine_tuned, quote=False).splitlines()[0] in tuned_part
        # report.html is rendered with Jinja's autoescape, which is markupsafe's escape (&#39; for ', &#34; for ").
        row = html.split(f". {escape_html(sample.question)}</th></tr>", 1)[1].split("</tr>", 1)[0]
        assert row == f"<tr><td>{escape_html(sample.base)}</td><td>{escape_html(sample.fine_tuned)}</td>"
    assert "Quality gate passed" in markdown and "Quality gate passed" in html


def test_reports_show_the_training_loss_curve(cli_run, train_dir):
    """report.md links the copy beside it; report.html carries the same PNG inside itself."""
    output_dir, _ = cli_run
    png = (train_dir / "loss_curve.png").read_bytes()
    assert (output_dir / "loss_curve.png").read_bytes() == png
    assert "![Training and eval loss per step](loss_curve.png)" in (output_dir / "report.md").read_text(
        encoding="utf-8"
    )
    html = (output_dir / "report.html").read_text(encoding="utf-8")
    embedded = html.split('src="data:image/png;base64,', 1)[1].split('"', 1)[0]
    assert base64.b64decode(embedded) == png
    assert 'src="http' not in html and "href=" not in html  # nothing for the UI to fetch
    assert not list(output_dir.glob(".staging-*"))


def test_failed_gate_is_a_result_not_an_error_and_fills_the_kfp_artifacts(
    smollm2_dir, data_dir, train_dir, tmp_path, capsys
):
    """The component's body with a threshold no two-step fine-tune meets: it returns the decision and the UI shows why.

    ``python_func`` is the body KFP runs in the pod; real KFP artifact objects with local URIs.
    """
    eval_dir = tmp_path / "workspace" / "runs" / "run-1" / "evaluate"  # where the step puts its stage directory
    metrics = dsl.Metrics(uri=str(tmp_path / "metrics"))
    html, markdown = dsl.HTML(uri=str(tmp_path / "report_html")), dsl.Markdown(uri=str(tmp_path / "report_markdown"))
    # Short answers and one scored row: this run is about the gate and the artifacts.
    outputs = evaluate_model.python_func(
        workspace_root=str(tmp_path / "workspace"),
        run_id="run-1",
        base_model=str(smollm2_dir),
        train_dir=str(train_dir),
        data_dir=str(data_dir),
        tokens_dir=str(tokenised(smollm2_dir, data_dir, max_length=64)),
        extra_questions=[],
        max_new_tokens=8,
        score_rows=1,
        min_eval_loss_improvement=10.0,
        min_reward_accuracy_improvement=0.05,
        min_improvement_over_published=0.0,
        batch_size=8,
        benchmark_tasks="",
        benchmark_allow_code=False,
        benchmark_limit=1000,
        benchmark_fewshot=0,
        benchmark_batch_size=16,
        max_benchmark_drop=0.02,
        mlflow_tracking_uri="",
        mlflow_experiment="llm-finetune",
        repo_id="",
        force=False,
        gpus=0,
        metrics=metrics,
        report_html=html,
        report_markdown=markdown,
    )
    assert outputs.gate_passed is False
    reason = outputs.gate_reason
    assert "which falls short of the required minimum improvement of 10.0000" in reason
    assert "FAILED (export, publish, store, register and serve are skipped)" in capsys.readouterr().out

    evaluation = read_json(eval_dir / "evaluation.json")
    assert evaluation["gate"] == {
        "passed": False,
        "min_eval_loss_improvement": 10.0,
        "max_benchmark_drop": 0.02,
        "reason": reason,
        "forced": False,
        "comparisons": [{"against": "base", "passed": False, "reason": reason}],
        "measure": "eval_loss",
    }
    # benchmark_tasks empty: none ran, and the step and the reports say so.
    assert evaluation["benchmarks"] == {"skipped": "benchmark_tasks is empty, so no standard benchmark was run."}
    # Nothing was published on this workspace: the step looked (its record) and compared with the base alone.
    assert evaluation["published_search"] == {"repo_id": "", "on_hub": False} and "published" not in evaluation
    assert set(metrics.metadata) == METRIC_NAMES
    assert metrics.metadata["gate_passed"] == 0
    for role in ("base", "fine_tuned"):
        for key in ("eval_loss", "perplexity", "rouge_l"):
            assert metrics.metadata[f"{role}_{key}"] == evaluation[role][key]
    assert metrics.metadata["eval_loss_delta"] == evaluation["deltas"]["eval_loss"]

    html_text = Path(html.path).read_text(encoding="utf-8")
    markdown_text = Path(markdown.path).read_text(encoding="utf-8")
    assert html_text == (eval_dir / "report.html").read_text(encoding="utf-8")
    assert "Quality gate failed: the model is not exported or published." in html_text and escape(reason) in html_text
    assert "Quality gate failed" in markdown_text and "](data:image/png;base64," in markdown_text
    for text in (html_text, markdown_text):
        assert "No standard benchmarks: benchmark_tasks is empty" in text
    samples = SampleAnswers.read(eval_dir / "demo_outputs" / "sample_responses.json").answers
    assert [sample.question for sample in samples] == list(DEFAULT_QUESTIONS)
    assert html.metadata["workspace_path"] == str(eval_dir / "report.html")


@pytest.mark.parametrize(
    ("eval_fraction", "extra", "message"),
    [
        (0.0, [], r"eval_conversations\.arrow has no rows: the data stage held no rows out, .* eval_fraction above 0"),
        (
            0.25,
            ["--max-length", 16],
            r"none of the \d+ eval conversations in .* has an assistant token within the first 16 tokens",
        ),
    ],
)
def test_no_usable_eval_rows_is_a_clear_error(smollm2_dir, bundled_records, tmp_path, eval_fraction, extra, message):
    """Nothing to evaluate on must stop the stage with one readable paragraph before any model is loaded."""
    data = prepared(bundled_records[:40], tmp_path / "data", eval_fraction)
    tokens = tokenised(smollm2_dir, data)
    result = evaluate_cli(
        smollm2_dir, smollm2_dir, data, tmp_path / "no-training-run", tmp_path / "out", "--tokens-dir", tokens, *extra
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    error = " ".join(result.stderr.split("error: ", 1)[1].split())
    assert str(tokens) in error
    assert re.search(message, error), error
    assert not (tmp_path / "out").exists()


def test_lm_eval_scores_both_models_on_the_same_examples_and_the_reports_show_the_table(cli_run):
    output_dir, result = cli_run
    benchmarks = read_json(output_dir / "evaluation.json")["benchmarks"]
    assert benchmarks["tasks"] == [SAMPLE_TASK] and benchmarks["requested"] == [SAMPLE_TASK]
    assert (benchmarks["limit"], benchmarks["num_fewshot"], benchmarks["batch_size"]) == (1000, 0, 16)
    scores = benchmarks["scores"]
    assert set(scores) == {"base", "fine_tuned"}
    for role in ("base", "fine_tuned"):
        entry = scores[role][SAMPLE_TASK]
        assert entry["metric"] == "acc_norm" and entry["higher_is_better"] is True
        assert entry["examples"] == 40  # all 40 questions, for both models
        assert 0.0 <= entry["value"] <= 1.0 and entry["value"] * 40 == pytest.approx(round(entry["value"] * 40))
        assert entry["stderr"] == pytest.approx(math.sqrt(entry["value"] * (1 - entry["value"]) / 39))
    base, tuned = (scores[role][SAMPLE_TASK] for role in ("base", "fine_tuned"))
    row = (
        f"| {SAMPLE_TASK}: acc_norm, higher is better, 40 examples | {base['value']:.4f} ± {base['stderr']:.4f} | "
        f"{tuned['value']:.4f} ± {tuned['stderr']:.4f} | {tuned['value'] - base['value']:+.4f} | passes |"
    )
    assert row in (output_dir / "report.md").read_text(encoding="utf-8")
    assert "<h2>Standard benchmarks</h2>" in (output_dir / "report.html").read_text(encoding="utf-8")
    assert (
        f"benchmark {SAMPLE_TASK}: acc_norm, higher is better, 40 examples: base {base['value']:.4f}" in result.stdout
    )
    assert "benchmarks (zero-shot, batch 16): practical_skills_mc (40 examples)" in result.stdout


def test_the_stage_scores_the_base_model_as_lm_eval_s_own_command_line_does(cli_run, smollm2_dir, tmp_path):
    """Our scoring wraps the model the stage loaded; lm-eval's CLI loads it itself: the same number."""
    output_dir, _ = cli_run
    ours = read_json(output_dir / "evaluation.json")["benchmarks"]["scores"]["base"][SAMPLE_TASK]
    result = subprocess.run(
        [
            str(Path(sys.executable)),
            "-m",
            "lm_eval",
            "run",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={smollm2_dir},dtype=float32",
            "--tasks",
            SAMPLE_TASK,
            "--include_path",
            str(bundled_task_dir()),
            "--device",
            "cpu",
            "--batch_size",
            "16",
            "--output_path",
            str(tmp_path / "lm-eval"),
        ],
        cwd=bundled_task_dir(),  # lm-eval reads the task's relative data file against the working directory
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (results_file,) = (tmp_path / "lm-eval").rglob("results_*.json")
    theirs = read_json(results_file)["results"][SAMPLE_TASK]
    assert ours["value"] == pytest.approx(theirs["acc_norm,none"], abs=1e-9)


def test_a_benchmark_drop_beyond_the_maximum_fails_the_gate_naming_the_task(smollm2_dir, data_dir, train_dir, tmp_path):
    """max_benchmark_drop -1 asks the fine-tune to gain a whole point of accuracy: no model can, so the gate fails on
    the benchmark alone (the loss comparison is set to pass). Short answers, one scored row and ten benchmark
    questions: this run is about the gate."""
    output_dir = tmp_path / "evaluate"
    result = evaluate_cli(
        *(smollm2_dir, train_dir / "merged", data_dir, train_dir, output_dir, *LENIENT_LOSS),
        *("--max-benchmark-drop", -1, "--benchmark-limit", 10),
        score_rows=1,
        max_new_tokens=8,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluation = read_json(output_dir / "evaluation.json")
    gate = evaluation["gate"]
    assert not gate["passed"] and not gate["forced"]
    assert [(c["against"], c["passed"], c.get("benchmark")) for c in gate["comparisons"]] == [
        ("base", True, None),
        ("base", False, SAMPLE_TASK),
    ]
    base, tuned = (evaluation["benchmarks"]["scores"][role][SAMPLE_TASK]["value"] for role in ("base", "fine_tuned"))
    assert (
        f"{SAMPLE_TASK} acc_norm" in gate["reason"]
        and f"(base {base:.4f}, new {tuned:.4f}), more than max_benchmark_drop -1.0000" in gate["reason"]
    )
    assert f"quality gate FAILED (export, publish, store, register and serve are skipped): {gate['reason']}" in (
        result.stdout
    )
    assert f"benchmark {SAMPLE_TASK}: acc_norm" in result.stdout and "fails against base" in result.stdout


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ("arc_eazy", r"benchmark_tasks names tasks lm-eval does not have: arc_eazy \(did you mean arc_easy"),
        ("./broken", r"the benchmark task practical_skills_mc \(.*\) cannot be loaded \(UndefinedError: 'prompt' is"),
    ],
)
def test_a_task_that_cannot_load_stops_the_step_before_any_model_is_scored(
    smollm2_dir, data_dir, train_dir, tmp_path, tasks, message
):
    broken = Path(shutil.copytree(bundled_task_dir(), tmp_path / "broken"))
    yaml_file = broken / f"{SAMPLE_TASK}.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("{{question}}", "{{prompt}}"))
    result = evaluate_cli(
        smollm2_dir,
        train_dir / "merged",
        data_dir,
        train_dir,
        tmp_path / "out",
        "--benchmark-tasks",
        tasks,
        "--tasks-root",
        tmp_path,
    )
    assert_refused_before_scoring(result, message, tmp_path / "out")


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        (
            "/srv/tasks/mine",
            r"^invalid evaluation options: benchmark_tasks names task directories outside the workspace "
            r"\(/srv/tasks/mine is an absolute path\): a task directory is code",
        ),
        (
            "./with-python",
            r"^benchmark_tasks names the task directory \./with-python, which holds Python \(with-python/utils\.py, "
            r"with-python/practical_skills_mc\.yaml: !function utils\.first_ten\): .* the Hub write token and the "
            r"service-account token\. .* set benchmark_allow_code to true\.$",
        ),
    ],
)
def test_a_task_directory_that_is_code_stops_the_step_before_any_model_is_scored(
    smollm2_dir, bundled_records, tmp_path, tasks, message
):
    """A task directory outside the workspace, or one with Python and no benchmark_allow_code: one paragraph naming
    benchmark_tasks and the fix, and the task's Python never ran (it would leave a file beside itself)."""
    task = Path(shutil.copytree(bundled_task_dir(), tmp_path / "with-python"))
    (task / "utils.py").write_text(
        'from pathlib import Path\n\nPath(__file__).with_name("imported").write_text("ran")\n\n\n'
        "def first_ten(dataset):\n    return dataset.select(range(10))\n"
    )
    yaml_file = task / f"{SAMPLE_TASK}.yaml"
    yaml_file.write_text(yaml_file.read_text() + "process_docs: !function utils.first_ten\n")
    data = prepared(bundled_records[:40], tmp_path / "data", eval_fraction=0.25)
    result = evaluate_cli(
        smollm2_dir,
        smollm2_dir,
        data,
        tmp_path / "no-training-run",
        tmp_path / "out",
        "--tokens-dir",
        tokenised(smollm2_dir, data),
        "--benchmark-tasks",
        tasks,
        "--tasks-root",
        tmp_path,
    )
    assert_refused_before_scoring(result, message, tmp_path / "out")
    assert not (task / "imported").exists()
