"""The two kinds of Kubeflow training job the launcher can run, and how to read them.

A ``JobKind`` holds what differs between a Training Operator ``PyTorchJob``
and a Trainer v2 ``TrainJob`` once the job exists: its API coordinates, how
its pods are labelled (to find them and name their replicas in the log), the
name of the trainer container, and which status condition means it finished.
Everything else (create, watch, logs, clean-up) is the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# The oldest operator releases that know every field the launcher's manifests set, named when a cluster
# refuses one. Trainer v2.2.0 introduced TrainJob's spec.runtimePatches and spec.activeDeadlineSeconds
# (kubeflow/trainer #3309 and #3258, first tagged v2.2.0-rc.0). PyTorchJob manifests are written for the
# Training Operator v1.9, the last v1 release (its spec.nprocPerNode dates from v1.7).
PYTORCHJOB_MIN_VERSION = "Kubeflow Training Operator v1.9"
TRAINJOB_MIN_VERSION = "Kubeflow Trainer v2.2"


# Kueue's labels on a job (kubernetes-sigs/kueue pkg/controller/constants/constants.go): the LocalQueue it is
# submitted to and its WorkloadPriorityClass. Kueue reads them on the job itself, never on its pods.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


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
    min_version: str  # the oldest operator that knows every field of the launcher's manifests
    suspend_path: tuple[str, ...]  # where Kueue suspends the job (and un-suspends it on admission)
    replicas: Callable[[dict[str, Any]], list[str]]  # the replicas a job (manifest) asks for, as replica_name says

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
        """The newest true condition (Created, Suspended, Running, Restarting, ...), for progress lines."""
        true = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        return true[-1].get("type", "") if true else "Pending"

    def suspended(self, job: dict[str, Any]) -> bool:
        """Whether the job is held suspended (by Kueue until it admits it).

        Read from the spec, which Kueue's webhook sets as the job is created, not
        from the operator's ``Suspended`` condition, which follows a moment later.
        """
        value: Any = job
        for key in self.suspend_path:
            value = (value or {}).get(key)
        return bool(value)


def _pytorchjob_replicas(job: dict[str, Any]) -> list[str]:
    """``master-0``, ``worker-0``, ...: every replica type's count (the operator defaults a missing one to 1)."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    return [f"{role.lower()}-{index}" for role, spec in specs.items() for index in range(spec.get("replicas", 1))]


def _trainjob_replicas(job: dict[str, Any]) -> list[str]:
    """``node-0`` ... ``node-<numNodes - 1>``: the trainer's replicated job in the torch-distributed runtime."""
    return [f"node-{index}" for index in range(job["spec"]["trainer"].get("numNodes", 1))]


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
    min_version=PYTORCHJOB_MIN_VERSION,
    suspend_path=("spec", "runPolicy", "suspend"),
    replicas=_pytorchjob_replicas,
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
    min_version=TRAINJOB_MIN_VERSION,
    suspend_path=("spec", "suspend"),
    replicas=_trainjob_replicas,
)

KINDS = {kind.backend: kind for kind in (PYTORCHJOB, TRAINJOB)}
