"""MLflow tracking against MLflow's own server on 127.0.0.1: the REST client, the first step's check, the trainer's
callback through an outage, and the evaluation's logging. What a whole local run leaves in MLflow is checked on the
shared run of tests/test_local_run.py; a two-rank training whose server dies mid-run, in tests/test_train_local.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow_server import free_port
from transformers import TrainerControl, TrainerState, TrainingArguments

from common.tracking import (
    PIPELINE_RUN_TAG,
    TOKEN_ENV,
    WORKSPACE_HEADER,
    MlflowError,
    MlflowServer,
    artifact_path,
    metric,
    uri_problem,
)
from components.evaluate.tracking import EvaluationTracking
from components.run_form.checks import problems, tracking_problems
from trainer import tracking as trainer_tracking
from trainer.backoff import Backoff
from trainer.progress import ProgressFile
from trainer.tracking import MlflowTracking


def closed_url() -> str:
    """An address where nothing listens: a server that is stopped."""
    return f"http://127.0.0.1:{free_port()}"


def tracked(uri: str, experiment: str = "llm-finetune", secret: str = "mlflow-credentials") -> dict[str, str]:
    """The run parameters the first step's check reads."""
    return {"mlflow_tracking_uri": uri, "mlflow_experiment": experiment, "mlflow_secret": secret}


def test_the_run_of_a_pipeline_run_is_created_once_and_found_again(mlflow_server):
    server = MlflowServer.from_environment(mlflow_server.url, {})
    run = server.run_of("found-again", "run-1")
    assert server.run_of("found-again", "run-1") == run  # a restarted trainer, then the evaluation
    other = server.run_of("found-again", "run-2")
    assert other.run_id != run.run_id and other.experiment_id == run.experiment_id
    stored = mlflow_server.client().get_run(run.run_id)
    assert stored.info.run_name == "run-1" and stored.data.tags[PIPELINE_RUN_TAG] == "run-1"
    assert run.url == f"{mlflow_server.url}/#/experiments/{run.experiment_id}/runs/{run.run_id}"
    assert artifact_path(run.artifact_uri) == f"{run.experiment_id}/{run.run_id}/artifacts"


def test_metrics_and_parameters_beyond_one_request_and_an_artifact_arrive(mlflow_server, tmp_path):
    """log-batch takes 1,000 metrics and 100 parameters a request: more are sent in several."""
    server = MlflowServer.from_environment(mlflow_server.url, {})
    run = server.run_of("batches", "run-1")
    server.log(
        run,
        [metric("loss", 1.0 / (step + 1), step) for step in range(2500)] + [metric("nan", float("nan"), 0)],
        params={f"param_{number}": number for number in range(150)} | {"long": "x" * 7000},
        tags={"gate.passed": "true"},
    )
    server.upload(run, "report.html", b"<html>the report</html>", "text/html")
    server.set_status(run, "FINISHED")

    client = mlflow_server.client()
    history = client.get_metric_history(run.run_id, "loss")
    assert sorted(entry.step for entry in history) == list(range(2500))
    stored = client.get_run(run.run_id)
    assert len([key for key in stored.data.params if key.startswith("param_")]) == 150
    assert len(stored.data.params["long"]) == 6000 and "nan" not in stored.data.metrics  # MLflow takes no NaN
    assert stored.data.tags["gate.passed"] == "true" and stored.info.status == "FINISHED"
    downloaded = client.download_artifacts(run.run_id, "report.html", str(tmp_path))
    assert Path(downloaded).read_bytes() == b"<html>the report</html>"


