"""The launcher's own pod: the pipeline run that owns the training job, and whether the pod is being evicted.

KFP v2 runs each step as a pod of the run's Argo Workflow: Argo makes the
Workflow the pod's controlling owner (argoproj/argo-workflows,
workflow/controller/workflowpod.go, ``NewControllerRef`` on the Workflow), and
KFP's Argo compiler gives the step's containers ``KFP_POD_NAME`` from the
downward API (kubeflow/pipelines, backend/src/v2/compiler/argocompiler/
container.go, ``commonEnvs``). The launcher reads its own pod, takes that
Workflow as the training job's ownerReference, and the Kubernetes garbage
collector deletes the job, and with it its pods, when the run is deleted,
even if the launcher is long gone.

SIGTERM reaches the launcher both when the run is cancelled (then it deletes
the job: nobody wants its result) and when its pod is evicted or preempted
(then the job must go on, and a retried step follows it). Kubernetes tells
the two apart on the pod: an eviction through the Eviction API (node drain),
preemption, a taint-based eviction or the kubelet's own termination first add
the condition ``DisruptionTarget`` (kubernetes pkg/apis/core/types.go,
``DisruptionTarget``; on by default since Kubernetes 1.26, GA in 1.31); a
plain deletion, which is how Argo stops a cancelled run's pods, does not.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from kubernetes.client.exceptions import ApiException

from common.errors import UserError
from common.kube import Cluster
from components.train.api_server import NETWORK_ERRORS, REQUEST_TIMEOUT, api_problem

POD_NAME_ENV = "KFP_POD_NAME"
DISRUPTION_CONDITION = "DisruptionTarget"
DISRUPTION_READS = 3
WORKFLOW_KIND = "Workflow"
WORKFLOW_GROUP = "argoproj.io"


def run_owner(cluster: Cluster, out: TextIO | None = None) -> dict[str, str] | None:
    """The ownerReference to this step's Argo Workflow, or None (said in the log) where there is none to find."""
    out = out or sys.stdout
    pod_name = os.environ.get(POD_NAME_ENV, "")
    if not pod_name:
        print(
            f"note: ${POD_NAME_ENV} is not set (not a KFP pipeline step), so the training job gets no owner; only "
            "this process deletes it when stopped, and activeDeadlineSeconds if this process dies",
            file=out,
            flush=True,
        )
        return None
    try:
        pod = _launcher_pod(cluster, pod_name)
    except ApiException as error:
        raise api_problem(error, f"read its own pod {pod_name} (to find the run that owns the job)", cluster) or error
    except NETWORK_ERRORS as error:
        raise UserError(
            f"The Kubernetes API could not be reached to read this step's pod {pod_name} ({type(error).__name__}); "
            "without it the training job could not be tied to the run. Retry the run."
        ) from None
    for reference in pod.metadata.owner_references or []:
        if reference.kind == WORKFLOW_KIND and reference.api_version.split("/")[0] == WORKFLOW_GROUP:
            print(f"the training job is owned by Workflow {reference.name}: deleting the run deletes it", file=out)
            return {
                "apiVersion": reference.api_version,
                "kind": WORKFLOW_KIND,
                "name": reference.name,
                "uid": reference.uid,
            }
    print(
        f"warning: this step's pod {pod_name} is not owned by an Argo Workflow, so the training job gets no owner "
        "and deleting the pipeline run will not delete it; activeDeadlineSeconds still ends it",
        file=out,
        flush=True,
    )
    return None


def launcher_disruption(cluster: Cluster, reads: int = DISRUPTION_READS) -> str | None:
    """Why this launcher pod is being evicted or preempted (the DisruptionTarget condition's reason and message),
    or None: not in a pipeline step, not disrupted (a cancelled run), or the pod cannot be read.

    The Eviction API, the scheduler and the taint manager set the condition
    before the pod is deleted; the kubelet (node-pressure eviction, node
    shutdown) sends it along with the kill, so the pod is read a few times, a
    second apart, before the answer is no.
    """
    pod_name = os.environ.get(POD_NAME_ENV, "")
    if not pod_name:
        return None
    for read in range(reads):
        if read:
            time.sleep(1)
        try:
            pod = _launcher_pod(cluster, pod_name)
        except (ApiException, *NETWORK_ERRORS):
            continue
        for condition in pod.status.conditions or []:
            if condition.type == DISRUPTION_CONDITION and condition.status == "True":
                return f"{condition.reason}: {condition.message}" if condition.message else condition.reason
    return None


def _launcher_pod(cluster: Cluster, pod_name: str):
    return cluster.core.read_namespaced_pod(pod_name, cluster.namespace, _request_timeout=REQUEST_TIMEOUT)
