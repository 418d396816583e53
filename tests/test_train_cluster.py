"""The launcher's create/watch/log/clean-up logic against a fake Kubernetes API server.

No real cluster runs here, so ``fake_kube.FakeKube`` (an in-memory API server on
127.0.0.1, see its docstring) answers the official ``kubernetes`` client exactly
where the launcher calls it, and a scenario thread plays the operator and the
kubelets: creating pods, writing log lines, ending containers, setting the job's
conditions, dropping streams. Every test also checks that each request the
launcher made is granted by ``pipelines/rbac.yaml``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import pytest
import yaml
from conftest import REPO_ROOT
from fake_kube import FakeKube, Request
from fake_run import training_progress, training_summary
from train_jobs import JOB_OWNER, LAUNCHER_POD, RUN_ID, WORKFLOW, example_spec, replica_pods, stand_in_artifacts

import components.train.progress as progress_module
from common.errors import UserError
from common.run_layout import TRAINING_FAILURE, TRAINING_PROGRESS
from components.local_model import CLUSTER_BASE_MODEL
from components.train.api_server import connect
from components.train.follow import run_job
from components.train.kinds import PYTORCHJOB, TRAINJOB, JobKind
from components.train.manifests import render_pytorchjob, render_trainjob
from components.train.owner import POD_NAME_ENV
from components.train.reports import TrainingFailed
from components.train.stage import SUMMARY_METRICS, run_in_pipeline

pytestmark = [pytest.mark.usefixtures("no_hub"), pytest.mark.waits]  # on the launcher's polls and timeouts

SUCCESS = {PYTORCHJOB: "Succeeded", TRAINJOB: "Complete"}


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
    spec = example_spec(nodes, 1, secret="hf-read-token")
    return render_pytorchjob(spec) if kind is PYTORCHJOB else render_trainjob(spec)


def launch(
    fake: FakeKube,
    kind: JobKind,
    script,
    *,
    timeout: float = 60,
    start_timeout: float = 60,
    start_timeout_includes_queue: bool = False,
    nodes: int = 2,
    labels: dict[str, str] | None = None,
) -> tuple[str, dict | BaseException]:
    """Run the launcher against ``script``; its log and its result (or the exception it raised).

    ``labels`` are added to the job's (e.g. Kueue's queue label).
    """
    out = io.StringIO()
    manifest = manifest_for(kind, nodes)
    manifest["metadata"]["labels"].update(labels or {})
    scenario = Scenario(fake, script)
    scenario.start()
    try:
        result = run_job(
            connect(),
            kind,
            manifest,
            timeout=timeout,
            start_timeout=start_timeout,
            start_timeout_includes_queue=start_timeout_includes_queue,
            out=out,
        )
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


def succeed(
    fake: FakeKube,
    kind: JobKind,
    job: str,
    pods: list[str],
    message: str = "",
    *,
    drop: bool = False,
    expire: bool = False,
) -> None:
    """Every replica exits 0, then the job reports success (``drop``/``expire``: see FakeKube.set_condition)."""
    for pod in pods:
        fake.exit_container(pod, 0)
    fake.set_condition(kind.plural, job, SUCCESS[kind], "JobSucceeded", message, drop=drop, expire=expire)


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
    verb = {"POST": "create", "DELETE": "delete", "PUT": "update"}.get(request.method) or (
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
        granted = any(
            group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in rules
        )
        assert granted, (
            f"{request.method} {request.path} needs {verb} on {resource} ({group or 'core'}), "
            "which pipelines/rbac.yaml does not grant"
        )


def test_rbac_grants_exactly_what_the_issue_asks():
    granted = {
        (group, resource, verb)
        for rule in rbac_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    jobs = {
        (group, plural, verb)
        for group, plural in (("kubeflow.org", "pytorchjobs"), ("trainer.kubeflow.org", "trainjobs"))
        for verb in ("create", "get", "list", "watch", "delete")
    }
    pods = {("", resource, verb) for resource in ("pods", "pods/log") for verb in ("get", "list", "watch")}
    events = {("", "events", "list")}  # why pods do not start
    kueue = {("kueue.x-k8s.io", "localqueues", "get"), ("kueue.x-k8s.io", "localqueues", "list")}
    kueue |= {("kueue.x-k8s.io", "workloads", "list")}  # why a queued job waits
    serving = {("serving.kserve.io", "inferenceservices", verb) for verb in ("create", "get", "update")}
    assert granted == jobs | pods | events | kueue | serving


# --- lifecycle ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [PYTORCHJOB, TRAINJOB], ids=["pytorchjob", "trainjob"])
def test_created_running_succeeded_streams_every_replica(fake, kind):
    def script(fake):
        job, (first, second) = start_replicas(fake, kind)
        fake.log(first, "loading model", "step 1/2 loss 2.10")
        fake.log(second, "rank 1 joined")
        fake.log(first, "step 2/2 loss 1.70")
        succeed(fake, kind, job, [first, second], "training finished")

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
        fake.set_condition(
            "pytorchjobs", job, "Failed", "JobFailed", f"PyTorchJob {job} is failed because 1 Worker replica(s) failed."
        )

    log, result = launch(fake, PYTORCHJOB, script)
    assert isinstance(result, TrainingFailed)
    report = str(result)
    assert "failed (JobFailed): PyTorchJob" in report
    assert (
        "failing replica: worker-0" in report
        and "exited with code 137 (OOMKilled)" in report
        and "out of memory" in report
    )
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
        succeed(fake, PYTORCHJOB, job, [master, worker])

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
        succeed(fake, PYTORCHJOB, job, [master, worker], drop=True)

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert log.count("[master-0] before the drop") == 1 and log.count("[master-0] after the drop") == 1
    watches = fake.requests_matching("GET", "/pytorchjobs", watch="true")
    assert len(watches) >= 2 and all(w.query.get("resourceVersion") for w in watches)
    assert "reconnecting" in log


def test_expired_watch_lists_again(fake):
    def script(fake):
        job, pods = start_replicas(fake, PYTORCHJOB)
        succeed(fake, PYTORCHJOB, job, pods, drop=True, expire=True)

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert "watch expired" in log
    lists = [r for r in fake.requests_matching("GET", "/pytorchjobs") if r.query.get("watch") != "true"]
    assert len(lists) >= 2  # the first listing, and the one after 410 Gone


@pytest.mark.parametrize(
    "kind, served",
    [
        (
            PYTORCHJOB,
            {"kubeflow.org/v1": {"notebooks": "Notebook"}},
        ),  # OpenShift AI serves kubeflow.org/v1 for notebooks
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
        fake.add_pod(
            f"{job}-master-0",
            labels,
            "pytorch",
            pending_reason="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        )

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
        succeed(fake, PYTORCHJOB, job, pods)

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert "already exists and is still running" in log
    assert len(fake.requests_matching("POST", "/pytorchjobs")) == 2 and fake.job_names("pytorchjobs") == [
        result["metadata"]["name"]
    ]


def test_a_retried_launcher_reports_the_job_that_failed_instead_of_training_again(fake):
    """A retry is for a lost launcher pod: a job that failed on its own is reported, not trained a second time."""
    failed = manifest_for(PYTORCHJOB)
    name = failed["metadata"]["name"]
    fake.handle("POST", f"/apis/kubeflow.org/v1/namespaces/{fake.namespace}/pytorchjobs", {}, failed)
    (master, labels), *_ = replica_pods(PYTORCHJOB, name, 2)
    fake.add_pod(master, labels, PYTORCHJOB.container)
    fake.run_container(master)
    fake.log(master, "torch.OutOfMemoryError: CUDA out of memory")
    fake.exit_container(master, 1)
    fake.set_condition(
        "pytorchjobs", name, "Failed", "JobFailed", "PyTorchJob has failed because it has reached the backoff limit"
    )

    log, result = launch(fake, PYTORCHJOB, lambda fake: None)
    assert isinstance(result, TrainingFailed), result
    assert "already exists and has failed" in log
    assert "failing replica: master-0" in str(result) and "CUDA out of memory" in str(result)
    assert len(fake.requests_matching("POST", "/pytorchjobs")) == 2 and not fake.requests_matching(
        "DELETE", "/pytorchjobs"
    )
    assert fake.job_names("pytorchjobs") == [name]


def test_a_retried_launcher_counts_the_timeout_from_when_the_job_started(fake):
    """The overall timeout bounds the job, not the launcher: a job that started two hours ago (status.startTime)
    has used up a one-hour timeout, however fresh the launcher that adopts it."""
    adopted = manifest_for(PYTORCHJOB)
    name = adopted["metadata"]["name"]
    fake.handle("POST", f"/apis/kubeflow.org/v1/namespaces/{fake.namespace}/pytorchjobs", {}, adopted)
    fake.set_condition("pytorchjobs", name, "Running", "JobRunning")
    two_hours_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    with fake.changed:
        fake.objects["pytorchjobs"][name]["status"]["startTime"] = two_hours_ago.strftime("%Y-%m-%dT%H:%M:%SZ")

    log, result = launch(fake, PYTORCHJOB, lambda fake: None, timeout=3600)
    assert isinstance(result, TrainingFailed) and "did not finish within the timeout" in str(result), result
    assert "already exists and is still running" in log and fake.job_names("pytorchjobs") == []


def test_a_job_being_deleted_is_waited_for_and_created_anew(fake):
    """A cancelled earlier attempt's job may still be terminating its pods: following it would end in DELETED."""
    going = manifest_for(PYTORCHJOB)
    name = going["metadata"]["name"]
    fake.handle("POST", f"/apis/kubeflow.org/v1/namespaces/{fake.namespace}/pytorchjobs", {}, going)
    with fake.changed:
        fake.objects["pytorchjobs"][name]["metadata"]["deletionTimestamp"] = "2026-11-23T03:00:00Z"

    def script(fake):
        fake.wait_for_request("GET", f"/pytorchjobs/{name}", count=2)  # the launcher is waiting for it to go
        fake.handle("DELETE", f"/apis/kubeflow.org/v1/namespaces/{fake.namespace}/pytorchjobs/{name}", {}, None)
        fake.wait_for_request("POST", "/pytorchjobs", count=3)  # ours, the refused one, the launcher's second
        job, pods = start_replicas(fake, PYTORCHJOB)
        succeed(fake, PYTORCHJOB, job, pods)

    log, result = launch(fake, PYTORCHJOB, script)
    assert not isinstance(result, BaseException), result
    assert "is being deleted; waiting for it" in log and f"created PyTorchJob {name}" in log


