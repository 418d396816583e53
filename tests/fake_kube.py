"""A fake Kubernetes API server on 127.0.0.1 for the launcher's tests.

No real cluster runs here (no kind, no API server binary, no network), so this
in-memory server speaks just the HTTP the official ``kubernetes`` client sends
for the launcher's calls, the way the real API server answers them:

- discovery ``GET /apis/<group>/<version>`` (404 when the CRD is not installed);
- custom objects: create (409 when the name exists), get, list, watch, delete,
  replace (PUT: 409 Conflict unless it carries the stored resourceVersion; the
  status is kept, as for a CRD with a status subresource);
  a create with ``fieldValidation=Strict`` is refused (400) for spec fields the
  CRD does not know (``unknown_spec_fields``: an older operator), which are
  otherwise dropped silently, as the API server prunes them;
- pods: get, list, watch; ``pods/<name>/log`` with follow, timestamps, sinceSeconds,
  tailLines and previous;
- events (core v1): list, with the field selectors the API server allows for them;
- watches with resourceVersion and timeoutSeconds, streamed with chunked
  transfer encoding, one JSON event per line; a resourceVersion older than the
  kept history gets the ``ERROR`` event with code 410 (Gone);
- 403 Forbidden, in the API server's words, for the resources in ``forbidden``
  (a Role that does not grant them).

A job created with Kueue's queue label is held as Kueue and the operators hold
it: stored suspended with the operator's ``Suspended`` condition, with a Kueue
Workload saying why it waits, until the scenario calls ``admit``.

A test plays the cluster's part (the operator, the kubelets, Kueue) through the
methods below from a scenario thread: add pods, write log lines, end
containers, set job conditions, record events, admit queued jobs, drop every
open stream, expire watch history, fail the next requests (``fail_next``: a
connection closed without an answer, a 429 or 5xx Status). Every request is
recorded, so tests can check the verbs used against the RBAC.
"""

from __future__ import annotations

import copy
import hashlib
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qs, urlsplit

SERVED = {
    "kubeflow.org/v1": {"pytorchjobs": "PyTorchJob", "notebooks": "Notebook"},
    "trainer.kubeflow.org/v1alpha1": {"trainjobs": "TrainJob"},
    "kueue.x-k8s.io/v1beta1": {"workloads": "Workload", "localqueues": "LocalQueue"},
    "serving.kserve.io/v1beta1": {"inferenceservices": "InferenceService"},
}
CORE = {"pods": "Pod", "events": "Event"}  # the /api/v1 resources served
# Field selectors the API server accepts (k8s pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForEvent;
# every resource takes metadata.name and metadata.namespace); anything else is 400 "field label not supported".
FIELD_LABELS = {
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "source",
        "type",
    }
}
DROP = "drop"  # fail_next: close the connection without an answer
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Where Kueue's webhook suspends each kind of job, and what its operator then records: the Training Operator
# v1.9 (pkg/controller.v1/common/job.go, pkg/util/status.go) keeps its Created condition and appends
# Suspended / PyTorchJobSuspended; Trainer v2 (pkg/controller/trainjob_controller.go setSuspendedCondition)
# sets Suspended / Suspended with "TrainJob is suspended".
SUSPEND = {
    "pytorchjobs": {"path": ("runPolicy", "suspend"), "reason": "PyTorchJob{}", "podset": "master"},
    "trainjobs": {"path": ("suspend",), "reason": "{}", "podset": "node"},
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]


class Dropped(Exception):
    """Raised inside a stream to cut the connection without ending the response, like a broken network."""


