"""Preference pairs as token rows: what TRL's ``DPOTrainer`` makes of a conversational pair, made once.

TRL's own preparation (``DPOTrainer._prepare_dataset``) renders, per pair, the prompt alone with the generation
prompt, then the prompt followed by each answer, and starts each answer's tokens where the rendering with it
parts from the prompt's (``trl.data_utils.common_prefix_length``: a template may render the prompt alone
differently). The tokenise step writes those rows here instead, once, for every rank to memory-map; the trainer's
DPO objective passes them to TRL as they are.

Truncation, as TRL's: its collator keeps the start of prompt plus answer up to ``max_length``
(``truncation_mode`` keep_start), so the prompt is kept whole and an answer is cut at the end; a pair whose
prompt alone fills ``max_length`` would keep no answer token and is dropped here (the manifest counts it).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")


def _rendered(tokenizer: PreTrainedTokenizerBase, conversations: list[list[dict[str, Any]]], **options: Any) -> list:
    if not conversations:
        return []
    return tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=True, **options)["input_ids"]


def _shared(ids: list[int], other: list[int]) -> int:
    length = 0
    for left, right in zip(ids, other):
        if left != right:
            break
        length += 1
    return length


def tokenise_pairs(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[dict[str, Any]]],
    chosen: list[list[dict[str, Any]]],
    rejected: list[list[dict[str, Any]]],
    max_length: int,
) -> tuple[dict[str, list[list[int]]], list[int]]:
    """The pairs' token rows (``PAIR_COLUMNS``), and the positions of the pairs dropped for a prompt of
    ``max_length`` tokens or more (the tokenise step counts them, source by source)."""
    prompt_ids = _rendered(tokenizer, prompts, add_generation_prompt=True)
    with_chosen = _rendered(tokenizer, [p + c for p, c in zip(prompts, chosen)])
    with_rejected = _rendered(tokenizer, [p + r for p, r in zip(prompts, rejected)])
    rows: dict[str, list[list[int]]] = {name: [] for name in PAIR_COLUMNS}
    dropped: list[int] = []
    for position, (prompt, whole_chosen, whole_rejected) in enumerate(zip(prompt_ids, with_chosen, with_rejected)):
        start = min(_shared(prompt, whole_chosen), _shared(prompt, whole_rejected))
        if start >= max_length:
            dropped.append(position)
            continue
        rows["prompt_ids"].append(prompt[:start])
        rows["chosen_ids"].append(whole_chosen[start:])
        rows["rejected_ids"].append(whole_rejected[start:])
    return rows, dropped
