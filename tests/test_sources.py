"""Datasets named by URL: fetched into the run's data directory, then prepared like local files.

The servers are local stand-ins, since nothing outside this machine can be
reached: an HTTP server on 127.0.0.1, moto's S3 server (``ThreadedMotoServer``)
on 127.0.0.1 for S3 and S3-compatible stores, and ``tests/fake_hub.py``, a fake
Hugging Face Hub on 127.0.0.1, for ``hf://datasets/...``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from conftest import REPO_ROOT, qa, read_split, read_stats, run_cli, write_jsonl
from fake_hub import FakeHub
from first_step_run import paragraph, run_first_step
from huggingface_hub import constants
from local_server import LocalServer

from common.errors import UserError
from common.records import DataStats, RemoteVersion, SourceLineage
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.data.stage import locate_dataset_uri, resolve_inputs_of
from components.sample_data import bundled_dataset_path
from tests.yaml_files import read_yaml_documents

SAMPLE = bundled_dataset_path().read_bytes()
LINES = b"".join(json.dumps(qa(i)).encode() + b"\n" for i in range(3))


class StaticServer(LocalServer):
    """Serves ``routes``: path -> list of (status, body) answered in turn (the last one repeats)."""

    def __init__(self, routes: dict[str, list[tuple[int, bytes]]]) -> None:
        self.routes = routes
        self.hits: list[str] = []
        self.etag = ""  # sent with every answer when set
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                server.hits.append(path)
                answers = server.routes.get(path, [(404, b"not found")])
                status, body = answers.pop(0) if len(answers) > 1 else answers[0]
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if server.etag:
                    self.send_header("ETag", server.etag)
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


@pytest.fixture
def web():
    with StaticServer({}) as server:
        yield server


# --- HTTP --------------------------------------------------------------------------------------


def test_http_file_prepares_like_the_local_file(web, tmp_path, prepared_data_dir):
    """Same bytes, same prepared data: the fingerprint does not depend on where the file came from."""
    web.routes["/data/practical_skills.jsonl"] = [(200, SAMPLE)]
    inputs = locate_dataset_uri(f"{web.url}/data/practical_skills.jsonl", tmp_path / "out" / "source").input
    assert inputs == str(tmp_path / "out" / "source" / "practical_skills.jsonl")
    result = prepare(inputs, tmp_path / "out")
    assert result.stats.fingerprint == read_stats(prepared_data_dir)["fingerprint"]
    assert read_split(tmp_path / "out", "train") == read_split(prepared_data_dir, "train")


def test_http_gzip_without_a_file_name_is_recognised(web, tmp_path, capsys):
    web.routes["/download"] = [(200, gzip.compress(LINES))]
    inputs = locate_dataset_uri(f"{web.url}/download?X-Amz-Signature=s3cr3t", tmp_path / "source").input
    assert inputs.endswith("dataset.jsonl.gz")
    assert prepare(inputs, tmp_path / "out").stats.records == 3
    assert "s3cr3t" not in capsys.readouterr().out  # a presigned URL's query is never printed


def test_lineage_of_a_local_file_and_of_an_http_file_with_its_etag(web, tmp_path):
    """The content's digest is the text read, whatever carried it; the HTTP file adds the ETag its server sent."""
    local = tmp_path / "qa.jsonl"
    local.write_bytes(LINES)
    (lineage,) = prepare(str(local), tmp_path / "local").stats.lineage
    assert lineage == SourceLineage(str(local), f"sha256:{hashlib.sha256(LINES).hexdigest()}", 1, RemoteVersion())
    assert DataStats.read(tmp_path / "local" / "stats.json").lineage == (lineage,)

    web.routes["/qa.jsonl.gz"] = [(200, gzip.compress(LINES))]
    web.etag = '"v1-abc"'
    source = resolve_inputs_of(f"{web.url}/qa.jsonl.gz", "", tmp_path / "web" / "source", PrepareOptions(), "sft")
    (fetched,) = prepare(source, tmp_path / "web").stats.lineage
    assert (fetched.uri, fetched.content, fetched.remote) == (
        f"{web.url}/qa.jsonl.gz",
        lineage.content,  # the decompressed text
        RemoteVersion(etag='"v1-abc"'),
    )


