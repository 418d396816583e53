"""Parse a chunk of JSONL into an Arrow table of raw fields, one row per record.

The fast path hands the whole chunk to pyarrow's multithreaded JSON reader with
a fixed schema. pyarrow rejects a chunk as a whole when any line is malformed
(bad JSON, a number where a string belongs), and it silently skips blank lines,
so we fall back to an exact line-by-line parse whenever the chunk fails or its
row count does not match its number of non-blank lines. pyarrow does not check
UTF-8, reads ``{...} {...}`` on one line as two rows, and crashes (SIGSEGV) on a
top-level ``null``, so a chunk only takes the fast path when it is valid UTF-8
and every non-blank line starts with ``{``. Clean data stays on the fast path;
bad lines still get an exact file and line number.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from components.dataprep.chunks import Chunk
from components.dataprep.schema import RAW_SCHEMA, STRING_FIELDS, Reason

_READ_OPTIONS = pajson.ReadOptions(use_threads=True, block_size=4 << 20)
_PARSE_OPTIONS = pajson.ParseOptions(explicit_schema=RAW_SCHEMA, unexpected_field_behavior="ignore")
EXCERPT_CHARS = 300


@dataclass(frozen=True)
class Reject:
    """One rejected record, as written to rejects.jsonl."""

    source: str
    line: int
    reason: Reason
    detail: str
    excerpt: str

    def as_json(self) -> str:
        return json.dumps(
            {
                "source": self.source,
                "line": self.line,
                "reason": self.reason.label,
                "detail": self.detail,
                "record": self.excerpt,
            },
            ensure_ascii=False,
        )


@dataclass
class ParsedChunk:
    """Rows that parsed into ``RAW_SCHEMA`` plus the lines that could not."""

    table: pa.Table
    lines: np.ndarray  # 1-based line number of each table row
    rejects: list[Reject] = field(default_factory=list)
    blank_lines: int = 0

    def batches(self) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """The rows in pyarrow's own record batches (a few MiB each), with their line numbers.

        Validating batch by batch keeps the temporary arrays small.
        """
        start = 0
        for batch in self.table.to_batches():
            yield pa.Table.from_batches([batch]), self.lines[start : start + batch.num_rows]
            start += batch.num_rows


def excerpt(raw: bytes | str) -> str:
    """A short, printable prefix of a record for rejects.jsonl."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"


def parse_chunk(chunk: Chunk) -> ParsedChunk:
    """Parse ``chunk``, on pyarrow's fast path when the chunk allows it."""
    expected = _object_lines(chunk)
    if expected is None or not _is_utf8(chunk.data):
        return _parse_lines(chunk)
    numbers, blank = expected
    try:
        table = pajson.read_json(io.BytesIO(chunk.data), read_options=_READ_OPTIONS, parse_options=_PARSE_OPTIONS)
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return _parse_lines(chunk)
    if table.num_rows != len(numbers):  # e.g. two objects on one line
        return _parse_lines(chunk)
    return ParsedChunk(table, numbers, blank_lines=blank)


def _object_lines(chunk: Chunk) -> tuple[np.ndarray, int] | None:
    """Line numbers of the non-blank lines and the blank-line count, or None
    when a non-blank line does not start with ``{`` (it cannot be a record, and a
    top-level ``null`` would crash pyarrow).

    Only the first byte of each line is looked at in bulk; the rare lines that do
    not start with ``{`` (blank, indented or not objects) are checked one by one.
    """
    data = chunk.data
    bytes_ = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate([[0], np.flatnonzero(bytes_ == ord("\n")) + 1])[: chunk.line_count]
    blank = []
    for index in np.flatnonzero(bytes_[starts] != ord("{")).tolist():
        start = int(starts[index])
        end = data.find(b"\n", start)
        stripped = data[start : end if end >= 0 else len(data)].strip()
        if stripped:
            if not stripped.startswith(b"{"):
                return None
        else:
            blank.append(index)
    keep = np.ones(chunk.line_count, dtype=bool)
    keep[blank] = False
    return chunk.first_line + np.flatnonzero(keep).astype(np.int64), len(blank)


def _is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 (Arrow's vectorised check, no copy)."""
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    try:
        pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)]).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def split_lines(data: bytes) -> list[bytes]:
    """The lines of a chunk without their newlines; a final newline ends the last line, it does not start a new one."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return lines


def _parse_lines(chunk: Chunk) -> ParsedChunk:
    """Exact per-line parse: every bad line becomes a ``Reject`` with its line number."""
    rows: list[dict] = []
    numbers: list[int] = []
    rejects: list[Reject] = []
    blank = 0
    for offset, raw in enumerate(split_lines(chunk.data)):
        if not raw.strip():
            blank += 1
            continue
        line = chunk.first_line + offset
        problem = None
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            problem = (
                Reason.INVALID_UTF8,
                f"byte {error.start + 1} of the line is not valid UTF-8; save the file as UTF-8",
            )
        except json.JSONDecodeError as error:
            problem = (Reason.INVALID_JSON, f"invalid JSON at column {error.colno}: {error.msg}")
        else:
            if not isinstance(record, dict):
                problem = (Reason.NOT_AN_OBJECT, f"the line holds a JSON {_json_type(record)}, not an object")
            else:
                type_problem = _type_problem(record)
                if type_problem:
                    problem = (Reason.WRONG_TYPE, type_problem)
                elif b"\\u" in raw and _has_lone_surrogate(record):
                    problem = (Reason.INVALID_JSON, "a \\u escape is an unpaired surrogate, which is not valid Unicode")
        if problem:
            rejects.append(Reject(chunk.source, line, problem[0], problem[1], excerpt(raw)))
            continue
        rows.append({name: record.get(name) for name in RAW_SCHEMA.names})
        numbers.append(line)
    table = pa.Table.from_pylist(rows, schema=RAW_SCHEMA)
    return ParsedChunk(table, np.asarray(numbers, dtype=np.int64), rejects, blank)


def _has_lone_surrogate(record: dict) -> bool:
    """Whether a kept string holds an unpaired surrogate (json.loads allows them; UTF-8 and Arrow do not)."""
    values = [record.get(name) for name in STRING_FIELDS]
    for message in record.get("messages") or ():
        if message is not None:
            values += [message.get("role"), message.get("content")]
    for value in values:
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _type_problem(record: dict) -> str | None:
    """Describe the first field whose JSON type is wrong, or None."""
    for name in STRING_FIELDS:
        value = record.get(name)
        if value is not None and not isinstance(value, str):
            return f"field '{name}' is a JSON {_json_type(value)}; it must be a string"
    messages = record.get("messages")
    if messages is None:
        return None
    if not isinstance(messages, list):
        return f"field 'messages' is a JSON {_json_type(messages)}; it must be a list of {{role, content}} objects"
    for index, message in enumerate(messages, start=1):
        if message is None:
            continue  # a null message lacks role and content: missing_field, as on the fast path
        if not isinstance(message, dict):
            return f"message {index} is a JSON {_json_type(message)}; it must be an object with 'role' and 'content'"
        for key in ("role", "content"):
            value = message.get(key)
            if value is not None and not isinstance(value, str):
                return f"message {index} has a JSON {_json_type(value)} as '{key}'; it must be a string"
    return None


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"
