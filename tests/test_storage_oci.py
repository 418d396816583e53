"""The OCI modelcar target against a real registry (Debian's docker-registry, tests/oci_registry.py).

What is pushed is pulled back with an independent client (skopeo), unpacked
layer by layer, and compared byte for byte; the image's own busybox then runs
KServe's modelcar init check on the unpacked tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from common.errors import UserError
from components.store.modelcar_base import BUSYBOX_ENV
from components.store.oci_target import (
    AUTH_FILE_ENV,
    MANIFEST_FILE,
    image_uri,
    oci_location_problem,
    pinned_uri,
    push_version,
)
from components.store.options import StorageOptions, option_problems
from components.store.registry_auth import registry_scheme
from tests.oci_registry import require

HINT = "in the cluster the step reads them from the Secret 'oci-connection-models' (model_oci_secret)"
# kserve pkg/utils CreateModelcarInitContainer: the check the init container runs in the image, with /models
# where the test unpacked it.
KSERVE_INIT_CHECK = (
    "echo 'Pre-fetching modelcar: ' && [ -d {models} ] && [ \"$(ls -A {models})\" ] && "
    "echo 'OK ... Prefetched and valid (/models exists)' || "
    "(echo 'NOK ... Prefetched but modelcar is invalid (/models does not exist or is empty)' && exit 1)"
)


def version_folder(root: Path) -> dict[str, bytes]:
    """A published version as the publish step leaves it: checkpoint files, a GGUF, a subfolder, the card."""
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": os.urandom(3 << 20),
        "tokenizer.json": b'{"version": "1.0"}',
        "smol-ft.Q8_0.gguf": os.urandom(1 << 20),
        "evaluation/report.json": b'{"eval_loss": 1.5}',
        "README.md": b"# smol-ft\n\nA model card.\n",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def pull_and_unpack(registry, uri: str, work: Path) -> tuple[dict, Path]:
    """skopeo copies the image to a dir: layout; its config and the tree its layers make, unpacked in order."""
    policy = work / "policy.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    pulled, rootfs = work / "pulled", work / "rootfs"
    subprocess.run(
        [require("skopeo"), "--policy", str(policy), "copy", "--src-tls-verify=false", "--src-authfile",
         str(registry.auth_file), "docker://" + uri.removeprefix("oci://"), f"dir:{pulled}"],
        check=True, capture_output=True,
    )  # fmt: skip
    manifest = json.loads((pulled / "manifest.json").read_text())
    rootfs.mkdir()
    for layer in manifest["layers"]:
        with tarfile.open(pulled / layer["digest"].removeprefix("sha256:")) as tar:
            tar.extractall(rootfs, filter="tar")
    config = json.loads((pulled / manifest["config"]["digest"].removeprefix("sha256:")).read_text())
    return config, rootfs


def test_a_pushed_version_comes_back_byte_for_byte_and_passes_kserves_check(oci_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file))
    folder = tmp_path / "upload"
    files = version_folder(folder)
    uri = image_uri(f"oci://{oci_registry.host}/models/smol-ft", "run-2026.11.26")
    image = push_version(folder, uri, tmp_path / "store", HINT)
    assert (image.uri, image.files) == (f"oci://{oci_registry.host}/models/smol-ft:run-2026.11.26", len(files))
    assert image.total_bytes == sum(len(data) for data in files.values()) and image.digest.startswith("sha256:")
    assert not (tmp_path / "store" / "modelcar-layout").exists()  # the build folder goes once pushed
    pushed = (tmp_path / "store" / MANIFEST_FILE).read_bytes()  # the manifest sent, kept as evidence
    assert image.digest == "sha256:" + hashlib.sha256(pushed).hexdigest()

    config, rootfs = pull_and_unpack(oci_registry, uri, tmp_path)
    pulled = {p.relative_to(rootfs / "models").as_posix() for p in (rootfs / "models").rglob("*") if p.is_file()}
    assert pulled == set(files)
    for name, data in files.items():
        assert (rootfs / "models" / name).read_bytes() == data, name
    # KServe passes its commands as args: the image must have no entrypoint, and a shell on its PATH.
    assert "Entrypoint" not in config["config"] and config["architecture"] == "amd64"
    assert os.readlink(rootfs / "bin" / "sh") == "busybox"
    check = KSERVE_INIT_CHECK.format(models=rootfs / "models")
    ran = subprocess.run([rootfs / "bin" / "busybox", "sh", "-c", check], capture_output=True, text=True)
    assert ran.returncode == 0 and "OK ... Prefetched and valid" in ran.stdout
    empty = KSERVE_INIT_CHECK.format(models=tmp_path / "no-models")
    assert subprocess.run([rootfs / "bin" / "busybox", "sh", "-c", empty], capture_output=True).returncode == 1


def test_pushing_the_same_version_again_leaves_the_tag_on_a_whole_image(oci_registry, tmp_path, monkeypatch):
    """A retried step pushes the version again: the tag moves to the new manifest, which holds every file."""
    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file))
    folder = tmp_path / "upload"
    files = version_folder(folder)
    uri = image_uri(f"oci://{oci_registry.host}/models/again", "run-1")
    push_version(folder, uri, tmp_path, HINT)
    again = push_version(folder, uri, tmp_path, HINT)
    _, rootfs = pull_and_unpack(oci_registry, uri, tmp_path)
    assert {name: (rootfs / "models" / name).read_bytes() for name in files} == files
    manifest = (tmp_path / "pulled" / "manifest.json").read_bytes()
    assert again.digest == "sha256:" + hashlib.sha256(manifest).hexdigest()


def answered_digest(monkeypatch, digest: str | None) -> None:
    """The registry's answer to the manifest's PUT says ``digest`` (None: says nothing), as a registry or proxy
    that rewrites manifests, or an older one, would."""
    from oras.layout.layout import Layout

    push = Layout.push_to_registry

    def answered(self, *args, **kwargs):
        response = push(self, *args, **kwargs)
        response.headers.pop("Docker-Content-Digest", None)
        if digest is not None:
            response.headers["Docker-Content-Digest"] = digest
        return response

    monkeypatch.setattr(Layout, "push_to_registry", answered)


def test_the_digest_is_computed_from_the_manifest_pushed_not_read_from_the_answer(oci_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file))
    folder = tmp_path / "upload"
    version_folder(folder)
    uri = image_uri(f"oci://{oci_registry.host}/models/digest", "run-1")
    answered_digest(monkeypatch, None)  # no header at all: the digest is still known
    image = push_version(folder, uri, tmp_path / "store", HINT)
    pull_and_unpack(oci_registry, uri, tmp_path)
    assert image.digest == "sha256:" + hashlib.sha256((tmp_path / "pulled" / "manifest.json").read_bytes()).hexdigest()
    answered_digest(monkeypatch, "sha256:" + "0" * 64)  # another digest than the bytes sent: refused
    with pytest.raises(UserError, match=r"answered the push of .* with the digest sha256:0{64}, but the manifest"):
        push_version(folder, uri, tmp_path / "store", HINT)


def test_an_image_is_pinned_to_its_digest():
    digest = "sha256:" + "a" * 64
    assert pinned_uri("oci://quay.io/team/smol-ft:run-1", digest) == f"oci://quay.io/team/smol-ft@{digest}"
    assert pinned_uri("oci://127.0.0.1:5000/m/x:r", digest) == f"oci://127.0.0.1:5000/m/x@{digest}"
    with pytest.raises(UserError, match="no sha256 digest.*Run the store step of this run again"):
        pinned_uri("oci://quay.io/team/smol-ft:run-1", "")


def test_wrong_credentials_are_a_clear_error_and_nothing_is_tagged(oci_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file_with(tmp_path, "ci-pusher", "wrong")))
    folder = tmp_path / "upload"
    version_folder(folder)
    uri = image_uri(f"oci://{oci_registry.host}/models/denied", "run-1")
    with pytest.raises(UserError) as refused:
        push_version(folder, uri, tmp_path, HINT)
    assert "credentials are wrong" in str(refused.value) and "model_oci_secret" in str(refused.value)
    assert "wrong" not in str(refused.value).replace("are wrong", "")  # the password is never in the message
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    inspected = subprocess.run(
        [require("skopeo"), "--policy", str(policy), "inspect", "--tls-verify=false", "--authfile",
         str(oci_registry.auth_file), "docker://" + uri.removeprefix("oci://")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert inspected.returncode != 0 and "manifest unknown" in inspected.stderr


def test_credentials_for_another_registry_name_the_hosts_they_hold(oci_registry, tmp_path, monkeypatch):
    from tests.oci_registry import write_auth_file

    monkeypatch.setenv(AUTH_FILE_ENV, str(write_auth_file(tmp_path / "a.json", "quay.io", "me", "pw")))
    folder = tmp_path / "upload"
    version_folder(folder)
    with pytest.raises(UserError, match=rf"no entry for {oci_registry.host} \(they have: quay.io\)"):
        push_version(folder, image_uri(f"oci://{oci_registry.host}/models/x", "r"), tmp_path, HINT)


def test_an_unreachable_registry_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(AUTH_FILE_ENV, raising=False)
    with pytest.raises(UserError, match=r"Could not reach the registry 127.0.0.1:9 \(http\)"):
        push_version(tmp_path, "oci://127.0.0.1:9/models/x:r", tmp_path, HINT)


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("s3://bucket/models", "not an OCI repository"),
        ("oci://quay.io", "not an OCI repository"),
        ("oci://quay.io/team/model:v1", "names a tag; name the repository only (oci://quay.io/team/model)"),
        ("oci://quay.io/Team/Model", "which a registry refuses"),
        ("oci://quay.io/team/model@sha256:abc", "not an OCI repository"),
    ],
)
def test_a_repository_that_cannot_take_versions_is_refused_with_the_fix(uri, problem):
    assert problem in oci_location_problem(uri)
    with pytest.raises(UserError, match="model_oci_uri"):
        image_uri(uri, "run")


@pytest.mark.parametrize(
    ("host", "scheme"),
    [
        ("127.0.0.1:5000", "http"),
        ("127.0.0.2:5000", "http"),  # all of 127.0.0.0/8 is this machine, as for the bearer tokens
        ("[::1]:5000", "http"),
        ("localhost:5000", "http"),
        ("quay.io", "https"),
        ("10.0.0.5:5000", "https"),
        ("127.0.0.1.nip.io:5000", "https"),  # a name is judged as written, never resolved
        ("localhost.example.com", "https"),
    ],
)
def test_only_a_registry_on_this_machine_is_spoken_to_over_plain_http(host, scheme):
    """The registry credentials follow the bearer tokens' loopback rule (``common.http_trust.is_loopback``)."""
    assert registry_scheme(host) == scheme


