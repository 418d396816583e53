"""The fine-tuning pipeline DAG.

prepare → has the data changed since the last published model? → train →
evaluate → (quality gate) → export GGUF → publish. Each arrow only runs when
the step before succeeded; the two questions are ``dsl.If`` branches, so a
scheduled run on unchanged data stops after preparing, and a fine-tune that
made the model worse is never exported or published.

``build_pipeline`` wires the stages once; the workspace decides whether large
files travel over a PVC and training runs as a Kubeflow job
(``fine_tune_pipeline``, what is compiled and uploaded) or over a local
directory with local training processes (what ``python -m pipelines.run``
executes with kfp.local). Every run parameter's default comes from the options
dataclass of its stage; descriptions are in the docstring below.
"""

from typing import List

from kfp import dsl, kubernetes

from components.dataprep.prepare import PrepareOptions
from components.evaluation.options import EvaluateOptions
from components.hub_auth import SECRET_KEY, SECRET_NAME, TOKEN_ENV
from components.publish.options import PublishOptions
from components.runtime_image import runtime_image
from components.steps import (
    check_data_changed,
    evaluate_model,
    export_gguf,
    prepare_dataset,
    publish_model,
    report_skipped,
    train_model,
)
from components.training.stage import LaunchOptions
from gguf_export.options import DEFAULT_OUTTYPE
from pipelines.tasks import validate_parameters
from pipelines.workspace import ClusterWorkspace, Workspace
from trainer.config import TrainConfig

PIPELINE_NAME = "llm-finetune"
PREPARE = PrepareOptions()
TRAIN = TrainConfig()
LAUNCH = LaunchOptions()
EVALUATE = EvaluateOptions()
PUBLISH = PublishOptions()
# The evaluation generates with both models: one GPU in the cluster (it runs on
# the CPU where none is granted, e.g. locally).
EVALUATE_GPUS = 1
GPU_RESOURCE = "nvidia.com/gpu"
# An OpenShift AI data connection named "training-data" creates this Secret; the
# prepare step reads S3 credentials and the endpoint from it when it exists.
DATA_CONNECTION_SECRET = "aws-connection-training-data"
DATA_CONNECTION_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
)


