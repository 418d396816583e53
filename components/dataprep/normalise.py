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

from components.dataprep.schema import (
    ACCEPTED_SHAPES_HINT,
    CONVERSATION_SHAPES,
    CONVERSATIONAL_KEYS,
    MESSAGE_TYPE,
    MESSAGES_TYPE,
    REQUIRED_FIELDS,
    ROLES,
    SHAPE_MARKERS,
    SHAREGPT_ROLES,
    Reason,
    Shape,
)

# Separators for the content key that deduplication, the split and the
# fingerprint hash. Control characters keep role, content, message and row
# boundaries unambiguous for any realistic text.
_FIELD_SEP, _MESSAGE_SEP, _ROW_END = "\x1f", "\x1e", "\x1d"
_NO_SHAPE = -1
_PROMPT_COMPLETION_LISTS = CONVERSATION_SHAPES[Shape.PROMPT_COMPLETION_MESSAGES]
# The optional field of a flat shape that, when not blank, joins the user's turn.
OPTIONAL_FIELDS = {
    Shape.QUESTION_ANSWER: "topic",
    Shape.INSTRUCTION_INPUT_OUTPUT: "input",
    Shape.INSTRUCTION_CONTEXT_RESPONSE: "context",
}


@dataclass
class Normalised:
    """Accepted rows of one chunk, in input order."""

    rows: np.ndarray  # index of each accepted row in the parsed table
    shapes: np.ndarray  # Shape of each accepted row
    messages: pa.ListArray  # the conversation as written to Parquet
    content_keys: pa.StringArray  # canonical content, without the injected system prompt
    conversation_chars: np.ndarray
    response_chars: np.ndarray


@dataclass(frozen=True)
class RowProblem:
    row: int
    reason: Reason
    detail: str


def normalise(table: pa.Table, system_prompt: str) -> tuple[Normalised, list[RowProblem]]:
    """Check every row of ``table`` and build the conversations of the good ones."""
    table = table.combine_chunks()
    columns = {name: _column(table, name) for name in table.column_names}
    valid = {name: _as_bool(pc.is_valid(array)) for name, array in columns.items()}
    shape = _detect_shapes(valid, table.num_rows)
    reason = np.where(shape == _NO_SHAPE, Reason.UNKNOWN_SHAPE, Reason.OK).astype(np.int8)
    columns["messages"] = _unified_conversations(columns, shape)
    _check_flat_fields(columns, valid, shape, reason)
    for name in _PROMPT_COMPLETION_LISTS:  # a conversational record needs both of its lists
        reason[(shape == Shape.PROMPT_COMPLETION_MESSAGES) & ~valid[name] & (reason == Reason.OK)] = (
            Reason.MISSING_FIELD
        )
    _check_conversations(columns["messages"], np.isin(shape, list(CONVERSATION_SHAPES)), reason)

    accepted = np.flatnonzero(reason == Reason.OK)
    problems = []
    for row in np.flatnonzero(reason != Reason.OK).tolist():
        record, code = table.slice(row, 1).to_pylist()[0], Reason(int(reason[row]))
        messages = columns["messages"][row].as_py()
        problems.append(RowProblem(row, code, _describe(code, record, int(shape[row]), messages)))
    conversations = _conversations(columns, shape, accepted)
    flat_roles, flat_contents = _flat_fields(conversations)
    offsets = np.asarray(conversations.offsets)
    content_lengths = np.asarray(pc.utf8_length(flat_contents), dtype=np.int64)
    per_message = np.concatenate([[0], np.cumsum(content_lengths)])
    normalised = Normalised(
        rows=accepted,
        shapes=shape[accepted],
        messages=_with_system_prompt(conversations, system_prompt),
        content_keys=_content_keys(conversations, flat_roles, flat_contents),
        conversation_chars=per_message[offsets[1:]] - per_message[offsets[:-1]],
        response_chars=content_lengths[offsets[1:] - 1] if len(accepted) else np.zeros(0, np.int64),
    )
    return normalised, problems


def _column(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return (
        column.chunk(0)
        if column.num_chunks == 1
        else pa.concat_arrays(column.chunks)
        if column.num_chunks
        else pa.array([], column.type)
    )


def _as_bool(array: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False), dtype=bool)


def _non_blank(array: pa.Array) -> np.ndarray:
    return _as_bool(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(array)), 0))


