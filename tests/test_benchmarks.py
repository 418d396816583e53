"""The standard benchmarks' parts: loading lm-eval tasks (the bundled local task, broken ones, unknown names),
the placement check, the main metric, the gate's per-task comparisons with their force rule, and the reports'
task x model table. The whole evaluation with real lm-eval scoring is in test_evaluate_stage.py.

lm-eval itself loads every task here (its TaskManager, its YAML loader, ``datasets`` for the data files); no Hub
is reachable, so registry tasks are only looked up in its index, never downloaded.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from common.errors import UserError
from components.benchmark_tasks.tasks import (
    CPU_GENERATION_PARAMETERS,
    BenchmarkTasks,
    check_placement,
    load_tasks,
    main_metric,
)
from components.evaluate.gate import (
    benchmark_comparisons,
    decide,
    decide_with_published,
    decide_without_published,
    with_benchmarks,
)
from components.evaluate.options import EvaluateOptions
from components.evaluate.report import benchmark_verdicts, render_html, render_markdown
from components.run_form.checks import problems
from components.sample_data import bundled_task_dir
from pipelines.run_summary import summary_lines

TASK = "practical_skills_mc"


def squash(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def task_copy(tmp_path) -> Path:
    """A copy of the bundled task directory to break."""
    return Path(shutil.copytree(bundled_task_dir(), tmp_path / "task"))


def test_the_bundled_task_loads_by_name_with_its_data_read_beside_its_yaml(tmp_path, monkeypatch):
    """lm-eval reads a relative data_files path against the working directory; ours against the YAML's. The bundled
    task is named, not given as a path into the image, and needs no workspace."""
    monkeypatch.chdir(tmp_path)
    tasks = load_tasks([TASK], tmp_path / "no-workspace", limit=0)
    assert tasks.names == (TASK,) and tasks.examples == {TASK: 40} and tasks.generative == ()
    assert load_tasks([TASK], tmp_path, limit=25).examples == {TASK: 25}


def test_a_relative_task_directory_is_read_against_the_root(task_copy, tmp_path):
    assert load_tasks(["./task"], tmp_path, limit=0).names == (TASK,)


def test_an_unknown_task_name_is_named_with_the_closest_ones():
    with pytest.raises(UserError) as raised:
        load_tasks(["arc_eazy"], Path("."), limit=0)
    message = str(raised.value)
    assert message.startswith("benchmark_tasks names tasks lm-eval does not have: arc_eazy (did you mean arc_easy")
    assert "`lm-eval ls tasks`" in message


def test_a_registry_task_whose_data_cannot_be_fetched_is_one_paragraph(no_hub, monkeypatch):
    """arc_easy's data come from the Hub at run time; with none reachable the step stops before any model runs."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # datasets read the variable when imported
    with pytest.raises(UserError) as raised:
        load_tasks(["arc_easy"], Path("."), limit=0)
    message = str(raised.value)
    assert message.startswith("the benchmark task arc_easy cannot be loaded (ConnectionError: ")
    assert "Its data come from the Hub at run time" in message and "name that directory instead" in message


