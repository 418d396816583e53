"""Registration in the Model Registry, against the fake registry that validates every exchange with the spec.

The run's folders come from ``fake_run.make_run`` plus the publish step's dry
run; ``store/stored.json`` says where the version was copied, as the store step
writes it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest
from conftest import run_module
from fake_model_registry import FakeModelRegistry
from fake_run import BASE_COMMIT, FINGERPRINT, SOURCE_CONTENT, make_run
from local_server import HeaderRecorder, LocalServer, ipv6_loopback, non_loopback_address, self_signed_certificate

from common.errors import UserError
from common.records import Registration, StoredCopies, StoredCopy
from components.publish.options import PublishOptions
from components.publish.publish import publish
from components.register import catalogue
from components.register import stage as registry_stage
from components.register.options import RegistryOptions, option_problems
from components.register.stage import TOKEN_ENV, register
from components.run_form.checks import problems

TOKEN = "CANARY-registry-token-5e1f"
SERVICE_ACCOUNT_TOKEN = "CANARY-service-account-token-77d0"
S3_URI = "s3://models/team/smol-ft/run-1/"
OCI_URI = "oci://quay.io/team/smol-ft:run-1"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """The retries' backoff in hundredths of a second: the tests count tries, they do not wait for them."""
    monkeypatch.setattr(catalogue, "BACKOFF_S", 0.01)


