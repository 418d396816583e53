"""Validate parsed rows and turn every accepted shape into chat ``messages``.

All checks and rewrites are vectorised over a whole chunk with pyarrow compute
and numpy; only the (rare) rejected rows are looked at one by one, to write a
precise explanation of what is wrong with them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.data.arrays import as_bool, non_blank
from components.data.schema import MESSAGE_TYPE, MESSAGES_TYPE, ROLES, Reason
from components.data.shapes import CONVERSATION_SHAPES_HINT, SHAPES, RecordShape, user_assistant_lists

# Separators for the content key that deduplication, the split and the
# fingerprint hash. Control characters keep role, content, message and row
# boundaries unambiguous for any realistic text.
_FIELD_SEP, _MESSAGE_SEP, _ROW_END = "\x1f", "\x1e", "\x1d"
_NO_SHAPE = -1
_CONVERSATION_SHAPES = [code for code, shape in enumerate(SHAPES) if shape.is_conversation]
_PAIR_SHAPES = [code for code, shape in enumerate(SHAPES) if shape.is_pair]


@dataclass
class Normalised:
    """Accepted rows of one chunk, in input order."""

    rows: np.ndarray  # index of each accepted row in the parsed table
    shapes: np.ndarray  # each accepted row's shape: its index in SHAPES
    messages: pa.ListArray  # the conversation as written to Parquet
    content_keys: pa.StringArray  # canonical content, without the injected system prompt
    conversation_chars: np.ndarray
    response_chars: np.ndarray

    @property
    def split_keys(self) -> pa.StringArray:
        """What the split is drawn by: the whole conversation."""
        return self.content_keys


@dataclass(frozen=True)
class RowProblem:
    row: int
    reason: Reason
    detail: str


def normalise(table: pa.Table, system_prompt: str) -> tuple[Normalised, list[RowProblem]]:
    """Check every row of ``table`` and build the conversations of the good ones."""
    table = table.combine_chunks()
    columns = {name: column_of(table, name) for name in table.column_names}
    valid = {name: as_bool(pc.is_valid(array)) for name, array in columns.items()}
    shape = conversations_beside_pairs(valid, detect_shapes(valid, table.num_rows))
    reason = np.where(shape == _NO_SHAPE, Reason.UNKNOWN_SHAPE, Reason.OK).astype(np.int8)
    reason[np.isin(shape, _PAIR_SHAPES)] = Reason.PREFERENCE_PAIR
    check_required_fields(columns, valid, shape, reason)
    unified = _unified_conversations(columns, shape)
    check_conversations(unified, np.isin(shape, _CONVERSATION_SHAPES), reason)

    accepted = np.flatnonzero(reason == Reason.OK)
    problems = []
    for row in np.flatnonzero(reason != Reason.OK).tolist():
        record, code = table.slice(row, 1).to_pylist()[0], Reason(int(reason[row]))
        messages = unified[row].as_py()
        problems.append(RowProblem(row, code, _describe(code, record, int(shape[row]), messages)))
    conversations = _conversations(columns, unified, shape, accepted)
    flat_roles, flat_contents = flat_fields(conversations)
    offsets = np.asarray(conversations.offsets)
    content_lengths = np.asarray(pc.utf8_length(flat_contents), dtype=np.int64)
    per_message = np.concatenate([[0], np.cumsum(content_lengths)])
    normalised = Normalised(
        rows=accepted,
        shapes=shape[accepted],
        messages=with_system_prompt(conversations, system_prompt),
        content_keys=content_keys(conversations, flat_roles, flat_contents),
        conversation_chars=per_message[offsets[1:]] - per_message[offsets[:-1]],
        response_chars=content_lengths[offsets[1:] - 1] if len(accepted) else np.zeros(0, np.int64),
    )
    return normalised, problems


def column_of(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return (
        column.chunk(0)
        if column.num_chunks == 1
        else pa.concat_arrays(column.chunks)
        if column.num_chunks
        else pa.array([], column.type)
    )


def detect_shapes(valid: dict[str, np.ndarray], rows: int, pairs: bool = True) -> np.ndarray:
    """Each row's shape (its index in ``SHAPES``): the first whose marker fields the row has any of (of the
    conversation and flat shapes only, without ``pairs``)."""
    shape = np.full(rows, _NO_SHAPE, dtype=np.int8)
    for code, candidate in enumerate(SHAPES):
        if candidate.is_pair and not pairs:
            continue
        present = np.logical_or.reduce([valid[name] for name in candidate.detected_by])
        shape[(shape == _NO_SHAPE) & present] = code
    return shape


def conversations_beside_pairs(valid: dict[str, np.ndarray], shape: np.ndarray) -> np.ndarray:
    """``shape`` with each pair-shaped row that also holds a whole conversation or flat record (every required
    field of the shape it would otherwise be: UltraFeedback's ``messages`` beside its ``chosen`` and ``rejected``)
    read as that record, for objective sft."""
    pairs = np.isin(shape, _PAIR_SHAPES)
    if not pairs.any():
        return shape
    other = detect_shapes(valid, len(shape), pairs=False)
    complete = np.zeros(len(shape), dtype=bool)
    for code, candidate in enumerate(SHAPES):
        if not candidate.is_pair:
            complete |= (other == code) & np.logical_and.reduce([valid[name] for name in candidate.required])
    return np.where(pairs & complete, other, shape)


def fields_of(columns: dict[str, pa.Array], shape: RecordShape, rows: np.ndarray) -> dict[str, pa.Array]:
    """``shape``'s columns at ``rows`` (all of them as they are when ``rows`` is every row)."""
    if len(rows) == len(next(iter(columns.values()))):
        return {name: columns[name] for name in shape.fields}
    take = pa.array(rows)
    return {name: pc.take(columns[name], take) for name in shape.fields}


def _unified_conversations(columns: dict[str, pa.Array], shape: np.ndarray) -> pa.ListArray:
    """Every conversation-shaped row as role/content ``messages`` (null for flat rows), in row order.

    From here on every conversation shape is checked and written alike.
    """
    parts, order = [], []
    for code in _CONVERSATION_SHAPES:
        rows = np.flatnonzero(shape == code)
        if len(rows):
            parts.append(SHAPES[code].messages(fields_of(columns, SHAPES[code], rows)))
            order.append(rows)
    flat = np.flatnonzero(~np.isin(shape, _CONVERSATION_SHAPES))
    if len(flat) or not parts:
        parts.append(pa.nulls(len(flat), MESSAGES_TYPE))
        order.append(flat)
    return in_row_order(parts, order)


def in_row_order(parts: list[pa.ListArray], order: list[np.ndarray]) -> pa.ListArray:
    """The conversations of ``parts`` (of the rows ``order`` holds beside each) as one array, in row order.

    The parts split the rows between them, each part's in ascending order, so a lone part is already in order.
    """
    if len(parts) == 1:
        return parts[0].cast(MESSAGES_TYPE)
    combined = pa.concat_arrays([part.cast(MESSAGES_TYPE) for part in parts])
    return combined.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


def check_required_fields(
    columns: dict[str, pa.Array], valid: dict[str, np.ndarray], shape: np.ndarray, reason: np.ndarray
) -> None:
    """A row lacking a required field of its shape is missing_field; a flat shape's blank one, blank_field."""
    for code, candidate in enumerate(SHAPES):
        in_shape = shape == code
        if not in_shape.any():
            continue
        for name in candidate.required:
            reason[in_shape & ~valid[name] & (reason == Reason.OK)] = Reason.MISSING_FIELD
            if not candidate.holds_lists:
                blank = in_shape & valid[name] & ~non_blank(columns[name])
                reason[blank & (reason == Reason.OK)] = Reason.BLANK_FIELD


def check_conversations(messages: pa.ListArray, is_conversation: np.ndarray, reason: np.ndarray) -> None:
    if not is_conversation.any():
        return
    lengths = np.asarray(pc.fill_null(pc.list_value_length(messages), 0))
    reason[is_conversation & (lengths == 0) & (reason == Reason.OK)] = Reason.EMPTY_CONVERSATION
    parents = np.asarray(pc.list_parent_indices(messages))
    roles, contents = flat_fields(messages)
    role_ok = as_bool(pc.is_valid(roles))
    content_ok = as_bool(pc.is_valid(contents))
    per_message_checks = (
        (Reason.MISSING_FIELD, ~(role_ok & content_ok)),
        (Reason.UNKNOWN_ROLE, ~as_bool(pc.is_in(roles, value_set=pa.array(ROLES)))),
        (Reason.BLANK_FIELD, ~non_blank(contents)),
    )
    for code, bad in per_message_checks:
        bad_rows = np.bincount(parents[bad], minlength=len(reason)) > 0
        reason[bad_rows & (reason == Reason.OK)] = code
    ends = np.asarray(messages.offsets)[1:] - 1
    has_last = is_conversation & (lengths > 0)
    last_roles = pc.take(roles, pa.array(ends[has_last]))
    ends_with_assistant = np.zeros(len(reason), dtype=bool)
    ends_with_assistant[has_last] = as_bool(pc.equal(last_roles, "assistant"))
    reason[has_last & ~ends_with_assistant & (reason == Reason.OK)] = Reason.NOT_ENDING_WITH_ASSISTANT


def flat_fields(messages: pa.ListArray) -> tuple[pa.Array, pa.Array]:
    """Role and content of every message in ``messages``, flattened."""
    flat = messages.flatten()
    if flat.type != MESSAGE_TYPE:
        flat = flat.cast(MESSAGE_TYPE)
    roles, contents = flat.flatten()
    return roles, contents


def _conversations(
    columns: dict[str, pa.Array], unified: pa.ListArray, shape: np.ndarray, accepted: np.ndarray
) -> pa.ListArray:
    """The accepted rows as conversations, in input order, before any system prompt."""
    accepted_shapes = shape[accepted]
    parts: list[pa.ListArray] = []
    order: list[np.ndarray] = []
    for code, candidate in enumerate(SHAPES):
        rows = accepted[accepted_shapes == code]
        if not len(rows):
            continue
        if candidate.is_conversation:
            parts.append(pc.take(unified, pa.array(rows)))
        else:
            parts.append(user_assistant_lists(*candidate.turns(fields_of(columns, candidate, rows))))
        order.append(rows)
    if not parts:
        return pa.array([], MESSAGES_TYPE)
    return in_row_order(parts, order)


def with_system_prompt(conversations: pa.ListArray, system_prompt: str) -> pa.ListArray:
    """Prepend ``system_prompt`` to conversations that do not start with a system turn."""
    if not system_prompt or not len(conversations):
        return conversations
    roles, _ = flat_fields(conversations)
    offsets = np.asarray(conversations.offsets)
    first_roles = pc.take(roles, pa.array(offsets[:-1]))
    needs = ~as_bool(pc.equal(first_roles, "system"))
    inserted_before = np.cumsum(needs)  # system turns inserted up to and including each row
    flat = conversations.flatten()
    new_offsets = offsets + np.concatenate([[0], inserted_before])
    take = np.full(new_offsets[-1], len(flat), dtype=np.int64)  # default: the system message
    parents = np.asarray(pc.list_parent_indices(conversations))
    take[np.arange(len(flat)) + inserted_before[parents]] = np.arange(len(flat))
    system = pa.StructArray.from_arrays([pa.array(["system"]), pa.array([system_prompt])], fields=list(MESSAGE_TYPE))
    values = pc.take(pa.concat_arrays([flat, system]), pa.array(take))
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values)


