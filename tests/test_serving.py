"""The serving handoff: the InferenceService validated against KServe's CRD, and a deployment tried end to end.

The deployment runs against the fake Kubernetes API (tests/fake_kube.py), playing
KServe's part: for each spec applied, a ready predictor pod carrying the spec's
annotations (as KServe copies them onto its pods), and in the InferenceService's
status the URL of a real OpenAI-compatible server on 127.0.0.1 (llama.cpp's,
from llama-cpp-python's server extra, serving the bundled SmolLM2 GGUF) and its
Ready condition. The step then asks that server a real chat question. As the API
server does, a replace keeps the stored status: a spec KServe never starts keeps
the previous spec's Ready, which the step must not take for its own.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pytest
import requests
import yaml
from conftest import REPO_ROOT
from crd_schemas import schema_errors
from fake_kube import DROP, FakeKube
from fake_model_registry import FakeModelRegistry
from test_registry import TOKEN, stored_run
from test_train_cluster import assert_granted_by_rbac

from common import kube
from common.errors import UserError
from common.kube import API_RETRIES
from common.records import Served, StoredCopies, StoredCopy
from components.champion.record import completed_at
from components.local_model import bundled_gguf
from components.register.options import RegistryOptions
from components.register.stage import TOKEN_ENV, register
from components.serve import deploy
from components.serve.manifest import (
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    SPEC_ANNOTATION,
    render_inference_service,
    service_name,
)
from components.serve.options import ServingOptions, option_problems
from components.serve.stage import serve

pytestmark = pytest.mark.waits  # on readiness timeouts and the fake cluster's answers
ISVC_CRD = "serving.kserve.io_inferenceservices.yaml"
S3_SECRET = "aws-connection-models"
PULL_SECRET = "oci-pull-models"  # model_oci_pull_secret: what KServe's pods pull the modelcar with
OCI = StoredCopy("oci://quay.io/team/smol-ft:run-1", files=3, total_bytes=9, digest="sha256:" + "c" * 64)
# The registry the stored records of the deploy tests name: nothing listens there, so the pull check cannot ask it
# and only warns, as in a pod that cannot reach the registry its node pulls from (quay.io would refuse the made-up
# image, and no test may depend on the network). The pull check's own tests use a real registry.
NOWHERE = "127.0.0.1:9"
S3 = StoredCopy("s3://models/team/smol-ft/run-1/", files=3, total_bytes=9)


@pytest.fixture(scope="module")
def chat_server():
    """llama.cpp's OpenAI-compatible server on 127.0.0.1, serving the bundled SmolLM2 GGUF: its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_gguf()), "--model_alias", "smol-ft"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/v1/models", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError("llama.cpp's server did not start")
        time.sleep(0.5)
    yield url
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture(autouse=True)
def stored_on_a_registry_out_of_reach(monkeypatch):
    import test_registry

    monkeypatch.setattr(test_registry, "OCI_URI", f"oci://{NOWHERE}/team/smol-ft:run-1")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    fake = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr(deploy, "POLL_SECONDS", 0.1)
    yield fake
    fake.stop()


