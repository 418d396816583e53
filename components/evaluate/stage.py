"""Evaluation stage: the CLI, and what its KFP component runs.

    python -m components.evaluate --base-model BASE --fine-tuned-model TRAIN/merged \\
        --data-dir DATA --tokens-dir TOKENS --train-dir TRAIN --output-dir EVAL [--extra-questions "Q1" "Q2"] \\
        [--workspace-root WORKSPACE [--repo-id OWNER/NAME] [--force]]

One path: options → the tokenise step's eval conversations (the held-out split) → the published
model, when one is found (``--workspace-root``: see ``champion``) → the benchmark
tasks, loaded and checked (``benchmarks``) → for the base model, the published one
and the fine-tuned one (each loaded once and freed before the next): held-out loss,
answers to the sample questions and to the scored rows, benchmark scores → ROUGE-L
→ the quality gate → evaluation.json,
demo_outputs/sample_responses.json, report.md (+ loss_curve.png) and report.html
in the output directory. A failed gate is a result, not an error: the stage
succeeds and says why.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from common.atomic import link_or_copy, staging_dir
from common.cli_options import options_from, options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.records import (
    EvaluationResult,
    GateComparison,
    GateVerdict,
    ModelScores,
    SampleAnswer,
    SampleAnswers,
    TrainingSummary,
)
from common.run_layout import (
    EVALUATION,
    EVALUATION_HTML,
    EVALUATION_MARKDOWN,
    LOSS_CURVE,
    MERGED,
    SAMPLE_RESPONSES,
    TRAINING_SUMMARY,
    stage_dir,
)
from components.benchmark_tasks.tasks import (
    BenchmarkSettings,
    BenchmarkTasks,
    check_placement,
    load_tasks,
)
from components.benchmark_tasks.tasks import score as score_benchmarks
from components.champion.published import PublishedModel, find_published
from components.evaluate.champion import (
    FORCE_FIX,
    Champion,
    ChampionUnavailable,
    PublishedTarget,
    champion_from,
    check_comparable,
    published_files,
)
from components.evaluate.gate import (
    EVAL_LOSS,
    GATED_STAGES,
    REWARD_ACCURACY,
    GateDecision,
    benchmark_comparisons,
    decide,
    decide_with_published,
    decide_without_published,
    with_benchmarks,
)
from components.evaluate.generation import generate_answers
from components.evaluate.heldout import HeldOutLoss, held_out_loss, usable_conversations
from components.evaluate.models import (
    check_fine_tuned_dir,
    check_same_vocabulary,
    device_and_dtype,
    load_model,
    load_tokenizer,
    parameter_count,
    release_memory,
)
from components.evaluate.options import EvaluateOptions, build_parser
from components.evaluate.preferences import PairLogProbs, pair_log_probs, preference_scores, usable_pairs
from components.evaluate.reference import ReferenceRow, reference_rows, rouge_l
from components.evaluate.report import (
    benchmark_verdicts,
    held_out_note,
    png_data_uri,
    render_html,
    render_markdown,
)
from components.evaluate.tracking import EvaluationTracking
from components.evaluation_tables import score_text
from components.hub_auth import hub_token
from trainer.config import TrainConfig
from trainer.cuda import check_cuda_usable
from trainer.data import load_split
from trainer.masking import Message, TokenisedConversation
from trainer.token_cache import SplitTokens, TokenManifest

COMPARED = ("eval_loss", "perplexity", "rouge_l")
PREFERENCES_COMPARED = ("reward_accuracy", "reward_margin")  # objective dpo's, beside COMPARED


@dataclass(frozen=True)
class HeldOut:
    """What every model is measured on: the tokenised eval conversations (objective sft), or the held-out
    preference pairs' rows and the DPO beta their rewards are scaled by (objective dpo)."""

    conversations: list[TokenisedConversation] | None
    pairs: dict[str, list[list[int]]] | None
    beta: float
    max_length: int

    @property
    def count(self) -> int:
        return len(self.pairs["prompt_ids"]) if self.pairs is not None else len(self.conversations or ())


