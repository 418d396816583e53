"""The pipeline's stages as KFP components: thin wrappers over plain Python.

Each body only imports the module that does the work and calls it, so all
logic is testable without KFP. The modules imported here must not define
components themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime
version, which has no ``dsl.component``.
"""

from typing import NamedTuple

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