def rfc3339_nano(moment: float) -> str:
    """Like Go's RFC3339Nano, as the kubelet writes it: trailing zeros of the fraction trimmed."""
    whole = datetime.fromtimestamp(moment, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    nanos = f"{int(round(moment % 1 * 1e9)) % 1_000_000_000:09d}".rstrip("0")
    return f"{whole}.{nanos}Z" if nanos else f"{whole}Z"


class FakeKube:
    def __init__(
        self,
        namespace: str = "ml-team",
        served: dict[str, dict[str, str]] | None = None,
        *,
        unknown_spec_fields: dict[str, set[str]] | None = None,
        forbidden: set[str] | None = None,
    ) -> None:
        self.namespace = namespace
        self.served = SERVED if served is None else served
        self.unknown_spec_fields = unknown_spec_fields or {}  # plural -> top-level spec fields its CRD lacks
        self.forbidden = forbidden or set()  # resources the launcher's Role does not grant
        # What Kueue's Workload says while a queued job waits (kueue pkg/scheduler/flavorassigner).
        self.kueue_pending_message = (
            "couldn't assign flavors to pod set {podset}: insufficient unused quota for nvidia.com/gpu in flavor "
            "default-flavor, 2 more needed"
        )
        self.changed = threading.Condition()
        self.resource_version = 1000
        self.oldest_watchable = 0
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}  # plural -> name -> object
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, plural, event type, object)
        self.logs: dict[tuple[str, int], list[tuple[str, str]]] = {}  # (pod, run of its container) -> (timestamp, line)
        self.drops = 0
        self.failures: list[tuple[str, str | int]] = []  # (method, what it gets instead of an answer): fail_next
        self.failed: list[tuple[Request, str | int]] = []  # each request that got one, and what it got
        self.streamed: set[tuple[str, str]] = set()  # (pod, line) sent on a log stream
        self.requests: list[Request] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeKube:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.drop_streams()
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "launcher", "user": {"token": "not-a-secret"}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": "launcher", "namespace": self.namespace},
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    # --- the cluster's side: what operators and kubelets do -----------------------------------------
    def wait_for(self, plural: str, timeout: float = 20) -> dict[str, Any]:
        """The first object of ``plural`` once the launcher has created it."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.objects.get(plural):
                if not self.changed.wait(max(0.0, deadline - time.monotonic())):
                    raise AssertionError(f"no {plural} was created within {timeout} s")
            return copy.deepcopy(next(iter(self.objects[plural].values())))

    def set_condition(
        self,
        plural: str,
        name: str,
        kind: str,
        reason: str,
        message: str = "",
        *,
        drop: bool = False,
        expire: bool = False,
    ) -> None:
        """Make ``kind`` the job's true condition (earlier ones turn False), as the operators do.

        ``drop`` cuts every open stream in the same instant, so the launcher can
        learn of the change only by reconnecting; ``expire`` also forgets the watch
        history, so reconnecting from an old resourceVersion gets 410 Gone.
        """
        with self.changed:
            job = self.objects[plural][name]
            conditions = [
                {**c, "status": "False"}
                for c in job.setdefault("status", {}).get("conditions", [])
                if c["type"] != kind
            ]
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            conditions.append(
                {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now}
            )
            job["status"]["conditions"] = conditions
            self._stored(plural, "MODIFIED", job)
            if expire:
                self.oldest_watchable = self.resource_version
            if drop:
                self.drops += 1
            self.changed.notify_all()

    def set_status(self, plural: str, name: str, **fields: Any) -> None:
        """Merge ``fields`` into the object's status, as its controller does (e.g. KServe's url and address)."""
        with self.changed:
            item = self.objects[plural][name]
            item.setdefault("status", {}).update(copy.deepcopy(fields))
            self._stored(plural, "MODIFIED", item)

    def add_step_pod(self, name: str, owners: list[dict[str, Any]], conditions: Iterable[dict[str, Any]] = ()) -> None:
        """A pipeline step's pod as Argo creates it: its ``main`` container, labelled with and owned by its
        Workflow (argoproj/argo-workflows workflow/controller/workflowpod.go), with pod ``conditions`` such as
        the DisruptionTarget the API server adds before an eviction."""
        workflow = next((owner["name"] for owner in owners if owner.get("kind") == "Workflow"), None)
        self.add_pod(name, {"workflows.argoproj.io/workflow": workflow} if workflow else {}, "main")
        with self.changed:
            pod = self.objects["pods"][name]
            pod["metadata"]["ownerReferences"] = list(owners)
            pod["status"]["conditions"] = list(conditions)

    def add_pod(
        self,
        name: str,
        labels: dict[str, str],
        container: str,
        *,
        pending_reason: str = "",
        annotations: dict[str, str] | None = None,
    ) -> None:
        """A pod as its controller creates it; ``annotations`` are its template's (KServe copies an
        InferenceService's annotations onto its predictor's pods)."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "uid": str(uuid.uuid4()), "labels": labels},
            "spec": {"containers": [{"name": container}]},
            "status": {
                "phase": "Pending",
                "conditions": [],
                "containerStatuses": [self._status(container, {"waiting": {"reason": "ContainerCreating"}}, 0)],
            },
        }
        if annotations:
            pod["metadata"]["annotations"] = dict(annotations)
        if pending_reason:
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": pending_reason}
            ]
            pod["status"]["containerStatuses"] = []
        with self.changed:
            self._stored("pods", "ADDED", pod)

    def run_container(self, pod: str) -> None:
        """The container runs: on its node, scheduled first if it was not (the scheduler binds it, the kubelet
        reports its container)."""
        with self.changed:
            status = self.objects["pods"][pod]["status"]
            if not status["containerStatuses"]:
                status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                container = self.objects["pods"][pod]["spec"]["containers"][0]["name"]
                status["containerStatuses"] = [self._status(container, {"waiting": {"reason": "ContainerCreating"}}, 0)]

        def start(status):
            status["state"] = {"running": {"startedAt": rfc3339_nano(time.time())}}
            status["ready"] = True

        self._change_container(pod, start, phase="Running")

    def make_pod_ready(self, pod: str) -> None:
        """The container runs and passes its readiness probe: the kubelet sets the pod's Ready condition."""
        self.run_container(pod)
        with self.changed:
            status = self.objects["pods"][pod]["status"]
            status["conditions"] = [c for c in status["conditions"] if c["type"] != "Ready"]
            status["conditions"].append(_condition("Ready", "True", "", ""))
            self._stored("pods", "MODIFIED", self.objects["pods"][pod])

    def log(self, pod: str, *lines: str) -> None:
        with self.changed:
            run = self._container(pod)["restartCount"]
            for line in lines:
                self.logs.setdefault((pod, run), []).append((rfc3339_nano(time.time()), line))
            self.changed.notify_all()

    def exit_container(self, pod: str, exit_code: int, reason: str = "") -> None:
        def end(status):
            status["state"] = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                    "finishedAt": rfc3339_nano(time.time()),
                }
            }
            status["ready"] = False

        self._change_container(pod, end, phase="Succeeded" if exit_code == 0 else "Failed")

    def delete_pod(self, pod: str) -> None:
        """The pod is gone (its node was lost, or it was evicted); its operator makes a new one."""
        with self.changed:
            self._stored("pods", "DELETED", self.objects["pods"][pod])

    def restart_container(self, pod: str) -> None:
        """The kubelet runs the container again (restartPolicy OnFailure): lastState keeps the failed run."""

        def restart(status):
            status["lastState"] = status.pop("state")
            status["restartCount"] += 1
            status["state"] = {"running": {"startedAt": rfc3339_nano(time.time())}}

        self._change_container(pod, restart, phase="Running")

    def add_event(
        self, involved_kind: str, involved_name: str, reason: str, message: str, type: str = "Warning"
    ) -> dict[str, Any]:
        """Record a core v1 Event about an object, as a controller or kubelet does; the same one again
        (same object, reason and message) counts up instead, as client-go's EventCorrelator aggregates."""
        with self.changed:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            for event in self.objects.get("events", {}).values():
                involved = event["involvedObject"]
                if (involved["kind"], involved["name"], event["reason"], event["message"]) == (
                    involved_kind,
                    involved_name,
                    reason,
                    message,
                ):
                    event["count"] += 1
                    event["lastTimestamp"] = now
                    self._stored("events", "MODIFIED", event)
                    return copy.deepcopy(event)
            plural = next((p for p, k in [*CORE.items(), *self._custom_kinds()] if k == involved_kind), "")
            target = self.objects.get(plural, {}).get(involved_name, {}).get("metadata", {})
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{involved_name}.{uuid.uuid4().hex[:16]}",
                    "namespace": self.namespace,
                    "uid": str(uuid.uuid4()),
                },
                "involvedObject": {
                    "kind": involved_kind,
                    "name": involved_name,
                    "namespace": self.namespace,
                    "uid": target.get("uid", ""),
                },
                "reason": reason,
                "message": message,
                "type": type,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": "kubelet" if involved_kind == "Pod" else "controller"},
            }
            self._stored("events", "ADDED", event)
            return copy.deepcopy(event)

    def admit(self, plural: str, name: str) -> None:
        """Kueue admits the queued job: its Workload reserves quota and is admitted, the job is un-suspended,
        and the operator turns its Suspended condition False (reason Resumed)."""
        with self.changed:
            job = self.objects[plural][name]
            for workload in self._workloads_of(job):
                workload["status"]["conditions"] = [
                    _condition(
                        "QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cluster-queue"
                    ),
                    _condition("Admitted", "True", "Admitted", "The workload is admitted"),
                ]
                self._stored("workloads", "MODIFIED", workload)
            _set_path(job["spec"], SUSPEND[plural]["path"], False)
            self._stored(plural, "MODIFIED", job)
        kind = self._kind_of(plural)
        self.add_event(kind, name, "Started", "Admitted by clusterQueue cluster-queue", "Normal")
        message = f"{kind} {name} is resumed." if plural == "pytorchjobs" else "TrainJob is resumed"
        reason = SUSPEND[plural]["reason"].format("Resumed")
        self._operator_condition(plural, name, "Suspended", "False", reason, message)
        self.add_event(kind, name, reason, message, "Normal")

    def fail_next(self, *failures: str | int, method: str = "") -> None:
        """The next requests (of ``method``, or any) fail, one per entry, before the API acts on them: ``DROP``
        closes the connection without an answer (an API server restarting, a load balancer failing over), a status
        code is answered the way the API server words it (429: API Priority and Fairness throttling; 5xx:
        unavailable). They are kept in ``failed``."""
        with self.changed:
            self.failures.extend((method, failure) for failure in failures)

    def take_failure(self, method: str, path: str, query: dict[str, str]) -> str | int | None:
        """The failure this request gets (``fail_next``), or None: it is answered."""
        with self.changed:
            index = next((i for i, (only, _) in enumerate(self.failures) if only in ("", method)), None)
            if index is None:
                return None
            _, failure = self.failures.pop(index)
            self.failed.append((Request(method, path, query), failure))
            return failure

    def drop_streams(self) -> None:
        """Cut every open watch and log stream mid-response."""
        with self.changed:
            self.drops += 1
            self.changed.notify_all()

    def wait_for_request(self, method: str, path_part: str, count: int = 1, timeout: float = 20) -> None:
        """Until the launcher has made ``count`` such requests (e.g. started following a pod's log)."""
        deadline = time.monotonic() + timeout
        while len(self.requests_matching(method, path_part)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the launcher made no {method} {path_part} within {timeout} s")
            time.sleep(0.02)

    def wait_until_streamed(self, pod: str, line: str, timeout: float = 20) -> None:
        """Until ``line`` of ``pod`` has gone out on a log stream."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while (pod, line) not in self.streamed:
                if not self.changed.wait(max(0.0, deadline - time.monotonic())):
                    raise AssertionError(f"{line!r} of {pod} was not streamed within {timeout} s")

    def job_names(self, plural: str) -> list[str]:
        with self.changed:
            return sorted(self.objects.get(plural, {}))

    def requests_matching(self, method: str, path_part: str, **query: str) -> list[Request]:
        return [
            r
            for r in list(self.requests)
            if r.method == method and path_part in r.path and all(r.query.get(k) == v for k, v in query.items())
        ]

    # --- storage --------------------------------------------------------------------------------
    @staticmethod
    def _status(container: str, state: dict[str, Any], restarts: int) -> dict[str, Any]:
        return {
            "name": container,
            "state": state,
            "restartCount": restarts,
            "ready": False,
            "image": "runtime:test",
            "imageID": "sha256:0",
        }

    def _container(self, pod: str) -> dict[str, Any]:
        return self.objects["pods"][pod]["status"]["containerStatuses"][0]

    def _change_container(self, pod: str, change: Callable[[dict[str, Any]], None], phase: str) -> None:
        with self.changed:
            change(self._container(pod))
            self.objects["pods"][pod]["status"]["phase"] = phase
            self._stored("pods", "MODIFIED", self.objects["pods"][pod])

    def _stored(self, plural: str, event: str, item: dict[str, Any]) -> None:
        """Record a change (caller holds the lock) with a new resourceVersion and wake the streams."""
        self.resource_version += 1
        item["metadata"]["resourceVersion"] = str(self.resource_version)
        name = item["metadata"]["name"]
        if event == "DELETED":
            self.objects.get(plural, {}).pop(name, None)
        else:
            self.objects.setdefault(plural, {})[name] = item
        self.history.append((self.resource_version, plural, event, copy.deepcopy(item)))
        self.changed.notify_all()

    def _custom_kinds(self) -> list[tuple[str, str]]:
        return [(plural, kind) for kinds in self.served.values() for plural, kind in kinds.items()]

    def _kind_of(self, plural: str) -> str:
        return dict(self._custom_kinds())[plural]

    def _workloads_of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Kueue finds a job's Workload by the job-uid label (kueue pkg/controller/jobframework/reconciler.go)."""
        uid = job["metadata"]["uid"]
        return [
            w for w in self.objects.get("workloads", {}).values() if w["metadata"]["labels"].get(JOB_UID_LABEL) == uid
        ]

    def _hold_in_queue(self, plural: str, job: dict[str, Any]) -> None:
        """What follows the creation of a queued (and so suspended) job: Kueue makes its Workload, which waits
        for quota, and the operator records that the job is suspended."""
        kind, name, uid = self._kind_of(plural), job["metadata"]["name"], job["metadata"]["uid"]
        group = job["apiVersion"].split("/")[0]
        # Named as kueue's GetWorkloadNameForOwnerWithGVK names it (pkg/controller/jobframework/workload_names.go).
        digest = hashlib.sha1(f"{kind}\n{group}\n{name}\n{uid}".encode()).hexdigest()[:5]
        podset = SUSPEND[plural]["podset"]
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {
                "name": f"{kind.lower()}-{name}-{digest}",
                "namespace": self.namespace,
                "uid": str(uuid.uuid4()),
                "labels": {JOB_UID_LABEL: uid},
                "ownerReferences": [{"kind": kind, "name": name, "uid": uid, "controller": True}],
            },
            "spec": {"queueName": job["metadata"]["labels"][QUEUE_LABEL], "podSets": [{"name": podset}]},
            "status": {
                "conditions": [
                    _condition("QuotaReserved", "False", "Pending", self.kueue_pending_message.format(podset=podset))
                ]
            },
        }
        with self.changed:
            self._stored("workloads", "ADDED", workload)
        self.add_event(
            kind,
            name,
            "CreatedWorkload",
            f"Created Workload: {self.namespace}/{workload['metadata']['name']}",
            "Normal",
        )
        if plural == "pytorchjobs":
            self._operator_condition(
                plural, name, "Created", "True", "PyTorchJobCreated", f"PyTorchJob {name} is created."
            )
        message = f"{kind} {name} is suspended." if plural == "pytorchjobs" else "TrainJob is suspended"
        reason = SUSPEND[plural]["reason"].format("Suspended")
        self._operator_condition(plural, name, "Suspended", "True", reason, message)
        self.add_event(kind, name, reason, message, "Normal")

    def _operator_condition(self, plural: str, name: str, kind: str, status: str, reason: str, message: str) -> None:
        """Set a condition as the operator does: the Training Operator moves it to the end of the list
        (pkg/util/status.go setCondition), Trainer v2 updates it in place (meta.SetStatusCondition)."""
        with self.changed:
            job = self.objects.get(plural, {}).get(name)
            if job is None:
                return
            conditions = job.setdefault("status", {}).setdefault("conditions", [])
            new = _condition(kind, status, reason, message)
            if plural == "trainjobs" and any(c["type"] == kind for c in conditions):
                job["status"]["conditions"] = [new if c["type"] == kind else c for c in conditions]
            else:
                job["status"]["conditions"] = [c for c in conditions if c["type"] != kind] + [new]
            self._stored(plural, "MODIFIED", job)

    # --- the API --------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any] | Iterator[str]:
        self.requests.append(Request(method, path, query))
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 3 and method == "GET":
            return self._discovery(f"{parts[1]}/{parts[2]}")
        if parts[0] == "apis" and len(parts) >= 6 and parts[3] == "namespaces":
            group_version, plural = f"{parts[1]}/{parts[2]}", parts[5]
            name = parts[6] if len(parts) > 6 else None
            if plural not in self.served.get(group_version, {}):
                return 404, _status(
                    404, "NotFound", f"the server could not find the requested resource ({plural}.{group_version})"
                )
            if plural in self.forbidden:
                return self._forbidden(method, query, parts[1], plural, name)
            if method == "POST" and name is None:
                return self._create(group_version, plural, query, body)
            return self._resource(method, plural, name, query, body)
        if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[4] in CORE:
            name = parts[5] if len(parts) > 5 else None
            resource = parts[4] + (f"/{parts[6]}" if len(parts) == 7 else "")
            if resource in self.forbidden:
                return self._forbidden(method, query, "", resource, name)
            if resource == "pods/log":
                return self._log(parts[5], query)
            return self._resource(method, parts[4], name, query, body)
        return 404, _status(404, "NotFound", f"no route for {method} {path}")

    def _forbidden(self, method: str, query: dict[str, str], group: str, resource: str, name: str | None):
        """403 as the RBAC authorizer words it (k8s.io/apiserver endpoints/handlers/responsewriters/errors.go)."""
        verb = {"POST": "create", "DELETE": "delete", "PUT": "update"}.get(method) or (
            "get" if name else "watch" if query.get("watch") == "true" else "list"
        )
        plural, _, subresource = resource.partition("/")
        qualified = f"{plural}.{group}" if group else plural
        user = f"system:serviceaccount:{self.namespace}:pipeline-runner-dspa"
        target = f'resource "{plural}"' + (f' with subresource "{subresource}"' if subresource else "")
        reason = f'User "{user}" cannot {verb} {target} in API group "{group}" in the namespace "{self.namespace}"'
        subject = f'{qualified} "{name}"' if name else qualified
        return 403, _status(403, "Forbidden", f"{subject} is forbidden: {reason}")

    def _create(self, group_version: str, plural: str, query: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        """Create a custom object as the API server and Kueue's webhook do.

        Spec fields the CRD does not know are pruned silently, unless the client
        asked for ``fieldValidation=Strict``: then the create is refused with the
        decoder's strict error (apiextensions-apiserver customresource_handler.go
        schemaCoercingDecoder, wrapped by apiserver handlers/rest.go transformDecodeError).
        """
        kind, version = self.served[group_version][plural], group_version.split("/")[1]
        unknown = sorted(field for field in body.get("spec") or {} if field in self.unknown_spec_fields.get(plural, ()))
        if unknown and query.get("fieldValidation") == "Strict":
            errors = ", ".join(f'unknown field "spec.{field}"' for field in unknown)
            message = f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {errors}'
            return 400, _status(400, "BadRequest", message)
        name = body["metadata"]["name"]
        queued = plural in SUSPEND and QUEUE_LABEL in (body["metadata"].get("labels") or {})
        with self.changed:
            if name in self.objects.get(plural, {}):
                return 409, _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
            item = copy.deepcopy(body)
            for field in unknown:
                del item["spec"][field]
            item["metadata"].update(uid=str(uuid.uuid4()), namespace=self.namespace)
            if queued:  # Kueue's mutating webhook suspends a queued job as it is created
                _set_path(item.setdefault("spec", {}), SUSPEND[plural]["path"], True)
            self._stored(plural, "ADDED", item)
            created = copy.deepcopy(item)
        if queued:
            self._hold_in_queue(plural, created)
        return 201, created

    def _replace(self, plural: str, name: str, body: dict[str, Any]) -> tuple[int, Any]:
        """Replace an object as the API server does: optimistic concurrency on resourceVersion
        (k8s.io/apiserver registry/generic/registry/store.go Update), the status left to the status subresource."""
        with self.changed:
            current = self.objects.get(plural, {}).get(name)
            if current is None:
                return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                message = (
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; please '
                    "apply your changes to the latest version and try again"
                )
                return 409, _status(409, "Conflict", message)
            item = copy.deepcopy(body)
            item["metadata"].update(uid=current["metadata"]["uid"], namespace=self.namespace)
            item["status"] = copy.deepcopy(current.get("status") or {})
            self._stored(plural, "MODIFIED", item)
            return 200, copy.deepcopy(item)

    def _discovery(self, group_version: str) -> tuple[int, Any]:
        if group_version not in self.served:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        resources = [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": True,
                "kind": kind,
                "verbs": ["create", "delete", "get", "list", "update", "watch"],
            }
            for plural, kind in self.served[group_version].items()
        ]
        return 200, {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }

    def _resource(
        self, method: str, plural: str, name: str | None, query: dict[str, str], body: Any
    ) -> tuple[int, Any] | Iterator[str]:
        if method == "GET" and name is not None:
            with self.changed:
                item = self.objects.get(plural, {}).get(name)
            return (200, item) if item else (404, _status(404, "NotFound", f'{plural} "{name}" not found'))
        if method == "DELETE" and name is not None:
            with self.changed:
                item = self.objects.get(plural, {}).get(name)
                if item is None:
                    return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
                self._stored(plural, "DELETED", item)
                for pod in [
                    p
                    for p in self.objects.get("pods", {}).values()
                    if name in (p["metadata"].get("labels") or {}).values()
                ]:
                    self._stored("pods", "DELETED", pod)  # Foreground propagation: the job's pods go first
                for workload in self._workloads_of(item):
                    self._stored("workloads", "DELETED", workload)  # owned by the job: garbage-collected
                return 200, item
        if method == "PUT" and name is not None:
            return self._replace(plural, name, body)
        if method == "GET" and query.get("watch") == "true":
            return self._watch(plural, query)
        if method == "GET":
            unsupported = [
                field
                for field, _ in _field_requirements(query)
                if field not in {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, set())
            ]
            if unsupported:
                return 400, _status(400, "BadRequest", f"field label not supported: {unsupported[0]}")
            with self.changed:
                items = [
                    copy.deepcopy(item) for item in self.objects.get(plural, {}).values() if _selected(item, query)
                ]
                return 200, {
                    "kind": "List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.resource_version)},
                    "items": items,
                }
        return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")

    def _watch(self, plural: str, query: dict[str, str]) -> Iterator[str]:
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds", 1800))
        with self.changed:
            drops = self.drops
            if since < self.oldest_watchable:
                expired = _status(410, "Expired", f"too old resource version: {since} ({self.oldest_watchable})")
                yield json.dumps({"type": "ERROR", "object": expired})
                return
        while True:
            with self.changed:
                pending = [
                    (rv, event, item)
                    for rv, p, event, item in self.history
                    if p == plural and rv > since and _selected(item, query)
                ]
                while not pending and self.drops == drops and time.monotonic() < deadline:
                    self.changed.wait(max(0.0, deadline - time.monotonic()))
                    pending = [
                        (rv, event, item)
                        for rv, p, event, item in self.history
                        if p == plural and rv > since and _selected(item, query)
                    ]
                if self.drops != drops:
                    raise Dropped()
            if not pending and time.monotonic() >= deadline:
                return
            for rv, event, item in pending:
                since = rv
                yield json.dumps({"type": event, "object": item})

    def _log(self, pod: str, query: dict[str, str]) -> tuple[int, Any] | Iterator[str]:
        with self.changed:
            if pod not in self.objects.get("pods", {}):
                return 404, _status(404, "NotFound", f'pods "{pod}" not found')
            status = self._container(pod)
            run = status["restartCount"] - (1 if query.get("previous") == "true" else 0)
            if "waiting" in status["state"]:
                return 400, _status(400, "BadRequest", f'container in pod "{pod}" is waiting to start')
        if query.get("follow") != "true":
            lines = self.logs.get((pod, run), [])[-int(query.get("tailLines", 10**9)) :]
            return 200, "".join(f"{text}\n" for _, text in lines)
        return self._follow_log(pod, run, query)

    def _follow_log(self, pod: str, run: int, query: dict[str, str]) -> Iterator[str]:
        since = time.time() - float(query["sinceSeconds"]) if "sinceSeconds" in query else 0.0
        sent = 0
        with self.changed:
            drops = self.drops
        while True:
            with self.changed:
                lines = self.logs.get((pod, run), [])
                status = self.objects.get("pods", {}).get(pod, {}).get("status", {}).get("containerStatuses", [{}])[0]
                ended = (
                    pod not in self.objects.get("pods", {})
                    or status.get("restartCount") != run
                    or "terminated" in status.get("state", {})
                )
                if len(lines) == sent and not ended and self.drops == drops:
                    self.changed.wait(5)
                    continue
                if self.drops != drops:
                    raise Dropped()
                fresh, sent = lines[sent:], len(lines)
            for stamp, text in fresh:
                if datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() >= since - 1:
                    yield f"{stamp} {text}" if query.get("timestamps") == "true" else text
                    with self.changed:
                        self.streamed.add((pod, text))
                        self.changed.notify_all()
            if ended and sent == len(self.logs.get((pod, run), [])):
                return