@dataclass(frozen=True)
class ModelRun:
    """What one model produced: its held-out loss, its sample answers, its answers to the scored rows, its
    benchmark scores (task -> main metric entry; empty without benchmarks) and, on held-out pairs, its answers'
    log-probabilities."""

    loss: HeldOutLoss
    sample_answers: list[str]
    scored_answers: list[str]
    benchmarks: dict[str, dict[str, Any]]
    pairs: PairLogProbs | None = None


@dataclass(frozen=True)
class Evaluated:
    output_dir: Path
    evaluation: EvaluationResult
    samples: SampleAnswers
    training: TrainingSummary | None
    loss_curve_png: bytes | None


def resolve_max_length(options: EvaluateOptions, training: TrainingSummary | None) -> int:
    """The option when set, else the training run's truncation, else the trainer's default."""
    if options.max_length:
        return options.max_length
    return training.max_length if training else TrainConfig.max_length


def resolve_tokens_dir(options: EvaluateOptions, training: TrainingSummary | None) -> Path:
    """The option when set, else the tokenised data the training run read."""
    recorded = options.tokens_dir or (training.tokens_dir if training else None)
    if not recorded:
        raise UserError(
            f"no tokenised data to compute the held-out loss on: --tokens-dir is empty and {options.train_dir} has no "
            "training_summary.json naming the one training read. Pass --tokens-dir, the directory the tokenise step "
            "(python -m components.tokenise.stage) printed."
        )
    return Path(recorded)


def held_out_measures(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, held_out: HeldOut, batch_size: int
) -> tuple[HeldOutLoss, PairLogProbs | None]:
    """The model's held-out loss: over the conversations' assistant tokens, or over the chosen answers' tokens of
    the held-out pairs, whose log-probabilities come with it."""
    if held_out.pairs is None:
        loss = held_out_loss(model, held_out.conversations or [], tokenizer.pad_token_id, batch_size)
        print(
            f"  eval loss {loss.eval_loss:.4f}, perplexity {loss.perplexity:.3f} over {loss.eval_tokens} assistant "
            "tokens",
            flush=True,
        )
        return loss, None
    pairs = pair_log_probs(model, held_out.pairs, held_out.max_length)
    tokens = int(pairs.chosen_tokens.sum())
    loss = HeldOutLoss(pairs.chosen_loss, math.exp(min(pairs.chosen_loss, 700.0)), tokens)
    print(
        f"  held-out pairs: log-probability chosen {pairs.chosen.mean():.2f}, rejected {pairs.rejected.mean():.2f}; "
        f"eval loss {loss.eval_loss:.4f} over the {tokens} chosen answers' tokens",
        flush=True,
    )
    return loss, pairs


def run_model(
    load: Callable[[], PreTrainedModel],
    tokenizer: PreTrainedTokenizerBase,
    held_out: HeldOut,
    prompts: list[list[Message]],
    sample_count: int,
    options: EvaluateOptions,
    benchmarks: tuple[BenchmarkTasks, BenchmarkSettings] | None,
) -> ModelRun:
    """Load one model, measure it, generate with it and score it on the benchmarks; it is freed when this
    returns."""
    model = load()
    loss, pairs = held_out_measures(model, tokenizer, held_out, options.batch_size)
    answers = generate_answers(model, tokenizer, prompts, options.max_new_tokens, options.batch_size)
    scores = {}
    if benchmarks is not None:
        started = time.monotonic()
        scores = score_benchmarks(model, tokenizer, *benchmarks)
        listed = ", ".join(f"{task} {entry['metric']} {score_text(entry)}" for task, entry in scores.items())
        print(f"  benchmarks: {listed} ({time.monotonic() - started:.0f} s)", flush=True)
    return ModelRun(loss, answers[:sample_count], answers[sample_count:], scores, pairs)