@pytest.fixture
def service_account(tmp_path, monkeypatch):
    """A pod's service-account folder (token, namespace) where the step looks for it, holding a canary token."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text(SERVICE_ACCOUNT_TOKEN + "\n")
    (folder / "namespace").write_text("ml-team\n")
    monkeypatch.setattr(registry_stage, "SERVICE_ACCOUNT", folder)
    return folder


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with FakeModelRegistry(token=TOKEN) as fake:
        yield fake
        assert fake.violations == []  # every request and answer followed the published spec


def stored_run(workspace, run_id="run-1", *, gate_passed=True):
    """A run that went through publish (a dry run) and store (S3 and OCI)."""
    make_run(workspace, run_id, gate_passed=gate_passed)
    if gate_passed:
        publish(str(workspace), run_id, "", PublishOptions(publish_merged="true"), token=None)
    copies = (
        StoredCopy(S3_URI, files=14, total_bytes=20000),
        StoredCopy(OCI_URI, files=14, total_bytes=20000, digest="sha256:" + "c" * 64),
    )
    StoredCopies(copies).write(workspace / "runs" / run_id / "store" / "stored.json")


def test_a_dpo_version_records_the_objective_its_settings_and_the_preferences(tmp_path):
    """Under objective dpo the properties name the rows as pairs and add beta, the loss and the held-out pairs'
    reward accuracy and margin (the published model's accuracy when one was compared)."""
    import dataclasses

    from fake_run import evaluation, training_summary

    from common.run_layout import EVALUATION, TRAINING_SUMMARY, stage_dir
    from components.champion.version import RunDirs
    from components.register.provenance import version_properties

    make_run(tmp_path)
    summary = training_summary(config={"objective": "dpo", "dpo_beta": 0.2, "dpo_loss": "ipo"})
    summary.write(stage_dir(str(tmp_path), "run-1", "train") / TRAINING_SUMMARY)
    result = evaluation()
    tuned = dataclasses.replace(result.fine_tuned, reward_accuracy=0.875, reward_margin=0.25)
    dataclasses.replace(result, fine_tuned=tuned).write(stage_dir(str(tmp_path), "run-1", "evaluate") / EVALUATION)
    properties = version_properties(RunDirs.of(str(tmp_path), "run-1"), "run-1")
    assert properties["objective"] == "dpo" and (properties["dpo_beta"], properties["dpo_loss"]) == (0.2, "ipo")
    assert (properties["reward_accuracy_new"], properties["reward_margin_new"]) == (0.875, 0.25)
    assert "reward_accuracy_published" not in properties  # no published model was compared
    assert "train_preference_pairs" in properties and "train_conversations" not in properties


def values(properties: dict) -> dict:
    """The registry's typed custom properties as plain values."""
    out = {}
    for name, value in properties.items():
        kind = value["metadataType"]
        raw = value[{"MetadataIntValue": "int_value", "MetadataDoubleValue": "double_value",
                     "MetadataStringValue": "string_value", "MetadataBoolValue": "bool_value"}[kind]]  # fmt: skip
        out[name] = int(raw) if kind == "MetadataIntValue" else raw
    return out


def test_a_version_is_registered_with_its_artifacts_and_provenance(registry, tmp_path):
    stored_run(tmp_path)
    options = RegistryOptions(url=registry.url)
    registration = register(str(tmp_path), "run-1", "smol-ft", options, "aws-connection-models", "")
    assert registration.created
    (model,) = registry.registered_models.values()
    (version,) = registry.model_versions.values()
    assert (model["name"], version["name"], version["registeredModelId"]) == ("smol-ft", "run-1", model["id"])
    properties = values(version["customProperties"])
    assert properties["pipeline_run_id"] == "run-1" and properties["data_fingerprint"] == FINGERPRINT
    assert properties["base_model"] == "HuggingFaceTB/SmolLM3-3B" and properties["base_model_commit"] == BASE_COMMIT
    assert (properties["eval_loss_base"], properties["eval_loss_new"]) == (2.3456, 0.9511)
    assert "eval_loss_published" not in properties  # nothing was published before this run
    assert (properties["benchmark_arc_easy_acc_norm"], properties["benchmark_hellaswag_acc_norm"]) == (0.705, 0.541)
    assert properties["gate_passed"] is True and properties["gate_reason"] == "eval loss improved by 1.3945"
    assert properties["gguf_verified"] is True and properties["method"] == "lora" and properties["lora_r"] == 16
    assert (properties["train_conversations"], properties["eval_conversations"]) == (270, 30)
    assert properties["objective"] == "sft" and "dpo_beta" not in properties and "reward_accuracy_new" not in properties
    assert (properties["data_source_1"], properties["data_source_1_content"]) == (
        "s3://qa-data/skills.jsonl",
        SOURCE_CONTENT,
    )
    assert properties["data_source_1_version"] == 'VersionId v1, ETag "e1"'
    artifacts = {a["name"]: a for a in registry.version_artifacts(version["id"])}
    assert artifacts["smol-ft-s3"]["uri"] == S3_URI and artifacts["smol-ft-oci"]["uri"] == OCI_URI
    assert artifacts["smol-ft-s3"]["storageKey"] == "aws-connection-models"
    assert artifacts["smol-ft-s3"]["storagePath"] == "team/smol-ft/run-1/"
    assert {a["modelFormatName"] for a in artifacts.values()} == {"vLLM"}  # the merged checkpoint was stored
    record = Registration.read(tmp_path / "runs" / "run-1" / "register" / "registered.json")
    assert record.model_version_id == version["id"] and set(record.artifact_ids) == set(artifacts)


def test_registering_the_same_run_again_updates_and_never_duplicates(registry, tmp_path):
    stored_run(tmp_path)
    register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "aws-connection-models", "")
    moved = "s3://models/moved/smol-ft/run-1/"
    StoredCopies((StoredCopy(moved, files=1, total_bytes=1),)).write(
        tmp_path / "runs" / "run-1" / "store" / "stored.json"
    )
    again = register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "other-connection", "")
    assert not again.created
    assert (len(registry.registered_models), len(registry.model_versions), len(registry.artifacts)) == (1, 1, 2)
    (version,) = registry.model_versions.values()
    s3 = next(a for a in registry.version_artifacts(version["id"]) if a["name"] == "smol-ft-s3")
    assert (s3["uri"], s3["storageKey"]) == (moved, "other-connection")
    assert ("PATCH", f"/api/model_registry/v1alpha3/model_versions/{version['id']}") in registry.requests
    stored_run(tmp_path / "next", "run-2")  # its own workspace: publish refuses a run that never saw run-1's
    register(str(tmp_path / "next"), "run-2", "smol-ft", RegistryOptions(url=registry.url), "aws-connection-models", "")
    assert (len(registry.registered_models), len(registry.model_versions)) == (1, 2)  # a second run: a new version


