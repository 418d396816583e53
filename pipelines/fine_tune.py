"""The fine-tuning pipeline DAG.

``build_pipeline`` wires the stages once; the workspace decides whether large
files travel over a PVC (``fine_tune_pipeline``, what is compiled and uploaded)
or a local directory (what ``python -m pipelines.run`` executes with kfp.local).
The run-form parameters, their defaults and descriptions live in the signature
and docstring below and nowhere else.
"""

from kfp import dsl

from components.dataprep.prepare import PrepareOptions
from components.steps import prepare_dataset
from pipelines.tasks import validate_parameters
from pipelines.workspace import ClusterWorkspace, Workspace

PIPELINE_NAME = "llm-finetune"
PREPARE = PrepareOptions()


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
        pvc_name: str = "",
        pvc_size: str = "20Gi",
        pvc_storage_class: str = "",
        keep_pvc: bool = False,
    ):
        """Fine-tune a small LLM on question/answer data.

        Args:
            dataset_uri: Path (or glob) of the JSONL / JSONL.gz training data as seen inside the pods, e.g. on the workspace PVC. Empty uses the practical-skills sample bundled in the image.
            eval_fraction: Share of records held out for evaluation, in [0, 1). Rows are assigned by a hash of their content, so appending data never moves existing rows between splits.
            split_seed: Salt of the content hash that assigns rows to train or eval. Change it to draw a different split.
            max_reject_fraction: Fail the run when more than this share of records is invalid, in [0, 1). Rejected records are listed with file, line and reason in rejects.jsonl.
            system_prompt: System message prepended to conversations that have none. Empty adds none.
            pvc_name: Existing ReadWriteMany PVC to use as the workspace. Empty creates one for this run.
            pvc_size: Size of the PVC created for this run, e.g. 20Gi.
            pvc_storage_class: StorageClass of the PVC created for this run; it must support ReadWriteMany. Empty uses the cluster's default class.
            keep_pvc: Keep the PVC created for this run after it succeeds (a failed run always keeps it for inspection).
        """
        validated = validate_parameters(
            eval_fraction=eval_fraction,
            split_seed=split_seed,
            max_reject_fraction=max_reject_fraction,
            pvc_name=pvc_name,
            pvc_size=pvc_size,
            pvc_storage_class=pvc_storage_class,
        )
        workspace.attach(validated, pvc_name, pvc_size, pvc_storage_class)
        prepared = workspace.mount(
            prepare_dataset(
                dataset_uri=dataset_uri,
                workspace_root=workspace.root,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                eval_fraction=eval_fraction,
                split_seed=split_seed,
                max_reject_fraction=max_reject_fraction,
                system_prompt=system_prompt,
            ).after(validated)
        )
        workspace.release(prepared, pvc_name, keep_pvc)

    return fine_tune


fine_tune_pipeline = build_pipeline(ClusterWorkspace())