# --- the whole step on the cluster backends ----------------------------------------------------


def workspace_with_data(tmp_path) -> tuple[Path, Path, Path]:
    """A workspace root with the tokenise step's output, and the run's (not yet written) train directory."""
    workspace = tmp_path / "workspace"
    tokens = workspace / "token-cache" / "0123abcd"
    tokens.mkdir(parents=True)
    (tokens / "manifest.json").write_text("{}")  # the launcher only checks it is there; the pods read it
    return workspace, tokens, workspace / "runs" / RUN_ID / "train"


def step_arguments(workspace: Path, data: Path, tmp_path: Path, **launch) -> dict:
    return dict(
        workspace_root=str(workspace),
        run_id=RUN_ID,
        tokens_dir=str(data),
        base_model="",
        training={"epochs": 1.0},
        launch={"backend": "pytorchjob", "nodes": 2, "gpus_per_node": 1, **launch},
        pvc_name="ws-pvc",
        image="quay.io/example/llm-finetune-pipeline:0.1.0",
        pipeline_name="llm-finetune",
        **stand_in_artifacts(tmp_path / "artifacts"),
    )


PROGRESS = training_progress(
    total_steps=10, tokens_seen=4500, tokens_per_second=900.0, mfu=0.41, loss=1.25, learning_rate=2e-4
)


