"""The Arrow types of a conversation and of the Parquet we write, and the rejection
reasons reported in rejects.jsonl and stats.json. The record shapes we accept are
``components.data.shapes``."""

from __future__ import annotations

import enum

import pyarrow as pa

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
MESSAGES_TYPE = pa.list_(MESSAGE_TYPE)

# What train.parquet and eval.parquet hold. ``id`` is the content hash that also
# drives deduplication and the split, so later stages can refer to a row by it.
OUTPUT_SCHEMA = pa.schema([("id", pa.int64()), ("messages", MESSAGES_TYPE)])

ROLES = ("system", "user", "assistant")


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