def model_entry(run: ModelRun, rows: list[ReferenceRow], base: ModelRun, beta: float) -> ModelScores:
    """``run``'s numbers; on held-out pairs, its preferences too, with the base as the reference."""
    preferences = {}
    if run.pairs is not None and base.pairs is not None:
        scores = preference_scores(run.pairs, base.pairs, beta)
        preferences = {
            "reward_accuracy": scores.reward_accuracy,
            "reward_margin": scores.mean_margin,
            "chosen_log_prob": scores.chosen_log_prob,
            "rejected_log_prob": scores.rejected_log_prob,
        }
    return ModelScores(
        eval_loss=run.loss.eval_loss,
        perplexity=run.loss.perplexity,
        rouge_l=rouge_l(run.scored_answers, [row.reference for row in rows]),
        eval_tokens=run.loss.eval_tokens,
        **preferences,
    )


def compared(entry: ModelScores) -> tuple[str, ...]:
    """The numbers the report and the metrics compare: the held-out loss's, and the preferences' on pairs."""
    return COMPARED + (PREFERENCES_COMPARED if entry.reward_accuracy is not None else ())


def changes(new: ModelScores, reference: ModelScores) -> dict[str, float]:
    """The new model's numbers less the reference model's, for each compared number."""
    return {key: getattr(new, key) - getattr(reference, key) for key in compared(new)}


def held_out_data(
    options: EvaluateOptions, training: TrainingSummary | None, split: Any
) -> tuple[HeldOut, list[list[Message]], dict[str, int]]:
    """What the models are measured on, the conversations whose last answer ROUGE-L scores (under dpo: each
    prompt with its chosen answer), and how many held-out rows are used of how many."""
    max_length = resolve_max_length(options, training)
    tokens_dir = resolve_tokens_dir(options, training)
    manifest = TokenManifest.read(tokens_dir)
    objective = manifest.settings.get("objective", "sft")
    if training is not None and training.objective != objective:
        raise UserError(
            f"{tokens_dir} was tokenised for objective {objective}, and the training run in {options.train_dir} "
            f"trained with objective {training.objective}: the models would be measured on rows of the other kind. "
            "Pass the --tokens-dir that run read (empty: the one its training_summary.json names)."
        )
    if objective == "dpo":
        if training is None:
            raise UserError(
                f"{tokens_dir} holds preference pairs (objective dpo), and {options.train_dir} has no "
                f"{TRAINING_SUMMARY} to say the dpo_beta the models' rewards are scaled by. Pass --train-dir, the "
                "output directory of the training run that read these pairs."
            )
        pairs = usable_pairs(tokens_dir, max_length)
        held_out = HeldOut(None, pairs, float(training.config["dpo_beta"]), max_length)
        references = [prompt + chosen for prompt, chosen in zip(split["prompt"], split["chosen"])]
        return held_out, references, held_out_counts(manifest.eval, held_out.count, "pairs")
    conversations = usable_conversations(tokens_dir, max_length)
    held_out = HeldOut(conversations, None, 0.0, max_length)
    return held_out, split["messages"], held_out_counts(manifest.eval, held_out.count, "conversations")


def unavailable(error: ChampionUnavailable, target: PublishedTarget) -> str:
    """What stops the step without force; with force, the problem the report names instead of the comparison."""
    if not target.force:
        raise error
    problem = str(error).replace(FORCE_FIX, "").strip()
    print(f"the published model cannot be compared, and force is set: {problem}", flush=True)
    return problem


def load_champion(published: PublishedModel, tokenizer: PreTrainedTokenizerBase, token: str | None) -> Champion:
    """How to load the published model, once its files are here and its vocabulary is the new model's; raises
    ChampionUnavailable when it cannot be compared."""
    champion = champion_from(published, published_files(published, token))
    check_comparable(champion, tokenizer)
    return champion