def _detect_shapes(valid: dict[str, np.ndarray], rows: int) -> np.ndarray:
    """The first shape whose marker fields a row has, in priority order."""
    shape = np.full(rows, _NO_SHAPE, dtype=np.int8)
    for candidate, markers in SHAPE_MARKERS.items():
        present = np.logical_or.reduce([valid[name] for name in markers])
        shape[(shape == _NO_SHAPE) & present] = candidate
    return shape


def _unified_conversations(columns: dict[str, pa.Array], shape: np.ndarray) -> pa.ListArray:
    """Every conversation-shaped row as role/content ``messages`` (null for flat rows), in row order.

    ShareGPT turns get our role names (an unknown speaker keeps its own, which the role check then
    rejects); TRL's conversational prompt and completion become one conversation. From here on the
    three conversation shapes are checked and written alike.
    """
    sharegpt = np.flatnonzero(shape == Shape.SHAREGPT)
    prompt_completion = np.flatnonzero(shape == Shape.PROMPT_COMPLETION_MESSAGES)
    if not len(sharegpt) and not len(prompt_completion):
        return columns["messages"]
    others = np.flatnonzero((shape != Shape.SHAREGPT) & (shape != Shape.PROMPT_COMPLETION_MESSAGES))
    parts, order = [pc.take(columns["messages"], pa.array(others))], [others]
    if len(sharegpt):
        parts.append(_from_sharegpt(pc.take(columns["conversations"], pa.array(sharegpt))))
        order.append(sharegpt)
    if len(prompt_completion):
        take = pa.array(prompt_completion)
        prompts, completions = (pc.take(columns[name], take) for name in _PROMPT_COMPLETION_LISTS)
        parts.append(_joined_lists(prompts, completions))
        order.append(prompt_completion)
    return _in_row_order(parts, order)


def _in_row_order(parts: list[pa.ListArray], order: list[np.ndarray]) -> pa.ListArray:
    """The conversations of ``parts`` (of the rows ``order`` holds beside each) as one array, in row order."""
    combined = pa.concat_arrays([part.cast(MESSAGES_TYPE) for part in parts])
    return combined.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


def _from_sharegpt(turns: pa.ListArray) -> pa.ListArray:
    """ShareGPT ``{from, value}`` turns as ``{role, content}`` messages."""
    turns = pc.fill_null(turns, pa.scalar([], turns.type))
    flat = turns.flatten()
    speakers, values = flat.field("from"), flat.field("value")
    known = pc.index_in(speakers, value_set=pa.array(list(SHAREGPT_ROLES)))
    roles = pc.coalesce(pc.take(pa.array(list(SHAREGPT_ROLES.values())), known), speakers)
    messages = pa.StructArray.from_arrays([roles, values], fields=list(MESSAGE_TYPE), mask=flat.is_null())
    offsets = np.asarray(turns.offsets) - turns.offsets[0].as_py()
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), messages)


def _joined_lists(first: pa.ListArray, second: pa.ListArray) -> pa.ListArray:
    """Row by row, the items of ``first`` followed by those of ``second`` (a null list counts as empty)."""
    first, second = (pc.fill_null(part, pa.scalar([], part.type)) for part in (first, second))
    first_offsets, second_offsets = (np.asarray(part.offsets, dtype=np.int64) for part in (first, second))
    first_lengths, second_lengths = np.diff(first_offsets), np.diff(second_offsets)
    first_values, second_values = first.flatten(), second.flatten()
    offsets = np.concatenate([[0], np.cumsum(first_lengths + second_lengths)])
    row = np.repeat(np.arange(len(first)), first_lengths + second_lengths)
    position = np.arange(offsets[-1]) - offsets[row]
    in_first = position < first_lengths[row]
    index = np.where(
        in_first,
        first_offsets[row] - first_offsets[0] + position,
        len(first_values) + second_offsets[row] - second_offsets[0] + position - first_lengths[row],
    )
    values = pc.take(pa.concat_arrays([first_values, second_values]), pa.array(index))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def _check_flat_fields(
    columns: dict[str, pa.Array], valid: dict[str, np.ndarray], shape: np.ndarray, reason: np.ndarray
) -> None:
    for candidate, required in REQUIRED_FIELDS.items():
        in_shape = shape == candidate
        if not in_shape.any():
            continue
        for name in required:
            reason[in_shape & ~valid[name] & (reason == Reason.OK)] = Reason.MISSING_FIELD
            blank = in_shape & valid[name] & ~_non_blank(columns[name])
            reason[blank & (reason == Reason.OK)] = Reason.BLANK_FIELD


