"""Validate parsed preference records and make each a prompt, a chosen answer and a rejected answer.

Every preference shape makes two whole conversations, the chosen one and the rejected one, each beginning with
the prompt (``shapes.RecordShape.pair``); both are checked as any conversation is (roles, blank turns, the
assistant's turn last). The prompt is where the two part: the messages they share, ending with the user's turn,
and what follows on each side must be the assistant's answer. TRL's conversational form (a prompt list, the
answers as assistant messages) and UltraFeedback's whole conversations are so read alike, and a pair whose sides
part earlier (another question, another system prompt, a different earlier answer) is refused, naming the
message where they part. Vectorised over a whole chunk like ``normalise``; only rejected rows are looked at one
by one, to explain them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.data.arrays import as_bool, sliced_lists
from components.data.normalise import (
    RowProblem,
    check_conversations,
    check_required_fields,
    column_of,
    content_keys,
    describe_conversation,
    detect_shapes,
    fields_of,
    flat_fields,
    in_row_order,
    with_system_prompt,
)
from components.data.schema import MESSAGES_TYPE, Reason
from components.data.shapes import PAIR_SHAPES_HINT, SHAPES

_NO_SHAPE = -1
_PAIR_SHAPES = [code for code, shape in enumerate(SHAPES) if shape.is_pair]
_SIDES = ("chosen", "rejected")
_KEY_SEP, _SIDE_SEP = "\x1f", "\x1c"
EXCERPT_CHARS = 120  # of a message where the sides part, in a reject's explanation


@dataclass
class NormalisedPairs:
    """Accepted preference pairs of one chunk, in input order."""

    rows: np.ndarray  # index of each accepted row in the parsed table
    shapes: np.ndarray  # each accepted row's shape: its index in SHAPES
    prompt: pa.ListArray  # the shared messages, ending with the user's turn (with the system prompt, if any)
    chosen: pa.ListArray  # the chosen answer: assistant messages
    rejected: pa.ListArray  # the rejected answer: assistant messages
    content_keys: pa.StringArray  # canonical content of the pair, without the injected system prompt
    conversation_chars: np.ndarray  # the prompt and the chosen answer
    response_chars: np.ndarray  # the chosen answer
    # What the split is drawn by: the prompt's canonical content, so that every pair of one prompt (data sets of k
    # answers per prompt make several) lands in the same split and the held-out pairs' prompts are never trained on
    split_keys: pa.StringArray


def normalise_pairs(table: pa.Table, system_prompt: str) -> tuple[NormalisedPairs, list[RowProblem]]:
    """Check every row of ``table`` as a preference pair and split the good ones into prompt and answers."""
    table = table.combine_chunks()
    columns = {name: column_of(table, name) for name in table.column_names}
    valid = {name: as_bool(pc.is_valid(array)) for name, array in columns.items()}
    shape = detect_shapes(valid, table.num_rows)
    is_pair = np.isin(shape, _PAIR_SHAPES)
    reason = np.full(table.num_rows, Reason.OK, dtype=np.int8)
    reason[~is_pair] = Reason.NOT_A_PAIR
    reason[shape == _NO_SHAPE] = Reason.UNKNOWN_SHAPE
    check_required_fields(columns, valid, shape, reason)
    sides = _sides(columns, shape)
    failing_side = _check_sides(sides, is_pair, reason)
    lengths = [np.asarray(pc.fill_null(pc.list_value_length(side), 0), dtype=np.int64) for side in sides]
    shared = _shared_messages(sides, lengths, reason == Reason.OK)
    _check_parting(sides, lengths, shared, reason)

    problems = []
    for row in np.flatnonzero(reason != Reason.OK).tolist():
        record, code = table.slice(row, 1).to_pylist()[0], Reason(int(reason[row]))
        conversations = [side[row].as_py() for side in sides]
        detail = _describe(code, record, int(shape[row]), conversations, int(failing_side[row]), int(shared[row]))
        problems.append(RowProblem(row, code, detail))
    accepted = np.flatnonzero(reason == Reason.OK)
    take = pa.array(accepted, pa.int64())
    chosen_all, rejected_all = (pc.take(side, take) if len(accepted) else pa.array([], MESSAGES_TYPE) for side in sides)
    starts = shared[accepted]
    prompt = sliced_lists(chosen_all, np.zeros_like(starts), starts)
    chosen = sliced_lists(chosen_all, starts, lengths[0][accepted])
    rejected = sliced_lists(rejected_all, starts, lengths[1][accepted])
    prompt_chars, chosen_chars = (_chars(part) for part in (prompt, chosen))
    keys = [content_keys(part, *flat_fields(part)) for part in (prompt, chosen, rejected)]
    normalised = NormalisedPairs(
        rows=accepted,
        shapes=shape[accepted],
        prompt=with_system_prompt(prompt, system_prompt),
        chosen=chosen,
        rejected=rejected,
        content_keys=pc.binary_join_element_wise(*keys, _SIDE_SEP) if len(accepted) else pa.array([], pa.string()),
        conversation_chars=prompt_chars + chosen_chars,
        response_chars=chosen_chars,
        split_keys=keys[0],
    )
    return normalised, problems


def _sides(columns: dict[str, pa.Array], shape: np.ndarray) -> tuple[pa.ListArray, pa.ListArray]:
    """Every pair-shaped row's chosen and rejected conversation (null for other rows), in row order."""
    parts: tuple[list[pa.ListArray], list[pa.ListArray]] = ([], [])
    order = []
    for code in _PAIR_SHAPES:
        rows = np.flatnonzero(shape == code)
        if len(rows):
            for part, side in zip(parts, SHAPES[code].pair(fields_of(columns, SHAPES[code], rows))):
                part.append(side)
            order.append(rows)
    others = np.flatnonzero(~np.isin(shape, _PAIR_SHAPES))
    if len(others) or not order:
        for part in parts:
            part.append(pa.nulls(len(others), MESSAGES_TYPE))
        order.append(others)
    return in_row_order(parts[0], order), in_row_order(parts[1], order)