def evaluate(
    options: EvaluateOptions, target: PublishedTarget | None = None, mlflow_run_url: str | None = None
) -> Evaluated:
    """Compare the models and write the stage's files; see the module docstring for the order. Without
    ``target`` no published model is looked for; ``mlflow_run_url``, the run's MLflow run, goes into the record."""
    check_fine_tuned_dir(options.fine_tuned_model)
    training = TrainingSummary.read(options.train_dir / TRAINING_SUMMARY)
    # The base model as it was trained from: the Hub commit the trainer recorded (None for a local checkpoint).
    base_revision = training.base_model_commit if training else None
    tokenizer = load_tokenizer(options.fine_tuned_model)
    check_same_vocabulary(load_tokenizer(options.base_model, base_revision), tokenizer, options.base_model)
    split = load_split(options.data_dir, "eval")
    held_out, references, held_out_count = held_out_data(options, training, split)
    rows = reference_rows(references, options.score_rows)
    questions = options.questions
    prompts = [[{"role": "user", "content": question}] for question in questions] + [row.prompt for row in rows]
    print(
        f"{held_out_note(held_out_count)} (max_length {held_out.max_length}), {len(questions)} sample questions, "
        f"{len(rows)} scored rows",
        flush=True,
    )
    benchmarks = prepare_benchmarks(options)

    def measure(role: str, name: str, load: Callable[[], PreTrainedModel]) -> ModelRun:
        print(f"{role}: {name}", flush=True)
        run = run_model(load, tokenizer, held_out, prompts, len(questions), options, benchmarks)
        release_memory()
        return run

    # The published model is found, fetched and checked before any model runs: a missing folder, a missing
    # adapter or another vocabulary must stop the step in seconds, not after the base model's generations.
    token = hub_token()
    published = find_published(target.repo_id, target.workspace_root, token) if target else None
    champion, problem = None, None
    if target is not None:
        found = published.description if published else "none yet, so the gate compares with the base model only"
        print(f"published model: {found}", flush=True)
    if target is not None and published is not None:
        try:
            champion = load_champion(published, tokenizer, token)
        except ChampionUnavailable as error:
            problem = unavailable(error, target)

    runs = {
        "base": measure(
            "base",
            options.base_model + (f" at {base_revision}" if base_revision else ""),
            lambda: load_model(options.base_model, base_revision),
        )
    }
    if champion is not None and target is not None:
        try:
            runs["published"] = measure("published", champion.kind, champion.load)
        except ChampionUnavailable as error:
            champion, problem = None, unavailable(error, target)
    runs["fine_tuned"] = measure(
        "fine_tuned", str(options.fine_tuned_model), lambda: load_model(options.fine_tuned_model)
    )

    entries = {role: model_entry(run, rows, runs["base"], held_out.beta) for role, run in runs.items()}
    base, tuned = entries["base"], entries["fine_tuned"]
    benchmark_scores = {role: run.benchmarks for role, run in runs.items()} if benchmarks else {}
    gate = with_benchmarks(
        gate_decision(options, entries, published, target, problem),
        benchmark_comparisons(benchmark_scores, options.max_benchmark_drop) if benchmarks else (),
        bool(target and target.force),
    )
    published_scores = entries.get("published")
    evaluation = EvaluationResult(
        base_model=options.base_model,
        base_model_commit=base_revision,
        fine_tuned_model=str(options.fine_tuned_model),
        base=base,
        fine_tuned=tuned,
        deltas=changes(tuned, base),
        scored_rows=len(rows),
        held_out=held_out_count,
        benchmarks=benchmark_record(options, benchmarks, benchmark_scores),
        gate=GateVerdict(
            passed=gate.passed,
            min_eval_loss_improvement=options.min_eval_loss_improvement,
            reason=gate.reason,
            forced=gate.forced,
            max_benchmark_drop=options.max_benchmark_drop,
            comparisons=tuple(
                GateComparison(each.against, each.passed, each.reason, each.benchmark or None)
                for each in gate.comparisons
            ),
            min_improvement_over_published=options.min_improvement_over_published if published_scores else None,
            measure="reward_accuracy" if gate.measure is REWARD_ACCURACY else "eval_loss",
            min_reward_accuracy_improvement=gate.minimum if gate.measure is REWARD_ACCURACY else None,
        ),
        published_search=(
            {"repo_id": target.repo_id, "on_hub": bool(target.repo_id and token)} if target is not None else None
        ),
        published_model=(
            (champion.entry() if champion else {**published.entry(), "problem": problem})
            if published is not None
            else None
        ),
        published=published_scores,
        deltas_vs_published=changes(tuned, published_scores) if published_scores else None,
        mlflow_run_url=mlflow_run_url,
    )
    samples = SampleAnswers(
        tuple(
            SampleAnswer(question, **{role: run.sample_answers[number] for role, run in runs.items()})
            for number, question in enumerate(questions)
        )
    )
    curve = options.train_dir / LOSS_CURVE
    evaluated = Evaluated(
        options.output_dir, evaluation, samples, training, curve.read_bytes() if curve.is_file() else None
    )
    write_outputs(evaluated)
    return evaluated