def test_a_version_that_failed_the_gate_is_not_registered(registry, tmp_path):
    stored_run(tmp_path, gate_passed=False)
    with pytest.raises(UserError, match="failed the quality gate.*is not registered"):
        register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "s", "")
    assert registry.requests == []


def test_a_refused_token_names_the_secret_and_never_shows_the_token(tmp_path, monkeypatch):
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, "CANARY-wrong-token")
    with FakeModelRegistry(token=TOKEN) as fake:
        with pytest.raises(UserError) as refused:
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=fake.url), "s", "")
    message = str(refused.value)
    assert "refused the step (401" in message and "'model-registry-token' (model_registry_secret)" in message
    assert "CANARY" not in message and not fake.model_versions


def test_the_step_leaves_no_token_in_its_output_or_files(tmp_path):
    """The canary: the token reaches the registry as a header and nothing else."""
    stored_run(tmp_path)
    with FakeModelRegistry(token=TOKEN) as fake:
        result = run_module(
            "components.register.stage", "--workspace-root", tmp_path, "--run-id", "run-1", "--model-name", "smol-ft",
            "--s3-secret", "aws-connection-models", "--url", fake.url,
            env={**os.environ, TOKEN_ENV: TOKEN},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert fake.violations == [] and len(fake.model_versions) == 1
    assert "registered version" in result.stdout and TOKEN not in result.stdout + result.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]


def test_an_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with pytest.raises(UserError, match="Could not reach the Model Registry at http://127.0.0.1:9"):
        register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url="http://127.0.0.1:9"), "s", "")


def test_an_https_registry_without_a_token_is_refused_before_any_request(tmp_path, monkeypatch):
    stored_run(tmp_path)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(UserError, match="No token to present.*model_registry_secret"):
        register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url="https://127.0.0.1:9"), "s", "")


def test_a_version_stored_nowhere_has_nothing_to_register(registry, tmp_path):
    stored_run(tmp_path)
    StoredCopies().write(tmp_path / "runs" / "run-1" / "store" / "stored.json")
    with pytest.raises(UserError, match="nothing to register.*model_s3_uri or model_oci_uri"):
        register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "s", "")


def test_without_a_url_nothing_is_registered(tmp_path):
    stored_run(tmp_path)
    assert register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(), "s", "") is None
    record = tmp_path / "runs" / "run-1" / "register" / "registered.json"
    assert json.loads(record.read_text()) == {"format_version": 1, "registration": None}
    assert Registration.read(record) is None


def test_the_fake_refuses_what_the_spec_does_not_allow():
    """The negative control: a request body the spec forbids is recorded as a violation and answered 400."""
    import requests

    with FakeModelRegistry() as fake:
        answer = requests.post(f"{fake.url}/api/model_registry/v1alpha3/registered_models", json={"name": 5})
        assert answer.status_code == 400 and len(fake.violations) == 1 and not fake.registered_models


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (RegistryOptions(url="model-registry.svc:8080"), "url"),
        (RegistryOptions(url="ftp://registry"), "url"),
        (RegistryOptions(secret="Not_A_Secret"), "secret"),
        (RegistryOptions(url="http://my-registry-rest.ns.svc:8080"), "url"),  # a token would cross the network
        (RegistryOptions(url="http://127.0.0.1:8089", use_service_account=True), "use_service_account"),
        (RegistryOptions(url="http://r.ns.svc:8080", use_service_account=True, allow_http=True), "use_service_account"),
    ],
)
def test_bad_registry_options_are_refused(options, field):
    assert set(option_problems(options)) == {field}


