"""``python -m pipelines.submit``: runs and recurring runs on a KFP server, checked before sending.

No Kubeflow Pipelines server can run here, so these tests use ``tests/fake_kfp.py``,
a fake KFP v2beta1 API server on 127.0.0.1 that records what it receives.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
import yaml
from conftest import REPO_ROOT
from fake_kfp import FakeKfp
from kfp.client import client as kfp_client
from local_server import LocalServer, non_loopback_address

from pipelines.backend_versions import MINIMUM_BACKEND
from pipelines.cron import validate_cron
from pipelines.submit import main
from tests.yaml_files import read_yaml_documents

TOKEN = "kfp-CANARY-9e2b7d41"
PACKAGE = REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml"
MINIMUM = ".".join(map(str, MINIMUM_BACKEND))


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No kfp context file, kubeconfig or KFP_TOKEN from the machine running the tests."""
    monkeypatch.setattr(kfp_client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KFP_TOKEN", raising=False)


@pytest.fixture
def server():
    with FakeKfp(token=TOKEN) as fake:
        yield fake


def submit(*args: str) -> int:
    return main(["--package", str(PACKAGE), *args])


def test_run_sends_the_package_and_typed_parameters(server, capfd):
    assert (
        submit(
            "--host",
            server.url,
            "--token",
            TOKEN,
            "--param",
            "eval_fraction=0.2",
            "--param",
            "dataset_uri=s3://qa/2026/",
            "--experiment",
            "tuning",
        )
        == 0
    )
    [experiment] = server.bodies("POST", "/apis/v2beta1/experiments")
    assert experiment["display_name"] == "tuning"
    [run] = server.bodies("POST", "/apis/v2beta1/runs")
    assert run["runtime_config"]["parameters"] == {"eval_fraction": 0.2, "dataset_uri": "s3://qa/2026/"}
    assert run["experiment_id"] == "exp-1"
    compiled = read_yaml_documents(PACKAGE)
    assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"] == compiled[0]["pipelineInfo"]
    assert run["pipeline_spec"]["platform_spec"] == compiled[1]  # the PVC settings travel with the run
    assert all(request.authorization == f"Bearer {TOKEN}" for request in server.received)
    output = capfd.readouterr()
    assert "started run run-1 in experiment 'tuning'" in output.out
    assert TOKEN not in output.out + output.err


def test_recurring_run_with_cron_and_parameters(capfd):
    with FakeKfp(token=TOKEN, experiments={"nightly": "exp-9"}) as server:
        assert (
            submit(
                "--host",
                server.url,
                "--token",
                TOKEN,
                "--schedule",
                "0 0 3 * * *",
                "--experiment",
                "nightly",
                "--param",
                "keep_pvc=true",
                "--name",
                "nightly retrain",
            )
            == 0
        )
    assert server.bodies("POST", "/apis/v2beta1/experiments") == []  # the existing experiment is reused
    assert server.bodies("POST", "/apis/v2beta1/runs") == []
    [recurring] = server.bodies("POST", "/apis/v2beta1/recurringruns")
    assert recurring["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * *"}}
    assert int(recurring["max_concurrency"]) == 1 and recurring["no_catchup"] is True and recurring["mode"] == "ENABLE"
    assert recurring["experiment_id"] == "exp-9" and recurring["display_name"] == "nightly retrain"
    assert recurring["runtime_config"]["parameters"] == {"keep_pvc": "true"}
    assert "pipelineInfo" in recurring["pipeline_spec"]["pipeline_spec"]
    assert TOKEN not in "".join(capfd.readouterr())


def test_catchup_flag(server):
    submit("--host", server.url, "--token", TOKEN, "--schedule", "@daily", "--catchup")
    assert server.bodies("POST", "/apis/v2beta1/recurringruns")[0]["no_catchup"] is False


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("0 3 * * *", "has five fields, but KFP reads six with seconds first"),
        ("0 0 3 * *", "Put the seconds in front: '0 0 0 3 * *'"),
        ("* * * * * * *", "has 7 fields; KFP takes six"),
        ("61 0 3 * * *", "the second field '61' is outside 0-59"),
        ("0 0 3 0 * *", "the day of month field '0' is outside 1-31"),
        ("0 0 3 * * FUNDAY", "the day of week field 'FUNDAY' is not a number from 0 to 6 or a name like SUN"),
        ("0 0 9-5 * * *", "is a range that ends before it starts"),
        ("0 */0 * * * *", "a step is a positive whole number"),
        ("@fortnightly", "is not a known descriptor"),
    ],
)
def test_bad_cron_is_rejected_before_any_request(server, capfd, cron, words):
    with pytest.raises(SystemExit) as exited:
        submit("--host", server.url, "--token", TOKEN, "--schedule", cron)
    assert exited.value.code == 2
    assert words in " ".join(capfd.readouterr().err.split())
    assert server.received == []