@pytest.mark.parametrize(
    "uri", ["oci://bob:CANARY-oci-password@quay.io/team/model", "oci://CANARY-oci-password@quay.io/team/model"]
)
def test_credentials_in_model_oci_uri_are_refused_naming_the_secret(uri):
    """A run parameter is kept in the run's record and the pods' arguments: push credentials go in the Secret."""
    (problem,) = option_problems(StorageOptions(oci_uri=uri, oci_secret="my-push-secret")).values()
    assert "carries a credential" in problem and "oci://quay.io/team/model" in problem
    assert "'my-push-secret' (named by model_oci_secret)" in problem and "CANARY" not in problem


def test_run_ids_become_valid_tags():
    assert image_uri("oci://r.io/m", "8f1c2d3e-aaaa") == "oci://r.io/m:8f1c2d3e-aaaa"
    assert image_uri("oci://r.io/m", "run/2026:11") == "oci://r.io/m:run-2026-11"


def test_a_dynamically_linked_busybox_is_refused_before_anything_is_built(oci_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_FILE_ENV, str(oci_registry.auth_file))
    monkeypatch.setenv(BUSYBOX_ENV, "/bin/ls")  # dynamically linked, as a distribution's own busybox can be
    with pytest.raises(UserError, match="is dynamically linked.*busybox-static"):
        push_version(tmp_path, image_uri(f"oci://{oci_registry.host}/models/x", "r"), tmp_path, HINT)
    monkeypatch.setenv(BUSYBOX_ENV, str(tmp_path / "none"))
    with pytest.raises(UserError, match="names no file"):
        push_version(tmp_path, image_uri(f"oci://{oci_registry.host}/models/x", "r"), tmp_path, HINT)


