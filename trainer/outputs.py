"""What a finished run leaves for the next stages: adapter, merged model, summaries, loss curve.

Everything is written by rank 0 only, each file or directory under a temporary
name first and renamed into place, so the export stage never picks up a
half-written ``merged/`` after a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.atomic import write_file_atomic


def plot_loss_curve(history: list[dict[str, Any]], path: Path) -> None:
    """Training loss per logged step and eval loss per evaluation, on one chart.

    Drawn on a bare ``Figure`` (no pyplot, so no display backend to pick in a pod), imported here: only rank 0
    draws, once, and importing matplotlib cost every rank half a second at start-up (``python -X importtime``)."""
    from matplotlib.figure import Figure

    train = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    evals = [(entry["step"], entry["eval_loss"]) for entry in history if "eval_loss" in entry]
    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.subplots()
    if train:
        axes.plot(*zip(*train), label="train loss")
    if evals:
        axes.plot(*zip(*evals), marker="o", label="eval loss")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    write_file_atomic(path, lambda handle: figure.savefig(handle, format="png"))
