"""The pipeline's stages as KFP components, but for the train step (``train_step``, generated).

Every body has one shape: take its inputs by name (``dict(locals())`` before
anything else is bound), hand them to its stage's ``run_step``, and return what
that gives. Each ``run_step`` builds its options from the inputs named after its
options' fields, so all logic is plain Python, testable without KFP.
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
    seed: int,
    max_reject_fraction: float,
    system_prompt: str,
    field_map: str,
    train_data: dsl.Output[dsl.Dataset],
    eval_data: dsl.Output[dsl.Dataset],
    rejects: dsl.Output[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
) -> NamedTuple("PrepareOutputs", [("fingerprint", str), ("data_dir", str)]):
    """Validate and normalise the JSONL dataset into train/eval Parquet on the workspace."""
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from collections import namedtuple

    from components.dataprep.stage import run_step

    return namedtuple("PrepareOutputs", ["fingerprint", "data_dir"])(*run_step(inputs))


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def check_data_changed(fingerprint: str, repo_id: str, workspace_root: str, force: bool) -> NamedTuple(
    "DataChange",
    [("changed", bool), ("reason", str), ("finish", bool), ("version_run_id", str), ("version_train_dir", str)],
):
    """Whether to train: the prepared data's fingerprint differs from the last published model's
    (Hub model card, else the record on the workspace), nothing was published yet, or ``force``.
    On unchanged data, ``finish`` says whether the published version still lacks store, register or serve (its
    run failed after publishing); ``version_run_id`` and ``version_train_dir`` are then that version's.

    HF_TOKEN, when the task gets it from the hf-read-token Secret, lets it read the Hub model card.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from collections import namedtuple

    from components.publish.change_check import run_step

    fields = ["changed", "reason", "finish", "version_run_id", "version_train_dir"]
    return namedtuple("DataChange", fields)(*run_step(inputs))


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def report_skipped(skipped: str, reason: str):
    """A node in the run graph that says which stages were skipped and why (the decision's step says it too)."""
    print(f"skipped: {skipped}. Why: {reason}", flush=True)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def publish_model(
    workspace_root: str,
    run_id: str,
    dataset_uri: str,
    repo_id: str,
    private: bool,
    publish_merged: str,
    publish_adapter: bool,
    license: str,
    base_model: str,
    model_card: dsl.Output[dsl.Markdown],
    metrics: dsl.Output[dsl.Metrics],
) -> NamedTuple("PublishOutputs", [("location", str), ("dry_run", bool)]):
    """Commit the GGUF, Modelfile, reports and model card to the Hub as one commit, or write the folder (dry run).

    The token is read from HF_TOKEN, set from the hf-token Secret (the token that may write, mounted in this step
    alone); it is never a parameter.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from collections import namedtuple

    from components.publish.stage import run_step

    return namedtuple("PublishOutputs", ["location", "dry_run"])(*run_step(inputs))


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def tokenise_data(
    workspace_root: str,
    data_dir: str,
    base_model: str,
    backend: str,
    base_model_revision: str,
    max_length: int,
    loss_on: str,
    packing: bool,
    eval_max_rows: int,
    metrics: dsl.Output[dsl.Metrics],
) -> NamedTuple("TokeniseOutputs", [("tokens_dir", str)]):
    """Tokenise the prepared splits once, on this step's CPUs, into the workspace's token cache; returns the entry
    that the training ranks memory-map and the evaluation reads (an existing entry for the same data, tokenizer and
    settings is reused).

    HF_TOKEN, when the task gets it from the hf-read-token Secret, lets it fetch a gated model's tokenizer.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from collections import namedtuple

    from components.tokenise.stage import run_step

    return namedtuple("TokeniseOutputs", ["tokens_dir"])(run_step(inputs))


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def evaluate_model(
    workspace_root: str,
    run_id: str,
    base_model: str,
    train_dir: str,
    data_dir: str,
    tokens_dir: str,
    extra_questions: List[str],
    max_new_tokens: int,
    score_rows: int,
    min_eval_loss_improvement: float,
    min_improvement_over_published: float,
    batch_size: int,
    benchmark_tasks: str,
    benchmark_allow_code: bool,
    benchmark_limit: int,
    benchmark_fewshot: int,
    benchmark_batch_size: int,
    max_benchmark_drop: float,
    repo_id: str,
    force: bool,
    gpus: int,
    metrics: dsl.Output[dsl.Metrics],
    report_html: dsl.Output[dsl.HTML],
    report_markdown: dsl.Output[dsl.Markdown],
) -> NamedTuple("EvaluateOutputs", [("gate_passed", bool), ("gate_reason", str)]):
    """Compare the fine-tuned model with its base and with the published model (the Hub repository ``repo_id``
    with HF_TOKEN, else the workspace's publish record) on held-out data and standard benchmarks (lm-eval); report
    it and decide the quality gate.

    ``force`` lets a model that does not beat the published one pass. ``gpus``: the GPUs the step's pod was
    given (0: none); with any, it stops rather than run on the CPU when CUDA fails.
    """
    # No parameter defaults: the pod runs this source as written, so they could only be literals
    # copied from EvaluateOptions. The pipeline passes every value, defaulting to EvaluateOptions'.
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from collections import namedtuple

    from components.evaluation.stage import run_step

    return namedtuple("EvaluateOutputs", ["gate_passed", "gate_reason"])(*run_step(inputs))


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def export_gguf(
    workspace_root: str,
    run_id: str,
    train_dir: str,
    model_name: str,
    outtype: str,
    gguf_lora_adapter: bool,
    thresholds: dict,
    gguf_model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    report: dsl.Output[dsl.Markdown],
) -> str:
    """Convert merged/ to GGUF (comma-separated outtypes), verify it in llama.cpp, write a Modelfile.

    ``thresholds`` overrides keys of gguf_export.options.Thresholds; an empty
    ``model_name`` is derived from the base model. Returns the GGUF's path on
    the workspace.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from components.export.stage import run_step

    return run_step(inputs)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def store_model(
    workspace_root: str, run_id: str, train_dir: str, model_name: str, s3_uri: str, s3_secret: str, oci_uri: str,
    oci_secret: str
) -> str:  # fmt: skip
    """Copy the published version (the publish step's upload folder) to the storage targets the run names: S3, and
    an OCI registry as a KServe modelcar image.

    The S3 credentials and endpoint are the AWS_* variables from the data connection Secret ``s3_secret``, the
    registry's the dockerconfigjson Secret ``oci_secret`` mounted as a file; none is a parameter. Returns the
    first copy's URI, empty when no target is set.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from components.storage.stage import run_step

    return run_step(inputs)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def register_model(
    workspace_root: str, run_id: str, train_dir: str, model_name: str, repo_id: str, s3_secret: str, url: str,
    secret: str, use_service_account: bool, allow_http: bool
) -> str:  # fmt: skip
    """Register the stored version in the Kubeflow Model Registry at ``url``: the model by name, the run as a
    version, an artifact per place the version went (S3, OCI, the Hub) and its provenance as properties.

    The token is MODEL_REGISTRY_TOKEN from the Secret ``secret`` (key token), else, with ``use_service_account``
    and over https only, the pod's service account token; never a parameter, and over plain http only to loopback
    or with ``allow_http``. Returns the version's id, empty when no registry is set.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from components.registry.stage import run_step

    return run_step(inputs)


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def serve_model(
    workspace_root: str, run_id: str, train_dir: str, model_name: str, s3_secret: str,
    registry_url: str, registry_secret: str, registry_use_service_account: bool, registry_allow_http: bool,
    deploy: bool, pull_secret: str, runtime: str, gpus: int, cpu: str, memory: str,
    timeout_s: int
) -> str:  # fmt: skip
    """Write the stored version's KServe InferenceService (vLLM) to serve/inferenceservice.yaml; with ``deploy``,
    check that the registry lets its pods pull the image with the read-only Secret ``pull_secret`` (mounted as a
    file), create or update it in this namespace, wait until Ready, ask it one chat question and record the
    endpoint and answer (run summary, Model Registry). Returns the endpoint, empty when not deployed.
    """
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
    from components.serving.stage import run_step

    return run_step(inputs)
