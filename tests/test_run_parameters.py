"""Each run parameter is declared once, in its stage's options dataclass; everything else equals that declaration.

KFP needs literal Python where it reads signatures: the pipeline function (the
run form) and the step functions, whose source is shipped to the pods. These
tests prove those literals, the compiled descriptions and the README table equal
``components.parameters.RUN_PARAMETERS``, which derives from the dataclasses.
"""

from __future__ import annotations

import inspect
import re

import pytest
import yaml
from conftest import REPO_ROOT

from components import steps
from components.dataprep.options import PrepareOptions
from components.evaluation.options import EvaluateOptions
from components.export.options import ExportStageOptions
from components.parameters import RUN_PARAMETERS, readme_table
from components.publish.options import PublishOptions
from components.run_options import RunInputs
from components.training.options import LaunchOptions
from pipelines.fine_tune import build_pipeline
from pipelines.tasks import validate_parameters
from pipelines.workspace import ClusterWorkspace
from trainer.config import TrainConfig

# Which options each step takes under their field names.
STEP_OPTIONS = [
    (steps.prepare_dataset, PrepareOptions),
    (steps.train_model, TrainConfig),
    (steps.train_model, LaunchOptions),
    (steps.evaluate_model, EvaluateOptions),
    (steps.export_gguf, ExportStageOptions),
    (steps.publish_model, PublishOptions),
]
# The run's inputs, shared by several steps under the same names.
RUN_INPUT_STEPS = {
    "dataset_uri": [steps.prepare_dataset, steps.publish_model],
    "force": [steps.check_data_changed, steps.evaluate_model],
    "base_model": [steps.train_model, steps.publish_model],
    "data_connection_secret": [],  # a setting of the prepare step's pod, not an input (tests/test_compile.py)
}


def test_every_parameter_has_one_declaration_with_help():
    names = [parameter.name for parameter in RUN_PARAMETERS]
    assert len(names) == len(set(names))
    declared = [(parameter.options, parameter.field) for parameter in RUN_PARAMETERS]
    assert len(declared) == len(set(declared)), "two run parameters set the same stage option"
    for parameter in RUN_PARAMETERS:
        assert len(parameter.help.split()) >= 4, parameter.name


def test_the_pipeline_signature_is_the_table():
    """Names in run-form order, KFP types and defaults: the literal signature of the run form equals the table."""
    pipeline_function = build_pipeline(ClusterWorkspace()).pipeline_func
    signature = inspect.signature(pipeline_function).parameters
    assert list(signature) == [parameter.name for parameter in RUN_PARAMETERS]
    for parameter in RUN_PARAMETERS:
        assert signature[parameter.name].annotation == parameter.type, parameter.name
        assert signature[parameter.name].default == parameter.default, parameter.name


@pytest.mark.parametrize(("step", "options"), STEP_OPTIONS, ids=lambda value: getattr(value, "__name__", ""))
def test_each_step_takes_its_options_by_field_name_and_type(step, options):
    """The DAG passes ``arguments_for(options, run)``; the step's literal inputs must be exactly those fields."""
    signature = inspect.signature(step.python_func).parameters
    for parameter in (parameter for parameter in RUN_PARAMETERS if parameter.options is options):
        assert parameter.field in signature, (step.name, parameter.field)
        assert signature[parameter.field].annotation == parameter.type, (step.name, parameter.field)
        assert signature[parameter.field].default is inspect.Parameter.empty, (step.name, parameter.field)


def test_the_tables_kfp_types_are_the_compiled_pipelines():
    """``render`` types --param values from the table; ``run`` and ``submit`` from the pipeline: the same types."""
    from components.run_params import declared_parameters

    pipeline = build_pipeline(ClusterWorkspace())
    assert {parameter.name: parameter.kfp_type for parameter in RUN_PARAMETERS} == declared_parameters(pipeline)


def test_the_run_inputs_reach_their_steps_by_name_and_type():
    inputs = {parameter.field: parameter for parameter in RUN_PARAMETERS if parameter.options is RunInputs}
    assert set(inputs) == set(RUN_INPUT_STEPS)
    for name, takers in RUN_INPUT_STEPS.items():
        for step in takers:
            assert inspect.signature(step.python_func).parameters[name].annotation == inputs[name].type, step.name


def test_the_first_step_takes_every_run_parameter():
    signature = inspect.signature(validate_parameters.python_func).parameters
    assert {name: value.annotation for name, value in signature.items()} == {
        parameter.name: parameter.type for parameter in RUN_PARAMETERS
    }


def test_the_run_form_shows_each_declared_help_text():
    """What OpenShift AI shows beside each field of the run form is the dataclass's help, in the committed YAML."""
    spec = next(yaml.safe_load_all((REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml").read_text()))
    compiled = spec["root"]["inputDefinitions"]["parameters"]
    for parameter in RUN_PARAMETERS:
        assert " ".join(compiled[parameter.name]["description"].split()) == parameter.help, parameter.name
        assert compiled[parameter.name].get("defaultValue", "") == parameter.default, parameter.name


def test_the_readme_table_is_the_declarations():
    """Users read the README before filling the form: its table is generated text, checked here row for row."""
    readme = (REPO_ROOT / "README.md").read_text()
    table = readme_table()
    assert table in readme, "README's run-parameter table is stale: paste components.parameters.readme_table()"


def test_cli_help_comes_from_the_same_declaration():
    """``python -m trainer --help`` and the run form describe an option in the same words."""
    from trainer.config import build_parser

    help_text = " ".join(build_parser().format_help().split())
    for parameter in (parameter for parameter in RUN_PARAMETERS if parameter.options is TrainConfig):
        assert " ".join(parameter.help.split()) in help_text, parameter.name
    assert re.search(r"--lora-r LORA_R", help_text)