@contextlib.contextmanager
def play_kserve(fake: FakeKube, url: str, starts: Callable[[dict[str, Any]], bool] = lambda service: True):
    """KServe's part, while the block runs: each spec applied that ``starts`` accepts gets a ready predictor pod
    carrying the InferenceService's annotations (the pods of an earlier spec go, as a finished rollout scales
    the old ReplicaSet down), and the service its URLs and Ready. A spec ``starts`` refuses never gets a ready
    pod: its rollout hangs, and the old pods keep serving."""
    stop = threading.Event()

    def script():
        started = set()
        while not stop.is_set():
            with fake.changed:
                services = copy.deepcopy(list(fake.objects.get("inferenceservices", {}).values()))
            for service in services:
                name, annotations = service["metadata"]["name"], service["metadata"].get("annotations") or {}
                marker = annotations.get(SPEC_ANNOTATION, "")
                if (name, marker) in started or not starts(service):
                    continue
                started.add((name, marker))
                pod = f"{name}-predictor-{marker[:8]}"
                if pod not in fake.objects.get("pods", {}):
                    fake.add_pod(pod, {deploy.ISVC_LABEL: name}, "kserve-container", annotations=annotations)
                    fake.make_pod_ready(pod)
                for old in [p for p in list(fake.objects.get("pods", {})) if p.startswith(f"{name}-predictor-")]:
                    if old != pod:
                        fake.delete_pod(old)
                fake.set_status("inferenceservices", name, url=f"http://{name}.example", address={"url": url})
                fake.set_condition("inferenceservices", name, "Ready", "", "")
            time.sleep(0.05)

    thread = threading.Thread(target=script, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.mark.parametrize("copies", [[S3, OCI], [S3]], ids=["modelcar", "s3"])
def test_the_inference_service_is_valid_for_kserves_crd(copies):
    service = render_inference_service("smol-ft", "ml-team", "run-1", copies, ServingOptions(), S3_SECRET)
    assert schema_errors(service, ISVC_CRD) == []
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "vLLM"} and model["runtime"] == "vllm-cuda-runtime"
    assert model["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    if OCI in copies:  # the modelcar by its digest; no pull Secret named: anonymously
        assert model["storageUri"] == f"oci://quay.io/team/smol-ft@{OCI.digest}" and "storage" not in model
        assert "imagePullSecrets" not in service["spec"]["predictor"]
    else:  # the S3 copy, through the data connection
        assert model["storage"] == {"key": "aws-connection-models", "path": "team/smol-ft/run-1/"}
    cpu = render_inference_service("smol-ft", "ml-team", "run-1", copies, ServingOptions(gpus=0), S3_SECRET)
    assert schema_errors(cpu, ISVC_CRD) == [] and "nvidia.com/gpu" not in json.dumps(cpu)


@pytest.mark.parametrize("pull_secret", ["", PULL_SECRET])
def test_the_service_pulls_with_the_pull_secret_and_never_names_the_push_secret(pull_secret):
    """The pods pull the modelcar with model_oci_pull_secret, or with none; the store step's push Secret
    (model_oci_secret, whose credential can overwrite the model's images) is in no InferenceService."""
    options = ServingOptions(pull_secret=pull_secret)
    service = render_inference_service("smol-ft", "ml-team", "run-1", [S3, OCI], options, S3_SECRET)
    assert schema_errors(service, ISVC_CRD) == []
    assert service["spec"]["predictor"].get("imagePullSecrets") == ([{"name": pull_secret}] if pull_secret else None)
    assert "oci-connection-models" not in json.dumps(service)


def test_the_crd_check_catches_a_misspelled_field():
    """The negative control: the closed CRD schema refuses what KServe would prune silently."""
    service = render_inference_service("smol-ft", "ml-team", "run-1", [S3], ServingOptions(), S3_SECRET)
    service["spec"]["predictor"]["model"]["storageURI"] = "oci://x"
    assert schema_errors(service, ISVC_CRD)


DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # KServe's rule for InferenceService names
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_service_names_fit_kubernetes_and_kserve():
    names = ["SmolLM2-135M-Instruct-ft", "my_model.v2", "x" * 80, "7b-chat", "9", "a" * 34 + "-" + "b" * 40]
    for model_name in names:
        name = service_name(model_name)
        assert DNS_1035_LABEL.match(name) and len(name) <= 45, name
    assert service_name("SmolLM2-135M-Instruct-ft").startswith("smollm2-135m-instruct-ft-")  # still readable
    assert service_name("7b-chat").startswith("model-7b-chat-")  # a letter first, as DNS-1035 wants
    assert service_name("smol-ft") == service_name("smol-ft")  # one service per model, run after run


@pytest.mark.parametrize(
    "names",
    [
        ("my_model", "my.model", "my-model", "My-Model", "my__model"),  # collapsed to my-model before
        ("x" * 45 + "-a", "x" * 45 + "-b"),  # cut to the same 45 characters before
    ],
)
def test_models_whose_names_collapsed_to_one_service_name_get_their_own(names):
    assert len({service_name(name) for name in names}) == len(names)


def test_every_service_carries_the_labels_that_say_it_is_ours():
    service = render_inference_service("my_model", "ml-team", "run-1", [S3, OCI], ServingOptions(), S3_SECRET)
    labels = service["metadata"]["labels"]
    assert labels[MANAGED_BY_LABEL] == "llm-finetune-pipeline"
    other = render_inference_service("my.model", "ml-team", "run-1", [S3, OCI], ServingOptions(), S3_SECRET)
    assert labels[MODEL_LABEL] != other["metadata"]["labels"][MODEL_LABEL]  # names the model, not the prefix
    assert all(LABEL_VALUE.match(value) and len(value) <= 63 for value in labels.values())
    assert service["metadata"]["annotations"]["llm-finetune-pipeline/model-name"] == "my_model"


def test_an_image_without_a_digest_is_not_served_by_its_tag():
    """The store record of an older push without a digest: the tag could be moved, so it is refused."""
    for digest in ("", "sha256:short", None):
        tagged = dataclasses.replace(OCI, digest=digest)
        with pytest.raises(UserError, match=r"no sha256 digest for the image oci://quay.io/team/smol-ft:run-1"):
            render_inference_service("smol-ft", "ml-team", "run-1", [tagged], ServingOptions(), S3_SECRET)


def test_without_deploy_the_manifest_is_written_for_oc_apply(tmp_path):
    stored_run(tmp_path)
    assert serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(), S3_SECRET, RegistryOptions()) is None
    written = yaml.safe_load((tmp_path / "runs" / "run-1" / "serve" / "inferenceservice.yaml").read_text())
    assert written["spec"]["predictor"]["model"]["storageUri"] == f"oci://{NOWHERE}/team/smol-ft@sha256:" + "c" * 64
    assert schema_errors(written, ISVC_CRD) == []


