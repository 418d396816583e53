"""Run one training job on the cluster to its end: create, follow, report, clean up.

The step's outcome is the job's outcome. A failed job fails the step with the
replica that failed first, its exit code or reason and its last log lines,
because a launcher that returns normally on a failed job lets the pipeline go
on to evaluate and publish a model that was never trained. A job that outlives
the timeout, that does not start within the start timeout, or whose launcher is
stopped (the run was cancelled: SIGTERM), is deleted so it does not hold GPUs
(or its place in a queue) for nobody. While it has not started, the log says
what it waits for (components/train/stalls.py).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from kubernetes.client.exceptions import ApiException

from common.kube import Cluster
from components.train.api_server import (
    NETWORK_ERRORS,
    REQUEST_TIMEOUT,
    STREAM_SECONDS,
    api_problem,
    create_job,
    delete_job,
    require_kind,
    watch_objects,
)
from components.train.kinds import JobKind
from components.train.logs import ReplicaLogs, failed_replicas
from components.train.options import PARAMETER
from components.train.owner import launcher_disruption
from components.train.reports import TAIL_LINES, TrainingFailed, exit_code_text, quoted
from components.train.signals import Terminated, sigterm_raises
from components.train.stalls import NotStarted, Startup

DRAIN_SECONDS = 30  # how long to wait for the replicas' last log lines once the job has ended
TIMEOUT_PARAMETER = PARAMETER["timeout_minutes"]


def run_job(
    cluster: Cluster,
    kind: JobKind,
    manifest: dict[str, Any],
    timeout: float,
    start_timeout: float,
    start_timeout_includes_queue: bool = False,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Create the job and stream its replicas' logs until it succeeds (returns the job) or fails
    (raises TrainingFailed).

    Deletes the job, with TrainingFailed, when its replicas are not all running
    ``start_timeout`` seconds after its creation, and when it outlives ``timeout``
    seconds. Neither clock counts the time Kueue holds the job suspended before
    admitting it (or after preempting it): a job waiting hours in its queue is
    neither stuck nor training too long. ``start_timeout_includes_queue`` makes the start
    timeout count it, for users who would rather fail than wait in a queue; the
    overall timeout never does. Also deletes the job when this process is
    interrupted (``Terminated`` on SIGTERM, KeyboardInterrupt) or loses the job
    to an unexpected error, before re-raising; but not when SIGTERM comes
    because the launcher pod is being evicted (``owner.launcher_disruption``):
    then the job trains on for the step's next attempt to follow.
    """
    out = out or sys.stdout  # looked up now: tests and callers may have replaced it
    require_kind(cluster, kind)
    name = manifest["metadata"]["name"]
    logs = ReplicaLogs(cluster, kind, name, out)
    created = False
    with sigterm_raises():
        try:
            adopted = create_job(cluster, kind, manifest, out)
            created = True
            # The clocks start once the job exists: waiting for an earlier attempt's job to go does not count.
            startup = Startup(cluster, kind, manifest, logs, out, start_timeout, start_timeout_includes_queue)
            if adopted:
                startup.adopt(adopted)
            logs.start()
            job = wait_for_end(cluster, kind, name, timeout, startup, out)
        except NotStarted as stalled:
            logs.stop()
            print(f"{kind.kind} {name} has not started in time; deleting it", file=out, flush=True)
            delete_job(cluster, kind, name)
            raise TrainingFailed(str(stalled)) from None
        except BaseException as interruption:
            logs.stop()
            disruption = launcher_disruption(cluster) if isinstance(interruption, Terminated) else None
            if disruption:
                print(
                    f"this launcher pod is being evicted ({disruption}); {kind.kind} {name} keeps training. A retry "
                    "of this step, or Retry on the run, follows it; deleting the run deletes it",
                    file=out,
                    flush=True,
                )
                raise
            # A signal during creation may come after the API server stored the job: delete it too.
            if not isinstance(interruption, TrainingFailed) and (created or not isinstance(interruption, Exception)):
                print(
                    f"stopping ({interruption or type(interruption).__name__}); deleting {kind.kind} {name}",
                    file=out,
                    flush=True,
                )
                _delete_quietly(cluster, kind, name, out)
            raise
        if job is None:
            logs.stop()
            delete_job(cluster, kind, name)
            raise TrainingFailed(timeout_report(kind, name, timeout, logs))
        logs.drain(DRAIN_SECONDS)
        logs.stop()
    outcome = kind.outcome(job)
    if not outcome.succeeded:
        raise TrainingFailed(failure_report(cluster, kind, job, logs))
    print(f"{kind.kind} {name} succeeded: {outcome.message or outcome.reason}", file=out, flush=True)
    if not kind.removed_by_ttl:
        delete_job(cluster, kind, name)  # nothing else would; its logs are above and its outputs on the workspace
        print(f"deleted the finished {kind.kind} {name}", file=out, flush=True)
    return job


