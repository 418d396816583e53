"""Where and how the training stage runs the trainer: its options, their defaults, help and validation.

``LaunchOptions`` is the single declaration of these run parameters
(each field's ``name`` is its run-form name: ``training_nodes`` sets ``nodes`` and so on);
``launch_problems`` is their validation, shared by the pipeline's first step and
the train step itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common.cli_options import choice_problems, option, run_form_names, run_option
from common.errors import UserError
from common.kube import is_label_value_name, is_positive_quantity, is_subdomain_name
from components.default_base_model import LOCAL_BACKEND
from components.hub_auth import READ_SECRET_NAME
from components.train.kinds import KINDS

BACKENDS = (LOCAL_BACKEND, *KINDS)
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Of a pod's termination grace period, what torchrun keeps for itself: after its shutdown timeout it kills the
# workers and exits, which must happen before the kubelet kills the container.
TORCHRUN_EXIT_SECONDS = 10
MIN_GRACE_SECONDS = TORCHRUN_EXIT_SECONDS + 20


@dataclass(frozen=True)
class LaunchOptions:
    """Where and how the trainer runs."""

    backend: str = run_option(
        "pytorchjob",
        "pytorchjob (Kubeflow Training Operator v1) or trainjob (Kubeflow Trainer v2, OpenShift AI 3.x); "
        "local runs torchrun on this machine (what python -m pipelines.run uses).",
        name="training_backend",
        choices=BACKENDS,
    )
    nodes: int = run_option(
        2,
        "Training pods (1 master + workers); the job has nodes x gpus_per_node processes (local: processes).",
        name="training_nodes",
    )
    gpus_per_node: int = run_option(1, "GPUs per training pod, one training process each; 0 trains on CPU.")
    gpu_memory: str = run_option(
        "",
        "Memory of one GPU of the training nodes, e.g. 80Gi (A100/H100 80GB) or 48Gi (L40S): the train step estimates "
        "each GPU's use from the base model's config.json and refuses a job that cannot fit, before creating it, "
        "naming the changes that would. Empty: the estimate is printed only.",
    )
    cpu: str = run_option("8", "CPU request and limit of each training pod, e.g. 8.", name="training_cpu")
    memory: str = run_option(
        "48Gi", "Memory request and limit of each training pod, /dev/shm included, e.g. 48Gi.", name="training_memory"
    )
    shm_size: str = run_option(
        "8Gi",
        "Memory-backed /dev/shm of each training pod (NCCL and data loaders need it), e.g. 8Gi.",
        name="training_shm_size",
    )
    node_selector: str = run_option(
        "", "Node labels the training pods must run on: key=value,key2=value2 or a JSON object. Empty: any node."
    )
    tolerations: str = run_option(
        "nvidia.com/gpu:NoSchedule",
        "Taints the training pods tolerate: key[=value][:Effect],... or a JSON list. The default tolerates "
        "NVIDIA GPU nodes' taint.",
    )
    hf_token_secret: str = option(
        READ_SECRET_NAME,
        "Secret with key HF_TOKEN for the training pods: the read token (they only download the base model, never "
        "publish); optional, so a missing one only matters for private or gated models.",
    )
    mlflow_secret: str = run_option(
        "mlflow-credentials",
        "Secret with the MLflow tracking server's credentials, for mlflow_tracking_uri: key MLFLOW_TRACKING_TOKEN (a "
        "bearer token; on OpenShift AI, a service account's token), or MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD; and MLFLOW_WORKSPACE on a server with workspaces (OpenShift AI's: the project's "
        "namespace). Mounted in the first step, the training pods and the evaluate step only. Optional: a server "
        "that needs no login needs no Secret.",
    )
    timeout_minutes: float = run_option(
        24 * 60.0,
        "Delete the training job and fail the run once it has run this many minutes (time waiting in a Kueue "
        "queue excluded).",
        name="training_timeout_minutes",
    )
    start_timeout_minutes: float = run_option(
        30.0,
        "Delete the training job and fail the run, with the pods' Kubernetes events, when its pods are not all "
        "running this many minutes after it was created (unschedulable, volume not mounting, image not pulling). "
        "Time waiting in a Kueue queue does not count unless start_timeout_includes_queue is on.",
        name="training_start_timeout_minutes",
    )
    start_timeout_includes_queue: bool = run_option(
        False,
        "Count the time the training job waits for Kueue admission toward the start timeout.",
    )
    backoff_limit: int = run_option(
        3,
        "PyTorchJob: container restarts before the job fails, counted over all replicas together (the Training "
        "Operator sums them); each restart resumes from the newest checkpoint. A TrainJob restarts as its "
        "ClusterTrainingRuntime says instead.",
        name="training_backoff_limit",
    )
    queue_name: str = run_option(
        "",
        "Kueue LocalQueue to submit the training job to (label kueue.x-k8s.io/queue-name); it then waits for "
        "quota and appears in OpenShift AI's Distributed workloads dashboard. Empty: no queue.",
    )
    priority_class: str = run_option(
        "",
        "Kueue WorkloadPriorityClass of the training job (label kueue.x-k8s.io/priority-class); needs "
        "queue_name. Empty: the queue's default priority.",
    )
    trainjob_runtime: str = run_option("torch-distributed", "The ClusterTrainingRuntime a trainjob uses.")
    grace_period_seconds: int = run_option(
        180,
        "Seconds a training pod has, once stopped (eviction, node drain, deletion), to save a checkpoint before "
        "Kubernetes kills it: the pods' terminationGracePeriodSeconds. torchrun gives its workers all but the last "
        f"{TORCHRUN_EXIT_SECONDS} s. The default fits a LoRA checkpoint of a 3B model; raise it for full "
        "fine-tuning of large models.",
        name="training_grace_period_seconds",
    )

    @property
    def procs_per_node(self) -> int:
        return self.gpus_per_node or 1


# What the run form calls each option: what a message tells the user to change.
PARAMETER = run_form_names(LaunchOptions)


def parse_node_selector(value: str | dict[str, str]) -> dict[str, str]:
    """``{"k": "v"}`` (JSON or a dict) or ``k=v,k2=v2``; empty means none."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    text = value.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError as error:
            raise UserError(
                f"parameter 'node_selector' is not valid JSON ({error}): {text!r}. "
                'Write it as {"key": "value"} or key=value,key2=value2.'
            ) from None
        return parse_node_selector(parsed)
    selector = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, sep, label = pair.partition("=")
        if not sep or not key:
            raise UserError(
                f"parameter 'node_selector' has {pair!r}, which is not key=value. "
                "Write it as key=value,key2=value2 or as a JSON object."
            )
        selector[key.strip()] = label.strip()
    return selector


