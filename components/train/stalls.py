"""Why a training job has not started yet, said while it waits; and the start timeout that bounds the wait.

A job that waits looks like a hang in the step's log unless someone says why.
It waits for one of three things, and ``Startup`` has each said:

- Kueue holds it suspended until its ClusterQueue has quota for all its pods:
  ``kueue.Admission`` says so, how long and why, and when it is admitted.
- Its pods are pending (no node fits), stuck being set up (a volume that does
  not attach or mount, an image that does not pull), or not created at all (a
  ResourceQuota refuses them): the Events of the waiting pods and of the job
  (``events.EventLog``) are printed every ``EVENT_POLL_SECONDS`` until every
  replica has started.
- The start timeout bounds that wait, so a job that cannot start fails the
  step with the events that say why instead of waiting out the overall
  timeout. Time held by Kueue does not count unless asked for: waiting in a
  queue is what a queue is for.

Kueue suspends a PyTorchJob through ``spec.runPolicy.suspend`` and a TrainJob
through ``spec.suspend``; the Training Operator v1.9 then sets the condition
``Suspended`` (reason ``PyTorchJobSuspended``, pkg/controller.v1/common/job.go)
and Trainer v2 ``Suspended`` (reason ``Suspended``, pkg/controller/
trainjob_controller.go).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, TextIO

from common.kube import Cluster
from components.train.events import EventLog, job_event_selectors
from components.train.kinds import JobKind
from components.train.kueue import Admission
from components.train.logs import ReplicaLogs, container_status
from components.train.options import PARAMETER
from components.train.reports import duration_text

EVENT_POLL_SECONDS = 15  # how often the Events of a job that has not started are read
START_TIMEOUT_PARAMETER = PARAMETER["start_timeout_minutes"]
QUEUE_TIME_PARAMETER = PARAMETER["start_timeout_includes_queue"]


class NotStarted(Exception):
    """The job's replicas were not all running within the start timeout; the message is the report."""


