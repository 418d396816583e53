"""Every knob of the data stage, its default, help text and validation, in one place.

``python -m components.data.stage`` generates its options from these fields
and the pipeline's run form takes its parameters, defaults and descriptions from
them (``components/run_form``).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from common.cli_options import run_option
from common.errors import UserError
from components.data.field_map import field_map_problem

MAX_SEED = 2**64  # the content hash's salt is an unsigned 64-bit integer


def fraction(text: str) -> float:
    """argparse type for a number in [0, 1), so a bad value is refused with the option's name."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 1)")
    return value


@dataclass(frozen=True)
class PrepareOptions:
    """What one run of the data stage does."""

    eval_fraction: float = run_option(
        0.1,
        "Share of records held out for evaluation, in [0, 1); a pipeline run needs it above 0, because the "
        "evaluation stage compares the models on these rows. Rows are assigned by a hash of their content "
        "(a preference pair's by its prompt's, so that the pairs of one prompt stay together), so appending data "
        "never moves existing rows between splits.",
        normalise=fraction,
    )
    seed: int = run_option(
        42,
        "Salt of the content hash that assigns rows to train or eval. Change it to draw a different split.",
        name="split_seed",
    )
    max_reject_fraction: float = run_option(
        0.05,
        "Fail the run when more than this share of records is invalid, in [0, 1). Rejected records are listed "
        "with file, line and reason in rejects.jsonl.",
        normalise=fraction,
    )
    system_prompt: str = run_option("", "System message prepended to conversations that have none. Empty adds none.")
    field_map: str = run_option(
        "",
        'JSON object mapping our field names to the file\'s own column names, e.g. {"question": "input", "answer": '
        '"answer"}, so a file with other names reads as one of the accepted shapes. Empty: the names as they are.',
    )
    decontaminate: bool = run_option(
        True,
        "Drop the training rows that share a 13-word sequence with a row of the eval split (lm-eval's "
        "decontamination: lowercase, ASCII punctuation removed), so the held-out loss and the gates measure "
        "rows the model never saw. false keeps them; either way stats.json and the data report count them per "
        "source, with examples.",
    )
    max_contamination: float = run_option(
        1.0,
        "Refuse the run when a source's training rows overlap more than this share of a benchmark task's scored "
        "documents (each document: its question and correct answer, 13 words or more; an overlap: a shared "
        "13-word sequence, as lm-eval's decontamination finds it), naming the source and the task: a model "
        "that trained on a benchmark's answers makes its score meaningless. In [0, 1]; 1 never refuses, and the "
        "data report counts the overlaps either way. The tasks are benchmark_tasks'.",
    )

    def __post_init__(self) -> None:
        found = option_problems(self)
        if found:
            raise UserError(
                "invalid data options: " + "; ".join(f"{name} {problem}" for name, problem in found.items()) + "."
            )


# Options the fingerprint leaves out, added after the first release: max_contamination refuses data but never
# changes it, and what decontaminate drops shows in the rows' own digest. So data prepared before they existed keeps
# its fingerprint, and a scheduled run does not retrain for them.
NOT_FINGERPRINTED = ("decontaminate", "max_contamination")


def fingerprinted(options: PrepareOptions) -> dict[str, object]:
    """The options as the fingerprint takes them."""
    return {name: value for name, value in dataclasses.asdict(options).items() if name not in NOT_FINGERPRINTED}


def option_problems(options: PrepareOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way (CLI flag, run parameter)."""
    problems = {
        name: f"must be at least 0 and below 1 (got {getattr(options, name)})"
        for name in ("eval_fraction", "max_reject_fraction")
        if not 0.0 <= getattr(options, name) < 1.0
    }
    if not 0.0 <= options.max_contamination <= 1.0:
        problems["max_contamination"] = f"must be between 0 and 1 (got {options.max_contamination})"
    if not 0 <= options.seed < MAX_SEED:
        problems["seed"] = f"must be between 0 and 2**64 - 1 (got {options.seed})"
    if options.system_prompt and not options.system_prompt.strip():
        problems["system_prompt"] = (
            "is only whitespace, which would add a blank system turn to every conversation; "
            "pass real text, or an empty string for no system prompt"
        )
    problem = field_map_problem(options.field_map)
    if problem:
        problems["field_map"] = problem
    return problems
