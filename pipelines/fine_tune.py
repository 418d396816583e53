"""The fine-tuning pipeline DAG.

prepare → has the data changed since the last published model? → tokenise → train →
evaluate against the base and the published model → (quality gate) → export
GGUF → publish. Each arrow only runs when
the step before succeeded; the two questions are ``dsl.If`` branches, so a
scheduled run on unchanged data stops after preparing, and a fine-tune that
made the model worse is never exported or published.

``build_pipeline`` wires the stages once; the workspace decides whether large
files travel over a PVC and training runs as a Kubeflow job
(``fine_tune_pipeline``, what is compiled and uploaded) or over a local
directory with local training processes (what ``python -m pipelines.run``
executes with kfp.local). The signature below is the run form: each default is
the stage option's own (``components.parameters.RUN_PARAMETERS`` says which),
and the descriptions KFP shows are generated from the same declarations.
"""

from typing import List

from kfp import dsl, kubernetes

from components.dataprep.options import PrepareOptions
from components.evaluation.options import EvaluateOptions
from components.export.options import ExportStageOptions
from components.hub_auth import SECRET_KEY, SECRET_NAME, TOKEN_ENV
from components.parameters import PIPELINE_NAME, RUN_PARAMETERS, arguments_for, docstring
from components.publish.options import PublishOptions
from components.run_options import RunInputs, StepResources, WorkspaceOptions
from components.runtime_image import runtime_image
from components.steps import (
    check_data_changed,
    evaluate_model,
    export_gguf,
    prepare_dataset,
    publish_model,
    report_skipped,
    tokenise_data,
    train_model,
)
from components.tokenise.options import TokeniseOptions
from components.training.options import LaunchOptions
from pipelines.tasks import consumes, sized, small, validate_parameters
from pipelines.workspace import ClusterWorkspace, Workspace
from trainer.config import TrainConfig

DESCRIPTION = "Fine-tune a small LLM on JSONL questions and answers: prepare, train, evaluate, export, publish."
INPUTS = RunInputs()
PREPARE = PrepareOptions()
TRAIN = TrainConfig()
LAUNCH = LaunchOptions()
EVALUATE = EvaluateOptions()
TOKENISE = TokeniseOptions()
EXPORT = ExportStageOptions()
PUBLISH = PublishOptions()
WORKSPACE = WorkspaceOptions()
RESOURCES = StepResources()
GPU_RESOURCE = "nvidia.com/gpu"
# What an OpenShift AI data connection's Secret holds; the prepare step reads S3
# credentials and the endpoint from them when the Secret exists.
DATA_CONNECTION_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
)
# A train step whose launcher pod is lost (evicted, its node gone) runs again and
# follows the training job the first attempt created (the job's name comes from the run id).
TRAIN_STEP_RETRIES = 2


def with_hub_token(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """HF_TOKEN from the optional Secret: never a parameter, so it is in no run record, log or YAML."""
    return kubernetes.use_secret_as_env(
        task, secret_name=SECRET_NAME, secret_key_to_env={SECRET_KEY: TOKEN_ENV}, optional=True
    )


def with_data_connection(task: dsl.PipelineTask, secret_name) -> dsl.PipelineTask:
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={key: key for key in DATA_CONNECTION_KEYS}, optional=True
    )


def placed_like_training(task: dsl.PipelineTask, placement: dsl.PipelineTask) -> dsl.PipelineTask:
    """The GPU count, node selector and tolerations the parameter check derived from the training parameters:
    one GPU when the training pods have GPUs, none (the CPU) when gpus_per_node is 0."""
    gpus = placement.outputs["evaluate_gpus"]
    consumes(task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus), gpus)
    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    return task


def build_pipeline(workspace: Workspace):
    """The pipeline with its large files on ``workspace``."""

    def fine_tune(
        dataset_uri: str = INPUTS.dataset_uri,
        data_connection_secret: str = INPUTS.data_connection_secret,
        eval_fraction: float = PREPARE.eval_fraction,
        split_seed: int = PREPARE.seed,
        max_reject_fraction: float = PREPARE.max_reject_fraction,
        system_prompt: str = PREPARE.system_prompt,
        field_map: str = PREPARE.field_map,
        force: bool = INPUTS.force,
        base_model: str = INPUTS.base_model,
        base_model_revision: str = TRAIN.base_model_revision,
        method: str = TRAIN.method,
        sharding: str = TRAIN.sharding,
        attention: str = TRAIN.attention,
        compile_blocks: bool = TRAIN.compile_blocks,
        liger_kernels: bool = TRAIN.liger_kernels,
        lora_r: int = TRAIN.lora_r,
        lora_alpha: int = TRAIN.lora_alpha,
        lora_dropout: float = TRAIN.lora_dropout,
        lora_cast_inputs: bool = TRAIN.lora_cast_inputs,
        lora_target_modules: str = TRAIN.lora_target_modules,
        epochs: float = TRAIN.epochs,
        max_steps: int = TRAIN.max_steps,
        learning_rate: float = TRAIN.learning_rate,
        scale_lr: bool = TRAIN.scale_lr,
        warmup_ratio: float = TRAIN.warmup_ratio,
        weight_decay: float = TRAIN.weight_decay,
        per_device_batch_size: int = TRAIN.per_device_batch_size,
        gradient_accumulation_steps: int = TRAIN.gradient_accumulation_steps,
        max_length: int = TRAIN.max_length,
        packing: bool = TRAIN.packing,
        loss_on: str = TRAIN.loss_on,
        mixed_precision: bool = TRAIN.mixed_precision,
        gradient_checkpointing: bool = TRAIN.gradient_checkpointing,
        checkpoint_every: int = TRAIN.checkpoint_every,
        save_steps: int = TRAIN.save_steps,
        save_total_limit: int = TRAIN.save_total_limit,
        logging_steps: int = TRAIN.logging_steps,
        eval_steps: int = TRAIN.eval_steps,
        seed: int = TRAIN.seed,
        collective_timeout_minutes: float = TRAIN.collective_timeout_minutes,
        training_backend: str = LAUNCH.backend,
        training_nodes: int = LAUNCH.nodes,
        gpus_per_node: int = LAUNCH.gpus_per_node,
        gpu_memory: str = LAUNCH.gpu_memory,
        training_cpu: str = LAUNCH.cpu,
        training_memory: str = LAUNCH.memory,
        training_shm_size: str = LAUNCH.shm_size,
        node_selector: str = LAUNCH.node_selector,
        tolerations: str = LAUNCH.tolerations,
        training_timeout_minutes: float = LAUNCH.timeout_minutes,
        training_start_timeout_minutes: float = LAUNCH.start_timeout_minutes,
        start_timeout_includes_queue: bool = LAUNCH.count_queue_time,
        training_backoff_limit: int = LAUNCH.backoff_limit,
        queue_name: str = LAUNCH.queue_name,
        priority_class: str = LAUNCH.priority_class,
        trainjob_runtime: str = LAUNCH.trainjob_runtime,
        training_grace_period_seconds: int = LAUNCH.termination_grace_seconds,
        extra_questions: List[str] = list(EVALUATE.extra_questions),
        eval_max_new_tokens: int = EVALUATE.max_new_tokens,
        eval_score_rows: int = EVALUATE.score_rows,
        eval_batch_size: int = EVALUATE.batch_size,
        eval_max_rows: int = TOKENISE.eval_max_rows,
        min_eval_loss_improvement: float = EVALUATE.min_eval_loss_improvement,
        min_improvement_over_published: float = EVALUATE.min_improvement_over_published,
        model_name: str = EXPORT.model_name,
        gguf_outtype: str = EXPORT.outtype,
        gguf_lora_adapter: bool = EXPORT.include_lora,
        gguf_thresholds: dict = EXPORT.thresholds,
        hub_repo_id: str = PUBLISH.repo_id,
        hub_private: bool = PUBLISH.private,
        publish_merged: bool = PUBLISH.include_merged,
        publish_adapter: bool = PUBLISH.include_adapter,
        model_license: str = PUBLISH.license,
        pvc_name: str = WORKSPACE.pvc_name,
        pvc_size: str = WORKSPACE.pvc_size,
        pvc_storage_class: str = WORKSPACE.pvc_storage_class,
        keep_pvc: bool = WORKSPACE.keep_pvc,
        prepare_cpu: str = RESOURCES.prepare_cpu,
        prepare_memory: str = RESOURCES.prepare_memory,
        tokenise_cpu: str = RESOURCES.tokenise_cpu,
        tokenise_memory: str = RESOURCES.tokenise_memory,
        train_launcher_cpu: str = RESOURCES.train_launcher_cpu,
        train_launcher_memory: str = RESOURCES.train_launcher_memory,
        evaluate_cpu: str = RESOURCES.evaluate_cpu,
        evaluate_memory: str = RESOURCES.evaluate_memory,
        export_cpu: str = RESOURCES.export_cpu,
        export_memory: str = RESOURCES.export_memory,
        publish_cpu: str = RESOURCES.publish_cpu,
        publish_memory: str = RESOURCES.publish_memory,
    ):
        run = dict(locals())  # every run parameter by name, taken before anything else is bound here
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        validated = small(validate_parameters(**{parameter.name: run[parameter.name] for parameter in RUN_PARAMETERS}))
        workspace.attach(validated, pvc_name, pvc_size, pvc_storage_class)
        prepared = workspace.mount(
            prepare_dataset(
                dataset_uri=dataset_uri,
                workspace_root=workspace.root,
                run_id=run_id,
                **arguments_for(PrepareOptions, run),
            ).after(validated)
        )
        with_hub_token(with_data_connection(sized(prepared, prepare_cpu, prepare_memory), data_connection_secret))
        changed = workspace.mount(
            check_data_changed(
                fingerprint=prepared.outputs["fingerprint"],
                repo_id=hub_repo_id,
                workspace_root=workspace.root,
                force=force,
            )
        )
        with_hub_token(small(changed))

        with dsl.If(changed.outputs["changed"] == True, name="data-changed"):  # noqa: E712 (a KFP condition)
            backend = workspace.training_backend(training_backend)
            tokenised = workspace.mount(
                tokenise_data(
                    workspace_root=workspace.root,
                    data_dir=prepared.outputs["data_dir"],
                    base_model=base_model,
                    backend=backend,
                    base_model_revision=base_model_revision,
                    max_length=max_length,
                    loss_on=loss_on,
                    packing=packing,
                    eval_max_rows=eval_max_rows,
                )
            )
            with_hub_token(sized(tokenised, tokenise_cpu, tokenise_memory))
            trained = workspace.mount(
                train_model(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    tokens_dir=tokenised.outputs["tokens_dir"],
                    pvc_name=workspace.pvc(),
                    pvc_size=pvc_size,
                    image=runtime_image(),
                    base_model=base_model,
                    pipeline_name=PIPELINE_NAME,
                    hf_token_secret=SECRET_NAME,
                    **arguments_for(TrainConfig, run),
                    **{**arguments_for(LaunchOptions, run), "backend": backend},
                )
            )
            sized(trained, train_launcher_cpu, train_launcher_memory).set_retry(
                num_retries=TRAIN_STEP_RETRIES, backoff_duration="30s"
            )
            evaluated = workspace.mount(
                evaluate_model(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    base_model=trained.outputs["base_model"],
                    train_dir=trained.outputs["train_dir"],
                    data_dir=prepared.outputs["data_dir"],
                    tokens_dir=tokenised.outputs["tokens_dir"],
                    repo_id=hub_repo_id,
                    force=force,
                    gpus=validated.outputs["evaluate_gpus"] if workspace.gpus else 0,
                    **arguments_for(EvaluateOptions, run),
                )
            )
            with_hub_token(sized(evaluated, evaluate_cpu, evaluate_memory))
            if workspace.gpus:  # kfp.local ignores placement, and has no GPU count to pass
                placed_like_training(evaluated, validated)

            with dsl.If(evaluated.outputs["gate_passed"] == True, name="quality-gate-passed"):  # noqa: E712
                exported = workspace.mount(
                    export_gguf(
                        workspace_root=workspace.root,
                        run_id=run_id,
                        train_dir=trained.outputs["train_dir"],
                        **arguments_for(ExportStageOptions, run),
                    )
                )
                sized(exported, export_cpu, export_memory)
                published = workspace.mount(
                    publish_model(
                        workspace_root=workspace.root,
                        run_id=run_id,
                        dataset_uri=dataset_uri,
                        base_model=base_model,
                        **arguments_for(PublishOptions, run),
                    ).after(exported)
                )
                with_hub_token(sized(published, publish_cpu, publish_memory))
                workspace.release(published, pvc_name, keep_pvc)
            with dsl.Else(name="quality-gate-failed"):
                gate_failed = small(
                    report_skipped(skipped="export and publish", reason=evaluated.outputs["gate_reason"])
                )
                workspace.release(gate_failed, pvc_name, keep_pvc)
        with dsl.Else(name="data-unchanged"):
            unchanged = small(
                report_skipped(skipped="training, evaluation, export and publish", reason=changed.outputs["reason"])
            )
            workspace.release(unchanged, pvc_name, keep_pvc)

    fine_tune.__doc__ = docstring("Fine-tune a small LLM on question/answer data.")
    return dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)(fine_tune)


fine_tune_pipeline = build_pipeline(ClusterWorkspace())
