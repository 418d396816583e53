"""Before the train step creates its job: the Kueue LocalQueue it names exists, and the run's Argo Workflow
is found to own the job.

The fake Kubernetes API on 127.0.0.1 (tests/fake_kube.py) stands in for a
cluster, which cannot run here. What it serves for these calls is what the API
server serves: custom objects of Kueue's ``kueue.x-k8s.io/v1beta1``
LocalQueues (404 for the whole group when Kueue is not installed) and pods with
the ownerReferences Argo gives a workflow's pods (argoproj/argo-workflows,
workflow/controller/workflowpod.go: the Workflow as controlling owner).
"""

from __future__ import annotations

import io

import pytest
from fake_kube import SERVED, FakeKube

from common.errors import UserError
from components.training.kube import connect
from components.training.kueue import require_local_queue
from components.training.owner import POD_NAME_ENV, run_owner

KUEUE = {"kueue.x-k8s.io/v1beta1": {"localqueues": "LocalQueue"}}
WITHOUT_KUEUE = {group: kinds for group, kinds in SERVED.items() if not group.startswith("kueue.x-k8s.io/")}
WORKFLOW = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Workflow",
    "name": "llm-finetune-x7k2q",
    "uid": "6c1e2f0a-1b2c-4d5e-8f90-a1b2c3d4e5f6",
    "controller": True,
    "blockOwnerDeletion": True,
}


def serve(tmp_path, monkeypatch, served, forbidden=None) -> FakeKube:
    server = FakeKube(served=served, forbidden=forbidden).start()
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return server


@pytest.fixture
def kueue(tmp_path, monkeypatch):
    server = serve(tmp_path, monkeypatch, {**SERVED, **KUEUE})
    for name in ("team-a", "team-b"):
        local_queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": name}}
        server.handle(
            "POST", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{server.namespace}/localqueues", {}, local_queue
        )
    yield server
    server.stop()


@pytest.fixture
def no_kueue(tmp_path, monkeypatch):
    server = serve(tmp_path, monkeypatch, WITHOUT_KUEUE)
    yield server
    server.stop()


def test_an_existing_local_queue_passes(kueue):
    require_local_queue(connect(), "team-a")


def test_a_missing_local_queue_names_the_ones_there_are(kueue):
    with pytest.raises(UserError) as refused:
        require_local_queue(connect(), "team-c")
    message = str(refused.value)
    assert "no LocalQueue of that name" in message and "team-a, team-b" in message and "ml-team" in message
    assert not kueue.job_names("pytorchjobs")


def test_a_queue_on_a_cluster_without_kueue_is_refused(no_kueue):
    """The label alone would do nothing there: the job would run outside any quota."""
    with pytest.raises(UserError, match="does not serve Kueue"):
        require_local_queue(connect(), "team-a")


def add_launcher_pod(server: FakeKube, name: str, owners: list[dict]) -> None:
    server.add_pod(name, {"workflows.argoproj.io/workflow": WORKFLOW["name"]}, "main")
    with server.changed:
        server.objects["pods"][name]["metadata"]["ownerReferences"] = owners


def test_the_runs_workflow_owns_the_job(no_kueue, monkeypatch):
    """Deleting the run deletes its Workflow, and the garbage collector then deletes the job it owns."""
    add_launcher_pod(no_kueue, "llm-finetune-x7k2q-system-container-impl-1234", [WORKFLOW])
    monkeypatch.setenv(POD_NAME_ENV, "llm-finetune-x7k2q-system-container-impl-1234")
    out = io.StringIO()
    owner = run_owner(connect(), out)
    assert owner == {key: WORKFLOW[key] for key in ("apiVersion", "kind", "name", "uid")}  # not controller
    assert WORKFLOW["name"] in out.getvalue()


def test_a_pod_without_a_workflow_owner_says_so(no_kueue, monkeypatch):
    add_launcher_pod(no_kueue, "launcher", [])
    monkeypatch.setenv(POD_NAME_ENV, "launcher")
    out = io.StringIO()
    assert run_owner(connect(), out) is None
    assert "not owned by an Argo Workflow" in out.getvalue() and "activeDeadlineSeconds" in out.getvalue()


def test_outside_a_pipeline_step_there_is_no_owner_and_the_log_says_so(no_kueue, monkeypatch):
    monkeypatch.delenv(POD_NAME_ENV, raising=False)
    out = io.StringIO()
    assert run_owner(connect(), out) is None
    assert f"${POD_NAME_ENV} is not set" in out.getvalue()
    assert not no_kueue.requests_matching("GET", "/pods/")


def test_a_launcher_that_may_not_read_its_own_pod_stops_before_creating_an_orphan(tmp_path, monkeypatch):
    """Without its Workflow as owner the job would outlive the run: an older Role is a clear error, not a shrug."""
    server = serve(tmp_path, monkeypatch, WITHOUT_KUEUE, forbidden={"pods"})
    try:
        monkeypatch.setenv(POD_NAME_ENV, "launcher")
        with pytest.raises(UserError, match="pipelines/rbac.yaml") as refused:
            run_owner(connect(), io.StringIO())
        assert "may not read its own pod launcher" in str(refused.value)
    finally:
        server.stop()
