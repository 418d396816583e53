"""The run parameters that belong to no single stage: the run's inputs and its workspace.

Like the stages' options dataclasses, each field declares one run parameter's
default, type, help text and (in ``option_problems``) its validation. This
module imports no KFP: the first pipeline step imports it inside its pod, where
only KFP's reduced runtime is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.cli_options import option
from common.kube import is_label_name, is_positive_quantity, is_subdomain_name
from components.local_model import CLUSTER_BASE_MODEL, LOCAL_MODEL_NAME


@dataclass(frozen=True)
class RunInputs:
    """What the run starts from; read by several stages."""

    dataset_uri: str = option(
        "",
        "The JSONL / JSONL.gz training data: a path or glob as seen inside the pods (e.g. on the workspace PVC), "
        "an https:// URL, s3://bucket/key or s3://bucket/prefix/ (credentials from the data connection "
        "'training-data'), or hf://datasets/owner/name[@revision][/path]. Empty uses the practical-skills sample "
        "bundled in the image.",
    )
    force: bool = option(
        False,
        "Train, evaluate, export and publish even when the prepared data is the same as the last published "
        "model's (e.g. after changing training options).",
    )
    base_model: str = option(
        "",
        "Model to fine-tune: a Hugging Face Hub id or a directory on the workspace PVC. Empty: "
        f"{CLUSTER_BASE_MODEL} on a cluster, {LOCAL_MODEL_NAME} in a local run.",
    )


@dataclass(frozen=True)
class WorkspaceOptions:
    """The PVC the stages share (a local run uses a directory instead and ignores these)."""

    pvc_name: str = option("", "Existing ReadWriteMany PVC to use as the workspace. Empty creates one for this run.")
    pvc_size: str = option("20Gi", "Size of the PVC created for this run, e.g. 20Gi.")
    pvc_storage_class: str = option(
        "",
        "StorageClass of the PVC created for this run; it must support ReadWriteMany. Empty uses the cluster's "
        "default class.",
    )
    keep_pvc: bool = option(
        False, "Keep the PVC created for this run after it succeeds (a failed run always keeps it for inspection)."
    )


def workspace_problems(options: WorkspaceOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value, checked as the API server would check it."""
    problems = {}
    if options.pvc_name and not is_label_name(options.pvc_name):
        problems["pvc_name"] = (
            f"{options.pvc_name!r} is not a valid Kubernetes name: use at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit (or leave it empty)"
        )
    if not is_positive_quantity(options.pvc_size):
        problems["pvc_size"] = f"{options.pvc_size!r} is not a positive Kubernetes quantity such as '20Gi' or '500Mi'"
    if options.pvc_storage_class and not is_subdomain_name(options.pvc_storage_class):
        problems["pvc_storage_class"] = (
            f"{options.pvc_storage_class!r} is not a valid StorageClass name (lowercase letters, digits, '-' and "
            "'.'; empty means the cluster default)"
        )
    return problems
