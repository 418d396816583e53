"""Per-rank evidence that data parallelism did what it should.

Two failure modes of multi-pod training are silent: ranks that read the same
data (a sampler that was not sharded, so N GPUs do the work of one) and ranks
whose weights drift apart (a desynchronised all-reduce). Each rank therefore
records a digest of every training sequence it was handed, per epoch, and a
digest of its final trainable weights; rank 0 gathers them into
``data_shards.json`` and the summary, where a reader (or a test) can check that
shards are disjoint and weights identical.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import xxhash
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments


class ShardRecorder(TrainerCallback):
    """Digests each sequence this rank trains on, grouped by epoch, by wrapping the training collator."""

    def __init__(self) -> None:
        self.epoch = 0
        self.digests: dict[int, list[str]] = defaultdict(list)
        self.tokens = 0

    def attach(self, trainer: Trainer) -> None:
        """Record the batches of the training dataloader only (evaluation shares the collator)."""
        build_train_loader = trainer.get_train_dataloader

        def recording_train_loader() -> Any:
            plain = trainer.data_collator
            trainer.data_collator = self._recording(plain)
            try:
                return build_train_loader()
            finally:
                trainer.data_collator = plain

        trainer.get_train_dataloader = recording_train_loader

    def _recording(self, collate: Callable[[list[dict[str, Any]]], Any]) -> Callable[[list[dict[str, Any]]], Any]:
        def recording_collate(examples: list[dict[str, Any]]) -> Any:
            for example in examples:
                ids = np.asarray(example["input_ids"], dtype=np.int64)
                self.digests[self.epoch].append(xxhash.xxh3_64_hexdigest(ids.tobytes()))
                self.tokens += int(ids.size)
            return collate(examples)

        return recording_collate

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.epoch = int(state.epoch or 0)

    def report(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "sequences_by_epoch": {str(epoch): digests for epoch, digests in sorted(self.digests.items())},
        }


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the trainable parameters, in name order: equal on every rank after a correct DDP run."""
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):
        if parameter.requires_grad:
            digest.update(name.encode())
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def gather(value: Any, world_size: int) -> list[Any]:
    """``value`` from every rank, in rank order (rank 0 included)."""
    if world_size == 1 or not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered
