"""Kubernetes names, quantities and the one way this project connects to a cluster.

Names and quantities are checked the way the API server checks them, so a bad
value is refused by the first pipeline step instead of by the cluster an hour
later. Quantities are parsed by the ``kubernetes`` client's own
``parse_quantity``; the name patterns are Kubernetes' DNS-1123 rules
(k8s.io/apimachinery/pkg/util/validation/validation.go).

A step whose every API call must get through (the serve step) connects with
retries: a dropped connection, or a 429 or 5xx from an API server that is
restarting or overloaded, is tried again a bounded number of times, backing
off, and then fails the step with one paragraph instead of a traceback.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.utils import parse_quantity

from common.errors import UserError

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # at most 63 characters: PVC names, job names
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")  # at most 253
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # a pod's token, namespace and CAs
SERVICE_ACCOUNT_NAMESPACE = SERVICE_ACCOUNT / "namespace"
# What an API server answers when the request may be tried again: 429 from API Priority and Fairness, and the 5xx
# of an API server that is restarting or overloaded, or of the load balancer in front of it.
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
API_RETRIES = 5  # tries after the first, for callers that ask for retries
# urllib3 waits 0, 2, 4, 8, 16 times this before the retries after the first: about half a minute in all, long
# enough for an API server pod to be replaced or a load balancer to fail over.
RETRY_BACKOFF_S = 1.0


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


def connect(needed_for: str, otherwise: str, retries: int = 0) -> Cluster:
    """The cluster this pod runs in (its service account), else the kubeconfig's current context.

    ``needed_for`` says what the caller needs the cluster for and ``otherwise``
    what the user can do instead; both go into the error when there is no cluster,
    or, with ``retries``, when a request still fails after that many more tries
    (``RetryingApiClient``).
    """
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        return Cluster(api_client(configuration, retries, needed_for, otherwise), namespace)
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
    return Cluster(api_client(configuration, retries, needed_for, otherwise), namespace)


def api_client(configuration: client.Configuration, retries: int, needed_for: str, otherwise: str) -> client.ApiClient:
    """The client of ``configuration``: a plain one, or one that retries when ``retries`` is above 0."""
    if retries <= 0:
        return client.ApiClient(configuration)
    return RetryingApiClient(configuration, retries, needed_for, otherwise)


def api_retry(retries: int) -> urllib3.Retry:
    """urllib3's policy for ``RetryingApiClient``: up to ``retries`` more tries when the connection fails or drops,
    or the answer is one of ``RETRYABLE_STATUS``, backing off (and waiting as long as a Retry-After header says).

    Every method is retried, creates and replaces too: the API server never applies one twice, since a create of a
    name that exists is refused (409 AlreadyExists) and a replace carries the resourceVersion it read (409 Conflict
    once the first try went through), so the worst a repeat can do is fail, and say so.
    """
    return urllib3.Retry(
        total=retries,
        backoff_factor=RETRY_BACKOFF_S,
        status_forcelist=RETRYABLE_STATUS,
        allowed_methods=None,  # every method, see above
        raise_on_status=True,  # the last retryable answer ends as MaxRetryError, said in one paragraph below
    )


class RetryingApiClient(client.ApiClient):
    """An API client whose requests are retried (``api_retry``) and whose request that still fails after the last
    try fails the step with one paragraph saying which call, what went wrong and what to check."""

    def __init__(self, configuration: client.Configuration, retries: int, needed_for: str, otherwise: str) -> None:
        configuration.retries = api_retry(retries)  # read once, by the connection pool the client makes now
        super().__init__(configuration)
        self.retries, self.needed_for, self.otherwise = retries, needed_for, otherwise

    def request(self, method, url, *args, **kwargs):
        try:
            return super().request(method, url, *args, **kwargs)
        except urllib3.exceptions.HTTPError as error:  # MaxRetryError after the last try; its reason says why
            raise UserError(self.unreachable(method, url, getattr(error, "reason", None) or error)) from None

    def unreachable(self, method: str, url: str, reason: object) -> str:
        waited = sum(RETRY_BACKOFF_S * 2 ** (n - 1) for n in range(2, self.retries + 1))
        return (
            f"The Kubernetes API at {self.configuration.host} did not answer {method} {urlsplit(url).path} after "
            f"{self.retries + 1} tries over about {waited:.0f} s ({reason}), so the step could not {self.needed_for} "
            "the cluster. The API server was unreachable, dropped the connections, or answered that it is "
            f"overloaded or unavailable ({', '.join(map(str, sorted(RETRYABLE_STATUS)))}). Check that it answers "
            "(oc get --raw /readyz) and that this machine or pod reaches it, then run the step again. "
            f"{self.otherwise}"
        )


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
