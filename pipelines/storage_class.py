"""Find the StorageClass for the per-run workspace PVC.

KFP's CreatePVC sends ``storageClassName: ""`` when given an empty string, which
Kubernetes reads as "no class" (static binding only: the claim would stay
Pending forever), and sends ``standard`` when the input is absent. Neither means
"the cluster default", so an empty ``pvc_storage_class`` is resolved here, at
run time, to the class the cluster marks as default.
"""

from kubernetes import client
from kubernetes.client.rest import ApiException

from common.errors import UserError, exit_on_user_error
from common.kube import connect

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


def choose_storage_class(requested: str, api: client.StorageV1Api | None = None) -> str:
    """``requested`` itself, or the cluster's default StorageClass when it is empty."""
    if requested:
        return requested
    api = (
        api
        or connect(
            "find its default StorageClass in", "Set the pipeline parameter pvc_storage_class, or name an existing PVC."
        ).storage
    )
    try:
        classes = api.list_storage_class().items
    except ApiException as error:
        raise UserError(
            f"Could not list StorageClasses to find the cluster default (HTTP {error.status} {error.reason}). "
            "Set the pipeline parameter pvc_storage_class to a class that supports ReadWriteMany "
            "(`oc get storageclass` lists them), or give the pipeline's service account get/list on storageclasses."
        ) from None
    defaults = sorted(
        item.metadata.name
        for item in classes
        if any((item.metadata.annotations or {}).get(key) == "true" for key in DEFAULT_CLASS_ANNOTATIONS)
    )
    if not defaults:
        names = ", ".join(sorted(item.metadata.name for item in classes)) or "none"
        raise UserError(
            f"The cluster has no default StorageClass (classes found: {names}). Set the pipeline parameter "
            "pvc_storage_class to one that supports ReadWriteMany, or name an existing PVC in pvc_name."
        )
    return defaults[0]


@exit_on_user_error
def resolve_in_pipeline(requested: str) -> str:
    chosen = choose_storage_class(requested)
    print(f"workspace PVC storage class: {chosen}", flush=True)
    return chosen
