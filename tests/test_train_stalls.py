"""A training job that does not start: Kueue's queue, pods stuck before running, the start timeout, and
manifests an older operator does not understand.

Same set-up as test_train_cluster.py: the official client against ``fake_kube.FakeKube``, a scenario
thread playing the cluster (here Kueue, the kubelet's and controllers' Events too), real threads and
clocks. The launcher's intervals are shortened through its module constants so each test takes seconds.
"""

from __future__ import annotations

import time

import pytest
from fake_kube import QUEUE_LABEL, FakeKube
from test_train_cluster import launch, manifest_for, start_replicas, succeed
from train_jobs import replica_pods

from common.errors import UserError
from components.train import kueue, stalls
from components.train.kinds import PYTORCHJOB, TRAINJOB
from components.train.reports import TrainingFailed

pytestmark = pytest.mark.waits  # on the start and queue timeouts, which it lets run out
QUEUE = "gpu-queue"
QUEUED = {QUEUE_LABEL: QUEUE}
MOUNT_FAILED = (
    "Unable to attach or mount volumes: unmounted volumes=[workspace], unattached volumes=[workspace dshm "
    "scratch kube-api-access-7xk2p]: timed out waiting for the condition"
)
MULTI_ATTACH = 'Multi-Attach error for volume "pvc-5f0c1d2e" Volume is already used by pod(s) {pod} on node gpu-node-1'
QUOTA = (
    'Error creating: pods "{pod}" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, '
    "used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4"
)


@pytest.fixture
def quick(monkeypatch):
    """Notices and event polls every second (the watch's granularity) instead of every few minutes."""
    monkeypatch.setattr(kueue, "ADMISSION_NOTICE_SECONDS", 1)
    monkeypatch.setattr(stalls, "EVENT_POLL_SECONDS", 1)


def suspended(fake: FakeKube, kind, name: str) -> bool:
    return kind.suspended(fake.objects[kind.plural][name])


# --- Kueue ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [PYTORCHJOB, TRAINJOB], ids=["pytorchjob", "trainjob"])
def test_time_in_the_queue_is_said_and_counted_by_neither_timeout(fake, quick, kind):
    def script(fake):
        job = fake.wait_for(kind.plural)["metadata"]["name"]
        assert suspended(fake, kind, job)  # Kueue's webhook suspended it as it was created
        time.sleep(4)  # held in the queue longer than either timeout
        assert fake.job_names(kind.plural) == [job]
        fake.admit(kind.plural, job)
        job, pods = start_replicas(fake, kind)
        succeed(fake, kind, job, pods)

    log, result = launch(fake, kind, script, timeout=3, start_timeout=2, labels=QUEUED)
    assert not isinstance(result, BaseException), result
    assert kind.outcome(result).succeeded
    assert log.count(f"waiting for admission in queue {QUEUE}") >= 2, log
    podset = "master" if kind is PYTORCHJOB else "node"
    assert f"Kueue says: couldn't assign flavors to pod set {podset}: insufficient unused quota" in log
    assert f"{kind.kind} {result['metadata']['name']}: admitted by Kueue after " in log
    assert log.index("waiting for admission") < log.index("admitted by Kueue") < log.index("succeeded")
    # The operators' and Kueue's Normal events on the job are not worth a line.
    assert "Suspended:" not in log and "CreatedWorkload" not in log and "Started:" not in log


def test_queue_time_counted_fails_on_the_start_timeout_while_still_queued(fake, quick):
    def script(fake):
        fake.wait_for("pytorchjobs")  # and never admitted

    log, result = launch(fake, PYTORCHJOB, script, start_timeout=2, start_timeout_includes_queue=True, labels=QUEUED)
    assert isinstance(result, TrainingFailed), result
    report = str(result)
    assert "did not start within the start timeout of 2 s (time waiting for Kueue admission counted)" in report
    assert f"still waiting for admission in queue {QUEUE}" in report and "insufficient unused quota" in report
    assert "training_start_timeout_minutes" in report and "start_timeout_includes_queue" in report
    assert fake.job_names("pytorchjobs") == [] and fake.job_names("workloads") == []
    assert fake.requests_matching("DELETE", "/pytorchjobs/")


