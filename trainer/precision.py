"""Which floating-point precision a rank trains in, decided by its own GPU.

bf16 where the GPU computes it natively, fp16 with loss scaling on older GPUs,
fp32 on the CPU. The evaluation step loads its models by the same rule.
"""

from __future__ import annotations

import torch

from trainer.distributed import Topology

# Native bf16 arrived with Ampere (compute capability 8.0). torch.cuda.is_bf16_supported() also says yes on
# T4 and V100 (7.x), where bf16 is emulated and slow, so it is not asked.
NATIVE_BF16_CAPABILITY = (8, 0)


def device_capability(topology: Topology) -> tuple[int, int] | None:
    """The compute capability of this rank's GPU (selected first, as the Trainer will), or None on CPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.set_device(topology.local_rank)
    return torch.cuda.get_device_capability(topology.local_rank)


def precision(capability: tuple[int, int] | None) -> dict[str, bool]:
    """bf16 on GPUs that have it natively, fp16 with loss scaling on older GPUs, fp32 on CPU."""
    if capability is None:
        return {"bf16": False, "fp16": False}
    bf16 = has_native_bf16(capability)
    return {"bf16": bf16, "fp16": not bf16}


def has_native_bf16(capability: tuple[int, int]) -> bool:
    return tuple(capability) >= NATIVE_BF16_CAPABILITY


def native_bf16() -> bool:
    """Whether the current CUDA device computes bf16 natively (False without CUDA)."""
    return torch.cuda.is_available() and has_native_bf16(torch.cuda.get_device_capability())
