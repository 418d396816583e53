"""Training stage: what the pipeline's ``train_model`` step runs.

In the cluster the step is a small launcher pod (no GPU): it renders a
PyTorchJob (Training Operator v1) or a TrainJob (Kubeflow Trainer v2), creates
it, streams every replica's log into the step's log and ends as the job ends.
Under kfp.local (backend ``local``) it runs the same trainer as N local
processes with torchrun. Either way the trainer writes ``merged/``,
``adapter/``, ``checkpoints/`` and ``training_summary.json`` into the run's
train directory on the workspace, and the step returns that directory with a
Model artifact pointing at it, the summary's numbers as Metrics and the
launched manifest (or local command) as an artifact for debugging.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Mapping

from common.atomic import write_json, write_text_atomic
from common.cli_options import run_form_names
from common.errors import UserError, exit_on_user_error
from common.records import TrainingSummary
from common.run_layout import TOKENS_MANIFEST, TRAINING_FAILURE, TRAINING_PROGRESS, TRAINING_SUMMARY, stage_dir
from components.default_base_model import LOCAL_BACKEND, resolve_base_model
from components.train.fit import check_fit
from components.train.kinds import KINDS, PYTORCHJOB
from components.train.manifests import JobSpec, job_name, render_pytorchjob, render_trainjob, run_labels, to_yaml
from components.train.options import (
    PARAMETER,
    LaunchOptions,
    launch_problems,
    sharding_problem,
)
from components.train.progress import ProgressReporter
from components.train.reports import TrainingFailed
from components.train.signals import TERMINATED_EXIT_CODE, Terminated
from trainer.config import TrainConfig, option_problems

SUMMARY_METRICS = (
    "final_train_loss",
    "mean_train_loss",
    "final_eval_loss",
    "global_step",
    "epochs",
    "train_examples",
    "eval_examples",
    "tokens_seen",
    "train_runtime_s",
    "non_padding_tokens_per_s",
    "mfu",
    "world_size",
    "learning_rate",
)


def check_parameters(launch: LaunchOptions, config: TrainConfig, pvc_name: str, image: str) -> None:
    """Fail in seconds, naming every bad parameter, rather than after pods were scheduled."""
    problems = [
        f"parameter '{name}' {problem}"
        for name, problem in {**launch_problems(launch), **option_problems(config)}.items()
    ]
    if sharding := sharding_problem(config.sharding, launch.nodes, launch.gpus_per_node):
        problems.append(f"parameter 'sharding' {sharding}")
    if launch.backend in KINDS:
        if not pvc_name:
            problems.append(
                "the cluster backends need the workspace PVC's name (pvc_name), to mount it in every training pod"
            )
        if not image:
            problems.append("the cluster backends need the runtime image (image) to run the training pods in")
    if problems:
        raise UserError(
            "The train step's parameters are invalid: " + "; ".join(problems) + ". Fix them and start the run again."
        )
    if not (config.tokens_dir / TOKENS_MANIFEST).is_file():
        raise UserError(
            f"The tokenise step's output {config.tokens_dir} holds no {TOKENS_MANIFEST}, so there is nothing to "
            "train on. "
            "Pass the tokens_dir the tokenise_data step returned "
            "(and, in a cluster, mount the workspace PVC in this step)."
        )


def job_spec(
    config: TrainConfig,
    launch: LaunchOptions,
    *,
    namespace: str,
    run_id: str,
    pipeline_name: str,
    pvc_name: str,
    mount_path: str,
    image: str,
    owner: dict[str, str] | None = None,
) -> JobSpec:
    return JobSpec(
        name=job_name(run_id),
        namespace=namespace,
        image=image,
        train=config,
        launch=launch,
        pvc_name=pvc_name,
        mount_path=mount_path,
        labels=run_labels(run_id, pipeline_name),
        owner=owner,
    )


def render_job(config: TrainConfig, launch: LaunchOptions, **placement: Any) -> dict[str, Any]:
    """The PyTorchJob or TrainJob manifest for ``launch.backend``: what the step creates, and what
    ``python -m pipelines.training_job render`` prints. ``placement`` holds ``job_spec``'s keyword arguments."""
    spec = job_spec(config, launch, **placement)
    if KINDS[launch.backend] is PYTORCHJOB:
        return render_pytorchjob(spec)
    return render_trainjob(spec, launch.trainjob_runtime)


