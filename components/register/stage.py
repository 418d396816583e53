"""Registration stage: catalogue the run's version in the Model Registry, with where it went and its provenance.

    python -m components.register.stage --workspace-root local-run/workspace --run-id RUN \\
        --model-name smol-ft --model-registry-url http://127.0.0.1:8080

Runs after the store step: the version's artifacts are its S3 copy and modelcar
image (``store/stored.json``) and its Hub repository when it was uploaded
(the publish record). The token comes from ``$MODEL_REGISTRY_TOKEN`` (the
Secret model_registry_secret names, key ``token``), else, only when
model_registry_use_service_account asks for it and only over https, the pod's
service-account token; neither is ever printed or written, and neither goes
anywhere ``common.http_trust.token_may_go_to`` refuses.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping

from common.cli_options import add_options, options_from, options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.http_trust import token_may_go_to
from common.kube import SERVICE_ACCOUNT
from common.records import Registration
from common.run_layout import REGISTER, REGISTERED, stage_dir
from components.champion.record import completed_at, completes, read_record
from components.champion.version import MERGED_CONFIG, RunDirs, stored_copies, trained_from
from components.export.options import model_name_of
from components.register.catalogue import ArtifactSpec, Connection, register_version
from components.register.options import RegistryOptions
from components.register.provenance import version_properties
from components.store.s3_target import bucket_and_key

TOKEN_ENV = "MODEL_REGISTRY_TOKEN"
TOKEN_KEY = "token"  # the key of model_registry_secret the pipeline maps to TOKEN_ENV
SERVICE_ACCOUNT_HINT = "the token is the pod's service account's (model_registry_use_service_account)"


@completes(REGISTER)
def register(
    workspace_root: str, run_id: str, model_name: str, options: RegistryOptions, s3_secret: str, repo_id: str
) -> Registration | None:
    """Register run ``run_id``'s version when ``options.url`` is set; also recorded in ``register/registered.json``."""
    record_file = stage_dir(workspace_root, run_id, REGISTER) / REGISTERED
    if not options.url:
        Registration.write(record_file, None)
        return None
    dirs = RunDirs.of(workspace_root, run_id)
    properties = version_properties(dirs, run_id)
    artifacts = artifact_specs(workspace_root, run_id, model_name, s3_secret, repo_id, dirs.upload)
    if not artifacts:
        raise UserError(
            f"Run {run_id} has nothing to register: its version was stored nowhere a deployment can read it "
            "(set model_s3_uri or model_oci_uri) and not uploaded to the Hub (repo_id)."
        )
    registration = register_version(connection(options), model_name, run_id, properties, artifacts)
    Registration.write(record_file, registration)
    return registration


def registered_version_id(workspace_root: str, run_id: str) -> str:
    """The Model Registry version id ``register`` recorded for run ``run_id``; empty when it registered none."""
    registration = Registration.read(stage_dir(workspace_root, run_id, REGISTER) / REGISTERED)
    return registration.model_version_id if registration else ""


def artifact_specs(
    workspace_root: str, run_id: str, model_name: str, s3_secret: str, repo_id: str, upload: Path
) -> list[ArtifactSpec]:
    """One model artifact per place the version went: S3, the OCI registry, the Hub."""
    copies = stored_copies(workspace_root, run_id)
    # A serving runtime loads the merged checkpoint (vLLM); without one the version is its GGUF files.
    model_format = ("vLLM", "1") if (upload / MERGED_CONFIG).is_file() else ("gguf", "3")
    specs = []
    for copy in copies:
        storage = {"storage_key": s3_secret, "storage_path": bucket_and_key(copy.uri)[1]} if copy.scheme == "s3" else {}
        specs.append(ArtifactSpec(f"{model_name}-{copy.scheme}", copy.uri, *model_format, **storage))
    record = read_record(workspace_root, repo_id) if repo_id else None
    if record and record.uploaded and record.run_id == run_id:
        specs.append(ArtifactSpec(f"{model_name}-hf", f"hf://{record.repo_id}", *model_format))
    return specs


