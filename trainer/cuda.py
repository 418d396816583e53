"""GPUs that were granted must work: no silent fall-back to the CPU.

When a pod is given GPUs but torch cannot use them (an image whose torch CUDA
build the node's driver is too old for, a missing driver mount), transformers
quietly runs on the CPU: hours of training at a fraction of the speed, holding
GPUs nobody uses. Whenever their pods asked for GPUs, the train and evaluation
steps call ``check_cuda_usable`` first, and stop with what to change instead.
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.errors import UserError

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")  # present where the NVIDIA kernel driver is mounted


def driver_version() -> str:
    """The NVIDIA kernel driver's own version line, or why there is none."""
    try:
        first_line = DRIVER_VERSION_FILE.read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return f"not visible ({DRIVER_VERSION_FILE} is missing: no NVIDIA driver is mounted into this container)"
    return " ".join(first_line.split())


def cuda_failure() -> str:
    """Why torch cannot use CUDA, in torch's own words."""
    if not torch.backends.cuda.is_built():
        return "this torch is a CPU-only build"
    try:
        torch.cuda.init()
    except Exception as error:  # torch raises RuntimeError or AssertionError, worded by the driver API
        return " ".join(str(error).split())
    return "torch sees no CUDA device"


def check_cuda_usable(step: str) -> None:
    """Raise ``UserError`` unless CUDA is usable; ``step`` names who asked for GPUs."""
    if torch.cuda.is_available():
        return
    raise UserError(
        f"The {step} was given GPUs, but CUDA is not usable in this pod: {cuda_failure()}. torch {torch.__version__} "
        f"is built for CUDA {torch.version.cuda or 'none'}; the node's NVIDIA driver is {driver_version()}. "
        "Rather than train on the CPU for hours while holding the GPUs, the step stops here. Use a runtime image "
        "whose torch CUDA version the node's driver supports (nvidia-smi on the node prints the highest CUDA "
        "version its driver supports), or set gpus_per_node to 0 to train on the CPU on purpose."
    )