def test_cluster_step_launches_follows_and_records_what_the_pods_wrote(fake, tmp_path, capsys, monkeypatch):
    workspace, data, train_dir = workspace_with_data(tmp_path)
    monkeypatch.setattr(progress_module, "CHECK_SECONDS", 0.02)
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.0)
    halfway_read = threading.Event()
    line = progress_module.progress_line

    def noting(progress):
        if progress.step == 5:
            halfway_read.set()  # formatted: the same check prints it
        return line(progress)

    monkeypatch.setattr(progress_module, "progress_line", noting)

    def script(fake):
        job, pods = start_replicas(fake, PYTORCHJOB)
        halfway = dataclasses.replace(PROGRESS, step=5, epoch=0.5, eta_seconds=50.0, last_checkpoint="checkpoint-5")
        train_dir.mkdir(parents=True, exist_ok=True)
        halfway.write(train_dir / TRAINING_PROGRESS)  # rank 0's progress file on the shared PVC, not a pod log
        assert halfway_read.wait(30), "the step never read the halfway record"
        for directory in ("merged", "adapter", "checkpoints/checkpoint-10"):  # what rank 0 writes onto the shared PVC
            (train_dir / directory).mkdir(parents=True)
        done = dataclasses.replace(PROGRESS, step=10, epoch=1.0, eta_seconds=0.0, last_checkpoint="checkpoint-10")
        done = dataclasses.replace(done, finished=True)
        done.write(train_dir / TRAINING_PROGRESS)
        summary = training_summary(world_size=2, global_step=10, final_train_loss=1.25, final_eval_loss=None)
        summary.write(train_dir / "training_summary.json")
        fake.log(pods[0], "step 10/10 loss 1.25")
        succeed(fake, PYTORCHJOB, job, pods)

    scenario = Scenario(fake, script)
    scenario.start()
    arguments = step_arguments(workspace, data, tmp_path)
    assert run_in_pipeline(**arguments) == (str(train_dir), CLUSTER_BASE_MODEL)  # the empty base_model, resolved
    scenario.check()
    assert_granted_by_rbac(fake.requests)

    (created,) = [fake.objects["pytorchjobs"][name] for name in fake.job_names("pytorchjobs")]
    recorded = yaml.safe_load(Path(arguments["manifest_artifact"].path).read_text())
    assert recorded["spec"] == created["spec"] and recorded["metadata"]["name"] == created["metadata"]["name"]
    command = created["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--model") + 1] == CLUSTER_BASE_MODEL  # an empty base_model means the cluster default
    assert command[command.index("--output-dir") + 1] == str(train_dir)
    assert created["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    model = arguments["model_artifact"]
    assert model.metadata["merged_dir"] == str(train_dir / "merged") and model.metadata["adapter_dir"] == str(
        train_dir / "adapter"
    )
    metrics = arguments["metrics"].metrics
    assert (metrics["world_size"], metrics["global_step"], metrics["final_train_loss"]) == (2, 10, 1.25)
    progress_numbers = {"progress_percent", "total_steps", "final_learning_rate"}
    assert metrics.keys() == set(SUMMARY_METRICS) - {"final_eval_loss", "mfu"} | progress_numbers  # None: not logged
    assert (metrics["progress_percent"], metrics["total_steps"], metrics["final_learning_rate"]) == (100.0, 10, 2e-4)
    out = capsys.readouterr().out
    assert "[master-0] step 10/10 loss 1.25" in out
    assert "progress: step 5/10 (50.0%), epoch 0.50, 4,500 tokens, 900 tokens/s, MFU 41.0%, loss 1.2500, " in out
    assert "progress: step 10/10 (100.0%), epoch 1.00, 4,500 tokens, 900 tokens/s, MFU 41.0%, loss 1.2500, " in out
    assert (
        "ETA 0:00:50, last checkpoint checkpoint-5" in out and "lr 2.00e-04, done, last checkpoint checkpoint-10" in out
    )


def test_cluster_step_fails_with_the_report_when_the_job_fails(fake, tmp_path, capsys):
    workspace, data, _ = workspace_with_data(tmp_path)

    def script(fake):
        job, (master, worker) = start_replicas(fake, PYTORCHJOB)
        fake.log(worker, "error: --expected-world-size is 2 but this process sees WORLD_SIZE=1")
        fake.exit_container(worker, 2)
        fake.exit_container(master, 1)
        fake.set_condition("pytorchjobs", job, "Failed", "JobFailed", "1 Worker replica(s) failed.")

    scenario = Scenario(fake, script)
    scenario.start()
    with pytest.raises(SystemExit) as exit_info:
        run_in_pipeline(**step_arguments(workspace, data, tmp_path))
    scenario.check()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: training failed.\nPyTorchJob")
    assert (
        "failing replica: worker-0" in err
        and "exited with code 2 (Error): the trainer rejected its input or options" in err
    )
    assert "  | error: --expected-world-size is 2" in err

    # The step is retried when its pod is lost; a retry after a failed training reports it and trains nothing.
    train_dir = workspace / "runs" / RUN_ID / "train"
    assert "failing replica: worker-0" in (train_dir / TRAINING_FAILURE).read_text()
    posts = len(fake.requests_matching("POST", "/pytorchjobs"))
    with pytest.raises(SystemExit) as retried:
        run_in_pipeline(**step_arguments(workspace, data, tmp_path))
    assert retried.value.code == 1 and len(fake.requests_matching("POST", "/pytorchjobs")) == posts
    err = capsys.readouterr().err
    assert "training failed in an earlier attempt of this step" in err and "failing replica: worker-0" in err
    assert "Start a new run" in err


LAUNCHER = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
from train_jobs import stand_in_artifacts
from components.train.stage import run_in_pipeline
run_in_pipeline(**{arguments!r}, **stand_in_artifacts(__import__("pathlib").Path({artifacts!r})))
"""


# What the API server adds to a pod before evicting it (kubernetes pkg/apis/core/types.go, DisruptionTarget).
EVICTION = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "EvictionByEvictionAPI",
    "message": "Eviction API: evicting",
}


def sigterm_the_launcher(fake: FakeKube, tmp_path: Path, pod_conditions: list[dict]) -> tuple[str, str, str, int]:
    """Run the train step as a KFP step pod would (its pod, owned by the run's Workflow, named by KFP_POD_NAME),
    send it SIGTERM once it follows its running job; the job's name, the step's stdout, stderr and exit code."""
    workspace, data, _ = workspace_with_data(tmp_path)
    fake.add_step_pod(LAUNCHER_POD, [WORKFLOW], pod_conditions)
    arguments = {
        key: value
        for key, value in step_arguments(workspace, data, tmp_path).items()
        if "artifact" not in key and key != "metrics"
    }
    script = tmp_path / "launcher.py"
    script.write_text(
        LAUNCHER.format(
            repo=str(REPO_ROOT),
            tests=str(REPO_ROOT / "tests"),
            arguments=arguments,
            artifacts=str(tmp_path / "artifacts"),
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO_ROOT,
        env={**os.environ, "KUBECONFIG": os.environ["KUBECONFIG"], POD_NAME_ENV: LAUNCHER_POD},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        try:
            job = fake.wait_for("pytorchjobs", timeout=60)["metadata"]["name"]
        except AssertionError:
            process.kill()
            raise AssertionError("the launcher created no job:\n" + "".join(process.communicate()))
        fake.set_condition("pytorchjobs", job, "Running", "JobRunning")
        fake.wait_for_request("GET", "/pytorchjobs", count=2)  # the launcher is following the job
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return job, out, err, process.returncode


def test_sigterm_to_the_launcher_deletes_the_job(fake, tmp_path):
    """Cancelling the run stops the launcher pod with SIGTERM: its job must not keep the GPUs."""
    job, out, err, code = sigterm_the_launcher(fake, tmp_path, [])
    assert code == 143, err
    assert f"deleting PyTorchJob {job}" in out and f"deleted PyTorchJob {job}" in out
    assert "stopped (SIGTERM)" in err and "Traceback" not in err
    (delete,) = fake.requests_matching("DELETE", f"/pytorchjobs/{job}")
    assert delete.query.get("propagationPolicy") == "Foreground"
    assert fake.job_names("pytorchjobs") == []
    assert_granted_by_rbac(fake.requests)


def test_an_evicted_launcher_leaves_the_job_training_for_the_next_attempt(fake, tmp_path):
    """A node drain also sends SIGTERM, after marking the pod DisruptionTarget: the job trains on, owned by the
    run's Workflow, and the step's next attempt follows it."""
    job, out, err, code = sigterm_the_launcher(fake, tmp_path, [EVICTION])
    assert code == 143, err
    assert "being evicted (EvictionByEvictionAPI: Eviction API: evicting)" in out and "keeps training" in out
    assert not fake.requests_matching("DELETE", "/pytorchjobs") and fake.job_names("pytorchjobs") == [job]
    assert fake.objects["pytorchjobs"][job]["metadata"]["ownerReferences"] == [JOB_OWNER]
    assert_granted_by_rbac(fake.requests)
