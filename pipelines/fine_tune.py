"""The fine-tuning pipeline DAG.

prepare → has the data changed since the last published model? → tokenise → train →
evaluate against the base and the published model → (quality gate) → export
GGUF → publish → store → register → serve. Each arrow only runs when
the step before succeeded; the two questions are ``dsl.If`` branches, so a
scheduled run on unchanged data stops after preparing, and a fine-tune that
made the model worse is never exported or published. One exception to the
stop: when the run that published the model failed after publishing, a run on
the same data runs the store, register and serve steps it left undone on that
version (``dsl.Elif``), without training.

``build_pipeline`` wires the stages once; the workspace decides whether large
files travel over a PVC and training runs as a Kubeflow job
(``fine_tune_pipeline``, what is compiled and uploaded) or over a local
directory with local training processes (what ``python -m pipelines.run``
executes with kfp.local). ``fine_tune`` gets the run's every parameter by name;
the literal signature KFP reads (the run form) is generated around it
(``pipelines/run_form.py``), and the descriptions KFP shows come from the same
declarations (``components/run_form``).
"""

from pathlib import Path
from typing import Any

from kfp import dsl, kubernetes

from common.run_layout import HF_HOME
from common.tracking import SECRET_KEYS as MLFLOW_SECRET_KEYS
from components.data.sources import URL_ENV as DATASET_URL_ENV
from components.evaluate.gate import GATED_STAGES
from components.hub_auth import READ_SECRET_NAME, READ_TOKEN_CHECK_ENV, SECRET_KEY, TOKEN_ENV, WRITE_SECRET_NAME
from components.pipeline_steps.skipped import report_skipped
from components.pipeline_steps.stages import (
    check_data_changed,
    evaluate_model,
    export_gguf,
    prepare_dataset,
    publish_model,
    register_model,
    serve_model,
    store_model,
    tokenise_data,
)
from components.pipeline_steps.train_step import train_model
from components.register.stage import TOKEN_ENV as REGISTRY_TOKEN_ENV
from components.register.stage import TOKEN_KEY as REGISTRY_TOKEN_KEY
from components.run_form.docs import docstring
from components.run_form.table import PIPELINE_NAME
from components.runtime_image import runtime_image
from components.serve.pull_check import PULL_SECRET_MOUNT
from components.store.oci_target import SECRET_MOUNT
from pipelines.first_step import validate_parameters
from pipelines.run_form import with_run_form
from pipelines.step_signatures import run_arguments
from pipelines.tasks import consumes, sized, small
from pipelines.workspace import ClusterWorkspace, Workspace

DESCRIPTION = (
    "Fine-tune a small LLM on JSONL questions and answers: prepare, train, evaluate, export, publish, store, "
    "register, serve."
)
GPU_RESOURCE = "nvidia.com/gpu"
# What an OpenShift AI data connection's Secret holds; the prepare step reads S3
# credentials and the endpoint from them when the Secret exists, and a dataset URL
# that carries a credential from its key DATASET_URL (dataset_uri secret:DATASET_URL).
DATA_CONNECTION_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
)
# A train step whose launcher pod is lost (evicted, its node gone) runs again and
# follows the training job the first attempt created (the job's name comes from the run id).
TRAIN_STEP_RETRIES = 2


def with_hub_token(
    task: dsl.PipelineTask, secret_name: str = READ_SECRET_NAME, variable: str = TOKEN_ENV
) -> dsl.PipelineTask:
    """HF_TOKEN from the optional Secret ``secret_name``: never a parameter, so it is in no run record, log or YAML.

    The steps that only read the Hub get the read token (``hf-read-token``); ``with_hub_write_token`` is the
    publish step's. Optional: a public base model and dataset need no token, and a run with hub_repo_id set and a
    Secret missing is refused by the first step instead.
    """
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={SECRET_KEY: variable}, optional=True
    )


def with_hub_write_token(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """HF_TOKEN from ``hf-token``, the token that may write to hub_repo_id: the publish step's alone."""
    return with_hub_token(task, WRITE_SECRET_NAME)


def with_data_connection(
    task: dsl.PipelineTask, secret_name, keys: tuple[str, ...] = DATA_CONNECTION_KEYS
) -> dsl.PipelineTask:
    """``keys`` of the data connection Secret as environment variables, optional: a run reading no S3 data (and
    no URL from the Secret) needs no Secret."""
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={key: key for key in keys}, optional=True
    )


def with_secrets_to_check(task: dsl.PipelineTask, data_connection_secret) -> dsl.PipelineTask:
    """The first step gets the Secrets whose absence would make a later step skip what it guards (the Hub tokens:
    the champion comparison and the publish) or fail after the run started (a dataset URL kept in the Secret), so
    it refuses the run in seconds, naming them. It checks their presence only. Both Hub Secrets hold the key
    HF_TOKEN, so the read one is seen here under another variable (the write one is HF_TOKEN, as in publish)."""
    checked = with_data_connection(task, data_connection_secret, keys=(DATASET_URL_ENV,))
    return with_hub_token(with_hub_write_token(checked), READ_SECRET_NAME, READ_TOKEN_CHECK_ENV)