def _check_conversations(messages: pa.ListArray, is_conversation: np.ndarray, reason: np.ndarray) -> None:
    if not is_conversation.any():
        return
    lengths = np.asarray(pc.fill_null(pc.list_value_length(messages), 0))
    reason[is_conversation & (lengths == 0) & (reason == Reason.OK)] = Reason.EMPTY_CONVERSATION
    parents = np.asarray(pc.list_parent_indices(messages))
    roles, contents = _flat_fields(messages)
    role_ok = _as_bool(pc.is_valid(roles))
    content_ok = _as_bool(pc.is_valid(contents))
    per_message_checks = (
        (Reason.MISSING_FIELD, ~(role_ok & content_ok)),
        (Reason.UNKNOWN_ROLE, ~_as_bool(pc.is_in(roles, value_set=pa.array(ROLES)))),
        (Reason.BLANK_FIELD, ~_non_blank(contents)),
    )
    for code, bad in per_message_checks:
        bad_rows = np.bincount(parents[bad], minlength=len(reason)) > 0
        reason[bad_rows & (reason == Reason.OK)] = code
    ends = np.asarray(messages.offsets)[1:] - 1
    has_last = is_conversation & (lengths > 0)
    last_roles = pc.take(roles, pa.array(ends[has_last]))
    ends_with_assistant = np.zeros(len(reason), dtype=bool)
    ends_with_assistant[has_last] = _as_bool(pc.equal(last_roles, "assistant"))
    reason[has_last & ~ends_with_assistant & (reason == Reason.OK)] = Reason.NOT_ENDING_WITH_ASSISTANT


def _flat_fields(messages: pa.ListArray) -> tuple[pa.Array, pa.Array]:
    """Role and content of every message in ``messages``, flattened."""
    flat = messages.flatten()
    if flat.type != MESSAGE_TYPE:
        flat = flat.cast(MESSAGE_TYPE)
    roles, contents = flat.flatten()
    return roles, contents


def _conversations(columns: dict[str, pa.Array], shape: np.ndarray, accepted: np.ndarray) -> pa.ListArray:
    """The accepted rows as conversations, in input order, before any system prompt."""
    accepted_shapes = shape[accepted]
    parts: list[pa.ListArray] = []
    order: list[np.ndarray] = []
    for candidate in Shape:
        rows = accepted[accepted_shapes == candidate]
        if not len(rows):
            continue
        take = pa.array(rows)
        if candidate in CONVERSATION_SHAPES:
            parts.append(pc.take(columns["messages"], take))
        else:
            names = REQUIRED_FIELDS[candidate] + ((OPTIONAL_FIELDS[candidate],) if candidate in OPTIONAL_FIELDS else ())
            user, assistant = _turns(candidate, {name: pc.take(columns[name], take) for name in names})
            parts.append(_user_assistant_lists(user, assistant))
        order.append(rows)
    if not parts:
        return pa.array([], MESSAGES_TYPE)
    return _in_row_order(parts, order)


def _turns(shape: Shape, fields: dict[str, pa.Array]) -> tuple[pa.Array, pa.Array]:
    """User and assistant text of a flat record shape."""
    if shape == Shape.QUESTION_ANSWER:
        has_topic = pa.array(_non_blank(fields["topic"]))
        with_topic = pc.binary_join_element_wise("For ", fields["topic"], ", ", fields["question"], "")
        return pc.if_else(has_topic, with_topic, fields["question"]), fields["answer"]
    if shape in (Shape.INSTRUCTION_INPUT_OUTPUT, Shape.INSTRUCTION_CONTEXT_RESPONSE):
        extra = fields[OPTIONAL_FIELDS[shape]]
        joined = pc.binary_join_element_wise(fields["instruction"], extra, "\n\n")
        answer = fields["output" if shape == Shape.INSTRUCTION_INPUT_OUTPUT else "response"]
        return pc.if_else(pa.array(_non_blank(extra)), joined, fields["instruction"]), answer
    return fields["prompt"], fields["completion"]


def _user_assistant_lists(user: pa.Array, assistant: pa.Array) -> pa.ListArray:
    count = len(user)
    interleave = np.stack([np.arange(count), np.arange(count) + count], axis=1).ravel()
    contents = pc.take(pa.concat_arrays([user.cast(pa.string()), assistant.cast(pa.string())]), pa.array(interleave))
    roles = pc.take(pa.array(["user", "assistant"]), pa.array(np.tile([0, 1], count)))
    values = pa.StructArray.from_arrays([roles, contents], fields=list(MESSAGE_TYPE))
    return pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * count + 1, 2, dtype=np.int32)), values)


