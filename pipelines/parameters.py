"""Validation of the pipeline's run parameters, before any work starts.

The OpenShift AI run form accepts any value of the right type, so the first task
of the DAG checks them all and fails in seconds with every problem listed, each
naming its parameter, instead of failing an hour later in a training pod.
``python -m pipelines.run`` calls the same checks before starting a local run.
"""

import dataclasses
import re
from types import SimpleNamespace
from typing import Any, Callable

from common.errors import UserError, exit_on_user_error

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
MAX_SEED = 2**64


def _fraction(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else f"must be at least 0 and below 1 (got {value})"


def _held_out_fraction(value: float) -> str | None:
    if 0.0 < value < 1.0:
        return None
    return f"must be above 0 and below 1 (got {value}): the evaluation stage compares the models on the held-out rows"


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
    "eval_fraction": _held_out_fraction,
    "split_seed": _seed,
    "max_reject_fraction": _fraction,
    "pvc_name": _optional_label,
    "pvc_size": _quantity,
    "pvc_storage_class": _optional_subdomain,
}


# Run parameters that carry a stage option under another name (the run form is
# one flat list, so "cpu" or "batch_size" alone would not say which stage they are for).
LAUNCH_PARAMETERS = {
    "training_backend": "backend",
    "training_nodes": "nodes",
    "gpus_per_node": "gpus_per_node",
    "training_cpu": "cpu",
    "training_memory": "memory",
    "training_shm_size": "shm_size",
    "node_selector": "node_selector",
    "tolerations": "tolerations",
    "training_timeout_minutes": "timeout_minutes",
    "training_backoff_limit": "backoff_limit",
    "trainjob_runtime": "trainjob_runtime",
}
EVALUATE_PARAMETERS = {
    "extra_questions": "extra_questions",
    "eval_max_new_tokens": "max_new_tokens",
    "eval_score_rows": "score_rows",
    "eval_batch_size": "batch_size",
    "min_eval_loss_improvement": "min_eval_loss_improvement",
}
PUBLISH_PARAMETERS = {
    "hub_repo_id": "repo_id",
    "hub_private": "private",
    "publish_merged": "include_merged",
    "publish_adapter": "include_adapter",
    "model_license": "license",
}


def _renamed(values: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Stage option name -> value, for the run parameters in ``values`` that ``names`` maps."""
    return {option: values[parameter] for parameter, option in names.items() if parameter in values}


def _stage_problems(values: dict[str, Any]) -> list[str]:
    """The stages' own checks of their options, for the run parameters in ``values``, each named as in the run form."""
    from components.evaluation.options import EvaluateOptions
    from components.evaluation.options import option_problems as evaluate_problems
    from components.training.stage import LaunchOptions, launch_problems
    from trainer.config import TrainConfig
    from trainer.config import option_problems as training_problems

    training = {name: values[name] for name in TrainConfig.__dataclass_fields__ if name in values}
    found = {name: problem for name, problem in training_problems(TrainConfig(**training)).items() if name in training}
    for names, problems_of in (
        (LAUNCH_PARAMETERS, lambda options: launch_problems(LaunchOptions(**options))),
        # Checked on the field values, before EvaluateOptions would refuse to exist.
        (
            EVALUATE_PARAMETERS,
            lambda options: evaluate_problems(SimpleNamespace(**{**dataclasses.asdict(EvaluateOptions()), **options})),
        ),
    ):
        options = _renamed(values, names)
        parameter_of = {option: parameter for parameter, option in names.items()}
        found.update(
            {parameter_of[option]: problem for option, problem in problems_of(options).items() if option in options}
        )
    return (
        [f"parameter '{name}' {problem}" for name, problem in found.items()]
        + _export_problems(values)
        + _publish_problems(values)
    )


def _export_problems(values: dict[str, Any]) -> list[str]:
    from components.export.stage import check_model_name, parse_outtypes
    from gguf_export.options import Thresholds

    found = []
    for name, check in (
        ("gguf_outtype", parse_outtypes),
        ("model_name", check_model_name),
        ("gguf_thresholds", Thresholds.from_mapping),
    ):
        if values.get(name):
            try:
                check(values[name])
            except UserError as error:
                found.append(f"parameter '{name}': {str(error).rstrip('.')}")
    return found


def _publish_problems(values: dict[str, Any]) -> list[str]:
    from components.publish.options import PublishOptions

    try:
        PublishOptions(**_renamed(values, PUBLISH_PARAMETERS))
    except UserError as error:
        return [f"parameter 'hub_repo_id': {str(error).rstrip('.')}"]
    return []


def problems(values: dict[str, Any]) -> list[str]:
    """One line per invalid parameter among ``values``."""
    found = []
    for name, check in CHECKS.items():
        if name in values:
            problem = check(values[name])
            if problem:
                found.append(f"parameter '{name}' {problem}")
    return found + _stage_problems(values)


def validate(values: dict[str, Any]) -> None:
    """Raise ``UserError`` listing every invalid parameter."""
    found = problems(values)
    if found:
        raise UserError("The run parameters are invalid: " + "; ".join(found) + ". Fix them and start the run again.")


@exit_on_user_error
def check_in_pipeline(values: dict[str, Any]) -> None:
    validate(values)
    print("run parameters are valid", flush=True)
