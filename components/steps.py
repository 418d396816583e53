"""The pipeline's stages as KFP components: thin wrappers over plain Python.

Each body only imports the module that does the work and calls it, so all
logic is testable without KFP. The modules imported here must not define
components themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime
version, which has no ``dsl.component``.
"""

from typing import NamedTuple, Optional

from kfp import dsl

from components.runtime_image import runtime_image


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
    backend: Optional[str] = None,
    nodes: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    cpu: Optional[str] = None,
    memory: Optional[str] = None,
    shm_size: Optional[str] = None,
    node_selector: Optional[str] = None,
    tolerations: Optional[str] = None,
    hf_token_secret: Optional[str] = None,
    timeout_minutes: Optional[float] = None,
    backoff_limit: Optional[int] = None,
    trainjob_runtime: Optional[str] = None,
    method: Optional[str] = None,
    lora_r: Optional[int] = None,
    lora_alpha: Optional[int] = None,
    lora_dropout: Optional[float] = None,
    lora_target_modules: Optional[str] = None,
    epochs: Optional[float] = None,
    max_steps: Optional[int] = None,
    learning_rate: Optional[float] = None,
    scale_lr: Optional[bool] = None,
    warmup_ratio: Optional[float] = None,
    weight_decay: Optional[float] = None,
    per_device_batch_size: Optional[int] = None,
    gradient_accumulation_steps: Optional[int] = None,
    max_length: Optional[int] = None,
    packing: Optional[bool] = None,
    loss_on: Optional[str] = None,
    gradient_checkpointing: Optional[bool] = None,
    save_steps: Optional[int] = None,
    save_total_limit: Optional[int] = None,
    logging_steps: Optional[int] = None,
    eval_steps: Optional[int] = None,
    seed: Optional[int] = None,
) -> str:
    """Fine-tune the base model: a PyTorchJob or TrainJob on the cluster, or local torchrun processes.

    Launch options (backend ... trainjob_runtime) are ``LaunchOptions`` fields and
    training options (method ... seed) ``TrainConfig`` fields; None keeps the
    dataclass's default, which stays their single source (the defaults here must
    be literals: KFP runs this function's source in the pod). ``image`` is the
    training pods' image: pass ``runtime_image()``, what this pipeline is
    compiled for. ``pvc_name`` may be empty for the local backend. Returns the
    run's train directory.
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
