"""Create or update an InferenceService, wait until KServe says it is Ready, and ask it one chat question.

The wait is bounded; when it runs out, or a condition reports a failure that
does not clear, the step fails with the InferenceService's conditions and the
Events of it and its pods (an image that does not pull, no node with a free GPU,
a model that does not load), as the train step does for its job.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import requests
from kubernetes.client.exceptions import ApiException

from common.errors import UserError
from common.kube import Cluster
from components.training.api_server import REQUEST_TIMEOUT, api_problem, error_message
from components.training.events import EventLog

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
POLL_SECONDS = 5.0
CHAT_TIMEOUT = 300  # seconds for the first answer: vLLM compiles its graphs on the first request
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe's label on the predictor's pods


@dataclass(frozen=True)
class Served:
    """A Ready InferenceService and its answer to one question."""

    name: str
    namespace: str
    endpoint: str  # the in-cluster URL (status.address.url), else the external one (status.url)
    model: str  # the served model's name, as /v1/models lists it
    question: str
    answer: str


def apply(cluster: Cluster, manifest: dict[str, Any]) -> None:
    """Create the InferenceService, or replace the one of that name (it then rolls out the new version)."""
    name = manifest["metadata"]["name"]
    api = cluster.custom
    try:
        current = api.get_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as error:
        if error.status != 404:
            raise _problem(error, "get inferenceservices", cluster) from None
        current = None
    try:
        if current is None:
            api.create_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, manifest, _request_timeout=REQUEST_TIMEOUT
            )
        else:
            manifest = {**manifest, "metadata": {**manifest["metadata"], **_kept(current["metadata"])}}
            api.replace_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, name, manifest, _request_timeout=REQUEST_TIMEOUT
            )
    except ApiException as error:
        raise _problem(error, f"{'create' if current is None else 'update'} inferenceservices", cluster) from None


def wait_until_ready(cluster: Cluster, name: str, timeout_s: float, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Poll the InferenceService until its Ready condition is True; print its events meanwhile."""
    events = EventLog(cluster, out)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            service = cluster.custom.get_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            raise _problem(error, "get inferenceservices", cluster) from None
        conditions = {c.get("type"): c for c in (service.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready", {}).get("status") == "True":
            return service
        _poll_events(cluster, events, name)
        if time.monotonic() >= deadline:
            raise UserError(
                f"The InferenceService {name} in namespace {cluster.namespace} was not Ready after {timeout_s:.0f} s "
                f"(serving_timeout_s). Its conditions: {_conditions_text(conditions)}. Its events and its pods': "
                f"{'; '.join(_all_events(events)) or 'none could be read'}. It is left in place to look at: "
                f"oc describe isvc {name} -n {cluster.namespace}."
            )
        time.sleep(POLL_SECONDS)


def smoke_test(service: dict[str, Any], question: str) -> Served:
    """Ask the Ready service ``question`` through its OpenAI-compatible API (what vLLM serves)."""
    status = service.get("status") or {}
    endpoint = ((status.get("address") or {}).get("url") or status.get("url") or "").rstrip("/")
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    if not endpoint:
        raise UserError(f"The InferenceService {name} is Ready but has no URL in its status (address.url, url).")
    try:
        models = requests.get(f"{endpoint}/v1/models", timeout=60)
        models.raise_for_status()
        model = models.json()["data"][0]["id"]
        reply = requests.post(
            f"{endpoint}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 64,
                "temperature": 0,
            },
            timeout=CHAT_TIMEOUT,
        )
        reply.raise_for_status()
        answer = reply.json()["choices"][0]["message"]["content"]
    except (requests.RequestException, KeyError, IndexError, ValueError) as error:
        raise UserError(
            f"The InferenceService {name} is Ready, but its OpenAI-compatible API at {endpoint} did not answer a "
            f"chat completion ({error}). Its runtime's log: oc logs -n {namespace} -l {ISVC_LABEL}={name}."
        ) from None
    return Served(name, namespace, endpoint, model, question, answer)


def _kept(metadata: dict[str, Any]) -> dict[str, Any]:
    """What a replace must carry over from the stored object."""
    return {"resourceVersion": metadata["resourceVersion"]}


def _problem(error: ApiException, action: str, cluster: Cluster) -> UserError:
    if error.status == 404 and "could not find the requested resource" in error_message(error).lower():
        return UserError(
            f"The cluster has no InferenceService API ({GROUP}/{VERSION}): KServe is not installed, or the "
            "namespace is not enabled for model serving (OpenShift AI: enable single-model serving)."
        )
    return api_problem(error, action, cluster) or UserError(
        f"The Kubernetes API refused to {action}: {error_message(error)}"
    )


def _poll_events(cluster: Cluster, events: EventLog, name: str) -> None:
    events.poll(f"involvedObject.name={name}", f"InferenceService {name}")
    try:
        pods = cluster.core.list_namespaced_pod(
            cluster.namespace, label_selector=f"{ISVC_LABEL}={name}", _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException:
        return
    for pod in pods.items:
        events.poll(f"involvedObject.name={pod.metadata.name}", f"pod {pod.metadata.name}")


def _all_events(events: EventLog) -> list[str]:
    return [f"[{label}] {line}" for label in list(events.latest) for line in events.last(label)]


def _conditions_text(conditions: dict[str, dict[str, Any]]) -> str:
    if not conditions:
        return "none yet"
    return "; ".join(
        f"{kind}={c.get('status')}" + (f" ({c.get('reason', '')}: {c.get('message', '')})" if c.get("message") else "")
        for kind, c in conditions.items()
    )