@pytest.mark.parametrize(
    "options",
    [
        RegistryOptions(url="https://my-registry-rest.ns.svc:8443"),
        RegistryOptions(url="https://my-registry-rest.ns.svc:8443", use_service_account=True),
        RegistryOptions(url="http://127.0.0.1:8089"),  # this machine: the token never reaches a network
        RegistryOptions(url="http://localhost:8089"),
        RegistryOptions(url="http://my-registry-rest.ns.svc:8080", allow_http=True),  # the user vouches: mTLS mesh
    ],
)
def test_registry_urls_a_token_may_go_to_pass(options):
    assert option_problems(options) == {}


@pytest.mark.parametrize(
    "url",
    [
        "https://bob:CANARY-registry-password@my-registry-rest.ns.svc:8443",
        "https://CANARY-registry-password@my-registry-rest.ns.svc:8443",
        "https://my-registry-rest.ns.svc:8443?token=CANARY-registry-password",
    ],
)
def test_credentials_in_model_registry_url_are_refused_by_the_first_step_naming_the_secret(url):
    """A run parameter is kept in the run's record and the pods' arguments, so the first step refuses a URL that
    carries a credential, without repeating it, and says where the token goes instead."""
    (line,) = problems({"model_registry_url": url, "model_registry_secret": "my-token", "model_s3_uri": "s3://b"})
    assert line.startswith("parameter 'model_registry_url' is a URL that carries a credential")
    assert "https://my-registry-rest.ns.svc:8443" in line and "'my-token' (named by model_registry_secret)" in line
    assert "CANARY" not in line


def test_plain_http_to_another_host_is_refused_by_the_first_step_naming_the_fix():
    """The first step's checks (components/run_form/checks.py, which run each stage's option_problems) refuse the
    run before anything trains: one line naming model_registry_url and the parameter that would allow it."""
    values = {"model_registry_url": "http://my-registry-rest.ns.svc:8080", "model_s3_uri": "s3://models/team"}
    (line,) = problems(values)
    assert line.startswith("parameter 'model_registry_url' is 'http://my-registry-rest.ns.svc:8080'")
    assert "plain http" in line and "https" in line and "model_registry_allow_http to true" in line
    assert problems({**values, "model_registry_allow_http": True}) == []


def test_the_service_account_token_over_http_is_refused_by_the_first_step():
    values = {"model_registry_url": "http://127.0.0.1:8089", "model_registry_use_service_account": True}
    (line,) = problems({**values, "model_s3_uri": "s3://models/team"})
    assert line.startswith("parameter 'model_registry_use_service_account' is true, but model_registry_url")
    assert "https only" in line and "model_registry_secret" in line
    # allow_http vouches for the network, not for sending the pod's own credential over it
    assert len(problems({**values, "model_s3_uri": "s3://b", "model_registry_allow_http": True})) == 1


def test_a_token_never_goes_over_plain_http_to_another_host(tmp_path, monkeypatch):
    """A real server on this machine's non-loopback address, reachable (the control request gets there), is
    another host to the rule: the step refuses before sending anything. The same token does reach a plain-http
    server on loopback (127.0.0.1, and 127.0.0.2: all of 127.0.0.0/8), and the other host once the user vouches
    for the network (model_registry_allow_http)."""
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with HeaderRecorder(host=non_loopback_address()) as remote:
        with pytest.raises(urllib.error.HTTPError):  # the control: the server is reachable, and records
            urllib.request.urlopen(remote.url + "/control", timeout=10)
        assert remote.received == [("GET", "/control", None)]
        with pytest.raises(UserError) as refused:
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=remote.url), "s", "")
        assert remote.received == [("GET", "/control", None)]  # nothing after the control
        message = " ".join(str(refused.value).split())
        assert f"{remote.url} is plain http" in message and "model_registry_url" in message
        assert "model_registry_allow_http" in message and TOKEN not in message
        with pytest.raises(UserError, match=r"refused the step \(401"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=remote.url, allow_http=True), "s", "")
        assert remote.authorizations == {None, f"Bearer {TOKEN}"}
    for host in ("127.0.0.1", "127.0.0.2"):
        with HeaderRecorder(host=host) as local:
            with pytest.raises(UserError, match=r"refused the step \(401"):
                register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=local.url), "s", "")
        assert local.received and local.authorizations == {f"Bearer {TOKEN}"}, host


