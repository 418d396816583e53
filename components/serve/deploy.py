"""Create or update an InferenceService, wait until KServe serves it, and ask it one chat question.

Only a service this pipeline made for this model (its ownership labels) is
replaced; any other of that name is refused and left untouched. The wait is
bounded; when it runs out the step fails with the InferenceService's conditions
and the Events of it and its pods (an image that does not pull, no node with a
free GPU, a model that does not load), as the train step does for its job. When
the attempt fails after the apply, for that or any other reason (the API server
unreachable, the chat question unanswered), a replaced service gets its previous
spec back; what it replaced is saved in the run's serve folder first, so a retry
of a step killed mid-rollout puts back that, not the spec the killed try applied.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO, TypeVar

import requests
from kubernetes.client.exceptions import ApiException

from common.atomic import write_json
from common.errors import UserError
from common.kube import Cluster
from common.records import Served
from common.run_layout import PREVIOUS_SERVICE
from components.serve.manifest import (
    MANAGED_BY_LABEL,
    MANAGER,
    MODEL_LABEL,
    MODEL_NAME_ANNOTATION,
    RUN_ANNOTATION,
    SPEC_ANNOTATION,
)
from components.train.api_server import REQUEST_TIMEOUT, api_problem, error_message
from components.train.events import EventLog

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
POLL_SECONDS = 5.0
CHAT_TIMEOUT = 300  # seconds for the first answer: vLLM compiles its graphs on the first request
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe's label on the predictor's pods
T = TypeVar("T")


def roll_out(
    cluster: Cluster,
    manifest: dict[str, Any],
    timeout_s: float,
    serve_dir: Path,
    check: Callable[[dict[str, Any]], T],
    out: TextIO = sys.stdout,
) -> T:
    """Apply ``manifest``, wait until KServe serves it and ``check`` the Ready service (the smoke test); return
    what ``check`` returns.

    Whatever ends the attempt after the apply with an exception (not served within ``timeout_s``, the API
    server unreachable while waiting, ``check`` failing, an interrupt), a replaced service first gets back the
    spec it had before this run (KServe then returns to the pods that served before); a service this run
    created is left in place to look at, since nothing served under its name before. A step killed outright
    runs no handler and leaves this run's spec in place, which is why what it replaced is saved in
    ``serve_dir`` before the apply: the retried attempt then finds the service carrying this run's spec, and
    restores the saved one, not that, when its own rollout fails."""
    name = manifest["metadata"]["name"]
    current = _get(cluster, name)
    if current is not None:
        _refuse_unless_ours(current, manifest, cluster.namespace)
    previous = _remember_previous(serve_dir / PREVIOUS_SERVICE, current, manifest)
    apply(cluster, manifest, current)
    print(f"InferenceService {name} applied in {cluster.namespace}; waiting until it is Ready", file=out, flush=True)
    try:
        return check(wait_until_ready(cluster, manifest, timeout_s, out))
    except UserError as failed:
        raise UserError(f"{failed} {_undo(cluster, previous, manifest)}") from None
    except BaseException:
        print(_undo(cluster, previous, manifest), file=out, flush=True)
        raise


def apply(cluster: Cluster, manifest: dict[str, Any], current: dict[str, Any] | None) -> None:
    """Create the InferenceService when there is none (``current``), else replace ``current``, which the caller
    checked is ours (KServe then rolls out the new version)."""
    name = manifest["metadata"]["name"]
    api = cluster.custom
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


def _remember_previous(
    record_path: Path, current: dict[str, Any] | None, manifest: dict[str, Any]
) -> dict[str, Any] | None:
    """What served before this run (None: nothing), saved to ``record_path`` before the apply; return it.

    That is ``current``, unless ``current`` carries this run's id and the spec an earlier attempt of this run
    recorded there: that attempt applied it and died before it could put back what it replaced (a killed pod
    runs no handler), so the service as it is now is this run's spec, perhaps a broken one, and what it
    replaced is the one the record keeps."""
    record = _read_record(record_path)
    earlier = (
        record is not None
        and current is not None
        and _annotation(current, RUN_ANNOTATION) == manifest["metadata"]["annotations"][RUN_ANNOTATION]
        and _annotation(current, SPEC_ANNOTATION) == record["spec_sha256"]
    )
    previous = record["previous"] if earlier else _restorable(current)
    write_json(record_path, {"spec_sha256": manifest["metadata"]["annotations"][SPEC_ANNOTATION], "previous": previous})
    return previous


def _read_record(path: Path) -> dict[str, Any] | None:
    """The record ``_remember_previous`` wrote, None when there is none."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if isinstance(record, dict) and isinstance(record["spec_sha256"], str) and "previous" in record:
            return record
    except (ValueError, KeyError):
        pass
    raise UserError(
        f"{path} is not the record of the replaced InferenceService this step writes (JSON with spec_sha256 and "
        "previous), so the step cannot tell what served before this run. Check that the InferenceService serves "
        "what it should (oc get isvc -o yaml), move that file away, and run the step again."
    )


