"""How evaluation.json's models and benchmark scores are tabulated: which models are columns, their changes, and
each benchmark task's row.

The evaluation's report and the model card the publish step writes show the same tables, so both read them from
here. It sits below both stages: the evaluation imports the publish stage (to find the model published before),
so the publish stage may not import the evaluation.
"""

from __future__ import annotations

from typing import Any

Evaluation = dict[str, Any]


def columns(evaluation: Evaluation) -> list[tuple[str, str]]:
    """(role in evaluation.json, column header) of each scored model, in the report's order."""
    if "published" not in evaluation:
        return [("base", "Base"), ("fine_tuned", "Fine-tuned")]
    return [("base", "Base"), ("published", "Published"), ("fine_tuned", "New")]


def change_headers(evaluation: Evaluation) -> list[str]:
    return ["Change vs base", "Change vs published"] if "published" in evaluation else ["Change"]


def score_text(entry: dict[str, Any]) -> str:
    """A benchmark score as the reports and the log show it: the value ± lm-eval's standard error, when it gave one."""
    stderr = f" ± {entry['stderr']:.4f}" if entry["stderr"] is not None else ""
    return f"{entry['value']:.4f}{stderr}"


def benchmark_rows(evaluation: Evaluation) -> list[tuple[str, list[str], list[str], str]]:
    """(task and metric, each model's score ± stderr, the new model's changes, verdict) per benchmark task."""
    benchmarks = evaluation.get("benchmarks") or {}
    comparisons = evaluation.get("gate", {}).get("comparisons", [])
    rows = []
    for task in benchmarks.get("tasks", []):
        scores = benchmarks["scores"]
        new = scores["fine_tuned"][task]
        values = [score_text(scores[role][task]) for role, _ in columns(evaluation)]
        references = ["base", "published"] if "published" in scores else ["base"]
        changes = [f"{new['value'] - scores[role][task]['value']:+.4f}" for role in references]
        failed = [c["against"] for c in comparisons if c.get("benchmark") == task and not c["passed"]]
        verdict = f"fails against {' and '.join(failed)}" if failed else "passes"
        better = "higher" if new["higher_is_better"] else "lower"
        rows.append(
            (f"{task}: {new['metric']}, {better} is better, {new['examples']} examples", values, changes, verdict)
        )
    return rows


def benchmark_note(evaluation: Evaluation) -> str:
    """How the benchmarks were run and judged, or why none were."""
    benchmarks = evaluation.get("benchmarks") or {}
    if "skipped" in benchmarks:
        return f"No standard benchmarks: {benchmarks['skipped']}"
    if not benchmarks:
        return "No standard benchmarks: this evaluation predates them."
    shots = f"{benchmarks['num_fewshot']}-shot" if benchmarks["num_fewshot"] else "zero-shot"
    limit = f"at most the first {benchmarks['limit']} examples of each task" if benchmarks["limit"] else "every example"
    return (
        f"Scored by lm-evaluation-harness {benchmarks['lm_eval_version']}, {shots}, on {limit} (the same for every "
        f"model), ± one standard error as lm-eval reports it. The gate fails when a task's main metric falls more "
        f"than {benchmarks['max_drop']:.4f} (max_benchmark_drop) below the base or the published model's."
    )
