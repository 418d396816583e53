"""What a local run shows while it runs: one line per stage on the terminal, everything else in a log file.

kfp.local prints every task's streamed output, its outputs' JSON and its own log lines to
``sys.stdout`` (``kfp/local/task_dispatcher.py``, ``subprocess_task_handler.py``). ``StageProgress``
stands in for ``sys.stdout`` during the run: it writes all of it to the log file and watches for
the dispatcher's "Executing task 'x'" and "Task 'x' finished with status S" lines, which become
``  x ... done (1m 12s)``. A task that fails raises out of the run before any such line (the
runner is started with ``raise_on_error``); ``failed`` then ends its line and returns its last output.
"""

from __future__ import annotations

import io
import re
import time
from typing import TextIO

ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"Executing task '([^']+)'")
FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
TAIL_LINES = 40


def duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


class StageProgress(io.TextIOBase):
    """A text stream: everything to ``log``, a line per finished task to ``terminal``."""

    def __init__(self, log: TextIO, terminal: TextIO) -> None:
        self.log, self.terminal = log, terminal
        self.pending = ""
        self.task: str | None = None
        self.started = 0.0
        self.task_output: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._watch(ANSI_COLOUR.sub("", line))
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.terminal.flush()

    def _watch(self, line: str) -> None:
        started, finished = STARTED.search(line), FINISHED.search(line)
        if started:
            self.task, self.started, self.task_output = started.group(1), time.monotonic(), []
            print(f"  {self.task} ...", end="", file=self.terminal, flush=True)
        elif finished:
            word = {"SUCCESS": "done", "FAILURE": "failed"}.get(finished.group(2), finished.group(2).lower())
            print(f" {word} ({duration(time.monotonic() - self.started)})", file=self.terminal, flush=True)
            self.task = None
        elif self.task:
            self.task_output.append(line)

    def failed(self) -> list[str]:
        """End the running task's line as failed; return the last lines it printed."""
        if self.task:
            print(f" failed ({duration(time.monotonic() - self.started)})", file=self.terminal, flush=True)
        return self.task_output[-TAIL_LINES:]
