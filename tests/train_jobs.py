"""Example training jobs for the launcher's tests: a JobSpec, and the pods each operator would make for it."""

from __future__ import annotations

import json
from pathlib import Path

from components.train.kinds import PYTORCHJOB, JobKind
from components.train.manifests import DEADLINE_BACKSTOP_SECONDS, JobSpec, job_name, run_labels
from components.train.options import LaunchOptions
from trainer.config import TrainConfig

RUN_ID = "0f6c8a3e-5b1d-4c2a-9e7f-1a2b3c4d5e6f"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# The train step's pod under KFP, and the ownerReference Argo gives it: its Workflow, as controller.
LAUNCHER_POD = "llm-finetune-x7k2q-system-container-impl-1"
WORKFLOW = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Workflow",
    "name": "llm-finetune-x7k2q",
    "uid": "6c1e2f0a-1b2c-4d5e-8f90-a1b2c3d4e5f6",
    "controller": True,
    "blockOwnerDeletion": True,
}
# What the launcher makes the training job's owner: the same Workflow, not as controller.
JOB_OWNER = {key: WORKFLOW[key] for key in ("apiVersion", "kind", "name", "uid")}


def example_spec(
    nodes: int, gpus: int, *, tolerations=(), secret: str = "", node_selector=None, namespace: str = "ml-team"
) -> JobSpec:
    root = "/mnt/workspace"
    return JobSpec(
        name=job_name(RUN_ID),
        namespace=namespace,
        image="quay.io/example/llm-finetune-pipeline:0.1.0",
        train=TrainConfig(
            model="HuggingFaceTB/SmolLM3-3B",
            tokens_dir=Path(f"{root}/token-cache/0123abcd"),
            output_dir=Path(f"{root}/runs/{RUN_ID}/train"),
            epochs=2.0,
        ),
        launch=LaunchOptions(
            nodes=nodes,
            gpus_per_node=gpus,
            cpu="8",
            memory="64Gi",
            shm_size="16Gi",
            backoff_limit=3,
            timeout_minutes=(86400 - DEADLINE_BACKSTOP_SECONDS) / 60,
            grace_period_seconds=180,
            hf_token_secret=secret,
            node_selector=json.dumps(node_selector or {}),
            tolerations=json.dumps(list(tolerations)),
        ),
        pvc_name="ws-pvc",
        mount_path=root,
        ttl_seconds_after_finished=3600,
        labels=run_labels(RUN_ID, "llm-finetune"),
    )


def replica_pods(kind: JobKind, job: str, nodes: int) -> list[tuple[str, dict[str, str]]]:
    """(pod name, labels) of each replica, labelled as the Training Operator v1.9 or JobSet label them."""
    if kind is PYTORCHJOB:
        roles = [("master", 0)] + [("worker", index) for index in range(nodes - 1)]
        return [
            (
                f"{job}-{role}-{index}",
                {
                    "training.kubeflow.org/job-name": job,
                    "training.kubeflow.org/replica-type": role,
                    "training.kubeflow.org/replica-index": str(index),
                },
            )
            for role, index in roles
        ]
    return [
        (
            f"{job}-node-0-{index}-x7k2q",
            {
                "jobset.sigs.k8s.io/jobset-name": job,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": str(index),
            },
        )
        for index in range(nodes)
    ]


class StandInArtifact:
    """What ``run_in_pipeline`` uses of a KFP artifact (path, metadata, log_metric), without KFP."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.metadata: dict = {}
        self.metrics: dict = {}

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name] = value


def stand_in_artifacts(directory: Path) -> dict[str, StandInArtifact]:
    """The train step's three outputs, as run_in_pipeline's keyword arguments."""
    return {name: StandInArtifact(directory / name) for name in ("model_artifact", "metrics", "manifest_artifact")}