def test_a_version_vllm_cannot_load_is_not_deployed(tmp_path):
    stored_run(tmp_path)
    (tmp_path / "runs" / "run-1" / "publish" / "upload" / "config.json").unlink()
    assert serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(), S3_SECRET, RegistryOptions()) is None
    assert not (tmp_path / "runs" / "run-1" / "serve" / "inferenceservice.yaml").exists()
    with pytest.raises(UserError, match="no merged checkpoint.*publish_merged to true"):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    StoredCopies().write(tmp_path / "runs" / "run-1" / "store" / "stored.json")
    with pytest.raises(UserError, match="set model_oci_uri or model_s3_uri"):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())


NAME = service_name("smol-ft")


def test_deploy_waits_for_ready_asks_a_question_and_records_the_answer(tmp_path, cluster, chat_server, monkeypatch):
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with FakeModelRegistry(token=TOKEN) as registry, play_kserve(cluster, chat_server):
        options = RegistryOptions(url=registry.url)
        register(str(tmp_path), "run-1", "smol-ft", options, S3_SECRET, "")
        served = serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, options)
        again = serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, options)
        (version,) = registry.model_versions.values()
        assert registry.violations == []
    assert (served.name, served.namespace, served.endpoint, served.model) == (
        NAME, "ml-team", chat_server, "smol-ft"
    )  # fmt: skip
    assert served.question == "How many cups in a gallon?" and served.answer.strip()  # a real model's answer
    assert list(cluster.objects["inferenceservices"]) == [NAME] and again.endpoint == served.endpoint
    assert [r.method for r in cluster.requests_matching("PUT", f"inferenceservices/{NAME}")] == ["PUT"]
    assert_granted_by_rbac(cluster.requests)
    stored = cluster.objects["inferenceservices"][NAME]
    assert stored["spec"]["predictor"]["model"]["storageUri"] == f"oci://{NOWHERE}/team/smol-ft@{OCI.digest}"
    assert stored["metadata"]["labels"][MANAGED_BY_LABEL] == "llm-finetune-pipeline"
    record = Served.read(tmp_path / "runs" / "run-1" / "serve" / "served.json")
    assert record == again and record.endpoint == chat_server
    properties = version["customProperties"]
    assert properties["serving_endpoint"]["string_value"] == chat_server
    assert properties["serving_answer"]["string_value"] == again.answer
    assert properties["pipeline_run_id"]["string_value"] == "run-1"  # the registration's own properties are kept


def test_a_new_service_that_never_gets_ready_fails_with_its_conditions_and_events(tmp_path, cluster):
    """Nothing served under its name before: it is left in place to look at, and the message says so."""
    stored_run(tmp_path)

    def script():
        cluster.wait_for("inferenceservices")
        cluster.set_status(
            "inferenceservices", NAME,
            conditions=[{"type": "Ready", "status": "False", "reason": "RevisionMissing", "message": "no pods"}],
        )  # fmt: skip
        cluster.add_event("InferenceService", NAME, "InternalError", "fails to pull the modelcar")

    threading.Thread(target=script, daemon=True).start()
    with pytest.raises(UserError) as failed:
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True, timeout_s=2), S3_SECRET, RegistryOptions())
    message = str(failed.value)
    assert (
        "was not Ready after 2 s (serving_timeout_s)" in message and "Ready=False (RevisionMissing: no pods)" in message
    )
    assert "fails to pull the modelcar" in message and f"oc describe isvc {NAME} -n ml-team" in message
    assert "This run created it" in message and "left in place" in message
    assert list(cluster.objects["inferenceservices"]) == [NAME]


def second_run(workspace, digest: str) -> None:
    """Run run-2 of the same model, stored as another image: run-1's folders with another store record."""
    shutil.copytree(workspace / "runs" / "run-1", workspace / "runs" / "run-2")
    record = workspace / "runs" / "run-2" / "store" / "stored.json"
    copies = [
        dataclasses.replace(copy_, uri=f"oci://{NOWHERE}/team/smol-ft:run-2", digest=digest)
        if copy_.scheme == "oci"
        else copy_
        for copy_ in StoredCopies.read(record).copies
    ]
    StoredCopies(tuple(copies)).write(record)


def test_a_new_version_that_never_gets_ready_gives_the_service_its_previous_spec_back(tmp_path, cluster, chat_server):
    """run-2's image never starts: KServe keeps reporting Ready for run-1's pods (the replace keeps the status),
    which the step does not take for run-2's; at the timeout run-1's spec is put back."""
    stored_run(tmp_path)
    new_digest = "sha256:" + "d" * 64
    second_run(tmp_path, new_digest)

    def starts(service: dict[str, Any]) -> bool:  # KServe cannot start run-2's image
        return new_digest not in json.dumps(service["spec"])

    with play_kserve(cluster, chat_server, starts=starts):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
        before = copy.deepcopy(cluster.objects["inferenceservices"][NAME])
        with pytest.raises(UserError) as failed:
            options = ServingOptions(deploy=True, timeout_s=2)
            serve(str(tmp_path), "run-2", "smol-ft", options, S3_SECRET, RegistryOptions())
    message = str(failed.value)
    assert "was not Ready after 2 s (serving_timeout_s) with the spec this run applied" in message
    assert "KServe reports Ready, but for the pods of the spec before" in message
    assert f"The spec it replaced (run run-1's, oci://{NOWHERE}/team/smol-ft@{OCI.digest}) was put back" in message
    after = cluster.objects["inferenceservices"][NAME]
    assert after["spec"] == before["spec"] and after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    puts = cluster.requests_matching("PUT", f"inferenceservices/{NAME}")
    assert len(puts) == 2  # run-2's spec, then run-1's back
    assert schema_errors({k: after[k] for k in ("apiVersion", "kind", "metadata", "spec")}, ISVC_CRD) == []
    assert_granted_by_rbac(cluster.requests)


