"""The S3 model storage target against a real S3 implementation on 127.0.0.1 (moto's server).

moto's ``ThreadedMotoServer`` serves the S3 REST API over HTTP, so the boto3
client, its retries and its multipart transfers run exactly as against a bucket
in the cluster; a second server, started as its own process with moto's
authentication switched on, refuses unknown credentials as S3 does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from fake_run import training_summary

import components.store.s3_target as s3_target
from common.errors import UserError
from common.s3 import client_from_environment, keys_under
from components.store.options import StorageOptions, option_problems
from components.store.s3_target import COMPLETE_MARKER, upload_version, version_uri

BUCKET = "models"
HINT = "the step reads them from the Secret named by model_s3_secret"


def use_endpoint(monkeypatch, endpoint: str, key: str = "testing") -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def bucket(s3_server, monkeypatch):
    use_endpoint(monkeypatch, s3_server)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for key in keys_under(client, BUCKET, ""):
        client.delete_object(Bucket=BUCKET, Key=key)
    client.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def model(tmp_path):
    """An upload folder as the publish stage lays it out: a checkpoint at the top, reports in folders."""
    folder = tmp_path / "upload"
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": os.urandom(4096),
        "smol-ft-q8_0.gguf": b"GGUF" + os.urandom(1024),
        "README.md": b"# smol-ft\n",
        "evaluation/evaluation.json": b'{"gate": {"passed": true}}',
    }
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder, files


def written(client) -> list[tuple[str, str]]:
    """Record each write the client sends: (operation, key)."""
    calls: list[tuple[str, str]] = []
    writes = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "DeleteObject")

    def record(model, params, **_):
        if model.name in writes:
            calls.append((model.name, params.get("Key")))

    client.meta.events.register("before-parameter-build.s3", record)
    return calls


def test_the_version_goes_under_model_and_run():
    assert version_uri("s3://models", "smol-ft", "run-1") == "s3://models/smol-ft/run-1/"
    assert version_uri("s3://models/team/a/", "smol-ft", "run-1") == "s3://models/team/a/smol-ft/run-1/"
    for wrong in ("models/team", "s3:///team", "https://models/team", "s3://models?x=1", "s3://models#team/a"):
        with pytest.raises(UserError, match="is not an S3 location"):
            version_uri(wrong, "smol-ft", "run-1")
        # The first step refuses the same values, before anything is trained.
        assert "s3_uri" in option_problems(StorageOptions(s3_uri=wrong))
    assert option_problems(StorageOptions(s3_uri="s3://models/team")) == {}


def test_every_file_lands_and_the_marker_comes_last(bucket, model):
    folder, files = model
    client = client_from_environment()
    calls = written(client)
    uri = version_uri(f"s3://{BUCKET}/team", "smol-ft", "run-1")
    copy = upload_version(folder, uri, HINT, client)

    prefix = "team/smol-ft/run-1/"
    assert (copy.uri, copy.files, copy.total_bytes) == (uri, 5, sum(map(len, files.values())))
    assert keys_under(bucket, BUCKET, prefix) == sorted([prefix + COMPLETE_MARKER, *(prefix + n for n in files)])
    for name, data in files.items():
        assert bucket.get_object(Bucket=BUCKET, Key=prefix + name)["Body"].read() == data
    marker = json.loads(bucket.get_object(Bucket=BUCKET, Key=prefix + COMPLETE_MARKER)["Body"].read())
    assert marker == {"files": {name: len(data) for name, data in files.items()}}
    assert calls[0] == ("DeleteObject", prefix + COMPLETE_MARKER), "an earlier marker goes first"
    assert calls[-1] == ("PutObject", prefix + COMPLETE_MARKER), "the marker is written last"


def test_a_large_file_goes_up_in_parts(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(s3_target, "MULTIPART_CHUNK", 5 << 20)  # S3's smallest part
    folder = tmp_path / "upload"
    folder.mkdir()
    data = os.urandom(11 << 20)
    (folder / "model.safetensors").write_bytes(data)
    client = client_from_environment()
    calls = written(client)
    upload_version(folder, f"s3://{BUCKET}/big/", HINT, client)
    assert [op for op, _ in calls].count("UploadPart") == 3
    assert bucket.get_object(Bucket=BUCKET, Key="big/model.safetensors")["Body"].read() == data


def test_a_transient_refusal_is_retried(bucket, model):
    """S3 answers 503 SlowDown to the first attempt at a file (throttling, as a busy store does): the client retries
    it (botocore's standard mode) and the version still lands whole."""
    from botocore.awsrequest import AWSResponse

    folder, files = model
    client = client_from_environment()
    attempts: dict[str, int] = {}

    def slow_down_once(request, **_):
        key = request.url.split("?")[0].rsplit(f"/{BUCKET}/", 1)[-1]
        if request.method == "PUT" and key.endswith("model.safetensors"):
            attempts[key] = attempts.get(key, 0) + 1
            if attempts[key] == 1:
                body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                return AWSResponse(request.url, 503, {}, _Raw(body))
        return None

    client.meta.events.register("before-send.s3", slow_down_once)
    upload_version(folder, f"s3://{BUCKET}/smol-ft/run-6/", HINT, client)
    assert attempts == {"smol-ft/run-6/model.safetensors": 2}
    assert (
        bucket.get_object(Bucket=BUCKET, Key="smol-ft/run-6/model.safetensors")["Body"].read()
        == files["model.safetensors"]
    )
    assert COMPLETE_MARKER in {key.rsplit("/", 1)[-1] for key in keys_under(bucket, BUCKET, "smol-ft/run-6/")}


class _Raw:
    """The raw body of a stand-in HTTP answer, as botocore reads it."""

    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def test_a_copy_cut_off_midway_is_not_complete_and_the_retried_step_completes_it(bucket, model):
    """The step dies after some files (a dropped connection that outlasted the retries); the version has no
    marker, so no reader takes it. The retried step uploads again, drops what the folder no longer has, and
    writes the marker."""
    folder, files = model
    uri, prefix = f"s3://{BUCKET}/smol-ft/run-2/", "smol-ft/run-2/"
    bucket.put_object(Bucket=BUCKET, Key=prefix + "stale-from-an-older-attempt.bin", Body=b"old")
    bucket.put_object(Bucket=BUCKET, Key=prefix + COMPLETE_MARKER, Body=b"{}")
    client = client_from_environment()
    puts = []

    def cut_off(model, params, **_):
        if model.name == "PutObject":
            puts.append(params["Key"])
            if len(puts) == 3:
                raise EndpointConnectionError(endpoint_url=os.environ["AWS_ENDPOINT_URL"])

    client.meta.events.register("before-parameter-build.s3", cut_off)
    with pytest.raises(UserError, match="Could not write"):
        upload_version(folder, uri, HINT, client)
    assert prefix + COMPLETE_MARKER not in keys_under(bucket, BUCKET, prefix)

    upload_version(folder, uri, HINT)
    assert keys_under(bucket, BUCKET, prefix) == sorted([prefix + COMPLETE_MARKER, *(prefix + n for n in files)])


@pytest.fixture(scope="module")
def guarded_server():
    """moto's server in its own process with authentication on after one request (which creates the bucket)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.2)
    yield endpoint
    server.terminate()
    server.wait(timeout=30)


def test_wrong_credentials_are_a_clear_error_and_write_nothing(guarded_server, model, monkeypatch):
    folder, _ = model
    use_endpoint(monkeypatch, guarded_server, key="not-a-key")
    boto3.client("s3").create_bucket(Bucket=BUCKET)  # the one request let through
    with pytest.raises(UserError) as refused:
        upload_version(folder, f"s3://{BUCKET}/smol-ft/run-3/", HINT)
    message = str(refused.value)
    assert "S3 refused DeleteObject on s3://models/smol-ft/run-3/ (InvalidAccessKeyId)" in message
    assert HINT in message and "not-a-key" not in message


def test_a_policy_that_may_not_put_objects_is_a_clear_error(bucket, model):
    """The first requests pass, the uploads are refused (a policy without s3:PutObject, a quota): boto3's transfer
    manager wraps the refusal in its own error, which must still end as one paragraph, not a traceback."""
    from botocore.awsrequest import AWSResponse

    folder, _ = model
    client = client_from_environment()

    def deny_puts(request, **_):
        if request.method == "PUT":
            body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            return AWSResponse(request.url, 403, {}, _Raw(body))
        return None

    client.meta.events.register("before-send.s3", deny_puts)
    with pytest.raises(UserError) as refused:
        upload_version(folder, f"s3://{BUCKET}/smol-ft/run-7/", HINT, client)
    assert "S3 refused PutObject on s3://models/smol-ft/run-7/ (AccessDenied)" in str(refused.value)
    assert "s3:PutObject" in str(refused.value)


def test_the_store_step_copies_the_published_folder_under_the_models_name(bucket, model, tmp_path):
    """The step reads the publish step's upload folder (a dry run writes it too) and names the version after the
    export's model name, or the base model's name followed by -ft."""
    from common.run_layout import UPLOAD, stage_dir
    from components.champion.record import DeliveryRecord
    from components.store.stage import run_step

    folder, files = model
    workspace = tmp_path / "workspace"
    stage_dir(workspace, "run-4", "publish").mkdir(parents=True)
    folder.rename(stage_dir(workspace, "run-4", "publish") / UPLOAD)
    train_dir = stage_dir(workspace, "run-4", "train")
    train_dir.mkdir(parents=True)
    training_summary("org/SmolLM2-135M").write(train_dir / "training_summary.json")
    inputs = {"workspace_root": str(workspace), "run_id": "run-4", "train_dir": str(train_dir), "model_name": ""}
    inputs |= {"s3_uri": f"s3://{BUCKET}/team", "s3_secret": "aws-connection-models"}

    assert run_step(inputs) == f"s3://{BUCKET}/team/SmolLM2-135M-ft/run-4/"
    prefix = "team/SmolLM2-135M-ft/run-4/"
    assert keys_under(bucket, BUCKET, prefix) == sorted([prefix + COMPLETE_MARKER, *(prefix + n for n in files)])
    assert DeliveryRecord.read(workspace, "run-4").missing == ("register", "serve")
    DeliveryRecord.path(workspace, "run-4").unlink()  # else the step would not store the recorded version again
    assert run_step({**inputs, "s3_uri": ""}) == "", "no target: nothing to copy"


def test_the_store_step_without_a_published_version_says_what_to_run(tmp_path, capsys):
    from components.store.stage import run_step

    inputs = {"workspace_root": str(tmp_path), "run_id": "run-5", "train_dir": str(tmp_path), "model_name": "m"}
    with pytest.raises(SystemExit) as exited:
        run_step({**inputs, "s3_uri": f"s3://{BUCKET}", "s3_secret": "aws-connection-models"})
    assert exited.value.code == 2
    assert "holds no published version" in " ".join(capsys.readouterr().err.split())


def test_a_store_that_fails_is_left_to_finish_and_one_that_completed_is_not_repeated(
    bucket, model, tmp_path, monkeypatch, capsys
):
    """The S3 endpoint is down after publish: the step fails with its paragraph, and the version's delivery record
    still lacks store, so the next run on the same data stores it. Once stored, the step (retried, or run again to
    finish the version) does not copy it again."""
    import common.s3
    from common.run_layout import UPLOAD, stage_dir
    from components.champion.record import DELIVERY_STEPS, DeliveryRecord
    from components.store.stage import run_step

    folder, files = model
    workspace = tmp_path / "workspace"
    stage_dir(workspace, "run-6", "publish").mkdir(parents=True)
    folder.rename(stage_dir(workspace, "run-6", "publish") / UPLOAD)
    DeliveryRecord("run-6").write(workspace)  # as the publish step leaves it
    inputs = {"workspace_root": str(workspace), "run_id": "run-6", "train_dir": str(tmp_path), "model_name": "m"}
    inputs |= {"s3_uri": f"s3://{BUCKET}/team", "s3_secret": "aws-connection-models"}
    s3_endpoint = os.environ["AWS_ENDPOINT_URL"]
    with socket.socket() as probe:  # a port nothing listens on: the endpoint is down
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{probe.getsockname()[1]}")
    monkeypatch.setattr(common.s3, "S3_ATTEMPTS", 1)
    with pytest.raises(SystemExit) as exited:
        run_step(inputs)
    assert exited.value.code == 2 and "Could not write s3://models/team/m/run-6/" in capsys.readouterr().err
    assert DeliveryRecord.read(workspace, "run-6").missing == DELIVERY_STEPS

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    assert run_step(inputs) == f"s3://{BUCKET}/team/m/run-6/"
    assert DeliveryRecord.read(workspace, "run-6").missing == ("register", "serve")
    prefix = "team/m/run-6/"
    assert keys_under(bucket, BUCKET, prefix) == sorted([prefix + COMPLETE_MARKER, *(prefix + n for n in files)])
    for key in keys_under(bucket, BUCKET, prefix):
        bucket.delete_object(Bucket=BUCKET, Key=key)
    assert run_step(inputs) == f"s3://{BUCKET}/team/m/run-6/"  # from the store record: nothing is sent
    assert "run run-6's version was stored already" in capsys.readouterr().out
    assert keys_under(bucket, BUCKET, prefix) == []
