"""Manifests of a distributed training job: a PyTorchJob (Training Operator v1) or a TrainJob (Trainer v2).

Both describe the same job: ``nodes`` pods of the runtime image, each running
``torchrun -m trainer <options>`` with one process per GPU (one on CPU). No
rank or rendezvous flag is set by hand: torchrun reads ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
``PET_MASTER_PORT``, which both operators inject, and ``--expected-world-size``
makes the trainer refuse to start if that environment does not add up to
``nodes x processes per node``.

What every pod gets, and why:

- the workspace PVC at the same path in every replica, so the paths in the
  trainer's options mean the same file everywhere (data in, checkpoints out);
- ``HF_TOKEN`` from a Secret, marked optional so public models need none; the
  token itself never appears in a manifest, parameter or log; likewise, when
  ``mlflow_tracking_uri`` is set, the MLflow credentials' keys of ``mlflow_secret``;
- a memory-backed ``/dev/shm`` (NCCL and DataLoader workers use shared memory;
  the container runtime's 64 MiB default breaks multi-GPU training). It counts
  against the memory limit;
- ``HOME``, ``TRITON_CACHE_DIR`` on a scratch emptyDir and ``HF_HOME`` on the
  workspace: OpenShift runs pods under a random UID with no writable home, and
  a shared model cache on the PVC is downloaded once for all replicas and runs;
- a restricted security context (no privilege escalation, no capabilities), as
  the restricted Pod Security profile and OpenShift's restricted-v2 SCC want.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from common.run_layout import HF_HOME
from common.tracking import SECRET_KEYS as MLFLOW_SECRET_KEYS
from components.hub_auth import SECRET_KEY, TOKEN_ENV
from components.train.kinds import PRIORITY_LABEL, PYTORCHJOB, QUEUE_LABEL, TRAINJOB
from components.train.options import TORCHRUN_EXIT_SECONDS, LaunchOptions, parse_node_selector, parse_tolerations
from trainer.config import TrainConfig, to_args

GPU_RESOURCE = "nvidia.com/gpu"
PYTORCHJOB_PORT = {"name": "pytorchjob-port", "containerPort": 23456}  # the port the operator's MASTER_PORT names
SCRATCH = "/tmp"
LABEL_PREFIX = "llm-finetune-pipeline"
# The torch-distributed ClusterTrainingRuntime runs its trainer as the replicated
# job "node" (container "node"); runtime patches address it by that name.
TRAINJOB_REPLICATED_JOB = "node"
RUNTIME_PATCH_MANAGER = "llm-finetune-pipeline/launcher"
# Pods are named <job>-worker-<i> (PyTorchJob) or <job>-node-0-<i> (TrainJob) and
# their host names must stay within 63 characters.
MAX_JOB_NAME = 45
FINISHED_JOB_TTL_SECONDS = 24 * 3600  # finished PyTorchJobs (and their pods' logs) stay a day for inspection
DEADLINE_BACKSTOP_SECONDS = 300


@dataclass(frozen=True)
class JobSpec:
    """Everything a training job manifest is rendered from: the run's launch options and where the job goes."""

    name: str  # unique per pipeline run (see job_name); pods and services derive their names from it
    namespace: str
    image: str
    train: TrainConfig  # the trainer's options; paths are on the workspace PVC
    launch: LaunchOptions  # the job's size, placement, limits and queue, as the run set them
    pvc_name: str
    mount_path: str
    labels: dict[str, str] = field(default_factory=dict)  # ties the job and its pods to the pipeline run
    owner: dict[str, str] | None = None  # ownerReference to the pipeline run's Argo Workflow: deleted with the run
    ttl_seconds_after_finished: int = FINISHED_JOB_TTL_SECONDS  # PyTorchJob only: Trainer v2 has none

    @property
    def node_selector(self) -> dict[str, str]:
        return parse_node_selector(self.launch.node_selector)

    @property
    def tolerations(self) -> list[dict[str, Any]]:
        return parse_tolerations(self.launch.tolerations)

    @property
    def active_deadline_seconds(self) -> int:
        """When the cluster stops the job even if the launcher is gone: the launcher deletes it first, at the
        run's training timeout; this is the backstop."""
        return int(self.launch.timeout_minutes * 60) + DEADLINE_BACKSTOP_SECONDS

    @property
    def procs_per_node(self) -> int:
        return self.launch.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.launch.nodes * self.procs_per_node

    @property
    def torchrun_shutdown_seconds(self) -> int:
        """How long torchrun lets its workers save after SIGTERM before it kills them: the pod's grace period
        less the time torchrun needs to tear down and exit before the kubelet's SIGKILL."""
        return self.launch.grace_period_seconds - TORCHRUN_EXIT_SECONDS

    def trainer_command(self) -> list[str]:
        config = dataclasses.replace(
            self.train, require_cuda=self.launch.gpus_per_node > 0, expected_world_size=self.world_size
        )
        return ["torchrun", f"--shutdown-timeout={self.torchrun_shutdown_seconds}", "-m", "trainer", *to_args(config)]


