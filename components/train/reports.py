"""What a failed training run tells the user, wherever it ran.

A failure report names what failed (a replica, a local rank), how it ended
(exit code and what that code usually means) and quotes its last lines, so the
step's log answers "why" without anyone fetching pod logs by hand.
"""

from __future__ import annotations

TAIL_LINES = 50

EXIT_CODE_HINTS = {
    1: "the trainer raised an error; its traceback is in the lines below",
    2: "the trainer rejected its input or options; its error line is below",
    137: (
        "killed (SIGKILL): usually out of memory (raise the memory parameter, or lower per_device_batch_size or "
        "max_length) or a lost node"
    ),
    143: "stopped (SIGTERM): evicted or preempted; the trainer saved a checkpoint first",
}


class TrainingFailed(Exception):
    """Training failed or timed out; the message is the report for the step's log (several lines)."""


def exit_code_text(exit_code: int, reason: str = "") -> str:
    """``137 (OOMKilled): killed (SIGKILL): usually out of memory ...``"""
    hint = EXIT_CODE_HINTS.get(exit_code, "")
    return f"{exit_code}" + (f" ({reason})" if reason else "") + (f": {hint}" if hint else "")


def quoted(lines: list[str]) -> list[str]:
    """Log lines set off from the report's own sentences."""
    return [f"  | {line}" for line in lines] or ["  (no log lines: the trainer may never have started)"]


def duration_text(seconds: float) -> str:
    """``45 s``, ``3 min 12 s``, ``30 min``, ``2 h 5 min``: how long something waited, for a log line."""
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    if minutes:
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    return f"{rest} s"
