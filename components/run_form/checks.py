"""The first pipeline step's checks: every run parameter's value, by its stage's rules and across stages.

The step fails in seconds naming every bad parameter, instead of an hour later
in a training pod; ``python -m pipelines.run`` and ``submit`` run the same
checks before a run starts. Each stage's own rules are its options module's
``option_problems``; the rules here are the ones a whole run adds. This module
imports no KFP: the first pipeline step imports it in its pod.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from common.cli_options import default_of
from common.errors import UserError, exit_on_user_error
from components.evaluation.options import task_entries
from components.publish.options import PublishOptions
from components.run_form.table import RUN_FORM, RUN_PARAMETERS, run_parameters_of
from components.training.options import parse_node_selector, parse_tolerations, sharding_problem
from trainer.config import packages_needed


def _held_out_fraction(value: float) -> str | None:
    if 0.0 < value < 1.0:
        return None
    return f"must be above 0 and below 1 (got {value}): the evaluation stage compares the models on the held-out rows"


# Rules a pipeline run adds to a stage's own: the data stage alone may hold nothing out, the DAG may not.
PIPELINE_RULES: dict[str, Callable[[Any], str | None]] = {"eval_fraction": _held_out_fraction}


def _job_rules(values: dict[str, Any]) -> dict[str, str]:
    """Rules across the training options and the job's size."""
    found = {}
    names = ("sharding", "training_nodes", "gpus_per_node")
    if all(name in values for name in names):
        problem = sharding_problem(*(values[name] for name in names))
        if problem:
            found["sharding"] = problem
    if values.get("gpus_per_node") == 0:
        for field, (_, alternative) in packages_needed(values).items():
            found.setdefault(
                field,
                f"is {values[field]}, which runs only on NVIDIA GPUs, and gpus_per_node is 0 (the training pods get "
                f"none): {alternative}, or give the training pods GPUs",
            )
    return found


def _publish_rules(values: dict[str, Any]) -> dict[str, str]:
    """What a publish must hold for the next run's evaluation to load it as the model to beat.

    ``publish_merged`` auto follows the method and ``publish_adapter``; only an explicit false can leave the
    repository without loadable weights.
    """
    if values.get("publish_merged") != "false" or not all(name in values for name in ("method", "publish_adapter")):
        return {}
    if values["method"] == "full":
        why = "method is full, whose only weights are the merged checkpoint"
    elif not values["publish_adapter"]:
        why = "publish_adapter is false too"
    else:
        return {}
    return {
        "publish_merged": f"is false and {why}: the repository would hold only GGUF files, which the next run's "
        "evaluation cannot load to compare its model with the published one. Set publish_merged to auto or true"
    }


def _target_rules(values: dict[str, Any]) -> dict[str, str]:
    """What registering and deploying need from the steps before them, so a run does not train for hours to
    fail at its last step."""
    names = ("deploy", "model_oci_uri", "model_s3_uri", "model_registry_url", "hub_repo_id", "publish_merged")
    if not all(name in values for name in (*names, "method", "publish_adapter")):
        return {}
    found = {}
    stored = values["model_oci_uri"] or values["model_s3_uri"]
    if values["deploy"] and not stored:
        found["deploy"] = (
            "is true, but the version is stored nowhere KServe can read it: set model_oci_uri (a modelcar image) or "
            "model_s3_uri"
        )
    # publish's own rule for what auto means (only lora and qlora train an adapter); an invalid value is named
    # by publish's option_problems.
    publish = SimpleNamespace(include_merged=values["publish_merged"], include_adapter=values["publish_adapter"])
    merged = PublishOptions.publishes_merged(publish, adapter_trained=values["method"] != "full")
    if values["deploy"] and stored and not merged:
        found["deploy"] = (
            f"is true, but with method {values['method']} and publish_merged {values['publish_merged']} the stored "
            "version holds no merged checkpoint for vLLM to load: set publish_merged to true"
        )
    if values["model_registry_url"] and not (stored or values["hub_repo_id"]):
        found["model_registry_url"] = (
            "is set, but the version goes nowhere a registry entry could point to: set model_oci_uri or model_s3_uri "
            "(or hub_repo_id)"
        )
    return found


