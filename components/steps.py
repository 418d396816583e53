"""The pipeline's stages as KFP components: thin wrappers over plain Python.

Each body only imports the module that does the work and calls it, so all
logic is testable without KFP. The modules imported here must not define
components themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime
version, which has no ``dsl.component``.
"""

from typing import NamedTuple

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