def with_mlflow_credentials(task: dsl.PipelineTask, secret_name) -> dsl.PipelineTask:
    """The MLflow tracking server's credentials (``common.tracking.SECRET_KEYS``) from the Secret mlflow_secret
    names, each optional: a server that needs no login needs no Secret. The first step (which checks the server)
    and the evaluate step (which logs to it) get them here; the training pods get them in their manifest."""
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={key: key for key in MLFLOW_SECRET_KEYS}, optional=True
    )


def with_registry_credentials(task: dsl.PipelineTask, secret_name, mount_path: Path = SECRET_MOUNT) -> dsl.PipelineTask:
    """The dockerconfigjson Secret as files where the step looks (the store step's push Secret at SECRET_MOUNT, the
    serve step's pull Secret at PULL_SECRET_MOUNT): its password is in no environment variable, parameter or log."""
    return kubernetes.use_secret_as_volume(task, secret_name=secret_name, mount_path=str(mount_path), optional=True)


def with_registry_token(task: dsl.PipelineTask, secret_name) -> dsl.PipelineTask:
    """MODEL_REGISTRY_TOKEN from the Secret's key 'token', optional: without it the step presents the pod's
    service account token."""
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={REGISTRY_TOKEN_KEY: REGISTRY_TOKEN_ENV}, optional=True
    )


def placed_like_training(task: dsl.PipelineTask, placement: dsl.PipelineTask) -> dsl.PipelineTask:
    """The GPU count, node selector and tolerations the parameter check derived from the training parameters:
    one GPU when the training pods have GPUs, none (the CPU) when gpus_per_node is 0."""
    gpus = placement.outputs["evaluate_gpus"]
    consumes(task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus), gpus)
    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    return task


def deliver(
    workspace: Workspace,
    run: dict[str, Any],
    version: dict[str, Any],
    pull_secret_volume,
    after: tuple[dsl.PipelineTask, ...] = (),
) -> dsl.PipelineTask:
    """Store, register and serve the published ``version`` (its workspace, run id, train directory and model name),
    after the tasks ``after``; the serve task, the last. ``pull_secret_volume``: the first step's name of the pull
    Secret to mount in the serve step (model_oci_pull_secret, or a placeholder when it is empty).

    Wired twice: after the publish of a new version, and on unchanged data for the published version whose run
    failed after publishing (each step skips itself when the version's delivery record says it completed).
    """
    stored = workspace.mount(store_model(**version, **run_arguments("store_model", run)).after(*after))
    with_data_connection(sized(stored, run["publish_cpu"], run["publish_memory"]), run["model_s3_secret"])
    with_registry_credentials(stored, run["model_oci_secret"])
    registered = workspace.mount(
        register_model(
            **version,
            repo_id=run["hub_repo_id"],
            s3_secret=run["model_s3_secret"],
            **run_arguments("register_model", run),
        ).after(stored)
    )
    with_registry_token(small(registered), run["model_registry_secret"])
    served = workspace.mount(
        serve_model(
            **version,
            s3_secret=run["model_s3_secret"],
            registry_url=run["model_registry_url"],
            registry_secret=run["model_registry_secret"],
            registry_use_service_account=run["model_registry_use_service_account"],
            registry_allow_http=run["model_registry_allow_http"],
            **run_arguments("serve_model", run),
        ).after(registered)
    )
    with_registry_token(small(served), run["model_registry_secret"])
    with_registry_credentials(served, pull_secret_volume, PULL_SECRET_MOUNT)  # the serve step only: it can only pull
    for task in (stored, registered, served):
        workspace.retry_after_publish(task)  # retried on a cluster, not locally (pipelines.workspace)
    return served


