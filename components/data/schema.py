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
# The same for preference pairs, in TRL's conversational preference form: the prompt's messages (ending with the
# user's turn), then each answer's (assistant) messages.
PAIR_SCHEMA = pa.schema(
    [("id", pa.int64()), ("prompt", MESSAGES_TYPE), ("chosen", MESSAGES_TYPE), ("rejected", MESSAGES_TYPE)]
)

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
    PREFERENCE_PAIR = 11  # a chosen/rejected pair where conversations are trained on
    NOT_A_PAIR = 12  # a conversation where preference pairs are trained on
    IDENTICAL_SIDES = 13  # the chosen answer is the rejected one
    SIDES_PART_BEFORE_THE_ANSWER = 14  # chosen and rejected do not share one prompt followed by their answers

    @property
    def label(self) -> str:
        return self.name.lower()
