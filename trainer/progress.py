"""Where the run is, from rank 0 at each logging step: a line in its own log, and ``train/progress.json``.

The line is for whoever reads the pod's log: pods have no terminal, and a tqdm bar there becomes carriage-return
soup in the log viewer (a terminal keeps the Trainer's own bar and gets these too). The file, rewritten at each
logging step, each checkpoint and the end, is for the train step, which reads it from the shared workspace while it
waits for the job and prints it once a minute and at each checkpoint (components/train/progress.py): the same
lines for a PyTorchJob, a TrainJob and local ranks, with no reading of pod logs. Writing it never stops training:
a failed write is logged once and skipped.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from common.records import TrainingProgress
from trainer import mfu
from trainer.trainjob_status import TrainJobStatus

log = logging.getLogger(__name__)


# The file is read every few seconds and printed once a minute: a write at every logging step, inside the loop the
# other ranks wait for, would mostly go unread. A checkpoint and the end are always written.
WRITE_SECONDS = 5.0


class ProgressFile(TrainerCallback):
    """Rank 0 writes the run's ``TrainingProgress`` to ``path``: step, tokens, rate, MFU, loss, ETA, checkpoint."""

    def __init__(
        self,
        path: Path,
        peak_flops: float | None,
        trains_adapter: bool,
        devices: int,
        status: TrainJobStatus | None = None,
        with_reference: bool = False,
        resumed_from: str | None = None,
    ) -> None:
        self.path = path
        self.with_reference = with_reference  # DPO: a reference model's forward pass on every token too
        self.status = status  # the TrainJob's status server, where the cluster has one
        self.peak_flops, self.trains_adapter, self.devices = peak_flops, trains_adapter, devices
        self.started: float | None = None
        self.first_step = self.first_tokens = 0
        self.per_token: float | None = None
        self.loss: float | None = None
        self.learning_rate: float | None = None
        self.checkpoint = resumed_from  # the checkpoint this attempt resumed from, until it saves its own
        self.written_at = -WRITE_SECONDS
        self.write_failed = False
        self.latest: TrainingProgress | None = None  # rank 0's last record, which the MLflow tracker logs too

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.started = time.monotonic()
        self.first_step, self.first_tokens = state.global_step, state.num_input_tokens_seen
        if self.peak_flops and kwargs.get("model") is not None:
            weights = mfu.matmul_weights(kwargs["model"])
            self.per_token = mfu.flops_per_token(weights, self.trains_adapter, self.with_reference)
        self._write(state)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "loss" in logs:
            self.loss, self.learning_rate = logs["loss"], logs.get("learning_rate", self.learning_rate)
            self._write(state, log_line=True)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.checkpoint = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        self._write(state, always=True)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._write(state, always=True, final=True)

    def progress(self, state: TrainerState) -> TrainingProgress:
        """What the run has done, as of ``state``."""
        elapsed = time.monotonic() - (self.started or time.monotonic())
        steps = state.global_step - self.first_step
        tokens = int(state.num_input_tokens_seen)
        rate = (tokens - self.first_tokens) / elapsed if elapsed > 0 and steps else None
        remaining = max(state.max_steps - state.global_step, 0)
        return TrainingProgress(
            step=state.global_step,
            total_steps=state.max_steps,
            epoch=round(float(state.epoch or 0.0), 4),
            tokens_seen=tokens,
            tokens_per_second=round(rate, 1) if rate is not None else None,
            mfu=self.utilisation(rate),
            loss=self.loss,
            learning_rate=self.learning_rate,
            elapsed_seconds=round(elapsed, 1),
            eta_seconds=round(elapsed / steps * remaining, 1) if steps else None,
            last_checkpoint=self.checkpoint,
            updated=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            finished=state.max_steps > 0 and state.global_step >= state.max_steps,
        )

    def utilisation(self, tokens_per_second: float | None) -> float | None:
        """The MFU of ``tokens_per_second`` (every rank's) on this run's GPUs; None where it is not known."""
        if not tokens_per_second or not self.per_token:
            return None
        return mfu.utilisation(tokens_per_second, self.per_token, self.peak_flops, self.devices)

    def _write(self, state: TrainerState, log_line: bool = False, always: bool = False, final: bool = False) -> None:
        if not state.is_world_process_zero:
            return
        progress = self.latest = self.progress(state)
        if log_line:
            print(progress.described(), file=sys.stderr, flush=True)
        if self.status is not None:
            self.status.report(progress, final)
        now = time.monotonic()
        if not always and now - self.written_at < WRITE_SECONDS:
            return
        self.written_at = now
        try:
            progress.write(self.path)
        except OSError as error:  # a full or lost volume: the checkpoints will say so; training goes on
            if not self.write_failed:
                log.warning("could not write %s (%s); the train step's progress lines stop here", self.path, error)
            self.write_failed = True
