"""The evaluation as a page a person reads: Markdown and self-contained HTML.

Both show the gate's verdict first, then the metrics table, the training run
and its loss curve, and every sample question with the base and fine-tuned
answers side by side. When a model was published before, it is a third
column between them (base, published, new), with the new model's change
against each. Below it, the standard benchmarks: a task x model table of each
task's main metric with lm-eval's standard error, and the verdict. The HTML
embeds the loss curve as a data URI, because the pipelines UI shows an HTML
artifact as a single file; the Markdown takes
the image source from its caller (a relative link beside report.md on the
workspace, a data URI in the KFP artifact). Model output is escaped: it is
untrusted text, not markup. The HTML is the Jinja template report.html.j2
beside this module, rendered with autoescape on; the Markdown escapes by hand.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from common.records import SampleAnswer, TrainingSummary
from components.evaluation_tables import (
    Evaluation,
    benchmark_note,
    benchmark_rows,
    change_headers,
    columns,
)
from trainer.methods import method_named

TITLE = "Fine-tuned vs base model"
# (key in evaluation.json's model entries, label, digits, which direction is better)
METRICS = (
    ("eval_loss", "Eval loss (held-out assistant tokens)", 4, "lower"),
    ("perplexity", "Perplexity", 3, "lower"),
    ("rouge_l", "ROUGE-L F-measure", 4, "higher"),
)
# Objective dpo's rows, after METRICS: the held-out pairs' preferences against the base (the base scores chance)
PREFERENCE_METRICS = (
    ("reward_accuracy", "Reward accuracy (held-out pairs; the base: chance)", 4, "higher"),
    ("reward_margin", "Reward margin, chosen minus rejected", 4, "higher"),
)
# (label, the TrainingSummary attribute) in the order the report lists them; a fact that is None is left out
TRAINING_FACTS = (
    ("Base model", "base_model"),
    ("Method", "method"),
    ("Objective", "objective"),
    ("Optimizer steps", "global_step"),
    ("Epochs", "epochs"),
    ("Training conversations", "train_examples"),
    ("Final training loss", "final_train_loss"),
    ("Trainer's final eval loss", "final_eval_loss"),
    ("Training time (s)", "train_runtime_s"),
    ("Precision", "precision"),
    ("Processes", "world_size"),
    ("Attention kernel", "attention"),
    ("Compiled blocks", "compiled_blocks"),
    ("Speed fallback", "speed_fallback"),
)


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def gate_headline(evaluation: Evaluation) -> str:
    gate = evaluation["gate"]
    if gate["passed"]:
        forced = " because force is set" if gate.get("forced") else ""
        return f"Quality gate passed{forced}. {gate['reason']}"
    return f"Quality gate failed: the model is not exported or published. {gate['reason']}"


def metric_rows(evaluation: Evaluation) -> list[tuple[str, list[str], list[str]]]:
    """(label, each model's value, the new model's changes) per metric, formatted for display."""
    rows = []
    on_pairs = evaluation["fine_tuned"].get("reward_accuracy") is not None
    for key, label, digits, better in METRICS + (PREFERENCE_METRICS if on_pairs else ()):
        if on_pairs and key == "eval_loss":
            label = "Eval loss (held-out chosen answers' tokens)"
        values = [f"{evaluation[role][key]:.{digits}f}" for role, _ in columns(evaluation)]
        changes = [evaluation["deltas"][key]]
        if "published" in evaluation:
            changes.append(evaluation["deltas_vs_published"][key])
        rows.append((f"{label}, {better} is better", values, [f"{change:+.{digits}f}" for change in changes]))
    return rows


def benchmark_verdicts(evaluation: Evaluation) -> list[str]:
    """One line per benchmark task for a log or a run summary: each model's score and the gate's verdict."""
    benchmarks = evaluation.get("benchmarks") or {}
    if "skipped" in benchmarks:
        return [f"benchmarks: none: {benchmarks['skipped']}"]
    headers = [header for _, header in columns(evaluation)]
    return [
        f"benchmark {label}: "
        + ", ".join(f"{header.lower()} {value}" for header, value in zip(headers, values))
        + f": {verdict}"
        for label, values, _, verdict in benchmark_rows(evaluation)
    ]


def held_out_note(held_out: dict[str, Any]) -> str:
    """The held-out conversations (or preference pairs) in words: a sample or the whole split, and any left
    without a loss."""
    kind = "pairs" if "pairs" in held_out else "conversations"
    used, kept, split = held_out[kind], held_out["tokenised"], held_out["split_conversations"]
    drawn = (
        f"a fixed sample of {kept} of the {split} in the split (eval_max_rows {held_out['eval_max_rows']})"
        if kept < split
        else f"all {split} in the split"
    )
    unused = ""
    if used < kept and kind == "pairs":
        unused = f"; {kept - used} were dropped for a prompt that fills max_length"
    elif used < kept:
        unused = f"; {kept - used} have no assistant token within max_length"
    return f"{used} held-out {'preference pairs' if kind == 'pairs' else kind}: {drawn}{unused}"


def notes(evaluation: Evaluation) -> str:
    published = evaluation.get("published_model")
    published_note = (
        f" Published model: {published['description']}, loaded as {published['loaded_as']}."
        if published and published.get("loaded_as")
        else f" Published model: {published['description']}, not compared: {published['problem']}"
        if published
        else ""
    )
    return (
        f"Loss over {evaluation['fine_tuned']['eval_tokens']} held-out assistant tokens of "
        f"{held_out_note(evaluation['held_out'])}; "
        f"ROUGE-L over {evaluation['scored_rows']} held-out rows answered greedily. "
        f"Base model: {evaluation['base_model']}. Fine-tuned model: {evaluation['fine_tuned_model']}." + published_note
    )


def training_facts(summary: TrainingSummary | None) -> list[tuple[str, str]]:
    """(label, value) for the training run's facts (``training_summary.json``); none without a summary."""
    if summary is None:
        return []
    facts = []
    for label, attribute in TRAINING_FACTS:
        if attribute == "train_examples" and summary.objective == "dpo":
            label = "Training preference pairs"
        value = getattr(summary, attribute)
        if value is not None:
            facts.append((label, f"{value:.4g}" if isinstance(value, float) else str(value)))
    if method_named(summary.method).quantised_base:
        # the trainer merges a QLoRA adapter into a fresh unquantised base (trainer.train.merged_from_adapter)
        facts.append(
            (
                "Base as evaluated",
                "the base model the adapter was trained against (same checkpoint and commit), unquantised: "
                "the adapter trained on it held in 4-bit NF4 and was merged into its unquantised weights",
            )
        )
    return facts


