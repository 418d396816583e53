"""The evaluation's numbers, benchmark scores, gate and report into the pipeline run's MLflow run.

The trainer created the run and logged the training into it; this step finds it by the pipeline run's id (or
creates it, when the trainer could not reach the server), adds the numbers of its KFP metrics at the training's
last step, the gate's decision as tags and its files as artifacts, and ends the run. The run's address goes into
``evaluation.json``, from which the report, the model card and the Model Registry version link to it.

The first step refused a server it could not reach. One that fails now costs the run nothing: the step says so
loudly in its log and its report goes on without the link.
"""

from __future__ import annotations

import mimetypes
import sys
from dataclasses import dataclass
from pathlib import Path

from common.tracking import MlflowError, MlflowServer, TrackedRun, metric


@dataclass
class EvaluationTracking:
    """The MLflow run this step logs to; ``run`` is None when the server could not be used, ``problem`` says why."""

    server: MlflowServer | None
    run: TrackedRun | None
    problem: str | None = None

    @classmethod
    def start(cls, tracking_uri: str, experiment: str, pipeline_run: str) -> EvaluationTracking | None:
        """The run of ``pipeline_run``, found before the models are scored so that the reports can link it; None
        without ``tracking_uri``."""
        if not tracking_uri.strip():
            return None
        try:
            server = MlflowServer.from_environment(tracking_uri)
            run = server.run_of(experiment, pipeline_run)
        except (ValueError, MlflowError) as error:
            tracking = cls(None, None, f"{tracking_uri}: {error}")
            tracking.warn("is not logged")
            return tracking
        print(f"MLflow run: {run.url}", flush=True)
        return cls(server, run)

    @property
    def url(self) -> str | None:
        return self.run.url if self.run else None

    def finish(self, numbers: dict[str, float], tags: dict[str, str], files: list[Path], step: int) -> None:
        """Log ``numbers`` at ``step`` and ``tags``, upload each of ``files`` that exists, and end the run."""
        if self.server is None or self.run is None:
            return
        try:
            self.server.log(self.run, [metric(key, value, step) for key, value in numbers.items()], tags=tags)
            for path in files:
                if path.is_file():
                    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                    self.server.upload(self.run, path.name, path.read_bytes(), kind)
            self.server.set_status(self.run, "FINISHED")
        except (MlflowError, ValueError, OSError) as error:  # ValueError: an experiment moved to a bucket since
            self.problem = str(error)
            self.warn("was not all logged")
            return
        print(f"MLflow: the evaluation's numbers, gate and report are in {self.run.url}", flush=True)

    def failed(self) -> None:
        """End the run as FAILED, as far as the server answers: the evaluation raised."""
        if self.server is not None and self.run is not None:
            try:
                self.server.set_status(self.run, "FAILED")
            except MlflowError:
                pass  # the evaluation's own error is the one the step reports

    def warn(self, what: str) -> None:
        print(
            f"warning: MLFLOW: the evaluation {what} ({self.problem}); the step goes on without it, and its numbers "
            "are in the step's metrics and report",
            file=sys.stderr,
            flush=True,
        )