def with_hub_token(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """HF_TOKEN from the optional Secret: never a parameter, so it is in no run record, log or YAML."""
    return kubernetes.use_secret_as_env(
        task, secret_name=SECRET_NAME, secret_key_to_env={SECRET_KEY: TOKEN_ENV}, optional=True
    )


def with_data_connection(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return kubernetes.use_secret_as_env(
        task,
        secret_name=DATA_CONNECTION_SECRET,
        secret_key_to_env={key: key for key in DATA_CONNECTION_KEYS},
        optional=True,
    )


def on_gpu(task: dsl.PipelineTask, gpus: int) -> dsl.PipelineTask:
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus)
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    return task


def build_pipeline(workspace: Workspace):
    """The pipeline with its large files on ``workspace``."""

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Fine-tune a small LLM on JSONL questions and answers: prepare, train, evaluate, export, publish.",
    )
    def fine_tune(
        dataset_uri: str = "",
        eval_fraction: float = PREPARE.eval_fraction,
        split_seed: int = PREPARE.seed,
        max_reject_fraction: float = PREPARE.max_reject_fraction,
        system_prompt: str = PREPARE.system_prompt,
        force: bool = False,
        base_model: str = "",
        method: str = TRAIN.method,
        epochs: float = TRAIN.epochs,
        max_steps: int = TRAIN.max_steps,
        learning_rate: float = TRAIN.learning_rate,
        scale_lr: bool = TRAIN.scale_lr,
        warmup_ratio: float = TRAIN.warmup_ratio,
        weight_decay: float = TRAIN.weight_decay,
        lora_r: int = TRAIN.lora_r,
        lora_alpha: int = TRAIN.lora_alpha,
        lora_dropout: float = TRAIN.lora_dropout,
        lora_target_modules: str = TRAIN.lora_target_modules,
        per_device_batch_size: int = TRAIN.per_device_batch_size,
        gradient_accumulation_steps: int = TRAIN.gradient_accumulation_steps,
        max_length: int = TRAIN.max_length,
        packing: bool = TRAIN.packing,
        loss_on: str = TRAIN.loss_on,
        gradient_checkpointing: bool = TRAIN.gradient_checkpointing,
        save_steps: int = TRAIN.save_steps,
        save_total_limit: int = TRAIN.save_total_limit,
        logging_steps: int = TRAIN.logging_steps,
        eval_steps: int = TRAIN.eval_steps,
        seed: int = TRAIN.seed,
        training_backend: str = LAUNCH.backend,
        training_nodes: int = LAUNCH.nodes,
        gpus_per_node: int = LAUNCH.gpus_per_node,
        training_cpu: str = LAUNCH.cpu,
        training_memory: str = LAUNCH.memory,
        training_shm_size: str = LAUNCH.shm_size,
        node_selector: str = LAUNCH.node_selector,
        tolerations: str = LAUNCH.tolerations,
        training_timeout_minutes: float = LAUNCH.timeout_minutes,
        training_backoff_limit: int = LAUNCH.backoff_limit,
        trainjob_runtime: str = LAUNCH.trainjob_runtime,
        extra_questions: List[str] = list(EVALUATE.extra_questions),
        eval_max_new_tokens: int = EVALUATE.max_new_tokens,
        eval_score_rows: int = EVALUATE.score_rows,
        eval_batch_size: int = EVALUATE.batch_size,
        min_eval_loss_improvement: float = EVALUATE.min_eval_loss_improvement,
        model_name: str = "",
        gguf_outtype: str = DEFAULT_OUTTYPE,
        gguf_lora_adapter: bool = False,
        gguf_thresholds: dict = {},
        hub_repo_id: str = PUBLISH.repo_id,
        hub_private: bool = PUBLISH.private,
        publish_merged: bool = PUBLISH.include_merged,
        publish_adapter: bool = PUBLISH.include_adapter,
        model_license: str = PUBLISH.license,
        pvc_name: str = "",
        pvc_size: str = "20Gi",
        pvc_storage_class: str = "",
        keep_pvc: bool = False,
    ):
        """Fine-tune a small LLM on question/answer data.

        Args:
            dataset_uri: The JSONL / JSONL.gz training data: a path or glob as seen inside the pods (e.g. on the workspace PVC), an https:// URL, s3://bucket/key or s3://bucket/prefix/ (credentials from the data connection 'training-data'), or hf://datasets/owner/name[@revision][/path]. Empty uses the practical-skills sample bundled in the image.
            eval_fraction: Share of records held out for evaluation, above 0 and below 1: the evaluation stage compares the models on them. Rows are assigned by a hash of their content, so appending data never moves existing rows between splits.
            split_seed: Salt of the content hash that assigns rows to train or eval. Change it to draw a different split.
            max_reject_fraction: Fail the run when more than this share of records is invalid, in [0, 1). Rejected records are listed with file, line and reason in rejects.jsonl.
            system_prompt: System message prepended to conversations that have none. Empty adds none.
            force: Train, evaluate, export and publish even when the prepared data is the same as the last published model's (e.g. after changing training options).
            base_model: Model to fine-tune: a Hugging Face Hub id or a directory on the workspace PVC. Empty: HuggingFaceTB/SmolLM3-3B on a cluster, SmolLM2-135M-Instruct in a local run.
            method: lora (default), full fine-tuning, or qlora (4-bit; needs NVIDIA GPUs).
            epochs: Passes over the training split.
            max_steps: Stop after this many optimizer steps (-1: run all epochs).
            learning_rate: Peak learning rate (cosine schedule after warm-up).
            scale_lr: Multiply the learning rate by the number of training processes (linear scaling rule).
            warmup_ratio: Share of steps spent warming the learning rate up.
            weight_decay: AdamW weight decay (0 for none).
            lora_r: LoRA rank: the size of the low-rank update of each adapted weight.
            lora_alpha: LoRA scaling numerator (the update is scaled by alpha / r).
            lora_dropout: Dropout on the LoRA input, in [0, 1).
            lora_target_modules: Comma-separated module names to adapt, or all-linear.
            per_device_batch_size: Sequences per GPU per step (packed sequences of max_length tokens when packing).
            gradient_accumulation_steps: Micro-batches accumulated per optimizer step.
            max_length: Tokens per (packed) training sequence; longer conversations are truncated.
            packing: Pack conversations into max_length sequences without cross-sample attention.
            loss_on: assistant (loss on the assistant's tokens only) or all.
            gradient_checkpointing: Recompute activations in the backward pass to save GPU memory (about 20% slower).
            save_steps: Write a checkpoint every this many optimizer steps; a restarted training pod resumes from the newest.
            save_total_limit: Complete checkpoints kept on the workspace (at least 2).
            logging_steps: Log loss, tokens/s and ETA every this many steps.
            eval_steps: Evaluate on the held-out split every this many steps (0: once per epoch).
            seed: Seed for shuffling, dropout and LoRA initialisation.
            training_backend: pytorchjob (Kubeflow Training Operator v1) or trainjob (Kubeflow Trainer v2, OpenShift AI 3.x).
            training_nodes: Training pods (1 master + workers); the job has training_nodes x gpus_per_node processes.
            gpus_per_node: GPUs per training pod, one training process each; 0 trains on CPU.
            training_cpu: CPU request of each training pod, e.g. 8.
            training_memory: Memory of each training pod, e.g. 48Gi.
            training_shm_size: Memory-backed /dev/shm of each training pod (NCCL and data loaders need it), e.g. 8Gi.
            node_selector: Node labels the training pods must run on: key=value,key2=value2 or a JSON object. Empty: any node.
            tolerations: Taints the training pods tolerate: key[=value][:Effect],... or a JSON list. The default tolerates NVIDIA GPU nodes' taint.
            training_timeout_minutes: Delete the training job and fail the run after this many minutes.
            training_backoff_limit: Restarts of failed training pods (each resumes from the newest checkpoint) before the job fails.
            trainjob_runtime: The ClusterTrainingRuntime a trainjob uses.
            extra_questions: Questions asked of the base and the fine-tuned model, after the five built-in ones, as a JSON list of strings.
            eval_max_new_tokens: Most tokens generated per answer in the evaluation.
            eval_score_rows: Held-out rows answered by both models and scored with ROUGE-L against the reference answer.
            eval_batch_size: Conversations per forward pass and prompts per generation batch in the evaluation.
            min_eval_loss_improvement: Quality gate: the base model's held-out loss minus the fine-tuned one's must be at least this; otherwise nothing is exported or published (0: the fine-tune must not make it worse).
            model_name: Name of the GGUF files and of the Ollama model. Empty: the base model's name followed by -ft.
            gguf_outtype: GGUF type(s) to export, comma-separated: f32, f16, bf16, q8_0 (default), q4_0, q4_1, q5_0, q5_1, q4_k_m, q5_k_m, q6_k. The first is what the Modelfile uses.
            gguf_lora_adapter: Also export the LoRA adapter as a GGUF adapter, to apply on top of the base model's GGUF in llama.cpp.
            gguf_thresholds: Verification pass thresholds overriding the defaults, as a JSON object with any of float_min_top1 (0.99), float_max_nmse (0.001), quant_min_top1 (0.9), quant_max_nmse (0.01), min_positions (200), lora_max_nmse (0.01). A failed verification fails the run before publishing.
            hub_repo_id: Hugging Face Hub model repository to publish to, owner/name. Empty: dry run, the folder that would be uploaded is written to the workspace. The token comes from the Secret 'hf-token', never from a parameter.
            hub_private: Create the Hub repository private when it does not exist yet.
            publish_merged: Also upload the merged safetensors checkpoint.
            publish_adapter: Also upload the LoRA adapter (PEFT), when training produced one.
            model_license: License identifier for the model card metadata; keep the base model's.
            pvc_name: Existing ReadWriteMany PVC to use as the workspace. Empty creates one for this run.
            pvc_size: Size of the PVC created for this run, e.g. 20Gi.
            pvc_storage_class: StorageClass of the PVC created for this run; it must support ReadWriteMany. Empty uses the cluster's default class.
            keep_pvc: Keep the PVC created for this run after it succeeds (a failed run always keeps it for inspection).
        """
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        validated = validate_parameters(
            eval_fraction=eval_fraction,
            split_seed=split_seed,
            max_reject_fraction=max_reject_fraction,
            method=method,
            epochs=epochs,
            max_steps=max_steps,
            learning_rate=learning_rate,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            per_device_batch_size=per_device_batch_size,
            gradient_accumulation_steps=gradient_accumulation_steps,
            max_length=max_length,
            loss_on=loss_on,
            save_steps=save_steps,
            save_total_limit=save_total_limit,
            logging_steps=logging_steps,
            eval_steps=eval_steps,
            training_backend=training_backend,
            training_nodes=training_nodes,
            gpus_per_node=gpus_per_node,
            training_cpu=training_cpu,
            training_memory=training_memory,
            training_shm_size=training_shm_size,
            node_selector=node_selector,
            tolerations=tolerations,
            training_timeout_minutes=training_timeout_minutes,
            training_backoff_limit=training_backoff_limit,
            extra_questions=extra_questions,
            eval_max_new_tokens=eval_max_new_tokens,
            eval_score_rows=eval_score_rows,
            eval_batch_size=eval_batch_size,
            min_eval_loss_improvement=min_eval_loss_improvement,
            model_name=model_name,
            gguf_outtype=gguf_outtype,
            gguf_thresholds=gguf_thresholds,
            hub_repo_id=hub_repo_id,
            pvc_name=pvc_name,
            pvc_size=pvc_size,
            pvc_storage_class=pvc_storage_class,
        )
        workspace.attach(validated, pvc_name, pvc_size, pvc_storage_class)
        prepared = workspace.mount(
            prepare_dataset(
                dataset_uri=dataset_uri,
                workspace_root=workspace.root,
                run_id=run_id,
                eval_fraction=eval_fraction,
                split_seed=split_seed,
                max_reject_fraction=max_reject_fraction,
                system_prompt=system_prompt,
            ).after(validated)
        )
        with_hub_token(with_data_connection(prepared))
        changed = workspace.mount(
            check_data_changed(
                fingerprint=prepared.outputs["fingerprint"],
                repo_id=hub_repo_id,
                workspace_root=workspace.root,
                force=force,
            )
        )
        with_hub_token(changed)

        with dsl.If(changed.outputs["changed"] == True, name="data-changed"):  # noqa: E712 (a KFP condition, not Python)
            trained = workspace.mount(
                train_model(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    data_dir=prepared.outputs["data_dir"],
                    pvc_name=workspace.pvc(),
                    image=runtime_image(),
                    base_model=base_model,
                    pipeline_name=PIPELINE_NAME,
                    backend=workspace.training_backend(training_backend),
                    nodes=training_nodes,
                    gpus_per_node=gpus_per_node,
                    cpu=training_cpu,
                    memory=training_memory,
                    shm_size=training_shm_size,
                    node_selector=node_selector,
                    tolerations=tolerations,
                    hf_token_secret=SECRET_NAME,
                    timeout_minutes=training_timeout_minutes,
                    backoff_limit=training_backoff_limit,
                    trainjob_runtime=trainjob_runtime,
                    method=method,
                    lora_r=lora_r,
                    lora_alpha=lora_alpha,
                    lora_dropout=lora_dropout,
                    lora_target_modules=lora_target_modules,
                    epochs=epochs,
                    max_steps=max_steps,
                    learning_rate=learning_rate,
                    scale_lr=scale_lr,
                    warmup_ratio=warmup_ratio,
                    weight_decay=weight_decay,
                    per_device_batch_size=per_device_batch_size,
                    gradient_accumulation_steps=gradient_accumulation_steps,
                    max_length=max_length,
                    packing=packing,
                    loss_on=loss_on,
                    gradient_checkpointing=gradient_checkpointing,
                    save_steps=save_steps,
                    save_total_limit=save_total_limit,
                    logging_steps=logging_steps,
                    eval_steps=eval_steps,
                    seed=seed,
                )
            )
            evaluated = workspace.mount(
                evaluate_model(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    base_model=trained.outputs["base_model"],
                    train_dir=trained.outputs["train_dir"],
                    data_dir=prepared.outputs["data_dir"],
                    extra_questions=extra_questions,
                    max_new_tokens=eval_max_new_tokens,
                    score_rows=eval_score_rows,
                    batch_size=eval_batch_size,
                    min_eval_loss_improvement=min_eval_loss_improvement,
                )
            )
            with_hub_token(on_gpu(evaluated, EVALUATE_GPUS))

            with dsl.If(evaluated.outputs["gate_passed"] == True, name="quality-gate-passed"):  # noqa: E712
                exported = workspace.mount(
                    export_gguf(
                        workspace_root=workspace.root,
                        run_id=run_id,
                        train_dir=trained.outputs["train_dir"],
                        model_name=model_name,
                        outtype=gguf_outtype,
                        include_lora=gguf_lora_adapter,
                        thresholds=gguf_thresholds,
                    )
                )
                published = workspace.mount(
                    publish_model(
                        workspace_root=workspace.root,
                        run_id=run_id,
                        dataset_uri=dataset_uri,
                        repo_id=hub_repo_id,
                        private=hub_private,
                        include_merged=publish_merged,
                        include_adapter=publish_adapter,
                        license=model_license,
                        base_model=base_model,
                    ).after(exported)
                )
                with_hub_token(published)
                workspace.release(published, pvc_name, keep_pvc)
            with dsl.Else(name="quality-gate-failed"):
                gate_failed = report_skipped(skipped="export and publish", reason=evaluated.outputs["gate_reason"])
                workspace.release(gate_failed, pvc_name, keep_pvc)
        with dsl.Else(name="data-unchanged"):
            unchanged = report_skipped(
                skipped="training, evaluation, export and publish", reason=changed.outputs["reason"]
            )
            workspace.release(unchanged, pvc_name, keep_pvc)

    return fine_tune


fine_tune_pipeline = build_pipeline(ClusterWorkspace())