def job_name(run_id: str, prefix: str = "llm-ft") -> str:
    """A DNS-1035 label derived from the run id: the same for every attempt of the run's train step.

    A retried launcher therefore finds the job it started instead of starting a
    second one. Long ids are shortened with a hash so distinct runs stay distinct.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    name = f"{prefix}-{slug}" if slug else prefix
    if len(name) > MAX_JOB_NAME:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = name[: MAX_JOB_NAME - len(digest) - 1].rstrip("-") + "-" + digest
    return name


def label_value(text: str) -> str:
    """``text`` as a valid label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("._-")


def run_labels(run_id: str, pipeline_name: str) -> dict[str, str]:
    """Labels that tie a job and its pods to a pipeline run: ``oc get pods -l llm-finetune-pipeline/run-id=<id>``."""
    return {
        "app.kubernetes.io/part-of": LABEL_PREFIX,
        "app.kubernetes.io/component": "train",
        f"{LABEL_PREFIX}/run-id": label_value(run_id),
        f"{LABEL_PREFIX}/pipeline": label_value(pipeline_name),
    }


def _resources(spec: JobSpec) -> dict[str, Any]:
    # Limits equal to the requests: a namespace with a ResourceQuota on limits refuses pods without them, and
    # with the GPUs requested too the pods get the Guaranteed QoS class, evicted last under node pressure.
    requests = {"cpu": spec.launch.cpu, "memory": spec.launch.memory}
    limits = {"cpu": spec.launch.cpu, "memory": spec.launch.memory}
    if spec.launch.gpus_per_node:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(spec.launch.gpus_per_node)
    return {"requests": requests, "limits": limits}


def _env(spec: JobSpec) -> list[dict[str, Any]]:
    env = [
        {"name": "HOME", "value": SCRATCH},
        {"name": "HF_HOME", "value": f"{spec.mount_path}/{HF_HOME}"},
        {"name": "TRITON_CACHE_DIR", "value": f"{SCRATCH}/.triton"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if spec.launch.hf_token_secret:
        secret = {"name": spec.launch.hf_token_secret, "key": SECRET_KEY, "optional": True}
        env.append({"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": secret}})
    if spec.train.mlflow_tracking_uri:  # rank 0 logs to MLflow: its credentials, each key optional
        for key in MLFLOW_SECRET_KEYS:
            secret = {"name": spec.launch.mlflow_secret, "key": key, "optional": True}
            env.append({"name": key, "valueFrom": {"secretKeyRef": secret}})
    return env


def _volumes(spec: JobSpec) -> list[dict[str, Any]]:
    return [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": spec.pvc_name}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.launch.shm_size}},
        {"name": "scratch", "emptyDir": {}},
    ]


def _volume_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    return [
        {"name": "workspace", "mountPath": spec.mount_path},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "scratch", "mountPath": SCRATCH},
    ]


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _placement(spec: JobSpec) -> dict[str, Any]:
    """Where the pods run, and how long a stopped pod has to save its checkpoint."""
    placement: dict[str, Any] = {"terminationGracePeriodSeconds": spec.launch.grace_period_seconds}
    node_selector, tolerations = spec.node_selector, spec.tolerations  # each parsed afresh from the run's text
    if node_selector:
        placement["nodeSelector"] = node_selector
    if tolerations:
        placement["tolerations"] = tolerations
    return placement


