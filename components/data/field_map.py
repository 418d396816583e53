"""``field_map``: read a file whose columns have other names as one of the shapes we accept.

A JSON object from our field name to the file's column, e.g. ``{"question": "input"}`` for seed
003's ``{"input", "trace", "answer"}`` records. A column taken by the map is read only as the field
it is mapped to (here ``input`` is no longer Alpaca's input); columns nobody maps are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from components.data.shapes import JSON_FIELDS


@dataclass(frozen=True)
class FieldMap:
    """Our field name -> the file's column name, for the fields that are renamed."""

    renamed: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> FieldMap:
        """The map in ``text`` (empty: none); ``ValueError`` says what is wrong with it."""
        if not text.strip():
            return cls()
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"is not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(mapping, dict) or not all(isinstance(value, str) and value for value in mapping.values()):
            raise ValueError(
                'must be a JSON object of our field name -> the file\'s column name, e.g. {"question": "input"}'
            )
        unknown = sorted(set(mapping) - set(JSON_FIELDS))
        if unknown:
            raise ValueError(
                f"maps {', '.join(map(repr, unknown))}, which are not fields we read; they are {', '.join(JSON_FIELDS)}"
            )
        taken = [column for column in set(mapping.values()) if list(mapping.values()).count(column) > 1]
        if taken:
            raise ValueError(f"maps several fields to the column {taken[0]!r}; each column can be read as one field")
        return cls(tuple(sorted(mapping.items())))

    @cached_property
    def _columns(self) -> dict[str, str | None]:
        renamed = dict(self.renamed)
        return {
            field: renamed[field] if field in renamed else None if field in renamed.values() else field
            for field in JSON_FIELDS
        }

    def column(self, field: str) -> str | None:
        """The file's column read as ``field``; None when the map gave that name to another field."""
        return self._columns[field]

    @property
    def mapped_columns(self) -> tuple[str, ...]:
        return tuple(column for _, column in self.renamed)


def field_map_problem(text: str) -> str | None:
    """What is wrong with a ``field_map`` value, for the options' validation."""
    try:
        FieldMap.parse(text)
    except ValueError as error:
        return str(error)
    return None
