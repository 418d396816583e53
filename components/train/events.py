"""The Kubernetes Events of a training job and of its pods, printed into the step's log, each once.

Kubernetes says why a pod does not start (no node fits, a volume that does not
attach or mount, an image that does not pull, a ResourceQuota refusing it) only
in Events. ``EventLog`` reads those of chosen objects through the core v1
Events API (field selectors on ``involvedObject``, the ones
kubernetes pkg/apis/core/v1/conversion.go allows for events), prints each event
once and again when its count grows, and keeps the newest few per object for
the start timeout's report.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, TextIO

from kubernetes.client.exceptions import ApiException

from common.kube import Cluster
from components.train.api_server import NETWORK_ERRORS, REQUEST_TIMEOUT, error_message
from components.train.kinds import TRAINJOB, JobKind
from components.train.manifests import TRAINJOB_REPLICATED_JOB

EVENTS_IN_REPORT = 5  # the last events of each object that go into the start timeout's report


def event_count(event: dict[str, Any]) -> int:
    """How often the event happened: ``count``, or ``series.count`` for events written through events.k8s.io."""
    return event.get("count") or (event.get("series") or {}).get("count") or 1


def event_time(event: dict[str, Any]) -> str:
    series = event.get("series") or {}
    return event.get("lastTimestamp") or series.get("lastObservedTime") or event.get("eventTime") or ""


def event_text(event: dict[str, Any]) -> str:
    """``Warning FailedMount: MountVolume.SetUp failed for volume "workspace" : ... (3 times)``"""
    count = event_count(event)
    message = " ".join((event.get("message") or "").split())
    repeated = f" ({count} times)" if count > 1 else ""
    return f"{event.get('type', '')} {event.get('reason', '')}: {message}{repeated}"


class EventLog:
    """Prints Kubernetes Events of chosen objects, each once, and again when it repeats."""

    def __init__(self, cluster: Cluster, out: TextIO) -> None:
        self.cluster, self.out = cluster, out
        self.printed: dict[str, int] = {}  # event uid -> the count last printed
        self.latest: dict[str, dict[str, str]] = defaultdict(dict)  # label -> event uid -> its newest line
        self.readable = True

    def last(self, label: str) -> list[str]:
        """The newest events printed for ``label``, oldest first, each once with its latest count."""
        return list(self.latest[label].values())[-EVENTS_IN_REPORT:]

    def poll(self, selector: str, label: str | None = None, warnings_only: bool = False) -> None:
        """Print the new events matching the field ``selector``, prefixed with ``label`` (default: their object)."""
        if not self.readable:
            return
        try:
            listing = json.loads(
                self.cluster.core.list_namespaced_event(
                    self.cluster.namespace,
                    field_selector=selector,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT,
                ).data
            )
        except ApiException as error:
            if error.status == 403:
                self.readable = False
                print(
                    f"cannot read the Kubernetes events of the job and its pods ({error_message(error)}); "
                    "apply the current pipelines/rbac.yaml to see here why pods do not start. Carrying on.",
                    file=self.out,
                    flush=True,
                )
            return
        except NETWORK_ERRORS:
            return
        for event in sorted(listing.get("items") or [], key=event_time):
            if warnings_only and event.get("type") != "Warning":
                continue
            uid, count = event["metadata"]["uid"], event_count(event)
            if self.printed.get(uid, 0) >= count:
                continue
            self.printed[uid] = count
            involved = event.get("involvedObject") or {}
            prefix = label or f"{involved.get('kind', '')} {involved.get('name', '')}"
            self.latest[prefix].pop(uid, None)  # a repeated event moves to the end
            self.latest[prefix][uid] = event_text(event)
            print(f"[{prefix}] {event_text(event)}", file=self.out, flush=True)


def job_event_selectors(kind: JobKind, name: str) -> list[str]:
    """Field selectors for the Events of the job and of what stands between it and its pods.

    The job's name alone also matches a TrainJob's JobSet (same name). Pods that
    a ResourceQuota refuses are reported as FailedCreate on whoever creates
    them: the PyTorchJob itself, or a TrainJob's child Job ``<name>-node-0``
    (JobSet names it ``<jobset>-<replicated job>-<index>``).
    """
    selectors = [f"involvedObject.name={name}"]
    if kind is TRAINJOB:
        selectors.append(f"involvedObject.kind=Job,involvedObject.name={name}-{TRAINJOB_REPLICATED_JOB}-0")
    return selectors
