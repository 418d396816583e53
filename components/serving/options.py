"""The serving handoff's run parameters: their defaults, help texts and validation, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from common.cli_options import run_option
from common.kube import is_label_name, is_positive_quantity


@dataclass(frozen=True)
class ServingOptions:
    """How the stored version is served by KServe."""

    deploy: bool = run_option(
        False,
        "Create or update the KServe InferenceService of the stored version in the run's namespace, wait until it "
        "is Ready (serving_timeout_s), ask it one chat question and record the endpoint and answer in the run "
        "summary and the Model Registry. Off: the InferenceService is only written to serve/inferenceservice.yaml "
        "for oc apply. Needs model_oci_uri or model_s3_uri and the merged checkpoint (publish_merged).",
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
        "Seconds to wait for the InferenceService to become Ready (image pull, model download, vLLM start) before "
        "the step fails with its conditions and events.",
        name="serving_timeout_s",
    )


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
    if options.timeout_s < 60:
        problems["timeout_s"] = f"is {options.timeout_s}; a model server takes minutes to start, allow at least 60"
    return problems
