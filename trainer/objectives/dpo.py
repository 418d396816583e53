"""Direct preference optimisation: the chosen answer made more likely than the rejected one, relative to the model
the run started from (the reference).

TRL's ``DPOTrainer`` on the pair rows the tokenise step wrote (``trainer.preference_rows``), which are exactly what
its own preparation makes: it prepares nothing again in any rank. The reference is the starting model: for lora
and qlora the same model with its adapter disabled (TRL does this when no ``ref_model`` is given), so no second
copy is held; for full fine-tuning TRL keeps a frozen copy.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from trl import DPOConfig, DPOTrainer

from trainer.config import TrainConfig
from trainer.distributed import Topology
from trainer.objectives import Objective
from trainer.run_arguments import run_arguments
from trainer.run_trainer import RunTrainer

log = logging.getLogger("trainer")


def reference_description(reference: Any) -> str:
    """What the run compares its policy with, for the log: the same model with its adapter off, or TRL's copy."""
    if reference is None:
        return "the model itself with its adapter disabled (no second copy in memory)"
    from torch.distributed.fsdp import FSDPModule

    placed = "sharded by FSDP across the ranks" if isinstance(reference, FSDPModule) else "whole on every rank"
    return f"a frozen copy of the starting model, {placed}"


class DPORunTrainer(RunTrainer, DPOTrainer):
    """TRL's DPOTrainer with the run's own behaviour (``RunTrainer``), on the tokenise step's rows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log.info("DPO reference: %s", reference_description(self.ref_model))

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        # The tokenise step wrote prompt_ids, chosen_ids and rejected_ids as this would, and dropped the pairs whose
        # prompt fills max_length (trainer.preference_rows).
        return dataset


def dpo_arguments(config: TrainConfig, topology: Topology, has_eval: bool) -> DPOConfig:
    """The run's arguments and DPO's own: beta, the loss, and the length a prompt and answer are cut to."""
    return DPOConfig(
        **run_arguments(config, topology, has_eval),
        beta=config.dpo_beta,
        loss_type=[config.dpo_loss],
        max_length=config.max_length,
        truncation_mode="keep_start",
    )


def forwarded_tokens(example: dict[str, Any]) -> np.ndarray:
    """The tokens one pair puts through the model: the prompt with each answer."""
    prompt = example["prompt_ids"]
    return np.asarray([*prompt, *example["chosen_ids"], *prompt, *example["rejected_ids"]], dtype=np.int64)


DPO = Objective("dpo", dpo_arguments, DPORunTrainer, forwarded_tokens)