def rolled_back(cluster: FakeKube, before: dict[str, Any], message: str) -> None:
    """run-1's spec, labels and annotations are back (valid for KServe's CRD), and the message says so."""
    assert f"The spec it replaced (run run-1's, oci://{NOWHERE}/team/smol-ft@{OCI.digest}) was put back" in message
    after = cluster.objects["inferenceservices"][NAME]
    for part in ("labels", "annotations"):
        assert after["metadata"][part] == before["metadata"][part], part
    assert after["spec"] == before["spec"]
    assert schema_errors({k: after[k] for k in ("apiVersion", "kind", "metadata", "spec")}, ISVC_CRD) == []


def previous_record(workspace, run_id: str = "run-2") -> dict[str, Any]:
    """The record of what run ``run_id``'s rollout replaced, checked against KServe's CRD (None: nothing)."""
    record = json.loads((workspace / "runs" / run_id / "serve" / "previous.json").read_text())
    assert record["previous"] is None or schema_errors(record["previous"], ISVC_CRD) == []
    return record


def test_an_api_server_lost_while_waiting_gives_the_service_its_previous_spec_back(
    tmp_path, cluster, chat_server, quick_api_retries
):
    """After run-2's spec is applied, the API server stops answering beyond the client's retries: the step fails
    with the client's paragraph, and run-1's spec is put back once the API server answers again."""
    stored_run(tmp_path)
    second_run(tmp_path, "sha256:" + "d" * 64)

    def lose_the_api_server():
        cluster.wait_for_request("PUT", f"inferenceservices/{NAME}")
        cluster.fail_next(*[DROP] * (API_RETRIES + 1))

    with play_kserve(cluster, chat_server, starts=lambda service: "d" * 64 not in json.dumps(service["spec"])):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
        before = copy.deepcopy(cluster.objects["inferenceservices"][NAME])
        threading.Thread(target=lose_the_api_server, daemon=True).start()
        with pytest.raises(UserError) as failed:
            options = ServingOptions(deploy=True, timeout_s=120)
            serve(str(tmp_path), "run-2", "smol-ft", options, S3_SECRET, RegistryOptions())
    message = str(failed.value)
    assert "did not answer GET /api" in message and f"after {API_RETRIES + 1} tries" in message
    assert len(cluster.failed) == API_RETRIES + 1
    rolled_back(cluster, before, message)
    assert previous_record(tmp_path)["previous"]["spec"] == before["spec"]
    assert completed_at(str(tmp_path), "run-2", "serve") is None