def _with_system_prompt(conversations: pa.ListArray, system_prompt: str) -> pa.ListArray:
    """Prepend ``system_prompt`` to conversations that do not start with a system turn."""
    if not system_prompt or not len(conversations):
        return conversations
    roles, _ = _flat_fields(conversations)
    offsets = np.asarray(conversations.offsets)
    first_roles = pc.take(roles, pa.array(offsets[:-1]))
    needs = ~_as_bool(pc.equal(first_roles, "system"))
    inserted_before = np.cumsum(needs)  # system turns inserted up to and including each row
    flat = conversations.flatten()
    new_offsets = offsets + np.concatenate([[0], inserted_before])
    take = np.full(new_offsets[-1], len(flat), dtype=np.int64)  # default: the system message
    parents = np.asarray(pc.list_parent_indices(conversations))
    take[np.arange(len(flat)) + inserted_before[parents]] = np.arange(len(flat))
    system = pa.StructArray.from_arrays([pa.array(["system"]), pa.array([system_prompt])], fields=list(MESSAGE_TYPE))
    values = pc.take(pa.concat_arrays([flat, system]), pa.array(take))
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values)


def _content_keys(conversations: pa.ListArray, roles: pa.Array, contents: pa.Array) -> pa.StringArray:
    """One canonical string per conversation: what deduplication and the split hash."""
    if not len(conversations):
        return pa.array([], pa.string())
    turns = pc.binary_join_element_wise(roles, contents, _FIELD_SEP)
    per_row = pa.ListArray.from_arrays(conversations.offsets, turns)
    joined = pc.binary_join(per_row, _MESSAGE_SEP)
    return pc.binary_join_element_wise(joined, _ROW_END, "")


def _describe(reason: Reason, record: dict, shape: int, messages: list[dict | None] | None) -> str:
    """A precise, human explanation for one rejected row (``messages``: its turns as role/content)."""
    if reason == Reason.UNKNOWN_SHAPE:
        return f"the record has none of the expected fields; expected {ACCEPTED_SHAPES_HINT}"
    if shape == Shape.PROMPT_COMPLETION_MESSAGES and reason == Reason.MISSING_FIELD:
        for name in _PROMPT_COMPLETION_LISTS:
            if record.get(name) is None:
                return (
                    f"field '{CONVERSATIONAL_KEYS[name]}' is missing or null (a conversational record needs a prompt "
                    "and a completion list)"
                )
    if shape in CONVERSATION_SHAPES:
        return _describe_conversation(reason, messages or [], sharegpt=shape == Shape.SHAREGPT)
    required = REQUIRED_FIELDS[Shape(shape)]
    for name in required:
        value = record.get(name)
        if value is None and reason == Reason.MISSING_FIELD:
            return f"field '{name}' is missing or null (required: {', '.join(required)})"
        if value is not None and not value.strip() and reason == Reason.BLANK_FIELD:
            return f"field '{name}' is blank"
    return reason.label.replace("_", " ")


def _describe_conversation(reason: Reason, messages: list[dict | None], sharegpt: bool) -> str:
    turn, role_key, content_key = ("turn", "from", "value") if sharegpt else ("message", "role", "content")
    if reason == Reason.EMPTY_CONVERSATION:
        field = "conversations" if sharegpt else "messages"
        return f"'{field}' is an empty list; it needs at least a user and an assistant turn"
    for index, message in enumerate(messages, start=1):
        message = message or {}
        role, content = message.get("role"), message.get("content")
        if reason == Reason.MISSING_FIELD and (role is None or content is None):
            return f"{turn} {index} has no '{role_key if role is None else content_key}'"
        if reason == Reason.UNKNOWN_ROLE and role not in ROLES:
            if sharegpt:
                return (
                    f"turn {index} has from {json.dumps(role)}; ShareGPT speakers must be human, gpt or system "
                    "(user and assistant are accepted too)"
                )
            return f"message {index} has role {json.dumps(role)}; roles must be system, user or assistant"
        if reason == Reason.BLANK_FIELD and content is not None and not content.strip():
            return f"{turn} {index} ({role}) has blank {content_key}"
    if reason == Reason.NOT_ENDING_WITH_ASSISTANT:
        last = (messages[-1] or {}).get("role")
        return f"the conversation ends with a {json.dumps(last)} turn; the last {turn} must be the assistant's answer"
    return reason.label.replace("_", " ")
