"""A successful run never deletes the only copy of its model: keep_pvc false with nowhere else for the model to
go is refused by the first step, and keep_pvc auto (the default) keeps the PVC exactly when it holds that copy.

The DAG's DeletePVC runs under the first step's ``keep_workspace`` output (tests/test_compile.py follows the
guard); here is what decides it, in the function and in the step's real process.
"""

from __future__ import annotations

import pytest
from first_step_run import paragraph, run_first_step

from components.run_form import command_line as run_params
from components.run_form.checks import keeps_workspace, problems
from pipelines.fine_tune import fine_tune_pipeline
from pipelines.first_step import validate_parameters

HUB = {"hub_repo_id": "team/assistant"}
S3 = {"model_s3_uri": "s3://models/assistant/"}
OCI = {"model_oci_uri": "oci://quay.io/team/assistant"}
REFUSAL = (
    "parameter 'keep_pvc' is false, but the run sends its model to no Hub repository, S3 bucket or OCI registry "
    "(hub_repo_id, model_s3_uri and model_oci_uri are empty): a successful run would delete its workspace PVC and "
    "with it the only copy of the model that passed its gate. Set keep_pvc to auto or true, or set one of those "
    "targets"
)


def defaults(**setting) -> dict:
    return {**run_params.defaults_of(fine_tune_pipeline), **setting}


def keep_pvc_problems(values: dict) -> list[str]:
    return [line for line in problems(values) if line.startswith("parameter 'keep_pvc'")]


def test_keep_pvc_false_with_no_target_is_refused():
    """The situation of a run that would end by deleting its model: refused, naming the three targets and the
    fix, before anything runs."""
    assert keep_pvc_problems(defaults(keep_pvc="false")) == [REFUSAL]


@pytest.mark.parametrize(
    "setting",
    [
        {"keep_pvc": "false", **HUB},
        {"keep_pvc": "false", **S3},
        {"keep_pvc": "false", **OCI},
        {"keep_pvc": "false", "pvc_name": "team-workspace"},  # the user's own PVC is never deleted
        {"keep_pvc": "auto"},
        {"keep_pvc": "true"},
    ],
    ids=["hub", "s3", "oci", "existing-pvc", "auto", "true"],
)
def test_keep_pvc_false_is_fine_once_the_model_goes_elsewhere(setting):
    assert keep_pvc_problems(defaults(**setting)) == []


def test_keep_pvc_takes_only_its_three_values():
    (line,) = keep_pvc_problems(defaults(keep_pvc="yes"))
    assert line == "parameter 'keep_pvc' must be one of auto, true, false (got 'yes')"


@pytest.mark.parametrize(
    ("setting", "kept", "says"),
    [
        ({}, True, "keep_pvc auto: hub_repo_id, model_s3_uri and model_oci_uri are empty"),
        (HUB, False, "keep_pvc auto; the model goes to hub_repo_id"),
        ({**S3, **OCI}, False, "keep_pvc auto; the model goes to model_s3_uri, model_oci_uri"),
        ({"keep_pvc": "true", **HUB}, True, "kept after the run (keep_pvc true)"),
        ({"keep_pvc": "false", **OCI}, False, "keep_pvc false; the model goes to model_oci_uri"),
        ({"keep_pvc": "false", "pvc_name": "team-ws"}, True, "team-ws (pvc_name), yours: the run never deletes it"),
    ],
    ids=["auto-nowhere", "auto-hub", "auto-s3-oci", "true", "false", "existing-pvc"],
)
def test_the_first_step_decides_and_says_whether_the_pvc_outlives_the_run(setting, kept, says):
    """auto deletes the PVC only once the model is somewhere else, true keeps it, false deletes it, and a PVC the
    user named is never deleted; the step's log line says which way it went."""
    keep, line = keeps_workspace(defaults(**setting))
    assert keep is kept
    assert line.startswith("workspace PVC (on a cluster): ")
    assert ("deleted after a successful run" in line) is not kept
    assert says in line


def test_the_first_step_returns_the_decision_the_dag_deletes_by():
    """``keep_workspace`` is the output DeletePVC's condition reads."""
    assert validate_parameters.python_func(**defaults(benchmark_tasks="")).keep_workspace is True
    assert validate_parameters.python_func(**defaults(benchmark_tasks="", **S3)).keep_workspace is False


def test_the_first_steps_pod_refuses_in_one_paragraph_and_logs_the_decision():
    """In the pod: the refusal is one ``error:`` paragraph with exit 2; the default run says in its log that the
    PVC will be kept, and why."""
    refused = run_first_step({"keep_pvc": "false"})
    assert refused.returncode == 2
    assert (
        paragraph(refused.stderr)
        == f"error: The run parameters are invalid: {REFUSAL}. Fix them and start the run again."
    )
    passed = run_first_step({})
    assert passed.returncode == 0, passed.stderr
    assert "workspace PVC (on a cluster): kept after the run (keep_pvc auto:" in passed.stdout