def test_a_source_is_recorded_without_its_query_string(web, tmp_path):
    """A dataset_sources URL whose query holds a credential under a name the first step's check does not know
    (the command line is not checked at all): fetched with it, recorded and reported without it."""
    web.routes["/qa.jsonl"] = [(200, LINES)]
    listed = json.dumps(
        [{"uri": f"{web.url}/qa.jsonl?code=s3cr3t"}, {"uri": str(write_jsonl(tmp_path / "b.jsonl", [qa(7)]))}]
    )
    sources = resolve_inputs_of("", listed, tmp_path / "out" / "source", PrepareOptions(), "sft")
    prepare(sources, tmp_path / "out")
    assert web.hits == ["/qa.jsonl"]
    for name in ("stats.json", "report.md"):
        text = (tmp_path / "out" / name).read_text()
        assert f"{web.url}/qa.jsonl" in text and "s3cr3t" not in text


def test_an_unreachable_hub_is_a_clear_error(monkeypatch, tmp_path):
    """Nothing listens on the endpoint: the revision cannot be resolved, and the step says so in one sentence."""
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(UserError, match="^Could not reach the Hub to download the dataset me/qa; check the connection"):
        locate_dataset_uri("hf://datasets/me/qa", tmp_path / "source")


def test_http_server_error_is_retried(web, tmp_path):
    web.routes["/qa.jsonl"] = [(503, b"busy"), (200, LINES)]
    inputs = locate_dataset_uri(f"{web.url}/qa.jsonl", tmp_path / "source").input
    assert Path(inputs).read_bytes() == LINES and web.hits == ["/qa.jsonl", "/qa.jsonl"]


@pytest.mark.parametrize(
    ("status", "words"), [(404, "does not exist (HTTP 404)"), (401, "refused"), (403, "presigned URL")]
)
def test_http_errors_are_clear_and_leave_no_file(web, tmp_path, status, words):
    web.routes["/qa.jsonl"] = [(status, b"no")]
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")) as raised:
        locate_dataset_uri(f"{web.url}/qa.jsonl?token=abc", tmp_path / "source").input
    assert "token=abc" not in str(raised.value)
    assert list((tmp_path / "source").iterdir()) == []


def test_unknown_scheme_is_refused(tmp_path):
    with pytest.raises(UserError, match="scheme 'ftp'.*hf://datasets/owner/name"):
        locate_dataset_uri("ftp://host/qa.jsonl", tmp_path / "source").input


# --- S3 ----------------------------------------------------------------------------------------


def test_s3_prefix_fetches_every_jsonl_object_below_it(s3, tmp_path):
    s3.put_object(
        Bucket="qa-data", Key="qa/a.jsonl", Body=write_jsonl(tmp_path / "a.jsonl", [qa(1), qa(2)]).read_bytes()
    )
    s3.put_object(
        Bucket="qa-data",
        Key="qa/more/b.jsonl.gz",
        Body=gzip.compress(write_jsonl(tmp_path / "b.jsonl", [qa(3)]).read_bytes()),
    )
    s3.put_object(Bucket="qa-data", Key="qa/README.txt", Body=b"not data")
    s3.put_object(Bucket="qa-data", Key="qa-old/c.jsonl", Body=b"{}\n")  # shares the prefix text, not the folder
    inputs = locate_dataset_uri("s3://qa-data/qa", tmp_path / "out" / "source").input
    fetched = sorted(
        p.relative_to(tmp_path / "out" / "source").as_posix()
        for p in (tmp_path / "out" / "source").rglob("*")
        if p.is_file()
    )
    assert fetched == ["a.jsonl", "more/b.jsonl.gz"]
    assert prepare(inputs, tmp_path / "out").stats.records == 3


