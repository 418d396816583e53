"""Evaluation stage: the CLI, and what its KFP component runs.

    python -m components.evaluation.stage --base-model BASE --fine-tuned-model TRAIN/merged \\
        --data-dir DATA --train-dir TRAIN --output-dir EVAL [--extra-questions "Q1" "Q2"]

One path: options → the held-out split tokenised as in training → for the base
model, then the fine-tuned one (each loaded once and freed before the next):
held-out loss, answers to the sample questions and to the scored rows → ROUGE-L
→ the quality gate → evaluation.json, demo_outputs/sample_responses.json,
report.md (+ loss_curve.png) and report.html in the output directory. A failed
gate is a result, not an error: the stage succeeds and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from common.atomic import link_or_copy, staging_dir
from common.errors import exit_on_user_error
from common.run_layout import (
    EVALUATION,
    EVALUATION_HTML,
    EVALUATION_MARKDOWN,
    LOSS_CURVE,
    MERGED,
    SAMPLE_RESPONSES,
    TRAINING_SUMMARY,
)
from components.evaluation.gate import decide
from components.evaluation.generation import generate_answers
from components.evaluation.heldout import HeldOutLoss, held_out_loss, usable_conversations
from components.evaluation.models import (
    check_fine_tuned_dir,
    check_same_vocabulary,
    load_model,
    load_tokenizer,
    release_memory,
)
from components.evaluation.options import EvaluateOptions, parse_options
from components.evaluation.reference import ReferenceRow, reference_rows, rouge_l
from components.evaluation.report import png_data_uri, render_html, render_markdown
from trainer.config import TrainConfig
from trainer.cuda import check_cuda_usable
from trainer.data import load_split, split_path
from trainer.masking import Message, TokenisedConversation

COMPARED = ("eval_loss", "perplexity", "rouge_l")


@dataclass(frozen=True)
class ModelRun:
    """What one model produced: its held-out loss, its sample answers, its answers to the scored rows."""

    loss: HeldOutLoss
    sample_answers: list[str]
    scored_answers: list[str]


@dataclass(frozen=True)
class Evaluated:
    output_dir: Path
    evaluation: dict[str, Any]
    samples: list[dict[str, str]]
    training: dict[str, Any] | None
    loss_curve_png: bytes | None


def read_training_summary(train_dir: Path) -> dict[str, Any] | None:
    path = train_dir / TRAINING_SUMMARY
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def resolve_max_length(options: EvaluateOptions, training: dict[str, Any] | None) -> int:
    """The option when set, else the training run's truncation, else the trainer's default."""
    if options.max_length:
        return options.max_length
    return int((training or {}).get("config", {}).get("max_length") or TrainConfig.max_length)


def run_model(
    name_or_path: str,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[TokenisedConversation],
    prompts: list[list[Message]],
    sample_count: int,
    options: EvaluateOptions,
    revision: str | None = None,
) -> ModelRun:
    """Load one model, measure it and generate with it; it is freed when this returns."""
    model = load_model(name_or_path, revision)
    loss = held_out_loss(model, conversations, tokenizer.pad_token_id, options.batch_size)
    print(
        f"  eval loss {loss.eval_loss:.4f}, perplexity {loss.perplexity:.3f} over {loss.eval_tokens} assistant tokens",
        flush=True,
    )
    answers = generate_answers(model, tokenizer, prompts, options.max_new_tokens, options.batch_size)
    return ModelRun(loss, answers[:sample_count], answers[sample_count:])


def model_entry(run: ModelRun, rows: list[ReferenceRow]) -> dict[str, Any]:
    return {
        "eval_loss": run.loss.eval_loss,
        "perplexity": run.loss.perplexity,
        "rouge_l": rouge_l(run.scored_answers, [row.reference for row in rows]),
        "eval_tokens": run.loss.eval_tokens,
    }


def evaluate(options: EvaluateOptions) -> Evaluated:
    """Compare the two models and write the stage's files; see the module docstring for the order."""
    check_fine_tuned_dir(options.fine_tuned_model)
    training = read_training_summary(options.train_dir)
    # The base model as it was trained from: the Hub commit the trainer recorded (None for a local checkpoint).
    base_revision = (training or {}).get("base_model_commit")
    tokenizer = load_tokenizer(options.fine_tuned_model)
    check_same_vocabulary(load_tokenizer(options.base_model, base_revision), tokenizer, options.base_model)
    split = load_split(options.data_dir, "eval")
    max_length = resolve_max_length(options, training)
    conversations = usable_conversations(split, split_path(options.data_dir, "eval"), tokenizer, max_length)
    rows = reference_rows(split["messages"], options.score_rows)
    questions = options.questions
    prompts = [[{"role": "user", "content": question}] for question in questions] + [row.prompt for row in rows]
    print(
        f"{len(conversations)} held-out conversations (max_length {max_length}), {len(questions)} sample questions, "
        f"{len(rows)} scored rows",
        flush=True,
    )

    runs = {}
    for role, name, revision in (
        ("base", options.base_model, base_revision),
        ("fine_tuned", str(options.fine_tuned_model), None),
    ):
        print(f"{role}: {name}" + (f" at {revision}" if revision else ""), flush=True)
        runs[role] = run_model(name, tokenizer, conversations, prompts, len(questions), options, revision)
        release_memory()

    base, tuned = model_entry(runs["base"], rows), model_entry(runs["fine_tuned"], rows)
    gate = decide(base["eval_loss"], tuned["eval_loss"], options.min_eval_loss_improvement)
    evaluation = {
        "base_model": options.base_model,
        "base_model_commit": base_revision,
        "fine_tuned_model": str(options.fine_tuned_model),
        "base": base,
        "fine_tuned": tuned,
        "deltas": {key: tuned[key] - base[key] for key in COMPARED},
        "scored_rows": len(rows),
        "gate": {
            "passed": gate.passed,
            "min_eval_loss_improvement": gate.min_eval_loss_improvement,
            "reason": gate.reason,
        },
    }
    samples = [
        {"question": question, "base": base_answer, "fine_tuned": tuned_answer}
        for question, base_answer, tuned_answer in zip(
            questions, runs["base"].sample_answers, runs["fine_tuned"].sample_answers, strict=True
        )
    ]
    curve = options.train_dir / LOSS_CURVE
    evaluated = Evaluated(
        options.output_dir, evaluation, samples, training, curve.read_bytes() if curve.is_file() else None
    )
    write_outputs(evaluated)
    return evaluated


