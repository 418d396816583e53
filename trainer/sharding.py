"""FSDP2 through the Trainer's own ``fsdp_config``, and the evidence that the model really was sharded.

With ``--sharding fsdp`` the Hugging Face Trainer hands accelerate an FSDP2
plugin (full shard, one FSDP unit per transformer block from the model's own
``_no_split_modules``, sharded distributed checkpoints), and accelerate shards
the model with ``torch.distributed.fsdp.fully_shard``. Nothing here wraps a
model by hand.

Two things the libraries do not do for us:

- On a CPU-only job accelerate classifies the run as ``MULTI_CPU`` and drops the
  FSDP plugin (accelerate/state.py, ``AcceleratorState.__init__``: only
  accelerator device types reach the FSDP branch), so the Trainer silently wraps
  the model in DDP. FSDP2 itself runs on CPU over gloo, so ``use_fsdp_on_cpu``
  puts the plugin back where accelerate would have on a GPU; the rest of the path
  (``fsdp2_prepare_model``, sharded saves and loads) is then the one GPU jobs take.
- Whatever the cause of a silent fall-back, ``local_parameter_fraction``
  measures what each rank holds (≈ 1 / world size when sharded, 1.0 under DDP),
  ``check_sharded`` stops a run asked for FSDP whose ranks hold everything, and
  the summary records the fraction per rank.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch.distributed.tensor import DTensor
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from common.errors import UserError
from trainer.config import TrainConfig
from trainer.diagnostics import gather

# A rank of a sharded job holds at most 1/world size of each sharded parameter plus whatever FSDP leaves
# whole (none of a transformer's weights: fully_shard shards every parameter on dim 0, padding the last rank).
# Anything above this share of the model on one rank means it was not sharded.
MOST_HELD_BY_A_SHARDED_RANK = 0.75


def trainer_arguments(config: TrainConfig) -> dict[str, Any]:
    """The Trainer's FSDP arguments for ``config.sharding`` (none for DDP).

    - ``version 2``: FSDP2 (``fully_shard``), per-parameter sharding that LoRA's mix of
      frozen and trainable weights needs.
    - ``SHARDED_STATE_DICT``: every rank writes its own shards of weights and optimizer state
      (torch.distributed.checkpoint) instead of gathering 16 bytes per parameter on rank 0.
    - ``cpu_ram_efficient_loading``: only rank 0 reads the base weights into host memory and
      broadcasts them; the other ranks build the model on the meta device. Eight ranks of a node
      each loading an 8B model in fp32 would need 256 GB of host memory.
    - No ``activation_checkpointing`` here: transformers checkpoints the blocks under FSDP as under DDP
      (``trainer.run_arguments``). FSDP's own wraps each block in a ``CheckpointWrapper``, whose module names PEFT 0.21
      cannot match to the gathered weights' (it strips only FSDP1's prefix): every checkpoint and ``adapter/``
      of a LoRA run came out empty and ``merged/`` was the untrained base. FSDP2 skips the unshard of a
      block recomputed in its backward either way (``FSDPState._pre_forward``): counted on 2 ranks, 6
      all-gathers per step with either kind of checkpointing and with none (transformers' warning of a
      redundant all-gather is about FSDP1).
    """
    if config.sharding != "fsdp":
        return {}
    return {
        "fsdp": True,
        "fsdp_config": {
            "version": 2,
            "reshard_after_forward": True,
            "state_dict_type": "SHARDED_STATE_DICT",
            "cpu_ram_efficient_loading": True,
        },
    }


def prepare_environment(config: TrainConfig) -> None:
    """What ``accelerate launch`` would export for an FSDP run, for a job started by plain torchrun.

    transformers reads it in ``from_pretrained`` to load the weights on local rank 0 only
    (transformers/distributed/fsdp.py, ``is_fsdp_enabled``).
    """
    if config.sharding == "fsdp":
        os.environ["ACCELERATE_USE_FSDP"] = "true"
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"


def use_fsdp_on_cpu(trainer: Trainer) -> None:
    """Give a CPU-only job the FSDP plugin accelerate dropped, so that the Trainer shards instead of using DDP."""
    state = trainer.accelerator.state
    if trainer.args.fsdp_plugin_args is None or state.distributed_type != DistributedType.MULTI_CPU:
        return
    # Both places accelerate itself records the decision (AcceleratorState.__init__ ends by copying it into
    # PartialState's shared state, and every later AcceleratorState() copies it back).
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    trainer.is_fsdp_enabled = True


def local_parameter_fraction(model: torch.nn.Module) -> float:
    """Parameters this rank holds ÷ parameters of the model (tied weights counted once)."""
    held = total = 0
    for parameter in model.parameters():
        total += parameter.numel()
        held += parameter.to_local().numel() if isinstance(parameter, DTensor) else parameter.numel()
    return held / total if total else 1.0


def check_sharded(config: TrainConfig, fractions: list[float]) -> None:
    """Stop a job asked for FSDP whose ranks each hold (nearly) the whole model: it would fit no better than DDP."""
    if config.sharding != "fsdp" or len(fractions) < 2:
        return
    unsharded = [rank for rank, fraction in enumerate(fractions) if fraction > MOST_HELD_BY_A_SHARDED_RANK]
    if unsharded:
        held = ", ".join(f"rank {rank}: {fractions[rank]:.0%}" for rank in unsharded)
        raise UserError(
            f"--sharding fsdp was asked for, but the model is not sharded ({held} of the parameters held locally; "
            f"sharded, each of the {len(fractions)} ranks would hold about {1 / len(fractions):.0%}). The installed "
            "accelerate/transformers did not apply FSDP; rather than train unsharded, the run stops here. Check the "
            "library versions against the runtime image's, or use --sharding none."
        )


class ShardingCheck(TrainerCallback):
    """Measures what each rank holds once the Trainer has wrapped the model, and stops an unsharded FSDP run."""

    def __init__(self, config: TrainConfig, world_size: int) -> None:
        self.config = config
        self.world_size = world_size
        self.fraction: float | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs: Any
    ) -> None:
        self.fraction = local_parameter_fraction(model)
        check_sharded(self.config, gather(self.fraction, self.world_size))
