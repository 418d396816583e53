"""The workspace PVC's StorageClass: the one named, or the cluster's default, refused when the cluster says it
cannot give a ReadWriteMany filesystem volume (the PVC would stay Pending and the run wait there for good).

No real Kubernetes API server can run here, so these tests serve the three endpoints the code calls from a small
fake HTTP server on 127.0.0.1 (http.server in a thread), following the API's paths and answers:
GET /apis/storage.k8s.io/v1/storageclasses and .../storageclasses/{name} (Kubernetes storage.k8s.io/v1), and GET
/apis/cdi.kubevirt.io/v1beta1/storageprofiles/{name} (CDI's StorageProfile, kubevirt/containerized-data-importer
doc/storageprofile.md: status.claimPropertySets of accessModes and volumeMode). A real ``kubernetes`` client talks
to it: its requests and its parsing of the answers (``V1StorageClass`` refuses an object without a provisioner)
are the real ones; only the cluster is fake.
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
from common.kube import Cluster
from pipelines.storage_capabilities import FS_TYPE, gives_rwx_filesystem
from pipelines.storage_class import choose_storage_class

LIST_PATH = "/apis/storage.k8s.io/v1/storageclasses"
PROFILES_PATH = "/apis/cdi.kubevirt.io/v1beta1/storageprofiles"
GA = "storageclass.kubernetes.io/is-default-class"
BETA = "storageclass.beta.kubernetes.io/is-default-class"
CEPHFS = "openshift-storage.cephfs.csi.ceph.com"  # ODF's ocs-storagecluster-cephfs
CEPH_RBD = "openshift-storage.rbd.csi.ceph.com"  # ODF's ocs-storagecluster-ceph-rbd, often the default
EBS = "ebs.csi.aws.com"  # gp3-csi, the default of OpenShift on AWS


def storage_class(
    name: str, annotations: dict | None = None, provisioner: str = "nfs.csi.k8s.io", parameters: dict | None = None
) -> dict:
    metadata = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    found = {
        "kind": "StorageClass",
        "apiVersion": "storage.k8s.io/v1",
        "metadata": metadata,
        "provisioner": provisioner,
        "reclaimPolicy": "Delete",
    }
    return {**found, "parameters": parameters} if parameters else found


def storage_profile(name: str, *property_sets: tuple[list[str], str]) -> dict:
    """A StorageProfile as CDI writes it: status.claimPropertySets, one per (access modes, volume mode)."""
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "StorageProfile",
        "metadata": {"name": name},
        "spec": {},
        "status": {
            "storageClass": name,
            "claimPropertySets": [{"accessModes": modes, "volumeMode": mode} for modes, mode in property_sets],
        },
    }


def status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeCluster:
    """What the fake API answers, and the request paths it saw."""

    def __init__(self) -> None:
        self.status = 200  # of every StorageClass request: 403 plays a service account without access
        self.items: list[dict] = []
        self.profiles: dict[str, dict] | None = None  # None: CDI is not installed (its API group answers 404)
        self.requests: list[str] = []

    def answer(self, path: str) -> tuple[int, dict]:
        if path == LIST_PATH or path.startswith(LIST_PATH + "/"):
            if self.status == 403:
                return 403, status(
                    403,
                    "Forbidden",
                    'storageclasses.storage.k8s.io is forbidden: User "system:serviceaccount:ds:pipeline-runner" '
                    'cannot list resource "storageclasses"',
                )
            if path == LIST_PATH:
                body = {"kind": "StorageClassList", "apiVersion": "storage.k8s.io/v1", "metadata": {}}
                return 200, {**body, "items": self.items}
            name = path.rsplit("/", 1)[1]
            found = [item for item in self.items if item["metadata"]["name"] == name]
            if found:
                return 200, found[0]
            return 404, status(404, "NotFound", f'storageclasses.storage.k8s.io "{name}" not found')
        if path.startswith(PROFILES_PATH + "/") and self.profiles is not None:
            name = path.rsplit("/", 1)[1]
            if name in self.profiles:
                return 200, self.profiles[name]
            return 404, status(404, "NotFound", f'storageprofiles.cdi.kubevirt.io "{name}" not found')
        return 404, status(404, "NotFound", "the server could not find the requested resource")


@pytest.fixture
def cluster():
    """A fake Kubernetes API on a free local port; yields (FakeCluster, base URL)."""
    state = FakeCluster()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            state.requests.append(path)
            code, body = state.answer(path)
            payload = json.dumps(body).encode()
            self.send_response(code)
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
    """A real API client talking to the fake cluster, as ``common.kube.connect`` would return it."""
    _, url = cluster
    with client.ApiClient(client.Configuration(host=url)) as api_client:
        yield Cluster(api_client, "ds")


def test_a_named_class_is_looked_up_and_used(cluster, api):
    """A named class that gives ReadWriteMany is the user's choice: used, and the log line says how it was
    checked."""
    state, _ = cluster
    state.items = [storage_class("ocs-storagecluster-cephfs", provisioner=CEPHFS)]
    chosen = choose_storage_class("ocs-storagecluster-cephfs", api)
    assert chosen.name == "ocs-storagecluster-cephfs"
    assert chosen.log_line() == (
        f"workspace PVC storage class: ocs-storagecluster-cephfs (provisioner {CEPHFS}; {CEPHFS} gives "
        "ReadWriteMany filesystem volumes)"
    )
    assert state.requests == [f"{LIST_PATH}/ocs-storagecluster-cephfs", f"{PROFILES_PATH}/ocs-storagecluster-cephfs"]


def test_a_named_class_that_does_not_exist_is_refused(cluster, api):
    """A misspelt class leaves the claim Pending for good: refused in one paragraph naming the parameter."""
    state, _ = cluster
    state.items = [storage_class("ocs-storagecluster-cephfs", provisioner=CEPHFS)]
    with pytest.raises(UserError) as raised:
        choose_storage_class("ocs-storagecluster-cepfs", api)
    message = str(raised.value)
    assert message.startswith(
        "The cluster has no StorageClass named ocs-storagecluster-cepfs (pvc_storage_class), so the run's PVC would "
        "stay Pending."
    )
    assert "Set the pipeline parameter pvc_storage_class" in message and "pvc_name" in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_named_class_the_service_account_may_not_read_is_used_unchecked(cluster, api):
    """The user named it, and only the check lacks permission: the run goes on, and its log says the class was
    not checked and why."""
    state, _ = cluster
    state.status = 403
    chosen = choose_storage_class("nfs-client", api)
    assert chosen.name == "nfs-client"
    assert "not checked: the pipeline's service account may not read StorageClasses (HTTP 403)" in chosen.log_line()


def test_a_named_class_that_cannot_be_read_is_still_judged_by_its_storage_profile(cluster, api):
    """CDI's StorageProfiles are readable where StorageClasses are not: what the profile says still decides."""
    state, _ = cluster
    state.status = 403
    state.profiles = {
        "thin-csi": storage_profile("thin-csi", (["ReadWriteOnce"], "Filesystem"), (["ReadWriteOnce"], "Block")),
        "nfs": storage_profile("nfs", (["ReadWriteMany"], "Filesystem")),
    }
    with pytest.raises(UserError, match=r"^The StorageClass thin-csi \(pvc_storage_class\) cannot give .* \(its CDI"):
        choose_storage_class("thin-csi", api)
    assert "its CDI StorageProfile offers ReadWriteMany Filesystem" in choose_storage_class("nfs", api).log_line()


