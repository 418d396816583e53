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
from typing import Any, ClassVar, Self

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


def _record(value: dict[str, Any], kind: type, path: Path, what: str, fix: str) -> Any:
    """The JSON object ``value`` as a ``kind`` record, refused with the fields it lacks (``what`` names it)."""
    specs = dataclasses.fields(kind)
    required = {spec.name for spec in specs if dataclasses.MISSING is spec.default is spec.default_factory}
    missing = sorted(required - value.keys())
    if missing:
        raise UserError(f"{path}: {what} has no {', '.join(missing)}. {fix}")
    return kind(**{spec.name: value[spec.name] for spec in specs if spec.name in value})


def _entries(value: Any, kind: type, path: Path, what: str, fix: str) -> tuple[Any, ...]:
    """``value`` (a list of JSON objects) as ``kind`` records, refused with the fields an entry lacks."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise UserError(f"{path}: its {what} are not a list of objects. {fix}")
    return tuple(
        _record(entry, kind, path, f"entry {number} of its {what}", fix) for number, entry in enumerate(value, 1)
    )


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


def _entry(value: Any, kind: type, path: Path, what: str, fix: str) -> Any:
    """One JSON object (or null) as a ``kind`` record (or None), refused with the fields it lacks."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise UserError(f"{path}: its {what} is not an object. {fix}")
    return _record(value, kind, path, f"its {what}", fix)


class OneOrNone:
    """A file holding one record, or none when its step had nothing to do: ``{"format_version": V, KEY: {...}}``
    (``KEY: null`` for none). Before the format version (2026-11-28) the file was the record's object itself, or
    null: read as such. A subclass is a frozen dataclass that sets the class attributes below."""

    KEY: ClassVar[str]  # the record's key in the file
    WHAT: ClassVar[str]  # what the record is, for a refusal
    VERSION: ClassVar[int]
    FIX: ClassVar[str]  # what to do about a file that cannot be read

    @classmethod
    def write(cls, path: Path, record: Self | None) -> None:
        value = dataclasses.asdict(record) if record is not None else None
        write_text_atomic(path, json.dumps({FORMAT_VERSION: cls.VERSION, cls.KEY: value}, indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> Self | None:
        """The record at ``path``; None for none, or when the step has not written the file."""
        if not path.is_file():
            return None
        value = _json_of(path, cls.WHAT, cls.FIX)
        if isinstance(value, dict) and FORMAT_VERSION in value or not (value is None or isinstance(value, dict)):
            value = _versioned(value, path, cls.WHAT, cls.VERSION, cls.FIX).get(cls.KEY)
        return _entry(value, cls, path, cls.WHAT, cls.FIX)


@dataclass(frozen=True)
class Registration(OneOrNone):
    """``register/registered.json``: the Model Registry's ids of what the register step registered or updated.

    Written by register (none: no ``model_registry_url``); read by serve (to add the endpoint to the version),
    the run summary and register again (a retried step).
    """

    url: str
    registered_model_id: str
    model_version_id: str
    artifact_ids: dict[str, str]  # artifact name -> id
    created: bool  # False: the version was there already and was updated

    KEY = "registration"
    WHAT = "registration"
    VERSION = 1
    FIX = "Rerun the register step of that run: it updates the version in place and rewrites the record."


@dataclass(frozen=True)
class Served(OneOrNone):
    """``serve/served.json``: a Ready InferenceService and its answer to one question.

    Written by serve (none: deploy is off); read by the run summary and serve again (a retried step).
    """

    name: str
    namespace: str
    endpoint: str  # the in-cluster URL (status.address.url), else the external one (status.url)
    model: str  # the served model's name, as /v1/models lists it
    question: str
    answer: str

    KEY = "served"
    WHAT = "served endpoint"
    VERSION = 1
    FIX = "Rerun the serve step of that run: it checks the InferenceService again and rewrites the record."