def content_keys(conversations: pa.ListArray, roles: pa.Array, contents: pa.Array) -> pa.StringArray:
    """One canonical string per conversation: what deduplication and the split hash."""
    if not len(conversations):
        return pa.array([], pa.string())
    turns = pc.binary_join_element_wise(roles, contents, _FIELD_SEP)
    per_row = pa.ListArray.from_arrays(conversations.offsets, turns)
    joined = pc.binary_join(per_row, _MESSAGE_SEP)
    return pc.binary_join_element_wise(joined, _ROW_END, "")


def _describe(reason: Reason, record: dict, code: int, messages: list[dict | None] | None) -> str:
    """A precise, human explanation for one rejected row (``messages``: its turns as role/content)."""
    if reason == Reason.UNKNOWN_SHAPE:
        return f"the record has none of the expected fields; expected {CONVERSATION_SHAPES_HINT}"
    if reason == Reason.PREFERENCE_PAIR:
        return (
            "the record is a preference pair (a chosen and a rejected answer), and supervised fine-tuning (objective "
            "sft) trains on conversations: train on the pairs with objective dpo, or read one side as the "
            'conversation with field_map (for example {"completion": "chosen"} for string pairs, '
            '{"messages": "chosen"} for whole conversations)'
        )
    shape = SHAPES[code]
    missing = [name for name in shape.required if record.get(name) is None]
    if reason == Reason.MISSING_FIELD and missing:
        if shape.is_conversation:
            lists = " and ".join(f"a {shape.key(name)}" for name in shape.required)
            return f"field '{shape.key(missing[0])}' is missing or null (a conversational record needs {lists} list)"
        return f"field '{missing[0]}' is missing or null (required: {', '.join(shape.required)})"
    if shape.is_conversation:
        return describe_conversation(reason, messages or [], shape)
    for name in shape.required:
        value = record.get(name)
        if reason == Reason.BLANK_FIELD and value is not None and not value.strip():
            return f"field '{name}' is blank"
    return reason.label.replace("_", " ")


