"""Trainer callbacks: completion manifests and pre-emption saves (progress: trainer/progress.py).

Each hooks one concern into the Hugging Face Trainer's own loop instead of
replacing it.
"""

from __future__ import annotations

import logging
import signal
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