def test_the_first_step_refuses_an_unknown_task_name_before_training():
    found = problems({"benchmark_tasks": "arc_easy, hellasvag"})
    assert len(found) == 1 and found[0].startswith(
        "parameter 'benchmark_tasks' names tasks lm-eval does not have: hellasvag (did you mean hellaswag"
    )
    assert problems({"benchmark_tasks": "arc_easy,hellaswag,ifeval"}) == []
    # A local directory lives on the workspace, which the first step does not mount: the evaluate step checks it.
    assert problems({"benchmark_tasks": "tasks/mine"}) == []
    # The bundled task is a name of ours, not lm-eval's, and not an unknown task.
    assert problems({"benchmark_tasks": f"arc_easy,{TASK}"}) == []


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (
            lambda d: (d / f"{TASK}.jsonl").unlink(),
            rf"the benchmark task {TASK} \(.*/task\) cannot be loaded \(FileNotFoundError: .*Fix the task's",
        ),
        (
            lambda d: (d / f"{TASK}.yaml").write_text(
                (d / f"{TASK}.yaml").read_text().replace("{{question}}", "{{prompt}}")
            ),
            rf"the benchmark task {TASK} \(.*\) cannot be loaded \(UndefinedError: 'prompt' is undefined\)",
        ),
        (
            lambda d: (d / f"{TASK}.yaml").write_text(
                (d / f"{TASK}.yaml").read_text().replace("doc_to_target: answer", "doc_to_target: answr")
            ),
            rf"the benchmark task {TASK} \(.*\) loads but cannot render its first example \(ValueError: its target "
            r"\(a str\) is neither an index into its 4 choices nor one of them\)",
        ),
        (
            lambda d: (d / f"{TASK}.yaml").write_text("task: [unclosed\n"),
            r"the benchmark task file .*\.yaml cannot be read \(.*\)\. Fix the YAML\.",
        ),
        (
            lambda d: (d / f"{TASK}.yaml").write_text("group: mine\ntask: [a, b]\n"),
            r"is not an lm-eval task YAML: it needs a 'task' name",
        ),
        (lambda d: (d / f"{TASK}.yaml").unlink(), r"holds no \*\.yaml file"),
        (lambda d: (d / f"{TASK}.jsonl").write_text(""), r"cannot be loaded|cannot render its first example"),
        (lambda d: shutil.rmtree(d), r"names the local task directory .*, but .* is not a directory"),
    ],
    ids=[
        "missing-data",
        "bad-template",
        "bad-target",
        "bad-yaml",
        "group-yaml",
        "no-yaml",
        "empty-data",
        "no-directory",
    ],
)
def test_a_broken_local_task_is_one_paragraph_naming_it(task_copy, breakage, message):
    breakage(task_copy)
    with pytest.raises(UserError, match=message) as raised:
        load_tasks(["./task"], task_copy.parent, limit=0)
    assert "\n" not in str(raised.value) and "Traceback" not in str(raised.value)


def test_a_task_listed_twice_is_refused(task_copy, tmp_path):
    """Two entries bringing the same task (a tag or group and one of its tasks) would score and gate it twice."""
    shutil.copytree(task_copy, tmp_path / "again")
    with pytest.raises(UserError, match=rf"lists the task {TASK} twice: in .*/task and in .*/again"):
        load_tasks(["./task", "./again"], tmp_path, limit=0)


def test_generative_tasks_are_refused_for_a_large_model_on_the_cpu_only():
    tasks = BenchmarkTasks(("ifeval", "arc_easy"), ("ifeval", "arc_easy"), {}, ("ifeval",), None)
    with pytest.raises(UserError, match=r"the benchmark tasks ifeval generate text, .* \(3\.0B parameters\)"):
        check_placement(tasks, on_gpu=False, parameters=3_000_000_000, model="org/m")
    check_placement(tasks, on_gpu=True, parameters=3_000_000_000, model="org/m")
    check_placement(tasks, on_gpu=False, parameters=CPU_GENERATION_PARAMETERS, model="org/m")
    check_placement(
        BenchmarkTasks((), ("arc_easy",), {}, (), None), on_gpu=False, parameters=3_000_000_000, model="org/m"
    )


