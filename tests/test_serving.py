"""The serving handoff: the InferenceService validated against KServe's CRD, and a deployment tried end to end.

The deployment runs against the fake Kubernetes API (tests/fake_kube.py), playing
KServe's part: once the InferenceService is created, its status gets the URL of a
real OpenAI-compatible server on 127.0.0.1 (llama.cpp's, from llama-cpp-python's
server extra, serving the bundled SmolLM2 GGUF) and its Ready condition. The
step then asks that server a real chat question.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
import yaml
from crd_schemas import schema_errors
from fake_kube import FakeKube
from fake_model_registry import FakeModelRegistry
from test_registry import TOKEN, stored_run
from test_train_cluster import assert_granted_by_rbac

from common.atomic import write_json
from common.errors import UserError
from components.local_model import bundled_gguf
from components.registry.options import RegistryOptions
from components.registry.stage import TOKEN_ENV, register
from components.serving import deploy
from components.serving.manifest import render_inference_service, service_name
from components.serving.options import ServingOptions, option_problems
from components.serving.stage import serve

ISVC_CRD = "serving.kserve.io_inferenceservices.yaml"
SECRETS = ("aws-connection-models", "oci-connection-models")
OCI = {"uri": "oci://quay.io/team/smol-ft:run-1", "digest": "sha256:" + "c" * 64, "files": 3, "total_bytes": 9}
S3 = {"uri": "s3://models/team/smol-ft/run-1/", "files": 3, "total_bytes": 9}


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


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    fake = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr(deploy, "POLL_SECONDS", 0.1)
    yield fake
    fake.stop()


def play_kserve(fake: FakeKube, url: str, *, times: int = 1) -> threading.Thread:
    """KServe's part: each time the InferenceService is created or replaced, report its URLs and Ready."""

    def script():
        seen = set()
        while len(seen) < times:
            service = fake.wait_for("inferenceservices")
            version = service["metadata"]["resourceVersion"]
            if service["metadata"]["name"] in fake.objects.get("inferenceservices", {}) and version not in seen:
                if service.get("spec", {}).get("predictor") and "Ready" not in json.dumps(service.get("status")):
                    seen.add(version)
                    name = service["metadata"]["name"]
                    fake.set_status("inferenceservices", name, url=f"http://{name}.example", address={"url": url})
                    fake.set_condition("inferenceservices", name, "Ready", "", "")
            time.sleep(0.05)

    thread = threading.Thread(target=script, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("copies", [[S3, OCI], [S3]], ids=["modelcar", "s3"])
def test_the_inference_service_is_valid_for_kserves_crd(copies):
    service = render_inference_service("smol-ft", "ml-team", "run-1", copies, ServingOptions(), *SECRETS)
    assert schema_errors(service, ISVC_CRD) == []
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "vLLM"} and model["runtime"] == "vllm-cuda-runtime"
    assert model["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    if OCI in copies:  # the modelcar, pulled with the Secret it was pushed with
        assert model["storageUri"] == OCI["uri"] and "storage" not in model
        assert service["spec"]["predictor"]["imagePullSecrets"] == [{"name": "oci-connection-models"}]
    else:  # the S3 copy, through the data connection
        assert model["storage"] == {"key": "aws-connection-models", "path": "team/smol-ft/run-1/"}
    cpu = render_inference_service("smol-ft", "ml-team", "run-1", copies, ServingOptions(gpus=0), *SECRETS)
    assert schema_errors(cpu, ISVC_CRD) == [] and "nvidia.com/gpu" not in json.dumps(cpu)


def test_the_crd_check_catches_a_misspelled_field():
    """The negative control: the closed CRD schema refuses what KServe would prune silently."""
    service = render_inference_service("smol-ft", "ml-team", "run-1", [S3], ServingOptions(), *SECRETS)
    service["spec"]["predictor"]["model"]["storageURI"] = "oci://x"
    assert schema_errors(service, ISVC_CRD)


def test_service_names_fit_kubernetes_and_kserve():
    assert service_name("SmolLM2-135M-Instruct-ft") == "smollm2-135m-instruct-ft"
    assert service_name("my_model.v2") == "my-model-v2" and len(service_name("x" * 80)) == 45


def test_without_deploy_the_manifest_is_written_for_oc_apply(tmp_path):
    stored_run(tmp_path)
    assert serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(), SECRETS, RegistryOptions()) is None
    written = yaml.safe_load((tmp_path / "runs" / "run-1" / "serve" / "inferenceservice.yaml").read_text())
    assert written["spec"]["predictor"]["model"]["storageUri"] == "oci://quay.io/team/smol-ft:run-1"
    assert schema_errors(written, ISVC_CRD) == []


def test_a_version_vllm_cannot_load_is_not_deployed(tmp_path):
    stored_run(tmp_path)
    (tmp_path / "runs" / "run-1" / "publish" / "upload" / "config.json").unlink()
    assert serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(), SECRETS, RegistryOptions()) is None
    assert not (tmp_path / "runs" / "run-1" / "serve" / "inferenceservice.yaml").exists()
    with pytest.raises(UserError, match="no merged checkpoint.*publish_merged to true"):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), SECRETS, RegistryOptions())
    write_json(tmp_path / "runs" / "run-1" / "store" / "stored.json", [])
    with pytest.raises(UserError, match="set model_oci_uri or model_s3_uri"):
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), SECRETS, RegistryOptions())


def test_deploy_waits_for_ready_asks_a_question_and_records_the_answer(tmp_path, cluster, chat_server, monkeypatch):
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with FakeModelRegistry(token=TOKEN) as registry:
        options = RegistryOptions(url=registry.url)
        register(str(tmp_path), "run-1", "smol-ft", options, SECRETS[0], "")
        kserve = play_kserve(cluster, chat_server, times=2)
        served = serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), SECRETS, options)
        again = serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), SECRETS, options)
        kserve.join(timeout=30)
        (version,) = registry.model_versions.values()
        assert registry.violations == []
    assert (served.name, served.namespace, served.endpoint, served.model) == (
        "smol-ft", "ml-team", chat_server, "smol-ft"
    )  # fmt: skip
    assert served.question == "How many cups in a gallon?" and served.answer.strip()  # a real model's answer
    assert list(cluster.objects["inferenceservices"]) == ["smol-ft"] and again.endpoint == served.endpoint
    assert [r.method for r in cluster.requests_matching("PUT", "inferenceservices/smol-ft")] == ["PUT"]
    assert_granted_by_rbac(cluster.requests)
    stored = cluster.objects["inferenceservices"]["smol-ft"]
    assert stored["spec"]["predictor"]["model"]["storageUri"] == OCI["uri"]
    record = json.loads((tmp_path / "runs" / "run-1" / "serve" / "served.json").read_text())
    assert record["answer"] == again.answer and record["endpoint"] == chat_server
    properties = version["customProperties"]
    assert properties["serving_endpoint"]["string_value"] == chat_server
    assert properties["serving_answer"]["string_value"] == again.answer
    assert properties["pipeline_run_id"]["string_value"] == "run-1"  # the registration's own properties are kept


def test_a_service_that_never_gets_ready_fails_with_its_conditions_and_events(tmp_path, cluster):
    stored_run(tmp_path)

    def script():
        cluster.wait_for("inferenceservices")
        cluster.set_status(
            "inferenceservices", "smol-ft",
            conditions=[{"type": "Ready", "status": "False", "reason": "RevisionMissing", "message": "no pods"}],
        )  # fmt: skip
        cluster.add_event("InferenceService", "smol-ft", "InternalError", "fails to pull the modelcar")

    threading.Thread(target=script, daemon=True).start()
    with pytest.raises(UserError) as failed:
        serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True, timeout_s=2), SECRETS, RegistryOptions())
    message = str(failed.value)
    assert (
        "was not Ready after 2 s (serving_timeout_s)" in message and "Ready=False (RevisionMissing: no pods)" in message
    )
    assert "fails to pull the modelcar" in message and "oc describe isvc smol-ft -n ml-team" in message


def test_missing_rbac_names_the_verb_the_resource_and_the_file(tmp_path, tmp_path_factory, monkeypatch):
    stored_run(tmp_path)
    fake = FakeKube(forbidden={"inferenceservices"}).start()
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with pytest.raises(UserError) as refused:
            serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), SECRETS, RegistryOptions())
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
            serve(str(tmp_path), "run-1", "smol-ft", ServingOptions(deploy=True), SECRETS, RegistryOptions())
    finally:
        fake.stop()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (ServingOptions(runtime="vLLM_Runtime"), "runtime"),
        (ServingOptions(gpus=-1), "gpus"),
        (ServingOptions(memory="16 Gi"), "memory"),
        (ServingOptions(timeout_s=10), "timeout_s"),
    ],
)
def test_bad_serving_options_are_refused(options, field):
    assert set(option_problems(options)) == {field}