@pytest.mark.parametrize(
    "cron",
    [
        "0 0 3 * * *",
        "0 */15 * * * ?",
        "0 30 2 * * MON-FRI",
        "0 0 0 1 jan,jul *",
        "0 0,30 8-18/2 * * 1-5",
        "@every 6h30m",
        "@weekly",
    ],
)
def test_cron_forms_the_scheduler_accepts(cron):
    assert validate_cron(cron) == cron


@pytest.mark.parametrize(
    ("param", "words"),
    [
        ("epoch=3", "'epoch' is not a pipeline parameter (did you mean epochs?)"),
        ("eval_fraction=1.5", "parameter 'eval_fraction' must be above 0 and below 1"),
        ("split_seed=x", "must be a whole number"),
    ],
)
def test_bad_parameters_are_rejected_before_any_request(server, capfd, param, words):
    with pytest.raises(SystemExit):
        submit("--host", server.url, "--token", TOKEN, "--param", param)
    assert words in " ".join(capfd.readouterr().err.split())
    assert server.received == []


def test_token_from_the_environment(server, monkeypatch, capfd):
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    assert submit("--host", server.url) == 0
    assert {request.authorization for request in server.received} == {f"Bearer {TOKEN}"}
    output = capfd.readouterr().out
    assert "with the bearer token from $KFP_TOKEN" in output and TOKEN not in output


def test_token_from_the_kubeconfig(server, tmp_path, monkeypatch, capfd):
    """What `oc login` leaves: a context whose user has a token."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "work",
        "clusters": [{"name": "c", "cluster": {"server": "https://api.cluster.example:6443"}}],
        "users": [{"name": "me", "user": {"token": TOKEN}}],
        "contexts": [{"name": "work", "context": {"cluster": "c", "user": "me", "namespace": "ml"}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    assert submit("--host", server.url) == 0
    assert {request.authorization for request in server.received} == {f"Bearer {TOKEN}"}
    assert "from the current kubeconfig context" in capfd.readouterr().out


def test_refused_token_is_a_clear_error(server, capfd):
    with pytest.raises(SystemExit):
        submit("--host", server.url, "--token", "expired-token-123")
    error = " ".join(capfd.readouterr().err.split())
    assert "refused the request (HTTP 401)" in error and "oc login" in error
    assert "expired-token-123" not in error
    assert [request.path for request in server.received] == ["/apis/v2beta1/healthz"]  # one request, no 25 s of retries


def test_missing_package_is_a_clear_error(server, tmp_path, capfd):
    with pytest.raises(SystemExit):
        main(["--host", server.url, "--package", str(tmp_path / "nope.yaml")])
    assert "python -m pipelines.compile" in capfd.readouterr().err
    assert server.received == []


@pytest.mark.parametrize("schedule", [(), ("--schedule", "@daily")], ids=["run", "recurring run"])
def test_server_older_than_the_minimum_is_refused_before_anything_is_created(capfd, schedule):
    with FakeKfp(token=TOKEN, tag_name="2.14.4") as server:  # the last release before 2.15.0
        with pytest.raises(SystemExit) as exited:
            submit("--host", server.url, "--token", TOKEN, *schedule)
    assert exited.value.code == 2
    error = " ".join(capfd.readouterr().err.split())
    assert f"{server.url} runs Kubeflow Pipelines backend 2.14.4" in error
    assert f"older than {MINIMUM}, the oldest this pipeline runs on" in error
    assert "It lacks use_secret_as_env(..., optional=True) (from 2.15.0)." in error
    assert "Nothing was submitted. Upgrade the pipeline server: OpenShift AI to 3.0 or later" in error
    assert "Traceback" not in error
    assert [(request.method, request.path) for request in server.received] == [("GET", "/apis/v2beta1/healthz")]


@pytest.mark.parametrize("tag", [MINIMUM, "v2.16.1", "2.17.0"])
def test_server_at_or_above_the_minimum_gets_the_run(capfd, tag):
    with FakeKfp(token=TOKEN, tag_name=tag) as server:
        assert submit("--host", server.url, "--token", TOKEN) == 0
    assert len(server.bodies("POST", "/apis/v2beta1/runs")) == 1
    output = capfd.readouterr().out
    assert f"{server.url} runs Kubeflow Pipelines backend {tag}; this pipeline needs {MINIMUM} or later" in output


def test_server_without_a_version_gets_the_run_with_a_warning(capfd):
    """What OpenShift AI's data science pipelines server answers: tag_name "unknown", with pipeline_store."""
    with FakeKfp(token=TOKEN, tag_name="unknown") as server:
        assert submit("--host", server.url, "--token", TOKEN) == 0
    assert len(server.bodies("POST", "/apis/v2beta1/runs")) == 1
    output = " ".join(capfd.readouterr().out.split())
    assert (
        f"warning: {server.url} does not report its Kubeflow Pipelines backend version (tag_name 'unknown': " in output
    )
    assert "so it was not checked" in output and f"this pipeline needs {MINIMUM} (OpenShift AI 3.0) or later" in output