def test_no_credentials_at_all_says_where_they_were_looked_for(oci_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_FILE_ENV, str(tmp_path / "absent.json"))
    folder = tmp_path / "upload"
    version_folder(folder)
    with pytest.raises(UserError, match="refused an anonymous push.*found no registry credentials.*model_oci_secret"):
        push_version(folder, image_uri(f"oci://{oci_registry.host}/models/anon", "r"), tmp_path, HINT)


def test_no_credential_reaches_an_output_of_the_store_step(oci_registry, s3_server, tmp_path):
    """The canary: the S3 secret key and the registry password (and its base64 form in the auth file) appear in
    neither the step's output nor any file it writes, when it succeeds and when the registry refuses it."""
    import base64

    import boto3

    from common.run_layout import PUBLISH, UPLOAD, stage_dir
    from tests.conftest import run_module
    from tests.oci_registry import PASSWORD, USER

    s3_key = "CANARY-s3-secret-key-9f3e1a"
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "canary-id"}
    env |= {"AWS_SECRET_ACCESS_KEY": s3_key, "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="canary-id",
                 aws_secret_access_key=s3_key).create_bucket(Bucket="canary")  # fmt: skip
    workspace = tmp_path / "workspace"
    version_folder(stage_dir(workspace, "run-1", PUBLISH) / UPLOAD)
    secrets = [s3_key, PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()]
    wrong = oci_registry.auth_file_with(tmp_path, USER, "CANARY-wrong-password")
    for auth_file, expected_rc, canaries in ((oci_registry.auth_file, 0, secrets), (wrong, 2, ["CANARY-wrong"])):
        result = run_module(
            "components.store.stage", "--workspace-root", workspace, "--run-id", "run-1", "--model-name", "smol",
            "--s3-uri", "s3://canary/models", "--oci-uri", f"oci://{oci_registry.host}/models/canary",
            env={**env, AUTH_FILE_ENV: str(auth_file)}, timeout=300,
        )  # fmt: skip
        assert result.returncode == expected_rc, result.stderr
        for canary in canaries:
            assert canary not in result.stdout + result.stderr
            assert not [
                path for path in workspace.rglob("*") if path.is_file() and canary.encode() in path.read_bytes()
            ]
    assert "credentials are wrong" in " ".join(result.stderr.split()) and "Traceback" not in result.stderr


