"""Every run parameter, in the order of the run form, read off the options dataclasses' fields.

The run form is one flat list; which stage option each entry sets, and under
what name, is declared on the option's field (``run_option``). Adding a run
parameter is adding such a field: the pipeline's signature, the steps'
arguments, the first step's checks and the reference page follow from this
table. This module imports no KFP: the first pipeline step imports it in its pod.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable, List

from common.cli_options import default_of, run_form_names
from components.data.options import PrepareOptions
from components.data.options import option_problems as prepare_problems
from components.evaluate.options import EvaluateOptions
from components.evaluate.options import option_problems as evaluate_problems
from components.export.options import ExportStageOptions
from components.export.options import option_problems as export_problems
from components.publish.options import PublishOptions
from components.publish.options import option_problems as publish_problems
from components.register.options import RegistryOptions
from components.register.options import option_problems as registry_problems
from components.run_form.options import (
    RunInputs,
    StepResources,
    WorkspaceOptions,
    inputs_problems,
    resources_problems,
    workspace_problems,
)
from components.serve.options import ServingOptions
from components.serve.options import option_problems as serving_problems
from components.store.options import StorageOptions
from components.store.options import option_problems as storage_problems
from components.tokenise.options import TokeniseOptions
from components.tokenise.options import option_problems as tokenise_problems
from components.train.options import LaunchOptions, launch_problems
from trainer.config import TrainConfig
from trainer.config import option_problems as training_problems

PIPELINE_NAME = "llm-finetune"

# The options dataclasses whose run_option fields make up the run form, in its order, each with its stage's
# validation: field name -> problem, read from any object with the fields (the first step checks the values
# before building the dataclass, whose __post_init__ may refuse them).
RUN_FORM: tuple[tuple[type, Callable[[Any], dict[str, str]]], ...] = (
    (RunInputs, inputs_problems),
    (PrepareOptions, prepare_problems),
    (TrainConfig, training_problems),
    (LaunchOptions, launch_problems),
    (TokeniseOptions, tokenise_problems),
    (EvaluateOptions, evaluate_problems),
    (ExportStageOptions, export_problems),
    (PublishOptions, publish_problems),
    (StorageOptions, storage_problems),
    (RegistryOptions, registry_problems),
    (ServingOptions, serving_problems),
    (WorkspaceOptions, workspace_problems),
    (StepResources, resources_problems),
)
RUN_FORM_OPTIONS = tuple(options for options, _ in RUN_FORM)

KFP_TYPES = {
    str: "STRING",
    int: "NUMBER_INTEGER",
    float: "NUMBER_DOUBLE",
    bool: "BOOLEAN",
    dict: "STRUCT",
    List[str]: "LIST",
}


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


def run_parameters_of(options: type) -> tuple[RunParameter, ...]:
    """The run parameters that ``options`` declares, in field order."""
    return tuple(RunParameter(name, options, field) for field, name in run_form_names(options).items())


RUN_PARAMETERS: tuple[RunParameter, ...] = tuple(
    parameter for options in RUN_FORM_OPTIONS for parameter in run_parameters_of(options)
)


def arguments_for(options: type, run: dict[str, Any]) -> dict[str, Any]:
    """The run parameters that ``options`` declares, from ``run`` (name -> value), keyed by field name."""
    return {parameter.field: run[parameter.name] for parameter in run_parameters_of(options)}
