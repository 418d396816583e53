"""Kubernetes names, quantities and the one way this project connects to a cluster.

Names and quantities are checked the way the API server checks them, so a bad
value is refused by the first pipeline step instead of by the cluster an hour
later. Quantities are parsed by the ``kubernetes`` client's own
``parse_quantity``; the name patterns are Kubernetes' DNS-1123 rules
(k8s.io/apimachinery/pkg/util/validation/validation.go).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.utils import parse_quantity

from common.errors import UserError

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # at most 63 characters: PVC names, job names
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")  # at most 253
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # a pod's token, namespace and CAs
SERVICE_ACCOUNT_NAMESPACE = SERVICE_ACCOUNT / "namespace"


def is_label_name(value: str) -> bool:
    """A DNS-1123 label: what a PVC or a Secret's key-free object name may be."""
    return len(value) <= 63 and bool(DNS1123_LABEL.match(value))


def is_subdomain_name(value: str) -> bool:
    """A DNS-1123 subdomain: what a StorageClass or a Secret may be named."""
    return len(value) <= 253 and bool(DNS1123_SUBDOMAIN.match(value))


def is_label_value_name(value: str) -> bool:
    """An object name (DNS-1123 subdomain) that also fits in a label value (63 characters): how Kueue is told
    a job's LocalQueue and WorkloadPriorityClass."""
    return len(value) <= 63 and is_subdomain_name(value)


def is_positive_quantity(value: str) -> bool:
    """``value`` is a quantity the API server accepts ('8', '500m', '48Gi', '1.5Ti') and above zero.

    The client's ``parse_quantity`` tolerates spaces ('20 Gi') that the API server's parser refuses, so
    those are refused first.
    """
    if any(character.isspace() for character in value):
        return False
    try:
        return parse_quantity(value) > 0
    except ValueError:
        return False


@dataclass(frozen=True)
class Cluster:
    """An API client and the namespace this process works in."""

    api: client.ApiClient
    namespace: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def storage(self) -> client.StorageV1Api:
        return client.StorageV1Api(self.api)


def kubeconfig_configuration() -> tuple[client.Configuration, dict]:
    """The current kubeconfig context as a client configuration, and that context.

    ``KUBECONFIG`` is read now (the client library reads it once, at import), so a
    variable set after start-up still counts; it may list several files. Raises
    ``config.ConfigException`` or ``OSError`` when there is no usable kubeconfig.
    """
    kubeconfig = os.environ.get("KUBECONFIG") or None
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    _, context = config.list_kube_config_contexts(config_file=kubeconfig)
    return configuration, context


def connect(needed_for: str, otherwise: str) -> Cluster:
    """The cluster this pod runs in (its service account), else the kubeconfig's current context.

    ``needed_for`` says what the caller needs the cluster for and ``otherwise``
    what the user can do instead; both go into the error when there is no cluster.
    """
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return Cluster(client.ApiClient(configuration), SERVICE_ACCOUNT_NAMESPACE.read_text().strip())
    except config.ConfigException:
        pass
    try:
        configuration, context = kubeconfig_configuration()
    except (config.ConfigException, OSError) as error:
        raise UserError(
            f"Found no Kubernetes cluster to {needed_for} ({error}). In a pipeline pod the step uses the pod's "
            f"service account; elsewhere it reads the kubeconfig (KUBECONFIG or ~/.kube/config). {otherwise}"
        ) from None
    namespace = context.get("context", {}).get("namespace") or "default"
    return Cluster(client.ApiClient(configuration), namespace)


def default_namespace() -> str:
    """The current kubeconfig context's namespace, as ``oc``/``kubectl`` would use it; 'default' without one.

    For commands that only name a namespace (rendering a manifest) and need no connection.
    """
    kubeconfig = os.environ.get("KUBECONFIG") or None
    try:
        _, context = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return "default"
    except yaml.YAMLError as error:
        raise UserError(
            f"The kubeconfig ({kubeconfig or '~/.kube/config'}) is not valid YAML ({error.__class__.__name__}); "
            "fix it, or name the namespace with --namespace."
        ) from None
    return (context or {}).get("context", {}).get("namespace") or "default"
