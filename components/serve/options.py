"""The serving handoff's run parameters: their defaults, help texts and validation, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from common.cli_options import run_option
from common.kube import is_label_name, is_positive_quantity

# What the serve step mounts when model_oci_pull_secret is empty: a Secret name that is never created, so the
# optional mount is an empty folder (see pull_secret_volume).
NO_PULL_SECRET = "no-model-oci-pull-secret"


@dataclass(frozen=True)
class ServingOptions:
    """How the stored version is served by KServe."""

    deploy: bool = run_option(
        False,
        "Create or update the KServe InferenceService of the stored version in the run's namespace (its image "
        "by digest), wait until it is Ready (serving_timeout_s), ask it one chat question and record the endpoint "
        "and answer in the run summary and the Model Registry. Only a service this pipeline created for this model "
        "(label app.kubernetes.io/managed-by=llm-finetune-pipeline) is updated; another of that name is refused. "
        "Off: the InferenceService is only written to serve/inferenceservice.yaml for oc apply. Needs "
        "model_oci_uri or model_s3_uri and the merged checkpoint (publish_merged).",
    )
    pull_secret: str = run_option(
        "",
        "Secret of type kubernetes.io/dockerconfigjson with a read-only (pull) credential for model_oci_uri's "
        "registry, which KServe's pods pull the modelcar image with (the InferenceService's imagePullSecrets): oc "
        "create secret docker-registry NAME --docker-server=REGISTRY --docker-username=... --docker-password=... "
        "with a robot account or token that may only pull. Not model_oci_secret, which can push. With deploy, "
        "the serve step first reads the image's manifest with this credential and stops, applying nothing, when "
        "the registry refuses it. Empty: no pull Secret; the registry must serve the image anonymously (a pull "
        "Secret linked to the namespace's service account is not seen by that check: name it here).",
        name="model_oci_pull_secret",
    )
    runtime: str = run_option(
        "vllm-cuda-runtime",
        "ServingRuntime (vLLM) in the namespace that serves the InferenceService: on OpenShift AI one made from "
        "the vllm-cuda-runtime-template (Settings → Serving runtimes, or oc process).",
        name="serving_runtime",
    )
    gpus: int = run_option(1, "GPUs of the serving pod (nvidia.com/gpu); 0 serves on CPU.", name="serving_gpus")
    cpu: str = run_option("4", "CPU request and limit of the serving pod.", name="serving_cpu")
    memory: str = run_option("16Gi", "Memory request and limit of the serving pod.", name="serving_memory")
    timeout_s: int = run_option(
        1800,
        "Seconds to wait for the InferenceService to become Ready with the new version (image pull, model "
        "download, vLLM start) before the step fails with its conditions and events; an updated service then gets "
        "its previous spec back.",
        name="serving_timeout_s",
    )


def pull_secret_volume(pull_secret: str) -> str:
    """The Secret the serve step mounts (optional) for ``pull_secret``: itself, or, when it is empty, NO_PULL_SECRET.

    Kubeflow Pipelines cannot mount a Secret of no name (the pod would be invalid), and the mount is declared in
    the compiled pipeline whatever the value; the serve step reads the mount only when ``pull_secret`` is set."""
    return pull_secret or NO_PULL_SECRET


def pull_secret_problem(pull_secret: str, push_secret: str) -> str | None:
    """Why ``pull_secret`` may not be what KServe's pods pull with, or None: the store step's push Secret would
    let anyone who can read the serving namespace's pods overwrite the model's images."""
    if pull_secret and pull_secret == push_secret:
        return (
            f"names the Secret {pull_secret!r}, which is model_oci_secret, the credential the store step pushes with: "
            "the serving pods would hold a credential that can overwrite the model's images. Create a Secret with a "
            "read-only (pull) credential for the registry (oc create secret docker-registry NAME ...) and name it "
            "here, or leave it empty when the registry serves the image anonymously"
        )
    return None


def option_problems(options: ServingOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way."""
    problems = {}
    if not is_label_name(options.runtime):
        problems["runtime"] = f"{options.runtime!r} is not a valid ServingRuntime name (a DNS-1123 label)"
    if options.gpus < 0:
        problems["gpus"] = f"is {options.gpus}; write 0 or more"
    for field in ("cpu", "memory"):
        if not is_positive_quantity(value := getattr(options, field)):
            problems[field] = f"is {value!r}, which is not a Kubernetes quantity above zero (e.g. 4, 500m, 16Gi)"
    if options.pull_secret and not is_label_name(options.pull_secret):
        problems["pull_secret"] = (
            f"{options.pull_secret!r} is not a Secret name the serve step can mount: lowercase letters, digits and "
            "'-', at most 63 (Kubeflow Pipelines names the step's volume after the Secret)"
        )
    if options.timeout_s < 60:
        problems["timeout_s"] = f"is {options.timeout_s}; a model server takes minutes to start, allow at least 60"
    return problems
