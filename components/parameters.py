"""The run form: every pipeline parameter, declared once, by the stage option it sets.

A parameter's default, type, help text and validation live in its stage's
options dataclass; ``RUN_PARAMETERS`` only gives each field its name in the run
form, which is one flat list (``cpu`` alone would not say which stage it is
for). Everything else is derived from that table: the pipeline's parameter
descriptions (what the OpenShift AI run form shows), the README's parameter
table, the arguments the DAG passes to each step, and the checks of the first
pipeline step, which fails in seconds naming every bad parameter instead of an
hour later in a training pod. ``python -m pipelines.run`` runs the same checks
before a local run. Where KFP needs a literal Python signature (the pipeline
function, and the step functions, whose source ships to the pod),
``tests/test_run_parameters.py`` proves it equals this table.

This module imports no KFP: the first pipeline step imports it in its pod.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import typing
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, List

from common.cli_options import default_of
from common.errors import UserError, exit_on_user_error
from components.dataprep.options import PrepareOptions
from components.dataprep.options import option_problems as prepare_problems
from components.evaluation.options import EvaluateOptions
from components.evaluation.options import option_problems as evaluate_problems
from components.export.options import ExportStageOptions
from components.export.options import option_problems as export_problems
from components.publish.options import PublishOptions
from components.publish.options import option_problems as publish_problems
from components.run_options import (
    RunInputs,
    StepResources,
    WorkspaceOptions,
    inputs_problems,
    resources_problems,
    workspace_problems,
)
from components.tokenise.options import TokeniseOptions
from components.tokenise.options import option_problems as tokenise_problems
from components.training.options import (
    LaunchOptions,
    launch_problems,
    parse_node_selector,
    parse_tolerations,
    sharding_problem,
)
from trainer.config import SET_BY_THE_LAUNCHER, TrainConfig, packages_needed
from trainer.config import option_problems as training_problems


@dataclass(frozen=True)
class RunParameter:
    """One field of the run form: the stage option ``options.<field>`` under the name ``name``."""

    name: str
    options: type
    field: str

    @property
    def declaration(self) -> dataclasses.Field:
        return next(spec for spec in dataclasses.fields(self.options) if spec.name == self.field)

    @property
    def default(self) -> Any:
        """The default as KFP holds it: a list, not a tuple."""
        value = default_of(self.declaration)
        return list(value) if isinstance(value, tuple) else value

    @property
    def type(self) -> Any:
        """The type as KFP declares it: ``List[str]`` for a ``tuple[str, ...]`` field."""
        kind = typing.get_type_hints(self.options)[self.field]
        return List[str] if kind == tuple[str, ...] else kind

    @property
    def kfp_type(self) -> str:
        """The type's name in a compiled pipeline's parameter definitions (ParameterTypeEnum)."""
        return KFP_TYPES[self.type]

    @property
    def help(self) -> str:
        return self.declaration.metadata["help"]


KFP_TYPES = {
    str: "STRING",
    int: "NUMBER_INTEGER",
    float: "NUMBER_DOUBLE",
    bool: "BOOLEAN",
    dict: "STRUCT",
    List[str]: "LIST",
}


def _options_of(options: type, **fields_by_parameter: str) -> list[RunParameter]:
    return [RunParameter(name, options, field) for name, field in fields_by_parameter.items()]


PIPELINE_NAME = "llm-finetune"
# The evaluation generates with both models on one GPU when training has GPUs (on the CPU otherwise).
EVALUATE_GPUS = 1

# Every trainer option is a run parameter under its own name, except what the train step sets itself.
TRAINING_OPTIONS = [spec.name for spec in dataclasses.fields(TrainConfig) if spec.name not in SET_BY_THE_LAUNCHER]

# In the order of the run form.
RUN_PARAMETERS: tuple[RunParameter, ...] = (
    *_options_of(RunInputs, dataset_uri="dataset_uri", data_connection_secret="data_connection_secret"),
    *_options_of(
        PrepareOptions,
        eval_fraction="eval_fraction",
        split_seed="seed",
        max_reject_fraction="max_reject_fraction",
        system_prompt="system_prompt",
        field_map="field_map",
    ),
    *_options_of(RunInputs, force="force", base_model="base_model"),
    *_options_of(TrainConfig, **{name: name for name in TRAINING_OPTIONS}),
    *_options_of(
        LaunchOptions,
        training_backend="backend",
        training_nodes="nodes",
        gpus_per_node="gpus_per_node",
        gpu_memory="gpu_memory",
        training_cpu="cpu",
        training_memory="memory",
        training_shm_size="shm_size",
        node_selector="node_selector",
        tolerations="tolerations",
        training_timeout_minutes="timeout_minutes",
        training_start_timeout_minutes="start_timeout_minutes",
        start_timeout_includes_queue="count_queue_time",
        training_backoff_limit="backoff_limit",
        queue_name="queue_name",
        priority_class="priority_class",
        trainjob_runtime="trainjob_runtime",
        training_grace_period_seconds="termination_grace_seconds",
    ),
    *_options_of(
        EvaluateOptions,
        extra_questions="extra_questions",
        eval_max_new_tokens="max_new_tokens",
        eval_score_rows="score_rows",
        eval_batch_size="batch_size",
    ),
    *_options_of(TokeniseOptions, eval_max_rows="eval_max_rows"),
    *_options_of(
        EvaluateOptions,
        min_eval_loss_improvement="min_eval_loss_improvement",
        min_improvement_over_published="min_improvement_over_published",
    ),
    *_options_of(
        ExportStageOptions,
        model_name="model_name",
        gguf_outtype="outtype",
        gguf_lora_adapter="include_lora",
        gguf_thresholds="thresholds",
    ),
    *_options_of(
        PublishOptions,
        hub_repo_id="repo_id",
        hub_private="private",
        publish_merged="include_merged",
        publish_adapter="include_adapter",
        model_license="license",
    ),
    *_options_of(
        WorkspaceOptions,
        pvc_name="pvc_name",
        pvc_size="pvc_size",
        pvc_storage_class="pvc_storage_class",
        keep_pvc="keep_pvc",
    ),
    *_options_of(StepResources, **{spec.name: spec.name for spec in dataclasses.fields(StepResources)}),
)

# Each options dataclass's validation: field name -> problem, read from any object with the fields
# (the values are checked before the dataclass, whose __post_init__ may refuse them, is built).
VALIDATION: dict[type, Callable[[Any], dict[str, str]]] = {
    RunInputs: inputs_problems,
    PrepareOptions: prepare_problems,
    TrainConfig: training_problems,
    LaunchOptions: launch_problems,
    TokeniseOptions: tokenise_problems,
    EvaluateOptions: evaluate_problems,
    ExportStageOptions: export_problems,
    PublishOptions: publish_problems,
    WorkspaceOptions: workspace_problems,
    StepResources: resources_problems,
}


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
    """What a publish must hold for the next run's evaluation to load it as the model to beat."""
    if not all(name in values for name in ("method", "publish_merged", "publish_adapter")) or values["publish_merged"]:
        return {}
    if values["method"] == "full":
        why = "method is full, whose only weights are the merged checkpoint"
    elif not values["publish_adapter"]:
        why = "publish_adapter is false too"
    else:
        return {}
    return {
        "publish_merged": f"is false and {why}: the repository would hold only GGUF files, which the next run's "
        "evaluation cannot load to compare its model with the published one. Set publish_merged to true"
    }