def connection(options: RegistryOptions) -> Connection:
    """How to reach ``options.url``: the token, where it came from (for an error), and the CA to trust
    (OpenShift's service CA for an in-cluster ``.svc`` URL, else the system's).

    The token is the Secret's; the pod's service-account token only when the user asked for it, and only over
    https: it is the pod's credential for the whole cluster, not one made for the registry.
    """
    service_ca = SERVICE_ACCOUNT / "service-ca.crt"
    custom_ca = str(service_ca) if service_ca.is_file() and ".svc" in options.url else None
    if token := os.environ.get(TOKEN_ENV, "").strip():
        hint = f"the token is the Secret '{options.secret}' (model_registry_secret), key '{TOKEN_KEY}'"
        return Connection(options.url, token, hint, custom_ca, options.allow_http)
    if options.use_service_account:
        return Connection(options.url, service_account_token(options), SERVICE_ACCOUNT_HINT, custom_ca)
    print(
        f"no {TOKEN_ENV} (Secret '{options.secret}') and model_registry_use_service_account is false: calling the "
        "registry without a token",
        flush=True,
    )
    hint = (
        f"no token was sent (give one in the Secret '{options.secret}', key '{TOKEN_KEY}', or set "
        "model_registry_use_service_account to true)"
    )
    return Connection(options.url, None, hint, custom_ca, options.allow_http)


def service_account_token(options: RegistryOptions) -> str:
    """The pod's service-account token, once the registry's URL is https (the token's only way out)."""
    if why := token_may_go_to(options.url, https_only=True):
        raise UserError(
            f"model_registry_use_service_account is true, but model_registry_url {why}: the pod's service-account "
            "token is its credential for the whole cluster. Use the registry's https endpoint, or give a token in "
            f"the Secret '{options.secret}' (model_registry_secret, key '{TOKEN_KEY}')."
        )
    path = SERVICE_ACCOUNT / "token"
    if not path.is_file():
        raise UserError(
            f"model_registry_use_service_account is true, but this pod has no service-account token ({path}): "
            f"give a token in the Secret '{options.secret}' (model_registry_secret, key '{TOKEN_KEY}') instead."
        )
    print(f"no {TOKEN_ENV} (Secret '{options.secret}'): presenting the pod's service-account token", flush=True)
    return path.read_text().strip()


def summary(registration: Registration | None) -> str:
    if registration is None:
        return "no model_registry_url: not registered"
    verb = "registered" if registration.created else "updated"
    return (
        f"{verb} version {registration.model_version_id} of registered model {registration.registered_model_id} at "
        f"{registration.url} with {len(registration.artifact_ids)} artifacts"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.register.stage",
        description="Register a run's stored model version in the Kubeflow Model Registry.",
    )
    parser.add_argument("--workspace-root", required=True, help="the workspace holding runs/<run-id>/")
    parser.add_argument("--run-id", required=True, help="the run whose version to register (the version's name)")
    parser.add_argument("--model-name", required=True, help="the registered model's name")
    parser.add_argument("--s3-secret", default="", help="the data connection an s3:// artifact is read with")
    parser.add_argument("--repo-id", default="", help="the Hub repository the version was uploaded to, if any")
    add_options(parser, RegistryOptions)
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    options = options_from(args, RegistryOptions)
    print(summary(register(args.workspace_root, args.run_id, args.model_name, options, args.s3_secret, args.repo_id)))


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> str:
    """What the ``register_model`` component calls with every input by name; returns the version's id (empty:
    not registered). A version already registered (a retried step, or a run finishing the published version's
    steps) is not registered again."""
    if done := completed_at(inputs["workspace_root"], inputs["run_id"], REGISTER):
        print(f"run {inputs['run_id']}'s version was registered already, at {done}: not registered again", flush=True)
        return registered_version_id(inputs["workspace_root"], inputs["run_id"])
    model_name = model_name_of(inputs["model_name"], trained_from(Path(inputs["train_dir"])))
    options = options_from_inputs(RegistryOptions, inputs)
    registration = register(
        inputs["workspace_root"], inputs["run_id"], model_name, options, inputs["s3_secret"], inputs["repo_id"]
    )
    print(summary(registration), flush=True)
    return registration.model_version_id if registration else ""


if __name__ == "__main__":
    main()
