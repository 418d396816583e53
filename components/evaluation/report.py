"""The evaluation as a page a person reads: Markdown and self-contained HTML.

Both show the gate's verdict first, then the metrics table, the training run
and its loss curve, and every sample question with the base and fine-tuned
answers side by side. The HTML embeds the loss curve as a data URI, because
the pipelines UI shows an HTML artifact as a single file; the Markdown takes
the image source from its caller (a relative link beside report.md on the
workspace, a data URI in the KFP artifact). Model output is escaped: it is
untrusted text, not markup.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

Evaluation = dict[str, Any]
Sample = dict[str, str]

TITLE = "Fine-tuned vs base model"
# (key in evaluation.json's model entries, label, digits, which direction is better)
METRICS = (
    ("eval_loss", "Eval loss (held-out assistant tokens)", 4, "lower"),
    ("perplexity", "Perplexity", 3, "lower"),
    ("rouge_l", "ROUGE-L F-measure", 4, "higher"),
)
TRAINING_FACTS = (
    ("config.model", "Base model"),
    ("config.method", "Method"),
    ("global_step", "Optimizer steps"),
    ("epochs", "Epochs"),
    ("train_examples", "Training conversations"),
    ("final_train_loss", "Final training loss"),
    ("final_eval_loss", "Trainer's final eval loss"),
    ("train_runtime_s", "Training time (s)"),
    ("precision", "Precision"),
    ("world_size", "Processes"),
)


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def gate_headline(evaluation: Evaluation) -> str:
    gate = evaluation["gate"]
    if gate["passed"]:
        return f"Quality gate passed. {gate['reason']}"
    return f"Quality gate failed: the model is not exported or published. {gate['reason']}"


def metric_rows(evaluation: Evaluation) -> list[tuple[str, str, str, str]]:
    """(label, base, fine-tuned, change) per metric, formatted for display."""
    rows = []
    for key, label, digits, better in METRICS:
        base, tuned, delta = evaluation["base"][key], evaluation["fine_tuned"][key], evaluation["deltas"][key]
        rows.append(
            (f"{label}, {better} is better", f"{base:.{digits}f}", f"{tuned:.{digits}f}", f"{delta:+.{digits}f}")
        )
    return rows


def notes(evaluation: Evaluation) -> str:
    return (
        f"Loss over {evaluation['fine_tuned']['eval_tokens']} held-out assistant tokens; "
        f"ROUGE-L over {evaluation['scored_rows']} held-out rows answered greedily. "
        f"Base model: {evaluation['base_model']}. Fine-tuned model: {evaluation['fine_tuned_model']}."
    )


def training_facts(summary: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) for the training run facts present in ``training_summary.json``."""
    facts = []
    for path, label in TRAINING_FACTS:
        value: Any = summary
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            facts.append((label, f"{value:.4g}" if isinstance(value, float) else str(value)))
    return facts


def _markdown_text(text: str) -> str:
    return escape(text, quote=False)


def _blockquote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in (_markdown_text(text) or "(empty answer)").splitlines())


def render_markdown(
    evaluation: Evaluation, samples: list[Sample], training: dict[str, Any] | None, loss_curve_src: str | None
) -> str:
    lines = [
        f"# {TITLE}",
        "",
        f"**{gate_headline(evaluation)}**",
        "",
        "| Metric | Base | Fine-tuned | Change |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {label} | {base} | {tuned} | {delta} |" for label, base, tuned, delta in metric_rows(evaluation)]
    lines += ["", _markdown_text(notes(evaluation)), "", "## Training run", ""]
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
        lines += [
            "",
            f"### {number}. {_markdown_text(sample['question'])}",
            "",
            "**Base**",
            "",
            _blockquote(sample["base"]),
            "",
        ]
        lines += ["**Fine-tuned**", "", _blockquote(sample["fine_tuned"])]
    return "\n".join(lines) + "\n"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1f2328; max-width: 72rem; }
.gate { padding: .75rem 1rem; border-radius: 6px; font-weight: 600; }
.passed { background: #dafbe1; border: 1px solid #4ac26b; }
.failed { background: #ffebe9; border: 1px solid #ff8182; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #d0d7de; padding: .4rem .7rem; vertical-align: top; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
.answers td { width: 50%; white-space: pre-wrap; }
.note { color: #59636e; }
img { max-width: 100%; }
"""


def render_html(
    evaluation: Evaluation, samples: list[Sample], training: dict[str, Any] | None, loss_curve_png: bytes | None
) -> str:
    gate_class = "passed" if evaluation["gate"]["passed"] else "failed"
    metrics = "".join(
        f"<tr><td>{escape(label)}</td><td class=number>{base}</td>"
        f"<td class=number>{tuned}</td><td class=number>{delta}</td></tr>"
        for label, base, tuned, delta in metric_rows(evaluation)
    )
    facts = "".join(
        f"<tr><td>{escape(label)}</td><td>{escape(value)}</td></tr>" for label, value in training_facts(training)
    )
    curve = (
        f'<img alt="Training and eval loss per step" src="{png_data_uri(loss_curve_png)}">'
        if loss_curve_png
        else "<p>No loss curve was found.</p>"
    )
    answers = "".join(
        f"<tr><th colspan=2>{number}. {escape(sample['question'])}</th></tr>"
        f"<tr><td>{escape(sample['base']) or '<em>(empty answer)</em>'}</td>"
        f"<td>{escape(sample['fine_tuned']) or '<em>(empty answer)</em>'}</td></tr>"
        for number, sample in enumerate(samples, start=1)
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{TITLE}</title><style>{STYLE}</style></head>
<body>
<h1>{TITLE}</h1>
<p class="gate {gate_class}">{escape(gate_headline(evaluation))}</p>
<table><tr><th>Metric</th><th>Base</th><th>Fine-tuned</th><th>Change</th></tr>{metrics}</table>
<p class="note">{escape(notes(evaluation))}</p>
<h2>Training run</h2>
{f"<table>{facts}</table>" if facts else "<p>training_summary.json was not found.</p>"}
{curve}
<h2>Sample answers</h2>
<table class="answers"><tr><th>Base</th><th>Fine-tuned</th></tr>{answers}</table>
</body></html>
"""
