"""The launcher's conversation with the Kubernetes API, through the official ``kubernetes`` client.

Connects as the pod's service account (in-cluster config, namespace from the
service account) or, from a laptop, with the kubeconfig. Checks that the job
kind is served before creating anything, creates the job (or attaches to the
one a previous attempt of the same run created), deletes it, and watches
objects in a way that survives what long watches meet in practice: streams
that end or drop (reconnect from the last resourceVersion), an expired
resourceVersion (410 Gone: list again), brief API outages (back off, retry).

The job is created with strict field validation: an API server whose CRD is
older than the manifest (an older Trainer or Training Operator) refuses a field
it does not know instead of dropping it silently, which would run a job without
its volumes or deadline.

The kind check uses API discovery (``GET /apis/<group>/<version>``), which
every authenticated user may read, so the launcher needs no ClusterRole to read
CustomResourceDefinitions.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Callable, Iterator, TextIO

import urllib3
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

import common.kube
from common.errors import UserError
from common.kube import Cluster
from components.train.kinds import KINDS, JobKind
from components.train.options import PARAMETER

DELETE_WAIT_SECONDS = 300  # a deleted job's pods have their grace period (180 s by default) to stop
REQUEST_TIMEOUT = (10, 60)  # seconds to connect, to read a reply (not a stream)
STREAM_SECONDS = 30  # a watch ends after this and is renewed, so its caller can check its clock
RETRYABLE_STATUS = (429, 500, 502, 503, 504)
NETWORK_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
# The API server's answer to a Strict create with fields the CRD's schema lacks, e.g. 'TrainJob in version
# "v1alpha1" cannot be handled as a TrainJob: strict decoding error: unknown field "spec.runtimePatches"'
# (k8s.io/apiserver endpoints/handlers/rest.go transformDecodeError, apiextensions-apiserver
# customresource_handler.go schemaCoercingDecoder).
UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def connect() -> Cluster:
    """The cluster to start the training job in: the pod's own, else the kubeconfig's current context."""
    return common.kube.connect(
        "start the training job in", "To train on this machine instead, set the backend parameter to local."
    )


def api_problem(error: ApiException, action: str, cluster: Cluster) -> UserError | None:
    """A UserError for API refusals the user can fix (permissions, an invalid job), else None."""
    message = error_message(error)
    if error.status == 403:
        return UserError(
            f"The pipeline's service account may not {action} in namespace {cluster.namespace}: {message}. "
            f"Apply pipelines/rbac.yaml to that namespace (oc apply -n {cluster.namespace} -f pipelines/rbac.yaml, "
            "with the RoleBinding naming your pipeline server's service account; see "
            "docs/getting-started/openshift-ai.md)."
        )
    if error.status == 401:
        return UserError(
            f"The Kubernetes API rejected the launcher's credentials when it tried to {action}: {message}."
        )
    if error.status in (400, 422):
        return UserError(f"The cluster refused to {action}: {message}. Check the train step's parameters.")
    return None


def error_message(error: ApiException) -> str:
    """The API server's own words (the Status message), else the HTTP reason."""
    try:
        return json.loads(error.body or "{}").get("message") or error.reason
    except (TypeError, ValueError, AttributeError):
        return error.reason


def unknown_fields_problem(error: ApiException, kind: JobKind) -> UserError | None:
    """A UserError naming the fields the cluster's CRD does not know, when a Strict create was refused for them."""
    message = error_message(error)
    fields = UNKNOWN_FIELD.findall(message) if error.status == 400 and "strict decoding error" in message else []
    if not fields:
        return None
    other = next(other for other in KINDS.values() if other is not kind)
    backend = PARAMETER["backend"]
    return UserError(
        f"The cluster's {kind.kind} API does not know {', '.join(fields)}, which the train step sets: it is "
        f"older than {kind.min_version}, which these fields need (the API server said: {message}). Upgrade to "
        f"{kind.min_version} or newer, or set {backend}={other.backend} to train with a {other.kind} instead."
    )


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


def create_job(cluster: Cluster, kind: JobKind, manifest: dict[str, Any], out: TextIO) -> dict[str, Any] | None:
    """Create the job (None); if this run's job already exists, follow it (the job as it is now), whatever its
    state, unless it is going away.

    The job's name is derived from the run id, so a conflict means an earlier
    attempt of this very step (a retried launcher pod) created it. A running or
    succeeded job is adopted rather than trained again; a failed one is followed
    too, so the step reports its failure rather than train again: a retry is
    for a lost launcher, not a second restart budget. A job being deleted (the
    earlier attempt was cancelled) is waited for and then created anew.
    """
    name = manifest["metadata"]["name"]
    for attempt in range(2):
        try:
            cluster.custom.create_namespaced_custom_object(
                kind.group,
                kind.version,
                cluster.namespace,
                kind.plural,
                manifest,
                field_validation="Strict",
                _request_timeout=REQUEST_TIMEOUT,
            )
            print(f"created {kind.kind} {name} in namespace {cluster.namespace}", file=out, flush=True)
            return None
        except ApiException as error:
            if error.status == 409 and attempt:
                raise UserError(
                    f"{kind.kind} {name} was created again by someone else while this step waited for the earlier "
                    f"one to go; inspect it (oc get {kind.plural} {name} -n {cluster.namespace}) and retry the run."
                ) from None
            if error.status != 409:
                problem = unknown_fields_problem(error, kind) or api_problem(error, f"create {kind.plural}", cluster)
                raise problem or error
        try:
            existing = cluster.custom.get_namespaced_custom_object(
                kind.group, kind.version, cluster.namespace, kind.plural, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:  # deleted between our create and this read: create it again
                continue
            raise api_problem(error, f"get {kind.plural}", cluster) or error
        if existing["metadata"].get("deletionTimestamp"):
            print(f"{kind.kind} {name} from an earlier attempt is being deleted; waiting for it", file=out, flush=True)
            wait_until_gone(cluster, kind, name)
            continue
        outcome = kind.outcome(existing)
        state = "is still running" if outcome is None else "has succeeded" if outcome.succeeded else "has failed"
        print(
            f"{kind.kind} {name} already exists and {state} (an earlier attempt of this step started it); following it",
            file=out,
            flush=True,
        )
        return existing
    # Not reached: the second attempt's create either succeeds or raises.


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
            raise api_problem(error, f"get {kind.plural}", cluster) or error
        except NETWORK_ERRORS:
            pass  # a brief API outage: ask again
        time.sleep(1)
    raise UserError(
        f"{kind.kind} {name} from an earlier attempt was still being deleted after {timeout:.0f} s (its pods may "
        f"be stuck terminating: oc get pods -n {cluster.namespace}); retry the step later."
    )


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
