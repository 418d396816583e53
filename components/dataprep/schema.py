"""Record shapes we accept, the Arrow schemas we parse into and write out, and
the rejection reasons reported in rejects.jsonl and stats.json."""

from __future__ import annotations

import enum

import pyarrow as pa

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
MESSAGES_TYPE = pa.list_(MESSAGE_TYPE)

# Plain string fields of the flat record shapes, in the order they are checked.
STRING_FIELDS = ("topic", "question", "answer", "instruction", "input", "output", "prompt", "completion")

# Everything the parser keeps from a record; other keys are ignored.
RAW_SCHEMA = pa.schema([(name, pa.string()) for name in STRING_FIELDS] + [("messages", MESSAGES_TYPE)])

# What train.parquet and eval.parquet hold. ``id`` is the content hash that also
# drives deduplication and the split, so later stages can refer to a row by it.
OUTPUT_SCHEMA = pa.schema([("id", pa.int64()), ("messages", MESSAGES_TYPE)])

ROLES = ("system", "user", "assistant")


class Shape(enum.IntEnum):
    """Accepted record shapes, in priority order when a record has several."""

    MESSAGES = 0
    TOPIC_QUESTION_ANSWER = 1
    INSTRUCTION_INPUT_OUTPUT = 2
    PROMPT_COMPLETION = 3


# Required fields per flat shape; ``input`` is optional for instruction records.
REQUIRED_FIELDS = {
    Shape.TOPIC_QUESTION_ANSWER: ("topic", "question", "answer"),
    Shape.INSTRUCTION_INPUT_OUTPUT: ("instruction", "output"),
    Shape.PROMPT_COMPLETION: ("prompt", "completion"),
}
SHAPE_MARKERS = {
    Shape.TOPIC_QUESTION_ANSWER: ("topic", "question", "answer"),
    Shape.INSTRUCTION_INPUT_OUTPUT: ("instruction", "input", "output"),
    Shape.PROMPT_COMPLETION: ("prompt", "completion"),
}


class Reason(enum.IntEnum):
    """Why a record was rejected. 0 means accepted."""

    OK = 0
    INVALID_UTF8 = 1
    INVALID_JSON = 2
    NOT_AN_OBJECT = 3
    WRONG_TYPE = 4
    UNKNOWN_SHAPE = 5
    MISSING_FIELD = 6
    BLANK_FIELD = 7
    EMPTY_CONVERSATION = 8
    UNKNOWN_ROLE = 9
    NOT_ENDING_WITH_ASSISTANT = 10

    @property
    def label(self) -> str:
        return self.name.lower()


ACCEPTED_SHAPES_HINT = (
    'one of {"topic", "question", "answer"}, {"instruction", "input", "output"}, '
    '{"prompt", "completion"} or {"messages": [{"role", "content"}, ...]}'
)
