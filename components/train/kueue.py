"""Kueue: the check that a training job's LocalQueue exists, and what the log says while Kueue holds the job.

Kueue's job integrations (PyTorchJob through ``kubeflow.org/pytorchjob``,
TrainJob through ``trainer.kubeflow.org/trainjob``) manage a job that carries
``kueue.x-k8s.io/queue-name`` (``kinds.QUEUE_LABEL``): its webhook creates the
job suspended and Kueue un-suspends it once the LocalQueue's ClusterQueue has
quota for all its pods.
OpenShift AI's Distributed workloads dashboard lists only such workloads.

While the job waits, ``Admission`` says so at once, then every
``ADMISSION_NOTICE_SECONDS``, with how long it has waited and why in the words of
the job's Workload ("couldn't assign flavors to pod set master: insufficient
unused quota for nvidia.com/gpu ..."); Kueue labels a Workload with the uid of
its job (``kueue.x-k8s.io/job-uid``, pkg/controller/constants/constants.go).

A queue name that names no LocalQueue would leave the job suspended for ever
(Kueue reports it only on the Workload), and a cluster without Kueue would
ignore the label and run the job outside any quota: both are refused here,
before the job is created.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from kubernetes.client.exceptions import ApiException

from common.errors import UserError
from common.kube import Cluster
from components.train.api_server import NETWORK_ERRORS, REQUEST_TIMEOUT, api_problem, error_message
from components.train.kinds import QUEUE_LABEL, JobKind
from components.train.reports import duration_text

GROUP = "kueue.x-k8s.io"
# Served by every Kueue release through v0.19 and its main branch; deprecated since v0.16 in favour of v1beta2,
# which serves the same LocalQueues and Workloads.
VERSION = "v1beta1"
LOCAL_QUEUES = "localqueues"
WORKLOADS = "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on a Workload: the uid of the job it was made for
ADMISSION_NOTICE_SECONDS = 120  # how often "waiting for admission" is repeated while Kueue holds the job


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


class Admission:
    """Says, while Kueue holds the job, where it waits, for how long and why; and when it is admitted."""

    def __init__(self, cluster: Cluster, kind: JobKind, name: str, out: TextIO) -> None:
        self.cluster, self.kind, self.name, self.out = cluster, kind, name, out
        self.next_notice = 0.0
        self.workloads_readable = True

    def waiting(self, job: dict[str, Any], waited: float) -> None:
        """Say (at once, then every ADMISSION_NOTICE_SECONDS) that the job waits for admission."""
        if time.monotonic() < self.next_notice:
            return
        self.next_notice = time.monotonic() + ADMISSION_NOTICE_SECONDS
        print(f"{self.kind.kind} {self.name}: {self.notice(job, waited)}", file=self.out, flush=True)

    def notice(self, job: dict[str, Any], waited: float) -> str:
        """``waiting for admission in queue q for 3 min so far; Kueue says: ...``: the log's line and the report's."""
        queue = (job.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL)
        where = f"in queue {queue}" if queue else "(the job is suspended but names no Kueue queue)"
        why = self.why(job)
        return f"waiting for admission {where} for {duration_text(waited)} so far" + (
            f"; Kueue says: {why}" if why else ""
        )

    def admitted(self, job: dict[str, Any], waited: float) -> None:
        self.next_notice = 0.0  # a job suspended again (preempted) is announced at once
        queued = QUEUE_LABEL in (job.get("metadata", {}).get("labels") or {})
        by = "admitted by Kueue" if queued else "resumed"
        print(f"{self.kind.kind} {self.name}: {by} after {duration_text(waited)}", file=self.out, flush=True)

    def why(self, job: dict[str, Any]) -> str:
        """Why Kueue has not admitted the job, from its Workload's conditions; empty when that cannot be read."""
        if not self.workloads_readable:
            return ""
        uid = job.get("metadata", {}).get("uid", "")
        try:
            listing = self.cluster.custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self.cluster.namespace,
                WORKLOADS,
                label_selector=f"{JOB_UID_LABEL}={uid}",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as error:
            if error.status in (403, 404):  # not granted (an older pipelines/rbac.yaml), or no Kueue API
                self.workloads_readable = False
                if error.status == 403:
                    print(
                        f"cannot read Kueue Workloads to say why the job waits ({error_message(error)}); "
                        "apply the current pipelines/rbac.yaml to see it here. Carrying on.",
                        file=self.out,
                        flush=True,
                    )
            return ""
        except NETWORK_ERRORS:
            return ""
        return pending_reason(listing.get("items") or [])


def pending_reason(workloads: list[dict[str, Any]]) -> str:
    """The message of the first condition holding a Workload back: no quota reserved, or admission checks."""
    for workload in workloads:
        conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
        for condition_type in ("QuotaReserved", "Admitted"):
            condition = conditions.get(condition_type)
            if condition and condition.get("status") == "False" and condition.get("message"):
                return condition["message"]
    return ""