def test_a_vsphere_default_is_judged_by_its_parameters(cluster, api):
    """thin-csi, the default of OpenShift on vSphere, gives ReadWriteOnce; CDI reads the class's fstype to tell an
    NFS (vSAN file) class, which gives ReadWriteMany, from it."""
    state, _ = cluster
    state.items = [
        storage_class("thin-csi", {GA: "true"}, "csi.vsphere.vmware.com", {"StoragePolicyName": "thin"}),
        storage_class("vsan-file", provisioner="csi.vsphere.vmware.com", parameters={FS_TYPE: "nfs4"}),
    ]
    with pytest.raises(UserError, match=r"default StorageClass thin-csi .*\(csi\.vsphere\.vmware\.com gives Read"):
        choose_storage_class("", api)
    assert (
        choose_storage_class("vsan-file", api)
        .log_line()
        .endswith("csi.vsphere.vmware.com gives ReadWriteMany filesystem volumes)")
    )


@pytest.mark.parametrize(
    ("provisioner", "parameters", "gives"),
    [
        ("csi.trident.netapp.io", {"backendType": "ontap-nas-economy"}, True),
        ("csi.trident.netapp.io", {"backendType": "ontap-san"}, False),
        (
            "csi.trident.netapp.io",
            {"backendType": "google-cloud-netapp-volumes", "selector": "a=b; performance=flex"},
            True,
        ),
        ("csi.trident.netapp.io", {"backendType": "azure-netapp-files"}, None),
        ("driver.longhorn.io", {}, False),
        ("driver.longhorn.io", {"nfsOptions": "vers=4.2"}, True),
        ("driver.longhorn.io", {"migratable": "true", "nfsOptions": "vers=4.2"}, False),
        ("pxd.portworx.com", {}, True),
        ("pxd.portworx.com", {"backend": "pure_block"}, False),
        ("kubernetes.io/portworx-volume", {"sharedv4_mount_options": "vers=3.0,nolock"}, True),
        ("infinibox-csi-driver", {"storage_protocol": "nfs_treeq"}, True),
        ("infinibox-csi-driver", {"storage_protocol": "iscsi"}, False),
        ("infinibox-csi-driver", {}, None),
        ("csi-unity.dellemc.com", {"protocol": "NFS"}, True),
        ("csi-powerstore.dellemc.com", {FS_TYPE: "ext4"}, False),
        ("csi-powermax.dellemc.com", {FS_TYPE: "nfs"}, True),
        ("csi.huawei.com", {"protocol": "iscsi"}, False),
        ("rook-ceph.cephfs.csi.ceph.com", {}, True),
        ("storage.rbd.csi.ceph.com", {}, False),
        ("ebs.csi.aws.com", {"type": "io2"}, False),  # ReadWriteMany only as a raw block device
        ("csi.vendor.example.com", {}, None),
    ],
)
def test_cdis_table_reads_the_parameters_cdi_reads(provisioner, parameters, gives):
    """The provisioners CDI judges by their class's parameters: each side of each rule, and what it does not
    know."""
    assert gives_rwx_filesystem(provisioner, parameters) is gives