def test_a_version_that_does_not_answer_the_question_gives_the_service_its_previous_spec_back(
    tmp_path, cluster, chat_server
):
    """run-2's pods get Ready, but its OpenAI-compatible API does not answer: the smoke test fails the rollout,
    and run-1's spec is put back."""
    stored_run(tmp_path)
    second_run(tmp_path, "sha256:" + "d" * 64)
    with play_kserve(cluster, chat_server):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    before = copy.deepcopy(cluster.objects["inferenceservices"][NAME])
    with play_kserve(cluster, f"http://{NOWHERE}"), pytest.raises(UserError) as failed:
        serve(str(tmp_path), "run-2", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    message = str(failed.value)
    assert f"is Ready, but its OpenAI-compatible API at http://{NOWHERE} did not answer a chat completion" in message
    rolled_back(cluster, before, message)


def test_an_interrupted_rollout_gives_the_service_its_previous_spec_back(tmp_path, cluster, chat_server, monkeypatch):
    """Any exception after the apply, not only the step's own errors: it goes on unchanged once the spec is back."""
    from components.serve import stage

    stored_run(tmp_path)
    second_run(tmp_path, "sha256:" + "d" * 64)
    with play_kserve(cluster, chat_server):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
        before = copy.deepcopy(cluster.objects["inferenceservices"][NAME])

        def interrupted(service, question):
            raise KeyboardInterrupt

        monkeypatch.setattr(stage, "smoke_test", interrupted)
        with pytest.raises(KeyboardInterrupt):
            serve(str(tmp_path), "run-2", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    after = cluster.objects["inferenceservices"][NAME]
    assert after["spec"] == before["spec"] and after["metadata"]["annotations"] == before["metadata"]["annotations"]


def test_the_retry_of_a_killed_rollout_puts_back_the_spec_before_the_run_not_the_killed_tries(
    tmp_path, cluster, chat_server
):
    """The serve step of run-2 is killed (SIGKILL: no handler runs) while it waits for run-2's spec, which never
    starts: the service is left with run-2's spec. The retried step reads that service, carrying run-2's spec,
    but puts back run-1's, which the killed try saved before its apply, when its own rollout fails."""
    stored_run(tmp_path)
    new_digest = "sha256:" + "d" * 64
    second_run(tmp_path, new_digest)
    with play_kserve(cluster, chat_server, starts=lambda service: new_digest not in json.dumps(service["spec"])):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
        before = copy.deepcopy(cluster.objects["inferenceservices"][NAME])
        command = [sys.executable, "-m", "components.serve.stage", "--workspace-root", str(tmp_path)]
        command += ["--run-id", "run-2", "--model-name", "smol-ft", "--deploy"]
        killed = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            cluster.wait_for_request("PUT", f"inferenceservices/{NAME}", timeout=120)
        finally:
            killed.kill()
            killed.wait(timeout=30)
        assert new_digest in json.dumps(cluster.objects["inferenceservices"][NAME]["spec"])  # left broken
        assert previous_record(tmp_path)["previous"]["spec"] == before["spec"]
        with pytest.raises(UserError) as failed:
            options = ServingOptions(deploy=True, timeout_s=2)
            serve(str(tmp_path), "run-2", "smol-ft", options, S3_SECRET, RegistryOptions())
    message = str(failed.value)
    assert "was not Ready after 2 s (serving_timeout_s) with the spec this run applied" in message
    rolled_back(cluster, before, message)
    record = previous_record(tmp_path)  # kept for a further retry
    assert record["previous"]["spec"] == before["spec"]
    applied = yaml.safe_load((tmp_path / "runs" / "run-2" / "serve" / "inferenceservice.yaml").read_text())
    assert record["spec_sha256"] == applied["metadata"]["annotations"][SPEC_ANNOTATION]


def test_the_retry_of_a_killed_try_that_created_the_service_leaves_it_in_place(tmp_path, cluster):
    """Nothing served under the name before the killed try created it (its record says none): the retry, which
    finds the service carrying this run's spec, has nothing to put back and leaves it in place, saying so."""
    stored_run(tmp_path)
    killed = subprocess.Popen(
        [sys.executable, "-m", "components.serve.stage", "--workspace-root", str(tmp_path), "--run-id", "run-1",
         "--model-name", "smol-ft", "--deploy"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        cluster.wait_for_request("POST", deploy.PLURAL, timeout=120)
    finally:
        killed.kill()
        killed.wait(timeout=30)
    assert previous_record(tmp_path, "run-1")["previous"] is None
    with pytest.raises(UserError) as failed:
        options = ServingOptions(deploy=True, timeout_s=2)
        serve(str(tmp_path), "run-1", "smol-ft", options, S3_SECRET, RegistryOptions())
    assert "This run created it" in str(failed.value) and "left in place" in str(failed.value)
    assert list(cluster.objects["inferenceservices"]) == [NAME]
    assert len(cluster.requests_matching("PUT", f"inferenceservices/{NAME}")) == 1  # the retry's apply, no restore


def foreign_service(cluster: FakeKube, labels: dict[str, str]) -> dict[str, Any]:
    """An InferenceService someone else made, under the name the step would use."""
    service = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": "ml-team", "labels": labels},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "vLLM"}, "storageUri": "oci://other/team:v7"}}},
    }
    code, created = cluster._create("serving.kserve.io/v1beta1", "inferenceservices", {}, service)  # as a POST
    assert code == 201
    return created


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, "this pipeline did not create it: it lacks the label app.kubernetes.io/managed-by=llm-finetune-pipeline"),
        ({"app.kubernetes.io/part-of": "llm-finetune-pipeline"}, "lacks the label app.kubernetes.io/managed-by"),
        (
            {MANAGED_BY_LABEL: "llm-finetune-pipeline", MODEL_LABEL: "0" * 40},
            "was created by this pipeline for another model",
        ),
    ],
    ids=["foreign", "part-of-only", "another-model"],
)
def test_a_service_of_that_name_that_is_not_ours_is_left_untouched(tmp_path, cluster, labels, expected):
    stored_run(tmp_path)
    existing = foreign_service(cluster, labels)
    with pytest.raises(UserError) as refused:
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    message = str(refused.value)
    assert expected in message and NAME in message and "leaves it untouched" in message
    assert "model_name" in message and f"oc delete isvc {NAME} -n ml-team" in message  # the fix
    assert cluster.objects["inferenceservices"][NAME] == existing  # not a field changed
    assert [r.method for r in cluster.requests if "inferenceservices" in r.path] == ["GET"]  # read, nothing else


def test_a_foreign_service_can_be_adopted_with_the_label_the_message_gives(tmp_path, cluster, chat_server):
    """The message's fix works: labelled as it says, the service is the model's and is updated."""
    stored_run(tmp_path)
    foreign_service(cluster, {})
    with pytest.raises(UserError) as refused:
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    command = re.search(r"oc label isvc \S+ -n ml-team (.*)\.$", str(refused.value)).group(1)
    with cluster.changed:
        labels = cluster.objects["inferenceservices"][NAME]["metadata"]["labels"]
        labels.update(pair.split("=", 1) for pair in command.split())
    with play_kserve(cluster, chat_server):
        served = serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    assert served.name == NAME


