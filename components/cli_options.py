"""Command-line options generated from a dataclass of options.

A stage's options dataclass is the single source of each default and help text
(see ``trainer/config.py``); its CLI is generated from the fields so the two can
never disagree. A field's metadata holds ``help`` and optionally ``choices``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import field
from typing import Any


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (and e.g. ``choices``) for the generated CLI."""
    return field(default=default, metadata={"help": help, **extra})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, options_type: type) -> None:
    """Add one option per field of ``options_type``; booleans get ``--x/--no-x``."""
    types = typing.get_type_hints(options_type)
    for spec in dataclasses.fields(options_type):
        kind = types[spec.name]
        help_text = f"{spec.metadata['help']} Default: {spec.default if spec.default != '' else 'empty'}."
        if kind is bool:
            parser.add_argument(flag(spec.name), action=argparse.BooleanOptionalAction, default=spec.default, help=help_text)
        else:
            parser.add_argument(flag(spec.name), type=kind, default=spec.default, choices=spec.metadata.get("choices"), help=help_text)


def options_from(args: argparse.Namespace, options_type: type):
    """The ``options_type`` instance holding the parsed values of its fields."""
    return options_type(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(options_type)})