def _markdown_text(text: str) -> str:
    return escape(text, quote=False)


def _blockquote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in (_markdown_text(text) or "(empty answer)").splitlines())


def render_markdown(
    evaluation: Evaluation,
    samples: tuple[SampleAnswer, ...],
    training: TrainingSummary | None,
    loss_curve_src: str | None,
) -> str:
    headers = [header for _, header in columns(evaluation)] + change_headers(evaluation)
    lines = [
        f"# {TITLE}",
        "",
        f"**{gate_headline(evaluation)}**",
        "",
        *([f"MLflow run: <{evaluation['mlflow_run_url']}>", ""] if evaluation.get("mlflow_run_url") else []),
        "| Metric | " + " | ".join(headers) + " |",
        "|---|" + "---:|" * len(headers),
    ]
    lines += [
        f"| {label} | " + " | ".join(values + changes) + " |" for label, values, changes in metric_rows(evaluation)
    ]
    lines += ["", _markdown_text(notes(evaluation)), "", "## Standard benchmarks", ""]
    rows = benchmark_rows(evaluation)
    if rows:
        lines += [
            "| Task | " + " | ".join(headers) + " | Gate |",
            "|---|" + "---:|" * len(headers) + "---|",
        ]
        lines += [
            f"| {_markdown_text(label)} | " + " | ".join(values + changes) + f" | {verdict} |"
            for label, values, changes, verdict in rows
        ]
        lines.append("")
    lines += [_markdown_text(benchmark_note(evaluation)), "", "## Training run", ""]
    lines += [f"- {label}: {_markdown_text(value)}" for label, value in training_facts(training)] or [
        "- training_summary.json was not found."
    ]
    lines += [
        "",
        f"![Training and eval loss per step]({loss_curve_src})" if loss_curve_src else "No loss curve was found.",
        "",
        "## Sample answers",
    ]
    for number, sample in enumerate(samples, start=1):
        lines += ["", f"### {number}. {_markdown_text(sample.question)}"]
        for role, header in columns(evaluation):
            lines += ["", f"**{header}**", "", _blockquote(getattr(sample, role))]
    return "\n".join(lines) + "\n"


HTML_TEMPLATE = "report.html.j2"
# The template beside this module (package data, like the model card's). Autoescape because questions and answers are
# model output: untrusted text that must not become markup. StrictUndefined, so a misspelt name fails the render
# instead of leaving a blank in the page.
_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def render_html(
    evaluation: Evaluation,
    samples: tuple[SampleAnswer, ...],
    training: TrainingSummary | None,
    loss_curve_png: bytes | None,
) -> str:
    """The page from ``report.html.j2``; the template escapes every value, model output included."""
    return _TEMPLATES.get_template(HTML_TEMPLATE).render(
        title=TITLE,
        gate_passed=evaluation["gate"]["passed"],
        gate_headline=gate_headline(evaluation),
        mlflow_run_url=evaluation.get("mlflow_run_url"),
        columns=columns(evaluation),
        change_headers=change_headers(evaluation),
        metrics=metric_rows(evaluation),
        notes=notes(evaluation),
        benchmarks=benchmark_rows(evaluation),
        benchmark_note=benchmark_note(evaluation),
        facts=training_facts(training),
        loss_curve_src=png_data_uri(loss_curve_png) if loss_curve_png else None,
        samples=samples,
    )
