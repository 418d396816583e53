"""The pipeline's own bookkeeping steps (parameter checks, workspace PVC) as KFP components.

Like ``components.steps``, each body calls plain Python that defines no components.
"""

from typing import List, NamedTuple

from kfp import dsl
from kfp.dsl.pipeline_channel import PipelineChannel

from components.runtime_image import runtime_image

# The bookkeeping steps (parameter checks, PVC name, data-change check, skip
# notes) are small Python processes: fixed requests and limits, no run parameters.
SMALL_STEP_CPU = "250m"
SMALL_STEP_MEMORY = "1Gi"


def sized(task: dsl.PipelineTask, cpu, memory) -> dsl.PipelineTask:
    """``cpu`` and ``memory`` (values or run parameters) as the task's requests and its limits: limits too,
    because a namespace with a ResourceQuota on limits refuses pods without them."""
    task.set_cpu_request(cpu).set_cpu_limit(cpu).set_memory_request(memory).set_memory_limit(memory)
    return consumes(task, cpu, memory)


def consumes(task: dsl.PipelineTask, *values) -> dsl.PipelineTask:
    """Register the run parameters and task outputs among ``values`` that a resource setting of ``task`` reads.

    kfp 2.17's ``set_cpu_limit`` and its kin, unlike ``set_container_image``, do
    not register the channel they are given, so a task inside a ``dsl.If``
    would read a parameter its condition's sub-DAG is never given (the backend
    cannot resolve it). ``register_pipeline_channels`` is the SDK's way to add
    them. tests/test_compile.py follows every resource value to its source.
    """
    task.register_pipeline_channels([value for value in values if isinstance(value, PipelineChannel)])
    return task


def small(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return sized(task, SMALL_STEP_CPU, SMALL_STEP_MEMORY)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def validate_parameters(
    dataset_uri: str,
    data_connection_secret: str,
    eval_fraction: float,
    split_seed: int,
    max_reject_fraction: float,
    system_prompt: str,
    field_map: str,
    force: bool,
    base_model: str,
    base_model_revision: str,
    method: str,
    sharding: str,
    attention: str,
    compile_blocks: bool,
    liger_kernels: bool,
    lora_r: int,
    lora_alpha: int,
    lora_dropout: float,
    lora_cast_inputs: bool,
    lora_target_modules: str,
    epochs: float,
    max_steps: int,
    learning_rate: float,
    scale_lr: bool,
    warmup_ratio: float,
    weight_decay: float,
    per_device_batch_size: int,
    gradient_accumulation_steps: int,
    max_length: int,
    packing: bool,
    loss_on: str,
    mixed_precision: bool,
    gradient_checkpointing: bool,
    checkpoint_every: int,
    save_steps: int,
    save_total_limit: int,
    logging_steps: int,
    eval_steps: int,
    seed: int,
    collective_timeout_minutes: float,
    training_backend: str,
    training_nodes: int,
    gpus_per_node: int,
    gpu_memory: str,
    training_cpu: str,
    training_memory: str,
    training_shm_size: str,
    node_selector: str,
    tolerations: str,
    training_timeout_minutes: float,
    training_start_timeout_minutes: float,
    start_timeout_includes_queue: bool,
    training_backoff_limit: int,
    queue_name: str,
    priority_class: str,
    trainjob_runtime: str,
    training_grace_period_seconds: int,
    extra_questions: List[str],
    eval_max_new_tokens: int,
    eval_score_rows: int,
    eval_batch_size: int,
    eval_max_rows: int,
    min_eval_loss_improvement: float,
    min_improvement_over_published: float,
    model_name: str,
    gguf_outtype: str,
    gguf_lora_adapter: bool,
    gguf_thresholds: dict,
    hub_repo_id: str,
    hub_private: bool,
    publish_merged: bool,
    publish_adapter: bool,
    model_license: str,
    pvc_name: str,
    pvc_size: str,
    pvc_storage_class: str,
    keep_pvc: bool,
    prepare_cpu: str,
    prepare_memory: str,
    tokenise_cpu: str,
    tokenise_memory: str,
    train_launcher_cpu: str,
    train_launcher_memory: str,
    evaluate_cpu: str,
    evaluate_memory: str,
    export_cpu: str,
    export_memory: str,
    publish_cpu: str,
    publish_memory: str,
) -> NamedTuple("Placement", [("evaluate_gpus", int), ("node_selector", dict), ("tolerations", list)]):
    """Fail fast, naming each invalid run parameter, before any stage starts (not after hours of training).

    Takes every run parameter, as ``components.parameters.RUN_PARAMETERS`` declares it
    (tests/test_run_parameters.py checks it): the pod runs this source as written.
    Returns where the evaluate step runs, derived from the training placement
    parameters in the forms kfp-kubernetes takes at run time (a count, JSON).
    """
    values = dict(locals())  # the parameters, by name: taken before anything else is bound here
    from collections import namedtuple

    from components.parameters import check_in_pipeline, evaluate_placement

    check_in_pipeline(values)
    placement = evaluate_placement(values)
    return namedtuple("Placement", ["evaluate_gpus", "node_selector", "tolerations"])(
        placement.evaluate_gpus, placement.node_selector, placement.tolerations
    )


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def resolve_storage_class(requested: str) -> str:
    """The StorageClass for the run's PVC: the one requested, or the cluster default."""
    from pipelines.storage_class import resolve_in_pipeline

    return resolve_in_pipeline(requested)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def use_existing_pvc(pvc_name: str) -> str:
    """Pass the user's PVC name on (KFP's OneOf needs a task output in each branch)."""
    print(f"using existing workspace PVC {pvc_name}")
    return pvc_name


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def workspace_pvc(pvc_name: str) -> str:
    """The workspace PVC of this run, whichever branch provided it.

    ``mount_pvc`` cannot take a ``dsl.OneOf`` directly, so this task turns it
    into one plain task output every stage can mount.
    """
    print(f"workspace PVC: {pvc_name}")
    return pvc_name