def build_pipeline(workspace: Workspace):
    """The pipeline with its large files on ``workspace``."""

    def fine_tune(run: dict[str, Any]) -> None:
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        validated = with_secrets_to_check(small(validate_parameters(**run)), run["data_connection_secret"])
        with_mlflow_credentials(validated, run["mlflow_secret"])
        workspace.attach(validated, run["pvc_name"], run["pvc_size"], run["pvc_storage_class"])
        prepared = workspace.mount(
            prepare_dataset(
                dataset_uri=run["dataset_uri"],
                dataset_sources=run["dataset_sources"],
                workspace_root=workspace.root,
                run_id=run_id,
                **run_arguments("prepare_dataset", run),
            ).after(validated)
        )
        # The benchmark tasks' data, which the data step checks the training rows against, into the Hub cache on the
        # PVC, where the evaluate step finds it.
        prepared.set_env_variable("HF_HOME", f"{workspace.root}/{HF_HOME}")
        with_hub_token(
            with_data_connection(
                sized(prepared, run["prepare_cpu"], run["prepare_memory"]),
                run["data_connection_secret"],
                keys=(*DATA_CONNECTION_KEYS, DATASET_URL_ENV),
            )
        )
        changed = workspace.mount(
            check_data_changed(
                fingerprint=prepared.outputs["fingerprint"],
                data_dir=prepared.outputs["data_dir"],
                repo_id=run["hub_repo_id"],
                workspace_root=workspace.root,
                force=run["force"],
            )
        )
        with_hub_token(small(changed))

        with dsl.If(changed.outputs["changed"] == True, name="data-changed"):  # noqa: E712 (a KFP condition)
            backend = workspace.training_backend(run["training_backend"])
            tokenised = workspace.mount(
                tokenise_data(
                    workspace_root=workspace.root,
                    data_dir=prepared.outputs["data_dir"],
                    base_model=run["base_model"],
                    backend=backend,
                    **run_arguments("tokenise_data", run),
                )
            )
            with_hub_token(sized(tokenised, run["tokenise_cpu"], run["tokenise_memory"]))
            trained = workspace.mount(
                train_model(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    tokens_dir=tokenised.outputs["tokens_dir"],
                    pvc_name=workspace.pvc(),
                    pvc_size=run["pvc_size"],
                    image=runtime_image(),
                    base_model=run["base_model"],
                    pipeline_name=PIPELINE_NAME,
                    hf_token_secret=READ_SECRET_NAME,
                    **{**run_arguments("train_model", run), "backend": backend},
                )
            )
            sized(trained, run["train_launcher_cpu"], run["train_launcher_memory"]).set_retry(
                num_retries=TRAIN_STEP_RETRIES, backoff_duration="30s"
            )
            with_hub_token(trained)  # the fit check reads a gated or private base model's config.json
            evaluated = workspace.mount(
                evaluate_model(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    base_model=trained.outputs["base_model"],
                    train_dir=trained.outputs["train_dir"],
                    data_dir=prepared.outputs["data_dir"],
                    tokens_dir=tokenised.outputs["tokens_dir"],
                    repo_id=run["hub_repo_id"],
                    force=run["force"],
                    gpus=validated.outputs["evaluate_gpus"] if workspace.gpus else 0,
                    **run_arguments("evaluate_model", run),
                )
            )
            with_hub_token(sized(evaluated, run["evaluate_cpu"], run["evaluate_memory"]))
            with_mlflow_credentials(evaluated, run["mlflow_secret"])
            # The Hub cache on the PVC: the base model the training pods downloaded there is not fetched again, and
            # the benchmark datasets lm-eval downloads are kept for the next run.
            evaluated.set_env_variable("HF_HOME", f"{workspace.root}/{HF_HOME}")
            if workspace.gpus:  # kfp.local ignores placement, and has no GPU count to pass
                placed_like_training(evaluated, validated)

            with dsl.If(evaluated.outputs["gate_passed"] == True, name="quality-gate-passed"):  # noqa: E712
                exported = workspace.mount(
                    export_gguf(
                        workspace_root=workspace.root,
                        run_id=run_id,
                        train_dir=trained.outputs["train_dir"],
                        **run_arguments("export_gguf", run),
                    )
                )
                sized(exported, run["export_cpu"], run["export_memory"])
                published = workspace.mount(
                    publish_model(
                        workspace_root=workspace.root,
                        run_id=run_id,
                        dataset_uri=run["dataset_uri"],
                        base_model=run["base_model"],
                        **run_arguments("publish_model", run),
                    ).after(exported)
                )
                with_hub_write_token(sized(published, run["publish_cpu"], run["publish_memory"]))
                # What the store, register and serve steps all take: where the version is and its name.
                version = dict(
                    workspace_root=workspace.root,
                    run_id=run_id,
                    train_dir=trained.outputs["train_dir"],
                    model_name=run["model_name"],
                )
                pull_secret = validated.outputs["pull_secret_volume"]
                served = deliver(workspace, run, version, pull_secret, after=(published,))
                workspace.release(served, run["pvc_name"], validated.outputs["keep_workspace"])
            with dsl.Else(name="quality-gate-failed"):
                gate_failed = small(report_skipped(skipped=GATED_STAGES, reason=evaluated.outputs["gate_reason"]))
                workspace.release(gate_failed, run["pvc_name"], validated.outputs["keep_workspace"])
        with dsl.Elif(changed.outputs["finish"] == True, name="finish-published-version"):  # noqa: E712
            # Unchanged data, but the run that published the model failed after publishing: the steps it left
            # undone run on its version now, and nothing is trained.
            published_version = dict(
                workspace_root=workspace.root,
                run_id=changed.outputs["version_run_id"],
                train_dir=changed.outputs["version_train_dir"],
                model_name=run["model_name"],
            )
            finished = deliver(workspace, run, published_version, validated.outputs["pull_secret_volume"])
            workspace.release(finished, run["pvc_name"], validated.outputs["keep_workspace"])
        with dsl.Else(name="data-unchanged"):
            unchanged = small(
                report_skipped(skipped=f"training, evaluation, {GATED_STAGES}", reason=changed.outputs["reason"])
            )
            workspace.release(unchanged, run["pvc_name"], validated.outputs["keep_workspace"])

    pipeline_function = with_run_form(fine_tune)
    pipeline_function.__doc__ = docstring("Fine-tune a small LLM on question/answer data.")
    return dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)(pipeline_function)


fine_tune_pipeline = build_pipeline(ClusterWorkspace())
