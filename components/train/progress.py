"""The train step's progress lines: read from the ``progress.json`` the trainer rewrites on the shared workspace.

Every backend mounts the workspace where this step reads the training outputs, so the same lines come from a
PyTorchJob, a TrainJob and local ranks, without reading pod logs (which a restarted pod loses, and which interleave
the ranks). A line goes to the step's log once a minute while training moves, at each new checkpoint and at the end;
the last record read becomes the step's KFP metrics. Reading never fails the step: a file that cannot be read yet
is read again at the next check.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import TextIO

from common.records import TrainingProgress

CHECK_SECONDS = 5.0  # how often the file is read: a checkpoint is reported within this
LINE_SECONDS = 60.0  # the longest a moving run goes without a line
JOIN_SECONDS = 10.0  # how long the step waits for a read in progress when training has ended
CLOCK_SKEW_SECONDS = 60.0  # the pods' clocks and this one's may differ by this much


def progress_line(progress: TrainingProgress) -> str:
    """The step's line: the rank's own (``TrainingProgress.described``), marked as this step's."""
    return f"progress: {progress.described()}"


class ProgressReporter:
    """Reads ``path`` every ``CHECK_SECONDS`` in a thread while the job runs (a ``with`` block) and prints its lines
    to ``out``; ``last`` is the newest record read."""

    def __init__(self, path: Path, out: TextIO | None = None) -> None:
        self.path = path
        self.out = out
        self.started = dt.datetime.now(dt.timezone.utc)
        self.last: TrainingProgress | None = None
        self._unreadable: str | None = None  # why the file could not be read, once said
        self._printed: TrainingProgress | None = None
        self._since_line = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="progress", daemon=True)

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=CHECK_SECONDS + JOIN_SECONDS)  # a hung read of the volume must not hang the step
        self.check(final=True)

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_SECONDS):
            self._since_line += CHECK_SECONDS
            self.check()

    def check(self, final: bool = False) -> None:
        """Read the file; print a line when the run has moved and a minute has passed, or it saved or finished.
        Never raises: progress lines are worth less than the step they report on."""
        try:
            progress = TrainingProgress.read(self.path)
            if progress is None or progress == self._printed:
                return
            line = progress_line(progress)
        except Exception as error:  # being replaced, from another version, or not a progress record at all
            if self._unreadable is None:
                self._write(f"progress: cannot read {self.path} ({error}); the replicas' own lines say how it goes")
            self._unreadable = str(error)
            return
        self.last = progress
        earlier = self._printed
        due = earlier is None or self._since_line >= LINE_SECONDS or final
        saved = earlier is not None and progress.last_checkpoint != earlier.last_checkpoint
        if due or saved or progress.finished:
            self._write(line + self._staleness(progress))
            self._printed, self._since_line = progress, 0.0

    def _staleness(self, progress: TrainingProgress) -> str:
        """For a record written before this step started (a job this step found running, or an earlier one's)."""
        try:
            written = dt.datetime.fromisoformat(progress.updated)
        except ValueError:
            return ""
        if written >= self.started - dt.timedelta(seconds=CLOCK_SKEW_SECONDS):
            return ""
        return f" (written {progress.updated}, before this step started)"

    def _write(self, line: str) -> None:
        out = self.out or sys.stdout  # looked up now: tests and callers may have replaced it
        out.write(line + "\n")  # one write: the replicas' lines come from other threads (logs.ReplicaLogs.emit)
        out.flush()

    def metrics(self) -> dict[str, float]:
        """The last record's numbers, for the step's KFP metrics (those the training summary does not hold)."""
        if self.last is None:
            return {}
        numbers = {
            "progress_percent": round(self.last.percent, 2),
            "total_steps": self.last.total_steps,
            "final_learning_rate": self.last.learning_rate,
        }
        return {name: value for name, value in numbers.items() if value is not None}