class Stopwatch:
    """Seconds since the job was created, with and without the time it was held suspended."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.held_before = 0.0  # seconds of suspensions that have ended
        self.held_since: float | None = None

    @property
    def suspended(self) -> bool:
        return self.held_since is not None

    def hold(self, suspended: bool) -> float | None:
        """Note whether the job is suspended now; how long it was, when a suspension has just ended."""
        now = time.monotonic()
        if suspended and self.held_since is None:
            self.held_since = now
        elif not suspended and self.held_since is not None:
            ended, self.held_since = now - self.held_since, None
            self.held_before += ended
            return ended
        return None

    def held(self) -> float:
        """Seconds the current suspension has lasted (0 when not suspended)."""
        return time.monotonic() - self.held_since if self.held_since is not None else 0.0

    def total(self) -> float:
        return time.monotonic() - self.started

    def active(self) -> float:
        """Seconds not spent suspended: what the overall timeout counts."""
        return self.total() - self.held_before - self.held()


def active_seconds(kind: JobKind, job: dict[str, Any]) -> float:
    """How long an existing job has been active, not held by Kueue, from its status; 0 while it is held.

    A PyTorchJob's ``status.startTime`` is set when it starts and again when it
    resumes from suspension (training-operator pkg/controller.v1/common/job.go);
    a TrainJob's is the time its ``Suspended`` condition turned False (resumed),
    else its creation.
    """
    if kind.suspended(job):
        return 0.0
    status = job.get("status") or {}
    stamp = status.get("startTime")
    if not stamp:
        resumed = [
            condition.get("lastTransitionTime")
            for condition in status.get("conditions") or []
            if condition.get("type") == "Suspended" and condition.get("status") == "False"
        ]
        stamp = resumed[-1] if resumed else job.get("metadata", {}).get("creationTimestamp")
    try:
        since = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (AttributeError, ValueError):  # no timestamp, or not RFC 3339: count from now rather than fail
        return 0.0
    return max(0.0, (datetime.now(timezone.utc) - since).total_seconds())


def pod_state(pod: dict[str, Any], container: str) -> str:
    """``Pending, unschedulable: 0/3 nodes are available ...`` or ``Pending, container ContainerCreating``."""
    status = pod.get("status") or {}
    parts = [status.get("phase") or "Pending"]
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            parts.append(f"unschedulable: {condition.get('message', '')}")
    waiting = ((container_status(pod, container) or {}).get("state") or {}).get("waiting")
    if waiting:
        parts.append(f"container {waiting.get('reason', 'waiting')}")
    return ", ".join(parts)


class Startup:
    """The start clock of one job, and what the log says until all its replicas have started.

    ``check()`` is called whenever the launcher looks at the job (each change,
    and at least every ``seconds_to_next()``); it raises NotStarted when the
    start timeout has passed. Once every replica has started, it is done: a
    pod restarted later is bounded by the overall timeout only.
    """

    def __init__(
        self,
        cluster: Cluster,
        kind: JobKind,
        manifest: dict[str, Any],
        logs: ReplicaLogs,
        out: TextIO,
        start_timeout: float,
        start_timeout_includes_queue: bool,
    ) -> None:
        self.kind, self.logs = kind, logs
        self.name = manifest["metadata"]["name"]
        self.expected = kind.replicas(manifest)
        self.start_timeout, self.start_timeout_includes_queue = start_timeout, start_timeout_includes_queue
        self.clock = Stopwatch()
        self.admission = Admission(cluster, kind, self.name, out)
        self.events = EventLog(cluster, out)
        self.job: dict[str, Any] = manifest
        self.active_before = 0.0  # how long an adopted job had been active before this launcher
        self.next_poll = time.monotonic() + EVENT_POLL_SECONDS
        self.started = False

    def adopt(self, job: dict[str, Any]) -> None:
        """Count the overall timeout from the existing job's own record, not from now: a retried launcher must
        not give a job that has trained for hours a fresh timeout. The start timeout starts afresh: this launcher
        cannot know when the replicas first ran, and those already running count at once."""
        self.active_before = active_seconds(self.kind, job)

    def job_active(self) -> float:
        """Seconds the job has been active (not held by Kueue): what the overall timeout counts."""
        return self.active_before + self.clock.active()

    def see(self, job: dict[str, Any]) -> None:
        """Follow the job's suspension as it changes."""
        self.job = job
        ended = self.clock.hold(self.kind.suspended(job))
        if ended is not None:
            self.admission.admitted(job, ended)
            self.next_poll = time.monotonic() + EVENT_POLL_SECONDS  # its pods are only now being created

    def elapsed(self) -> float:
        """What the start timeout counts."""
        return self.clock.total() if self.start_timeout_includes_queue else self.clock.active()

    def check(self) -> None:
        """Say what the job waits for, when due; raise NotStarted once it has waited past the start timeout."""
        if self.clock.suspended:  # also once started: Kueue may preempt the job, and admit it again later
            self.admission.waiting(self.job, self.clock.held())
        if self.started:
            return
        if not self.clock.suspended:
            if set(self.expected) <= set(self.logs.started_replicas()):
                self.started = True
                return
            if time.monotonic() >= self.next_poll:
                self.poll_events()
        if self.elapsed() >= self.start_timeout:
            if not self.clock.suspended:
                self.poll_events()  # the newest events, printed before the report quotes them
            raise NotStarted(self.report())

    def seconds_to_next(self) -> float:
        """How soon ``check()`` has something to do: a notice, a poll, the start timeout."""
        now = time.monotonic()
        due = [self.admission.next_notice] if self.clock.suspended else []
        if not self.started and not self.clock.suspended:
            due.append(self.next_poll)
        if not self.started and (not self.clock.suspended or self.start_timeout_includes_queue):
            due.append(now + self.start_timeout - self.elapsed())
        return max(0.0, min(due, default=float("inf")) - now)

    def poll_events(self) -> None:
        """Print the new events of the job and of its pods that have not started."""
        self.next_poll = time.monotonic() + EVENT_POLL_SECONDS
        for selector in job_event_selectors(self.kind, self.name):
            # The operators' Normal events on the job (pods created, suspended, resumed) say nothing new.
            self.events.poll(selector, warnings_only=True)
        for pod in self.logs.waiting_pods():
            self.events.poll(
                f"involvedObject.kind=Pod,involvedObject.name={pod['metadata']['name']}",
                label=self.kind.replica_name(pod),
            )

    def report(self) -> str:
        counted = "counted" if self.start_timeout_includes_queue else "not counted"
        lines = [
            f"{self.kind.kind} {self.name} did not start within the start timeout of "
            f"{duration_text(self.start_timeout)} (time waiting for Kueue admission {counted}) and was deleted."
        ]
        if self.clock.suspended:
            lines.append(f"It was still {self.admission.notice(self.job, self.clock.held())}.")
            lines.append(
                f"Ask for quota in that queue, use another queue_name, raise {START_TIMEOUT_PARAMETER}, or turn "
                f"{QUEUE_TIME_PARAMETER} off so time in the queue does not count."
            )
            return "\n".join(lines)
        lines.append(f"Replicas not running: {self.not_running()}.")
        started = self.logs.started_replicas()
        recent = [
            f"  [{label}] {line}"
            for label in self.events.latest
            if label not in started
            for line in self.events.last(label)
        ]
        if recent:
            lines.append("Their last events:")
            lines += recent
        else:
            lines.append("Kubernetes recorded no events for them (or they could not be read).")
        lines.append(
            "Fix what the events say (a volume that does not mount, an image that does not pull, quota, no node "
            f"with the GPUs asked for); if the cluster is only slow to start them (a large image, nodes being "
            f"added), raise {START_TIMEOUT_PARAMETER}."
        )
        return "\n".join(lines)

    def not_running(self) -> str:
        """``worker-0 (pod x: Pending, container ContainerCreating), worker-1 (no pod yet)``"""
        started = self.logs.started_replicas()
        waiting = {self.kind.replica_name(pod): pod for pod in self.logs.waiting_pods()}
        parts = []
        for replica in [r for r in self.expected if r not in started] + sorted(set(waiting) - set(self.expected)):
            pod = waiting.get(replica)
            state = f"pod {pod['metadata']['name']}: {pod_state(pod, self.kind.container)}" if pod else "no pod yet"
            parts.append(f"{replica} ({state})")
        return ", ".join(parts) or "none of those expected (their pods are named otherwise)"
