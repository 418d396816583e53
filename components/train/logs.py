"""The logs of every replica of a training job, streamed into the launcher's own log.

A pipeline step's log is the one place users look, so the master's log alone
is not enough: a worker that runs out of memory or fails to reach the master
explains a failure only in its own log. ``ReplicaLogs`` watches the job's pods,
follows the trainer container of each one as it starts (and again after each
restart), prefixes every line with its replica (``[master-0]``, ``[worker-1]``,
``[node-0]``) and keeps each replica's last lines for the failure report. It
also says why a pod is not starting (unschedulable, image pull errors), which
otherwise looks like a silent hang.

A log stream that drops while its container still runs is followed again;
lines are asked for with their kubelet timestamps so none is printed twice.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from common.kube import Cluster
from components.train.api_server import NETWORK_ERRORS, REQUEST_TIMEOUT, watch_objects
from components.train.kinds import JobKind
from components.train.reports import TAIL_LINES

LOG_REQUEST_TIMEOUT = (10, 300)  # a trainer silent for 5 minutes (downloading a model) gets its log asked for again
WAITING_REASONS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
)


@dataclass(frozen=True)
class ReplicaExit:
    """A trainer container that ended with a non-zero exit code."""

    replica: str
    pod: str
    exit_code: int
    reason: str
    finished_at: str


def container_status(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return status
    return None


def has_started(pod: dict[str, Any], container: str) -> bool:
    """Whether the trainer container got past scheduling, volumes and image: it runs, or ran and ended.

    A container that crashes and restarts has started: the trainer's own log and
    the job's restart limit deal with it, not the start timeout.
    """
    status = container_status(pod, container) or {}
    state, last = status.get("state") or {}, status.get("lastState") or {}
    running = "running" in state and (pod.get("status") or {}).get("phase") == "Running"
    return running or "terminated" in state or "terminated" in last


def failed_replicas(pods: list[dict[str, Any]], kind: JobKind) -> list[ReplicaExit]:
    """Non-zero exits of the trainer container (current or previous run), earliest first: the first is
    usually the cause.
    """
    exits = []
    for pod in pods:
        status = container_status(pod, kind.container) or {}
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated")
            if terminated and terminated.get("exitCode"):
                exits.append(
                    ReplicaExit(
                        kind.replica_name(pod),
                        pod["metadata"]["name"],
                        terminated["exitCode"],
                        terminated.get("reason") or "",
                        terminated.get("finishedAt") or "",
                    )
                )
                break
    return sorted(exits, key=lambda item: item.finished_at)


def timestamp_key(stamp: str) -> tuple[str, int] | None:
    """An orderable key for a kubelet RFC 3339 timestamp (nanosecond digits vary in length, so strings do not sort)."""
    if not stamp.endswith("Z") or "T" not in stamp:
        return None
    whole, _, fraction = stamp[:-1].partition(".")
    return whole, int((fraction + "000000000")[:9]) if fraction.isdigit() else 0


def seconds_since(key: tuple[str, int]) -> float:
    moment = datetime.fromisoformat(key[0]).replace(tzinfo=timezone.utc).timestamp() + key[1] / 1e9
    return time.time() - moment


class ReplicaLogs:
    """Follows the trainer container of every pod of one job, on background threads."""

    def __init__(self, cluster: Cluster, kind: JobKind, job_name: str, out: TextIO) -> None:
        self.cluster, self.kind, self.job_name, self.out = cluster, kind, job_name, out
        self.tails: dict[str, deque[str]] = defaultdict(lambda: deque(maxlen=TAIL_LINES))
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> newest state seen (deleted ones too), for the failure report
        self.deleted: set[str] = set()  # uids of the pods above that are gone
        self.started: set[str] = set()  # replicas whose trainer container has run (is running, or ran and ended)
        self._followers: dict[tuple[str, int], threading.Thread] = {}
        self._notices: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._watch_pods, name=f"pods-of-{self.job_name}", daemon=True).start()

    def drain(self, timeout: float) -> None:
        """Follow every pod the job has now, then wait up to ``timeout`` seconds for the streams to end.

        A short job can finish before the pod watch has shown this launcher all of
        its pods; a final listing makes sure each one's log is printed.
        """
        deadline = time.monotonic() + timeout
        try:
            listing = self.cluster.core.list_namespaced_pod(
                self.cluster.namespace,
                label_selector=self.kind.pod_selector(self.job_name),
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            for pod in json.loads(listing.data).get("items") or []:
                self._see(pod, deleted=False)
        except (ApiException, *NETWORK_ERRORS):
            pass  # the watch's view has to do
        with self._lock:
            followers = list(self._followers.values())
        for thread in followers:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Stop watching and following (threads leave when their current stream ends)."""
        self._stopped.set()

    def emit(self, replica: str, text: str) -> None:
        with self._lock:
            if self._stopped.is_set():  # the step has moved on (its report is written); late lines would interleave
                return
            out = self.out or sys.stdout
            out.write(f"[{replica}] {text}\n")  # one write: the step's progress lines come from another thread
            out.flush()
            self.tails[replica].append(text)

    def snapshot(self) -> list[dict[str, Any]]:
        """The newest state seen of every pod of the job, deleted ones included."""
        with self._lock:
            return list(self.pods.values())

    def tail(self, replica: str) -> list[str]:
        with self._lock:
            return list(self.tails.get(replica, ()))

    def started_replicas(self) -> set[str]:
        """The replicas whose trainer container has started at least once, as seen so far."""
        with self._lock:
            return set(self.started)

    def waiting_pods(self) -> list[dict[str, Any]]:
        """The job's pods that exist and whose trainer container has not started: pending, or still being set
        up (volumes, image), which is where a job that does not start is stuck.
        """
        with self._lock:
            return [
                pod
                for uid, pod in self.pods.items()
                if uid not in self.deleted
                and not has_started(pod, self.kind.container)
                and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]

    def _watch_pods(self) -> None:
        core = self.cluster.core
        selector = self.kind.pod_selector(self.job_name)
        try:
            events = watch_objects(
                core.list_namespaced_pod,
                self.cluster.namespace,
                label_selector=selector,
                stream_seconds=lambda: 60,
                out=self.out,
                stop=self._stopped,
            )
            for event in events:
                if event is not None and not self._stopped.is_set():
                    self._see(event[1], deleted=event[0] == "DELETED")
        except ApiException as error:
            # The job goes on; only its logs are missing here. Say why instead of dying silently.
            print(
                f"cannot watch the pods of {self.job_name} ({error.status} {error.reason}); "
                "their logs will not appear here. "
                "Check that the RBAC of pipelines/rbac.yaml is applied.",
                file=self.out,
                flush=True,
            )

    def _see(self, pod: dict[str, Any], deleted: bool) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            self.pods[uid] = pod  # kept after deletion: its exit code may explain a failure
            if deleted:
                self.deleted.add(uid)
            elif has_started(pod, self.kind.container):
                self.started.add(self.kind.replica_name(pod))
        if deleted:
            return
        self._notice_why_waiting(pod)
        status = container_status(pod, self.kind.container)
        state = (status or {}).get("state") or {}
        if "running" in state or "terminated" in state:
            key = (uid, status.get("restartCount", 0))
            # The pod watch and drain() may both see this run of the container; a follower is registered
            # only once started, so drain() never joins a thread that has not begun.
            with self._lock:
                if key in self._followers:
                    return
                thread = threading.Thread(
                    target=self._follow, args=(pod, key[1]), name=f"log-{pod['metadata']['name']}", daemon=True
                )
                thread.start()
                self._followers[key] = thread

    def _notice_why_waiting(self, pod: dict[str, Any]) -> None:
        replica = self.kind.replica_name(pod)
        notices = [
            f"pod not scheduled: {condition.get('message', '')}"
            for condition in (pod.get("status") or {}).get("conditions") or []
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable"
        ]
        waiting = ((container_status(pod, self.kind.container) or {}).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in WAITING_REASONS:
            notices.append(f"container not starting: {waiting['reason']}: {waiting.get('message', '')}")
        for notice in notices:
            with self._lock:  # the pod watch and drain() may both see the pod
                fresh = (replica, notice) not in self._notices
                self._notices.add((replica, notice))
            if fresh:
                self.emit(replica, notice)

    def _still_running(self, name: str, uid: str, restart_count: int) -> bool:
        """Whether the run of the container we followed is still going (asked afresh: the pod watch may lag)."""
        try:
            pod = json.loads(
                self.cluster.core.read_namespaced_pod(
                    name, self.cluster.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                ).data
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        status = container_status(pod, self.kind.container) or {}
        same_run = pod["metadata"]["uid"] == uid and status.get("restartCount", 0) == restart_count
        return same_run and "running" in (status.get("state") or {})

    def _follow(self, pod: dict[str, Any], restart_count: int) -> None:
        """Print the log of one run of the trainer container, following it again if the stream breaks."""
        name, uid, replica = pod["metadata"]["name"], pod["metadata"]["uid"], self.kind.replica_name(pod)
        if restart_count:
            self.emit(
                replica,
                f"--- trainer container restarted (restart {restart_count}); it resumes from the newest checkpoint ---",
            )
        last: tuple[str, int] | None = None
        while not self._stopped.is_set():
            # Ask again from a minute before the last line printed (clocks differ); repeats are skipped.
            since = {"since_seconds": int(seconds_since(last)) + 60} if last else {}
            try:
                lines = watch.Watch().stream(
                    self.cluster.core.read_namespaced_pod_log,
                    name,
                    self.cluster.namespace,
                    container=self.kind.container,
                    timestamps=True,
                    _request_timeout=LOG_REQUEST_TIMEOUT,
                    **since,
                )
                for line in lines:
                    stamp, _, text = line.partition(" ")
                    key = timestamp_key(stamp)
                    if key is None:
                        self.emit(replica, line)
                        continue
                    if last is not None and key <= last:
                        continue  # printed before the stream broke
                    last = key
                    self.emit(replica, text)
            except ApiException as error:
                if error.status in (400, 404):  # container gone or not started: the pod watch says what comes next
                    return
                time.sleep(1)
                continue
            except NETWORK_ERRORS:  # a broken stream: whatever the container did since, its log is still there
                time.sleep(1)
                continue
            # The kubelet ends the stream when the container ends; a stream can also be closed early by a proxy.
            try:
                if not self._still_running(name, uid, restart_count):
                    return
            except (ApiException, *NETWORK_ERRORS):
                pass
            time.sleep(1)
