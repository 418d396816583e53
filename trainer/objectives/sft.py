"""Supervised fine-tuning: the loss of the assistant's tokens (or every token) of the chat conversations.

TRL's ``SFTTrainer`` on the rows the tokenise step wrote, exactly as its own preparation makes them (labels,
truncation or packing), so TRL prepares nothing again in any rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from trl import SFTConfig, SFTTrainer

from trainer import compiled
from trainer.config import TrainConfig
from trainer.distributed import Topology
from trainer.objectives import Objective
from trainer.run_arguments import run_arguments
from trainer.run_trainer import RunTrainer


class SFTRunTrainer(RunTrainer, SFTTrainer):
    """TRL's SFTTrainer with the run's own behaviour (``RunTrainer``)."""


def sft_arguments(config: TrainConfig, topology: Topology, has_eval: bool) -> SFTConfig:
    """The run's arguments and SFT's own: the rows' length, packing, and the padding compiled blocks need."""
    return SFTConfig(
        **run_arguments(config, topology, has_eval),
        max_length=config.max_length,
        packing=config.packing,
        packing_strategy="bfd",
        padding_free=config.packing,
        pad_to_multiple_of=compiled.PAD_MULTIPLE if compiled.why_run_not_compiled(config) is None else None,
        # The tokenise step wrote the rows TRL's preparation would make (labels, truncation or packing): TRL must
        # not map over the whole data set again in every rank.
        dataset_kwargs={"skip_prepare_dataset": True},
    )


def row_tokens(example: dict[str, Any]) -> np.ndarray:
    """A (packed) row's tokens."""
    return np.asarray(example["input_ids"], dtype=np.int64)


SFT = Objective("sft", sft_arguments, SFTRunTrainer, row_tokens)