def _restorable(service: dict[str, Any] | None) -> dict[str, Any] | None:
    """What putting ``service`` back needs, as an object oc apply takes: its spec, labels and annotations (not
    its resourceVersion or status, which are stale by the time it is put back)."""
    if service is None:
        return None
    metadata = service["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": metadata.get("labels") or {},
            "annotations": metadata.get("annotations") or {},
        },
        "spec": service["spec"],
    }


class NotReady(UserError):
    """The applied spec was not served in time; the message says what the cluster showed."""


def wait_until_ready(
    cluster: Cluster, manifest: dict[str, Any], timeout_s: float, out: TextIO = sys.stdout
) -> dict[str, Any]:
    """Poll the InferenceService of ``manifest`` until KServe serves its spec; print its events meanwhile.

    Served means its Ready condition is True and every ready predictor pod carries the spec's SPEC_ANNOTATION
    (at least one does). Ready alone is not enough after a replace: KServe keeps reporting the pods of the
    previous spec as Ready while the new ones fail to start."""
    name, marker = manifest["metadata"]["name"], manifest["metadata"]["annotations"][SPEC_ANNOTATION]
    events = EventLog(cluster, out)
    deadline = time.monotonic() + timeout_s
    while True:
        service = _get(cluster, name)
        if service is None:
            raise UserError(
                f"The InferenceService {name} in namespace {cluster.namespace} was deleted while the step waited "
                "for it to become Ready; run the step again to create it."
            )
        conditions = {c.get("type"): c for c in (service.get("status") or {}).get("conditions") or []}
        pods = _pods(cluster, name)
        ours, others = _ready_pods(pods, marker)
        ready = conditions.get("Ready", {}).get("status") == "True"
        if ready and ours and not others:
            return service
        _poll_events(cluster, events, name, pods)
        if time.monotonic() >= deadline:
            stale = (
                f" KServe reports Ready, but for the pods of the spec before: none of its ready pods carries "
                f"{SPEC_ANNOTATION}={marker[:12]}... of the spec applied."
                if ready and not ours
                else ""
            )
            raise NotReady(
                f"The InferenceService {name} in namespace {cluster.namespace} was not Ready after {timeout_s:.0f} s "
                f"(serving_timeout_s) with the spec this run applied. Its conditions: "
                f"{_conditions_text(conditions)}.{stale} Its events and its pods': "
                f"{'; '.join(_all_events(events)) or 'none could be read'}."
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
    """What a replace must carry over from the stored object: its version, and KServe's finalizer (dropping it
    would let a deletion skip KServe's cleanup)."""
    finalizers = metadata.get("finalizers")
    return {"resourceVersion": metadata["resourceVersion"], **({"finalizers": finalizers} if finalizers else {})}


def _get(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The InferenceService ``name`` as stored, None when there is none."""
    try:
        return cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as error:
        if error.status == 404 and "could not find the requested resource" not in error_message(error).lower():
            return None
        raise _problem(error, "get inferenceservices", cluster) from None


def _refuse_unless_ours(current: dict[str, Any], manifest: dict[str, Any], namespace: str) -> None:
    """Fail, touching nothing, unless ``current`` carries the ownership labels ``manifest`` carries.

    A service of ours made before services carried these labels had another name (the name now ends with the
    model's hash), so it is never met here; one that lacks them is treated as someone else's."""
    name = current["metadata"]["name"]
    labels = current["metadata"].get("labels") or {}
    ours = manifest["metadata"]["labels"]
    fix_labels = f"{MANAGED_BY_LABEL}={MANAGER} {MODEL_LABEL}={ours[MODEL_LABEL]}"
    if labels.get(MANAGED_BY_LABEL) != MANAGER:
        raise UserError(
            f"An InferenceService named {name} already exists in namespace {namespace}, and this pipeline did not "
            f"create it: it lacks the label {MANAGED_BY_LABEL}={MANAGER}. The step leaves it untouched rather than "
            "take over what it serves. Set model_name to another name (the service's name follows it), or, if it "
            f"is this model's service, delete it (oc delete isvc {name} -n {namespace}) or label it as this "
            f"pipeline's: oc label isvc {name} -n {namespace} {fix_labels}."
        )
    if labels.get(MODEL_LABEL) != ours[MODEL_LABEL]:
        other = (current["metadata"].get("annotations") or {}).get(MODEL_NAME_ANNOTATION, "unknown")
        raise UserError(
            f"The InferenceService {name} in namespace {namespace} was created by this pipeline for another model "
            f"(model_name {other!r}; its label {MODEL_LABEL} is {labels.get(MODEL_LABEL)!r}, not "
            f"{ours[MODEL_LABEL]!r}). The step leaves it untouched. Set model_name to another name, or delete "
            f"that service if it is no longer needed (oc delete isvc {name} -n {namespace})."
        )


def _undo(cluster: Cluster, previous: dict[str, Any] | None, manifest: dict[str, Any]) -> str:
    """Put back what served before this run, if anything; say what was done, in sentences ending the message."""
    if previous is None:
        return _left_in_place(cluster, manifest)
    if _annotation(previous, SPEC_ANNOTATION) == manifest["metadata"]["annotations"][SPEC_ANNOTATION]:
        return (
            f"It had this same spec before this run applied it (run {_annotation(previous, RUN_ANNOTATION)}'s), so "
            f"there is no other spec to put back. See why it failed with oc describe isvc "
            f"{manifest['metadata']['name']} -n {cluster.namespace}."
        )
    before = f"run {_annotation(previous, RUN_ANNOTATION)}'s, {_model_source(previous)}"
    try:
        return _restore(cluster, previous, manifest, before)
    except (ApiException, UserError) as error:  # UserError: the retrying client's, after its last try
        reason = error_message(error) if isinstance(error, ApiException) else str(error)
        return (
            f"Putting back the spec it replaced ({before}) failed too ({reason}), so it keeps the spec this run "
            f"applied. {_by_hand(cluster, manifest)}"
        )


def _restore(cluster: Cluster, previous: dict[str, Any], manifest: dict[str, Any], before: str) -> str:
    """Put ``previous``'s spec, labels and annotations back on the service, unless it was deleted or someone else
    changed it meanwhile; say what was done."""
    name, namespace = manifest["metadata"]["name"], cluster.namespace
    current = _get(cluster, name)
    if current is None:
        return (
            f"It was deleted meanwhile, so the spec it replaced ({before}) was not put back. "
            f"{_by_hand(cluster, manifest)}"
        )
    if _annotation(current, SPEC_ANNOTATION) != manifest["metadata"]["annotations"][SPEC_ANNOTATION]:
        return (
            f"Its spec was changed by someone else meanwhile, so the step left it as it is rather than put back "
            f"the spec it replaced ({before})."
        )
    restored = _restorable(previous)
    restored["metadata"].update(name=name, namespace=namespace, **_kept(current["metadata"]))
    cluster.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, restored, _request_timeout=REQUEST_TIMEOUT
    )
    return (
        f"The spec it replaced ({before}) was put back, so KServe returns to the pods that served before; the "
        f"version of this run is not served. See why it failed with oc describe isvc {name} -n {namespace}."
    )


def _by_hand(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """How to put the replaced service back without the step: from the record saved before the apply."""
    run = manifest["metadata"]["annotations"][RUN_ANNOTATION]
    return (
        f'Put it back by hand from runs/{run}/serve/{PREVIOUS_SERVICE} of the workspace, whose "previous" is '
        f"the service as it was: jq .previous {PREVIOUS_SERVICE} | oc apply -n {cluster.namespace} -f -."
    )


def _left_in_place(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """What is said of a service this run created that never became Ready: it is kept to look at."""
    name, namespace = manifest["metadata"]["name"], cluster.namespace
    return (
        f"This run created it (nothing served under that name before), so it is left in place to look at: "
        f"oc describe isvc {name} -n {namespace}. The next run of this model replaces it; oc delete isvc {name} "
        f"-n {namespace} removes it."
    )


def _annotation(service: dict[str, Any], key: str) -> str:
    return (service["metadata"].get("annotations") or {}).get(key, "unknown")


def _model_source(service: dict[str, Any]) -> str:
    """Where the service's model comes from: its storageUri, or its data connection's path."""
    model = ((service.get("spec") or {}).get("predictor") or {}).get("model") or {}
    storage = model.get("storage") or {}
    return model.get("storageUri") or (f"s3 path {storage.get('path')}" if storage else "an unknown model")


def _pods(cluster: Cluster, name: str) -> list[Any]:
    """The predictor pods KServe runs for the InferenceService ``name``."""
    try:
        return cluster.core.list_namespaced_pod(
            cluster.namespace, label_selector=f"{ISVC_LABEL}={name}", _request_timeout=REQUEST_TIMEOUT
        ).items
    except ApiException as error:
        raise _problem(error, "list pods", cluster) from None


def _ready_pods(pods: list[Any], marker: str) -> tuple[list[Any], list[Any]]:
    """The ready, not terminating, pods that run the spec ``marker`` names, and those that run another."""
    ready = [
        pod
        for pod in pods
        if not pod.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
    ]
    ours = [pod for pod in ready if (pod.metadata.annotations or {}).get(SPEC_ANNOTATION) == marker]
    return ours, [pod for pod in ready if pod not in ours]


def _problem(error: ApiException, action: str, cluster: Cluster) -> UserError:
    if error.status == 404 and "could not find the requested resource" in error_message(error).lower():
        return UserError(
            f"The cluster has no InferenceService API ({GROUP}/{VERSION}): KServe is not installed, or the "
            "namespace is not enabled for model serving (OpenShift AI: enable single-model serving)."
        )
    return api_problem(error, action, cluster) or UserError(
        f"The Kubernetes API refused to {action}: {error_message(error)}"
    )


def _poll_events(cluster: Cluster, events: EventLog, name: str, pods: list[Any]) -> None:
    events.poll(f"involvedObject.name={name}", f"InferenceService {name}")
    for pod in pods:
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
