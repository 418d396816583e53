"""The pipeline's stages as KFP components: thin wrappers over plain Python.

Each body only imports the module that does the work and calls it, so all
logic is testable without KFP. The modules imported here must not define
components themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime
version, which has no ``dsl.component``.
"""

from typing import List, NamedTuple

from kfp import dsl

from components.runtime_image import runtime_image
from gguf_export.options import DEFAULT_OUTTYPE


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def prepare_dataset(
    dataset_uri: str,
    workspace_root: str,
    run_id: str,
    eval_fraction: float,
    split_seed: int,
    max_reject_fraction: float,
    system_prompt: str,
    train_data: dsl.Output[dsl.Dataset],
    eval_data: dsl.Output[dsl.Dataset],
    rejects: dsl.Output[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
) -> NamedTuple("PrepareOutputs", [("fingerprint", str), ("data_dir", str)]):
    """Validate and normalise the JSONL dataset into train/eval Parquet on the workspace."""
    from collections import namedtuple

    from components.dataprep.prepare import PrepareOptions
    from components.prepare_dataset import run_in_pipeline
    from components.workspace import stage_dir

    options = PrepareOptions(eval_fraction, split_seed, max_reject_fraction, system_prompt)
    data_dir = str(stage_dir(workspace_root, run_id, "data"))
    fingerprint, written_to = run_in_pipeline(dataset_uri, data_dir, options, train_data, eval_data, rejects, metrics)
    return namedtuple("PrepareOutputs", ["fingerprint", "data_dir"])(fingerprint, written_to)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def check_data_changed(fingerprint: str, repo_id: str, workspace_root: str, force: bool) -> bool:
    """Whether to train: the prepared data's fingerprint differs from the last published model's
    (Hub model card, else the record on the workspace), nothing was published yet, or ``force``.

    The reason is in the step's log. A single output on purpose: kfp.local resolves a
    ``dsl.If`` condition only on a task's ``.output``, not on a NamedTuple field.
    HF_TOKEN, when the task gets it from the hf-token Secret, lets it read the Hub model card.
    """
    from components.data_changed import run_in_pipeline

    changed, _reason = run_in_pipeline(fingerprint, repo_id, workspace_root, force)
    return changed


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def publish_model(
    workspace_root: str,
    run_id: str,
    dataset_uri: str,
    repo_id: str,
    private: bool,
    include_merged: bool,
    include_adapter: bool,
    license: str,
    base_model: str,
    model_card: dsl.Output[dsl.Markdown],
    metrics: dsl.Output[dsl.Metrics],
) -> NamedTuple("PublishOutputs", [("location", str), ("dry_run", bool)]):
    """Commit the GGUF, Modelfile, reports and model card to the Hub as one commit, or write the folder (dry run).

    The token is read from HF_TOKEN, set from the hf-token Secret; it is never a parameter.
    """
    from collections import namedtuple

    from components.publish.options import PublishOptions
    from components.publish_model import run_in_pipeline

    options = PublishOptions(
        repo_id=repo_id,
        private=private,
        include_merged=include_merged,
        include_adapter=include_adapter,
        license=license,
        base_model=base_model,
    )
    location, dry_run = run_in_pipeline(workspace_root, run_id, dataset_uri, options, model_card, metrics)
    return namedtuple("PublishOutputs", ["location", "dry_run"])(location, dry_run)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def train_model(
    workspace_root: str,
    run_id: str,
    data_dir: str,
    pvc_name: str,
    image: str,
    model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    manifest: dsl.Output[dsl.Artifact],
    base_model: str = "",
    pipeline_name: str = "llm-finetune",
    backend: str = "pytorchjob",
    nodes: int = 2,
    gpus_per_node: int = 1,
    cpu: str = "8",
    memory: str = "48Gi",
    shm_size: str = "8Gi",
    node_selector: str = "",
    tolerations: str = "nvidia.com/gpu:NoSchedule",
    hf_token_secret: str = "hf-token",
    timeout_minutes: float = 1440.0,
    backoff_limit: int = 3,
    trainjob_runtime: str = "torch-distributed",
    method: str = "lora",
    lora_r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.05,
    lora_target_modules: str = "all-linear",
    epochs: float = 3.0,
    max_steps: int = -1,
    learning_rate: float = 0.0002,
    scale_lr: bool = False,
    warmup_ratio: float = 0.03,
    weight_decay: float = 0.0,
    per_device_batch_size: int = 4,
    gradient_accumulation_steps: int = 1,
    max_length: int = 1024,
    packing: bool = True,
    loss_on: str = "assistant",
    gradient_checkpointing: bool = False,
    save_steps: int = 50,
    save_total_limit: int = 2,
    logging_steps: int = 5,
    eval_steps: int = 0,
    seed: int = 42,
) -> str:
    """Fine-tune the base model: a PyTorchJob or TrainJob on the cluster, or local torchrun processes.

    Launch options (backend ... trainjob_runtime) are ``LaunchOptions`` fields and
    training options (method ... seed) ``TrainConfig`` fields. Their defaults are
    copies of those dataclasses' defaults, written out because KFP runs this
    function's source in the pod, where it cannot refer to them; a test keeps the
    copies equal. ``image`` is the training pods' image: pass ``runtime_image()``,
    what this pipeline is compiled for. ``pvc_name`` may be empty for the local
    backend. Returns the run's train directory.
    """
    from components.train_model import run_in_pipeline

    launch = dict(
        backend=backend, nodes=nodes, gpus_per_node=gpus_per_node, cpu=cpu, memory=memory, shm_size=shm_size,
        node_selector=node_selector, tolerations=tolerations, hf_token_secret=hf_token_secret,
        timeout_minutes=timeout_minutes, backoff_limit=backoff_limit, trainjob_runtime=trainjob_runtime,
    )  # fmt: skip
    training = dict(
        method=method, lora_r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, lora_target_modules=lora_target_modules,
        epochs=epochs, max_steps=max_steps, learning_rate=learning_rate, scale_lr=scale_lr, warmup_ratio=warmup_ratio,
        weight_decay=weight_decay, per_device_batch_size=per_device_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps, max_length=max_length, packing=packing, loss_on=loss_on,
        gradient_checkpointing=gradient_checkpointing, save_steps=save_steps, save_total_limit=save_total_limit,
        logging_steps=logging_steps, eval_steps=eval_steps, seed=seed,
    )  # fmt: skip
    return run_in_pipeline(
        workspace_root=workspace_root, run_id=run_id, data_dir=data_dir, base_model=base_model, training=training,
        launch=launch, pvc_name=pvc_name, image=image, pipeline_name=pipeline_name,
        model_artifact=model, metrics=metrics, manifest_artifact=manifest,
    )  # fmt: skip


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def evaluate_model(
    base_model: str,
    train_dir: str,
    data_dir: str,
    eval_dir: str,
    extra_questions: List[str],
    max_new_tokens: int,
    score_rows: int,
    min_eval_loss_improvement: float,
    batch_size: int,
    metrics: dsl.Output[dsl.Metrics],
    report_html: dsl.Output[dsl.HTML],
    report_markdown: dsl.Output[dsl.Markdown],
) -> NamedTuple("EvaluateOutputs", [("gate_passed", bool), ("gate_reason", str)]):
    """Compare the fine-tuned model with its base on held-out data; report it and decide the quality gate."""
    # No parameter defaults: the pod runs this source as written, so they could only be literals
    # copied from EvaluateOptions. The pipeline passes every value, defaulting to EvaluateOptions'.
    from collections import namedtuple

    from components.evaluate_model import run_in_pipeline

    gate_passed, gate_reason = run_in_pipeline(
        base_model, train_dir, data_dir, eval_dir, extra_questions, max_new_tokens, score_rows,
        min_eval_loss_improvement, batch_size, metrics, report_html, report_markdown,
    )  # fmt: skip
    return namedtuple("EvaluateOutputs", ["gate_passed", "gate_reason"])(gate_passed, gate_reason)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def export_gguf(
    train_dir: str,
    export_dir: str,
    model_name: str,
    gguf_model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    report: dsl.Output[dsl.Markdown],
    outtype: str = DEFAULT_OUTTYPE,
    include_lora: bool = False,
    thresholds: dict = {},
) -> str:
    """Convert merged/ to GGUF (comma-separated outtypes; q8_0 by default), verify it in llama.cpp, write a Modelfile.

    q8_0 is the default because it is what an Ollama user wants from a small
    fine-tune: near-lossless, half of f16's size, bit-identical to llama.cpp's
    own converter; q4_k_m is one parameter away. ``thresholds`` overrides keys
    of gguf_export.options.Thresholds. Returns the GGUF's path on the workspace.
    """
    from components.export_gguf import run_in_pipeline

    return run_in_pipeline(train_dir, export_dir, outtype, model_name, include_lora, thresholds, gguf_model, metrics, report)
