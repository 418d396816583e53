"""The pipeline's stages as KFP components: thin wrappers over plain Python.

Each body only imports the module that does the work and calls it, so all
logic is testable without KFP. The modules imported here must not define
components themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime
version, which has no ``dsl.component``.
"""

from typing import List, NamedTuple

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