@pytest.mark.parametrize(
    ("provisioner", "class_name"),
    [(CEPH_RBD, "ocs-storagecluster-ceph-rbd"), (EBS, "gp3-csi"), ("topolvm.io", "lvms-vg1")],
    ids=["odf-ceph-rbd", "aws-ebs", "lvm-storage"],
)
def test_a_default_class_of_block_storage_is_refused(cluster, api, provisioner, class_name):
    """The usual OpenShift default is ReadWriteOnce block storage: the run's ReadWriteMany PVC would never bind.
    Refused before the PVC is asked for, in one paragraph naming the class, its provisioner and the fix."""
    state, _ = cluster
    state.items = [storage_class(class_name, {GA: "true"}, provisioner), storage_class("cephfs", provisioner=CEPHFS)]
    with pytest.raises(UserError) as raised:
        choose_storage_class("", api)
    message = str(raised.value)
    assert message.startswith(
        f"The cluster's default StorageClass {class_name} (pvc_storage_class is empty) cannot give the run's "
        f"workspace a ReadWriteMany filesystem volume ({provisioner} gives ReadWriteOnce volumes"
    )
    assert "the run's PVC would stay Pending" in message
    assert "Set the pipeline parameter pvc_storage_class" in message and "ocs-storagecluster-cephfs" in message
    assert "\n" not in message


