"""Registration in the Model Registry, against the fake registry that validates every exchange with the spec.

The run's folders come from ``fake_run.make_run`` plus the publish step's dry
run; ``store/stored.json`` says where the version was copied, as the store step
writes it.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_module
from fake_model_registry import FakeModelRegistry
from fake_run import BASE_COMMIT, FINGERPRINT, make_run

from common.atomic import write_json
from common.errors import UserError
from components.publish.options import PublishOptions
from components.publish.publish import publish
from components.registry.options import RegistryOptions, option_problems
from components.registry.stage import TOKEN_ENV, register

TOKEN = "CANARY-registry-token-5e1f"
S3_URI = "s3://models/team/smol-ft/run-1/"
OCI_URI = "oci://quay.io/team/smol-ft:run-1"


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
        publish(str(workspace), run_id, "", PublishOptions(include_merged="true"), token=None)
    copies = [
        {"uri": S3_URI, "files": 14, "total_bytes": 20000},
        {"uri": OCI_URI, "digest": "sha256:" + "c" * 64, "files": 14, "total_bytes": 20000},
    ]
    write_json(workspace / "runs" / run_id / "store" / "stored.json", copies)


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
    artifacts = {a["name"]: a for a in registry.version_artifacts(version["id"])}
    assert artifacts["smol-ft-s3"]["uri"] == S3_URI and artifacts["smol-ft-oci"]["uri"] == OCI_URI
    assert artifacts["smol-ft-s3"]["storageKey"] == "aws-connection-models"
    assert artifacts["smol-ft-s3"]["storagePath"] == "team/smol-ft/run-1/"
    assert {a["modelFormatName"] for a in artifacts.values()} == {"vLLM"}  # the merged checkpoint was stored
    record = json.loads((tmp_path / "runs" / "run-1" / "register" / "registered.json").read_text())
    assert record["model_version_id"] == version["id"] and set(record["artifact_ids"]) == set(artifacts)


def test_registering_the_same_run_again_updates_and_never_duplicates(registry, tmp_path):
    stored_run(tmp_path)
    register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "aws-connection-models", "")
    moved = "s3://models/moved/smol-ft/run-1/"
    write_json(tmp_path / "runs" / "run-1" / "store" / "stored.json", [{"uri": moved, "files": 1, "total_bytes": 1}])
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
            "components.registry.stage", "--workspace-root", tmp_path, "--run-id", "run-1", "--model-name", "smol-ft",
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
    write_json(tmp_path / "runs" / "run-1" / "store" / "stored.json", [])
    with pytest.raises(UserError, match="nothing to register.*model_s3_uri or model_oci_uri"):
        register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(url=registry.url), "s", "")


def test_without_a_url_nothing_is_registered(tmp_path):
    stored_run(tmp_path)
    assert register(str(tmp_path), "run-1", "smol-ft", RegistryOptions(), "s", "") is None
    assert (tmp_path / "runs" / "run-1" / "register" / "registered.json").read_text() == "null\n"


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
    ],
)
def test_bad_registry_options_are_refused(options, field):
    assert set(option_problems(options)) == {field}
