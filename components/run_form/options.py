"""The run parameters that belong to no single stage: the run's inputs and its workspace.

Like the stages' options dataclasses, each field declares one run parameter's
default, type, help text and (in ``option_problems``) its validation. This
module imports no KFP: the first pipeline step imports it inside its pod, where
only KFP's reduced runtime is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from common.cli_options import choice_problems, run_option
from common.kube import is_label_name, is_positive_quantity, is_subdomain_name
from components.data.mixture import SOURCES_HELP, parse_sources
from components.local_model import CLUSTER_BASE_MODEL, LOCAL_MODEL_NAME
from components.tokenise.options import GIB, MAIN_MEMORY, WORKER_MEMORY

# keep_pvc's values: auto keeps the PVC only where deleting it would delete the only copy of the model.
KEEP_PVC_CHOICES = ("auto", "true", "false")


@dataclass(frozen=True)
class RunInputs:
    """What the run starts from; read by several stages."""

    dataset_uri: str = run_option(
        "",
        "The JSONL / JSONL.gz training data: a path or glob as seen inside the pods (e.g. on the workspace PVC), "
        "an https:// URL, s3://bucket/key or s3://bucket/prefix/ (credentials from the Secret "
        "data_connection_secret names), or hf://datasets/owner/name[@revision][/path]. A URL that carries a "
        "credential (presigned, SAS) is refused here, since parameters are kept in the run's record: put it in "
        "that Secret's key DATASET_URL and write secret:DATASET_URL. Empty uses the practical-skills sample "
        "bundled in the image. To train on several sources, leave it empty and use dataset_sources.",
    )
    dataset_sources: str = run_option("", SOURCES_HELP)
    data_connection_secret: str = run_option(
        "aws-connection-training-data",
        "Secret of the OpenShift AI data connection with the S3 credentials and endpoint for an s3:// "
        "dataset_uri (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_S3_ENDPOINT, ...), and the URL of a "
        "dataset_uri secret:DATASET_URL (key DATASET_URL); the default is the Secret of a connection named "
        "training-data. Optional: a missing Secret only matters for s3:// data and secret:DATASET_URL.",
    )
    force: bool = run_option(
        False,
        "Train, evaluate, export and publish even when the prepared data is the same as the last published "
        "model's (e.g. after changing training options), and publish even when the new model does not beat the "
        "published one (it must still beat its base); the report says so.",
    )
    base_model: str = run_option(
        "",
        "Model to fine-tune: a Hugging Face Hub id or a directory on the workspace PVC. Empty: "
        f"{CLUSTER_BASE_MODEL} on a cluster, {LOCAL_MODEL_NAME} in a local run.",
    )


@dataclass(frozen=True)
class WorkspaceOptions:
    """The PVC the stages share (a local run uses a directory instead and ignores these)."""

    pvc_name: str = run_option(
        "", "Existing ReadWriteMany PVC to use as the workspace. Empty creates one for this run."
    )
    pvc_size: str = run_option("20Gi", "Size of the PVC created for this run, e.g. 20Gi.")
    pvc_storage_class: str = run_option(
        "",
        "StorageClass of the PVC created for this run; it must give ReadWriteMany filesystem volumes (a class the "
        "cluster says cannot is refused before the PVC is asked for). Empty uses the cluster's default class.",
    )
    keep_pvc: str = run_option(
        "auto",
        "After a successful run, keep the PVC created for it (true) or delete it (false). auto deletes it once the "
        "model went to a Hub repository, an S3 bucket or an OCI registry (hub_repo_id, model_s3_uri, "
        "model_oci_uri) and keeps it when it holds the run's only copy; false with none of those is refused. A "
        "failed run always keeps its PVC for inspection.",
        choices=KEEP_PVC_CHOICES,
    )


def inputs_problems(inputs: RunInputs) -> dict[str, str]:
    """Field name -> what is wrong with its value."""
    found = {}
    if not is_subdomain_name(inputs.data_connection_secret):
        found["data_connection_secret"] = (
            f"{inputs.data_connection_secret!r} is not a valid Secret name (lowercase letters, digits, '-' and '.'); "
            "the default is aws-connection-training-data"
        )
    try:
        sources = parse_sources(inputs.dataset_sources)
    except ValueError as error:
        found["dataset_sources"] = str(error)
    else:
        if sources and inputs.dataset_uri.strip():
            found["dataset_sources"] = (
                f"lists {len(sources)} source(s) and dataset_uri is {inputs.dataset_uri.strip()!r} too: a run reads "
                "one or the other; add dataset_uri to the list as one more source, or clear one of them"
            )
    return found


@dataclass(frozen=True)
class StepResources:
    """CPU and memory of each pipeline step's pod, as its request and its limit.

    Limits as well as requests, because namespaces with a ResourceQuota on
    limits refuse pods without them, and a step that outgrows its memory should
    be killed with OOMKilled in its status rather than take a node's memory.
    The defaults fit the default model (3B parameters, about 6 GB in bf16).
    The training pods' own sizes are the training_* parameters.
    """

    prepare_cpu: str = run_option("2", "CPU of the prepare step (reads, validates and splits the dataset).")
    prepare_memory: str = run_option("4Gi", "Memory of the prepare step.")
    tokenise_cpu: str = run_option(
        "4",
        f"CPU of the tokenise step: it runs one tokenising process per CPU (about {WORKER_MEMORY / GIB:g} GiB "
        "each), so the step's time falls with its CPUs.",
    )
    tokenise_memory: str = run_option(
        "8Gi",
        f"Memory of the tokenise step: about {WORKER_MEMORY / GIB:g} GiB per CPU plus {MAIN_MEMORY / GIB:g} GiB, "
        "whatever the data size.",
    )
    train_launcher_cpu: str = run_option(
        "500m", "CPU of the train step's launcher pod, which starts the training job and streams its logs."
    )
    train_launcher_memory: str = run_option("1Gi", "Memory of the train step's launcher pod.")
    evaluate_cpu: str = run_option(
        "4", "CPU of the evaluate step (generates with the models and scores them on the benchmarks)."
    )
    evaluate_memory: str = run_option(
        "32Gi",
        "Memory of the evaluate step: it loads the base, published and fine-tuned models one at a time, 3B models "
        "by default (on the CPU, with gpus_per_node=0, about 12 GB each in float32, plus the benchmark batches' "
        "logits: benchmark_batch_size x tokens x vocabulary x 8 bytes, about 3 GB for hellaswag at 16).",
    )
    export_cpu: str = run_option(
        "4", "CPU of the export step (GGUF conversion and the llama.cpp check run on the CPU)."
    )
    export_memory: str = run_option(
        "24Gi", "Memory of the export step: it converts the merged model and loads the GGUF in llama.cpp."
    )
    publish_cpu: str = run_option(
        "1", "CPU of the publish and store steps (upload the files to the Hub and to the storage targets)."
    )
    publish_memory: str = run_option("2Gi", "Memory of the publish and store steps.")


def resources_problems(resources: StepResources) -> dict[str, str]:
    """Field name -> what is wrong with its value: each is a positive Kubernetes quantity."""
    return {
        spec.name: f"is {getattr(resources, spec.name)!r}, not a positive Kubernetes quantity such as '2', '500m', "
        "'8Gi'"
        for spec in fields(StepResources)
        if not is_positive_quantity(getattr(resources, spec.name))
    }


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
    return {**problems, **choice_problems(WorkspaceOptions, options)}
