"""The checks a rank makes of its options and its process before anything heavy loads.

``python -m trainer`` runs them before it imports transformers, PEFT and TRL (most of a rank's start-up): a pod
with an option it cannot honour, the wrong number of workers or no usable CUDA stops after torch's import alone,
with one paragraph naming the option and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from common.cli_options import flag
from common.errors import UserError
from trainer import distributed
from trainer.config import TrainConfig, option_problems, packages_needed
from trainer.cuda import check_cuda_usable
from trainer.distributed import Topology


def check(config: TrainConfig) -> Topology:
    """This process's place in the job, once ``config`` has passed every check that needs no model."""
    topology = Topology.from_environment()
    if config.require_cuda:
        check_cuda_usable("training job")
    distributed.check_world_size(topology, config.expected_world_size)
    check_config(config, topology)
    return topology


def check_config(config: TrainConfig, topology: Topology) -> None:
    """Reject settings that would fail (or silently misbehave) only after the model has loaded."""
    problems = [f"{flag(name)} {problem}" for name, problem in option_problems(config).items()]
    if config.sharding == "fsdp" and topology.world_size < 2:
        problems.append(
            "--sharding fsdp needs at least 2 processes to shard the model across, and this run has 1; launch with "
            "torchrun --nproc-per-node (and nodes) for 2 or more, or use --sharding none"
        )
    for field, needs in packages_needed(dataclasses.asdict(config)).items():
        no_cuda = needs.cuda and not torch.cuda.is_available()
        if no_cuda or not importlib.util.find_spec(needs.module):
            missing = "no CUDA device" if no_cuda else f"no {needs.module}"
            switched_on = getattr(config, field) is True  # a boolean flag: --liger-kernels, off with --no-...
            asked = flag(field) if switched_on else f"{flag(field)} {getattr(config, field)}"
            fix = (
                f"leave it out or pass --no-{flag(field)[2:]}"
                if switched_on
                else needs.alternative.replace(field, flag(field))
            )
            what = f"a CUDA GPU and the {needs.module} package" if needs.cuda else f"the {needs.module} package"
            problems.append(f"{asked} needs {what}, and this process has {missing}; {fix}")
    if problems:
        raise UserError("invalid training options: " + "; ".join(problems) + ".")
