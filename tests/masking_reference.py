"""The per-conversation tokenisation the trainer used before it tokenised in batches, kept as the reference.

``trainer.masking`` renders prefixes for many conversations at once, tokenises them
in one call and computes masks with numpy; the tests hold it to this straightforward
version (one conversation, one render per prefix, a Python loop over the tokens), so
a faster path can never train on different tokens than the one that was reviewed.
"""

from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from trainer.masking import Message, TemplateError, TokenisedConversation


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the ``[start, end)`` character span of every assistant turn."""
    text = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], generation_prompt=True) if index else ""
        through = _render(tokenizer, messages[: index + 1], generation_prompt=False)
        if not (text.startswith(before) and text.startswith(through) and len(through) > len(before)):
            raise TemplateError(
                f"the chat template does not render assistant turn {index} of a conversation as a prefix of the "
                "whole conversation, so its tokens cannot be located for assistant-only loss; train with "
                "--loss-on all, or use a model whose template renders conversation prefixes unchanged"
            )
        # The separator after the end-of-turn token is never generated, so it carries no loss.
        spans.append((len(before), len(through.rstrip())))
    return text, spans


def tokenise_conversation(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> TokenisedConversation:
    """Token ids of ``messages`` rendered by the chat template, with the assistant mask.

    The template already inserts any BOS token, so the tokenizer adds no special
    tokens of its own. A token belongs to the assistant when its first character
    lies inside an assistant span.
    """
    text, spans = assistant_char_spans(tokenizer, messages)
    encoding: Any = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    masks = []
    span_index = 0
    for start, end in encoding["offset_mapping"]:
        while span_index < len(spans) and start >= spans[span_index][1]:
            span_index += 1
        inside = span_index < len(spans) and spans[span_index][0] <= start < spans[span_index][1] and end > start
        masks.append(1 if inside else 0)
    return TokenisedConversation(input_ids=list(encoding["input_ids"]), assistant_masks=masks)
