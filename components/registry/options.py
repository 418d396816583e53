"""The Model Registry's run parameters: their defaults, help texts and validation, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from common.cli_options import run_option
from common.kube import is_subdomain_name


@dataclass(frozen=True)
class RegistryOptions:
    """Where a version that passed the gate is catalogued."""

    url: str = run_option(
        "",
        "REST endpoint of the Kubeflow Model Registry that catalogues every version that passes the gate, e.g. "
        "https://<registry>-rest.<namespace>.svc:8443 in the cluster (its route from outside). The model is "
        "registered under model_name, the run as a version whose artifacts are where the model went (S3, OCI, the "
        "Hub) and whose properties are its provenance, evaluation and gate. Empty: not registered.",
        name="model_registry_url",
    )
    secret: str = run_option(
        "model-registry-token",
        "Secret whose key 'token' is the bearer token for model_registry_url; without it the step presents its "
        "service account's token, which OpenShift AI's registry accepts when that account may access the registry "
        "service.",
        name="model_registry_secret",
    )


def option_problems(options: RegistryOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way."""
    problems = {}
    parts = urlsplit(options.url)
    if options.url and (parts.scheme not in ("http", "https") or not parts.hostname or parts.query):
        problems["url"] = f"is {options.url!r}, which is not an http(s) URL; write https://host[:port]"
    if not is_subdomain_name(options.secret):
        problems["secret"] = f"{options.secret!r} is not a valid Secret name (lowercase letters, digits, '-' and '.')"
    return problems
