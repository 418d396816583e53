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

import numpy as np
from transformers import PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

Message = dict[str, str]


class TemplateError(ValueError):
    """The chat template cannot locate the assistant turns of a conversation."""


@dataclass(frozen=True)
class TokenisedConversation:
    """Token ids of one rendered conversation and, per token, 1 when the assistant wrote it."""

    input_ids: list[int]
    assistant_masks: list[int]


def _render(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[Message]], generation_prompt: bool
) -> list[str]:
    """Every conversation rendered by the chat template, in one call (the template's per-call setup is paid once).

    This is ``apply_chat_template(tokenize=False)`` without its first pass, which turns message objects into dicts
    and drops keys whose value is None: messages here are already plain dicts of strings, and that pass was a third
    of the time spent rendering. What renders is transformers' own ``render_jinja_template`` with the arguments
    ``apply_chat_template`` gives it; a test holds the text to ``apply_chat_template``'s.
    """
    if not conversations:
        return []
    rendered, _ = render_jinja_template(
        [list(messages) for messages in conversations],
        chat_template=tokenizer.get_chat_template(),
        add_generation_prompt=generation_prompt,
        **tokenizer.special_tokens_map,
    )
    return rendered


def assistant_char_spans(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[Message]]
) -> list[tuple[str, list[tuple[int, int]]]]:
    """Per conversation, the rendered text and the ``[start, end)`` character span of every assistant turn.

    Each span needs the turns before it rendered with the generation prompt and the turns through it rendered
    without; all of those prefixes, for all the conversations, are rendered in batched calls.
    """
    turns = [
        (number, index)
        for number, messages in enumerate(conversations)
        for index, message in enumerate(messages)
        if message["role"] == "assistant"
    ]
    texts = _render(tokenizer, conversations, generation_prompt=False)
    # Nothing comes before a first turn, and through a last turn is the whole conversation, rendered already.
    befores = iter(_render(tokenizer, [conversations[n][:i] for n, i in turns if i], generation_prompt=True))
    throughs = iter(
        _render(
            tokenizer,
            [conversations[n][: i + 1] for n, i in turns if i + 1 < len(conversations[n])],
            generation_prompt=False,
        )
    )
    spans: list[list[tuple[int, int]]] = [[] for _ in conversations]
    for number, index in turns:
        text = texts[number]
        before = next(befores) if index else ""
        through = next(throughs) if index + 1 < len(conversations[number]) else text
        if not (text.startswith(before) and text.startswith(through) and len(through) > len(before)):
            raise TemplateError(
                f"the chat template does not render assistant turn {index} of a conversation as a prefix of the "
                "whole conversation, so its tokens cannot be located for assistant-only loss; train with "
                "--loss-on all, or use a model whose template renders conversation prefixes unchanged"
            )
        # The separator after the end-of-turn token is never generated, so it carries no loss.
        spans[number].append((len(before), len(through.rstrip())))
    return list(zip(texts, spans))


def tokenise_conversation(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> TokenisedConversation:
    """Token ids of ``messages`` rendered by the chat template, with the assistant mask."""
    (tokenised,) = tokenise_conversations(tokenizer, [messages])
    return tokenised


def tokenise_conversations(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[Message]]
) -> list[TokenisedConversation]:
    """Token ids of each conversation rendered by the chat template, with its assistant mask.

    The template already inserts any BOS token, so the tokenizer adds no special
    tokens of its own. A token belongs to the assistant when its first character
    lies inside an assistant span. The texts go to the tokenizer in one call (a
    fast tokenizer encodes a batch in parallel, in Rust) and each mask comes from
    the offsets in numpy rather than a Python loop per token.
    """
    rendered = assistant_char_spans(tokenizer, conversations)
    encodings: Any = tokenizer([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
    return [
        TokenisedConversation(input_ids=list(input_ids), assistant_masks=_mask(offsets, spans))
        for (_, spans), input_ids, offsets in zip(rendered, encodings["input_ids"], encodings["offset_mapping"])
    ]


def _mask(offsets: Sequence[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Per token, 1 when its first character lies inside an assistant span.

    The spans are in order and disjoint. For each token, the candidate span is the first one ending after the
    furthest token start seen so far (a pointer that only moves forward, as a scan over the tokens would have).
    """
    token = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = token[:, 0], token[:, 1]
    if not spans:
        return [0] * len(starts)
    span = np.asarray(spans, dtype=np.int64)
    current = np.searchsorted(span[:, 1], np.maximum.accumulate(starts), side="right")
    valid = current < len(span)
    current = np.minimum(current, len(span) - 1)
    inside = valid & (span[current, 0] <= starts) & (starts < span[current, 1]) & (ends > starts)
    return inside.astype(np.int64).tolist()
