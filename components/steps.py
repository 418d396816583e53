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
