"""The tokenise step's own options; the ones it shares with training are TrainConfig's fields.

``max_length``, ``loss_on``, ``packing`` and ``base_model_revision`` change the
tokenised rows but belong to the training run: the step's CLI takes them from
``TrainConfig`` (``TRAINING_FIELDS``) and the pipeline passes it the same run
parameters as the train step, so both always agree.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from common.cli_options import add_options, option, run_option
from common.errors import UserError
from trainer.config import TrainConfig
from trainer.token_cache import TRAINING_SETTINGS

TRAINING_FIELDS = ("base_model_revision", *TRAINING_SETTINGS)

# benchmarks/tokenise_bench.py, 2 workers, SmolLM2's tokenizer, resident memory summed over the main process and
# its workers (pages the forked workers share with it counted in each): 1.58 GiB at 60k conversations (0.56 GiB
# main, 0.53 each worker); 4.07 GiB at 1M before chunks were compacted (2.15 main, 1.5 each worker). 1 GiB for the
# main process and 1.5 GiB per worker covers the larger figure, with room for larger vocabularies.
GIB = 1 << 30
MAIN_MEMORY = GIB
WORKER_MEMORY = 3 << 29


@dataclass(frozen=True)
class TokeniseOptions:
    """What one run of the tokenise step does, besides the training options it shares."""

    data_dir: Path = option(Path(), "The data stage's output directory (train.parquet, eval.parquet).", required=True)
    model: str = option(
        "",
        "Base model whose tokenizer and chat template tokenise the data: a local checkpoint directory or a Hugging "
        "Face Hub id (only its tokenizer files are downloaded).",
        required=True,
    )
    cache_dir: Path = option(
        Path(),
        "The token cache: each combination of data, tokenizer and settings gets its own entry here, reused "
        "whenever it repeats (the pipeline: <workspace>/token-cache).",
        required=True,
    )
    eval_max_rows: int = run_option(
        1000,
        "Most eval conversations used for the held-out loss, in training and in the evaluation stage: a fixed "
        "sample of the eval split (the same rows in every run), stated in the report. 0: every eval conversation.",
    )
    workers: int = option(0, "Processes tokenising in parallel; 0: one per CPU this process may use.")

    def __post_init__(self) -> None:
        found = option_problems(self)
        if found:
            raise UserError(
                "invalid tokenise options: " + "; ".join(f"{name} {problem}" for name, problem in found.items()) + "."
            )


def option_problems(options: TokeniseOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value."""
    return {
        name: f"must be 0 or more (got {getattr(options, name)})"
        for name in ("eval_max_rows", "workers")
        if getattr(options, name) < 0
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.tokenise.stage",
        description="Tokenise the data stage's splits once into the token cache that training and evaluation read.",
    )
    add_options(parser, TokeniseOptions)
    add_options(parser.add_argument_group("training options the tokens depend on"), TrainConfig, only=TRAINING_FIELDS)
    return parser