@pytest.fixture
def stalling_registry():
    """A registry that answers the /v2/ probe and then never answers a push: a real socket that stops talking,
    as a registry behind a hung proxy does."""
    import threading
    from http.server import BaseHTTPRequestHandler

    from tests.local_server import LocalServer

    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def _answer_or_stall(self) -> None:
            if self.path.rstrip("/") == "/v2":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                release.wait(60)

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _answer_or_stall

        def log_message(self, *args) -> None:
            pass

    with LocalServer(Handler) as server:
        yield server.url.removeprefix("http://")
        release.set()


def test_a_registry_that_stops_answering_ends_the_push_with_the_fix(stalling_registry, tmp_path, monkeypatch):
    import time

    from components.store import oci_target

    monkeypatch.delenv(AUTH_FILE_ENV, raising=False)
    monkeypatch.setattr(oci_target, "PUSH_TIMEOUT", (5.0, 1.0))
    from types import SimpleNamespace

    import oras.provider  # noqa: F401  (imports oras.decorator whole)

    # oras-py's own 5 tries, without the 131 s it sleeps between them
    monkeypatch.setattr("oras.decorator.time", SimpleNamespace(sleep=lambda seconds: None))
    version_folder(tmp_path / "upload")
    started = time.monotonic()
    with pytest.raises(UserError, match=r"stopped answering while this step pushed .* Nothing was tagged"):
        push_version(tmp_path / "upload", f"oci://{stalling_registry}/models/x:r", tmp_path / "store", HINT)
    assert time.monotonic() - started < 20  # 5 tries of 1 s each, not the minutes a stalled push took
