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

TRL's conversational prompt/completion puts message lists where the plain shape
has strings, so a chunk whose fast parse fails is tried once more with those
keys read as lists before falling back. ``field_map`` renames columns on both
paths: the parsed table always has our field names (``RAW_SCHEMA``).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from components.data.chunks import Chunk
from components.data.field_map import FieldMap
from components.data.schema import Reason
from components.data.shapes import (
    CONVERSATIONAL_FIELDS,
    CONVERSATIONAL_KEYS,
    JSON_FIELDS,
    LIST_FIELDS,
    RAW_SCHEMA,
    STRING_FIELDS,
)

_READ_OPTIONS = pajson.ReadOptions(use_threads=True, block_size=4 << 20)
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
    mapped_columns_seen: frozenset[str] = frozenset()  # field_map columns some record of the chunk has

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


def parse_chunk(chunk: Chunk, fields: FieldMap = FieldMap()) -> ParsedChunk:
    """Parse ``chunk``, on pyarrow's fast path when the chunk allows it."""
    expected = _object_lines(chunk)
    if expected is None or not _is_utf8(chunk.data):
        return _parse_lines(chunk, fields)
    numbers, blank = expected
    for conversational in (False, True):
        try:
            read = pajson.read_json(
                io.BytesIO(chunk.data), read_options=_READ_OPTIONS, parse_options=_parse_options(fields, conversational)
            )
        except (pa.ArrowInvalid, UnicodeDecodeError):
            continue
        if read.num_rows != len(numbers):  # e.g. two objects on one line
            break
        seen = frozenset(column for column in fields.mapped_columns if read.column(column).null_count < read.num_rows)
        return ParsedChunk(
            _raw_table(read, fields, conversational), numbers, blank_lines=blank, mapped_columns_seen=seen
        )
    return _parse_lines(chunk, fields)


def _source(name: str, fields: FieldMap, conversational: bool) -> str | None:
    """The file's column read into the raw field ``name``, with prompt/completion read as lists or strings."""
    if name in CONVERSATIONAL_KEYS:
        return fields.column(CONVERSATIONAL_KEYS[name]) if conversational else None
    if name in CONVERSATIONAL_FIELDS and conversational:
        return None
    return fields.column(name)


def _parse_options(fields: FieldMap, conversational: bool) -> pajson.ParseOptions:
    schema = pa.schema(
        [
            (_source(name, fields, conversational), RAW_SCHEMA.field(name).type)
            for name in RAW_SCHEMA.names
            if _source(name, fields, conversational)
        ]
    )
    return pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")


def _raw_table(read: pa.Table, fields: FieldMap, conversational: bool) -> pa.Table:
    """``read`` (the file's column names) as ``RAW_SCHEMA`` (ours), with the fields it lacks null."""
    columns = []
    for raw in RAW_SCHEMA:
        source = _source(raw.name, fields, conversational)
        columns.append(read.column(source) if source else pa.chunked_array([pa.nulls(read.num_rows, raw.type)]))
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


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


def _parse_lines(chunk: Chunk, fields: FieldMap) -> ParsedChunk:
    """Exact per-line parse: every bad line becomes a ``Reject`` with its line number."""
    rows: list[dict] = []
    numbers: list[int] = []
    rejects: list[Reject] = []
    seen: set[str] = set()
    blank = 0
    for offset, raw in enumerate(split_lines(chunk.data)):
        if not raw.strip():
            blank += 1
            continue
        line = chunk.first_line + offset
        problem = None
        row: dict = {}
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
                seen.update(column for column in fields.mapped_columns if record.get(column) is not None)
                row = _raw_row(record, fields)
                type_problem = _type_problem(row, fields)
                if type_problem:
                    problem = (Reason.WRONG_TYPE, type_problem)
                elif b"\\u" in raw and _has_lone_surrogate(row):
                    problem = (Reason.INVALID_JSON, "a \\u escape is an unpaired surrogate, which is not valid Unicode")
        if problem:
            rejects.append(Reject(chunk.source, line, problem[0], problem[1], excerpt(raw)))
            continue
        rows.append(row)
        numbers.append(line)
    table = pa.Table.from_pylist(rows, schema=RAW_SCHEMA)
    return ParsedChunk(table, np.asarray(numbers, dtype=np.int64), rejects, blank, frozenset(seen))


def _raw_row(record: dict, fields: FieldMap) -> dict:
    """The record's fields under our names; a prompt or completion that is a list is TRL's conversational one."""
    row = {name: None for name in RAW_SCHEMA.names}
    for name in JSON_FIELDS:
        column = fields.column(name)
        value = record.get(column) if column else None
        if name in CONVERSATIONAL_FIELDS and isinstance(value, list):
            row[CONVERSATIONAL_FIELDS[name]] = value
        else:
            row[name] = value
    return row


def _has_lone_surrogate(row: dict) -> bool:
    """Whether a kept string holds an unpaired surrogate (json.loads allows them; UTF-8 and Arrow do not)."""
    values = [row.get(name) for name in STRING_FIELDS]
    for name in RAW_SCHEMA.names:
        if isinstance(row.get(name), list):
            values += [value for item in row[name] if isinstance(item, dict) for value in item.values()]
    for value in values:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _type_problem(row: dict, fields: FieldMap) -> str | None:
    """Describe the first field whose JSON type is wrong, or None (naming the file's own column)."""
    for name in STRING_FIELDS:
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            shapes = "a string or a list of messages" if name in CONVERSATIONAL_FIELDS else "a string"
            return f"field '{fields.column(name)}' is a JSON {_json_type(value)}; it must be {shapes}"
    for name, list_field in LIST_FIELDS.items():
        items = row.get(name)
        if items is None:
            continue
        keys, turn = list_field.item_keys, list_field.item
        column = fields.column(list_field.key)
        if not isinstance(items, list):
            return f"field '{column}' is a JSON {_json_type(items)}; it must be a list of {{{', '.join(keys)}}} objects"
        for index, item in enumerate(items, start=1):
            if item is None:
                continue  # a null item lacks both keys: missing_field, as on the fast path
            if not isinstance(item, dict):
                return (
                    f"{turn} {index} is a JSON {_json_type(item)}; it must be an object with "
                    f"{' and '.join(map(repr, keys))}"
                )
            for key in keys:
                value = item.get(key)
                if value is not None and not isinstance(value, str):
                    return f"{turn} {index} has a JSON {_json_type(value)} as '{key}'; it must be a string"
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