def train_on_cluster(
    config: TrainConfig,
    launch: LaunchOptions,
    *,
    run_id: str,
    pipeline_name: str,
    pvc_name: str,
    mount_path: str,
    image: str,
    manifest_artifact,
) -> None:
    from components.train.api_server import connect
    from components.train.follow import run_job
    from components.train.kueue import require_local_queue
    from components.train.owner import run_owner

    cluster = connect()
    kind = KINDS[launch.backend]
    if launch.queue_name:
        require_local_queue(cluster, launch.queue_name)
    manifest = render_job(
        config,
        launch,
        namespace=cluster.namespace,
        run_id=run_id,
        pipeline_name=pipeline_name,
        pvc_name=pvc_name,
        mount_path=mount_path,
        image=image,
        owner=run_owner(cluster),
    )
    name, text = manifest["metadata"]["name"], to_yaml(manifest)
    write_text_atomic(Path(manifest_artifact.path), text)
    manifest_artifact.metadata.update({"kind": kind.kind, "name": name, "namespace": cluster.namespace})
    print(f"{kind.kind} to run:\n{text}", flush=True)
    if kind is not PYTORCHJOB:
        print(
            f"note: {PARAMETER['backoff_limit']} applies to PyTorchJobs only; this TrainJob "
            "restarts as its ClusterTrainingRuntime says "
            f"(oc get clustertrainingruntime {launch.trainjob_runtime} -o yaml). The stock torch-distributed runtime "
            "sets no JobSet failurePolicy, so Kubernetes' Job default applies: 6 pod restarts of the node Job, all "
            "nodes together, then the TrainJob fails.",
            flush=True,
        )
    run_job(
        cluster,
        kind,
        manifest,
        timeout=launch.timeout_minutes * 60,
        start_timeout=launch.start_timeout_minutes * 60,
        start_timeout_includes_queue=launch.start_timeout_includes_queue,
    )


def train_locally(config: TrainConfig, launch: LaunchOptions, manifest_artifact) -> None:
    from components.train.local import local_command, run_local

    processes = launch.nodes * launch.procs_per_node
    _check_local_gpus(processes, launch.gpus_per_node)
    command = local_command(config, processes)
    write_text_atomic(
        Path(manifest_artifact.path), to_yaml({"backend": LOCAL_BACKEND, "processes": processes, "command": command})
    )
    manifest_artifact.metadata.update({"kind": "local", "processes": processes})
    run_local(config, processes)


def _check_local_gpus(processes: int, gpus_per_node: int) -> None:
    import torch

    if gpus_per_node and torch.cuda.is_available() and processes > torch.cuda.device_count():
        raise UserError(
            f"The local backend would start {processes} processes (nodes x gpus_per_node), one per GPU, "
            f"but this machine has {torch.cuda.device_count()}. Lower nodes or gpus_per_node."
        )


def record_outputs(config: TrainConfig, launch: LaunchOptions, model_artifact, metrics) -> None:
    """Model artifact metadata pointing at the workspace, and the summary's numbers as metrics."""
    summary_path = config.output_dir / TRAINING_SUMMARY
    if not summary_path.is_file():
        raise UserError(
            f"Training finished but {summary_path} is missing. "
            "The training pods write it to the workspace PVC, so this step "
            "must mount the same PVC at the same path (the workspace root) to read it."
        )
    summary = TrainingSummary.read(summary_path)
    locations = {
        "train_dir": str(config.output_dir),
        "merged_dir": str(config.merged_dir),
        "adapter_dir": str(config.adapter_dir) if config.adapter_dir.is_dir() else "",
        "checkpoints_dir": str(config.checkpoints_dir),
    }
    write_json(Path(model_artifact.path), locations)
    model_artifact.metadata.update(
        {
            **locations,
            "base_model": config.model,
            "method": config.method,
            "backend": launch.backend,
            "world_size": summary.world_size,
        }
    )
    for name in SUMMARY_METRICS:
        value = getattr(summary, name)
        if value is not None:
            metrics.log_metric(name, value)