def write_outputs(evaluated: Evaluated) -> None:
    """Every file staged first, then renamed into place with evaluation.json last (the completion marker)."""
    target = evaluated.output_dir
    (target / SAMPLE_RESPONSES).parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(target) as staging:
        staging.file(SAMPLE_RESPONSES).parent.mkdir()
        staging.file(SAMPLE_RESPONSES).write_text(
            json.dumps(evaluated.samples, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        names = [SAMPLE_RESPONSES]
        if evaluated.loss_curve_png:
            staging.file(LOSS_CURVE).write_bytes(evaluated.loss_curve_png)
            names.append(LOSS_CURVE)
        markdown = render_markdown(
            evaluated.evaluation,
            evaluated.samples,
            evaluated.training,
            LOSS_CURVE if evaluated.loss_curve_png else None,
        )
        staging.file(EVALUATION_MARKDOWN).write_text(markdown, encoding="utf-8")
        html = render_html(evaluated.evaluation, evaluated.samples, evaluated.training, evaluated.loss_curve_png)
        staging.file(EVALUATION_HTML).write_text(html, encoding="utf-8")
        staging.file(EVALUATION).write_text(json.dumps(evaluated.evaluation, indent=2) + "\n", encoding="utf-8")
        staging.publish(*names, EVALUATION_MARKDOWN, EVALUATION_HTML, EVALUATION)


def summary(evaluated: Evaluated) -> str:
    evaluation = evaluated.evaluation
    lines = []
    for role, label in (("base", "base      "), ("fine_tuned", "fine-tuned")):
        entry = evaluation[role]
        lines.append(
            f"{label}  eval loss {entry['eval_loss']:.4f}  perplexity {entry['perplexity']:.3f}  "
            f"ROUGE-L {entry['rouge_l']:.4f}"
        )
    gate = evaluation["gate"]
    lines.append(
        f"quality gate {'passed' if gate['passed'] else 'FAILED (export and publish are skipped)'}: {gate['reason']}"
    )
    lines += [
        f"{name} -> {evaluated.output_dir / name}"
        for name in (EVALUATION, EVALUATION_MARKDOWN, EVALUATION_HTML, SAMPLE_RESPONSES)
    ]
    return "\n".join(lines)


def metrics_to_log(evaluation: dict[str, Any]) -> dict[str, float]:
    """The KFP Metrics: base_/fine_tuned_ values and deltas of each compared number, and the gate as 1/0."""
    values = {}
    for key in COMPARED:
        values[f"base_{key}"] = evaluation["base"][key]
        values[f"fine_tuned_{key}"] = evaluation["fine_tuned"][key]
        values[f"{key}_delta"] = evaluation["deltas"][key]
    values["gate_passed"] = 1 if evaluation["gate"]["passed"] else 0
    return values


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    print(summary(evaluate(parse_options(argv))), flush=True)


@exit_on_user_error
def run_in_pipeline(
    base_model: str,
    train_dir: str,
    data_dir: str,
    eval_dir: str,
    extra_questions: Sequence[str],
    max_new_tokens: int,
    score_rows: int,
    min_eval_loss_improvement: float,
    batch_size: int,
    metrics,
    html_report_artifact,
    markdown_report_artifact,
    require_cuda: bool = False,
) -> tuple[bool, str]:
    """What the KFP component does: evaluate, fill the UI artifacts, return the gate's decision and reason.

    The Markdown artifact embeds the loss curve as a data URI, since the UI
    shows the artifact alone, without report.md's neighbouring image. With
    ``require_cuda`` (the pod was given a GPU) a CUDA failure stops the step
    instead of generating on the CPU.
    """
    if require_cuda:
        check_cuda_usable("evaluation step")
    options = EvaluateOptions(
        base_model=base_model,
        fine_tuned_model=Path(train_dir) / MERGED,
        data_dir=Path(data_dir),
        train_dir=Path(train_dir),
        output_dir=Path(eval_dir),
        extra_questions=tuple(extra_questions),
        max_new_tokens=max_new_tokens,
        score_rows=score_rows,
        min_eval_loss_improvement=min_eval_loss_improvement,
        batch_size=batch_size,
    )
    evaluated = evaluate(options)
    print(summary(evaluated), flush=True)
    for name, value in metrics_to_log(evaluated.evaluation).items():
        metrics.log_metric(name, value)
    png = evaluated.loss_curve_png
    markdown = render_markdown(
        evaluated.evaluation, evaluated.samples, evaluated.training, png_data_uri(png) if png else None
    )
    # The UI shows the HTML artifact as it is.
    link_or_copy(evaluated.output_dir / EVALUATION_HTML, Path(html_report_artifact.path))
    Path(markdown_report_artifact.path).parent.mkdir(parents=True, exist_ok=True)
    Path(markdown_report_artifact.path).write_text(markdown, encoding="utf-8")
    for artifact, name in ((html_report_artifact, EVALUATION_HTML), (markdown_report_artifact, EVALUATION_MARKDOWN)):
        artifact.metadata.update({"workspace_path": str(evaluated.output_dir / name)})
    gate = evaluated.evaluation["gate"]
    return gate["passed"], gate["reason"]


if __name__ == "__main__":
    main()
