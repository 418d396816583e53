"""Kueue: the check that the LocalQueue a training job is submitted to exists.

Kueue's job integrations (PyTorchJob through ``kubeflow.org/pytorchjob``,
TrainJob through ``trainer.kubeflow.org/trainjob``) manage a job that carries
``kueue.x-k8s.io/queue-name`` (``kinds.QUEUE_LABEL``): its webhook creates the
job suspended and Kueue un-suspends it once the LocalQueue's ClusterQueue has
quota for all its pods.
OpenShift AI's Distributed workloads dashboard lists only such workloads.

A queue name that names no LocalQueue would leave the job suspended for ever
(Kueue reports it only on the Workload), and a cluster without Kueue would
ignore the label and run the job outside any quota: both are refused here,
before the job is created.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from common.errors import UserError
from common.kube import Cluster
from components.training.kube import REQUEST_TIMEOUT, api_problem

GROUP = "kueue.x-k8s.io"
# Served by every Kueue release through v0.19 and its main branch; deprecated since v0.16 in favour of v1beta2,
# which serves the same LocalQueues and Workloads.
VERSION = "v1beta1"
LOCAL_QUEUES = "localqueues"


def require_local_queue(cluster: Cluster, queue_name: str) -> None:
    """Fail, naming the queues that do exist, unless LocalQueue ``queue_name`` exists in the job's namespace."""
    try:
        cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, LOCAL_QUEUES, queue_name, _request_timeout=REQUEST_TIMEOUT
        )
        return
    except ApiException as error:
        if error.status != 404:
            raise api_problem(error, f"read Kueue LocalQueue {queue_name}", cluster) or error
    try:
        listing = cluster.custom.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, LOCAL_QUEUES, _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as error:
        if error.status == 404:
            raise UserError(
                f"queue_name is {queue_name!r}, but this cluster does not serve Kueue ({LOCAL_QUEUES}.{GROUP}/"
                f"{VERSION}), so nothing would queue the training job or hold it to a quota. Install Kueue (on "
                "OpenShift AI: the Red Hat build of Kueue, with the kueue component of the DataScienceCluster) or "
                "leave queue_name empty."
            ) from None
        raise api_problem(error, f"list Kueue LocalQueues in {cluster.namespace}", cluster) or error
    names = sorted(item["metadata"]["name"] for item in listing.get("items") or [])
    existing = f"the LocalQueues there are: {', '.join(names)}" if names else "there is no LocalQueue there"
    raise UserError(
        f"queue_name is {queue_name!r}, but namespace {cluster.namespace} has no LocalQueue of that name "
        f"({existing}); Kueue would hold the training job suspended for ever. Set queue_name to one of them, ask "
        "your cluster administrator for a LocalQueue, or leave queue_name empty."
    )
