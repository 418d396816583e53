"""Validate rendered manifests against the published CRD schemas, vendored in ``tests/schemas`` (its README says
where each came from).

The API server prunes fields a structural schema does not declare, silently: a
misspelt ``nprocsPerNode`` would be dropped, not rejected. So besides the
schema's own rules, every object that declares ``properties`` is closed here
(``additionalProperties: false``) unless it preserves unknown fields; the
``x-kubernetes-*`` keys are otherwise annotations that jsonschema ignores.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema

from tests.yaml_files import read_yaml

SCHEMAS = Path(__file__).resolve().parent / "schemas"
"""The vendored upstream schemas: the CRDs, and the Model Registry API that tests/fake_model_registry.py serves."""

SUBSCHEMA_KEYS = ("items", "additionalProperties", "not")
SUBSCHEMA_LIST_KEYS = ("allOf", "anyOf", "oneOf")


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    closed = dict(schema)
    if "properties" in schema:
        closed["properties"] = {name: _closed(sub) for name, sub in schema["properties"].items()}
    for key in SUBSCHEMA_KEYS:
        if isinstance(schema.get(key), dict):
            closed[key] = _closed(schema[key])
    for key in SUBSCHEMA_LIST_KEYS:
        if key in schema:
            closed[key] = [_closed(sub) for sub in schema[key]]
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@functools.cache
def crd_validator(file_name: str) -> jsonschema.protocols.Validator:
    """A validator for the (only) served version of the CRD in ``tests/schemas/<file_name>``."""
    crd = read_yaml(SCHEMAS / file_name)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True)]
    schema = _closed(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(manifest: dict, file_name: str) -> list[str]:
    """One line per violation, with the path of the offending field."""
    errors = crd_validator(file_name).iter_errors(manifest)
    return sorted(f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}" for error in errors)


PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"
TRAINJOB_CRD = "trainer.kubeflow.org_trainjobs.yaml"


INT32 = ("progressPercentage", "estimatedRemainingSeconds")  # format int32, which jsonschema does not check


@functools.cache
def _trainer_status_validator() -> jsonschema.protocols.Validator:
    crd = read_yaml(SCHEMAS / TRAINJOB_CRD)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True)]
    schema = _closed(version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["trainerStatus"])
    return jsonschema.Draft7Validator(schema)


def trainer_status_errors(trainer_status: Any) -> list[str]:
    """What the API server would refuse in a TrainJob's ``status.trainerStatus``: the CRD's schema (closed), its
    CEL rule that ``lastUpdatedTime`` is present and its int32 formats, which jsonschema does not read."""
    errors = _trainer_status_validator().iter_errors(trainer_status)
    found = sorted(f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}" for error in errors)
    if isinstance(trainer_status, dict):
        if "lastUpdatedTime" not in trainer_status:
            found.append("lastUpdatedTime is required when trainerStatus is present")
        found += [
            f"{name}: {trainer_status[name]} is not an int32"
            for name in INT32
            if isinstance(trainer_status.get(name), int) and not -(2**31) <= trainer_status[name] < 2**31
        ]
    return found
