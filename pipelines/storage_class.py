"""Find the StorageClass for the per-run workspace PVC, and refuse one that cannot give it.

KFP's CreatePVC sends ``storageClassName: ""`` when given an empty string, which
Kubernetes reads as "no class" (static binding only: the claim would stay
Pending forever), and sends ``standard`` when the input is absent. Neither means
"the cluster default", so an empty ``pvc_storage_class`` is resolved here, at
run time, to the class the cluster marks as default.

The workspace is a ReadWriteMany filesystem PVC: every step and training pod
mounts it, on whichever nodes they land. A class that only makes ReadWriteOnce
volumes (block storage: the usual default on OpenShift, ODF's Ceph RBD, AWS EBS)
leaves such a claim Pending without an event a newcomer would connect to the
class, and the run waits there for good. So the chosen class is checked where
the cluster says what it can give: CDI's StorageProfile for the class (on
clusters with OpenShift Virtualization, including an administrator's
overrides), else CDI's own table of well-known provisioners
(``pipelines.storage_capabilities``). A class neither knows is used, and the
log says that it could not be checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from common.errors import UserError, exit_on_user_error
from common.kube import Cluster, connect
from pipelines.storage_capabilities import gives_rwx_filesystem

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)
# CDI's StorageProfile: one per StorageClass, named like it, cluster-scoped.
PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL = "cdi.kubevirt.io", "v1beta1", "storageprofiles"
RWX_FIX = (
    "Set the pipeline parameter pvc_storage_class to a class that gives ReadWriteMany filesystem volumes (CephFS, "
    "NFS, EFS, Azure Files; on OpenShift Data Foundation: ocs-storagecluster-cephfs; `oc get storageclass` lists "
    "the classes), or name an existing ReadWriteMany PVC in pvc_name."
)


@dataclass(frozen=True)
class WorkspaceClass:
    """The StorageClass the run's PVC will ask for, and what is known of its ReadWriteMany support."""

    name: str
    provisioner: str
    checked: str  # how ReadWriteMany support was established, or why it could not be

    def log_line(self) -> str:
        return f"workspace PVC storage class: {self.name} (provisioner {self.provisioner or 'unknown'}; {self.checked})"


def choose_storage_class(requested: str, cluster: Cluster | None = None) -> WorkspaceClass:
    """``requested``, or the cluster's default StorageClass when it is empty; refused when the cluster says the
    class cannot give a ReadWriteMany filesystem volume."""
    cluster = cluster or connect(
        "check the workspace PVC's StorageClass in",
        "Set the pipeline parameter pvc_storage_class, or name an existing PVC.",
    )
    if requested:
        storage_class = named_class(requested, cluster.storage)
        what = f"The StorageClass {requested} (pvc_storage_class)"
    else:
        storage_class = default_class(cluster.storage)
        what = f"The cluster's default StorageClass {storage_class.metadata.name} (pvc_storage_class is empty)"
    if storage_class is None:  # named, but the service account may not read StorageClasses: CDI may still know it
        provisioner = ""
        gives_rwx, source = profile_verdict(requested, cluster.custom) or (
            None,
            "not checked: the pipeline's service account may not read StorageClasses (HTTP 403), and no CDI "
            "StorageProfile says what it gives",
        )
    else:
        name, provisioner = storage_class.metadata.name, storage_class.provisioner or ""
        gives_rwx, source = profile_verdict(name, cluster.custom) or table_verdict(
            provisioner, storage_class.parameters or {}
        )
    if gives_rwx is False:
        raise UserError(
            f"{what} cannot give the run's workspace a ReadWriteMany filesystem volume ({source}), so the run's "
            f"PVC would stay Pending and the run would wait there. {RWX_FIX}"
        )
    return WorkspaceClass(requested or storage_class.metadata.name, provisioner, source)


def named_class(name: str, storage: client.StorageV1Api) -> client.V1StorageClass | None:
    """The StorageClass ``name``; None when the service account may not read StorageClasses (a class the user
    named is then used unchecked); refused when it does not exist."""
    try:
        return storage.read_storage_class(name)
    except ApiException as error:
        if error.status == 404:
            raise UserError(
                f"The cluster has no StorageClass named {name} (pvc_storage_class), so the run's PVC would stay "
                f"Pending. {RWX_FIX}"
            ) from None
        if error.status == 403:
            return None
        raise UserError(
            f"Could not read the StorageClass {name} (pvc_storage_class) to check it (HTTP {error.status} "
            f"{error.reason}). Check that the cluster's API server answers, then start the run again."
        ) from None


def default_class(storage: client.StorageV1Api) -> client.V1StorageClass:
    """The class the cluster marks as default (the first by name if it marks several, so every run agrees)."""
    try:
        classes = storage.list_storage_class().items
    except ApiException as error:
        raise UserError(
            f"Could not list StorageClasses to find the cluster default (HTTP {error.status} {error.reason}). "
            "Set the pipeline parameter pvc_storage_class to a class that supports ReadWriteMany "
            "(`oc get storageclass` lists them), or give the pipeline's service account get/list on storageclasses."
        ) from None
    defaults = sorted(
        (item for item in classes if is_default(item)),
        key=lambda item: item.metadata.name,
    )
    if not defaults:
        names = ", ".join(sorted(item.metadata.name for item in classes)) or "none"
        raise UserError(
            f"The cluster has no default StorageClass (classes found: {names}). Set the pipeline parameter "
            "pvc_storage_class to one that supports ReadWriteMany, or name an existing PVC in pvc_name."
        )
    return defaults[0]


def is_default(storage_class: client.V1StorageClass) -> bool:
    annotations = storage_class.metadata.annotations or {}
    return any(annotations.get(key) == "true" for key in DEFAULT_CLASS_ANNOTATIONS)


def profile_verdict(name: str, custom: client.CustomObjectsApi) -> tuple[bool, str] | None:
    """What CDI's StorageProfile of the class says; None without CDI (404), without read access (403), when
    the API fails otherwise, or with a profile that lists no claim properties (CDI does not know the provisioner
    either): the profile is one source of two, so it never stops a run by its absence."""
    try:
        profile = custom.get_cluster_custom_object(PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL, name)
    except ApiException:
        return None
    property_sets = (profile.get("status") or {}).get("claimPropertySets") or []
    if not property_sets:
        return None
    gives_rwx = any(
        "ReadWriteMany" in (entry.get("accessModes") or []) and entry.get("volumeMode", "Filesystem") == "Filesystem"
        for entry in property_sets
    )
    offered = "; ".join(
        f"{', '.join(entry.get('accessModes') or [])} {entry.get('volumeMode', 'Filesystem')}"
        for entry in property_sets
    )
    return gives_rwx, f"its CDI StorageProfile offers {offered}"


def table_verdict(provisioner: str, parameters: dict[str, str]) -> tuple[bool | None, str]:
    """What CDI's table of well-known provisioners says of the class; None when it does not know it."""
    gives_rwx = gives_rwx_filesystem(provisioner, parameters)
    if gives_rwx:
        return True, f"{provisioner} gives ReadWriteMany filesystem volumes"
    if gives_rwx is False:
        return False, f"{provisioner} gives ReadWriteOnce volumes, or ReadWriteMany only as raw block devices"
    return None, (
        "not checked: whether it gives ReadWriteMany cannot be read here; if the PVC stays Pending, "
        "`oc describe pvc` says why, and pvc_storage_class names another class"
    )


@exit_on_user_error
def resolve_in_pipeline(requested: str) -> str:
    chosen = choose_storage_class(requested)
    print(chosen.log_line(), flush=True)
    return chosen.name
