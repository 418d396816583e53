"""Serving stage: the KServe InferenceService of the stored version, written for oc apply, or deployed and tried.

    python -m components.serve.stage --workspace-root local-run/workspace --run-id RUN --model-name smol-ft

Always (when the version was stored and holds the merged checkpoint) it writes
``serve/inferenceservice.yaml``. With ``deploy`` it checks that the registry
lets the service's pods pull the image with the pull Secret (``pull_check``),
creates or updates that InferenceService in the run's namespace, waits until
it is Ready, asks it the evaluation's first sample question, and records the
endpoint and the answer in ``serve/served.json``, the run summary and, when
the version was registered, the Model Registry.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from common.atomic import write_text_atomic
from common.cli_options import add_options, options_from, options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.kube import API_RETRIES, SERVICE_ACCOUNT_NAMESPACE, connect, default_namespace
from common.records import Registration, SampleAnswers, Served, StoredCopy
from common.run_layout import (
    EVALUATE,
    PUBLISH,
    REGISTER,
    REGISTERED,
    SAMPLE_RESPONSES,
    SERVE,
    SERVED,
    SERVICE_MANIFEST,
    UPLOAD,
    stage_dir,
)
from components.champion.record import completed_at, completes
from components.champion.version import MERGED_CONFIG, stored_copies, trained_from
from components.export.options import model_name_of
from components.register.catalogue import add_version_properties
from components.register.options import RegistryOptions
from components.register.stage import connection
from components.serve.deploy import roll_out, smoke_test
from components.serve.manifest import render_inference_service
from components.serve.options import ServingOptions
from components.serve.pull_check import check_pull

DEFAULT_QUESTION = "In one sentence, what can you help me with?"


@completes(SERVE)
def serve(
    workspace_root: str,
    run_id: str,
    model_name: str,
    options: ServingOptions,
    s3_secret: str,
    registry: RegistryOptions,
) -> Served | None:
    """Write the InferenceService of run ``run_id``'s stored version; deploy and try it when ``options.deploy``.

    ``s3_secret``: the S3 data connection the version was stored with. The image is pulled with
    ``options.pull_secret``, which the registry must accept before anything is applied."""
    serve_dir = stage_dir(workspace_root, run_id, SERVE)
    Served.write(serve_dir / SERVED, None)
    copies = stored_copies(workspace_root, run_id)
    problem = _unservable(copies, stage_dir(workspace_root, run_id, PUBLISH) / UPLOAD)
    if problem and options.deploy:
        raise UserError(f"deploy is set, but the version cannot be served: {problem}")
    if problem:
        print(f"no InferenceService written: {problem}", flush=True)
        return None
    cluster = connect("deploy the InferenceService in", "Or leave deploy off.", API_RETRIES) if options.deploy else None
    namespace = cluster.namespace if cluster else _namespace()
    manifest = render_inference_service(model_name, namespace, run_id, copies, options, s3_secret)
    write_text_atomic(serve_dir / SERVICE_MANIFEST, yaml.safe_dump(manifest, sort_keys=False))
    print(f"InferenceService written to {serve_dir / SERVICE_MANIFEST} (oc apply -f it to serve the version)")
    if not cluster:
        return None
    check_pull(manifest)
    question = _question(workspace_root, run_id)  # the smoke test is part of the rollout: failing, it is rolled back
    served = roll_out(cluster, manifest, options.timeout_s, serve_dir, lambda service: smoke_test(service, question))
    Served.write(serve_dir / SERVED, served)
    _record_in_registry(workspace_root, run_id, served, registry)
    return served


def _unservable(copies: Sequence[StoredCopy], upload: Path) -> str | None:
    """Why the version cannot be served by KServe's vLLM runtime, or None."""
    if not any(copy.scheme in ("oci", "s3") for copy in copies):
        return "it was stored neither as an image nor in S3; set model_oci_uri or model_s3_uri"
    if not (upload / MERGED_CONFIG).is_file():
        return "it holds no merged checkpoint for vLLM to load; set publish_merged to true"
    return None


def _namespace() -> str:
    """The pipeline pod's namespace, else the kubeconfig's: where oc apply would put it."""
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return default_namespace()


def _question(workspace_root: str, run_id: str) -> str:
    """The evaluation's first sample question: one the model was tuned to answer."""
    samples = SampleAnswers.read(stage_dir(workspace_root, run_id, EVALUATE) / SAMPLE_RESPONSES)
    return next((sample.question for sample in samples.answers if sample.question), DEFAULT_QUESTION)


def _record_in_registry(workspace_root: str, run_id: str, served: Served, registry: RegistryOptions) -> None:
    registration = Registration.read(stage_dir(workspace_root, run_id, REGISTER) / REGISTERED)
    if not registration or not registry.url:
        return
    properties = {
        "serving_inference_service": f"{served.namespace}/{served.name}",
        "serving_endpoint": served.endpoint,
        "serving_question": served.question,
        "serving_answer": served.answer,
    }
    add_version_properties(connection(registry), registration.model_version_id, properties)


def summary(served: Served | None) -> str:
    if served is None:
        return "not deployed (deploy is off, or nothing to serve)"
    return (
        f"served at {served.endpoint} ({served.namespace}/{served.name}); asked {served.question!r}: {served.answer!r}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.serve.stage",
        description="Write, or deploy and try, the KServe InferenceService of a run's stored version.",
    )
    parser.add_argument("--workspace-root", required=True, help="the workspace holding runs/<run-id>/")
    parser.add_argument("--run-id", required=True, help="the run whose stored version to serve")
    parser.add_argument("--model-name", required=True, help="the model's name (the InferenceService's)")
    parser.add_argument("--s3-secret", default="aws-connection-models", help="the data connection of the S3 copy")
    parser.add_argument("--registry-url", default="", help="the Model Registry to record the endpoint in")
    parser.add_argument(
        "--registry-use-service-account",
        action="store_true",
        help="present the pod's service-account token to the registry when $MODEL_REGISTRY_TOKEN is unset (https only)",
    )
    parser.add_argument(
        "--registry-allow-http",
        action="store_true",
        help="send the registry token over plain http to a host that is not this machine (an mTLS service mesh only)",
    )
    add_options(parser, ServingOptions)
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    options = options_from(args, ServingOptions)
    registry = RegistryOptions(
        url=args.registry_url,
        use_service_account=args.registry_use_service_account,
        allow_http=args.registry_allow_http,
    )
    print(summary(serve(args.workspace_root, args.run_id, args.model_name, options, args.s3_secret, registry)))


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> str:
    """What the ``serve_model`` component calls with every input by name; returns the endpoint (empty: none). A
    version already served (a retried step, or a run finishing the published version's steps) is not served
    again."""
    if done := completed_at(inputs["workspace_root"], inputs["run_id"], SERVE):
        print(f"run {inputs['run_id']}'s version was served already, at {done}: not served again", flush=True)
        served = Served.read(stage_dir(inputs["workspace_root"], inputs["run_id"], SERVE) / SERVED)
        return served.endpoint if served else ""
    model_name = model_name_of(inputs["model_name"], trained_from(Path(inputs["train_dir"])))
    options = options_from_inputs(ServingOptions, inputs)
    registry = RegistryOptions(
        url=inputs["registry_url"],
        secret=inputs["registry_secret"],
        use_service_account=inputs["registry_use_service_account"],
        allow_http=inputs["registry_allow_http"],
    )
    served = serve(inputs["workspace_root"], inputs["run_id"], model_name, options, inputs["s3_secret"], registry)
    print(summary(served), flush=True)
    return served.endpoint if served else ""


if __name__ == "__main__":
    main()
