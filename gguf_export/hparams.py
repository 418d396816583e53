"""Model hyper-parameters (config.json) as GGUF keys, and the RoPE frequency factors tensor.

Mirrors ``TextModel.set_gguf_parameters`` and ``LlamaModel.set_gguf_parameters``
of llama.cpp's converter for the keys our architectures use, so llama.cpp reads
the same values whichever converter wrote the file.
"""

from __future__ import annotations

import math
from typing import Any

import gguf
import numpy as np

from gguf_export.architectures import Architecture, NeedsLlamaCpp

SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", "llama3")


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 ``rope_parameters`` (or 4.x ``rope_scaling``) with ``rope_theta`` folded in."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params = dict(params.get("full_attention", params))
    if "rope_theta" not in params and config.get("rope_theta") is not None:
        params["rope_theta"] = config["rope_theta"]
    if "rope_type" not in params and params.get("type") is not None:
        params["rope_type"] = params["type"]
    return params


def check_rope(config: dict[str, Any], config_path: str) -> None:
    rope_type = rope_parameters(config).get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise NeedsLlamaCpp(
            f"{config_path}: RoPE type {rope_type!r} is not supported by the built-in converter "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)}); set LLAMA_CPP_DIR to convert with llama.cpp."
        )


def head_dim(config: dict[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def add_hparams(
    writer: gguf.GGUFWriter, config: dict[str, Any], arch: Architecture, file_type: gguf.LlamaFileType
) -> None:
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    rope = rope_parameters(config)
    rope_type = rope.get("rope_type", "default")
    if rope_type == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (
            ("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
            ("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
            ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
            ("beta_slow", writer.add_rope_scaling_yarn_beta_slow),
        ):
            if rope.get(key) is not None:
                add(rope[key])
    if rope.get("rope_theta") is not None:
        writer.add_rope_freq_base(rope["rope_theta"])
    if config.get("rms_norm_eps") is not None:
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim") is not None:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_file_type(file_type)
    if arch.llama_hparams:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim(config))


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray | None:
    """The ``rope_freqs`` tensor llama.cpp needs for Llama 3.1-style RoPE scaling, else None.

    Computed in float32 step by step as llama.cpp's converter does with torch,
    so the values are bit-identical.
    """
    rope = rope_parameters(config)
    if str(rope.get("rope_type", "")).lower() != "llama3":
        return None
    base = rope.get("rope_theta", 10000.0)
    dim = head_dim(config)
    freqs = np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = rope.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (np.float32(old_context_len) / wavelen - np.float32(low_freq_factor)) / np.float32(
                high_freq_factor - low_freq_factor
            )
            factors.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    return np.array(factors, dtype=np.float32)