def test_a_registry_on_ipv6_loopback_gets_the_token(tmp_path, monkeypatch):
    """http://[::1]:port passes the rule (loopback), so the client must reach it: a real server on ::1 receives
    the token (the client is rebuilt from scheme, host and port, and ::1 needs its brackets back)."""
    assert ipv6_loopback(), "this test needs a machine that binds ::1 (IPv6 on loopback), as the CI machines do"
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with HeaderRecorder(host="::1") as local:
        assert local.url.startswith("http://[::1]:")
        with pytest.raises(UserError, match=r"refused the step \(401"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=local.url), "s", "")
    assert local.received and local.authorizations == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("hostname", "written"),
    [("::1", "[::1]"), ("fd00::5", "[fd00::5]"), ("127.0.0.1", "127.0.0.1"), ("r.ns.svc", "r.ns.svc")],
)
def test_the_registry_client_is_built_from_the_host_as_a_url_writes_it(hostname, written):
    """The part the test above depends on, as a table: IPv6 hosts get their brackets back."""
    assert catalogue.url_host(hostname) == written


def test_the_service_account_token_goes_only_when_asked_and_only_over_https(
    tmp_path, monkeypatch, service_account, capsys
):
    """Without model_registry_use_service_account the pod's own token stays in the pod, even with no Secret; with
    it, it goes to an https registry (a real TLS server whose certificate the client verifies) and never over
    plain http, not even to loopback."""
    stored_run(tmp_path)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with HeaderRecorder() as plain:
        with pytest.raises(UserError, match=r"refused the step \(401.*no token was sent.*use_service_account"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=plain.url), "s", "")
        assert plain.received and plain.authorizations == {None}
        plain.received.clear()
        with pytest.raises(UserError) as refused:
            options = RegistryOptions(url=plain.url, use_service_account=True, allow_http=True)
            register(str(tmp_path), "run-1", "smol-ft", options, "s", "")
        assert plain.received == []
    message = " ".join(str(refused.value).split())
    assert "model_registry_use_service_account is true" in message and "https only" in message
    certificate = self_signed_certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # the client verifies the server, as in a cluster
    with HeaderRecorder(tls=certificate) as secure:
        with pytest.raises(UserError, match="No token to present.*model_registry_use_service_account to true"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=secure.url), "s", "")
        assert secure.received == []
        with pytest.raises(UserError, match=r"refused the step \(401"):
            options = RegistryOptions(url=secure.url, use_service_account=True)
            register(str(tmp_path), "run-1", "smol-ft", options, "s", "")
        assert secure.received and secure.authorizations == {f"Bearer {SERVICE_ACCOUNT_TOKEN}"}
    assert SERVICE_ACCOUNT_TOKEN not in capsys.readouterr().out


def test_a_busy_or_restarting_registry_is_tried_again_and_said_in_the_log(registry, tmp_path, capsys):
    """503 and 429 (a proxy in front of a restarting or rate-limiting registry) are tried again with backoff; the
    operation starts over, finding by name what an earlier try created, so nothing is duplicated."""
    stored_run(tmp_path)
    registry.failures = [503, 429]
    registration = register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "s", "")
    assert registration.created and (len(registry.model_versions), len(registry.artifacts)) == (1, 2)
    log = capsys.readouterr().out
    assert "answered 503 Service Unavailable (try 1 of 3); trying again" in log
    assert "answered 429 Too Many Requests (try 2 of 3); trying again" in log
    registry.failures = [502]  # mid-operation this time: the version is there already and is found again
    assert not register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "s", "").created
    assert (len(registry.registered_models), len(registry.model_versions), len(registry.artifacts)) == (1, 1, 2)


def test_a_registry_that_keeps_failing_is_given_up_after_three_tries(registry, tmp_path):
    stored_run(tmp_path)
    registry.failures = [503] * 5
    with pytest.raises(UserError, match=r"answered 503 Service Unavailable \(after 3 tries\)"):
        register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "s", "")
    assert len(registry.requests) == 3 and registry.failures == [503, 503]