def _failure_status(code: int) -> dict[str, Any]:
    """The API server's Status for a request it cannot serve now (k8s.io/apiserver filters: maxinflight, APF)."""
    if code == 429:
        return _status(429, "TooManyRequests", "Too many requests, please try again later.")
    return _status(code, "ServiceUnavailable", "the server is currently unable to handle the request")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}


def _set_path(item: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        item = item.setdefault(key, {})
    item[path[-1]] = value


def _field_requirements(query: dict[str, str]) -> list[tuple[str, str]]:
    return [tuple(r.partition("=")[::2]) for r in filter(None, query.get("fieldSelector", "").split(","))]


def _field(item: dict[str, Any], path: str) -> Any:
    value: Any = item
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _selected(item: dict[str, Any], query: dict[str, str]) -> bool:
    labels = item["metadata"].get("labels") or {}
    for requirement in filter(None, query.get("labelSelector", "").split(",")):
        key, _, value = requirement.partition("=")
        if labels.get(key) != value:
            return False
    return all(_field(item, field) == value for field, value in _field_requirements(query))


def _handler_for(fake: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streams, as the API server sends them

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def handle(self) -> None:
            try:
                super().handle()
            except ConnectionResetError:  # a client gone between two requests (a launcher killed by a test)
                self.close_connection = True

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            # The Python client writes booleans as True/False; the API server parses them either way.
            query = {
                key: values[-1].lower() if values[-1] in ("True", "False") else values[-1]
                for key, values in parse_qs(url.query).items()
            }
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            failure = fake.take_failure(method, url.path, query)
            if failure == DROP:  # no answer: the client sees the connection closed under its request
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            answer = (failure, _failure_status(failure)) if failure else fake.handle(method, url.path, query, body)
            if isinstance(answer, tuple):
                code, payload = answer
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for line in answer:
                    data = (line + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except Dropped:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:  # the client has gone already
                    pass
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PUT(self) -> None:
            self._serve("PUT")

    return Handler
