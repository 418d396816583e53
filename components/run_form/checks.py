"""The first pipeline step's checks: every run parameter's value, by its stage's rules and across stages.

The step fails in seconds naming every bad parameter, instead of an hour later
in a training pod; ``python -m pipelines.run`` and ``submit`` run the same
checks before a run starts. Each stage's own rules are its options module's
``option_problems``; the rules here are the ones a whole run adds. This module
imports no KFP: the first pipeline step imports it in its pod.

Inside that pod (and kfp.local's step process) the step also checks the Secrets
the run needs (``secret_problems``): the pipeline gives the first step the same
optional Secrets as the steps that use them, so a missing one is named here,
before any data is touched, instead of letting a later step skip what it
guards. Only their presence is checked; no value is printed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping

from common.cli_options import default_of
from common.errors import UserError, exit_on_user_error
from components.benchmark_tasks.tasks import task_entries
from components.data.mixture import parse_sources
from components.data.sources import (
    SECRET_URI,
    URL_ENV,
    credential_problem,
    scheme_problem,
    secret_reference_problem,
    secret_url_problem,
)
from components.hub_auth import missing_secrets, missing_secrets_problem
from components.publish.options import PublishOptions
from components.run_form.options import RunInputs
from components.run_form.table import RUN_FORM, RUN_PARAMETERS, run_parameters_of
from components.serve.options import pull_secret_problem
from components.train.options import parse_node_selector, parse_tolerations, sharding_problem
from trainer.config import packages_needed
from trainer.methods import METHODS


def _held_out_fraction(value: float) -> str | None:
    if 0.0 < value < 1.0:
        return None
    return f"must be above 0 and below 1 (got {value}): the evaluation stage compares the models on the held-out rows"


# Rules a pipeline run adds to a stage's own: the data stage alone may hold nothing out, the DAG may not.
PIPELINE_RULES: dict[str, Callable[[Any], str | None]] = {"eval_fraction": _held_out_fraction}


def _input_rules(values: dict[str, Any]) -> dict[str, str]:
    """A dataset URL that carries a credential is never a run parameter: KFP keeps parameters in the run's record
    and shows them in the UI and the pods' arguments. It comes from the data connection Secret instead. The same
    holds for each source of ``dataset_sources``."""
    found = {}
    for name, uri in _dataset_uris(values):
        secret = _data_connection_secret(values)
        problem = (
            secret_reference_problem(uri)
            or credential_problem(
                uri,
                f"Put the URL in the key {URL_ENV} of the data connection Secret ({secret}, named by "
                f"data_connection_secret): `oc create secret generic {secret} --from-literal={URL_ENV}=<url>` (or add "
                f"the key to the existing Secret), and "
                + (
                    f"set dataset_uri to {SECRET_URI}"
                    if name == "dataset_uri"
                    else f"make {SECRET_URI} that source's uri"
                ),
            )
            or scheme_problem(uri)  # after the credential: a leaked one is the more urgent fix
        )
        if problem:
            found.setdefault(name, _about(name, problem))
    return found


def _about(name: str, problem: str) -> str:
    """A problem with one source of dataset_sources reads as the list's ("has a source that is ...")."""
    return problem if name == "dataset_uri" else f"has a source that {problem}"


