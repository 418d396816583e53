"""Every knob of the evaluation stage, its default and its help text, in one place.

``EvaluateOptions`` is the single source of truth: the command line of
``python -m components.evaluate`` is generated from its fields and the KFP
component takes its defaults from it. This module imports nothing heavy, so the
pipeline definition can read the defaults without loading torch.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from common.cli_options import add_options, option, options_from, run_option
from common.errors import UserError
from components.benchmark_tasks.tasks import path_problem, task_entries

# The questions of the original project's demo, asked of both models in every run.
DEFAULT_QUESTIONS = (
    "How many cups in a gallon?",
    "How do I treat a nosebleed?",
    "What are the advantages of a mirrorless DSLR camera?",
    "What is the easiest loop knot to tie?",
    "I have a whistle, what is the right way to signal for help?",
)


@dataclass(frozen=True)
class EvaluateOptions:
    """What one evaluation of a fine-tuned model against its base does."""

    base_model: str = option(
        "", "Base model the run was trained from: a local checkpoint directory or a Hugging Face Hub id.", required=True
    )
    fine_tuned_model: Path = option(
        Path(), "The fine-tuned checkpoint: the training stage's merged/ directory.", required=True
    )
    data_dir: Path = option(
        Path(), "The data stage's output directory; its eval.parquet holds the rows the models answer.", required=True
    )
    tokens_dir: str = option(
        "",
        "The tokenise step's output; its eval conversations (at most eval_max_rows of the split) give the held-out "
        "loss. Empty: the tokens_dir the training run read (training_summary.json).",
    )
    train_dir: Path = option(
        Path(), "The training stage's output directory (training_summary.json, loss_curve.png).", required=True
    )
    output_dir: Path = option(Path(), "Where evaluation.json, the reports and demo_outputs/ go.", required=True)
    extra_questions: tuple[str, ...] = run_option(
        (),
        "Questions asked of the base and the fine-tuned model after the five built-in ones "
        "(in the run form, a JSON list of strings).",
    )
    max_new_tokens: int = run_option(
        256,
        "Most tokens generated per answer in the evaluation (sample questions and scored rows).",
        name="eval_max_new_tokens",
    )
    score_rows: int = run_option(
        50,
        "Held-out rows answered by both models and scored with ROUGE-L against the reference answer.",
        name="eval_score_rows",
    )
    max_length: int = option(
        0,
        "Tokens per held-out conversation for the loss; longer ones are truncated as in training. "
        "0: the max_length in training_summary.json.",
    )
    batch_size: int = run_option(
        8, "Conversations per forward pass and prompts per generation batch.", name="eval_batch_size"
    )
    min_eval_loss_improvement: float = run_option(
        0.0,
        "Quality gate: the base model's held-out loss minus the fine-tuned one's must be at least this; otherwise "
        "nothing is exported or published (0: the fine-tune must not make it worse).",
    )
    min_reward_accuracy_improvement: float = run_option(
        0.05,
        "Quality gate under objective dpo (instead of min_eval_loss_improvement): the fine-tuned model's reward "
        "accuracy on the held-out pairs (the share whose chosen answer it prefers over the rejected one, against "
        "the base it was tuned from) minus the base's, which is chance, 0.5, must be at least this; otherwise "
        "nothing is exported or published. Between -0.5 and 0.5.",
    )
    min_improvement_over_published: float = run_option(
        0.0,
        "Champion gate: when a model was published before (to hub_repo_id, or by an earlier local or dry run), "
        "its held-out loss on this run's split minus the new model's (under objective dpo: the new model's "
        "held-out reward accuracy minus the published one's) must be at least this; otherwise nothing is "
        "exported or published (0: the new model must be no worse). force overrides it.",
    )

    benchmark_tasks: str = run_option(
        "arc_easy,hellaswag",
        "Standard benchmarks every model is scored on with lm-evaluation-harness, comma-separated: lm-eval task, "
        "group or tag names (their data come from the Hub at run time, into HF_HOME on the workspace), "
        "practical_skills_mc (the bundled task), or directories of lm-eval task YAMLs with their data files (an "
        "entry with a /; a relative path inside the workspace, such as tasks/mine), for air-gapped clusters. A task "
        "directory is code: one holding Python is refused unless benchmark_allow_code is true. Empty: no "
        "benchmarks, and the report says so.",
    )
    benchmark_allow_code: bool = run_option(
        False,
        "Let a benchmark task directory hold Python (a .py file, or a !function tag in its YAMLs), which lm-eval "
        "imports: a task directory with Python is code run in the evaluate pod, which holds the Hub write token and "
        "the service-account token. Leave false unless you trust everyone who can write the directory.",
    )
    benchmark_limit: int = run_option(
        1000,
        "Examples per benchmark task, the same first ones for every model (0: all of them; hellaswag has 10,042).",
    )
    benchmark_fewshot: int = run_option(
        0, "Few-shot examples before each benchmark question, drawn with lm-eval's fixed seed (0: zero-shot)."
    )
    benchmark_batch_size: int = run_option(16, "Requests per forward pass in the benchmarks.")
    max_benchmark_drop: float = run_option(
        0.02,
        "Gate: the largest drop of a benchmark task's main metric (absolute, in the metric's own units: 0.02 is 2 "
        "points of accuracy) allowed against the base model and against the published one; a larger drop fails the "
        "gate. force overrides the comparison with the published model only.",
    )
    tasks_root: Path = option(
        Path("."),
        "Where a relative benchmark task directory is looked for, and what it and every file its tasks read must "
        "stay inside (the pipeline: the workspace root).",
    )

    def __post_init__(self) -> None:
        found = option_problems(self)
        if found:
            raise UserError(
                "invalid evaluation options: " + "; ".join(f"{name} {problem}" for name, problem in found.items()) + "."
            )

    @property
    def benchmark_entries(self) -> list[str]:
        """The benchmark tasks as written, stripped, each once; [] when none are asked for."""
        return task_entries(self.benchmark_tasks)

    @property
    def questions(self) -> list[str]:
        """The built-in questions, then the user's (stripped, each asked once)."""
        return list(dict.fromkeys([*DEFAULT_QUESTIONS, *(question.strip() for question in self.extra_questions)]))


