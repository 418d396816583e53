"""The tests' tiny models tokenise as SmolLM2 does, on fewer ids (conftest's ``cut_tokenizer``).

Many tests train these models to check the trainer's plumbing; what they learn from rests on the cut tokenizer
being SmolLM2's in every way but the length of its tokens.
"""

from __future__ import annotations

from conftest import TINY_VOCABULARY
from transformers import AutoConfig, AutoTokenizer

TEXTS = [
    "For knots, what is a bowline?",
    "naïve café ☕ 🎉 Ünïcödé… 我想在apple工作",
    "  two  spaces \n\nline breaks\t\ttabs ",
    "<|im_start|>user\nHello<|im_end|>\n",
]


def test_the_cut_tokenizer_is_smollm2s_on_fewer_ids(smollm2_dir, tiny_model_dir):
    full, cut = AutoTokenizer.from_pretrained(smollm2_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(cut) == AutoConfig.from_pretrained(tiny_model_dir).vocab_size == TINY_VOCABULARY
    assert cut.chat_template == full.chat_template
    assert cut.all_special_tokens == full.all_special_tokens and cut.all_special_ids == full.all_special_ids
    assert (cut.bos_token_id, cut.eos_token_id, cut.pad_token_id) == (
        full.bos_token_id,
        full.eos_token_id,
        full.pad_token_id,
    )
    for text in TEXTS:
        ids = cut(text, add_special_tokens=False).input_ids
        assert cut.decode(ids) == text == full.decode(full(text).input_ids)
    long = " ".join(TEXTS[:3]) * 4
    assert len(cut(long).input_ids) > len(full(long).input_ids)  # the same text in more, shorter tokens
    messages = [{"role": "user", "content": TEXTS[0]}, {"role": "assistant", "content": TEXTS[1]}]
    assert cut.apply_chat_template(messages, tokenize=False) == full.apply_chat_template(messages, tokenize=False)
