"""The two kinds of Kubeflow training job the launcher can run, and how to read them.

A ``JobKind`` holds what differs between a Training Operator ``PyTorchJob``
and a Trainer v2 ``TrainJob`` once the job exists: its API coordinates, how
its pods are labelled (to find them and name their replicas in the log), the
name of the trainer container, and which status condition means it finished.
Everything else (create, watch, logs, clean-up) is the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """How a finished job ended, in the operator's words."""

    succeeded: bool
    reason: str
    message: str


@dataclass(frozen=True)
class JobKind:
    backend: str  # the value of the pipeline's ``backend`` parameter
    kind: str
    group: str
    version: str
    plural: str
    container: str  # the trainer container in each pod
    job_label: str  # pod label holding the job's name
    role_label: str  # pod label holding the replica's role (master, worker, node)
    index_label: str  # pod label (or annotation) holding the replica's index within its role
    success_condition: str
    removed_by_ttl: bool  # whether the job's TTL removes it once finished; if not, the launcher deletes a succeeded job
    install_hint: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def pod_selector(self, job_name: str) -> str:
        return f"{self.job_label}={job_name}"

    def replica_name(self, pod: dict[str, Any]) -> str:
        """``master-0``, ``worker-1``, ``node-0``: what the log prefixes each line with."""
        metadata = pod.get("metadata", {})
        labels = metadata.get("labels") or {}
        index = labels.get(self.index_label) or (metadata.get("annotations") or {}).get(self.index_label)
        role = labels.get(self.role_label)
        return f"{role.lower()}-{index}" if role and index is not None else metadata.get("name", "?")

    def outcome(self, job: dict[str, Any]) -> Outcome | None:
        """The job's end, or None while it is still pending or running."""
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("status") != "True":
                continue
            if condition.get("type") in (self.success_condition, "Failed"):
                return Outcome(
                    condition["type"] == self.success_condition,
                    condition.get("reason", ""),
                    condition.get("message", ""),
                )
        return None

    def phase(self, job: dict[str, Any]) -> str:
        """The newest true condition (Created, Running, Restarting, ...), for progress lines."""
        true = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        return true[-1].get("type", "") if true else "Pending"


# Pod labels: the Training Operator v1.9 sets training.kubeflow.org/* on PyTorchJob
# pods; TrainJob pods belong to a JobSet (jobset.sigs.k8s.io/*) whose "node" Job is
# an Indexed Job, so the node's index is the Job controller's completion index.
PYTORCHJOB = JobKind(
    backend="pytorchjob",
    kind="PyTorchJob",
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    container="pytorch",  # the Training Operator only configures the container of this name
    job_label="training.kubeflow.org/job-name",
    role_label="training.kubeflow.org/replica-type",
    index_label="training.kubeflow.org/replica-index",
    success_condition="Succeeded",
    removed_by_ttl=True,
    install_hint=(
        "Install the Kubeflow Training Operator v1: on OpenShift AI 2.x set the trainingoperator component of "
        "the DataScienceCluster to Managed (oc patch datasciencecluster default-dsc --type merge -p "
        '\'{"spec":{"components":{"trainingoperator":{"managementState":"Managed"}}}}\'); elsewhere '
        "kubectl apply --server-side -k "
        "'github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0'. "
        "Or set the backend parameter to trainjob on clusters with Kubeflow Trainer v2 (OpenShift AI 3.x)."
    ),
)

TRAINJOB = JobKind(
    backend="trainjob",
    kind="TrainJob",
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    container="node",  # the trainer container of the torch-distributed ClusterTrainingRuntime
    job_label="jobset.sigs.k8s.io/jobset-name",  # the JobSet of a TrainJob has the TrainJob's name
    role_label="jobset.sigs.k8s.io/replicatedjob-name",
    index_label="batch.kubernetes.io/job-completion-index",
    success_condition="Complete",
    removed_by_ttl=False,
    install_hint=(
        "Install Kubeflow Trainer v2 with its runtimes: on OpenShift AI 3.x set the trainer component of the "
        "DataScienceCluster to Managed; elsewhere kubectl apply --server-side -k "
        "'https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0' and then "
        "-k 'https://github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref=v2.3.0'. "
        "Or set the backend parameter to pytorchjob on clusters with the Training Operator v1."
    ),
)

KINDS = {kind.backend: kind for kind in (PYTORCHJOB, TRAINJOB)}