def parse_tolerations(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A JSON list of Kubernetes tolerations, or the short form ``key[=value][:Effect],...``; empty means none."""
    if isinstance(value, list):
        tolerations = value
    elif not value.strip():
        return []
    elif value.strip().startswith("["):
        try:
            tolerations = json.loads(value)
        except ValueError as error:
            raise UserError(
                f"parameter 'tolerations' is not valid JSON ({error}): {value!r}. "
                "Write a JSON list of tolerations or key[=value][:Effect],..."
            ) from None
    else:
        tolerations = [_short_toleration(item.strip()) for item in value.split(",") if item.strip()]
    for toleration in tolerations:
        problem = _toleration_problem(toleration)
        if problem:
            raise UserError(f"parameter 'tolerations' has {toleration!r}: {problem}.")
    return tolerations


def _short_toleration(text: str) -> dict[str, Any]:
    """``nvidia.com/gpu:NoSchedule`` tolerates that taint whatever its value; ``team=ml:NoExecute`` only value ml."""
    taint, _, effect = text.partition(":")
    key, sep, value = taint.partition("=")
    toleration: dict[str, Any] = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def _toleration_problem(toleration: Any) -> str | None:
    if not isinstance(toleration, dict):
        return "each toleration is an object with key, operator, value and effect"
    if toleration.get("operator", "Equal") not in TOLERATION_OPERATORS:
        return f"operator must be one of {', '.join(TOLERATION_OPERATORS)}"
    if toleration.get("effect", "") not in ("", *TAINT_EFFECTS):
        return f"effect must be one of {', '.join(TAINT_EFFECTS)} (or absent for all)"
    if not toleration.get("key") and toleration.get("operator") != "Exists":
        return "a toleration without a key must use operator Exists"
    return None


def sharding_problem(sharding: str, nodes: int, gpus_per_node: int) -> str | None:
    """Why ``sharding`` cannot work on a job of ``nodes`` x ``gpus_per_node``, or None."""
    processes = nodes * (gpus_per_node or 1)
    if sharding == "fsdp" and processes < 2:
        return (
            f"is fsdp, but the job has {processes} training process (training_nodes x gpus_per_node): FSDP shards "
            "the model across processes and needs at least 2; use sharding none, or more nodes or GPUs"
        )
    return None


def launch_problems(launch: LaunchOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way (step or run parameter)."""
    problems = choice_problems(LaunchOptions, launch)
    if launch.nodes < 1:
        problems["nodes"] = f"must be at least 1 (got {launch.nodes})"
    if launch.gpus_per_node < 0:
        problems["gpus_per_node"] = f"must be 0 (CPU) or more (got {launch.gpus_per_node})"
    if launch.timeout_minutes <= 0:
        problems["timeout_minutes"] = f"must be positive (got {launch.timeout_minutes})"
    if launch.start_timeout_minutes <= 0:
        problems["start_timeout_minutes"] = f"must be positive (got {launch.start_timeout_minutes})"
    if launch.grace_period_seconds < MIN_GRACE_SECONDS:
        problems["grace_period_seconds"] = (
            f"must be at least {MIN_GRACE_SECONDS} (got {launch.grace_period_seconds}): torchrun needs "
            "time to stop its workers after they saved"
        )
    if launch.backoff_limit < 0:
        problems["backoff_limit"] = f"must be 0 or more (got {launch.backoff_limit})"
    for name in ("cpu", "memory", "shm_size", "gpu_memory"):
        value = getattr(launch, name)
        if (value or name != "gpu_memory") and not is_positive_quantity(value):
            problems[name] = f"is {value!r}, not a positive Kubernetes quantity such as '8', '500m', '48Gi'"
    if not is_subdomain_name(launch.mlflow_secret):
        problems["mlflow_secret"] = (
            f"is {launch.mlflow_secret!r}, not a valid Secret name (lowercase letters, digits, '-', '.')"
        )
    if launch.hf_token_secret and not is_subdomain_name(launch.hf_token_secret):
        problems["hf_token_secret"] = f"is {launch.hf_token_secret!r}, not a valid Secret name (or empty for none)"
    for name in ("queue_name", "priority_class"):
        value = getattr(launch, name)
        if value and not is_label_value_name(value):
            problems[name] = (
                f"is {value!r}, not a Kueue object name usable as a label value: at most 63 lowercase letters, "
                "digits, '-' and '.', starting and ending with a letter or digit (or empty for none)"
            )
    if launch.priority_class and not launch.queue_name:
        problems["priority_class"] = (
            f"is {launch.priority_class!r} but queue_name is empty: only Kueue reads the priority class, so "
            "set queue_name too (or leave priority_class empty)"
        )
    for name, parse in (("node_selector", parse_node_selector), ("tolerations", parse_tolerations)):
        try:
            parse(getattr(launch, name))
        except UserError as error:
            problems[name] = str(error).rstrip(".").split(f"parameter '{name}' ", 1)[-1]
    return problems
