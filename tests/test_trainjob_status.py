"""Progress into the TrainJob's status (trainer/trainjob_status.py) against a fake of Kubeflow Trainer's status
server (tests/fake_trainer_status.py, which checks each update against the vendored CRD). A two-rank run that
reports there: tests/test_train_local.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from crd_schemas import trainer_status_errors
from fake_run import training_progress
from fake_trainer_status import FakeTrainerStatus

import trainer.trainjob_status as trainjob_status
from trainer.trainjob_status import TrainJobStatus, status_body


@pytest.fixture
def status_server(tmp_path, monkeypatch):
    with FakeTrainerStatus(tmp_path / "status") as server:
        for name, value in server.environment().items():
            monkeypatch.setenv(name, value)
        yield server


def test_progress_reaches_the_trainjob_status_in_the_shape_the_crd_takes(status_server, caplog):
    caplog.set_level(logging.INFO, "trainer.trainjob_status")
    reporter = TrainJobStatus.from_environment()
    assert f"TrainJob status: reporting progress, ETA and metrics to {status_server.status_url}" in caplog.text
    reporter.report(training_progress(step=450))
    reporter.report(training_progress(step=451))  # within 5 s of the last: not sent (the server's rate limit)
    reporter.report(training_progress(step=1000, eta_seconds=0.0, finished=True), final=True)
    assert status_server.refused == [] and (reporter.reported, reporter.pacing.failed) == (2, 0)
    first, last = status_server.updates
    assert (first["progressPercentage"], first["estimatedRemainingSeconds"]) == (45, 440)
    assert {metric["name"]: metric["value"] for metric in first["metrics"]} == {
        "loss": "1.23456",
        "learning_rate": "0.00019",
        "current_step": "450",
        "total_steps": "1000",
        "current_epoch": "1.35",
        "tokens_seen": "1234567",
        "tokens_per_second": "3400.4",
        "mfu": "0.382",
    }
    assert (last["progressPercentage"], last["estimatedRemainingSeconds"]) == (100, 0)
    assert reporter.summary() == {"url": status_server.status_url, "reported": 2, "failed": 0, "last_error": None}


def test_progress_short_of_the_end_never_reads_100_percent():
    """A run stopped to be resumed (pre-emption) ends its attempt below 100, as its status should say."""
    nearly = training_progress(step=999, eta_seconds=0.4)
    assert status_body(nearly, final=False)["trainerStatus"]["progressPercentage"] == 99
    assert status_body(nearly, final=True)["trainerStatus"]["progressPercentage"] == 99
    first = training_progress(step=0, eta_seconds=None, loss=None, learning_rate=None, tokens_per_second=None, mfu=None)
    body = status_body(first, final=False)["trainerStatus"]
    assert "estimatedRemainingSeconds" not in body and [metric["name"] for metric in body["metrics"]] == [
        "current_step",
        "total_steps",
        "current_epoch",
        "tokens_seen",
    ]


def test_without_the_feature_gate_nothing_is_reported_and_the_log_says_why(monkeypatch, caplog):
    caplog.set_level(logging.INFO, "trainer.trainjob_status")
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    assert TrainJobStatus.from_environment() is None
    assert "TrainJob status: not reported (KUBEFLOW_TRAINER_SERVER_URL is not set: a PyTorchJob, a local run" in (
        caplog.text
    )
    assert "without its TrainJobStatus feature gate" in caplog.text


def test_the_token_goes_over_https_only(monkeypatch, caplog, tmp_path):
    (tmp_path / "token").write_text("pod-token")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://10.0.0.7:10443/apis/trainer.kubeflow.org/v1alpha1/x")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(tmp_path / "token"))
    assert TrainJobStatus.from_environment() is None
    assert "TrainJob status: not reported: its service account token" in caplog.text


def test_after_a_failure_the_reporter_waits_longer_each_time(status_server, monkeypatch):
    """Rank 0 posts inside its training loop, which the other ranks wait for: a server that does not answer must
    not cost it a timeout every few seconds."""
    now = [1000.0]
    monkeypatch.setattr(trainjob_status, "time", SimpleNamespace(monotonic=lambda: now[0]))
    reporter = TrainJobStatus.from_environment()
    status_server.token_file.write_text("a token the server did not issue")
    attempts = []
    for second in range(0, 200):
        now[0] = 1000.0 + second
        before = len(status_server.refused)
        reporter.report(training_progress())
        if len(status_server.refused) > before:
            attempts.append(second)
    assert attempts == [0, 10, 30, 70, 150]  # 5 s doubled after each failure in a row (up to 300 s)
    status_server.token_file.write_text(status_server.token)
    now[0] = 1000.0 + 460
    reporter.report(training_progress())
    now[0] += 5
    reporter.report(training_progress())  # back to every 5 s once it answers
    assert reporter.reported == 2 and len(status_server.updates) == 2


def test_an_eta_beyond_int32_is_capped_as_upstream_would_refuse_it():
    body = status_body(training_progress(eta_seconds=3.5e9), final=False)["trainerStatus"]
    assert body["estimatedRemainingSeconds"] == 2**31 - 1
    assert trainer_status_errors({**body, "estimatedRemainingSeconds": 2**31}) == [
        "estimatedRemainingSeconds: 2147483648 is not an int32"
    ]
    assert trainer_status_errors(body) == []


def test_a_server_that_refuses_or_is_gone_costs_the_run_nothing(status_server, monkeypatch, caplog):
    """Failures are counted and logged (the first, then one in a hundred), never raised into training."""
    monkeypatch.setattr(trainjob_status, "MIN_SECONDS", 0.0)
    reporter = TrainJobStatus.from_environment()
    status_server.token_file.write_text("a token the server did not issue")
    reporter.report(training_progress())
    assert status_server.refused == [(403, "Forbidden")] and reporter.pacing.failed == 1
    assert "TrainJob status: update 1 failed (HTTP 403: " in caplog.text and "training goes on" in caplog.text

    status_server.close()  # the controller restarts, or its server is gone
    for _ in range(99):
        reporter.report(training_progress())
    assert (reporter.reported, reporter.pacing.failed) == (0, 100)
    assert caplog.text.count("TrainJob status: update") == 2  # the first failure and the hundredth
    assert "Connection refused" in reporter.pacing.last_error or "Max retries" in reporter.pacing.last_error