def _check_sides(sides: tuple[pa.ListArray, pa.ListArray], is_pair: np.ndarray, reason: np.ndarray) -> np.ndarray:
    """Check each side as a conversation; returns, per row, the side (its index in _SIDES) a problem was found in."""
    failing_side = np.zeros(len(reason), dtype=np.int8)
    for index, side in enumerate(sides):
        found = reason.copy()
        check_conversations(side, is_pair, found)
        new = (reason == Reason.OK) & (found != Reason.OK)
        reason[new], failing_side[new] = found[new], index
    return failing_side


def _message_keys(side: pa.ListArray) -> pa.Array:
    roles, contents = flat_fields(side)
    return pc.binary_join_element_wise(roles, contents, _KEY_SEP)


def _shared_messages(
    sides: tuple[pa.ListArray, pa.ListArray], lengths: list[np.ndarray], rows: np.ndarray
) -> np.ndarray:
    """Per row, how many leading messages the two sides share (0 for the rows not in ``rows``)."""
    shared = np.zeros(len(rows), dtype=np.int64)
    checked = np.flatnonzero(rows)
    if not len(checked):
        return shared
    common = np.minimum(lengths[0], lengths[1])[checked]
    shared[checked] = common
    row = np.repeat(checked, common)
    position = np.arange(len(row)) - np.repeat(np.cumsum(common) - common, common)
    keys = []
    for side in sides:
        offsets = np.asarray(side.offsets, dtype=np.int64)
        index = offsets[row] - offsets[0] + position
        keys.append(pc.take(_message_keys(side), pa.array(index, pa.int64())))
    differ = ~as_bool(pc.equal(keys[0], keys[1]))
    np.minimum.at(shared, row[differ], position[differ])
    return shared


def _check_parting(
    sides: tuple[pa.ListArray, pa.ListArray], lengths: list[np.ndarray], shared: np.ndarray, reason: np.ndarray
) -> None:
    """Identical sides, and sides that do not part right after a prompt ending with the user's turn."""
    ok = reason == Reason.OK
    identical = ok & (shared == lengths[0]) & (shared == lengths[1])
    reason[identical] = Reason.IDENTICAL_SIDES
    ok &= ~identical
    parts_well = ok & (shared > 0)
    roles = [flat_fields(side)[0] for side in sides]
    offsets = [np.asarray(side.offsets, dtype=np.int64) for side in sides]
    rows = np.flatnonzero(parts_well)
    last_prompt_role = pc.take(roles[0], pa.array(offsets[0][rows] - offsets[0][0] + shared[rows] - 1, pa.int64()))
    parts_well[rows] = as_bool(pc.equal(last_prompt_role, "user"))
    for side_roles, side_offsets, side_lengths in zip(roles, offsets, lengths):
        rows = np.flatnonzero(parts_well)
        answer = side_lengths[rows] - shared[rows]
        parts_well[rows[answer == 0]] = False
        row = np.repeat(rows, np.maximum(answer, 0))
        position = np.arange(len(row)) - np.repeat(np.cumsum(answer) - answer, answer) + shared[row]
        index = side_offsets[row] - side_offsets[0] + position
        not_assistant = ~as_bool(pc.equal(pc.take(side_roles, pa.array(index, pa.int64())), "assistant"))
        parts_well[row[not_assistant]] = False
    reason[ok & ~parts_well] = Reason.SIDES_PART_BEFORE_THE_ANSWER