def _metadata(spec: JobSpec) -> dict[str, Any]:
    """The job's name and labels, Kueue's labels (on the job only: Kueue admits jobs, not pods) and its owner.

    The owner is not the controller (``controller`` unset), so neither Kueue nor
    the operator treats the job as another controller's child, and
    ``blockOwnerDeletion`` is unset because setting it needs update rights on
    the Workflow's finalizers; the garbage collector deletes the job with the
    Workflow either way.
    """
    labels = dict(spec.labels)
    if spec.launch.queue_name:
        labels[QUEUE_LABEL] = spec.launch.queue_name
    if spec.launch.priority_class:
        labels[PRIORITY_LABEL] = spec.launch.priority_class
    metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "labels": labels}
    if spec.owner:
        metadata["ownerReferences"] = [dict(spec.owner)]
    return metadata


def render_pytorchjob(spec: JobSpec) -> dict[str, Any]:
    """A ``kubeflow.org/v1`` PyTorchJob: one Master and ``nodes - 1`` Workers.

    ``OnFailure`` restarts a failed replica's container in place (the trainer
    resumes from the newest complete checkpoint) until ``backoffLimit``
    restarts have been spent; ``cleanPodPolicy: Running`` stops replicas left
    running when the job ends, keeping finished pods (and their logs) until
    the TTL removes the job.
    """
    container = {
        "name": PYTORCHJOB.container,
        "image": spec.image,
        "command": spec.trainer_command(),
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": _volume_mounts(spec),
        "ports": [dict(PYTORCHJOB_PORT)],
        "securityContext": CONTAINER_SECURITY,
    }
    template = {
        "metadata": {"labels": dict(spec.labels)},
        "spec": {"containers": [container], "volumes": _volumes(spec), **_placement(spec)},
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if spec.launch.nodes > 1:
        replicas["Worker"] = {"replicas": spec.launch.nodes - 1, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": PYTORCHJOB.api_version,
        "kind": PYTORCHJOB.kind,
        "metadata": _metadata(spec),
        "spec": {
            "nprocPerNode": str(spec.procs_per_node),
            "runPolicy": {
                "backoffLimit": spec.launch.backoff_limit,
                "cleanPodPolicy": "Running",
                "activeDeadlineSeconds": spec.active_deadline_seconds,
                "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            },
            "pytorchReplicaSpecs": replicas,
        },
    }


def render_trainjob(spec: JobSpec, runtime_name: str = "torch-distributed") -> dict[str, Any]:
    """A ``trainer.kubeflow.org/v1alpha1`` TrainJob on the ClusterTrainingRuntime ``runtime_name``.

    Image, command, node count, processes and resources go in ``spec.trainer``.
    Volumes, mounts, placement and pod labels are not trainer fields in
    Trainer v2.3: they go in a ``runtimePatches`` entry that patches the
    runtime's ``node`` replicated job. Restarts are the runtime's JobSet
    failure policy; there is no TTL, so the launcher deletes the job itself.
    """
    pod_spec = {
        "volumes": _volumes(spec),
        "containers": [
            {"name": TRAINJOB.container, "volumeMounts": _volume_mounts(spec), "securityContext": CONTAINER_SECURITY}
        ],
        **_placement(spec),
    }
    patch = {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "metadata": {"labels": dict(spec.labels)},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": TRAINJOB_REPLICATED_JOB,
                            "template": {
                                "spec": {"template": {"metadata": {"labels": dict(spec.labels)}, "spec": pod_spec}}
                            },
                        }
                    ]
                },
            }
        },
    }
    return {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": _metadata(spec),
        "spec": {
            "runtimeRef": {"name": runtime_name, "apiGroup": TRAINJOB.group, "kind": "ClusterTrainingRuntime"},
            "activeDeadlineSeconds": spec.active_deadline_seconds,
            "trainer": {
                "image": spec.image,
                "command": spec.trainer_command(),
                "env": _env(spec),
                "numNodes": spec.launch.nodes,
                "numProcPerNode": spec.procs_per_node,
                "resourcesPerNode": _resources(spec),
            },
            "runtimePatches": [patch],
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes a repeated object (the Master's and Workers' shared pod template) out in full each time, not as a
    YAML anchor and alias, which readers of the manifest would have to resolve by eye."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: dict[str, Any]) -> str:
    """The manifest as YAML, in the order it was built (what ``oc apply -f`` would take)."""
    return yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False, width=1000)
