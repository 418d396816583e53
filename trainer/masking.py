"""Tokenise a conversation and mark which tokens the assistant wrote.

TRL's ``assistant_only_loss`` needs ``{% generation %}`` markers in the chat
template, and most templates (SmolLM2's and SmolLM3's included) have none. This
module finds the assistant spans without them: a chat template renders a
conversation prefix the same way it renders the start of the whole
conversation, so the text an assistant turn adds is the difference between
rendering the turns before it (with the generation prompt) and rendering the
turns through it. Tokens whose characters fall inside those spans get mask 1;
the end-of-turn token is inside the span, so the model learns to stop; the
whitespace the template puts after it is not, since the model never emits it.

A template that is not prefix-preserving for a conversation (one that rewrites
earlier turns, e.g. to strip reasoning) is reported instead of silently
training on the wrong tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

Message = dict[str, str]


class TemplateError(ValueError):
    """The chat template cannot locate the assistant turns of a conversation."""


@dataclass(frozen=True)
class TokenisedConversation:
    """Token ids of one rendered conversation and, per token, 1 when the assistant wrote it."""

    input_ids: list[int]
    assistant_masks: list[int]


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