def test_the_main_metric_is_acc_norm_where_reported_else_the_first():
    results = {
        "results": {
            "arc_easy": {
                "alias": "arc_easy",
                "acc,none": 0.6,
                "acc_stderr,none": 0.01,
                "acc_norm,none": 0.55,
                "acc_norm_stderr,none": 0.0157,
            },  # fmt: skip
            "ifeval": {
                "prompt_level_strict_acc,none": 0.3,
                "prompt_level_strict_acc_stderr,none": 0.02,
                "inst_level_strict_acc,none": 0.4,
                "inst_level_strict_acc_stderr,none": "N/A",
            },  # fmt: skip
            "perplexity_task": {"word_perplexity,none": 12.5, "word_perplexity_stderr,none": "N/A"},
        },
        "higher_is_better": {"arc_easy": {"acc_norm": True}, "perplexity_task": {"word_perplexity": False}},
        "n-samples": {"arc_easy": {"original": 2376, "effective": 1000}},
    }
    assert main_metric(results, "arc_easy", 1000) == {
        "metric": "acc_norm",
        "value": 0.55,
        "stderr": 0.0157,
        "higher_is_better": True,
        "examples": 1000,
    }
    assert main_metric(results, "ifeval", 541)["metric"] == "prompt_level_strict_acc"
    lower = main_metric(results, "perplexity_task", 10)
    assert lower["higher_is_better"] is False and lower["stderr"] is None and lower["examples"] == 10
    with pytest.raises(UserError, match="lm-eval reports no score for bbh. Name its tasks"):
        main_metric({"results": {"bbh": {"alias": "bbh"}}}, "bbh", None)
    mixed = {"results": {"g": {"acc,none": 0.5}}, "higher_is_better": {"g": {"acc": None}}}
    with pytest.raises(UserError, match="lm-eval reports no direction for g's acc"):
        main_metric(mixed, "g", None)


def entry(value: float, higher: bool = True) -> dict:
    return {"metric": "acc_norm", "value": value, "stderr": 0.01, "higher_is_better": higher, "examples": 40}


LOSS_PASSES = decide(2.0, 1.5, 0.0)


@pytest.mark.parametrize(
    ("base", "new", "max_drop", "passed", "words"),
    [
        (0.50, 0.49, 0.02, True, "arc_easy acc_norm fell by 0.0100 against the base model (base 0.5000, new 0.4900)"),
        (
            0.50,
            0.45,
            0.02,
            False,
            "fell by 0.0500 against the base model (base 0.5000, new 0.4500), more than max_benchmark_drop 0.0200",
        ),  # fmt: skip
        (0.50, 0.50, -0.0, True, "did not change against the base model (base 0.5000, new 0.5000), within"),
        (0.50, 0.60, -1.0, False, "rose by 0.1000 against the base model (base 0.5000, new 0.6000), more than"),
        (0.50, math.nan, 0.02, False, "acc_norm is not a finite number against the base model (base 0.5000, new nan)"),
    ],
)
def test_a_benchmark_drop_beyond_the_maximum_fails_the_gate(base, new, max_drop, passed, words):
    comparisons = benchmark_comparisons({"base": {"arc_easy": entry(base)}, "fine_tuned": {"arc_easy": entry(new)}},
                                        max_drop)  # fmt: skip
    decision = with_benchmarks(LOSS_PASSES, comparisons, force=False)
    assert decision.passed is passed and words in decision.reason
    assert [(c.against, c.benchmark) for c in decision.comparisons] == [("base", ""), ("base", "arc_easy")]


def test_a_drop_of_a_lower_is_better_metric_is_a_rise():
    scores = {"base": {"t": entry(10.0, higher=False)}, "fine_tuned": {"t": entry(10.5, higher=False)}}
    (comparison,) = benchmark_comparisons(scores, 0.2)
    assert not comparison.passed and "fell by 0.5000" in comparison.reason


def test_force_overrides_a_benchmark_loss_against_the_published_model_only():
    scores = {
        "base": {"arc_easy": entry(0.50)},
        "published": {"arc_easy": entry(0.60)},
        "fine_tuned": {"arc_easy": entry(0.52)},
    }
    loss = decide_with_published(2.0, 1.5, 0.0, 1.6, 0.0, "run r1", False)
    comparisons = benchmark_comparisons(scores, 0.02)
    refused = with_benchmarks(loss, comparisons, force=False)
    assert not refused.passed and not refused.forced
    assert "arc_easy acc_norm fell by 0.0800 against the published model" in refused.reason
    forced = with_benchmarks(loss, comparisons, force=True)
    assert forced.passed and forced.forced and "force is set" in forced.reason

    scores["fine_tuned"]["arc_easy"] = entry(0.40)  # now behind the base too: force does not help
    still_refused = with_benchmarks(loss, benchmark_comparisons(scores, 0.02), force=True)
    assert not still_refused.passed and not still_refused.forced
    assert "force does not override the comparison with the base model" in still_refused.reason


