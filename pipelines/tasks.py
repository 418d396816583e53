"""The pipeline's own bookkeeping steps (parameter checks, workspace PVC) as KFP components.

Like ``components.steps``, each body calls plain Python that defines no components.
"""

from kfp import dsl

from components.runtime_image import runtime_image


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def validate_parameters(
    eval_fraction: float,
    split_seed: int,
    max_reject_fraction: float,
    pvc_name: str,
    pvc_size: str,
    pvc_storage_class: str,
):
    """Fail fast, naming each invalid run parameter."""
    from pipelines.parameters import check_in_pipeline

    check_in_pipeline(
        dict(
            eval_fraction=eval_fraction,
            split_seed=split_seed,
            max_reject_fraction=max_reject_fraction,
            pvc_name=pvc_name,
            pvc_size=pvc_size,
            pvc_storage_class=pvc_storage_class,
        )
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
