"""The record shapes we accept, each declared once; every table the data stage reads about them is derived here.

A shape is its fields (required, optional), the fields that mark a record as
that shape, and how its records become a conversation. ``SHAPES`` is in
detection order: a record has the first shape whose marker fields it has any
of. From it come the raw columns the parser reads (``RAW_SCHEMA``), the fields
``field_map`` may map (``JSON_FIELDS``), the list fields and their item keys
for the type check (``LIST_FIELDS``) and the accepted-shapes hint of an
``unknown_shape`` reject.

Adding a shape: one ``RecordShape`` in ``SHAPES`` (at the place its markers
should be tried) and its tests in ``tests/test_prepare_shapes.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.data.arrays import joined_lists, non_blank
from components.data.schema import MESSAGE_TYPE

Columns = Mapping[str, pa.Array]  # a shape's fields, for the rows of that shape


@dataclass(frozen=True)
class RecordShape:
    """One accepted record shape: its fields, what marks it, and how it becomes turns, messages or a pair.

    A flat shape's fields are strings and ``turns`` makes its user and assistant
    text. A conversation shape's fields are lists of ``item_keys`` objects and
    ``messages`` makes its role/content messages, checked turn by turn. A
    preference shape's ``pair`` makes the chosen and the rejected conversation,
    each with the prompt (``lists``: its fields are lists of messages).
    """

    name: str  # its key in stats.json's "shapes"
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()  # empty: any of its fields
    turns: Callable[[Columns], tuple[pa.Array, pa.Array]] | None = None
    messages: Callable[[Columns], pa.ListArray] | None = None
    pair: Callable[[Columns], tuple[pa.ListArray, pa.ListArray]] | None = None
    lists: bool = False  # a preference shape whose fields are lists of messages
    record_keys: Mapping[str, str] = field(default_factory=dict)  # field -> the record's key, where they differ
    item_keys: tuple[str, str] = ("role", "content")  # a conversation's item: the speaker's key, the text's key
    item: str = "message"  # what an error calls one item
    roles_hint: str = "roles must be system, user or assistant"

    @property
    def fields(self) -> tuple[str, ...]:
        return self.required + self.optional

    @property
    def detected_by(self) -> tuple[str, ...]:
        return self.markers or self.fields

    @property
    def is_conversation(self) -> bool:
        return self.messages is not None

    @property
    def is_pair(self) -> bool:
        """A preference pair: a prompt, a chosen and a rejected answer."""
        return self.pair is not None

    @property
    def holds_lists(self) -> bool:
        """Its fields are lists of ``item_keys`` objects, not strings."""
        return self.is_conversation or self.lists

    def key(self, name: str) -> str:
        """What a record calls the field ``name``."""
        return self.record_keys.get(name, name)

    @property
    def hint(self) -> str:
        """The shape as the accepted-shapes hint shows it."""
        if self.holds_lists:
            item = "[{" + ", ".join(map(json.dumps, self.item_keys)) + "}, ...]"
            required = "{" + ", ".join(f"{json.dumps(self.key(name))}: {item}" for name in self.required) + "}"
            optional = " or ".join(json.dumps(self.key(name)) for name in self.optional)
            return required + (f" (and an optional {optional} list)" if optional else "")
        required = "{" + ", ".join(map(json.dumps, self.required)) + "}"
        optional = " or ".join(map(json.dumps, self.optional))
        return required + (f" (and an optional {optional})" if optional else "")


def user_assistant_lists(user: pa.Array, assistant: pa.Array) -> pa.ListArray:
    """Row by row, the conversation of one user turn and one assistant turn."""
    count = len(user)
    interleave = np.stack([np.arange(count), np.arange(count) + count], axis=1).ravel()
    contents = pc.take(pa.concat_arrays([user.cast(pa.string()), assistant.cast(pa.string())]), pa.array(interleave))
    roles = pc.take(pa.array(["user", "assistant"]), pa.array(np.tile([0, 1], count)))
    values = pa.StructArray.from_arrays([roles, contents], fields=list(MESSAGE_TYPE))
    return pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * count + 1, 2, dtype=np.int32)), values)


def _question_answer(fields: Columns) -> tuple[pa.Array, pa.Array]:
    with_topic = pc.binary_join_element_wise("For ", fields["topic"], ", ", fields["question"], "")
    return pc.if_else(pa.array(non_blank(fields["topic"])), with_topic, fields["question"]), fields["answer"]


def _instruction_with(extra: str, answer: str) -> Callable[[Columns], tuple[pa.Array, pa.Array]]:
    """Turns of an instruction shape: the instruction, then ``extra`` when not blank; the answer in ``answer``."""

    def turns(fields: Columns) -> tuple[pa.Array, pa.Array]:
        joined = pc.binary_join_element_wise(fields["instruction"], fields[extra], "\n\n")
        return pc.if_else(pa.array(non_blank(fields[extra])), joined, fields["instruction"]), fields[answer]

    return turns


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


SHAREGPT_KEYS = ("from", "value")  # a ShareGPT turn's speaker and text


def _from_sharegpt(fields: Columns) -> pa.ListArray:
    """ShareGPT ``{from, value}`` turns as ``{role, content}`` messages (an unknown speaker keeps its name, which
    the role check then rejects)."""
    turns = fields["conversations"]
    turns = pc.fill_null(turns, pa.scalar([], turns.type))
    flat = turns.flatten()
    speakers, values = (flat.field(key) for key in SHAREGPT_KEYS)
    known = pc.index_in(speakers, value_set=pa.array(list(SHAREGPT_ROLES)))
    roles = pc.coalesce(pc.take(pa.array(list(SHAREGPT_ROLES.values())), known), speakers)
    messages = pa.StructArray.from_arrays([roles, values], fields=list(MESSAGE_TYPE), mask=flat.is_null())
    offsets = np.asarray(turns.offsets) - turns.offsets[0].as_py()
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), messages)


def _pair_of_strings(fields: Columns) -> tuple[pa.ListArray, pa.ListArray]:
    return (
        user_assistant_lists(fields["prompt"], fields["chosen"]),
        user_assistant_lists(fields["prompt"], fields["rejected"]),
    )


def _pair_of_lists(fields: Columns) -> tuple[pa.ListArray, pa.ListArray]:
    """TRL's conversational preference (a prompt list, the answers as assistant messages) and whole chosen and
    rejected conversations without a prompt (UltraFeedback binarized) alike: the prompt, if any, then each side.
    Where the two conversations part is found later, the same way for both."""
    prompt = fields["prompt_messages"]
    return joined_lists(prompt, fields["chosen_messages"]), joined_lists(prompt, fields["rejected_messages"])


SHAPES: tuple[RecordShape, ...] = (
    # Preference pairs first: a record with a chosen and a rejected answer is one, whatever else it holds
    # (UltraFeedback's rows also hold the chosen conversation as messages).
    RecordShape(
        "preference_messages",
        ("chosen_messages", "rejected_messages"),
        ("prompt_messages",),
        markers=("chosen_messages", "rejected_messages"),
        pair=_pair_of_lists,
        lists=True,
        record_keys={"prompt_messages": "prompt", "chosen_messages": "chosen", "rejected_messages": "rejected"},
    ),
    RecordShape("preference", ("prompt", "chosen", "rejected"), markers=("chosen", "rejected"), pair=_pair_of_strings),
    RecordShape("messages", ("messages",), messages=lambda fields: fields["messages"]),
    RecordShape(
        "sharegpt",
        ("conversations",),
        messages=_from_sharegpt,
        item_keys=SHAREGPT_KEYS,
        item="turn",
        roles_hint="ShareGPT speakers must be human, gpt or system (user and assistant are accepted too)",
    ),
    # TRL's conversational prompt/completion: message lists under the keys of the plain prompt/completion.
    RecordShape(
        "prompt_completion_messages",
        ("prompt_messages", "completion_messages"),
        messages=lambda fields: joined_lists(fields["prompt_messages"], fields["completion_messages"]),
        record_keys={"prompt_messages": "prompt", "completion_messages": "completion"},
    ),
    RecordShape("question_answer", ("question", "answer"), ("topic",), turns=_question_answer),
    # Dolly's context/response mark it before Alpaca's instruction/input/output: both have an instruction.
    RecordShape(
        "instruction_context_response",
        ("instruction", "response"),
        ("context",),
        markers=("context", "response"),
        turns=_instruction_with("context", "response"),
    ),
    RecordShape(
        "instruction_input_output", ("instruction", "output"), ("input",), turns=_instruction_with("input", "output")
    ),
    RecordShape(
        "prompt_completion", ("prompt", "completion"), turns=lambda fields: (fields["prompt"], fields["completion"])
    ),
)


@dataclass(frozen=True)
class ListField:
    """A raw column holding a list of turns: the record's key for it and its items' keys, for the type check."""

    key: str
    item_keys: tuple[str, str]
    item: str


def _unique(names) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


STRING_FIELDS = _unique(name for shape in SHAPES if not shape.holds_lists for name in shape.fields)
LIST_FIELDS = {
    name: ListField(shape.key(name), shape.item_keys, shape.item)
    for shape in SHAPES
    if shape.holds_lists
    for name in shape.fields
}
# The keys a record can hold, and so what field_map can map a column onto.
JSON_FIELDS = _unique([*STRING_FIELDS, *(list_field.key for list_field in LIST_FIELDS.values())])
# A list field under a string field's key (TRL's conversational prompt/completion): the record's key -> the column.
CONVERSATIONAL_FIELDS = {spec.key: name for name, spec in LIST_FIELDS.items() if spec.key in STRING_FIELDS}
CONVERSATIONAL_KEYS = {name: key for key, name in CONVERSATIONAL_FIELDS.items()}

# Everything the parser keeps from a record; other keys are ignored.
RAW_SCHEMA = pa.schema(
    [(name, pa.string()) for name in STRING_FIELDS]
    + [
        (name, pa.list_(pa.struct([(key, pa.string()) for key in spec.item_keys])))
        for name, spec in LIST_FIELDS.items()
    ]
)


def accepted_shapes_hint(pairs: bool) -> str:
    """The shapes an objective's records may take, for a record of none: preference pairs (objective dpo) or
    conversations (sft)."""
    return (
        "one of "
        + ", ".join(shape.hint for shape in SHAPES if (shape.pair is not None) == pairs)
        + "; a file with other column names can be mapped onto one of these with field_map"
    )


CONVERSATION_SHAPES_HINT = accepted_shapes_hint(pairs=False)
PAIR_SHAPES_HINT = accepted_shapes_hint(pairs=True)
