"""An empty pvc_storage_class resolves to the cluster's default StorageClass, or fails with what to do.

No real Kubernetes API server can run here, so these tests serve the one endpoint the code calls,
GET /apis/storage.k8s.io/v1/storageclasses, from a small fake HTTP server on 127.0.0.1 (http.server in a
thread), and point a real ``kubernetes.client.StorageV1Api`` at it. The client, its request and its
response parsing are the real ones; only the cluster is fake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import REPO_ROOT
from kubernetes import client

from common.errors import UserError
from pipelines.storage_class import choose_storage_class

LIST_PATH = "/apis/storage.k8s.io/v1/storageclasses"
GA = "storageclass.kubernetes.io/is-default-class"
BETA = "storageclass.beta.kubernetes.io/is-default-class"


def storage_class(name: str, annotations: dict | None = None) -> dict:
    metadata = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "provisioner": "example.com/nfs", "reclaimPolicy": "Delete"}


class FakeCluster:
    """What the fake API answers, and the request paths it saw."""

    def __init__(self) -> None:
        self.status = 200
        self.items: list[dict] = []
        self.requests: list[str] = []

    def body(self) -> dict:
        if self.status == 200:
            return {
                "kind": "StorageClassList",
                "apiVersion": "storage.k8s.io/v1",
                "metadata": {"resourceVersion": "1"},
                "items": self.items,
            }
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": (
                'storageclasses.storage.k8s.io is forbidden: User "system:serviceaccount:ds:pipeline-runner" '
                'cannot list resource "storageclasses"'
            ),
            "reason": "Forbidden",
            "code": self.status,
        }


@pytest.fixture
def cluster():
    """A fake Kubernetes API on a free local port; yields (FakeCluster, base URL)."""
    state = FakeCluster()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state.requests.append(self.path)
            if self.path.split("?")[0] != LIST_PATH:
                self.send_error(404)
                return
            payload = json.dumps(state.body()).encode()
            self.send_response(state.status, "Forbidden" if state.status == 403 else None)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def api(cluster):
    """A real StorageV1Api talking to the fake cluster."""
    _, url = cluster
    with client.ApiClient(client.Configuration(host=url)) as api_client:
        yield client.StorageV1Api(api_client)


def test_explicit_name_is_used_as_is_without_asking_the_cluster(cluster, api):
    """A named class is the user's choice: returned unchanged, and not even looked up (so a run needs no
    StorageClass permissions when the class is given)."""
    state, _ = cluster
    assert choose_storage_class("ocs-storagecluster-cephfs", api=api) == "ocs-storagecluster-cephfs"
    assert state.requests == []


def test_explicit_name_needs_no_cluster_config(monkeypatch, tmp_path):
    """With a class given, no client is built at all: no kubeconfig or in-cluster config is needed."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    assert choose_storage_class("nfs-client") == "nfs-client"


@pytest.mark.parametrize("annotation", [GA, BETA], ids=["ga", "beta"])
def test_default_class_found_by_annotation(cluster, api, annotation):
    """Clusters mark their default with the GA annotation, older ones with the beta one; both must work."""
    state, _ = cluster
    state.items = [
        storage_class("fast-rwo"),
        storage_class("shared-rwx", {annotation: "true", "description": "NFS"}),
        storage_class("local", {GA: "false", BETA: "false"}),
    ]
    assert choose_storage_class("", api=api) == "shared-rwx"
    assert [path.split("?")[0] for path in state.requests] == [LIST_PATH]


def test_several_defaults_pick_the_first_by_name(cluster, api):
    """A misconfigured cluster with two defaults still gives the same answer on every run."""
    state, _ = cluster
    state.items = [storage_class("zeta", {GA: "true"}), storage_class("alpha", {BETA: "true"}), storage_class("mid")]
    assert choose_storage_class("", api=api) == "alpha"


def test_no_default_tells_the_user_to_set_pvc_storage_class(cluster, api):
    """Without a default the claim would stay Pending forever; the run must stop and say what to set,
    listing the classes there are."""
    state, _ = cluster
    state.items = [storage_class("gp3", {GA: "false"}), storage_class("efs-sc"), storage_class("odd", {GA: "True"})]
    with pytest.raises(UserError) as raised:
        choose_storage_class("", api=api)
    message = str(raised.value)
    assert message.startswith("The cluster has no default StorageClass (classes found: efs-sc, gp3, odd).")
    assert "Set the pipeline parameter pvc_storage_class" in message
    assert "ReadWriteMany" in message and "pvc_name" in message


def test_no_classes_at_all(cluster, api):
    """An empty cluster says "none" rather than an empty list."""
    with pytest.raises(UserError, match=r"classes found: none\)"):
        choose_storage_class("", api=api)


def test_forbidden_asks_for_the_parameter_or_rbac(cluster, api):
    """Pipeline service accounts often may not list StorageClasses; the user gets the HTTP status and both
    fixes (name the class, or grant get/list on storageclasses), not an ApiException traceback."""
    state, _ = cluster
    state.status = 403
    with pytest.raises(UserError) as raised:
        choose_storage_class("", api=api)
    message = str(raised.value)
    assert message.startswith("Could not list StorageClasses to find the cluster default (HTTP 403 Forbidden).")
    assert "Set the pipeline parameter pvc_storage_class" in message
    assert "`oc get storageclass`" in message
    assert "service account get/list on storageclasses" in message
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None


def kubeconfig_for(url: str, path):
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "nobody", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "nobody"}}],
                "current-context": "fake",
            }
        )
    )
    return path


def resolve_in_subprocess(url: str, tmp_path) -> subprocess.CompletedProcess:
    """The in-pipeline entry point in a real process, outside a pod, finding the fake cluster via KUBECONFIG."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(kubeconfig_for(url, tmp_path / "kubeconfig"))
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from pipelines.storage_class import resolve_in_pipeline; print(repr(resolve_in_pipeline('')))",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_in_pipeline_entry_point_uses_kubeconfig_outside_a_pod(cluster, tmp_path):
    """Outside a pod the client falls back to the kubeconfig; the chosen class is logged and returned."""
    state, url = cluster
    state.items = [storage_class("standard-rwx", {GA: "true"})]
    result = resolve_in_subprocess(url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "workspace PVC storage class: standard-rwx\n'standard-rwx'\n"


def test_in_pipeline_forbidden_is_one_paragraph_exit_2(cluster, tmp_path):
    """In the pod log a permission problem reads as the error paragraph with exit 2, not a traceback."""
    state, url = cluster
    state.status = 403
    result = resolve_in_subprocess(url, tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: Could not list StorageClasses")
    assert "pvc_storage_class" in result.stderr
    assert "Traceback" not in result.stderr