def test_credentials_go_over_https_or_to_this_machine_only():
    with pytest.raises(ValueError, match="plain http to mlflow.example"):
        MlflowServer.from_environment("http://mlflow.example:5000", {TOKEN_ENV: "secret-token"})
    assert MlflowServer.from_environment("http://mlflow.example:5000", {}).headers == {}  # no login, nothing sent
    bearer = MlflowServer.from_environment("https://mlflow.example/mlflow/", {TOKEN_ENV: "t", "MLFLOW_WORKSPACE": "ns"})
    assert bearer.uri == "https://mlflow.example/mlflow"
    assert bearer.headers == {"Authorization": "Bearer t", WORKSPACE_HEADER: "ns"}
    basic = MlflowServer.from_environment(
        "http://127.0.0.1:5000",
        {TOKEN_ENV: "t", "MLFLOW_TRACKING_USERNAME": "user", "MLFLOW_TRACKING_PASSWORD": "pw"},
    )
    assert basic.headers == {"Authorization": "Basic dXNlcjpwdw=="}  # basic wins, as in mlflow's client


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("ftp://mlflow.example", "not an http:// or https:// address"),
        ("mlflow.example:5000", "not an http:// or https:// address"),
        ("https://user:pw@mlflow.example", "user name or password"),
        ("https://mlflow.example/#/experiments/1", "without a query, fragment"),
        ("https://mlflow.example/ml flow", "spaces or quotes"),
    ],
)
def test_a_tracking_address_that_cannot_be_one_is_refused_by_the_parameter_check(uri, says):
    assert says in uri_problem(uri)
    (line,) = [line for line in problems({"mlflow_tracking_uri": uri}) if "mlflow_tracking_uri" in line]
    assert says in line


def test_the_first_step_refuses_a_stopped_server_in_seconds_with_the_fix():
    started = time.monotonic()
    found = tracking_problems(tracked(closed_url(), secret="my-mlflow"), {})
    assert time.monotonic() - started < 10
    (problem,) = found.values()
    assert "did not answer" in problem and "the credentials in the Secret 'my-mlflow' (mlflow_secret" in problem
    assert problem.endswith("or clear mlflow_tracking_uri to run without MLflow")
    assert tracking_problems(tracked(""), {}) == {}


def test_the_first_step_accepts_a_server_that_can_track_the_run_and_creates_its_experiment(mlflow_server):
    assert tracking_problems(tracked(mlflow_server.url, "made-by-the-check"), {}) == {}
    assert mlflow_server.client().get_experiment_by_name("made-by-the-check") is not None


def test_the_first_step_refuses_an_experiment_whose_artifacts_the_server_does_not_take(mlflow_server):
    """Its report could not be uploaded at the end of the run: refused before it starts."""
    mlflow_server.client().create_experiment("to-a-bucket", artifact_location="s3://bucket/experiments")
    found = tracking_problems(tracked(mlflow_server.url, "to-a-bucket"), {})
    assert "artifacts go to s3://bucket/experiments" in found["mlflow_experiment"]
    assert "Name another mlflow_experiment" in found["mlflow_experiment"]


def test_the_first_step_refuses_a_deleted_experiment_which_takes_no_runs(mlflow_server):
    client = mlflow_server.client()
    client.delete_experiment(client.create_experiment("deleted-one"))
    (problem,) = tracking_problems(tracked(mlflow_server.url, "deleted-one"), {}).values()
    assert "the experiment 'deleted-one' is deleted" in problem and "restore it" in problem


def test_the_first_step_refuses_a_token_for_plain_http_to_another_machine():
    (problem,) = tracking_problems(tracked("http://mlflow.example:5000"), {TOKEN_ENV: "secret-token"}).values()
    assert "the Secret 'mlflow-credentials' (mlflow_secret)" in problem and "are not sent" in problem
    assert "plain http" in problem and "https:// address" in problem and "secret-token" not in problem


def test_an_answer_that_is_not_mlflow_s_is_an_error_not_a_crash(tmp_path):
    """A login page (a proxy's, answered with 200 or a redirect) is not MLflow's JSON."""
    from http.server import BaseHTTPRequestHandler

    from local_server import LocalServer

    class LoginPage(BaseHTTPRequestHandler):
        def do_GET(self):
            status = 302 if "redirect" in self.path else 200
            self.send_response(status)
            self.send_header("Location", "https://login.example/")
            self.send_header("Content-Length", "14")
            self.end_headers()
            self.wfile.write(b"<html>log in</html>"[:14])

        def log_message(self, *args):
            pass

    with LocalServer(LoginPage) as page:
        with pytest.raises(MlflowError, match="something other than MLflow's JSON"):
            MlflowServer(page.url).experiment("any")
        with pytest.raises(MlflowError, match="HTTP 302"):
            MlflowServer(page.url + "/redirect").experiment("any")