def test_s3_lineage_names_the_object_version_read(s3, tmp_path):
    """In a versioned bucket each object's VersionId and ETag are recorded; a new version of the object is a new
    lineage, and the prefix form records a digest of every object's key, ETag and version."""
    s3.put_bucket_versioning(Bucket="qa-data", VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket="qa-data", Key="qa/a.jsonl", Body=LINES)
    source = resolve_inputs_of("s3://qa-data/qa/a.jsonl", "", tmp_path / "source", PrepareOptions(), "sft")
    (lineage,) = prepare(source, tmp_path / "one").stats.lineage
    assert lineage.uri == "s3://qa-data/qa/a.jsonl" and lineage.files == 1
    assert lineage.remote == RemoteVersion(etag=first["ETag"], version_id=first["VersionId"])
    assert first["VersionId"] in lineage.described()

    second = s3.put_object(Bucket="qa-data", Key="qa/a.jsonl", Body=LINES + json.dumps(qa(9)).encode() + b"\n")
    source = resolve_inputs_of("s3://qa-data/qa/a.jsonl", "", tmp_path / "source", PrepareOptions(), "sft")
    (newer,) = prepare(source, tmp_path / "two").stats.lineage
    assert newer.remote.version_id == second["VersionId"] != first["VersionId"]
    assert newer.content != lineage.content

    prefix = resolve_inputs_of("s3://qa-data/qa/", "", tmp_path / "source", PrepareOptions(), "sft")
    assert prefix.remote.objects.startswith("sha256:") and not prefix.remote.version_id


def test_s3_single_object(s3, tmp_path):
    s3.put_object(Bucket="qa-data", Key="exports/qa.jsonl", Body=LINES)
    inputs = locate_dataset_uri("s3://qa-data/exports/qa.jsonl", tmp_path / "source").input
    assert Path(inputs).read_bytes() == LINES


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://qa-data/missing.jsonl", "does not exist"),
        ("s3://no-such-bucket/qa/", "does not exist"),
        ("s3://qa-data/empty/", "No .jsonl or .jsonl.gz objects are under s3://qa-data/empty/"),
    ],
)
def test_s3_missing_data_is_a_clear_error(s3, tmp_path, uri, words):
    with pytest.raises(UserError, match=words):
        locate_dataset_uri(uri, tmp_path / "source").input
    assert [p for p in (tmp_path / "source").rglob("*") if p.is_file()] == []


def test_s3_without_credentials_names_the_variables(s3_server, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(UserError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        locate_dataset_uri("s3://qa-data/qa.jsonl", tmp_path / "source").input


# --- Hugging Face Hub datasets -----------------------------------------------------------------

HUB_TOKEN = "hf_dataset_reader"


@pytest.fixture
def hub(monkeypatch):
    with FakeHub({HUB_TOKEN}) as fake:
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(
            constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.url + "/{repo_id}/resolve/{revision}/{filename}"
        )
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield fake


def test_hub_dataset_fetches_only_its_jsonl_files(hub, tmp_path):
    hub.add_repo(
        "dataset",
        "me/qa",
        {
            "README.md": b"# qa",
            "data/train.jsonl": LINES,
            "data/more.jsonl.gz": gzip.compress(LINES),
            "data/train.parquet": b"PAR1",
        },
    )
    inputs = locate_dataset_uri("hf://datasets/me/qa", tmp_path / "out" / "source").input
    files = sorted(
        p.relative_to(tmp_path / "out" / "source").as_posix() for p in (tmp_path / "out" / "source").glob("data/*")
    )
    assert files == ["data/more.jsonl.gz", "data/train.jsonl"]
    assert prepare(inputs, tmp_path / "out").stats.records == 6


def test_hub_dataset_lineage_is_the_commit_read(hub, tmp_path):
    repo = hub.add_repo("dataset", "me/qa", {"data/train.jsonl": LINES})
    source = resolve_inputs_of("hf://datasets/me/qa", "", tmp_path / "source", PrepareOptions(), "sft")
    (lineage,) = prepare(source, tmp_path / "out").stats.lineage
    assert lineage.remote == RemoteVersion(revision=repo.head) and lineage.uri == "hf://datasets/me/qa"


def test_hub_dataset_path_selects_one_file(hub, tmp_path):
    hub.add_repo("dataset", "me/qa", {"data/train.jsonl": LINES, "data/other.jsonl": b"{}\n"})
    inputs = locate_dataset_uri("hf://datasets/me/qa/data/train.jsonl", tmp_path / "source").input
    assert prepare(inputs, tmp_path / "out").stats.records == 3


def test_private_hub_dataset_uses_hf_token(hub, tmp_path, monkeypatch):
    hub.add_repo("dataset", "me/private-qa", {"qa.jsonl": LINES}, private=True)
    with pytest.raises(
        UserError, match="does not exist or this token cannot see it. If it is private or gated, set HF_TOKEN"
    ):
        locate_dataset_uri("hf://datasets/me/private-qa", tmp_path / "source").input
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    assert (
        prepare(
            locate_dataset_uri("hf://datasets/me/private-qa", tmp_path / "source").input, tmp_path / "out"
        ).stats.records
        == 3
    )


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("hf://datasets/me/absent", "does not exist"),
        ("hf://me/qa", "names a Hub model, not a dataset"),
        ("hf://datasets/me", "is not a Hub dataset URI"),
        ("hf://datasets/me/no-jsonl", "has no .jsonl or .jsonl.gz files"),
    ],
)
def test_hub_dataset_errors_are_clear(hub, tmp_path, uri, words):
    hub.add_repo("dataset", "me/no-jsonl", {"train.parquet": b"PAR1"})
    with pytest.raises(UserError, match=words):
        locate_dataset_uri(uri, tmp_path / "source").input


