"""The Trainer arguments every objective's run sets the same way, from the ``TrainConfig``.

An objective's arguments class (TRL's ``SFTConfig``, ...) is a ``transformers.TrainingArguments``: its module
passes ``run_arguments(...)`` and adds its own (``trainer.objectives``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from trainer import distributed, sharding
from trainer.config import TrainConfig, peak_learning_rate
from trainer.distributed import Topology
from trainer.precision import device_capability, precision


def run_arguments(config: TrainConfig, topology: Topology, has_eval: bool) -> dict[str, Any]:
    """Schedule, batches, checkpoints, logging, distribution and precision: TrainingArguments' keywords."""
    evaluate_by_steps = config.eval_steps > 0
    checkpointing = config.recomputes_activations
    eval_strategy = "no" if not has_eval else "steps" if evaluate_by_steps else "epoch"
    return dict(
        output_dir=str(config.checkpoints_dir),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        learning_rate=peak_learning_rate(config) * (topology.world_size if config.scale_lr else 1),
        lr_scheduler_type="cosine",
        warmup_steps=config.warmup_ratio,  # a float below 1 is a share of all steps
        weight_decay=config.weight_decay,
        per_device_train_batch_size=config.per_device_batch_size,
        # One (packed) eval row per forward pass: the Trainer averages per-batch mean losses, so only with one
        # row per batch does each eval row weigh the same whatever the number of ranks it is spread over.
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        activation_checkpointing=checkpointing,
        # transformers checkpoints the blocks whose index is a multiple of every_n_layers
        activation_checkpointing_kwargs={"every_n_layers": config.checkpoint_every} if checkpointing else None,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        eval_strategy=eval_strategy,
        eval_steps=config.eval_steps if evaluate_by_steps else None,
        logging_strategy="steps",
        logging_steps=config.logging_steps,
        logging_first_step=True,
        report_to=["tensorboard"],
        # Tokens are counted by ShardRecorder on the CPU: the Trainer's counter and its check of every step's loss
        # for nan/inf each read a GPU value back after every micro-batch, stalling the GPU's queue. An inf or nan
        # loss then shows in the logged mean instead of being replaced by the previous steps' average.
        include_num_input_tokens_seen="no",
        logging_nan_inf_filter=False,
        ddp_backend=distributed.backend() if topology.world_size > 1 else None,
        ddp_find_unused_parameters=False,
        # A peer pod that is gone leaves the others blocked in their next collective; torch's default waits 30
        # minutes (NCCL) before the rank fails, torchrun ends the pod and the job restarts and resumes. Under
        # torchrun the group already exists (distributed.initialise, same timeout) and accelerate reuses it; this
        # keeps the Trainer's arguments saying what the group does.
        ddp_timeout=round(config.collective_timeout_minutes * 60),
        # Equal training batch counts per rank without accelerate's padding of the last batch with repeated
        # samples, which would break the disjoint shards. The eval loader keeps every row (RunTrainer).
        dataloader_drop_last=topology.world_size > 1,
        disable_tqdm=not sys.stderr.isatty(),
        use_liger_kernel=config.liger_kernels,
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=not torch.cuda.is_available(),
        **precision(device_capability(topology) if config.mixed_precision else None),
        **sharding.trainer_arguments(config),
    )