def _dataset_uris(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(parameter name, URI) for each dataset URI the run reads: dataset_uri, and each source of dataset_sources
    (none when the list does not parse; its own check says why)."""
    uris = [("dataset_uri", values["dataset_uri"])] if "dataset_uri" in values else []
    try:
        sources = parse_sources(values.get("dataset_sources", ""))
    except ValueError:
        sources = ()
    return uris + [("dataset_sources", source.uri) for source in sources]


def _data_connection_secret(values: dict[str, Any]) -> str:
    return values.get("data_connection_secret") or RunInputs().data_connection_secret


def _job_rules(values: dict[str, Any]) -> dict[str, str]:
    """Rules across the training options and the job's size."""
    found = {}
    names = ("sharding", "training_nodes", "gpus_per_node")
    if all(name in values for name in names):
        problem = sharding_problem(*(values[name] for name in names))
        if problem:
            found["sharding"] = problem
    if values.get("gpus_per_node") == 0:
        for field, needs in packages_needed(values).items():
            if needs.cuda:
                found.setdefault(
                    field,
                    f"is {values[field]}, which runs only on NVIDIA GPUs, and gpus_per_node is 0 (the training pods "
                    f"get none): {needs.alternative}, or give the training pods GPUs",
                )
    return found


def _publish_rules(values: dict[str, Any]) -> dict[str, str]:
    """What a publish must hold for the next run's evaluation to load it as the model to beat.

    ``publish_merged`` auto follows the method and ``publish_adapter``; only an explicit false can leave the
    repository without loadable weights.
    """
    if values.get("publish_merged") != "false" or not all(name in values for name in ("method", "publish_adapter")):
        return {}
    if values["method"] in METHODS and not METHODS[values["method"]].trains_adapter:
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
    # publish's own rule for what auto means (only the methods that train an adapter have one); an invalid value is
    # named by publish's option_problems.
    publish = SimpleNamespace(publish_merged=values["publish_merged"], publish_adapter=values["publish_adapter"])
    method = METHODS.get(values["method"])
    merged = PublishOptions.publishes_merged(publish, adapter_trained=method is None or method.trains_adapter)
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


# Where a run sends its model besides its own workspace PVC: the copies that outlive the PVC.
DELIVERY_TARGETS = ("hub_repo_id", "model_s3_uri", "model_oci_uri")


def _delivered_elsewhere(values: dict[str, Any]) -> bool:
    return any(values[name] for name in DELIVERY_TARGETS)


def _workspace_rules(values: dict[str, Any]) -> dict[str, str]:
    """keep_pvc false deletes the PVC this run creates once the run succeeds; with no target that is the only
    copy of a model that passed its gate, so it is refused before anything runs."""
    if not all(name in values for name in ("keep_pvc", "pvc_name", *DELIVERY_TARGETS)):
        return {}
    if values["keep_pvc"] != "false" or values["pvc_name"] or _delivered_elsewhere(values):
        return {}
    return {
        "keep_pvc": "is false, but the run sends its model to no Hub repository, S3 bucket or OCI registry "
        "(hub_repo_id, model_s3_uri and model_oci_uri are empty): a successful run would delete its workspace PVC "
        "and with it the only copy of the model that passed its gate. Set keep_pvc to auto or true, or set one of "
        "those targets"
    }


def keeps_workspace(values: dict[str, Any]) -> tuple[bool, str]:
    """Whether the PVC a successful run creates outlives it, and the line that says why in the first step's log
    (keep_pvc auto decides by where the model goes, so the log must say which way it went). A local run has no
    PVC, and its log says so through "on a cluster"."""
    choice, prefix = values["keep_pvc"], "workspace PVC (on a cluster): "
    if values["pvc_name"]:
        return True, prefix + f"{values['pvc_name']} (pvc_name), yours: the run never deletes it"
    if choice == "true":
        return True, prefix + "kept after the run (keep_pvc true)"
    if choice == "false" or _delivered_elsewhere(values):
        targets = ", ".join(name for name in DELIVERY_TARGETS if values[name]) or "none"
        return False, prefix + f"deleted after a successful run (keep_pvc {choice}; the model goes to {targets})"
    return True, prefix + (
        "kept after the run (keep_pvc auto: hub_repo_id, model_s3_uri and model_oci_uri are empty, so the PVC holds "
        "the only copy of the model; delete it with `oc delete pvc` once you have copied it)"
    )


def _pull_secret_rules(values: dict[str, Any]) -> dict[str, str]:
    """KServe's pods never pull with the store step's push Secret (``pull_secret_problem``)."""
    if not all(name in values for name in ("model_oci_pull_secret", "model_oci_secret")):
        return {}
    problem = pull_secret_problem(values["model_oci_pull_secret"], values["model_oci_secret"])
    return {"model_oci_pull_secret": problem} if problem else {}


def _benchmark_rules(values: dict[str, Any]) -> dict[str, str]:
    """The registry names in benchmark_tasks must be lm-eval's: a misspelt task fails here, not after training. A
    local task directory is checked by the evaluate step, which mounts the workspace it lives on."""
    if "benchmark_tasks" not in values:
        return {}
    from components.benchmark_tasks.tasks import is_local, registry_problem

    named = [entry for entry in task_entries(values["benchmark_tasks"]) if not is_local(entry)]
    problem = registry_problem(named)
    return {"benchmark_tasks": problem} if problem else {}


def problems(values: dict[str, Any]) -> list[str]:
    """One line per invalid parameter among ``values`` (run parameter name -> value), in run-form order."""
    return _lines(_problems_by_name(values))


def _lines(found: dict[str, str]) -> list[str]:
    return [f"parameter '{p.name}' {found[p.name]}" for p in RUN_PARAMETERS if p.name in found]


def _problems_by_name(values: dict[str, Any]) -> dict[str, str]:
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
    found.update(_input_rules(values))
    found.update(_job_rules(values))
    found.update(_publish_rules(values))
    found.update(_target_rules(values))
    found.update(_workspace_rules(values))
    found.update(_pull_secret_rules(values))
    if "benchmark_tasks" not in found:
        found.update(_benchmark_rules(values))
    return found


def validate(values: dict[str, Any]) -> None:
    """Raise ``UserError`` listing every invalid parameter."""
    _refuse(problems(values))


def _refuse(found: list[str]) -> None:
    if found:
        raise UserError("The run parameters are invalid: " + "; ".join(found) + ". Fix them and start the run again.")


def secret_problems(values: dict[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Run parameter name -> what is wrong, for each Secret the run needs that is not in ``environ``, the first
    step's environment.

    Only meaningful where the Secrets are mounted as they are for the steps that use them: the first step's pod
    (pipelines/fine_tune.py gives it the same optional Secrets, the two Hub tokens under two names, since both
    are HF_TOKEN where they are used) and a local run, whose steps all share this environment
    (``components.hub_auth.one_token_for_every_step``). With hub_repo_id set both Hub Secrets are needed: the
    reading steps must read the published model, and the publish step must write it. ``python -m
    pipelines.submit`` renders a run for another machine, so it does not call this. Presence only (and the
    dataset URL's scheme): no value is tried against its service here, or printed.
    """
    found = {}
    repo_id = values.get("hub_repo_id")
    missing = missing_secrets(environ) if repo_id else []
    if missing:
        found["hub_repo_id"] = missing_secrets_problem(repo_id, missing)
    for name, uri in _dataset_uris(values):
        if str(uri).strip() == SECRET_URI:
            problem = _dataset_url_problem(_data_connection_secret(values), environ.get(URL_ENV, "").strip())
            if problem:
                found[name] = _about(name, problem)
    return found


def _dataset_url_problem(secret: str, url: str) -> str | None:
    """Why ``dataset_uri`` secret:DATASET_URL cannot be read, given the URL found in the environment (never shown
    beyond its scheme, host and path)."""
    if not url:
        return (
            f"is {SECRET_URI}, but the key {URL_ENV} of the Secret '{secret}' (data_connection_secret) is missing, "
            f"or the Secret is: add the key with the dataset's URL (`oc create secret generic {secret} "
            f"--from-literal={URL_ENV}=<url>`, or add it to the existing Secret; for a local run, export {URL_ENV})"
        )
    problem = secret_url_problem(url)
    return f"is {SECRET_URI}, but the URL in the key {URL_ENV} of the Secret '{secret}' {problem}" if problem else None


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
    for field, needs in packages_needed(values).items():
        if importlib.util.find_spec(needs.module) is None:
            found.append(
                f"parameter '{field}' is {values[field]}, which needs the {needs.module} package, and the runtime "
                f"image (which the training pods run too) does not install it: {needs.alternative}, or build the "
                f"image with {needs.module}{' for CUDA' if needs.cuda else ''}"
            )
    return found


def tracking_problems(values: dict[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Run parameter name -> why the MLflow server ``mlflow_tracking_uri`` names cannot track this run: with the
    credentials of the first step's environment (the Secret mlflow_secret names, mounted as in the steps that log),
    its experiment is read or created, must not be deleted, and must keep artifacts where the server takes uploads.
    A run is refused here, in seconds, rather than training for hours with nowhere to log. ``values`` holds every
    run parameter, as the first step gets them."""
    uri = values.get("mlflow_tracking_uri", "")  # absent from the values of a check by hand: no tracking
    if not uri.strip():
        return {}
    secret, experiment = values["mlflow_secret"], values["mlflow_experiment"]
    from common.tracking import MlflowError, MlflowServer, artifact_path

    fix = "; or clear mlflow_tracking_uri to run without MLflow"
    try:
        server = MlflowServer.from_environment(uri, environ)
    except ValueError as refused:
        return {
            "mlflow_tracking_uri": f"is {uri}, but the credentials in the Secret '{secret}' (mlflow_secret) "
            f"{str(refused).removeprefix('its credentials ')}: use the server's https:// address, or empty the "
            f"Secret's token and password if the server needs no login{fix}"
        }
    try:
        location = server.experiment(experiment).get("artifact_location", "")
    except MlflowError as error:
        return {
            "mlflow_tracking_uri": f"is {uri}, but the MLflow server there cannot track this run ({error}): check "
            f"the address (the MLflow UI's, without /#/...), that the server runs, and the credentials in the Secret "
            f"'{secret}' (mlflow_secret: MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
            f"MLFLOW_TRACKING_PASSWORD, and MLFLOW_WORKSPACE where the server has workspaces){fix}"
        }
    try:
        artifact_path(location)
    except ValueError as refused:
        return {
            "mlflow_experiment": f"is {experiment!r}, whose artifacts go to {location}: the report could not be "
            f"uploaded ({refused}). Name another mlflow_experiment (created with the server's own artifact store), or "
            "clear mlflow_tracking_uri to run without MLflow"
        }
    return {}


@exit_on_user_error
def check_in_pipeline(values: dict[str, Any]) -> None:
    """What the first step runs: every parameter's rules, the Secrets the run needs and the MLflow server it logs
    to, then the image's packages."""
    found = _problems_by_name(values)
    if not found:  # a run refused anyway is not worth a call to the server (which may create the experiment)
        found = tracking_problems(values)
    _refuse(_lines({**secret_problems(values), **found}))
    found = runtime_image_problems(values)
    if found:
        raise UserError("The run parameters ask for what this image cannot do: " + "; ".join(found) + ".")
    print("run parameters are valid", flush=True)
