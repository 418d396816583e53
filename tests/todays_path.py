"""The data path the trainer had before the tokenise step, kept as the reference its rows are held to.

Every rank read the Parquet split, tokenised each conversation
(``masking_reference``, one at a time) and handed ``input_ids`` with
``assistant_masks`` to TRL's ``SFTTrainer``, whose own preparation built the
labels and truncated or packed. The tokenise step must give the trainer exactly
the rows that made. Run as a script under torchrun, this module trains the way
the trainer did then: ``python -m trainer`` with that data path patched back in
(``TODAYS_DATA_DIR`` names the Parquet directory).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import masking_reference
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase
from trl import SFTTrainer

from trainer import data
from trainer.config import TrainConfig
from trainer.distributed import Topology


def tokenise_split(split: Dataset, tokenizer: PreTrainedTokenizerBase, loss_on: str) -> Dataset:
    """Each conversation's ids (and assistant masks unless ``loss_on == "all"``), one conversation at a time."""
    encoded = [masking_reference.tokenise_conversation(tokenizer, messages) for messages in split["messages"]]
    columns = {"input_ids": [conversation.input_ids for conversation in encoded]}
    if loss_on != "all":
        columns["assistant_masks"] = [conversation.assistant_masks for conversation in encoded]
    return Dataset.from_dict(columns)


def trl_arguments(config: TrainConfig, has_eval: bool):
    """The trainer's SFTConfig with TRL's own dataset preparation switched back on."""
    from trainer.objectives.sft import sft_arguments

    args = sft_arguments(config, Topology(rank=0, local_rank=0, world_size=1), has_eval=has_eval)
    args.dataset_kwargs = None
    args.report_to = []
    return args


def trl_prepared(model_dir: Path, split: Dataset, tokenizer: PreTrainedTokenizerBase, config: TrainConfig) -> Dataset:
    """What TRL's SFTTrainer makes of today's tokenised split under the trainer's settings."""
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=trl_arguments(config, has_eval=False),
        train_dataset=split,
        processing_class=tokenizer,
    )
    return trainer.train_dataset


def main() -> int:
    """``python -m trainer`` on today's data path: the tokenise step's rows replaced by per-rank tokenisation."""
    from trainer import train
    from trainer.__main__ import main as trainer_main

    parquet = Path(os.environ["TODAYS_DATA_DIR"])

    def todays_rows(config, model_dir, tokenizer):
        splits = {
            split: tokenise_split(data.load_split(parquet, split), tokenizer, config.loss_on) for split in data.SPLITS
        }
        # the token manifest's counts and data directory that the trainer reads (trainer.token_cache.TokenManifest)
        counts = SimpleNamespace(
            data_dir=str(parquet),
            **{split: SimpleNamespace(conversations=len(rows), sources=()) for split, rows in splits.items()},
        )
        return counts, splits["train"], splits["eval"]

    plain_sft_arguments = train.OBJECTIVES["sft"].arguments

    def preparing_sft_arguments(*args, **kwargs):
        arguments = plain_sft_arguments(*args, **kwargs)
        arguments.dataset_kwargs = None
        return arguments

    data.token_rows = todays_rows
    train.OBJECTIVES["sft"] = dataclasses.replace(train.OBJECTIVES["sft"], arguments=preparing_sft_arguments)
    return trainer_main()


if __name__ == "__main__":
    sys.exit(main())
