"""Record shapes we accept, the Arrow schemas we parse into and write out, and
the rejection reasons reported in rejects.jsonl and stats.json."""

from __future__ import annotations

import enum

import pyarrow as pa

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
MESSAGES_TYPE = pa.list_(MESSAGE_TYPE)

# ShareGPT's turns: {"from": "human" | "gpt" | "system" | ..., "value": text}.
SHAREGPT_TURN_TYPE = pa.struct([("from", pa.string()), ("value", pa.string())])
SHAREGPT_TYPE = pa.list_(SHAREGPT_TURN_TYPE)
# ShareGPT's speakers as our roles; any other "from" is rejected with its line.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}

# Plain string fields of the flat record shapes, in the order they are checked.
STRING_FIELDS = (
    "topic",
    "question",
    "answer",
    "instruction",
    "input",
    "output",
    "context",
    "response",
    "prompt",
    "completion",
)
# The fields a record's JSON can hold under their own names, and so what field_map can map a column onto.
JSON_FIELDS = STRING_FIELDS + ("messages", "conversations")
# TRL's conversational prompt/completion keeps message lists under the keys of the plain prompt/completion.
CONVERSATIONAL_FIELDS = {"prompt": "prompt_messages", "completion": "completion_messages"}
CONVERSATIONAL_KEYS = {raw: key for key, raw in CONVERSATIONAL_FIELDS.items()}  # and back: what the record calls it

# Everything the parser keeps from a record; other keys are ignored.
RAW_SCHEMA = pa.schema(
    [(name, pa.string()) for name in STRING_FIELDS]
    + [("messages", MESSAGES_TYPE), ("conversations", SHAREGPT_TYPE)]
    + [(name, MESSAGES_TYPE) for name in CONVERSATIONAL_FIELDS.values()]
)

# What train.parquet and eval.parquet hold. ``id`` is the content hash that also
# drives deduplication and the split, so later stages can refer to a row by it.
OUTPUT_SCHEMA = pa.schema([("id", pa.int64()), ("messages", MESSAGES_TYPE)])

ROLES = ("system", "user", "assistant")


class Shape(enum.IntEnum):
    """Accepted record shapes."""

    MESSAGES = 0
    SHAREGPT = 1
    PROMPT_COMPLETION_MESSAGES = 2
    QUESTION_ANSWER = 3
    INSTRUCTION_INPUT_OUTPUT = 4
    INSTRUCTION_CONTEXT_RESPONSE = 5
    PROMPT_COMPLETION = 6


# Shapes whose records are conversations (checked turn by turn), and their raw fields.
CONVERSATION_SHAPES = {
    Shape.MESSAGES: ("messages",),
    Shape.SHAREGPT: ("conversations",),
    Shape.PROMPT_COMPLETION_MESSAGES: ("prompt_messages", "completion_messages"),
}
# Required fields per flat shape; topic, input and context are optional.
REQUIRED_FIELDS = {
    Shape.QUESTION_ANSWER: ("question", "answer"),
    Shape.INSTRUCTION_INPUT_OUTPUT: ("instruction", "output"),
    Shape.INSTRUCTION_CONTEXT_RESPONSE: ("instruction", "response"),
    Shape.PROMPT_COMPLETION: ("prompt", "completion"),
}
# A record's shape is the first of these whose fields it has any of. Dolly's context/response come
# before Alpaca's instruction/input/output, since both have an instruction.
SHAPE_MARKERS = {
    **CONVERSATION_SHAPES,
    Shape.QUESTION_ANSWER: ("question", "answer", "topic"),
    Shape.INSTRUCTION_CONTEXT_RESPONSE: ("context", "response"),
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
    'one of {"question", "answer"} (and an optional "topic"), {"instruction", "input", "output"}, '
    '{"instruction", "context", "response"}, {"prompt", "completion"} (strings, or lists of messages), '
    '{"messages": [{"role", "content"}, ...]} or {"conversations": [{"from", "value"}, ...]}; a file with other '
    "column names can be mapped onto one of these with field_map"
)
