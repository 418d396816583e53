"""The pipeline's own bookkeeping steps (workspace PVC, sizes) as KFP components; the parameter check is
``first_step``, generated.

Like ``components.pipeline_steps``, each body calls plain Python that defines no components.
"""

from kfp import dsl
from kfp.dsl.pipeline_channel import PipelineChannel

from components.runtime_image import runtime_image
from pipelines import caller_names

caller_names.install()  # before any task setter runs: see pipelines/caller_names.py

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