def logged(
    callbacks: tuple[ProgressFile, MlflowTracking], args: TrainingArguments, state: TrainerState, logs: dict
) -> None:
    """One logging step as the Trainer calls its callbacks: the progress file first (its record, which the tracker
    logs too), then the tracker."""
    for callback in callbacks:
        callback.on_log(args, state, TrainerControl(), logs=logs)


def trainer_state(step: int, max_steps: int = 10) -> TrainerState:
    state = TrainerState()
    state.global_step, state.max_steps, state.epoch, state.num_input_tokens_seen = step, max_steps, step / 10, 64 * step
    return state


def test_the_trainer_keeps_its_metrics_through_an_outage_and_sends_them_when_the_server_is_back(
    mlflow_server, tmp_path
):
    """Rank 0 never raises for tracking: failures are counted, the next attempt waits longer, and the queued
    metrics arrive once the server answers again, each at its step."""
    clock = [1000.0]
    progress = ProgressFile(tmp_path / "progress.json", None, True, 1)
    tracking = MlflowTracking(
        MlflowServer(closed_url()), "outage", "run-1", {"method": "lora"}, progress, clock=lambda: clock[0]
    )
    args, control = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerControl()

    tracking.on_train_begin(args, trainer_state(0), control)
    assert tracking.pacing.failed == 1 and tracking.run is None
    for step in (1, 2, 3):
        logged((progress, tracking), args, trainer_state(step), {"loss": 2.0 - step / 10, "learning_rate": 1e-4})
    assert tracking.pacing.failed == 1  # within the backoff: no request
    clock[0] += trainer_tracking.MIN_SECONDS * 2
    tracking.on_log(args, trainer_state(4), control, logs={"eval_loss": 1.5})
    assert tracking.pacing.failed == 2 and "did not answer" in tracking.pacing.last_error
    assert tracking.pacing.next_attempt - clock[0] == trainer_tracking.MIN_SECONDS * 4  # twice as long after the second

    tracking.server = MlflowServer(mlflow_server.url)  # the server is back
    tracking.on_train_end(args, trainer_state(4), control)
    summary = tracking.summary()
    assert summary["failed"] == 2 and summary["metrics_unsent"] == 0 and summary["run_id"]
    client = mlflow_server.client()
    assert [(entry.step, entry.value) for entry in client.get_metric_history(summary["run_id"], "loss")] == [
        (1, 1.9),
        (2, 1.8),
        (3, 1.7),
    ]
    assert [entry.step for entry in client.get_metric_history(summary["run_id"], "eval_loss")] == [4]
    stored = client.get_run(summary["run_id"])
    assert stored.data.params["method"] == "lora" and stored.info.status == "RUNNING"  # the evaluation ends it
    # each step's loss, learning rate and tokens seen (no rate or MFU: the progress file's clock never started), and
    # the evaluation loss
    assert summary["metrics_logged"] == 3 * 3 + 1
    assert [entry.value for entry in client.get_metric_history(summary["run_id"], "tokens_seen")] == [64, 128, 192]


def test_a_refused_batch_is_dropped_and_counted_and_what_follows_still_arrives(mlflow_server, tmp_path):
    """A parameter changed on a retry is refused for good (MLflow writes parameters once): the metrics behind it
    must not wait forever."""
    progress = ProgressFile(tmp_path / "progress.json", None, True, 1)
    first = MlflowTracking(MlflowServer(mlflow_server.url), "refused", "run-1", {"lora_r": 8}, progress)
    args, control = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerControl()
    first.on_train_begin(args, trainer_state(0), control)
    retry = MlflowTracking(MlflowServer(mlflow_server.url), "refused", "run-1", {"lora_r": 16}, progress)
    retry.on_train_begin(args, trainer_state(0), control)
    retry.on_log(args, trainer_state(1), control, logs={"loss": 1.5})
    retry.on_train_end(args, trainer_state(1), control)
    assert retry.run == first.run and retry.pacing.failed == 1 and "INVALID_PARAMETER_VALUE" in retry.pacing.last_error
    history = mlflow_server.client().get_metric_history(first.run.run_id, "loss")
    assert [(entry.step, entry.value) for entry in history] == [(1, 1.5)]
    assert retry.summary()["metrics_unsent"] == 0