def test_cli_takes_a_url(web, tmp_path):
    web.routes["/qa.jsonl.gz"] = [(200, gzip.compress(LINES))]
    result = run_cli("--input", f"{web.url}/qa.jsonl.gz", "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "source" / "qa.jsonl.gz").is_file()
    assert read_stats(tmp_path / "out")["records"] == 3


def test_s3_endpoint_of_an_openshift_ai_data_connection(s3, s3_server, monkeypatch, tmp_path):
    """Data connections name the endpoint AWS_S3_ENDPOINT instead of AWS_ENDPOINT_URL."""
    s3.put_object(Bucket="qa-data", Key="qa.jsonl", Body=LINES)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_S3_ENDPOINT", s3_server)
    assert Path(locate_dataset_uri("s3://qa-data/qa.jsonl", tmp_path / "source").input).read_bytes() == LINES


# --- URLs that carry a credential: from the data connection Secret, never a run parameter ----------------------

SIGNATURE = "5f0c1e9d2b7a4c3e8f6a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
SIGNED_QUERY = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLECANARY%2F20261127%2Fus-east-1%2Fs3%2Faws4_request"
    f"&X-Amz-Date=20261127T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={SIGNATURE}"
)
SIGNED_PARTS = (SIGNATURE, "AKIAEXAMPLECANARY")


class FlakyServer(LocalServer):
    """Serves ``body`` at every path, after dropping the first connection without an answer (urllib3 retries it
    and logs a warning naming the URL it retries)."""

    def __init__(self, body: bytes) -> None:
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                if len(server.requests) == 1:
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


def assert_secret_nowhere(text: str, *roots: Path) -> None:
    for part in SIGNED_PARTS:
        assert part not in text
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert all(part.encode() not in data for part in SIGNED_PARTS), path


@pytest.mark.parametrize(
    ("url", "carried"),
    [
        (f"https://bucket.s3.amazonaws.com/qa.jsonl?{SIGNED_QUERY}", "X-Amz-Credential"),
        ("https://bucket.s3.amazonaws.com/qa.jsonl?AWSAccessKeyId=AKIA&Expires=1&Signature=abc", "AWSAccessKeyId"),
        (
            "https://storage.googleapis.com/b/qa.jsonl?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature=abc",
            "X-Goog-Signature",
        ),
        ("https://acct.blob.core.windows.net/c/qa.jsonl?sv=2022-11-02&se=2026-12-01&sp=r&sig=abc%3D", "sig"),
        ("https://reader:hunter2@data.example/qa.jsonl", "a user name or password before the host"),
    ],
)
def test_a_url_that_carries_a_credential_is_not_a_run_parameter(url, carried):
    """What ``pipelines.run`` and ``submit`` check before a run exists (so it never reaches a run record) and the
    first step checks again: the URL is named without its credential, with the fix."""
    from components.run_form.checks import problems

    (problem,) = problems({"dataset_uri": url})
    assert problem.startswith("parameter 'dataset_uri' is a URL that carries a credential (") and carried in problem
    assert "key DATASET_URL of the data connection Secret (aws-connection-training-data" in problem
    assert "set dataset_uri to secret:DATASET_URL" in problem
    assert "abc" not in problem and "hunter2" not in problem and "AKIA" not in problem


