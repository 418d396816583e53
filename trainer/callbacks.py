"""Trainer callbacks: completion manifests, pre-emption saves, progress lines, step history.

Each hooks one concern into the Hugging Face Trainer's own loop instead of
replacing it.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trainer import checkpoints, distributed

log = logging.getLogger("trainer")


class CompletionManifest(TrainerCallback):
    """After each save, once every rank has written its files, rank 0 marks the checkpoint complete."""

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        distributed.barrier()
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            checkpoints.mark_complete(path, state.global_step)
            log.info("checkpoint %s complete", path)
        distributed.barrier()


class PreemptionSave(TrainerCallback):
    """On SIGTERM (pod eviction, node drain, job deletion), save a checkpoint promptly and stop.

    The kubelet sends SIGTERM to the container's torchrun, which forwards it to
    every worker and kills them ``--shutdown-timeout`` seconds later; the
    kubelet kills what is left after ``terminationGracePeriodSeconds`` (the
    launcher sets both, see ``components.train.manifests``). So the save must
    start at once: the flag is checked after every micro-batch, not only at the
    end of an optimizer step, which with gradient accumulation can be minutes
    away. Stopping between micro-batches drops the partly accumulated gradients;
    the checkpoint holds the state after the last completed step, which is where
    the resumed run restarts. The flag is shared across ranks at every check so
    that all ranks take the collective save together even when only one pod was
    signalled; it travels over the CPU (gloo) group, so the check never waits for
    the GPU's queued work as an NCCL all-reduce read back by ``.item()`` would.
    """

    def __init__(self) -> None:
        self.requested = False
        self.stopped_early = False
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True

    def _stop_if_requested(self, state: TrainerState, control: TrainerControl) -> None:
        if distributed.any_rank(self.requested):
            if not self.stopped_early:
                log.warning("termination requested: saving a checkpoint at step %d and stopping", state.global_step)
            self.stopped_early = True
            control.should_save = True
            control.should_training_stop = True

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._stop_if_requested(state, control)

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._stop_if_requested(state, control)


def _duration(seconds: float) -> str:
    return str(dt.timedelta(seconds=int(max(seconds, 0))))


class ProgressLines(TrainerCallback):
    """One plain log line per logging step on rank 0: step, loss, tokens/s, ETA.

    Pods have no terminal, and a tqdm bar there becomes carriage-return soup in
    the log viewer; a terminal keeps the Trainer's own bar and gets these too.
    """

    def __init__(self) -> None:
        self.started: float | None = None
        self.first_step = 0
        self.first_tokens = 0

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.started = time.monotonic()
        self.first_step = state.global_step
        self.first_tokens = state.num_input_tokens_seen

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs or "loss" not in logs or self.started is None:
            return
        elapsed = time.monotonic() - self.started
        steps_done = state.global_step - self.first_step
        tokens_per_second = (state.num_input_tokens_seen - self.first_tokens) / elapsed if elapsed > 0 else 0.0
        eta = elapsed / steps_done * (state.max_steps - state.global_step) if steps_done else 0.0
        print(
            f"step {state.global_step}/{state.max_steps} epoch {state.epoch or 0:.2f} loss {logs['loss']:.4f} "
            f"lr {logs.get('learning_rate', 0.0):.2e} tokens/s {tokens_per_second:,.0f} "
            f"elapsed {_duration(elapsed)} eta {_duration(eta)}",
            file=sys.stderr,
            flush=True,
        )