def report_an_earlier_failure(train_dir: Path) -> None:
    """Exit 1 with the report an earlier attempt of this step recorded, if training failed there.

    The step is retried so that a lost launcher pod re-attaches to its job; a
    retry after the training itself failed or timed out must not train a
    second and third time (each with its own restart budget and timeout). A
    failed training is final for its run: start a new run once the cause is fixed.
    """
    record = train_dir / TRAINING_FAILURE
    if record.is_file():
        print(
            f"error: training failed in an earlier attempt of this step ({record}); not training again.\n"
            f"{record.read_text(encoding='utf-8')}"
            "Start a new run once the cause is fixed.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)


@exit_on_user_error
def run_in_pipeline(
    *,
    workspace_root: str,
    run_id: str,
    tokens_dir: str,
    base_model: str,
    training: dict[str, Any],
    launch: dict[str, Any],
    pvc_name: str,
    image: str,
    pipeline_name: str,
    model_artifact,
    pvc_size: str = "",
    metrics,
    manifest_artifact,
) -> tuple[str, str]:
    """Train (on the cluster or locally), then record the outputs; returns the run's train directory and base model.

    ``training`` holds TrainConfig options and ``launch`` LaunchOptions fields,
    by name; a name left out keeps that dataclass's default. A failed or
    timed-out training fails the step (exit 1) with the failure report; a
    stopped step (SIGTERM) exits 143 after deleting its job or stopping its
    local trainer.
    """
    options = LaunchOptions(**launch)
    train_dir = stage_dir(workspace_root, run_id, "train")
    config = TrainConfig(model=base_model, tokens_dir=Path(tokens_dir), output_dir=train_dir, **training)
    check_parameters(options, config, pvc_name, image)
    report_an_earlier_failure(train_dir)
    config = dataclasses.replace(config, model=resolve_base_model(base_model, options.backend))
    print(
        f"training {config.model} ({config.method}) with backend {options.backend}; outputs go to {train_dir}",
        flush=True,
    )
    workspace_size = pvc_size if options.backend != LOCAL_BACKEND else ""
    print(
        "\n".join(check_fit(config, options.nodes, options.gpus_per_node, options.gpu_memory, workspace_size)),
        flush=True,
    )
    reporter = ProgressReporter(train_dir / TRAINING_PROGRESS)
    try:
        with reporter:  # the trainer's progress file, as lines in this step's log
            if options.backend == LOCAL_BACKEND:
                train_locally(config, options, manifest_artifact)
            else:
                train_on_cluster(
                    config,
                    options,
                    run_id=run_id,
                    pipeline_name=pipeline_name,
                    pvc_name=pvc_name,
                    mount_path=workspace_root,
                    image=image,
                    manifest_artifact=manifest_artifact,
                )
    except TrainingFailed as failure:
        write_text_atomic(train_dir / TRAINING_FAILURE, f"{failure}\n")
        print(f"error: training failed.\n{failure}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Terminated:
        print(
            "the train step was stopped (SIGTERM) before training finished; the lines above say what became of "
            "its training job or local trainer",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(TERMINATED_EXIT_CODE)
    record_outputs(config, options, model_artifact, metrics)
    for name, value in reporter.metrics().items():
        metrics.log_metric(name, value)
    return str(train_dir), config.model


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> tuple[str, str]:
    """What the ``train_model`` component calls with every input by name: ``run_in_pipeline`` with the
    inputs named after ``LaunchOptions`` and ``TrainConfig`` fields gathered into those two groups."""
    launch_fields = {spec.name for spec in dataclasses.fields(LaunchOptions)}
    training_fields = run_form_names(TrainConfig)  # the rest the launcher sets: paths, the model, the job's size
    return run_in_pipeline(
        workspace_root=inputs["workspace_root"],
        run_id=inputs["run_id"],
        tokens_dir=inputs["tokens_dir"],
        base_model=inputs["base_model"],
        training={name: value for name, value in inputs.items() if name in training_fields},
        launch={name: value for name, value in inputs.items() if name in launch_fields},
        pvc_name=inputs["pvc_name"],
        pvc_size=inputs["pvc_size"],
        image=inputs["image"],
        pipeline_name=inputs["pipeline_name"],
        model_artifact=inputs["model"],
        metrics=inputs["metrics"],
        manifest_artifact=inputs["manifest"],
    )