def test_the_deployed_image_is_the_manifest_the_store_step_pushed_and_pulls_with_the_pull_secret(
    tmp_path, cluster, chat_server, oci_registry, monkeypatch, capsys
):
    """Against the real registry: the store step pushes the modelcar with the push credentials; the serve step
    reads it back with the pull Secret's credential alone (the push credentials are gone from its environment),
    then deploys it by the digest of the manifest pushed, which is the manifest the registry serves for the tag
    and for that digest, with the pull Secret as the service's only pull secret."""
    from components.serve.pull_check import PULL_AUTH_FILE_ENV
    from components.store.oci_target import AUTH_FILE_ENV, MANIFEST_FILE
    from components.store.options import StorageOptions
    from components.store.stage import store
    from tests.oci_registry import PULL_PASSWORD, PULL_USER, require

    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file))
    stored_run(tmp_path)
    (image,) = store(
        str(tmp_path), "run-1", "smol-ft", StorageOptions(oci_uri=f"oci://{oci_registry.host}/models/smol")
    )
    monkeypatch.delenv(AUTH_FILE_ENV)
    monkeypatch.setenv(PULL_AUTH_FILE_ENV, str(oci_registry.auth_file_with(tmp_path, PULL_USER, PULL_PASSWORD)))
    capsys.readouterr()
    with play_kserve(cluster, chat_server):
        options = ServingOptions(deploy=True, pull_secret=PULL_SECRET)
        serve(str(tmp_path), "run-1", "smol-ft", options, S3_SECRET, RegistryOptions())
    assert f"serves oci://{oci_registry.host}/models/smol@{image.digest} to the credentials of the Secret " in (
        capsys.readouterr().out
    )
    applied = cluster.objects["inferenceservices"][NAME]
    assert applied["spec"]["predictor"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
    assert "oci-connection-models" not in json.dumps(applied)  # the push Secret, named nowhere
    assert schema_errors({k: applied[k] for k in ("apiVersion", "kind", "metadata", "spec")}, ISVC_CRD) == []
    deployed = applied["spec"]["predictor"]["model"]["storageUri"]
    repository, _, digest = deployed.removeprefix("oci://").partition("@")
    assert repository == f"{oci_registry.host}/models/smol" and digest == image.digest
    pushed = (tmp_path / "runs" / "run-1" / "store" / MANIFEST_FILE).read_bytes()
    assert digest == "sha256:" + hashlib.sha256(pushed).hexdigest()
    for reference in (deployed, image.uri):  # the registry holds those bytes under the digest, and the tag
        served = subprocess.run(
            [require("skopeo"), "inspect", "--raw", "--tls-verify=false", "--authfile", str(oci_registry.auth_file),
             "docker://" + reference.removeprefix("oci://")],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        assert served == pushed, reference


def stored_on(workspace, host: str) -> None:
    """run-1, its image recorded in the registry ``host`` (by a digest it does not hold)."""
    stored_run(workspace)
    record = workspace / "runs" / "run-1" / "store" / "stored.json"
    copies = [
        dataclasses.replace(copy_, uri=f"oci://{host}/models/smol:run-1") if copy_.scheme == "oci" else copy_
        for copy_ in StoredCopies.read(record).copies
    ]
    StoredCopies(tuple(copies)).write(record)


@pytest.mark.parametrize(
    ("pull_secret", "pull_password", "expected"),
    [
        ("", None, r"refused an anonymous read of the image oci://{host}/models/smol@sha256:c{{64}} \(HTTP 401"),
        (PULL_SECRET, "wrong-pull-password", r"refused to let the credentials in the Secret 'oci-pull-models'"),
        (PULL_SECRET, "right", r"\(HTTP 404: MANIFEST_UNKNOWN"),  # may read, but the image is not there
        (PULL_SECRET, "unmounted", r"names the Secret 'oci-pull-models', but this step found no .dockerconfigjson"),
    ],
    ids=["no-pull-secret", "wrong-credential", "no-such-image", "secret-not-mounted"],
)
def test_a_pull_the_registry_would_refuse_stops_the_deploy_before_anything_is_applied(
    tmp_path, cluster, oci_registry, monkeypatch, pull_secret, pull_password, expected
):
    """With no pull Secret the registry, which asks for credentials, is asked anonymously, as KServe's pods would
    be, even where the step has the push credentials and a pull credential at hand; a pull Secret is read with its
    own credential. A refusal is one paragraph naming model_oci_pull_secret and the fix, and the InferenceService is
    never sent to the API server."""
    from components.serve.pull_check import PULL_AUTH_FILE_ENV
    from components.store.oci_target import AUTH_FILE_ENV
    from tests.oci_registry import PULL_PASSWORD, PULL_USER

    stored_on(tmp_path, oci_registry.host)
    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file))  # the push credentials: never used to pull
    password = {None: PULL_PASSWORD, "right": PULL_PASSWORD}.get(pull_password, pull_password)
    pull_file = oci_registry.auth_file_with(tmp_path, PULL_USER, password)
    monkeypatch.setenv(PULL_AUTH_FILE_ENV, str(tmp_path / "absent.json" if password == "unmounted" else pull_file))
    options = ServingOptions(deploy=True, pull_secret=pull_secret, timeout_s=2)
    with pytest.raises(UserError) as refused:
        serve(str(tmp_path), "run-1", "smol-ft", options, S3_SECRET, RegistryOptions())
    message = str(refused.value)
    assert re.search(expected.format(host=re.escape(oci_registry.host)), message), message
    assert "model_oci_pull_secret" in message and "Nothing was applied" in message and "\n" not in message
    assert "oc create secret docker-registry" in message  # the fix
    assert not [word for word in ("wrong-pull-password", PULL_PASSWORD) if word in message]
    assert cluster.requests == []  # nothing applied, nothing even read
    assert completed_at(str(tmp_path), "run-1", "serve") is None