def test_urls_without_a_credential_stay_parameters():
    from components.run_form.checks import problems

    for uri in (
        "https://data.example/qa.jsonl?version=3",
        "s3://bucket/qa/",
        "hf://datasets/me/qa",
        "",
        "data/*.jsonl",
    ):
        assert problems({"dataset_uri": uri}) == [], uri


def test_the_first_step_refuses_a_signed_url_in_one_paragraph():
    result = run_first_step({"dataset_uri": f"https://bucket.s3.amazonaws.com/qa.jsonl?{SIGNED_QUERY}"})
    assert result.returncode == 2, result.stdout + result.stderr
    message = paragraph(result.stderr)
    assert message.startswith("error: The run parameters are invalid: parameter 'dataset_uri' is a URL that carries")
    assert "(https://bucket.s3.amazonaws.com/qa.jsonl, with the query parameter X-Amz-Credential)" in message
    assert "set dataset_uri to secret:DATASET_URL" in message
    assert_secret_nowhere(result.stdout + result.stderr)


def test_the_first_step_needs_the_secret_key_a_secret_reference_names():
    """secret:DATASET_URL without the key (or the Secret) is refused before any data is touched, naming the
    Secret; with it the step passes and never prints the URL. Only that one key may be named."""
    missing = run_first_step({"dataset_uri": "secret:DATASET_URL", "data_connection_secret": "qa-connection"})
    assert missing.returncode == 2
    message = paragraph(missing.stderr)
    assert "parameter 'dataset_uri' is secret:DATASET_URL, but the key DATASET_URL of the Secret 'qa-connection'" in (
        message
    )
    assert "oc create secret generic qa-connection --from-literal=DATASET_URL=<url>" in message

    signed = f"https://bucket.s3.amazonaws.com/qa.jsonl?{SIGNED_QUERY}"
    present = run_first_step({"dataset_uri": "secret:DATASET_URL"}, {"DATASET_URL": signed})
    assert present.returncode == 0, present.stderr
    assert_secret_nowhere(present.stdout + present.stderr)

    wrong = run_first_step(
        {"dataset_uri": "secret:DATASET_URL"}, {"DATASET_URL": f"ftp://host/qa.jsonl?{SIGNED_QUERY}"}
    )
    assert wrong.returncode == 2 and "(ftp://host/qa.jsonl) is not an https://" in paragraph(wrong.stderr)
    assert_secret_nowhere(wrong.stderr)

    from components.run_form.checks import problems

    (other,) = problems({"dataset_uri": "secret:AWS_SECRET_ACCESS_KEY"})
    assert "the only Secret reference is secret:DATASET_URL" in other


# The prepare step as its pod runs it: KFP's executor logging (INFO and up, to stdout), the component's body, and the
# metadata its artifacts get (which KFP stores in the run's record).
PREPARE_STEP = """
import json, sys
from kfp import dsl
from kfp.dsl.executor_main import _setup_logging
from components.pipeline_steps.stages import prepare_dataset

_setup_logging()
out = sys.argv[1]
artifacts = {
    name: kind(uri=f"{out}/artifacts/{name}")
    for name, kind in (("train_data", dsl.Dataset), ("eval_data", dsl.Dataset), ("rejects", dsl.Dataset),
                       ("report", dsl.Markdown),
                       ("metrics", dsl.Metrics))
}
outputs = prepare_dataset.python_func(
    dataset_uri="secret:DATASET_URL", dataset_sources="", workspace_root=f"{out}/workspace", run_id="run-1",
    eval_fraction=0.3, seed=42,
    max_reject_fraction=0.05, system_prompt="", field_map="", decontaminate=True, max_contamination=1.0,
    objective="sft", benchmark_tasks="", benchmark_limit=0, benchmark_allow_code=False, **artifacts
)
print(json.dumps({"outputs": list(outputs), **{name: a.metadata for name, a in artifacts.items()}}))
"""


