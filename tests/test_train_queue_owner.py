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
from fake_kube import SERVED
from train_jobs import JOB_OWNER, LAUNCHER_POD, WORKFLOW

from common.errors import UserError
from components.train.api_server import connect
from components.train.kueue import require_local_queue
from components.train.owner import POD_NAME_ENV, run_owner

pytestmark = pytest.mark.waits  # on the launcher's polls of the fake cluster
WITHOUT_KUEUE = {group: kinds for group, kinds in SERVED.items() if not group.startswith("kueue.x-k8s.io/")}


@pytest.fixture
def kueue(fake):
    """The fake API (tests/conftest.py) serves Kueue by default; the namespace has LocalQueues team-a and team-b."""
    for name in ("team-a", "team-b"):
        local_queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": name}}
        fake.handle("POST", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{fake.namespace}/localqueues", {}, local_queue)
    return fake


@pytest.fixture
def no_kueue(fake):
    fake.served = WITHOUT_KUEUE
    return fake


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


def test_the_runs_workflow_owns_the_job(no_kueue, monkeypatch):
    """Deleting the run deletes its Workflow, and the garbage collector then deletes the job it owns."""
    no_kueue.add_step_pod(LAUNCHER_POD, [WORKFLOW])
    monkeypatch.setenv(POD_NAME_ENV, LAUNCHER_POD)
    out = io.StringIO()
    owner = run_owner(connect(), out)
    assert owner == JOB_OWNER  # not controller
    assert WORKFLOW["name"] in out.getvalue()


def test_a_pod_without_a_workflow_owner_says_so(no_kueue, monkeypatch):
    no_kueue.add_step_pod("launcher", [])
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


def test_a_launcher_that_may_not_read_its_own_pod_stops_before_creating_an_orphan(no_kueue, monkeypatch):
    """Without its Workflow as owner the job would outlive the run: an older Role is a clear error, not a shrug."""
    no_kueue.forbidden = {"pods"}
    monkeypatch.setenv(POD_NAME_ENV, "launcher")
    with pytest.raises(UserError, match="pipelines/rbac.yaml") as refused:
        run_owner(connect(), io.StringIO())
    assert "may not read its own pod launcher" in str(refused.value)