def _benchmark_rules(values: dict[str, Any]) -> dict[str, str]:
    """The registry names in benchmark_tasks must be lm-eval's: a misspelt task fails here, not after training. A
    local task directory is checked by the evaluate step, which mounts the workspace it lives on."""
    if "benchmark_tasks" not in values:
        return {}
    from components.evaluation.benchmarks import is_local, registry_problem

    named = [entry for entry in task_entries(values["benchmark_tasks"]) if not is_local(entry)]
    problem = registry_problem(named)
    return {"benchmark_tasks": problem} if problem else {}


def problems(values: dict[str, Any]) -> list[str]:
    """One line per invalid parameter among ``values`` (run parameter name -> value), in run-form order."""
    found: dict[str, str] = {}
    for options, validation in RUN_FORM:
        declared = run_parameters_of(options)
        given = {p.field: values[p.name] for p in declared if p.name in values}
        if not given:
            continue
        fields = {spec.name: default_of(spec) for spec in dataclasses.fields(options)}
        stage_problems = validation(SimpleNamespace(**{**fields, **given}))
        for parameter in declared:
            if parameter.field in given and parameter.field in stage_problems:
                found[parameter.name] = stage_problems[parameter.field]
    for name, rule in PIPELINE_RULES.items():
        problem = rule(values[name]) if name in values else None
        if problem:
            found[name] = problem
    found.update(_job_rules(values))
    found.update(_publish_rules(values))
    found.update(_target_rules(values))
    if "benchmark_tasks" not in found:
        found.update(_benchmark_rules(values))
    return [f"parameter '{p.name}' {found[p.name]}" for p in RUN_PARAMETERS if p.name in found]


def validate(values: dict[str, Any]) -> None:
    """Raise ``UserError`` listing every invalid parameter."""
    found = problems(values)
    if found:
        raise UserError("The run parameters are invalid: " + "; ".join(found) + ". Fix them and start the run again.")


# The evaluation generates with both models on one GPU when training has GPUs (on the CPU otherwise).
EVALUATE_GPUS = 1


@dataclass(frozen=True)
class EvaluatePlacement:
    """Where the evaluate step runs: on the training pods' kind of node, with one GPU if they have GPUs."""

    evaluate_gpus: int
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]


def evaluate_placement(values: dict[str, Any]) -> EvaluatePlacement:
    """The evaluate step's GPU count, node selector and tolerations from the training run parameters."""
    return EvaluatePlacement(
        evaluate_gpus=EVALUATE_GPUS if values["gpus_per_node"] > 0 else 0,
        node_selector=parse_node_selector(values["node_selector"]),
        tolerations=parse_tolerations(values["tolerations"]),
    )


def runtime_image_problems(values: dict[str, Any]) -> list[str]:
    """What the runtime image itself cannot do for these values.

    Checked only inside the image, by the pipeline's first step: its pod runs
    the image the training pods run, so a missing package is refused here, in
    seconds, instead of by the trainer once GPU pods were scheduled (a laptop
    that renders or submits the run may have other packages).
    """
    found = []
    for field, (module, alternative) in packages_needed(values).items():
        if importlib.util.find_spec(module) is None:
            found.append(
                f"parameter '{field}' is {values[field]}, which needs the {module} package, and the runtime image "
                f"(which the training pods run too) does not install it: {alternative}, or build the image with "
                f"{module} for CUDA"
            )
    return found


@exit_on_user_error
def check_in_pipeline(values: dict[str, Any]) -> None:
    validate(values)
    found = runtime_image_problems(values)
    if found:
        raise UserError("The run parameters ask for what this image cannot do: " + "; ".join(found) + ".")
    print("run parameters are valid", flush=True)
