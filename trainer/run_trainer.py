"""What every objective's trainer does the same way in this run, whatever TRL class it extends.

An objective's trainer class is ``class SFTRunTrainer(RunTrainer, SFTTrainer)``: TRL's trainer with this mix-in
first, so the run's behaviour applies to each objective alike:

* the eval loader never drops its last, incomplete batch. ``dataloader_drop_last`` applies to both loaders.
  Training needs it (equal batch counts per rank without accelerate's padding of the last batch with repeated
  samples, which would break the disjoint shards); evaluation must not have it: with fewer eval rows than ranks
  every rank dropped its only batch, no rank computed ``eval_loss``, and the run crashed after training. Without
  it, accelerate pads the ranks' last batches with repeated rows and ``gather_for_metrics`` removes the repeats,
  so each eval row counts exactly once;
* tokens are counted by ``ShardRecorder`` on the CPU (see ``trainer.run_arguments``): ``num_input_tokens_seen``
  in every log entry and checkpoint as the Trainer's own counter would have it;
* FSDP2 runs on CPUs with gloo (``sharding.use_fsdp_on_cpu``), for the tests and the GPU check's CPU mode.
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_utils import speed_metrics

from trainer import sharding
from trainer.diagnostics import ShardRecorder


class RunTrainer:
    """The mix-in; it comes before TRL's trainer class in the bases."""

    def __init__(self, *args: Any, shards: ShardRecorder, callbacks: list | None = None, **kwargs: Any) -> None:
        super().__init__(*args, callbacks=[*(callbacks or []), shards], **kwargs)
        self.shards = shards
        shards.attach(self)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # The checkpoint's trainer_state.json carries the count a resumed run starts from; every rank saves.
        self.state.num_input_tokens_seen = self.shards.tokens_seen()
        super()._save_checkpoint(model, trial)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # Every rank logs at the same points, so summing over the ranks here is safe.
        self.state.num_input_tokens_seen = self.shards.tokens_seen()
        logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
        if start_time is not None:
            this_attempt = self.state.num_input_tokens_seen - self.shards.tokens_before
            logs.update(speed_metrics("train", start_time, num_tokens=this_attempt))
        super().log(logs, start_time)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        sharding.use_fsdp_on_cpu(self)

    def get_eval_dataloader(self, eval_dataset=None):
        drop_last = self.args.dataloader_drop_last
        self.args.dataloader_drop_last = False
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.args.dataloader_drop_last = drop_last