def prepare_benchmarks(options: EvaluateOptions) -> tuple[BenchmarkTasks, BenchmarkSettings] | None:
    """The benchmark tasks loaded and checked against where the step runs, before any model is scored; None when
    benchmark_tasks is empty."""
    entries = options.benchmark_entries
    if not entries:
        print("benchmarks: none (benchmark_tasks is empty)", flush=True)
        return None
    tasks = load_tasks(entries, options.tasks_root, options.benchmark_limit, options.benchmark_allow_code)
    device, _ = device_and_dtype()
    check_placement(
        tasks, device.type == "cuda", parameter_count(options.fine_tuned_model), str(options.fine_tuned_model)
    )
    shot = f"{options.benchmark_fewshot}-shot" if options.benchmark_fewshot else "zero-shot"
    print(
        f"benchmarks ({shot}, batch {options.benchmark_batch_size}): "
        + ", ".join(f"{name} ({count} examples)" for name, count in tasks.examples.items()),
        flush=True,
    )
    settings = BenchmarkSettings(options.benchmark_limit, options.benchmark_fewshot, options.benchmark_batch_size)
    return tasks, settings


def benchmark_record(
    options: EvaluateOptions,
    benchmarks: tuple[BenchmarkTasks, BenchmarkSettings] | None,
    scores: dict[str, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    """evaluation.json's account of the benchmarks: what ran with which settings and each model's scores, or why
    none ran."""
    if benchmarks is None:
        return {"skipped": "benchmark_tasks is empty, so no standard benchmark was run."}
    from importlib.metadata import version

    tasks, settings = benchmarks
    return {
        "tasks": list(tasks.names),
        "requested": options.benchmark_entries,
        "limit": settings.limit,
        "num_fewshot": settings.num_fewshot,
        "batch_size": settings.batch_size,
        "max_drop": options.max_benchmark_drop,
        "lm_eval_version": version("lm-eval"),
        "scores": scores,
    }


def held_out_counts(kept: SplitTokens, usable: int, kind: str) -> dict[str, int]:
    """How many eval rows (``kind``: conversations, or preference pairs) the held-out measures cover, of how many
    the tokenise step kept (``kept``: its manifest's eval split) and the split has."""
    return {
        kind: usable,
        "tokenised": kept.conversations,
        "split_conversations": kept.split_conversations,
        "eval_max_rows": kept.eval_max_rows,
    }


def gate_decision(
    options: EvaluateOptions,
    entries: dict[str, ModelScores],
    published: PublishedModel | None,
    target: PublishedTarget | None,
    problem: str | None,
) -> GateDecision:
    """The gate on the held-out loss, or under objective dpo on the held-out reward accuracy (the base's is
    chance: it is its own reference)."""
    on_pairs = entries["fine_tuned"].reward_accuracy is not None
    measure, key = (REWARD_ACCURACY, "reward_accuracy") if on_pairs else (EVAL_LOSS, "eval_loss")
    minimum = options.min_reward_accuracy_improvement if on_pairs else options.min_eval_loss_improvement
    base, tuned = getattr(entries["base"], key), getattr(entries["fine_tuned"], key)
    if "published" in entries and published is not None and target is not None:
        name = f"run {published.run_id}" if published.run_id else published.description
        return decide_with_published(
            base,
            tuned,
            minimum,
            getattr(entries["published"], key),
            options.min_improvement_over_published,
            name,
            target.force,
            measure,
        )
    if problem is not None:
        return decide_without_published(base, tuned, minimum, problem, measure)
    return decide(base, tuned, minimum, measure)


def write_outputs(evaluated: Evaluated) -> None:
    """Every file staged first, then renamed into place with evaluation.json last (the completion marker)."""
    target = evaluated.output_dir
    (target / SAMPLE_RESPONSES).parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(target) as staging:
        staging.file(SAMPLE_RESPONSES).parent.mkdir()
        staging.file(SAMPLE_RESPONSES).write_text(evaluated.samples.text(), encoding="utf-8")
        names = [SAMPLE_RESPONSES]
        if evaluated.loss_curve_png:
            staging.file(LOSS_CURVE).write_bytes(evaluated.loss_curve_png)
            names.append(LOSS_CURVE)
        document = evaluated.evaluation.as_json()
        markdown = render_markdown(
            document,
            evaluated.samples.answers,
            evaluated.training,
            LOSS_CURVE if evaluated.loss_curve_png else None,
        )
        staging.file(EVALUATION_MARKDOWN).write_text(markdown, encoding="utf-8")
        html = render_html(document, evaluated.samples.answers, evaluated.training, evaluated.loss_curve_png)
        staging.file(EVALUATION_HTML).write_text(html, encoding="utf-8")
        evaluated.evaluation.write(staging.file(EVALUATION))
        staging.publish(*names, EVALUATION_MARKDOWN, EVALUATION_HTML, EVALUATION)


ROLE_LABELS = (("base", "base      "), ("published", "published "), ("fine_tuned", "fine-tuned"))
# What the step writes for people: named in its log, uploaded to the run's MLflow run.
OUTPUT_FILES = (EVALUATION, EVALUATION_MARKDOWN, EVALUATION_HTML, SAMPLE_RESPONSES)


def summary(evaluated: Evaluated) -> str:
    evaluation = evaluated.evaluation
    lines = []
    for role, label in ROLE_LABELS:
        entry = getattr(evaluation, role)
        if entry is None:
            continue
        preferences = (
            f"  reward accuracy {entry.reward_accuracy:.4f}  margin {entry.reward_margin:.4f}"
            if entry.reward_accuracy is not None
            else ""
        )
        lines.append(
            f"{label}  eval loss {entry.eval_loss:.4f}  perplexity {entry.perplexity:.3f}  ROUGE-L {entry.rouge_l:.4f}"
            + preferences
        )
    lines += benchmark_verdicts(evaluation.as_json())
    gate = evaluation.gate
    lines.append(f"quality gate {'passed' if gate.passed else f'FAILED ({GATED_STAGES} are skipped)'}: {gate.reason}")
    lines += [f"{name} -> {evaluated.output_dir / name}" for name in OUTPUT_FILES]
    return "\n".join(lines)


def metrics_to_log(evaluation: EvaluationResult) -> dict[str, float]:
    """The KFP Metrics: each model's compared numbers, the new model's changes against the base (and the published
    model when there is one), each model's benchmark scores (``fine_tuned_arc_easy_acc_norm``), and the gate as
    1/0."""
    values = {}
    for key in compared(evaluation.fine_tuned):
        values[f"base_{key}"] = getattr(evaluation.base, key)
        if evaluation.published and evaluation.deltas_vs_published:
            values[f"published_{key}"] = getattr(evaluation.published, key)
        values[f"fine_tuned_{key}"] = getattr(evaluation.fine_tuned, key)
        values[f"{key}_delta"] = evaluation.deltas[key]
        if evaluation.published and evaluation.deltas_vs_published:
            values[f"{key}_delta_vs_published"] = evaluation.deltas_vs_published[key]
    for role, tasks in (evaluation.benchmarks or {}).get("scores", {}).items():
        for task, entry in tasks.items():
            values[f"{role}_{task}_{entry['metric'].split(' ', 1)[0]}"] = entry["value"]
    values["gate_passed"] = 1 if evaluation.gate.passed else 0
    values["gate_forced"] = 1 if evaluation.gate.forced else 0
    return values


def build_cli() -> argparse.ArgumentParser:
    """The options' own flags, and where to look for the published model the new one must beat."""
    parser = build_parser()
    published = parser.add_argument_group(
        "the published model",
        "With --workspace-root the new model is also compared with the model published before: on the Hub when "
        "--repo-id is given and HF_TOKEN is set, else the publish record on the workspace.",
    )
    published.add_argument("--workspace-root", default="", help="the workspace holding published/ and runs/")
    published.add_argument("--repo-id", default="", help="the Hub repository the model is published to")
    published.add_argument(
        "--force", action="store_true", help="pass the gate even when the new model does not beat the published one"
    )
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_cli().parse_args(argv)
    target = PublishedTarget(args.repo_id, args.workspace_root, args.force) if args.workspace_root else None
    print(summary(evaluate(options_from(args, EvaluateOptions), target)), flush=True)


@exit_on_user_error
def run_in_pipeline(
    options: EvaluateOptions,
    target: PublishedTarget,
    metrics,
    html_report_artifact,
    markdown_report_artifact,
    require_cuda: bool = False,
    mlflow: tuple[str, str, str] = ("", "", ""),
) -> tuple[bool, str]:
    """What the KFP component does: evaluate, fill the UI artifacts, return the gate's decision and reason.

    The Markdown artifact embeds the loss curve as a data URI, since the UI
    shows the artifact alone, without report.md's neighbouring image. ``target``
    says where the published model is looked for. With
    ``require_cuda`` (the pod was given a GPU) a CUDA failure stops the step
    instead of generating on the CPU. ``mlflow``: the tracking server, experiment and pipeline run id of the run's
    MLflow run (an empty server: none), which gets the same numbers as the step's metrics, the gate and the files,
    and is ended here.
    """
    if require_cuda:
        check_cuda_usable("evaluation step")
    tracking = EvaluationTracking.start(*mlflow)
    try:
        evaluated = evaluate(options, target, tracking.url if tracking else None)
    except BaseException:
        if tracking:
            tracking.failed()
        raise
    print(summary(evaluated), flush=True)
    numbers = metrics_to_log(evaluated.evaluation)
    for name, value in numbers.items():
        metrics.log_metric(name, value)
    if tracking:
        gate = evaluated.evaluation.gate
        tracking.finish(
            numbers,
            {"gate.passed": str(gate.passed).lower(), "gate.reason": gate.reason},
            [evaluated.output_dir / name for name in OUTPUT_FILES],
            evaluated.training.global_step if evaluated.training else 0,
        )
    png = evaluated.loss_curve_png
    markdown = render_markdown(
        evaluated.evaluation.as_json(),
        evaluated.samples.answers,
        evaluated.training,
        png_data_uri(png) if png else None,
    )
    # The UI shows the HTML artifact as it is.
    link_or_copy(evaluated.output_dir / EVALUATION_HTML, Path(html_report_artifact.path))
    Path(markdown_report_artifact.path).parent.mkdir(parents=True, exist_ok=True)
    Path(markdown_report_artifact.path).write_text(markdown, encoding="utf-8")
    for artifact, name in ((html_report_artifact, EVALUATION_HTML), (markdown_report_artifact, EVALUATION_MARKDOWN)):
        artifact.metadata.update({"workspace_path": str(evaluated.output_dir / name)})
    gate = evaluated.evaluation.gate
    return gate.passed, gate.reason


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> tuple[bool, str]:
    """What the ``evaluate_model`` component calls with every input by name; returns the gate's (passed, reason).

    The paths come from the run's directories; ``gpus`` (what the step's pod was given) decides ``require_cuda``.
    """
    train_dir = Path(inputs["train_dir"])
    options = options_from_inputs(
        EvaluateOptions,
        inputs,
        fine_tuned_model=train_dir / MERGED,
        data_dir=Path(inputs["data_dir"]),
        train_dir=train_dir,
        output_dir=stage_dir(inputs["workspace_root"], inputs["run_id"], "evaluate"),
        tasks_root=Path(inputs["workspace_root"]),
    )
    target = PublishedTarget(inputs["repo_id"], inputs["workspace_root"], inputs["force"])
    return run_in_pipeline(
        options,
        target,
        inputs["metrics"],
        inputs["report_html"],
        inputs["report_markdown"],
        require_cuda=inputs["gpus"] > 0,
        mlflow=(inputs["mlflow_tracking_uri"], inputs["mlflow_experiment"], inputs["run_id"]),
    )


if __name__ == "__main__":
    main()
