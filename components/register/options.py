"""The Model Registry's run parameters: their defaults, help texts and validation, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from common.cli_options import run_option
from common.http_trust import token_may_go_to
from common.kube import is_subdomain_name
from components.data.sources import credential_problem, describe_uri


@dataclass(frozen=True)
class RegistryOptions:
    """Where a version that passed the gate is catalogued, and which token may go there."""

    url: str = run_option(
        "",
        "REST endpoint of the Kubeflow Model Registry that catalogues every version that passes the gate, e.g. "
        "https://<registry>-rest.<namespace>.svc:8443 in the cluster (its route from outside). The model is "
        "registered under model_name, the run as a version whose artifacts are where the model went (S3, OCI, the "
        "Hub) and whose properties are its provenance, evaluation and gate. It takes a bearer token, so it must be "
        "https, or http to this machine (127.0.0.1, ::1, localhost); plain http to another host only with "
        "model_registry_allow_http. Empty: not registered.",
        name="model_registry_url",
    )
    secret: str = run_option(
        "model-registry-token",
        "Secret whose key 'token' is the bearer token for model_registry_url (optional: without it the step sends "
        "no token, or the service account's with model_registry_use_service_account).",
        name="model_registry_secret",
    )
    use_service_account: bool = run_option(
        False,
        "When model_registry_secret does not exist, present the pipeline pod's own service-account token to the "
        "registry instead (OpenShift AI's registry accepts it when that account may access the registry "
        "service). Off by default: that token is the pod's credential for the whole cluster, so it is sent only "
        "when asked for, and only over https.",
        name="model_registry_use_service_account",
    )
    allow_http: bool = run_option(
        False,
        "Send the registry token over plain http to a model_registry_url that is not this machine. Only for a "
        "network that encrypts its own traffic (e.g. an in-cluster service mesh with mTLS between the pods); "
        "otherwise the token crosses the network readable by anyone on the way. The service-account token never "
        "goes over http.",
        name="model_registry_allow_http",
    )


def option_problems(options: RegistryOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way."""
    problems = {}
    parts = urlsplit(options.url)
    carried = options.url and credential_problem(
        options.url,
        f"Write the URL without it ({describe_uri(options.url)}) and put the registry's token in the Secret "
        f"'{options.secret}' (named by model_registry_secret), key 'token'",
    )
    if carried:
        problems["url"] = carried
    elif options.url and (parts.scheme not in ("http", "https") or not parts.hostname or parts.query):
        problems["url"] = f"is {options.url!r}, which is not an http(s) URL; write https://host[:port]"
    elif options.url and (why := token_may_go_to(options.url, options.allow_http)):
        problems["url"] = (
            f"is {options.url!r}: {why}. Use the registry's https endpoint (its .svc:8443 service in the cluster, "
            "or its route), or, only when the network encrypts the traffic itself (a service mesh with mTLS), set "
            "model_registry_allow_http to true"
        )
    elif options.url and options.use_service_account and (why := token_may_go_to(options.url, https_only=True)):
        problems["use_service_account"] = (
            f"is true, but model_registry_url {why}: the pod's service-account token is its credential for the "
            "whole cluster. Use the registry's https endpoint, or set model_registry_use_service_account to false "
            "and give the token in the Secret model_registry_secret"
        )
    if not is_subdomain_name(options.secret):
        problems["secret"] = f"{options.secret!r} is not a valid Secret name (lowercase letters, digits, '-' and '.')"
    return problems