def test_a_named_class_of_block_storage_is_refused_too(cluster, api):
    """A class the user names is checked like the default: naming it does not make it ReadWriteMany."""
    state, _ = cluster
    state.items = [storage_class("gp3-csi", provisioner=EBS)]
    with pytest.raises(UserError, match=r"^The StorageClass gp3-csi \(pvc_storage_class\) cannot give"):
        choose_storage_class("gp3-csi", api)


def test_the_storage_profile_decides_over_the_provisioner_table(cluster, api):
    """CDI's StorageProfile is what the cluster says of the class (its administrator may have set it): it
    decides both ways, for a provisioner the table knows and one it does not."""
    state, _ = cluster
    state.items = [
        storage_class("nfs-rwo", {GA: "true"}, "nfs.csi.k8s.io"),
        storage_class("vendor-files", provisioner="files.example.com"),
        storage_class("vendor-block", provisioner="block.example.com"),
    ]
    state.profiles = {
        "nfs-rwo": storage_profile("nfs-rwo", (["ReadWriteOnce"], "Filesystem")),
        "vendor-files": storage_profile("vendor-files", (["ReadWriteMany", "ReadWriteOnce"], "Filesystem")),
        "vendor-block": storage_profile(
            "vendor-block", (["ReadWriteMany"], "Block"), (["ReadWriteOnce"], "Filesystem")
        ),
    }
    with pytest.raises(UserError, match=r"\(its CDI StorageProfile offers ReadWriteOnce Filesystem\)"):
        choose_storage_class("", api)
    assert "its CDI StorageProfile offers ReadWriteMany, ReadWriteOnce Filesystem" in (
        choose_storage_class("vendor-files", api).log_line()
    )
    with pytest.raises(UserError, match=r"offers ReadWriteMany Block; ReadWriteOnce Filesystem\)"):
        choose_storage_class("vendor-block", api)


def test_a_profile_without_claim_properties_falls_to_the_table(cluster, api):
    """CDI writes an empty claimPropertySets for a provisioner it does not know: that says nothing."""
    state, _ = cluster
    state.items = [storage_class("ceph-rbd", {GA: "true"}, "rook-ceph.rbd.csi.ceph.com")]
    state.profiles = {"ceph-rbd": {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "StorageProfile", "status": {}}}
    with pytest.raises(UserError, match=r"\(rook-ceph\.rbd\.csi\.ceph\.com gives ReadWriteOnce volumes"):
        choose_storage_class("", api)


def test_an_unknown_provisioner_is_used_and_said_to_be_unchecked(cluster, api):
    """Neither CDI nor its table knows the class: the run goes on, and the log says it could not be checked and
    where to look if the PVC stays Pending."""
    state, _ = cluster
    state.items = [storage_class("vendor", {GA: "true"}, "csi.vendor.example.com")]
    chosen = choose_storage_class("", api)
    assert chosen.name == "vendor"
    assert chosen.log_line() == (
        "workspace PVC storage class: vendor (provisioner csi.vendor.example.com; not checked: whether it gives "
        "ReadWriteMany cannot be read here; if the PVC stays Pending, `oc describe pvc` says why, and "
        "pvc_storage_class names another class)"
    )


@pytest.mark.parametrize("annotation", [GA, BETA], ids=["ga", "beta"])
def test_default_class_found_by_annotation(cluster, api, annotation):
    """Clusters mark their default with the GA annotation, older ones with the beta one; both must work."""
    state, _ = cluster
    state.items = [
        storage_class("fast-rwo", provisioner=EBS),
        storage_class("shared-rwx", {annotation: "true", "description": "NFS"}),
        storage_class("local", {GA: "false", BETA: "false"}),
    ]
    assert choose_storage_class("", api).name == "shared-rwx"
    assert state.requests == [LIST_PATH, f"{PROFILES_PATH}/shared-rwx"]