def _chars(messages: pa.ListArray) -> np.ndarray:
    """Per row, the characters of its messages' contents."""
    lengths = np.asarray(pc.fill_null(pc.utf8_length(flat_fields(messages)[1]), 0), dtype=np.int64)
    per_message = np.concatenate([[0], np.cumsum(lengths)])
    offsets = np.asarray(messages.offsets, dtype=np.int64) - messages.offsets[0].as_py()
    return per_message[offsets[1:]] - per_message[offsets[:-1]]


def _describe(
    reason: Reason, record: dict, code: int, sides: list[list[dict | None] | None], side: int, shared: int
) -> str:
    """A precise, human explanation for one rejected row."""
    if reason == Reason.UNKNOWN_SHAPE:
        return f"the record has none of the expected fields; expected {PAIR_SHAPES_HINT}"
    if reason == Reason.NOT_A_PAIR:
        return (
            f"the record is a conversation ({SHAPES[code].name}), and preference tuning (objective dpo) trains on "
            'pairs: a "chosen" and a "rejected" answer to one prompt. Train on conversations with objective sft'
        )
    shape = SHAPES[code]
    missing = [shape.key(name) for name in shape.required if record.get(name) is None]
    if reason == Reason.MISSING_FIELD and missing:
        needs = ", ".join(f"'{shape.key(name)}'" for name in shape.required)
        return f"field '{missing[0]}' is missing or null (a preference pair needs {needs})"
    if reason == Reason.BLANK_FIELD and not shape.holds_lists:
        blank = next(name for name in shape.required if not str(record.get(name) or "").strip())
        return f"field '{blank}' is blank"
    chosen, rejected = (messages or [] for messages in sides)
    if reason == Reason.IDENTICAL_SIDES:
        return "the chosen and the rejected answer are the same; a pair must prefer one answer over another"
    if reason == Reason.SIDES_PART_BEFORE_THE_ANSWER:
        return _describe_parting(chosen, rejected, shared)
    return f"the {_SIDES[side]} conversation: " + describe_conversation(reason, sides[side] or [], shape)


def _describe_parting(chosen: list[dict | None], rejected: list[dict | None], shared: int) -> str:
    rule = "Both must share the prompt, ending with the user's turn, and differ only in the assistant's answer after it"
    roles = [[(message or {}).get("role") for message in side] for side in (chosen, rejected)]
    if shared == 0 or roles[0][shared - 1] != "user":
        where = (
            "at their first message" if shared == 0 else f"after message {shared} (the {roles[0][shared - 1]}'s turn)"
        )
        return (
            f"the chosen and the rejected conversation part {where}: chosen has {_excerpt(chosen, shared)}, rejected "
            f"has {_excerpt(rejected, shared)}. {rule}"
        )
    span = f"messages 1 to {shared}" if shared > 1 else "message 1"
    # Each side ends with the assistant's turn (checked before), so after a prompt ending with the user's turn each
    # has an answer: one side's holds another speaker's turn.
    for name, side, side_roles in zip(_SIDES, (chosen, rejected), roles):
        later = next((index for index in range(shared, len(side)) if side_roles[index] != "assistant"), None)
        if later is not None:
            return (
                f"after the prompt ({span}) the {name} conversation has {_excerpt(side, later)} "
                f"(message {later + 1}). {rule}; put earlier turns in the prompt of both"
            )
    return rule


def _excerpt(messages: list[dict | None], index: int) -> str:
    if index >= len(messages):
        return "nothing (it ends there)"
    text = json.dumps(messages[index], ensure_ascii=False)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."