def parameter_name(options: type, field: str) -> str:
    """The run-form name of ``options.<field>``: what a message tells the user to change."""
    return next(
        parameter.name for parameter in RUN_PARAMETERS if (parameter.options, parameter.field) == (options, field)
    )


def arguments_for(options: type, run: dict[str, Any]) -> dict[str, Any]:
    """The run parameters that ``options`` declares, from ``run`` (name -> value), keyed by field name."""
    return {parameter.field: run[parameter.name] for parameter in RUN_PARAMETERS if parameter.options is options}


def problems(values: dict[str, Any]) -> list[str]:
    """One line per invalid parameter among ``values`` (run parameter name -> value), in run-form order."""
    found: dict[str, str] = {}
    for options, validation in VALIDATION.items():
        given = {p.field: values[p.name] for p in RUN_PARAMETERS if p.options is options and p.name in values}
        if not given:
            continue
        fields = {spec.name: default_of(spec) for spec in dataclasses.fields(options)}
        stage_problems = validation(SimpleNamespace(**{**fields, **given}))
        for parameter in RUN_PARAMETERS:
            if parameter.options is options and parameter.field in given and parameter.field in stage_problems:
                found[parameter.name] = stage_problems[parameter.field]
    for name, rule in PIPELINE_RULES.items():
        problem = rule(values[name]) if name in values else None
        if problem:
            found[name] = problem
    found.update(_job_rules(values))
    found.update(_publish_rules(values))
    return [f"parameter '{p.name}' {found[p.name]}" for p in RUN_PARAMETERS if p.name in found]


def validate(values: dict[str, Any]) -> None:
    """Raise ``UserError`` listing every invalid parameter."""
    found = problems(values)
    if found:
        raise UserError("The run parameters are invalid: " + "; ".join(found) + ". Fix them and start the run again.")


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


def docstring(summary: str) -> str:
    """``summary`` and a Google-style ``Args:`` section: where KFP reads each parameter's description."""
    return summary + "\n\nArgs:\n" + "".join(f"    {p.name}: {p.help}\n" for p in RUN_PARAMETERS)


def shown_default(value: Any) -> str:
    """A default as the README shows it: empty, or the value as it is typed into the run form."""
    if value == "":
        return "empty"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{json.dumps(value) if isinstance(value, (bool, list, dict)) else value}`"


def readme_table() -> str:
    """The README's run-parameter table, row for row."""
    rows = [f"| `{p.name}` | {shown_default(p.default)} | {p.help} |" for p in RUN_PARAMETERS]
    return "\n".join(["| parameter | default | meaning |", "| --- | --- | --- |", *rows]) + "\n"
