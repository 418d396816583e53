"""The KServe InferenceService (vLLM) of a stored version, as OpenShift AI's dashboard would create it.

The model comes from the modelcar image when there is one (``storageUri:
oci://...``, its Secret as the pod's pull secret), else from the S3 copy
through the data connection (``storage: {key, path}``, which odh-model-controller
resolves). vLLM loads the merged checkpoint at the version's top level with its
own tokenizer_config.json, so the chat template trained with is the one served;
nothing overrides it.
"""

from __future__ import annotations

import re
from typing import Any

from components.storage.s3_target import bucket_and_key

GPU_RESOURCE = "nvidia.com/gpu"
NAME_LIMIT = 45  # KServe's own limit on InferenceService names (route and service names are built from it)


def service_name(model_name: str) -> str:
    """The InferenceService's name: the model's, in the characters and length Kubernetes and KServe allow.

    One per model: each run's deployment updates it to the new version."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")[:NAME_LIMIT].rstrip("-")
    return name or "model"


def render_inference_service(
    name: str,
    namespace: str,
    run_id: str,
    copies: list[dict[str, Any]],
    options,
    s3_secret: str,
    oci_secret: str,
) -> dict[str, Any]:
    """The InferenceService serving the version in ``copies`` (stored.json's records) with ``options``."""
    oci = next((copy for copy in copies if copy["uri"].startswith("oci://")), None)
    s3 = next((copy for copy in copies if copy["uri"].startswith("s3://")), None)
    resources = {"cpu": options.cpu, "memory": options.memory}
    if options.gpus:
        resources[GPU_RESOURCE] = str(options.gpus)
    model: dict[str, Any] = {
        "modelFormat": {"name": "vLLM"},
        "runtime": options.runtime,
        "resources": {"requests": resources, "limits": dict(resources)},
    }
    predictor: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 1, "model": model}
    if oci:
        model["storageUri"] = oci["uri"]
        predictor["imagePullSecrets"] = [{"name": oci_secret}]
    else:
        model["storage"] = {"key": s3_secret, "path": bucket_and_key(s3["uri"])[1]}
    if options.gpus:
        predictor["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"opendatahub.io/dashboard": "true", "app.kubernetes.io/part-of": "llm-finetune-pipeline"},
            "annotations": {
                "openshift.io/display-name": f"{name} ({run_id})",
                "serving.kserve.io/deploymentMode": "RawDeployment",
                "llm-finetune-pipeline/run-id": run_id,
            },
        },
        "spec": {"predictor": predictor},
    }
