"""Run parameters given on a command line as ``NAME=VALUE``, typed against a pipeline.

``python -m pipelines.run`` (kfp.local) and ``python -m pipelines.submit`` (a
KFP server) take the same ``--param`` options; both check the names and turn
the text into the types the pipeline declares, here, before anything runs.
"""

import difflib
import json
from typing import Any

from common.errors import UserError
from components.run_form.checks import validate

_PARSERS = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": None}


def parse_params(pairs: list[str], declared: dict[str, str]) -> dict[str, Any]:
    """Turn ``NAME=VALUE`` strings into typed values for the declared parameters."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise UserError(f"--param {pair!r} is not NAME=VALUE, e.g. --param eval_fraction=0.2.")
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(
                f"--param {name!r} is not a pipeline parameter{hint}; "
                f"the parameters are: {', '.join(sorted(declared))}."
            )
        values[name] = _parse_value(name, text, declared[name])
    return values


def _parse_json(name: str, text: str, kind: str) -> Any:
    expected, example = {"LIST": (list, '["first", "second"]'), "STRUCT": (dict, '{"key": 1}')}[kind]
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, expected):
        raise UserError(
            f"--param {name}={text!r}: {name} is a JSON {'list' if kind == 'LIST' else 'object'}, "
            f"e.g. --param '{name}={example}'."
        )
    return value


def _parse_value(name: str, text: str, kind: str) -> Any:
    if kind in ("LIST", "STRUCT"):
        return _parse_json(name, text, kind)
    if kind == "BOOLEAN":
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise UserError(f"--param {name}={text!r}: {name} is true or false.")
        return lowered == "true"
    try:
        return _PARSERS[kind](text)
    except ValueError:
        noun = {"NUMBER_INTEGER": "a whole number", "NUMBER_DOUBLE": "a number"}[kind]
        raise UserError(f"--param {name}={text!r}: {name} must be {noun}.") from None


def checked_arguments(pairs: list[str], pipeline) -> dict[str, Any]:
    """The typed ``NAME=VALUE`` overrides for ``pipeline``, once the run's every value passes the first
    step's checks."""
    return checked_overrides(pairs, declared_parameters(pipeline), defaults_of(pipeline))


def checked_overrides(pairs: list[str], declared: dict[str, str], defaults: dict[str, Any]) -> dict[str, Any]:
    """The typed ``NAME=VALUE`` overrides of the ``declared`` parameters, once the run's every value (the
    ``defaults`` included) passes the first step's checks.
    """
    overrides = parse_params(pairs, declared)
    validate({**defaults, **overrides})
    return overrides


def declared_parameters(pipeline) -> dict[str, str]:
    """Name → KFP parameter type of each run parameter of ``pipeline``.

    ``pipeline`` is a pipeline function or a compiled package loaded with
    ``kfp.components.load_component_from_file``: both carry the pipeline spec.
    """
    spec = pipeline.pipeline_spec.root.input_definitions.parameters
    from kfp.pipeline_spec import pipeline_spec_pb2

    kinds = pipeline_spec_pb2.ParameterType.ParameterTypeEnum
    return {name: kinds.Name(definition.parameter_type) for name, definition in spec.items()}


def defaults_of(pipeline) -> dict[str, Any]:
    """Name → default value of each run parameter of ``pipeline``."""
    return {name: spec.default for name, spec in pipeline.component_spec.inputs.items()}
