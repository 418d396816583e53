"""Typed records of the files one stage writes and a later one reads, each with a format version.

``common.run_layout`` names the files; a record here says what one holds. It is written and read only
through its class, so a renamed field fails where it is declared instead of as a ``KeyError`` in a
later step. A PVC outlives upgrades, and a run on unchanged data finishes the steps of an earlier
run's version: a file an older pipeline wrote is read as written when it holds every field, and one
that lacks a field, or has a format this pipeline does not know, gets one paragraph naming what it
lacks and what to do.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.atomic import write_text_atomic
from common.errors import UserError

FORMAT_VERSION = "format_version"


def _json_of(path: Path, what: str, fix: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not the JSON {what} record the pipeline writes ({error}). {fix}") from None


def _versioned(value: Any, path: Path, what: str, version: int, fix: str) -> dict[str, Any]:
    """``value``, the JSON in ``path``, refused unless it says it is format ``version`` of ``what``."""
    found = value.get(FORMAT_VERSION) if isinstance(value, dict) else None
    if found != version:
        written = f"format {found}" if found is not None else "a format without a version"
        raise UserError(
            f"{path} holds {what} in {written}, and this version of the pipeline reads format {version}: an older "
            f"or newer pipeline wrote it. {fix}"
        )
    return value


def _entries(value: Any, kind: type, path: Path, what: str, fix: str) -> tuple[Any, ...]:
    """``value`` (a list of JSON objects) as ``kind`` records, refused with the fields an entry lacks."""
    fields = {spec.name for spec in dataclasses.fields(kind)}
    required = {
        spec.name
        for spec in dataclasses.fields(kind)
        if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
    }
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise UserError(f"{path}: its {what} are not a list of objects. {fix}")
    for number, entry in enumerate(value, 1):
        missing = sorted(required - entry.keys())
        if missing:
            raise UserError(f"{path}: entry {number} of its {what} has no {', '.join(missing)}. {fix}")
    return tuple(kind(**{name: entry[name] for name in fields if name in entry}) for entry in value)


@dataclass(frozen=True)
class StoredCopy:
    """One place the store step copied a version to: an S3 prefix or an OCI modelcar image."""

    uri: str  # s3://bucket/prefix/model/run-id/, or oci://registry/repository:tag
    files: int
    total_bytes: int
    digest: str | None = None  # an image's manifest sha256: the image exactly, whatever later happens to the tag

    @property
    def scheme(self) -> str:
        """``s3`` or ``oci``."""
        return self.uri.split("://", 1)[0]


@dataclass(frozen=True)
class StoredCopies:
    """``store/stored.json``: every copy the store step made of a run's version (none: no target was set).

    Written by the store step; read by register (an artifact per copy), serve (the copy KServe loads) and
    the run summary.
    """

    copies: tuple[StoredCopy, ...] = ()

    VERSION = 1
    FIX = (
        "Rerun the store step of that run (it copies the version again and rewrites the record), or delete the file "
        "to have the version stored again by the next run on the same data."
    )

    def write(self, path: Path) -> None:
        record = {FORMAT_VERSION: self.VERSION, "copies": [dataclasses.asdict(copy) for copy in self.copies]}
        write_text_atomic(path, json.dumps(record, indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> StoredCopies:
        """The record at ``path``; no copies when the store step has not written one. Before the format version
        (2026-11-28) the file was the bare list of copies, with the same fields: read as such, since a run on
        unchanged data finishes an earlier run's version, whose store step may have run before an upgrade."""
        if not path.is_file():
            return cls()
        value = _json_of(path, "stored copies", cls.FIX)
        if not isinstance(value, list):
            value = _versioned(value, path, "stored copies", cls.VERSION, cls.FIX).get("copies")
        return cls(_entries(value, StoredCopy, path, "copies", cls.FIX))
