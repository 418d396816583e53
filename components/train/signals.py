"""SIGTERM as an exception, so the launcher cleans up when its pod is stopped.

Cancelling a run (or draining the node) sends SIGTERM to the launcher pod.
Left at its default, the signal kills the process at once and the training job
it started would keep its GPUs until its deadline. Raised as ``Terminated``, it
unwinds through the code that created the job, which deletes it (cluster) or
passes the signal on to torchrun (local).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

TERMINATED_EXIT_CODE = 128 + signal.SIGTERM


class Terminated(BaseException):
    """The process received SIGTERM (a BaseException, like KeyboardInterrupt, so no ``except Exception``
    swallows it).
    """


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"received signal {signal.Signals(signum).name}")


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` in the main thread (elsewhere handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
