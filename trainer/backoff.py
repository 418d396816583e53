"""When rank 0 calls a reporting server again: every few seconds while it answers, longer after each failure.

Rank 0 posts to the TrainJob status server and to MLflow inside its training loop, which every other rank waits
for. A server that drops packets costs each call its connect timeout, so after each failure in a row the next
attempt waits twice as long, up to a ceiling; the first answer puts it back to its usual pace. A server that
answers slowly is called less often too, so that waiting for it takes at most a tenth of the training's time.
Failures are counted for the training summary, and only the first and every hundredth is worth a warning: a
server down for hours must not fill the log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

LOG_EVERY_FAILURES = 100
BUSY_SHARE = 0.1  # of the time between calls, the most that waiting for an answer may take


@dataclass
class Backoff:
    """Calls every ``every`` seconds; after each failure in a row twice as long, up to ``longest``."""

    every: float
    longest: float
    clock: Callable[[], float] = time.monotonic
    failed: int = 0
    last_error: str | None = None
    next_attempt: float = 0.0
    _in_a_row: int = field(default=0, repr=False)

    def due(self) -> bool:
        return self.clock() >= self.next_attempt

    def succeeded(self, started: float) -> None:
        """The call begun at ``started`` (by ``clock``) was answered."""
        now = self.clock()
        self._in_a_row, self.next_attempt = 0, now + max(self.every, (now - started) / BUSY_SHARE)

    def failure(self, error: Exception) -> bool:
        """Count ``error`` and wait longer before the next attempt; whether it is worth a warning."""
        self._in_a_row += 1
        self.next_attempt = self.clock() + min(self.every * 2**self._in_a_row, self.longest)
        return self.count(error)

    def count(self, error: Exception) -> bool:
        """Count ``error`` without changing the pace (the server answered); whether it is worth a warning."""
        self.failed += 1
        self.last_error = str(error)
        return self.failed == 1 or self.failed % LOG_EVERY_FAILURES == 0