def option_problems(options: EvaluateOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way (CLI flag, run parameter)."""
    problems = {
        name: f"must be at least {minimum} (got {getattr(options, name)})"
        for name, minimum in (
            ("max_new_tokens", 1),
            ("score_rows", 1),
            ("batch_size", 1),
            ("max_length", 0),
            ("benchmark_limit", 0),
            ("benchmark_fewshot", 0),
            ("benchmark_batch_size", 1),
        )
        if getattr(options, name) < minimum
    }
    for name in (
        "min_eval_loss_improvement",
        "min_reward_accuracy_improvement",
        "min_improvement_over_published",
        "max_benchmark_drop",
    ):
        if not math.isfinite(getattr(options, name)):
            problems[name] = f"must be a finite number (got {getattr(options, name)})"
    if abs(options.min_reward_accuracy_improvement) > 0.5:
        problems["min_reward_accuracy_improvement"] = (
            f"must be between -0.5 and 0.5 (got {options.min_reward_accuracy_improvement}): a reward accuracy lies "
            "between 0 and 1, and the base's is 0.5"
        )
    if any(not entry.strip() for entry in options.benchmark_tasks.split(",")) and options.benchmark_tasks.strip():
        problems["benchmark_tasks"] = (
            f"holds an empty entry ({options.benchmark_tasks!r}); separate task names with single commas"
        )
    # A task directory is code: one outside the workspace is refused here, in the first step, by its text.
    outside = path_problem(task_entries(options.benchmark_tasks))
    if outside:
        problems.setdefault("benchmark_tasks", outside)
    if any(not question.strip() for question in options.extra_questions):
        problems["extra_questions"] = "holds an empty question; remove it or write the question"
    return problems


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser whose options are exactly ``EvaluateOptions``' fields."""
    parser = argparse.ArgumentParser(
        prog="python -m components.evaluate",
        description="Compare a fine-tuned model with its base on the held-out split and decide the quality gate.",
    )
    add_options(parser, EvaluateOptions)
    return parser


def parse_options(argv: Sequence[str] | None = None) -> EvaluateOptions:
    return options_from(build_parser().parse_args(argv), EvaluateOptions)