def describe_conversation(reason: Reason, messages: list[dict | None], shape: RecordShape) -> str:
    turn, (role_key, content_key) = shape.item, shape.item_keys
    if reason == Reason.EMPTY_CONVERSATION:
        keys = " and ".join(f"'{shape.key(name)}'" for name in shape.required)
        empty = "is an empty list" if len(shape.required) == 1 else "are empty lists"
        return f"{keys} {empty}; it needs at least a user and an assistant turn"
    for index, message in enumerate(messages, start=1):
        message = message or {}
        role, content = message.get("role"), message.get("content")
        if reason == Reason.MISSING_FIELD and (role is None or content is None):
            return f"{turn} {index} has no '{role_key if role is None else content_key}'"
        if reason == Reason.UNKNOWN_ROLE and role not in ROLES:
            return f"{turn} {index} has {role_key} {json.dumps(role)}; {shape.roles_hint}"
        if reason == Reason.BLANK_FIELD and content is not None and not content.strip():
            return f"{turn} {index} ({role}) has blank {content_key}"
    if reason == Reason.NOT_ENDING_WITH_ASSISTANT:
        last = (messages[-1] or {}).get("role")
        return f"the conversation ends with a {json.dumps(last)} turn; the last {turn} must be the assistant's answer"
    return reason.label.replace("_", " ")