def wait_for_end(
    cluster: Cluster, kind: JobKind, name: str, timeout: float, startup: Startup, out: TextIO
) -> dict[str, Any] | None:
    """The job once it has succeeded or failed; None once it has been active (not held by Kueue) for
    ``timeout`` seconds. Raises NotStarted when ``startup`` says it did not start in time.
    """
    phase = None

    def stream_seconds() -> float:  # a stream ends when the launcher has something to say or check
        return min(STREAM_SECONDS, startup.seconds_to_next(), timeout - startup.job_active())

    events = watch_objects(
        cluster.custom.list_namespaced_custom_object,
        kind.group,
        kind.version,
        cluster.namespace,
        kind.plural,
        field_selector=f"metadata.name={name}",
        stream_seconds=stream_seconds,
        out=out,
    )
    try:
        for event in events:
            if event is not None:
                kind_of_change, job = event
                if kind_of_change == "DELETED":
                    raise TrainingFailed(
                        f"{kind.kind} {name} was deleted while this step was following it (by a user, or its TTL); "
                        "the step cannot tell how training ended."
                    )
                startup.see(job)
                if kind.phase(job) != phase:
                    phase = kind.phase(job)
                    print(f"{kind.kind} {name}: {phase}", file=out, flush=True)
                if kind.outcome(job):
                    return job
            if startup.job_active() >= timeout:
                return None
            startup.check()
    except ApiException as error:
        raise api_problem(error, f"watch {kind.plural}", cluster) or error
    return None


def _delete_quietly(cluster: Cluster, kind: JobKind, name: str, out: TextIO) -> None:
    """Delete on the way out of an interruption: a failure here must not hide why we are leaving."""
    try:
        delete_job(cluster, kind, name)
        print(f"deleted {kind.kind} {name}", file=out, flush=True)
    except Exception as error:  # noqa: BLE001 - reported, and the interruption is re-raised
        print(
            f"could not delete {kind.kind} {name} ({error}); "
            f"delete it by hand: oc delete {kind.plural} {name} -n {cluster.namespace}",
            file=out,
            flush=True,
        )


def _tail(cluster: Cluster, kind: JobKind, replica: str, pod_name: str, logs: ReplicaLogs) -> list[str]:
    """The replica's last lines as streamed, or straight from the API if the stream never got them."""
    lines = logs.tail(replica)
    if lines:
        return lines
    for previous in (False, True):
        try:
            text = cluster.core.read_namespaced_pod_log(
                pod_name,
                cluster.namespace,
                container=kind.container,
                tail_lines=TAIL_LINES,
                previous=previous,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except (ApiException, *NETWORK_ERRORS):
            continue
        if text:
            return text.splitlines()[-TAIL_LINES:]
    return []


def failure_report(cluster: Cluster, kind: JobKind, job: dict[str, Any], logs: ReplicaLogs) -> str:
    name = job["metadata"]["name"]
    outcome = kind.outcome(job)
    lines = [f"{kind.kind} {name} failed ({outcome.reason}): {outcome.message}"]
    exits = failed_replicas(logs.snapshot(), kind)  # after drain(): what the API has now, and pods deleted since
    if exits:
        first = exits[0]
        lines.append(
            f"failing replica: {first.replica} (pod {first.pod}) exited with code "
            f"{exit_code_text(first.exit_code, first.reason)}"
        )
        lines += [f"also failed: {other.replica} with exit code {other.exit_code}" for other in exits[1:]]
        tail = _tail(cluster, kind, first.replica, first.pod, logs)
        lines.append(f"last {len(tail)} log lines of {first.replica}:")
        lines += quoted(tail)
    else:
        lines.append("no replica reported an exit code (pods deleted, or never scheduled); the replicas' last lines:")
        for replica in sorted(logs.tails):
            lines.append(f"{replica}:")
            lines += quoted(logs.tail(replica))
    lines.append(f"Inspect it with: oc describe {kind.plural} {name} -n {cluster.namespace}")
    return "\n".join(lines)


def timeout_report(kind: JobKind, name: str, timeout: float, logs: ReplicaLogs) -> str:
    lines = [
        f"{kind.kind} {name} did not finish within the timeout of {timeout / 60:.1f} minutes "
        "(time waiting for Kueue admission not counted) and was deleted."
    ]
    lines.append(
        f"Raise {TIMEOUT_PARAMETER}, or shorten training (epochs, max_steps); "
        "lines above say whether it was running or waiting for resources."
    )
    for replica in sorted(logs.tails):
        lines.append(f"last lines of {replica}:")
        lines += quoted(logs.tail(replica)[-10:])
    return "\n".join(lines)