def test_unreadable_workloads_and_events_are_said_once_and_the_job_carries_on(fake, quick):
    """A Role applied before this version of pipelines/rbac.yaml: the job still runs, the log says what it
    cannot show."""
    fake.forbidden = {"workloads", "events"}

    def script(fake):
        job = fake.wait_for("pytorchjobs")["metadata"]["name"]
        time.sleep(2.5)
        fake.admit("pytorchjobs", job)
        ((pod, labels),) = replica_pods(PYTORCHJOB, job, 1)
        fake.add_pod(pod, labels, "pytorch")
        fake.wait_for_request("GET", "/events")  # the launcher asked for the pending pod's events
        time.sleep(1.5)  # and would ask again, were it allowed
        fake.run_container(pod)
        fake.set_condition("pytorchjobs", job, "Running", "JobRunning")
        fake.wait_for_request("GET", f"/pods/{pod}/log")
        succeed(fake, PYTORCHJOB, job, [pod])

    log, result = launch(fake, PYTORCHJOB, script, start_timeout=30, nodes=1, labels=QUEUED)
    assert not isinstance(result, BaseException), result
    assert log.count(f"waiting for admission in queue {QUEUE}") >= 2
    assert log.count("cannot read Kueue Workloads") == 1 and "Kueue says" not in log
    assert log.count("cannot read the Kubernetes events") == 1
    assert len(fake.requests_matching("GET", "/workloads")) == 1 and len(fake.requests_matching("GET", "/events")) == 1


# --- pods that do not start ---------------------------------------------------------------------


def test_a_volume_that_does_not_mount_is_shown_and_fails_the_step_on_the_start_timeout(fake, quick):
    def script(fake):
        job = fake.wait_for("pytorchjobs")["metadata"]["name"]
        fake.set_condition("pytorchjobs", job, "Created", "JobCreated")
        (master, master_labels), (worker, worker_labels) = replica_pods(PYTORCHJOB, job, 2)
        fake.add_pod(master, master_labels, "pytorch")
        fake.add_pod(worker, worker_labels, "pytorch")  # stays ContainerCreating
        fake.run_container(master)
        fake.add_event("Pod", master, "Pulled", "Container image already present on machine", "Normal")
        fake.add_event("Pod", worker, "Scheduled", f"Successfully assigned ml-team/{worker} to gpu-node-2", "Normal")
        fake.add_event("Pod", worker, "FailedAttachVolume", MULTI_ATTACH.format(pod=master))
        fake.add_event("Pod", worker, "FailedMount", MOUNT_FAILED)
        fake.wait_for_request("GET", "/events", count=3)  # a poll has read them (job, and the worker's)
        fake.add_event("Pod", worker, "FailedMount", MOUNT_FAILED)  # the kubelet retries: count 2

    log, result = launch(fake, PYTORCHJOB, script, start_timeout=4)
    assert isinstance(result, TrainingFailed), result
    assert f"[worker-0] Warning FailedMount: {MOUNT_FAILED}" in log
    assert f"[worker-0] Warning FailedMount: {MOUNT_FAILED} (2 times)" in log  # printed again as it repeats
    assert "[worker-0] Warning FailedAttachVolume: Multi-Attach error" in log
    assert "[worker-0] Normal Scheduled: Successfully assigned" in log
    assert log.count("Multi-Attach error") == 1  # each event once
    assert "Container image already present" not in log  # the running master's events are not read
    assert log.index("FailedMount") < log.index("has not started in time")
    report = str(result)
    assert "did not start within the start timeout of 4 s (time waiting for Kueue admission not counted)" in report
    (not_running,) = [line for line in report.splitlines() if line.startswith("Replicas not running")]
    assert not_running.startswith("Replicas not running: worker-0 (pod ") and "master-0" not in not_running
    assert not_running.endswith(": Pending, container ContainerCreating).")
    assert f"  [worker-0] Warning FailedMount: {MOUNT_FAILED} (2 times)" in report
    assert f"  [worker-0] Warning FailedMount: {MOUNT_FAILED}\n" not in report  # each event once, as it is now
    assert "raise training_start_timeout_minutes" in report
    assert fake.job_names("pytorchjobs") == []
    worker_polls = [r for r in fake.requests_matching("GET", "/events") if "-worker-0" in r.query["fieldSelector"]]
    assert len(worker_polls) >= 2 and all("involvedObject.kind=Pod" in r.query["fieldSelector"] for r in worker_polls)


@pytest.mark.parametrize(
    "kind, involved_kind, suffix, reason",
    [(PYTORCHJOB, "PyTorchJob", "", "FailedCreatePod"), (TRAINJOB, "Job", "-node-0", "FailedCreate")],
    ids=["pytorchjob-creates-its-pods", "trainjob-child-job-creates-them"],
)
def test_pods_refused_by_a_quota_are_shown_from_the_events_of_who_creates_them(
    fake, quick, kind, involved_kind, suffix, reason
):
    """No pod exists: the Training Operator records FailedCreatePod on the PyTorchJob, a TrainJob's child
    Job (named by JobSet <jobset>-<replicated job>-<index>) FailedCreate on itself."""

    def script(fake):
        job = fake.wait_for(kind.plural)["metadata"]["name"]
        first_pod = replica_pods(kind, job, 1)[0][0]
        fake.add_event(kind.kind, job, "SuccessfulCreateService", f"Created service: {job}-master-0", "Normal")
        fake.add_event(involved_kind, job + suffix, reason, QUOTA.format(pod=first_pod))

    log, result = launch(fake, kind, script, start_timeout=3)
    assert isinstance(result, TrainingFailed), result
    job = manifest_for(kind)["metadata"]["name"]
    line = f"[{involved_kind} {job}{suffix}] Warning {reason}: Error creating: pods"
    assert line in log and "exceeded quota: gpu-quota" in log
    assert "SuccessfulCreateService" not in log  # the job's Normal events are not worth a line
    report = str(result)
    names = (
        "master-0 (no pod yet), worker-0 (no pod yet)"
        if kind is PYTORCHJOB
        else "node-0 (no pod yet), node-1 (no pod yet)"
    )
    assert f"Replicas not running: {names}" in report and f"  {line}" in report
    assert fake.job_names(kind.plural) == []


def test_the_start_timeout_ends_once_every_replica_has_run(fake, quick):
    """A replica whose pod is replaced later (node lost) may wait longer than the start timeout."""

    def script(fake):
        job, (master, worker) = start_replicas(fake, PYTORCHJOB)
        time.sleep(1.5)
        labels = dict(replica_pods(PYTORCHJOB, job, 2))[worker]
        fake.delete_pod(worker)
        fake.add_pod(worker, labels, "pytorch", pending_reason="0/3 nodes are available: 1 node(s) were unschedulable.")
        time.sleep(2.5)  # past the start timeout of 2 s, still pending
        fake.run_container(worker)
        fake.wait_for_request("GET", f"/pods/{worker}/log", count=2)
        succeed(fake, PYTORCHJOB, job, [master, worker])

    log, result = launch(fake, PYTORCHJOB, script, start_timeout=2)
    assert not isinstance(result, BaseException), result
    assert "[worker-0] pod not scheduled: 0/3 nodes are available" in log
    assert "has not started" not in log and not fake.requests_matching("GET", "/events")


# --- strict field validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, unknown, version, other",
    [
        (TRAINJOB, {"runtimePatches", "activeDeadlineSeconds"}, "Kubeflow Trainer v2.2", "pytorchjob"),
        (PYTORCHJOB, {"nprocPerNode"}, "Kubeflow Training Operator v1.9", "trainjob"),
    ],
    ids=["trainjob-before-v2.2", "pytorchjob-older-operator"],
)
def test_an_older_operator_refuses_the_fields_it_does_not_know(fake, kind, unknown, version, other):
    fake.unknown_spec_fields = {kind.plural: unknown}
    log, result = launch(fake, kind, lambda fake: None)
    assert isinstance(result, UserError), result
    message = str(result)
    fields = ", ".join(f"spec.{field}" for field in sorted(unknown))
    assert f"does not know {fields}, which the train step sets" in message
    assert f"Upgrade to {version} or newer, or set training_backend={other}" in message
    assert "strict decoding error" in message and "\n" not in message
    (create,) = fake.requests_matching("POST", f"/{kind.plural}")
    assert create.query.get("fieldValidation") == "Strict"
    assert fake.job_names(kind.plural) == []
