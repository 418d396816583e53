"""Rank 0's parameters and per-step metrics into the pipeline run's MLflow run (``mlflow_tracking_uri``).

The run is found by the pipeline run's id (``common.tracking``), so a restarted or resumed trainer goes on logging
into the run the first attempt created, and the evaluation step adds its numbers to it afterwards. Each logging
step's numbers (loss, learning rate, grad norm, evaluation loss, and the progress file's tokens/s, tokens seen and
MFU) are queued and sent in one batch at most every ``MIN_SECONDS``, always at the end.

Tracking never costs the run: the first step refused a server it could not reach, and what fails here later (the
server restarts, the network drops) is logged, counted in the training summary and retried with the queue kept,
so the metrics of an outage arrive once the server is back. After each failure in a row the next attempt waits
twice as long, up to five minutes, since every rank waits while rank 0 waits for the server.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from common.tracking import MAX_ENTRIES, MlflowError, MlflowServer, TrackedRun, metric
from trainer.backoff import Backoff
from trainer.config import TrainConfig
from trainer.progress import ProgressFile

log = logging.getLogger(__name__)

MIN_SECONDS = 5.0
BACKOFF_SECONDS = 300.0  # the longest wait after failures in a row (trainer/backoff.py)
# Metrics kept while the server does not answer: hours of a step a second at about seven metrics a step. Beyond it
# the oldest go, counted as dropped.
MAX_QUEUED = 100_000
# What one send may cost rank 0 (and every rank waiting for it): one request of up to MAX_ENTRIES metrics while
# training, so a backlog after an outage drains over the next logging steps; at the end, requests for at most this
# many seconds.
LAST_SEND_SECONDS = 60.0


class MlflowTracking(TrainerCallback):
    """Sends rank 0's parameters and logged metrics to the MLflow run of ``pipeline_run``."""

    def __init__(
        self,
        server: MlflowServer,
        experiment: str,
        pipeline_run: str,
        params: dict[str, Any],
        progress: ProgressFile,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server, self.experiment, self.pipeline_run = server, experiment, pipeline_run
        self.params = params  # sent once, with the first batch
        self.progress = progress
        self.run: TrackedRun | None = None
        self.queued: deque[dict[str, Any]] = deque(maxlen=MAX_QUEUED)
        self.logged = self.dropped = 0
        self.pacing = Backoff(MIN_SECONDS, BACKOFF_SECONDS, clock)

    @classmethod
    def from_config(
        cls, config: TrainConfig, is_main: bool, progress: ProgressFile, **facts: Any
    ) -> MlflowTracking | None:
        """The tracker rank 0 adds when ``mlflow_tracking_uri`` is set; None elsewhere, saying in the log why.
        ``facts`` (world size, precision) join the options as the run's parameters."""
        if not is_main:
            return None
        if not config.mlflow_tracking_uri:
            log.info("MLflow: not tracked (mlflow_tracking_uri is empty)")
            return None
        try:
            server = MlflowServer.from_environment(config.mlflow_tracking_uri)
        except ValueError as refused:  # the first step refuses this before any training: a trainer run by hand
            log.warning("MLflow: not tracked: %s %s", config.mlflow_tracking_uri, refused)
            return None
        params = {key: value for key, value in config.as_json().items() if value not in (None, "")} | facts
        # The MLflow run is named and tagged with the pipeline run's id, the name of the run's folder
        # (runs/<run id>/train: common.run_layout.stage_dir), so a restarted trainer and the evaluation find it.
        name = config.output_dir.parent.name
        log.info(
            "MLflow: logging parameters and metrics to %s, experiment %s, run %s",
            server.uri,
            config.mlflow_experiment,
            name,
        )
        return cls(server, config.mlflow_experiment, name, params, progress)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._send(force=True)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        numbers = {key: value for key, value in (logs or {}).items() if isinstance(value, (int, float))}
        progress = self.progress.latest  # the progress file's record of this step, written just before (rank 0)
        if "loss" in numbers and progress is not None and progress.step == state.global_step:
            numbers |= {
                "tokens_seen": progress.tokens_seen,
                "tokens_per_second": progress.tokens_per_second,
                "mfu": progress.mfu,
            }
        now = int(time.time() * 1000)
        for key, value in numbers.items():
            if value is not None and not isinstance(value, bool):
                if len(self.queued) == self.queued.maxlen:
                    self.dropped += 1
                self.queued.append(metric(key, value, state.global_step, now))
        self._send()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._send(force=True)

    def training_failed(self) -> None:
        """Mark the run FAILED, as far as the server answers: training raised (a restarted attempt sets it RUNNING
        again, and the evaluation sets FINISHED)."""
        self._send(force=True)
        if self.run is not None:
            try:
                self.server.set_status(self.run, "FAILED")
            except Exception as error:  # whatever it is: the training's own error is the one to raise
                self._failure(error)

    def _send(self, force: bool = False) -> None:
        """Create or find the run, then send the parameters and queued metrics: one request of metrics while
        training, the whole queue (for up to ``LAST_SEND_SECONDS``) when ``force``. A request the server refuses
        for what it holds (a 4xx: a parameter changed on a retry, a token that may not write) drops that batch,
        counted, rather than block everything queued behind it; one it does not answer keeps the queue for later."""
        if not force and not self.pacing.due():
            return
        started = self.pacing.clock()
        deadline = started + LAST_SEND_SECONDS
        try:
            if self.run is None:
                self.run = self.server.run_of(self.experiment, self.pipeline_run)
                self.server.set_status(self.run, "RUNNING")
                log.info("MLflow: run %s", self.run.url)
            if self.params:
                self._refused_or_raise(
                    lambda: self.server.log(self.run, params=self.params), len(self.params), "parameters"
                )
                self.params = {}  # sent, or refused for good: an unanswered send keeps them for the next
            requests = 0
            while self.queued and (requests < 1 or force and self.pacing.clock() < deadline):
                batch = [self.queued[index] for index in range(min(MAX_ENTRIES, len(self.queued)))]
                sent = self._refused_or_raise(lambda: self.server.log(self.run, metrics=batch), len(batch), "metrics")
                for _ in batch:
                    self.queued.popleft()
                self.logged += len(batch) if sent else 0
                self.dropped += 0 if sent else len(batch)
                requests += 1
        except Exception as error:  # whatever it is: tracking must never cost the run
            self._failure(error)
            return
        self.pacing.succeeded(started)

    def _refused_or_raise(self, send: Callable[[], None], count: int, what: str) -> bool:
        """Whether ``send`` went through; False (counted and logged) when the server refused it for good."""
        try:
            send()
        except MlflowError as error:
            if not error.refused:
                raise
            self._warn(self.pacing.count(error), error, f"{count} {what} refused, dropped")
            return False
        return True

    def _failure(self, error: Exception) -> None:
        self._warn(self.pacing.failure(error), error, f"{len(self.queued)} metrics wait to be sent")

    def _warn(self, worth_it: bool, error: Exception, outcome: str) -> None:
        if worth_it:
            log.warning("MLflow: request %d failed (%s); training goes on, %s", self.pacing.failed, error, outcome)

    def summary(self) -> dict[str, Any]:
        """What the training summary records of it."""
        return {
            "url": self.run.url if self.run else None,
            "run_id": self.run.run_id if self.run else None,
            "metrics_logged": self.logged,
            "metrics_unsent": len(self.queued),
            "metrics_dropped": self.dropped,
            "failed": self.pacing.failed,
            "last_error": self.pacing.last_error,
        }