@pytest.fixture
def token_registry():
    """A registry on 127.0.0.1 that asks for Bearer tokens, as Quay and the OpenShift registry do: its manifest
    endpoint challenges with a realm on the same server, whose token for ``repository:models/smol:pull`` reads
    the manifest. The token service gives that token for the puller's Basic credentials only (an anonymous client
    gets one that reads nothing). No local registry hands out tokens without an external token service, hence
    this stand-in. Its handler threads are daemons."""
    import base64
    from http.server import BaseHTTPRequestHandler
    from urllib.parse import parse_qs, urlsplit

    from tests.local_server import LocalServer

    good = "Basic " + base64.b64encode(b"puller:pull-pw").decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/token":
                query = parse_qs(parts.query)
                allowed = self.headers.get("Authorization") == good and query["scope"] == [
                    "repository:models/smol:pull"
                ]
                return self._answer(200, {"token": "reads-models-smol" if allowed else "reads-nothing"})
            if self.headers.get("Authorization") == "Bearer reads-models-smol":
                return self._answer(
                    200, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}
                )
            realm = f"http://{self.headers['Host']}/token"
            scope = "repository:models/smol:pull"
            challenge = {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake-registry",scope="{scope}"'}
            self._answer(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}, challenge)

        def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    with LocalServer(Handler) as server:
        yield server.url.removeprefix("http://")


@pytest.mark.parametrize(
    ("pull_secret", "password", "refusal"),
    [
        (PULL_SECRET, "pull-pw", None),
        (PULL_SECRET, "wrong", "refused to let the credentials in the Secret 'oci-pull-models'"),
        ("", None, "refused an anonymous read"),
    ],
    ids=["pull-credential", "wrong-credential", "anonymous"],
)
def test_a_registry_that_hands_out_tokens_is_asked_for_a_pull_token(
    tmp_path, monkeypatch, token_registry, pull_secret, password, refusal
):
    """The check exchanges the pull Secret's credential for a token scoped to pulling the repository, and reads
    the manifest with it; an anonymous client gets a token too, which may read nothing here."""
    import io

    from components.serve.pull_check import PULL_AUTH_FILE_ENV, check_pull
    from tests.oci_registry import write_auth_file

    pull_file = write_auth_file(tmp_path / "pull.json", token_registry, "puller", password or "pull-pw")
    monkeypatch.setenv(PULL_AUTH_FILE_ENV, str(pull_file))
    image = dataclasses.replace(OCI, uri=f"oci://{token_registry}/models/smol:run-1")
    options = ServingOptions(pull_secret=pull_secret)
    service = render_inference_service("smol-ft", "ml-team", "run-1", [image], options, S3_SECRET)
    out = io.StringIO()
    if refusal is None:
        check_pull(service, out)
        assert f"the registry {token_registry} serves oci://{token_registry}/models/smol@" in out.getvalue()
        return
    with pytest.raises(UserError, match=rf"{refusal}.*\(HTTP 401: UNAUTHORIZED authentication required\)"):
        check_pull(service, out)


def test_a_registry_this_pod_cannot_reach_is_a_warning_not_a_refusal(tmp_path, monkeypatch):
    """The node pulls, not this pod: a registry this pod cannot reach (a network policy, a mirror only the nodes
    use) may still serve the kubelet, so the check warns and the deploy goes on."""
    import io

    from components.serve.pull_check import PULL_AUTH_FILE_ENV, check_pull
    from tests.oci_registry import write_auth_file

    monkeypatch.setenv(PULL_AUTH_FILE_ENV, str(write_auth_file(tmp_path / "pull.json", NOWHERE, "puller", "pw")))
    nowhere = dataclasses.replace(OCI, uri=f"oci://{NOWHERE}/team/smol-ft:run-1")
    for options in (ServingOptions(), ServingOptions(pull_secret=PULL_SECRET)):
        service = render_inference_service("smol-ft", "ml-team", "run-1", [nowhere], options, S3_SECRET)
        out = io.StringIO()
        assert check_pull(service, out) is None
        warning = " ".join(out.getvalue().split())
        assert warning.startswith(f"WARNING: could not check that KServe's pods can pull oci://{NOWHERE}/")
        assert "Going on: the node's container runtime pulls the image" in warning and "mirror" in warning


