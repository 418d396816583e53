"""Command-line options generated from a dataclass of options.

A stage's options dataclass is the single source of each default and help text
(``trainer/config.py``, ``components/evaluate/options.py``,
``components/publish/options.py``); its CLI is generated from the fields so the
two can never disagree. A field's metadata holds ``help`` and optionally
``choices`` and ``required``; a ``tuple[str, ...]`` field takes any number of values.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import field
from typing import Any, Mapping, Sequence


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (and e.g. ``choices``, ``required``) for the generated CLI.

    A dict default (a mutable value) becomes a ``default_factory`` returning a copy; ``default_of`` reads either.
    """
    metadata = {"help": help, **extra}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def run_option(default: Any, help: str, *, name: str = "", **extra: Any) -> Any:
    """An ``option`` that is also a pipeline run parameter, called ``name`` in the run form (default: the field's name).

    The run form is one flat list, so an option whose field name would not say
    which stage it sets there (``cpu``) gets a longer ``name`` (``training_cpu``):
    the field's name after a prefix, never another name, so that the field, its
    stage's flag and step input, and the run form read alike
    (tests/test_run_parameters.py holds every run parameter to it).
    """
    return option(default, help, run_form=name or True, **extra)


def run_form_name(spec: dataclasses.Field) -> str | None:
    """The run-form name of a field declared with ``run_option``; None for an option the run form does not set."""
    name = spec.metadata.get("run_form")
    return spec.name if name is True else name


def run_form_names(options: type) -> dict[str, str]:
    """Field name -> run-form name of each run parameter ``options`` declares: what a message tells the user to set."""
    return {spec.name: name for spec in dataclasses.fields(options) if (name := run_form_name(spec)) is not None}


def choice_problems(options_type: type, values: Any) -> dict[str, str]:
    """Field name -> the problem of each field ``options_type`` declares with ``choices`` whose value in ``values``
    (an instance, or the run form's values under the fields' names) is none of them. Derived from the declaration,
    as the flag's and the run form's choices are, and said the same way for every stage."""
    return {
        spec.name: f"must be one of {', '.join(map(str, choices))} (got {value!r})"
        for spec in dataclasses.fields(options_type)
        if (choices := spec.metadata.get("choices")) is not None
        and (value := getattr(values, spec.name)) not in choices
    }


def default_of(spec: dataclasses.Field) -> Any:
    """The default value of a field declared with ``option``."""
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(default: Any) -> str:
    return "empty" if default in ("", ()) else str(default)


def _converter(kind: Any, metadata: Any) -> Any:
    """What turns the command-line text into the field's value: ``normalise``, else the type (``X | None``: X)."""
    if metadata.get("normalise"):
        return metadata["normalise"]
    members = [member for member in typing.get_args(kind) if member is not type(None)]
    return members[0] if members else kind


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, options_type: type, only: Sequence[str] = ()
) -> None:
    """Add one option per field of ``options_type`` (or per field named in ``only``); booleans get ``--x/--no-x``.

    Field metadata: ``help``; optionally ``choices``, ``required``, ``positional``
    and ``normalise`` (a function applied to the text, e.g. ``str.lower``).
    """
    types = typing.get_type_hints(options_type)
    for spec in dataclasses.fields(options_type):
        if only and spec.name not in only:
            continue
        kind, meta = types[spec.name], spec.metadata
        required = meta.get("required", False)
        help_text = meta["help"].replace("%", "%%")  # argparse %-formats help strings
        shown = "" if required or spec.default is None else f" Default: {_shown(spec.default)}."
        if meta.get("positional"):
            parser.add_argument(spec.name, type=_converter(kind, meta), help=help_text)
        elif kind is bool:
            parser.add_argument(
                flag(spec.name), action=argparse.BooleanOptionalAction, default=spec.default, help=help_text + shown
            )
        elif kind == tuple[str, ...]:
            parser.add_argument(flag(spec.name), nargs="*", type=str, default=spec.default, help=help_text + shown)
        else:
            parser.add_argument(
                flag(spec.name),
                type=_converter(kind, meta),
                required=required,
                default=None if required else spec.default,
                choices=meta.get("choices"),
                help=help_text + shown,
            )


def options_from(args: argparse.Namespace, options_type: type):
    """The ``options_type`` instance holding the parsed values of its fields (lists become tuples)."""
    return options_from_inputs(options_type, vars(args))


def options_from_inputs(options_type: type, inputs: Mapping[str, Any], **derived: Any):
    """The ``options_type`` instance from a KFP component's inputs, which carry its fields under the fields' names.

    ``derived`` holds the fields the stage computes itself (paths on the
    workspace); a field neither names keeps its default. Lists (how KFP and
    argparse hand over a sequence) become tuples.
    """
    names = {spec.name for spec in dataclasses.fields(options_type)} - derived.keys()
    values = {name: inputs[name] for name in names if name in inputs}
    return options_type(
        **{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}, **derived
    )
