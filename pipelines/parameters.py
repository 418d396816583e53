"""Validation of the pipeline's run parameters, before any work starts.

The OpenShift AI run form accepts any value of the right type, so the first task
of the DAG checks them all and fails in seconds with every problem listed, each
naming its parameter, instead of failing an hour later in a training pod.
``python -m pipelines.run`` calls the same checks before starting a local run.
"""

import re
from typing import Any, Callable

from components.errors import UserError, exit_on_user_error

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
MAX_SEED = 2**64


def _fraction(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else f"must be at least 0 and below 1 (got {value})"


def _seed(value: int) -> str | None:
    return None if 0 <= value < MAX_SEED else f"must be between 0 and 2**64 - 1 (got {value})"


def _optional_label(value: str) -> str | None:
    if not value or (len(value) <= 63 and DNS1123_LABEL.match(value)):
        return None
    return (
        f"{value!r} is not a valid Kubernetes name: use at most 63 lowercase letters, digits and '-', "
        "starting and ending with a letter or digit (or leave it empty)"
    )


def _optional_subdomain(value: str) -> str | None:
    if not value or (len(value) <= 253 and DNS1123_SUBDOMAIN.match(value)):
        return None
    return f"{value!r} is not a valid StorageClass name (lowercase letters, digits, '-' and '.'; empty means the cluster default)"


def _quantity(value: str) -> str | None:
    if QUANTITY.match(value) and float(re.sub(r"[A-Za-z]+$", "", value)) > 0:
        return None
    return f"{value!r} is not a positive Kubernetes quantity such as '20Gi' or '500Mi'"


CHECKS: dict[str, Callable[[Any], str | None]] = {
    "eval_fraction": _fraction,
    "split_seed": _seed,
    "max_reject_fraction": _fraction,
    "pvc_name": _optional_label,
    "pvc_size": _quantity,
    "pvc_storage_class": _optional_subdomain,
}


def problems(values: dict[str, Any]) -> list[str]:
    """One line per invalid parameter among ``values``."""
    found = []
    for name, check in CHECKS.items():
        if name in values:
            problem = check(values[name])
            if problem:
                found.append(f"parameter '{name}' {problem}")
    return found


def validate(values: dict[str, Any]) -> None:
    """Raise ``UserError`` listing every invalid parameter."""
    found = problems(values)
    if found:
        raise UserError("The run parameters are invalid: " + "; ".join(found) + ". Fix them and start the run again.")


@exit_on_user_error
def check_in_pipeline(values: dict[str, Any]) -> None:
    validate(values)
    print("run parameters are valid", flush=True)