def test_server_without_a_version_or_pipeline_store_is_refused(capfd):
    """KFP 2.4 / 2.5 images and OpenShift AI 2.21 and before: tag_name "unknown", no pipeline_store."""
    with FakeKfp(token=TOKEN, tag_name="unknown", pipeline_store=None) as server:
        with pytest.raises(SystemExit) as exited:
            submit("--host", server.url, "--token", TOKEN)
    assert exited.value.code == 2
    error = " ".join(capfd.readouterr().err.split())
    assert "has no pipeline_store, which every backend since 2.14.0 sends: it is older than 2.14.0" in error
    assert "set_retry on a task inside dsl.If (from 2.14.0)" in error and "Nothing was submitted" in error
    assert [request.path for request in server.received] == ["/apis/v2beta1/healthz"]


class LoginPage(BaseHTTPRequestHandler):
    """What a route answers when it is not the pipelines API (a dashboard, an OAuth login page)."""

    def do_GET(self):
        body = b"<html><head><title>Log in</title></head></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_page_instead_of_the_api_is_a_clear_error(capfd):
    with LocalServer(LoginPage) as page:
        with pytest.raises(SystemExit) as exited:
            submit("--host", page.url, "--token", TOKEN)
    assert exited.value.code == 2
    error = " ".join(capfd.readouterr().err.split())
    assert f"{page.url} answered /apis/v2beta1/healthz with something other than the Kubeflow Pipelines API's" in error
    assert "<title>Log in</title>" in error and "not the dashboard or a login page" in error


def test_the_token_never_goes_over_plain_http_to_another_host(capfd, monkeypatch):
    """The fake KFP server on this machine's non-loopback address is another host to the rule
    (``common.http_trust``): reachable (without a token the same command gets its run there), yet a token, given
    or found in $KFP_TOKEN, is refused before any request. Over plain http it goes to loopback only (the other
    tests here)."""
    with FakeKfp(host=non_loopback_address()) as remote:
        with pytest.raises(SystemExit):
            submit("--host", remote.url, "--token", TOKEN)
        error = " ".join(capfd.readouterr().err.split())
        assert f"Refusing to send the bearer token from --token to --host: {remote.url} is plain http" in error
        assert "https route" in error and TOKEN not in error
        monkeypatch.setenv("KFP_TOKEN", TOKEN)
        with pytest.raises(SystemExit):
            submit("--host", remote.url)
        assert "from $KFP_TOKEN" in capfd.readouterr().err
        assert remote.received == []
        monkeypatch.delenv("KFP_TOKEN")
        assert submit("--host", remote.url) == 0  # the control: no token, nothing to protect, the run goes
        assert remote.received and {request.authorization for request in remote.received} == {""}


def test_a_host_that_parsers_read_differently_never_gets_the_token(capfd):
    """``http://<other host>\\@127.0.0.1`` is loopback to ``urllib.parse`` but the other host to urllib3, which the
    client connects with: without a token the command's first request lands on the other host (the control), and
    with one it is refused before any request."""
    with FakeKfp(host=non_loopback_address()) as remote:
        host = f"{remote.url}\\@127.0.0.1:{remote.url.rsplit(':', 1)[1]}"
        with pytest.raises(SystemExit):
            submit("--host", host, "--token", TOKEN)
        error = " ".join(capfd.readouterr().err.split())
        assert "Refusing to send the bearer token from --token to --host" in error and TOKEN not in error
        assert remote.received == []
        with pytest.raises(SystemExit):  # the control: no token, and the request goes to the other host
            submit("--host", host)
        assert remote.received and {request.authorization for request in remote.received} == {""}
