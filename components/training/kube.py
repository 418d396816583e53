"""The launcher's conversation with the Kubernetes API, through the official ``kubernetes`` client.

Connects as the pod's service account (in-cluster config, namespace from the
service account) or, from a laptop, with the kubeconfig. Checks that the job
kind is served before creating anything, creates the job (or attaches to the
one a previous attempt of the same run created), deletes it, and watches
objects in a way that survives what long watches meet in practice: streams
that end or drop (reconnect from the last resourceVersion), an expired
resourceVersion (410 Gone: list again), brief API outages (back off, retry).

The kind check uses API discovery (``GET /apis/<group>/<version>``), which
every authenticated user may read, so the launcher needs no ClusterRole to read
CustomResourceDefinitions.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterator, TextIO

import urllib3
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

import common.kube
from common.errors import UserError
from common.kube import Cluster
from components.training.kinds import JobKind

REQUEST_TIMEOUT = (10, 60)  # seconds to connect, to read a reply (not a stream)
STREAM_SECONDS = 30  # a watch ends after this and is renewed, so its caller can check its clock
RETRYABLE_STATUS = (429, 500, 502, 503, 504)
NETWORK_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
DELETE_WAIT_SECONDS = 180


def connect() -> Cluster:
    """The cluster to start the training job in: the pod's own, else the kubeconfig's current context."""
    return common.kube.connect(
        "start the training job in", "To train on this machine instead, set the backend parameter to local."
    )


def api_problem(error: ApiException, action: str, cluster: Cluster) -> UserError | None:
    """A UserError for API refusals the user can fix (permissions, an invalid job), else None."""
    try:
        message = json.loads(error.body or "{}").get("message") or error.reason
    except (TypeError, ValueError):
        message = error.reason
    if error.status == 403:
        return UserError(
            f"The pipeline's service account may not {action} in namespace {cluster.namespace}: {message}. "
            f"Apply pipelines/rbac.yaml to that namespace (oc apply -n {cluster.namespace} -f pipelines/rbac.yaml, "
            "with the RoleBinding naming your pipeline server's service account; see the README)."
        )
    if error.status == 401:
        return UserError(
            f"The Kubernetes API rejected the launcher's credentials when it tried to {action}: {message}."
        )
    if error.status in (400, 422):
        return UserError(f"The cluster refused to {action}: {message}. Check the train step's parameters.")
    return None


def require_kind(cluster: Cluster, kind: JobKind) -> None:
    """Fail with install instructions unless the cluster serves ``kind``."""
    try:
        served = [
            resource.name
            for resource in cluster.custom.get_api_resources(
                kind.group, kind.version, _request_timeout=REQUEST_TIMEOUT
            ).resources
        ]
    except ApiException as error:
        if error.status != 404:
            raise api_problem(error, f"discover {kind.api_version}", cluster) or error
        served = []
    except NETWORK_ERRORS as error:
        raise UserError(
            f"The Kubernetes API at {cluster.api.configuration.host} cannot be reached ({error}). "
            "Check the kubeconfig, or the network."
        ) from None
    if kind.plural not in served:
        raise UserError(
            f"This cluster does not serve {kind.kind} ({kind.plural}.{kind.group}/{kind.version}): its "
            f"CustomResourceDefinition is not installed, so the train step cannot start its job. {kind.install_hint}"
        )


def create_job(cluster: Cluster, kind: JobKind, manifest: dict[str, Any], out: TextIO) -> None:
    """Create the job; if this run's job already exists, follow it, unless it failed: then replace it.

    The job's name is derived from the run id, so a conflict means an earlier
    attempt of this very step (e.g. a retried launcher pod) created it: a
    running or succeeded one is adopted rather than trained again, a failed one
    is replaced (its replicas resume from the checkpoints it left on the workspace).
    """
    name = manifest["metadata"]["name"]
    for attempt in range(2):
        try:
            cluster.custom.create_namespaced_custom_object(
                kind.group, kind.version, cluster.namespace, kind.plural, manifest, _request_timeout=REQUEST_TIMEOUT
            )
            print(f"created {kind.kind} {name} in namespace {cluster.namespace}", file=out, flush=True)
            return
        except ApiException as error:
            if error.status != 409 or attempt:
                raise api_problem(error, f"create {kind.plural}", cluster) or error
        existing = cluster.custom.get_namespaced_custom_object(
            kind.group, kind.version, cluster.namespace, kind.plural, name, _request_timeout=REQUEST_TIMEOUT
        )
        outcome = kind.outcome(existing)
        if outcome is None or outcome.succeeded:
            state = "is still running" if outcome is None else "has succeeded"
            print(
                f"{kind.kind} {name} already exists and {state} "
                "(an earlier attempt of this step started it); following it",
                file=out,
                flush=True,
            )
            return
        print(f"{kind.kind} {name} from an earlier attempt of this step failed; replacing it", file=out, flush=True)
        delete_job(cluster, kind, name)
        wait_until_gone(cluster, kind, name)


def delete_job(cluster: Cluster, kind: JobKind, name: str) -> None:
    """Delete the job and, through Foreground propagation, its pods before the job itself disappears."""
    try:
        cluster.custom.delete_namespaced_custom_object(
            kind.group,
            kind.version,
            cluster.namespace,
            kind.plural,
            name,
            propagation_policy="Foreground",
            _request_timeout=REQUEST_TIMEOUT,
        )
    except ApiException as error:
        if error.status != 404:
            raise api_problem(error, f"delete {kind.plural}", cluster) or error


def wait_until_gone(cluster: Cluster, kind: JobKind, name: str, timeout: float = DELETE_WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cluster.custom.get_namespaced_custom_object(
                kind.group, kind.version, cluster.namespace, kind.plural, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:
                return
            raise
        time.sleep(1)
    raise UserError(
        f"{kind.kind} {name} from an earlier attempt was still being deleted after {timeout:.0f} s; "
        "retry the step later."
    )


Event = tuple[str, dict[str, Any]]


def watch_objects(
    list_call: Callable[..., Any],
    *args: Any,
    stream_seconds: Callable[[], float],
    out: TextIO,
    stop: threading.Event | None = None,
    **selectors: Any,
) -> Iterator[Event | None]:
    """Every change to the objects ``list_call(*args, **selectors)`` lists, as (type, object dict), until
    ``stop`` is set.

    Starts with a listing (each object as ``ADDED``), then watches from the
    listing's resourceVersion. ``None`` is yielded each time a stream ends, so
    the caller can look at its clock even when nothing changes.
    """
    stop = stop or threading.Event()
    resource_version: str | None = None
    failures = 0
    while not stop.is_set():
        try:
            if resource_version is None:
                listing = json.loads(
                    list_call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **selectors).data
                )
                resource_version = listing["metadata"]["resourceVersion"]
                for item in listing.get("items") or []:
                    yield "ADDED", item
            seconds = max(1, int(stream_seconds()))
            opened, events = time.monotonic(), 0
            stream = watch.Watch().stream(
                list_call,
                *args,
                resource_version=resource_version,
                timeout_seconds=seconds,
                _request_timeout=(REQUEST_TIMEOUT[0], seconds + 30),
                **selectors,
            )
            for event in stream:
                events += 1
                item = event["raw_object"]
                resource_version = item.get("metadata", {}).get("resourceVersion") or resource_version
                if event["type"] != "BOOKMARK":
                    yield event["type"], item
            failures = 0
            if not events and time.monotonic() - opened < 1:
                time.sleep(1)  # a stream that ends at once (a proxy's doing) must not turn into a busy loop
        except ApiException as error:
            if error.status == 410:  # our resourceVersion is older than the API server's watch history
                print(f"watch expired ({error.reason}); listing again", file=out, flush=True)
                resource_version = None
            elif error.status in RETRYABLE_STATUS:
                failures += 1
                time.sleep(min(2 ** (failures - 1), 30))
            else:
                raise
        except NETWORK_ERRORS as error:
            if stop.is_set():
                return
            failures += 1
            print(
                f"lost the connection to the Kubernetes API ({type(error).__name__}); reconnecting",
                file=out,
                flush=True,
            )
            time.sleep(min(2 ** (failures - 1), 30))
        yield None