@pytest.mark.parametrize(
    "loss",
    [
        decide_with_published(2.0, 1.5, 0.0, 1.4, 0.0, "run r1", True),  # forced past the published model's loss
        decide_without_published(2.0, 1.5, 0.0, "its folder is gone"),  # forced without a published model
    ],
    ids=["forced-past-published", "forced-without-published"],
)
def test_a_benchmark_loss_against_the_base_undoes_a_forced_loss_decision(loss):
    """force got the loss decision past the published model, but a benchmark fell behind the base: the gate fails,
    and its reason no longer says the model is published."""
    assert loss.passed and loss.forced
    scores = {"base": {"arc_easy": entry(0.50)}, "fine_tuned": {"arc_easy": entry(0.40)}}
    decision = with_benchmarks(loss, benchmark_comparisons(scores, 0.02), force=True)
    assert not decision.passed and not decision.forced
    assert "is published" not in decision.reason and decision.reason.count("force does not override") == 1
    assert decision.reason.endswith(
        "arc_easy acc_norm fell by 0.1000 against the base model (base 0.5000, new 0.4000), more than "
        "max_benchmark_drop 0.0200. force does not override the comparison with the base model."
    )


def test_no_benchmarks_leave_the_loss_gate_as_it_is():
    assert with_benchmarks(LOSS_PASSES, (), force=True) is LOSS_PASSES


def evaluation(published: bool) -> dict:
    """An evaluation.json as the stage writes it, with a benchmark table and one failed comparison."""
    loss = {"eval_loss": 2.0, "perplexity": math.exp(2.0), "rouge_l": 0.25, "eval_tokens": 100}
    scores = {"base": {"arc_easy": entry(0.5), "hellaswag": entry(0.4)}}
    if published:
        scores["published"] = {"arc_easy": entry(0.52), "hellaswag": entry(0.41)}
    scores["fine_tuned"] = {"arc_easy": entry(0.45), "hellaswag": entry(0.405)}
    decision = with_benchmarks(LOSS_PASSES, benchmark_comparisons(scores, 0.02), force=False)
    record = {
        "base_model": "base",
        "base_model_commit": None,
        "fine_tuned_model": "/runs/x/train/merged",
        "base": loss,
        "fine_tuned": loss,
        "deltas": {"eval_loss": 0.0, "perplexity": 0.0, "rouge_l": 0.0},
        "scored_rows": 3,
        "held_out": {"conversations": 10, "tokenised": 10, "split_conversations": 10, "eval_max_rows": 1000},
        "benchmarks": {
            "tasks": ["arc_easy", "hellaswag"],
            "limit": 1000,
            "num_fewshot": 0,
            "max_drop": 0.02,
            "lm_eval_version": "0.4.13",
            "scores": scores,
        },
        "gate": {
            "passed": decision.passed,
            "forced": False,
            "min_eval_loss_improvement": 0.0,
            "max_benchmark_drop": 0.02,
            "reason": decision.reason,
            "comparisons": [
                {"against": c.against, "passed": c.passed, "reason": c.reason, "benchmark": c.benchmark}
                for c in decision.comparisons
            ],
        },
    }
    if published:
        record |= {"published": loss, "deltas_vs_published": record["deltas"]}
        record["published_model"] = {"description": "run r1", "run_id": "r1", "loaded_as": "merged checkpoint"}
    return record


