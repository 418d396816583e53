"""The Hugging Face architectures the built-in converter handles, and what each needs.

Every entry mirrors what llama.cpp's ``convert_hf_to_gguf.py`` does for that
architecture (its ``LlamaModel``, ``SmolLM3Model``, ``Qwen2Model`` and
``Qwen3Model`` classes), so the files we write load the same way in llama.cpp:

* the GGUF architecture name (which graph llama.cpp builds);
* whether the q/k projections are permuted: llama.cpp's Llama-family RoPE
  kernel pairs dimensions (i, i + d/2) the way the original Meta weights were
  laid out, and Hugging Face's Llama checkpoints interleave them, so the
  converter undoes that with ``permute`` (Qwen's graph uses NEOX-style RoPE and
  needs no permutation);
* the hyper-parameters written besides the generic ones;
* checks that the checkpoint is one llama.cpp can run faithfully (SmolLM3's
  no-RoPE layer pattern is hard-wired in llama.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gguf

from common.errors import UserError


def check_smollm3(config: dict[str, Any], config_path: str) -> None:
    """Refuse SmolLM3 checkpoints whose RoPE-less layers are not every fourth one.

    llama.cpp's SMOLLM3 graph skips RoPE in layer ``il`` exactly when
    ``(il + 1) % 4 == 0`` (``n_no_rope_layer_step = 4``); it does not read the
    pattern from the file, so any other pattern would convert silently and then
    produce wrong logits.
    """
    layers = int(config["num_hidden_layers"])
    expected = [int((layer + 1) % 4 != 0) for layer in range(layers)]
    pattern = config.get("no_rope_layers")
    interval = config.get("no_rope_layer_interval", 4)
    if pattern is None:
        pattern = [int((layer + 1) % interval != 0) for layer in range(layers)]
    if [int(value) for value in pattern] != expected:
        raise UserError(
            f"{config_path}: SmolLM3 no_rope_layers is {pattern} (no_rope_layer_interval {interval}), but llama.cpp "
            f"always skips RoPE in every fourth layer ({expected}). The GGUF would compute different logits, so it "
            "is not converted; only checkpoints with the standard pattern are supported."
        )
    if config.get("use_sliding_window") and config.get("sliding_window"):
        raise UserError(
            f"{config_path}: this SmolLM3 checkpoint uses sliding-window attention (sliding_window "
            f"{config['sliding_window']}), which llama.cpp's SmolLM3 graph does not implement; it is not converted."
        )


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture maps onto a llama.cpp architecture."""

    hf_name: str
    gguf_arch: gguf.MODEL_ARCH
    permute_qk: bool
    llama_hparams: bool  # LlamaModel.set_gguf_parameters: vocab_size and rope dimension count
    check: Callable[[dict[str, Any], str], None] | None = None

    @property
    def gguf_name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.gguf_arch]


SUPPORTED: dict[str, Architecture] = {
    arch.hf_name: arch
    for arch in (
        Architecture("LlamaForCausalLM", gguf.MODEL_ARCH.LLAMA, permute_qk=True, llama_hparams=True),
        Architecture("MistralForCausalLM", gguf.MODEL_ARCH.LLAMA, permute_qk=True, llama_hparams=True),
        Architecture(
            "SmolLM3ForCausalLM", gguf.MODEL_ARCH.SMOLLM3, permute_qk=True, llama_hparams=True, check=check_smollm3
        ),
        Architecture("Qwen2ForCausalLM", gguf.MODEL_ARCH.QWEN2, permute_qk=False, llama_hparams=False),
        Architecture("Qwen3ForCausalLM", gguf.MODEL_ARCH.QWEN3, permute_qk=False, llama_hparams=False),
    )
}


class NeedsLlamaCpp(UserError):
    """A checkpoint the built-in converter does not handle but llama.cpp's converter may (see ``delegate``)."""


class UnsupportedArchitecture(NeedsLlamaCpp):
    """The checkpoint's architecture is not one the built-in converter handles."""

    def __init__(self, architecture: str, config_path: str) -> None:
        self.architecture = architecture
        super().__init__(
            f"{config_path}: architecture {architecture!r} is not supported by the built-in converter "
            f"(supported: {', '.join(SUPPORTED)}). Set LLAMA_CPP_DIR to a llama.cpp checkout to convert it "
            "with llama.cpp's own convert_hf_to_gguf.py instead."
        )


def architecture_of(config: dict[str, Any], config_path: str) -> Architecture:
    names = config.get("architectures") or []
    if not names:
        raise UserError(
            f"{config_path} has no 'architectures' entry; it is not a Hugging Face causal-LM checkpoint config."
        )
    if names[0] not in SUPPORTED:
        raise UnsupportedArchitecture(names[0], config_path)
    arch = SUPPORTED[names[0]]
    if arch.check is not None:
        arch.check(config, config_path)
    return arch


def permute_rows(weights, n_head: int):
    """llama.cpp's ``LlamaModel.permute`` for whole heads: rows (i, i + d/2) become neighbours.

    ``weights`` holds complete heads (a multiple of ``head_dim`` rows), so the
    same function works on a chunk of heads as on the whole tensor.
    """
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )
