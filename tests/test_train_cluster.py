"""The launcher's create/watch/log/clean-up logic against a fake Kubernetes API server.

No real cluster runs here, so ``fake_kube.FakeKube`` (an in-memory API server on
127.0.0.1, see its docstring) answers the official ``kubernetes`` client exactly
where the launcher calls it, and a scenario thread plays the operator and the
kubelets: creating pods, writing log lines, ending containers, setting the job's
conditions, dropping streams. Every test also checks that each request the
launcher made is granted by ``pipelines/rbac.yaml``.
"""

from __future__ import annotations

import io
import threading
from typing import Callable

import pytest
import yaml

from components.errors import UserError
from components.training.follow import run_job
from components.training.kinds import PYTORCHJOB, TRAINJOB, JobKind
from components.training.kube import connect
from components.training.manifests import render_pytorchjob, render_trainjob
from components.training.reports import TrainingFailed
from conftest import REPO_ROOT
from fake_kube import FakeKube, Request
from train_jobs import example_spec, replica_pods

SUCCESS = {PYTORCHJOB: "Succeeded", TRAINJOB: "Complete"}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig is used
    yield server
    server.stop()


class Scenario(threading.Thread):
    """Plays the cluster's part while the launcher runs in the test's thread."""

    def __init__(self, fake: FakeKube, script: Callable[[FakeKube], None]) -> None:
        super().__init__(daemon=True)
        self.fake, self.script, self.error = fake, script, None

    def run(self) -> None:
        try:
            self.script(self.fake)
        except BaseException as error:  # re-raised in the test by check()
            self.error = error

    def check(self) -> None:
        self.join(30)
        assert not self.is_alive(), "the scenario did not finish"
        if self.error:
            raise self.error


def manifest_for(kind: JobKind, nodes: int = 2) -> dict:
    spec = example_spec(nodes, 1, secret="hf-token")
    return render_pytorchjob(spec) if kind is PYTORCHJOB else render_trainjob(spec)


def launch(fake: FakeKube, kind: JobKind, script, *, timeout: float = 60, nodes: int = 2) -> tuple[str, dict | BaseException]:
    """Run the launcher against ``script``; its log and its result (or the exception it raised)."""
    out = io.StringIO()
    scenario = Scenario(fake, script)
    scenario.start()
    try:
        result = run_job(connect(), kind, manifest_for(kind, nodes), timeout=timeout, out=out)
    except (TrainingFailed, UserError) as error:
        result = error
    scenario.check()
    assert_granted_by_rbac(fake.requests)
    return out.getvalue(), result


def start_replicas(fake: FakeKube, kind: JobKind, nodes: int = 2) -> tuple[str, list[str]]:
    job = fake.wait_for(kind.plural)["metadata"]["name"]
    fake.set_condition(kind.plural, job, "Created", "JobCreated")
    pods = []
    for pod, labels in replica_pods(kind, job, nodes):
        fake.add_pod(pod, labels, kind.container)
        pods.append(pod)
    for pod in pods:
        fake.run_container(pod)
    if kind is PYTORCHJOB:
        fake.set_condition(kind.plural, job, "Running", "JobRunning")
    for pod in pods:  # the launcher is now following each replica's log
        fake.wait_for_request("GET", f"/pods/{pod}/log")
    return job, pods


# --- RBAC -------------------------------------------------------------------------------------


def rbac_rules() -> list[dict]:
    documents = list(yaml.safe_load_all((REPO_ROOT / "pipelines" / "rbac.yaml").read_text()))
    (role,) = [d for d in documents if d["kind"] == "Role"]
    (binding,) = [d for d in documents if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    return role["rules"]


def authorization_attributes(request: Request) -> tuple[str, str, str] | None:
    """(API group, resource[/subresource], verb) as the API server's authorizer sees ``request``; None for discovery."""
    parts = request.path.strip("/").split("/")
    if parts[0] == "apis" and len(parts) == 3:
        return None  # GET /apis/<group>/<version>: granted to all authenticated users by system:discovery
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    assert rest[0] == "namespaces", request
    resource = rest[2] + (f"/{rest[4]}" if len(rest) > 4 else "")
    named = len(rest) > 3
    verb = {"POST": "create", "DELETE": "delete"}.get(request.method) or (
        "get" if named else "watch" if request.query.get("watch") == "true" else "list"
    )
    return group, resource, verb


def assert_granted_by_rbac(requests: list[Request]) -> None:
    rules = rbac_rules()
    for request in requests:
        attributes = authorization_attributes(request)
        if attributes is None:
            assert request.method == "GET"
            continue
        group, resource, verb = attributes
        granted = any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in rules)
        assert granted, f"{request.method} {request.path} needs {verb} on {resource} ({group or 'core'}), which pipelines/rbac.yaml does not grant"


def test_rbac_grants_exactly_what_the_issue_asks():
    granted = {(group, resource, verb) for rule in rbac_rules() for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    jobs = {(group, plural, verb) for group, plural in (("kubeflow.org", "pytorchjobs"), ("trainer.kubeflow.org", "trainjobs")) for verb in ("create", "get", "list", "watch", "delete")}
    pods = {("", resource, verb) for resource in ("pods", "pods/log") for verb in ("get", "list", "watch")}
    assert granted == jobs | pods


# --- lifecycle ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [PYTORCHJOB, TRAINJOB], ids=["pytorchjob", "trainjob"])
def test_created_running_succeeded_streams_every_replica(fake, kind):
    def script(fake):
        job, (first, second) = start_replicas(fake, kind)
        fake.log(first, "loading model", "step 1/2 loss 2.10")
        fake.log(second, "rank 1 joined")
        fake.log(first, "step 2/2 loss 1.70")
        fake.exit_container(first, 0)
        fake.exit_container(second, 0)
        fake.set_condition(kind.plural, job, SUCCESS[kind], "JobSucceeded", "training finished")

    log, result = launch(fake, kind, script)
    assert not isinstance(result, BaseException), result
    assert kind.outcome(result).succeeded
    names = ["master-0", "worker-0"] if kind is PYTORCHJOB else ["node-0", "node-1"]
    for line in (f"[{names[0]}] loading model", f"[{names[0]}] step 2/2 loss 1.70", f"[{names[1]}] rank 1 joined"):
        assert log.count(line) == 1, log
    assert fake.requests_matching("POST", f"/{kind.plural}")
    # A PyTorchJob is removed by its TTL; a TrainJob has none, so the launcher removes it.
    assert fake.job_names(kind.plural) == ([] if kind is TRAINJOB else [result["metadata"]["name"]])


def test_failed_replica_fails_the_step_with_its_exit_code_and_last_50_lines(fake):
    def script(fake):
        job, (master, worker) = start_replicas(fake, PYTORCHJOB)
        fake.log(master, "waiting for gradients")
        fake.log(worker, *[f"worker line {i}" for i in range(60)])
        fake.exit_container(worker, 137, "OOMKilled")
        fake.log(master, "RuntimeError: Connection closed by peer")
        fake.exit_container(master, 1)
        fake.set_condition("pytorchjobs", job, "Failed", "JobFailed", f"PyTorchJob {job} is failed because 1 Worker replica(s) failed.")

    log, result = launch(fake, PYTORCHJOB, script)
    assert isinstance(result, TrainingFailed)
    report = str(result)
    assert "failed (JobFailed): PyTorchJob" in report
    assert "failing replica: worker-0" in report and "exited with code 137 (OOMKilled)" in report and "out of memory" in report
    assert "also failed: master-0 with exit code 1" in report
    assert "  | worker line 59" in report and "  | worker line 10" in report and "worker line 9\n" not in report
    assert "[worker-0] worker line 0" in log  # every line was streamed while it ran


def test_restarted_replica_is_followed_again(fake):
    def script(fake):
        job, (master, worker) = start_replicas(fake, PYTORCHJOB)
        fake.log(worker, "step 3 loss 1.9")
        fake.exit_container(worker, 143)
        fake.restart_container(worker)
        fake.wait_for_request("GET", f"/pods/{worker}/log", count=2)
        fake.log(worker, "resuming from checkpoint-3")
        for pod in (master, worker):
            fake.exit_container(pod, 0)
        fake.set_condition("pytorchjobs", job, "Succeeded", "JobSucceeded")

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert "[worker-0] --- trainer container restarted (restart 1)" in log
    assert log.index("[worker-0] step 3 loss 1.9") < log.index("[worker-0] resuming from checkpoint-3")
    assert log.count("resuming from checkpoint-3") == 1


def test_dropped_streams_reconnect_without_losing_or_repeating_lines(fake):
    def script(fake):
        job, (master, worker) = start_replicas(fake, PYTORCHJOB)
        fake.log(master, "before the drop")
        fake.wait_until_streamed(master, "before the drop")
        fake.drop_streams()
        fake.log(master, "after the drop")
        for pod in (master, worker):
            fake.exit_container(pod, 0)
        fake.set_condition("pytorchjobs", job, "Succeeded", "JobSucceeded", drop=True)

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert log.count("[master-0] before the drop") == 1 and log.count("[master-0] after the drop") == 1
    watches = fake.requests_matching("GET", "/pytorchjobs", watch="true")
    assert len(watches) >= 2 and all(w.query.get("resourceVersion") for w in watches)
    assert "reconnecting" in log


def test_expired_watch_lists_again(fake):
    def script(fake):
        job, pods = start_replicas(fake, PYTORCHJOB)
        for pod in pods:
            fake.exit_container(pod, 0)
        fake.set_condition("pytorchjobs", job, "Succeeded", "JobSucceeded", drop=True, expire=True)

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert "watch expired" in log
    lists = [r for r in fake.requests_matching("GET", "/pytorchjobs") if r.query.get("watch") != "true"]
    assert len(lists) >= 2  # the first listing, and the one after 410 Gone


@pytest.mark.parametrize(
    "kind, served",
    [
        (PYTORCHJOB, {"kubeflow.org/v1": {"notebooks": "Notebook"}}),  # OpenShift AI serves kubeflow.org/v1 for notebooks
        (TRAINJOB, {}),
    ],
    ids=["pytorchjob-group-without-the-kind", "trainjob-group-absent"],
)
def test_missing_crd_is_a_clear_error_before_anything_is_created(fake, kind, served):
    fake.served = served
    log, result = launch(fake, kind, lambda fake: None)
    assert isinstance(result, UserError)
    assert f"does not serve {kind.kind}" in str(result) and "kubectl apply" in str(result)
    assert ("Training Operator" if kind is PYTORCHJOB else "Trainer v2") in str(result)
    assert not fake.requests_matching("POST", "")


def test_timeout_deletes_the_job_and_says_why(fake):
    def script(fake):
        job = fake.wait_for("pytorchjobs")["metadata"]["name"]
        fake.set_condition("pytorchjobs", job, "Created", "JobCreated")
        labels = replica_pods(PYTORCHJOB, job, 1)[0][1]
        fake.add_pod(f"{job}-master-0", labels, "pytorch", pending_reason="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")

    log, result = launch(fake, PYTORCHJOB, script, timeout=3, nodes=1)
    assert isinstance(result, TrainingFailed)
    assert "did not finish within the timeout" in str(result) and "was deleted" in str(result)
    assert "[master-0] pod not scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in log
    (delete,) = fake.requests_matching("DELETE", "/pytorchjobs/")
    assert delete.query.get("propagationPolicy") == "Foreground"
    assert fake.job_names("pytorchjobs") == []


def test_a_retried_launcher_follows_the_job_its_run_already_started(fake):
    """The job name comes from the run id: a second attempt adopts the running job instead of starting another."""
    fake.handle("POST", f"/apis/kubeflow.org/v1/namespaces/{fake.namespace}/pytorchjobs", {}, manifest_for(PYTORCHJOB))

    def script(fake):
        job, pods = start_replicas(fake, PYTORCHJOB)
        for pod in pods:
            fake.exit_container(pod, 0)
        fake.set_condition("pytorchjobs", job, "Succeeded", "JobSucceeded")

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert "already exists and is still running" in log
    assert len(fake.requests_matching("POST", "/pytorchjobs")) == 2 and fake.job_names("pytorchjobs") == [result["metadata"]["name"]]
