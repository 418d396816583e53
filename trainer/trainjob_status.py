"""Progress into the TrainJob's own status (``status.trainerStatus``), where the cluster's Kubeflow Trainer takes it.

Kubeflow Trainer v2.2.0 and later (KEP-2779; kubeflow/trainer pkg/statusserver) run a status server in the
controller when its ``TrainJobStatus`` feature gate is on (alpha, off by default). The controller then injects
into every trainer container the server's URL and the paths of its CA certificate and of a projected service
account token, and a POST of ``{"trainerStatus": {...}}`` to that URL replaces the TrainJob's
``status.trainerStatus`` (progressPercentage, estimatedRemainingSeconds, metrics as name/value strings,
lastUpdatedTime; schema: tests/schemas/trainer.kubeflow.org_trainjobs.yaml, from v2.3.0). Without the gate, in a
PyTorchJob and in local runs the URL is not set, and the log says so.

transformers (5.4 and later) has its own ``KubeflowCallback`` for this, which turns itself on when the URL is set,
even under ``report_to="none"``, and logs its failures at debug level only. This module reports instead, from the
same numbers as the train step's progress lines, and counts and logs its failures; the trainer turns
transformers' callback off (``DISABLE_KUBEFLOW_INTEGRATION``), since each POST replaces the whole status and two
writers would overwrite each other. A failed report never stops training.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.http_trust import token_may_go_to
from common.records import TrainingProgress
from trainer.backoff import Backoff

log = logging.getLogger(__name__)

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"  # a path
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"  # a path: the projected token, rotated by the kubelet
DISABLE_TRANSFORMERS_ENV = "DISABLE_KUBEFLOW_INTEGRATION"
# The status server's client is limited to 5 requests/s; upstream's docs, its SDK and transformers send one update
# every 5 s at most.
MIN_SECONDS = 5.0
# The post runs in rank 0's training loop, which the other ranks wait for: after each failure in a row the next
# attempt waits twice as long, up to BACKOFF_SECONDS (trainer/backoff.py).
TIMEOUTS = (2.0, 5.0)  # connect, read
BACKOFF_SECONDS = 300.0
INT32_MAX = 2**31 - 1  # estimatedRemainingSeconds is an int32: upstream refuses a larger one


def status_body(progress: TrainingProgress, final: bool) -> dict[str, Any]:
    """The request body: ``UpdateTrainJobStatusRequest`` (kubeflow/trainer pkg/apis/trainer/v1alpha1)."""
    percent = 100 if final and progress.finished else min(int(progress.percent), 99)
    metrics = {
        "loss": progress.loss,
        "learning_rate": progress.learning_rate,
        "current_step": progress.step,
        "total_steps": progress.total_steps,
        "current_epoch": progress.epoch,
        "tokens_seen": progress.tokens_seen,
        "tokens_per_second": progress.tokens_per_second,
        "mfu": progress.mfu,
    }
    status: dict[str, Any] = {
        "progressPercentage": percent,
        "metrics": [{"name": name, "value": str(value)} for name, value in metrics.items() if value is not None],
        "lastUpdatedTime": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if progress.eta_seconds is not None:
        status["estimatedRemainingSeconds"] = 0 if percent == 100 else min(int(progress.eta_seconds), INT32_MAX)
    return {"trainerStatus": status}


@dataclass
class TrainJobStatus:
    """Posts progress to the TrainJob status server at ``url``; counts what it sent and what failed."""

    url: str
    ca_file: str
    token_file: str
    reported: int = 0
    pacing: Backoff = field(
        default_factory=lambda: Backoff(MIN_SECONDS, BACKOFF_SECONDS, clock=lambda: time.monotonic()), repr=False
    )

    @classmethod
    def from_environment(cls) -> TrainJobStatus | None:
        """The reporter the controller's variables describe, or None, saying in the log why not."""
        url = os.environ.get(URL_ENV, "").strip()
        if not url:
            log.info(
                "TrainJob status: not reported (%s is not set: a PyTorchJob, a local run, or a TrainJob on a Kubeflow "
                "Trainer before v2.2 or without its TrainJobStatus feature gate); the train step's log has the "
                "progress",
                URL_ENV,
            )
            return None
        refused = token_may_go_to(url, https_only=True)
        if refused:
            log.warning("TrainJob status: not reported: its service account token %s", refused)
            return None
        reporter = cls(url, os.environ.get(CA_ENV, ""), os.environ.get(TOKEN_ENV, ""))
        log.info("TrainJob status: reporting progress, ETA and metrics to %s every %.0f s", url, MIN_SECONDS)
        return reporter

    def report(self, progress: TrainingProgress, final: bool = False) -> None:
        """Post ``progress``, at most every ``MIN_SECONDS`` (longer after failures) unless ``final``; a failure is
        counted, never raised."""
        if not final and not self.pacing.due():
            return
        started = self.pacing.clock()
        try:
            self._post(status_body(progress, final))
        except Exception as error:  # whatever it is: a status update must never cost the run
            if self.pacing.failure(error):
                log.warning(
                    "TrainJob status: update %d failed (%s); training goes on, and the train step's log has the "
                    "progress",
                    self.pacing.failed,
                    error,
                )
            return
        self.pacing.succeeded(started)
        self.reported += 1

    def _post(self, body: dict[str, Any]) -> None:
        import requests

        token = Path(self.token_file).read_text().strip()  # re-read: the kubelet rotates it
        response = requests.post(
            self.url,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            verify=self.ca_file or True,
            timeout=TIMEOUTS,
        )
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text.strip()[:200]}")

    def summary(self) -> dict[str, Any]:
        """What the training summary records of it."""
        failed, last_error = self.pacing.failed, self.pacing.last_error
        return {"url": self.url, "reported": self.reported, "failed": failed, "last_error": last_error}