def test_a_server_that_accepts_and_never_answers_costs_one_timeout_a_send(tmp_path, monkeypatch):
    """The case the timeouts and the backoff exist for: the connection opens, and no answer comes."""
    import socket

    monkeypatch.setattr("common.tracking.TIMEOUTS", (0.5, 0.5))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        clock = [0.0]
        progress = ProgressFile(tmp_path / "progress.json", None, True, 1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        tracking = MlflowTracking(MlflowServer(url), "silent", "run-1", {}, progress, clock=lambda: clock[0])
        args, control = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerControl()
        started = time.monotonic()
        tracking.on_train_begin(args, trainer_state(0), control)
        for step in range(1, 20):  # within the backoff: no request, no wait
            logged((progress, tracking), args, trainer_state(step), {"loss": 1.0})
        assert (
            time.monotonic() - started < 5
            and tracking.pacing.failed == 1
            and "did not answer" in tracking.pacing.last_error
        )
        assert len(tracking.queued) == 19 * 2  # each step's loss and tokens seen, kept for later


def test_parameters_a_server_did_not_answer_are_sent_when_it_does(mlflow_server, tmp_path):
    server = MlflowServer(mlflow_server.url)
    progress = ProgressFile(tmp_path / "progress.json", None, True, 1)
    tracking = MlflowTracking(MlflowServer(closed_url()), "params-kept", "run-1", {"lora_r": 8}, progress)
    tracking.run = server.run_of("params-kept", "run-1")  # found, then the server went away
    args, control = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerControl()
    tracking.on_train_begin(args, trainer_state(0), control)
    assert tracking.pacing.failed == 1 and tracking.params["lora_r"] == 8
    tracking.server = server  # back
    tracking.on_train_end(args, trainer_state(0), control)
    assert mlflow_server.client().get_run(tracking.run.run_id).data.params["lora_r"] == "8"


def test_a_slow_server_is_called_less_often(tmp_path):
    """Waiting for an answer takes at most a tenth of the time between calls (trainer/backoff.py)."""
    clock = [100.0]
    pacing = Backoff(5.0, 300.0, clock=lambda: clock[0])
    started = clock[0]
    clock[0] += 2.0  # the call took 2 s
    pacing.succeeded(started)
    assert pacing.next_attempt == clock[0] + 20.0 and not pacing.due()
    clock[0] += 0.1
    pacing.succeeded(clock[0])  # a quick answer: back to every 5 s
    assert pacing.next_attempt == clock[0] + 5.0


def test_a_failed_training_marks_the_run_failed(mlflow_server, tmp_path):
    progress = ProgressFile(tmp_path / "progress.json", None, True, 1)
    tracking = MlflowTracking(MlflowServer(mlflow_server.url), "failed", "run-1", {}, progress)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    tracking.on_train_begin(args, trainer_state(0), TrainerControl())
    tracking.training_failed()
    assert mlflow_server.client().get_run(tracking.run.run_id).info.status == "FAILED"


def test_an_evaluation_whose_server_is_gone_goes_on_and_says_so(capsys):
    tracking = EvaluationTracking.start(closed_url(), "gone", "run-1")
    assert tracking.url is None
    tracking.finish({"gate_passed": 1}, {}, [], 0)  # nothing to send to, nothing raised
    assert "warning: MLFLOW: the evaluation is not logged" in capsys.readouterr().err
    assert EvaluationTracking.start("", "any", "run-1") is None


def test_an_evaluation_that_loses_its_server_before_the_end_goes_on_and_says_so(mlflow_server, capsys, tmp_path):
    tracking = EvaluationTracking.start(mlflow_server.url, "lost", "run-1")
    assert tracking.url and tracking.url in capsys.readouterr().out
    tracking.server = MlflowServer(closed_url())
    tracking.finish({"gate_passed": 1}, {"gate.passed": "true"}, [], 3)
    assert "warning: MLFLOW: the evaluation was not all logged" in capsys.readouterr().err
    assert mlflow_server.client().get_run(tracking.run.run_id).info.status == "RUNNING"
