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
from itertools import chain
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


@dataclass(frozen=True)
class TokenisedBatch:
    """Many conversations' token ids and assistant masks laid end to end, with each conversation's length."""

    input_ids: np.ndarray  # int32
    assistant_masks: np.ndarray  # int8, 1 where the assistant wrote the token
    lengths: np.ndarray  # int64, tokens per conversation


def tokenise_conversation(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> TokenisedConversation:
    """Token ids of ``messages`` rendered by the chat template, with the assistant mask."""
    (tokenised,) = tokenise_conversations(tokenizer, [messages])
    return tokenised


def tokenise_conversations(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[Message]]
) -> list[TokenisedConversation]:
    """Token ids of each conversation rendered by the chat template, with its assistant mask."""
    if not conversations:
        return []
    batch = tokenise_batch(tokenizer, conversations)
    bounds = np.cumsum(batch.lengths)[:-1]
    return [
        TokenisedConversation(input_ids=ids.tolist(), assistant_masks=masks.tolist())
        for ids, masks in zip(np.split(batch.input_ids, bounds), np.split(batch.assistant_masks, bounds))
    ]


def tokenise_batch(tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[Message]]) -> TokenisedBatch:
    """Every conversation rendered by the chat template and tokenised, with the assistant masks, as flat arrays.

    The template already inserts any BOS token, so the tokenizer adds no special tokens of its own. A token belongs
    to the assistant when its first character lies inside an assistant span. The texts go to the tokenizer in one
    call (a fast tokenizer encodes in Rust) and the masks of all the conversations come from one numpy pass over
    their offsets: each conversation's characters are numbered after the previous one's, so its tokens and spans
    never meet another's.
    """
    if not conversations:
        return TokenisedBatch(np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0, np.int64))
    rendered = assistant_char_spans(tokenizer, conversations)
    texts = [text for text, _ in rendered]
    encodings: Any = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    lengths = np.fromiter(map(len, encodings["input_ids"]), np.int64, len(texts))
    tokens = int(lengths.sum())
    input_ids = np.fromiter(chain.from_iterable(encodings["input_ids"]), np.int32, tokens)
    offsets = chain.from_iterable(chain.from_iterable(encodings["offset_mapping"]))
    token_chars = np.fromiter(offsets, np.int64, 2 * tokens).reshape(-1, 2)
    first_char = np.cumsum([0] + [len(text) + 1 for text in texts[:-1]], dtype=np.int64)
    token_chars += np.repeat(first_char, lengths)[:, None]
    spans = np.array(
        [(start + first, end + first) for (_, own), first in zip(rendered, first_char.tolist()) for start, end in own],
        dtype=np.int64,
    ).reshape(-1, 2)
    return TokenisedBatch(input_ids, _mask(token_chars, spans), lengths)


def _mask(token_chars: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Per token (``[start, end)`` characters), 1 when its first character lies inside an assistant span.

    The spans are in order and disjoint. For each token, the candidate span is the first one ending after the
    furthest token start seen so far (a pointer that only moves forward, as a scan over the tokens would have).
    """
    starts, ends = token_chars[:, 0], token_chars[:, 1]
    if not len(spans):
        return np.zeros(len(starts), np.int8)
    current = np.searchsorted(spans[:, 1], np.maximum.accumulate(starts), side="right")
    valid = current < len(spans)
    current = np.minimum(current, len(spans) - 1)
    inside = valid & (spans[current, 0] <= starts) & (starts < spans[current, 1]) & (ends > starts)
    return inside.astype(np.int8)