def test_the_pull_secret_is_never_the_push_secret():
    """The first step refuses model_oci_pull_secret naming model_oci_secret, whose credential can push, and a
    name KFP cannot mount."""
    from components.run_form.checks import problems
    from components.run_form.table import RUN_PARAMETERS

    values = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}
    assert problems(values) == []
    values["model_oci_pull_secret"] = values["model_oci_secret"]
    (line,) = problems(values)
    assert line.startswith("parameter 'model_oci_pull_secret' names the Secret 'oci-connection-models', which is ")
    assert "can overwrite the model's images" in line and "read-only (pull) credential" in line
    values["model_oci_pull_secret"] = "pull.secret"
    (line,) = problems(values)
    assert "'pull.secret' is not a Secret name the serve step can mount" in line


def test_missing_rbac_names_the_verb_the_resource_and_the_file(tmp_path, tmp_path_factory, monkeypatch):
    stored_run(tmp_path)
    fake = FakeKube(forbidden={"inferenceservices"}).start()
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with pytest.raises(UserError) as refused:
            serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    finally:
        fake.stop()
    message = str(refused.value)
    assert "may not get inferenceservices in namespace ml-team" in message
    assert 'cannot get resource "inferenceservices"' in message and "pipelines/rbac.yaml" in message


def test_a_cluster_without_kserve_says_so(tmp_path, monkeypatch):
    stored_run(tmp_path)
    served = {group: kinds for group, kinds in FakeKube().served.items() if not group.startswith("serving.")}
    fake = FakeKube(served=served).start()
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with pytest.raises(UserError, match="no InferenceService API.*KServe is not installed"):
            serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    finally:
        fake.stop()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (ServingOptions(runtime="vLLM_Runtime"), "runtime"),
        (ServingOptions(gpus=-1), "gpus"),
        (ServingOptions(memory="16 Gi"), "memory"),
        (ServingOptions(timeout_s=10), "timeout_s"),
        (ServingOptions(pull_secret="oci.pull"), "pull_secret"),  # a Secret name, but not a volume name
    ],
)
def test_bad_serving_options_are_refused(options, field):
    assert set(option_problems(options)) == {field}


@pytest.fixture
def quick_api_retries(monkeypatch):
    """The API retries' backoff in hundredths of a second: the tests count tries, they do not wait for them."""
    monkeypatch.setattr(kube, "RETRY_BACKOFF_S", 0.01)


@pytest.mark.parametrize(
    ("failures", "creates"),
    [((DROP,) * 4, (DROP,)), ((503, 429, DROP, 502), (429,))],
    ids=["dropped-connections", "restarting-api-server"],
)
def test_a_dropped_connection_or_an_overloaded_api_server_is_retried(
    tmp_path, cluster, chat_server, quick_api_retries, failures, creates
):
    """The API server drops the step's first connections (more than urllib3's own three immediate retries of a
    read), or answers that it is unavailable or throttling, and fails the create once: each request is asked
    again, backing off, and the version is deployed and recorded as served."""
    stored_run(tmp_path)
    cluster.fail_next(*creates, method="POST")
    cluster.fail_next(*failures)
    with play_kserve(cluster, chat_server):
        served = serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    assert served.endpoint == chat_server and list(cluster.objects["inferenceservices"]) == [NAME]
    path = f"/apis/serving.kserve.io/v1beta1/namespaces/ml-team/{deploy.PLURAL}"
    expected = [("GET", f"{path}/{NAME}", failure) for failure in failures] + [("POST", path, c) for c in creates]
    assert [(request.method, request.path, failure) for request, failure in cluster.failed] == expected
    assert len(cluster.requests_matching("POST", deploy.PLURAL)) == 1  # the create that got through: one service
    assert completed_at(str(tmp_path), "run-1", "serve")


@pytest.mark.parametrize(
    ("failure", "reason"),
    [(DROP, "Remote end closed connection without response"), (503, "too many 503 error responses")],
    ids=["dropped", "unavailable"],
)
def test_an_api_server_that_stays_unreachable_fails_the_step_in_one_paragraph(
    tmp_path, cluster, quick_api_retries, failure, reason
):
    """After the last try the step stops with one paragraph (no traceback) naming the API server, the call, the
    tries, why, and what to check; nothing was changed, and the version is not recorded as served, so the next run
    on the same data serves it."""
    stored_run(tmp_path)
    cluster.fail_next(*[failure] * (API_RETRIES + 1))
    with pytest.raises(UserError) as failed:
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), S3_SECRET, RegistryOptions())
    message = str(failed.value)
    path = f"/apis/serving.kserve.io/v1beta1/namespaces/ml-team/inferenceservices/{NAME}"
    assert f"The Kubernetes API at {cluster.url} did not answer GET {path} after {API_RETRIES + 1} tries" in message
    assert reason in message and "deploy the InferenceService in the cluster" in message
    assert "oc get --raw /readyz" in message and "leave deploy off" in message and "\n" not in message
    assert len(cluster.failed) == API_RETRIES + 1 and not cluster.objects.get("inferenceservices")
    assert completed_at(str(tmp_path), "run-1", "serve") is None
