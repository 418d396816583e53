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

from common.errors import UserError
from common.records import TrainingProgress

CHECK_SECONDS = 5.0  # how often the file is read: a checkpoint is reported within this
LINE_SECONDS = 60.0  # the longest a moving run goes without a line


def progress_line(progress: TrainingProgress) -> str:
    """One line: step / total, epoch, tokens, rate, MFU, loss, learning rate, ETA and the newest checkpoint."""
    parts = [
        f"step {progress.step}/{progress.total_steps} ({progress.percent:.1f}%)",
        f"epoch {progress.epoch:.2f}",
        f"{progress.tokens_seen:,} tokens",
        f"{progress.tokens_per_second:,.0f} tokens/s" if progress.tokens_per_second is not None else "",
        f"MFU {progress.mfu:.1%}" if progress.mfu is not None else "",
        f"loss {progress.loss:.4f}" if progress.loss is not None else "",
        f"lr {progress.learning_rate:.2e}" if progress.learning_rate is not None else "",
        "done" if progress.finished else f"ETA {_duration(progress.eta_seconds)}" if progress.eta_seconds else "",
        f"last checkpoint {progress.last_checkpoint}" if progress.last_checkpoint else "no checkpoint yet",
    ]
    return "progress: " + ", ".join(part for part in parts if part)


def _duration(seconds: float | None) -> str:
    return str(dt.timedelta(seconds=int(max(seconds or 0, 0))))


class ProgressReporter:
    """Reads ``path`` every ``CHECK_SECONDS`` in a thread while the job runs (a ``with`` block) and prints its lines
    to ``out``; ``last`` is the newest record read."""

    def __init__(self, path: Path, out: TextIO | None = None) -> None:
        self.path = path
        self.out = out
        self.last: TrainingProgress | None = None
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
        self._thread.join()
        self.check(final=True)

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_SECONDS):
            self._since_line += CHECK_SECONDS
            self.check()

    def check(self, final: bool = False) -> None:
        """Read the file; print a line when the run has moved and a minute has passed, or it saved or finished."""
        try:
            progress = TrainingProgress.read(self.path)
        except (UserError, OSError):  # being replaced, or from another version: the next check reads it again
            return
        if progress is None or progress == self._printed:
            return
        self.last = progress
        earlier = self._printed
        due = earlier is None or self._since_line >= LINE_SECONDS or final
        saved = earlier is not None and progress.last_checkpoint != earlier.last_checkpoint
        if due or saved or progress.finished:
            out = self.out or sys.stdout  # looked up now: tests and callers may have replaced it
            out.write(progress_line(progress) + "\n")  # one write: the log's other lines come from another thread
            out.flush()
            self._printed, self._since_line = progress, 0.0

    def metrics(self) -> dict[str, float]:
        """The last record's numbers, for the step's KFP metrics (those the training summary does not hold)."""
        if self.last is None:
            return {}
        numbers = {
            "progress_percent": round(self.last.percent, 2),
            "total_steps": self.last.total_steps,
            "tokens_per_second": self.last.tokens_per_second,
            "final_learning_rate": self.last.learning_rate,
        }
        return {name: value for name, value in numbers.items() if value is not None}