def test_the_reports_show_a_task_by_model_table_with_standard_errors_and_verdicts():
    record = evaluation(published=False)
    markdown = render_markdown(record, [], None, None)
    assert "## Standard benchmarks" in markdown
    assert "| Task | Base | Fine-tuned | Change | Gate |" in markdown
    assert (
        "| arc_easy: acc_norm, higher is better, 40 examples | 0.5000 ± 0.0100 | 0.4500 ± 0.0100 | -0.0500 | "
        "fails against base |" in markdown
    )
    assert (
        "| hellaswag: acc_norm, higher is better, 40 examples | 0.4000 ± 0.0100 | 0.4050 ± 0.0100 | +0.0050 | passes |"
        in markdown
    )
    assert "lm-evaluation-harness 0.4.13, zero-shot, on at most the first 1000 examples of each task" in squash(
        markdown
    )
    html = render_html(record, [], None, None)
    assert "<h2>Standard benchmarks</h2>" in html and "<td>fails against base</td>" in html
    assert "<td class=number>0.5000 ± 0.0100</td>" in html


def test_with_a_published_model_the_table_has_its_column_and_change():
    record = evaluation(published=True)
    markdown = render_markdown(record, [], None, None)
    assert "| Task | Base | Published | New | Change vs base | Change vs published | Gate |" in markdown
    assert (
        "| 0.5000 ± 0.0100 | 0.5200 ± 0.0100 | 0.4500 ± 0.0100 | -0.0500 | -0.0700 | fails against base and published |"
        in markdown
    )
    assert benchmark_verdicts(record)[0] == (
        "benchmark arc_easy: acc_norm, higher is better, 40 examples: base 0.5000 ± 0.0100, published 0.5200 ± "
        "0.0100, new 0.4500 ± 0.0100: fails against base and published"
    )


def test_an_empty_task_list_is_said_in_the_reports_and_the_summary(tmp_path):
    record = evaluation(published=False) | {"benchmarks": {"skipped": "benchmark_tasks is empty, so no ..."}}
    record["gate"]["comparisons"] = record["gate"]["comparisons"][:1]
    assert "No standard benchmarks: benchmark_tasks is empty" in render_markdown(record, [], None, None)
    assert "No standard benchmarks: benchmark_tasks is empty" in render_html(record, [], None, None)
    assert benchmark_verdicts(record) == ["benchmarks: none: benchmark_tasks is empty, so no ..."]


def test_the_run_summary_prints_the_verdict_per_task(tmp_path):
    import json

    run = tmp_path / "runs" / "r1"
    (run / "train").mkdir(parents=True)
    (run / "evaluate").mkdir()
    (run / "evaluate" / "evaluation.json").write_text(json.dumps(evaluation(published=False)))
    lines = summary_lines(run)
    assert any(line.startswith("  benchmark arc_easy: acc_norm") and "fails against base" in line for line in lines)
    assert any(line.startswith("  benchmark hellaswag: acc_norm") and line.endswith(": passes") for line in lines)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"benchmark_limit": -1}, "benchmark_limit must be at least 0"),
        ({"benchmark_fewshot": -1}, "benchmark_fewshot must be at least 0"),
        ({"benchmark_batch_size": 0}, "benchmark_batch_size must be at least 1"),
        ({"max_benchmark_drop": math.nan}, "max_benchmark_drop must be a finite number"),
        ({"benchmark_tasks": "arc_easy,,hellaswag"}, "benchmark_tasks holds an empty entry"),
    ],
)
def test_bad_benchmark_options_are_named(changes, message):
    with pytest.raises(UserError, match=message):
        EvaluateOptions(**changes)


def test_entries_are_stripped_and_each_kept_once():
    assert EvaluateOptions(benchmark_tasks=" arc_easy , hellaswag,arc_easy ").benchmark_entries == [
        "arc_easy",
        "hellaswag",
    ]
    assert EvaluateOptions(benchmark_tasks="  ").benchmark_entries == []