def test_several_defaults_pick_the_first_by_name(cluster, api):
    """A misconfigured cluster with two defaults still gives the same answer on every run."""
    state, _ = cluster
    state.items = [storage_class("zeta", {GA: "true"}), storage_class("alpha", {BETA: "true"}), storage_class("mid")]
    assert choose_storage_class("", api).name == "alpha"


def test_no_default_tells_the_user_to_set_pvc_storage_class(cluster, api):
    """Without a default the claim would stay Pending forever; the run must stop and say what to set,
    listing the classes there are."""
    state, _ = cluster
    state.items = [storage_class("gp3", {GA: "false"}), storage_class("efs-sc"), storage_class("odd", {GA: "True"})]
    with pytest.raises(UserError) as raised:
        choose_storage_class("", api)
    message = str(raised.value)
    assert message.startswith("The cluster has no default StorageClass (classes found: efs-sc, gp3, odd).")
    assert "Set the pipeline parameter pvc_storage_class" in message
    assert "ReadWriteMany" in message and "pvc_name" in message


def test_no_classes_at_all(cluster, api):
    """An empty cluster says "none" rather than an empty list."""
    with pytest.raises(UserError, match=r"classes found: none\)"):
        choose_storage_class("", api)


def test_forbidden_asks_for_the_parameter_or_rbac(cluster, api):
    """Pipeline service accounts often may not list StorageClasses; the user gets the HTTP status and both
    fixes (name the class, or grant get/list on storageclasses), not an ApiException traceback."""
    state, _ = cluster
    state.status = 403
    with pytest.raises(UserError) as raised:
        choose_storage_class("", api)
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


def resolve_in_subprocess(url: str, tmp_path, requested: str = "") -> subprocess.CompletedProcess:
    """The in-pipeline entry point in a real process, outside a pod, finding the fake cluster via KUBECONFIG."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(kubeconfig_for(url, tmp_path / "kubeconfig"))
    return subprocess.run(
        [
            sys.executable,
            "-c",
            f"from pipelines.storage_class import resolve_in_pipeline; print(repr(resolve_in_pipeline({requested!r})))",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_in_pipeline_entry_point_uses_kubeconfig_outside_a_pod(cluster, tmp_path):
    """Outside a pod the client falls back to the kubeconfig; the chosen class and its check are logged and the
    name returned."""
    state, url = cluster
    state.items = [storage_class("standard-rwx", {GA: "true"}, CEPHFS)]
    result = resolve_in_subprocess(url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"workspace PVC storage class: standard-rwx (provisioner {CEPHFS}; {CEPHFS} gives ReadWriteMany filesystem "
        "volumes)\n'standard-rwx'\n"
    )


def test_in_pipeline_a_block_default_is_one_paragraph_exit_2(cluster, tmp_path):
    """In the pod log the refusal of a ReadWriteOnce default reads as the error paragraph with exit 2, not a
    traceback, before any PVC is asked for."""
    state, url = cluster
    state.items = [storage_class("ocs-storagecluster-ceph-rbd", {GA: "true"}, CEPH_RBD)]
    result = resolve_in_subprocess(url, tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: The cluster's default StorageClass ocs-storagecluster-ceph-rbd")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_in_pipeline_forbidden_is_one_paragraph_exit_2(cluster, tmp_path):
    """In the pod log a permission problem reads as the error paragraph with exit 2, not a traceback."""
    state, url = cluster
    state.status = 403
    result = resolve_in_subprocess(url, tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: Could not list StorageClasses")
    assert "pvc_storage_class" in result.stderr
    assert "Traceback" not in result.stderr
