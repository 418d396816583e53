"""Greedy answers to chat prompts, batched.

Prompts are rendered with the chat template and its generation prompt, exactly
as a chat client would send them, and left-padded so that every answer in a
batch starts right after its prompt. Generation stops at the model's EOS or at
the template's end-of-turn token, whichever the model emits first.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from trainer.masking import Message, tokenise_conversation

_PROBE = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The special token the chat template closes an assistant turn with, if it has one.

    The trainer's masking counts that token as part of the assistant's turn
    (the model learns to emit it), so it is the last masked token of a rendered
    probe conversation.
    """
    probe = tokenise_conversation(tokenizer, _PROBE)
    last = max(index for index, bit in enumerate(probe.assistant_masks) if bit)
    token_id = probe.input_ids[last]
    added = tokenizer.added_tokens_decoder.get(token_id)
    return token_id if token_id in tokenizer.all_special_ids or (added is not None and added.special) else None


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the model's generation config and the tokenizer, plus the end-of-turn token."""
    configured = model.generation_config.eos_token_id
    candidates = configured if isinstance(configured, list) else [configured]
    candidates = [*candidates, tokenizer.eos_token_id, end_of_turn_id(tokenizer)]
    return list(dict.fromkeys(token_id for token_id in candidates if token_id is not None))


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


@torch.inference_mode()
def generate_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Sequence[Message]],
    max_new_tokens: int,
    batch_size: int,
) -> list[str]:
    """The model's greedy reply to each conversation, in order, special tokens removed."""
    stop_ids = stop_token_ids(model, tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    prompts = [render_prompt(tokenizer, messages) for messages in conversations]
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        # The template already holds any BOS token, as in training.
        batch = tokenizer(
            prompts[start : start + batch_size],
            add_special_tokens=False,
            padding=True,
            padding_side="left",
            return_tensors="pt",
        ).to(model.device)
        generated = model.generate(**batch, generation_config=config)
        answers.extend(
            text.strip()
            for text in tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        )
    return answers
