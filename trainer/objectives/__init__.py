"""What a run optimises, apart from the run around it.

``trainer/train.py`` is the generic run: the distributed set-up, the base model and its adapter, the token
rows, checkpoints and resume, pre-emption, the speed path, saving and merging, the summary. An objective is
what changes with the loss: its Trainer arguments (a ``TrainingArguments`` class from TRL and the options it
sets beyond ``trainer.run_arguments``) and its trainer class (TRL's, with ``trainer.run_trainer.RunTrainer``
mixed in). Each lives in one module here; ``trainer.train.OBJECTIVES`` names them. Adding one is a recipe in
docs/contributing.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from transformers import Trainer, TrainingArguments

from trainer.config import TrainConfig
from trainer.distributed import Topology


@dataclass(frozen=True)
class Objective:
    """One training objective: how its Trainer is configured and which trainer class runs it."""

    name: str
    # (config, topology, has_eval) -> the objective's TrainingArguments
    arguments: Callable[[TrainConfig, Topology, bool], TrainingArguments]
    trainer_class: type[Trainer]
    # one training example's tokens as the model sees them: the token count and the shard digest (ShardRecorder)
    example_tokens: Callable[[dict[str, Any]], np.ndarray]
