"""Tiny random checkpoints of every architecture the GGUF converter handles.

Each uses SmolLM2's tokenizer and chat template (real tokenisation, ChatML),
2-4 layers of width 64, and a stored dtype chosen to exercise a different
reading path (f16, bf16, sharded bf16; SmolLM2 covers f32). The embeddings are
scaled up so the logits have clear winners (with the usual 0.02 every logit is
nearly equal and top-1 agreement would measure rounding noise), and q/k
projections scaled down so attention stays smooth. Mistral's intermediate size
(80) is not a multiple of the q8_0 block, so its down projection exercises
llama.cpp's F16 fallback.

transformers 5 tokenizes every ``model_type: qwen2`` checkpoint with its
Qwen2Tokenizer, which replaces the pre-tokenizer by Qwen's regex; the tiny Qwen2
model is therefore saved with the tokenizer as transformers really applies it
(SmolLM2's vocabulary, Qwen's pre-tokenizer). That combination is in neither
converter's table of known tokenizers, so both are told the pre-tokenizer
(``PRE_TOKENIZER_OVERRIDES``): ours through ``--pre-tokenizer``, llama.cpp's in
the test driver.
"""

from __future__ import annotations

from pathlib import Path

ARCHITECTURES = ("smollm3", "qwen2", "qwen3", "mistral")
PRE_TOKENIZER_OVERRIDES = {"qwen2": "qwen2"}
QK_SCALE = 0.25
EMBEDDING_SCALE = 5.0


def build_tiny_model(kind: str, tokenizer_dir: Path, target: Path) -> Path:
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        SmolLM3Config,
        SmolLM3ForCausalLM,
    )

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    specs = {
        "smollm3": (
            SmolLM3Config,
            SmolLM3ForCausalLM,
            dict(num_hidden_layers=4, tie_word_embeddings=True),
            torch.bfloat16,
            None,
        ),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False), torch.float16, None),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=True), torch.bfloat16, None),
        "mistral": (
            MistralConfig,
            MistralForCausalLM,
            dict(intermediate_size=80, sliding_window=None, tie_word_embeddings=False),
            torch.bfloat16,
            "3MB",
        ),
    }
    config_class, model_class, extra, dtype, shard = specs[kind]
    torch.manual_seed(0)
    model = model_class(config_class(**{**common, **extra}))
    with torch.no_grad():  # gentle attention: saturated softmaxes would turn rounding noise into different tokens
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(QK_SCALE)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                parameter.mul_(EMBEDDING_SCALE)
    model = model.to(dtype)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model.save_pretrained(target, max_shard_size=shard) if shard else model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    if kind == "qwen2":
        AutoTokenizer.from_pretrained(target).save_pretrained(target)  # as transformers applies it: Qwen2Tokenizer
    return target