def test_a_signed_url_from_the_secret_is_read_and_never_printed_or_written(tmp_path):
    """The prepare step with the URL in DATASET_URL (the data connection Secret's key in the cluster): the data is
    read, through a dropped connection that urllib3 retries and logs a warning about, and neither the step's log
    nor any file it writes nor its artifacts' metadata holds the signature or the access key."""
    with FlakyServer(LINES) as server:
        env = {**os.environ, "DATASET_URL": f"{server.url}/exports/qa.jsonl?{SIGNED_QUERY}"}
        result = subprocess.run(
            [sys.executable, "-c", PREPARE_STEP, str(tmp_path / "out")],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(server.requests) == 2 and server.requests[1] == f"/exports/qa.jsonl?{SIGNED_QUERY}"
    assert "Retrying" in result.stdout and "/exports/qa.jsonl?<redacted>" in result.stdout  # the warning, redacted
    assert f"fetching {server.url}/exports/qa.jsonl (from DATASET_URL)" in result.stdout
    recorded = json.loads(result.stdout.splitlines()[-1])
    assert recorded["train_data"]["rows"] + recorded["eval_data"]["rows"] == 3
    data = tmp_path / "out" / "workspace" / "runs" / "run-1" / "data"
    assert (data / "source" / "qa.jsonl").read_bytes() == LINES
    assert read_stats(data)["records"] == 3
    assert_secret_nowhere(result.stdout + result.stderr, tmp_path / "out")


def test_a_secret_reference_without_the_variable_is_a_clear_error_naming_the_parameter(tmp_path, monkeypatch):
    """The fetch's messages name the URI; the parameter it came from, dataset_uri or one of dataset_sources, is
    named once, first."""
    monkeypatch.delenv("DATASET_URL", raising=False)
    options, download = PrepareOptions(), tmp_path / "source"
    with pytest.raises(UserError) as single:
        resolve_inputs_of("secret:DATASET_URL", "", download, options, "sft")
    assert str(single.value).startswith(
        "dataset_uri: the URI is secret:DATASET_URL, but the environment variable DATASET_URL is empty or unset."
    )
    present = write_jsonl(tmp_path / "present.jsonl", [qa(1)])
    listed = json.dumps([str(present), "secret:DATASET_URL"])
    with pytest.raises(UserError) as among:
        resolve_inputs_of("", listed, download, options, "sft")
    assert str(among.value).startswith(
        "dataset_sources, source 2 (secret:DATASET_URL): the URI is secret:DATASET_URL, but the environment variable"
    )
    assert "dataset_uri" not in str(among.value)
    with pytest.raises(UserError, match="the only Secret reference is secret:DATASET_URL"):
        locate_dataset_uri("secret:AWS_SECRET_ACCESS_KEY", tmp_path / "source").input


def test_the_secret_key_reaches_the_first_step_and_the_prepare_step_only():
    """Optional, from the Secret data_connection_secret names: a run that does not use it needs no key."""
    _, platform = read_yaml_documents(REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml")
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mapped = {
        label: secret
        for label, executor in executors.items()
        for secret in executor.get("secretAsEnv", [])
        if {"envVar": "DATASET_URL", "secretKey": "DATASET_URL"} in secret["keyToEnv"]
    }
    assert set(mapped) == {"exec-validate-parameters", "exec-prepare-dataset"}
    for secret in mapped.values():
        assert secret["optional"] is True
        assert secret["secretNameParameter"] == {"componentInputParameter": "data_connection_secret"}
