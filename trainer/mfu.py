"""Model FLOPs utilisation (MFU): the share of the GPUs' peak arithmetic that the model's own FLOPs reach.

The model's FLOPs per trained token are 6N for full fine-tuning (forward 2N, backward 4N: gradients of the
activations and of the weights) and 4N for LoRA and QLoRA, whose frozen base needs no weight gradients, plus 2N
under DPO for the reference model's forward pass; N is the weights of the model's matrix products (its linear
layers, the output projection included where it shares the embeddings' weight; Kaplan et al. 2020). Attention's
own FLOPs, which PaLM adds
(12 x layers x hidden size x sequence length per token), are left out: with packed rows each sequence attends
only within itself, so its length is not the row's, and the utilisation here errs low rather than high.
Recomputed activations (gradient checkpointing) are not the model's FLOPs either: they lower MFU, as they should.

Peaks are NVIDIA's dense (no sparsity) bf16/fp16 tensor-core figures from the data sheets. A GPU not listed, fp32
training and the CPU give no MFU rather than a guess.
"""

from __future__ import annotations

from typing import Any

# The first name contained in torch.cuda.get_device_name() wins: "H100 PCIe" before "H100", and "L40S", "L40"
# before "L4".
PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM (the device name reads "NVIDIA H100 80GB HBM3")
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
)
TENSOR_CORE_PRECISIONS = ("bf16", "fp16")


def peak_flops(device: str, precision: str) -> float | None:
    """One GPU's peak FLOP/s for ``precision``; None where it is not known."""
    if precision not in TENSOR_CORE_PRECISIONS:
        return None
    return next((flops for name, flops in PEAK_FLOPS if name in device), None)


def flops_per_token(matmul_weights: int, trains_adapter: bool, with_reference: bool = False) -> float:
    """The model's training FLOPs per token for ``matmul_weights`` weights in matrix products; ``with_reference``:
    a frozen reference model's forward pass too (DPO)."""
    return ((4 if trains_adapter else 6) + (2 if with_reference else 0)) * matmul_weights


def matmul_weights(model: Any) -> int:
    """The weights of ``model``'s linear layers (LoRA's own included: their products are the adapter's FLOPs),
    counted from their shapes: a 4-bit layer (packed two weights a byte) and a sharded one (a slice on each rank)
    count whole, and a tied output projection counts although it shares the embedding's weight (the lookup is not
    a product; the projection is)."""
    import torch

    linear = (module for module in model.modules() if isinstance(module, torch.nn.Linear))
    return sum(module.in_features * module.out_features for module in linear)


def utilisation(tokens_per_second: float, per_token: float, peak: float | None, devices: int) -> float | None:
    """The run's MFU, 0 to 1, over ``devices`` GPUs of ``peak`` FLOP/s each; None without a peak."""
    if not peak or devices < 1:
        return None
    return tokens_per_second * per_token / (peak * devices)
