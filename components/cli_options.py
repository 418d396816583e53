"""Command-line options generated from a dataclass of options.

A stage's options dataclass is the single source of each default and help text
(``trainer/config.py``, ``components/evaluation/options.py``,
``components/publish/options.py``); its CLI is generated from the fields so the
two can never disagree. A field's metadata holds ``help`` and optionally
``choices`` and ``required``; a ``tuple[str, ...]`` field takes any number of values.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import field
from typing import Any


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (and e.g. ``choices``, ``required``) for the generated CLI."""
    return field(default=default, metadata={"help": help, **extra})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(default: Any) -> str:
    return "empty" if default in ("", ()) else str(default)


def add_options(parser: argparse.ArgumentParser, options_type: type) -> None:
    """Add one option per field of ``options_type``; booleans get ``--x/--no-x``."""
    types = typing.get_type_hints(options_type)
    for spec in dataclasses.fields(options_type):
        kind, required = types[spec.name], spec.metadata.get("required", False)
        help_text = spec.metadata["help"] + ("" if required else f" Default: {_shown(spec.default)}.")
        if kind is bool:
            parser.add_argument(flag(spec.name), action=argparse.BooleanOptionalAction, default=spec.default, help=help_text)
        elif kind == tuple[str, ...]:
            parser.add_argument(flag(spec.name), nargs="*", type=str, default=spec.default, help=help_text)
        else:
            parser.add_argument(
                flag(spec.name), type=kind, required=required, default=None if required else spec.default,
                choices=spec.metadata.get("choices"), help=help_text,
            )  # fmt: skip


def options_from(args: argparse.Namespace, options_type: type):
    """The ``options_type`` instance holding the parsed values of its fields (lists become tuples)."""
    values = {spec.name: getattr(args, spec.name) for spec in dataclasses.fields(options_type)}
    return options_type(**{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()})