class Silent(LocalServer):
    """Accepts each request and never answers it (a hung registry or proxy), until closed."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.released = threading.Event()
        silent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                silent.received.append(self.path)
                silent.released.wait(30)

        super().__init__(Handler)

    def close(self) -> None:
        self.released.set()
        super().close()


def test_every_request_has_a_timeout_and_is_tried_three_times(tmp_path, monkeypatch, capsys):
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setattr(catalogue, "REQUEST_TIMEOUT_S", 0.3)
    with Silent() as silent:
        started = time.monotonic()
        with pytest.raises(UserError, match=r"did not answer within 0.3 s \(3 tries\)"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=silent.url), "s", "")
        assert len(silent.received) == 3 and time.monotonic() - started < 10
    assert capsys.readouterr().out.count("did not answer within 0.3 s (try") == 2


def test_the_serve_step_records_its_endpoint_under_the_same_rule(tmp_path, monkeypatch, service_account):
    """The serve step writes the endpoint to the same registry with the same connection (``connection``): no
    token over plain http to another host, and no service-account token unless asked for."""
    from common.records import Served
    from components.serve.stage import _record_in_registry

    registered = Registration("http://registry", "3", "7", {"smol-ft-s3": "9"}, created=True)
    Registration.write(tmp_path / "runs" / "run-1" / "register" / "registered.json", registered)
    served = Served("smol-ft", "ml-team", "http://smol-ft-predictor.ml-team.svc", "smol-ft", "Hi?", "Hello.")
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with HeaderRecorder(host=non_loopback_address()) as remote:
        with pytest.raises(UserError, match="is plain http.*model_registry_allow_http"):
            _record_in_registry(str(tmp_path), "run-1", served, RegistryOptions(url=remote.url))
        assert remote.received == []
    monkeypatch.delenv(TOKEN_ENV)
    with HeaderRecorder() as local:
        with pytest.raises(UserError, match=r"refused the step \(401"):
            _record_in_registry(str(tmp_path), "run-1", served, RegistryOptions(url=local.url))
    assert local.received and local.authorizations == {None}


def test_a_plain_http_request_through_a_proxy_on_another_host_keeps_its_token(tmp_path, monkeypatch):
    """The registry client honours HTTP_PROXY (aiohttp's trust_env): a plain-http request to loopback would hand
    the token to the proxy, so the proxy's URL must pass the rule too; NO_PROXY for the host is the fix."""
    stored_run(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with HeaderRecorder(host=non_loopback_address()) as proxy, HeaderRecorder() as local:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with pytest.raises(UserError, match=f"through the proxy {proxy.url}.*NO_PROXY"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=local.url), "s", "")
        assert proxy.received == [] and local.received == []
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        with pytest.raises(UserError, match=r"refused the step \(401"):
            register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=local.url), "s", "")
        assert proxy.received == [] and local.authorizations == {f"Bearer {TOKEN}"}


def test_a_version_uploaded_to_the_hub_gets_an_hf_artifact_read_from_the_publish_record(tmp_path):
    """registry.stage.artifact_specs reads the workspace's publish record (components.champion.record): the Hub
    artifact only when the record names this run's upload."""
    from components.champion.record import PublishedRecord, write_record
    from components.register.stage import artifact_specs

    stored_run(tmp_path)
    upload = tmp_path / "runs" / "run-1" / "publish" / "upload"

    def hub_artifacts(run_id: str) -> list[tuple[str, str]]:
        record = PublishedRecord("me/smol", True, FINGERPRINT, run_id, "https://hub/commit/1", "2026-11-28T00:00:00")
        write_record(str(tmp_path), record)
        specs = artifact_specs(str(tmp_path), "run-1", "smol-ft", "aws-connection-models", "me/smol", upload)
        return [(spec.name, spec.uri) for spec in specs if spec.uri.startswith("hf://")]

    assert hub_artifacts("run-1") == [("smol-ft-hf", "hf://me/smol")]
    assert hub_artifacts("run-2") == []  # the Hub holds another run's model now
