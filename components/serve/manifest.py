"""The KServe InferenceService (vLLM) of a stored version, as OpenShift AI's dashboard would create it.

The model comes from the modelcar image when there is one (``storageUri:
oci://...@sha256:...``, pinned to the digest the store step computed from the
manifest it pushed, pulled with the read-only Secret ``model_oci_pull_secret``
names, never with the store step's push Secret), else from the S3 copy
through the data connection (``storage: {key, path}``, which odh-model-controller
resolves). vLLM loads the merged checkpoint at the version's top level with its
own tokenizer_config.json, so the chat template trained with is the one served;
nothing overrides it.

Every InferenceService this pipeline writes carries its ownership labels
(``app.kubernetes.io/managed-by`` and the model's key): the deploy step replaces
only a service that carries both, never one someone else made under that name.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Sequence

from common.records import StoredCopy
from components.store.oci_target import pinned_uri
from components.store.s3_target import bucket_and_key

GPU_RESOURCE = "nvidia.com/gpu"
NAME_LIMIT = 45  # KServe's own limit on InferenceService names (route and service names are built from it)
NAME_HASH_CHARS = 10  # hex digits of the model's key in its service name: 40 bits, so names of models differ
MANAGER = "llm-finetune-pipeline"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"  # the Kubernetes recommended label for the tool that manages it
MODEL_LABEL = "llm-finetune-pipeline/model-key"  # which model it serves: the model's key (a label value: <= 63)
MODEL_KEY_CHARS = 40
MODEL_NAME_ANNOTATION = "llm-finetune-pipeline/model-name"  # the model's name as given, for people
RUN_ANNOTATION = "llm-finetune-pipeline/run-id"
# The sha256 of the spec this pipeline sent. KServe copies an InferenceService's annotations onto its predictor's
# pods, so the deploy step can tell the pods of the spec it applied from the ones of the spec before.
SPEC_ANNOTATION = "llm-finetune-pipeline/spec-sha256"


def model_key(model_name: str) -> str:
    """The hex sha256 of the model's name exactly as given: its identity, which no character mapping loses."""
    return hashlib.sha256(model_name.encode("utf-8")).hexdigest()


def service_name(model_name: str) -> str:
    """The InferenceService's name: a readable prefix of the model's name and a hash of all of it.

    The prefix alone would collide (``my_model`` and ``my.model`` both become ``my-model``); the hash keeps
    every model its own service. The whole is a DNS-1035 label (a lowercase letter first, as KServe requires)
    of at most NAME_LIMIT characters. One per model: each run's deployment updates it to the new version."""
    readable = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")
    if not readable[:1].isalpha():
        readable = f"model-{readable}".rstrip("-")
    readable = readable[: NAME_LIMIT - NAME_HASH_CHARS - 1].rstrip("-")
    return f"{readable}-{model_key(model_name)[:NAME_HASH_CHARS]}"


def ownership_labels(model_name: str) -> dict[str, str]:
    """The labels that say this pipeline made the InferenceService, for this model."""
    return {MANAGED_BY_LABEL: MANAGER, MODEL_LABEL: model_key(model_name)[:MODEL_KEY_CHARS]}


def spec_digest(spec: dict[str, Any]) -> str:
    """The sha256 of ``spec`` in canonical JSON: the same spec always gives the same value."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def render_inference_service(
    model_name: str,
    namespace: str,
    run_id: str,
    copies: Sequence[StoredCopy],
    options,
    s3_secret: str,
) -> dict[str, Any]:
    """The InferenceService of model ``model_name`` serving the version in ``copies`` (stored.json's records)
    with ``options``; ``s3_secret`` is the data connection of the S3 copy."""
    name = service_name(model_name)
    spec = {"predictor": _predictor(copies, options, s3_secret)}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "opendatahub.io/dashboard": "true",
                "app.kubernetes.io/part-of": MANAGER,
                **ownership_labels(model_name),
            },
            "annotations": {
                "openshift.io/display-name": f"{model_name} ({run_id})",
                "serving.kserve.io/deploymentMode": "RawDeployment",
                RUN_ANNOTATION: run_id,
                MODEL_NAME_ANNOTATION: model_name,
                SPEC_ANNOTATION: spec_digest(spec),
            },
        },
        "spec": spec,
    }


def _predictor(copies: Sequence[StoredCopy], options, s3_secret: str) -> dict[str, Any]:
    """The predictor: the modelcar image by digest when there is one, pulled with the pull Secret when one is
    named (none: anonymously, or with what the namespace's service account links), else the S3 copy."""
    oci = next((copy for copy in copies if copy.scheme == "oci"), None)
    s3 = next((copy for copy in copies if copy.scheme == "s3"), None)
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
        model["storageUri"] = pinned_uri(oci.uri, oci.digest or "")
        if options.pull_secret:
            predictor["imagePullSecrets"] = [{"name": options.pull_secret}]
    else:
        model["storage"] = {"key": s3_secret, "path": bucket_and_key(s3.uri)[1]}
    if options.gpus:
        predictor["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return predictor
