"""Per-rank evidence that data parallelism did what it should.

Two failure modes of multi-pod training are silent: ranks that read the same
data (a sampler that was not sharded, so N GPUs do the work of one) and ranks
whose weights drift apart (a desynchronised all-reduce). Each rank therefore
records, per epoch, how many training sequences it was handed, an
order-independent digest of all of them and the digests of the first few, plus
a digest of its final trainable weights; rank 0 gathers them into
``data_shards.json`` and the summary, where a reader (or a test) can check that
the shards differ, their first sequences are disjoint and the weights identical.
What each rank sends is bounded (``SAMPLE_SIZE`` digests per epoch), whatever
the size of the data set.
"""

from __future__ import annotations

import hashlib
import resource
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import xxhash
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainer import distributed

SAMPLE_SIZE = 32  # sequence digests kept per rank and epoch: enough to see two ranks reading the same data


@dataclass
class EpochShard:
    """What one rank trained on in one epoch, in constant space."""

    sequences: int = 0
    digest_sum: int = 0  # sum of the sequences' 64-bit digests mod 2**64: the same for the same multiset
    first: list[str] = field(default_factory=list)

    def add(self, digest: int) -> None:
        self.sequences += 1
        self.digest_sum = (self.digest_sum + digest) % 2**64
        if len(self.first) < SAMPLE_SIZE:
            self.first.append(f"{digest:016x}")

    def as_json(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "digest_sum": f"{self.digest_sum:016x}", "first": self.first}


class ShardRecorder(TrainerCallback):
    """Records the sequences this rank trains on, per epoch, by wrapping the training collator.

    It is also the run's token counter. The Trainer's own (``include_num_input_tokens_seen``) gathers
    a GPU tensor and reads it back after every micro-batch, a host sync that stalls the GPU's queue;
    here each batch's real tokens are counted on the CPU as it is collated, and counted as trained
    when the optimizer step that used it lands (the loader collates one batch ahead). The ranks'
    counts are summed over the CPU group only when a log line or a checkpoint needs them.
    """

    def __init__(self, example_tokens: Callable[[dict[str, Any]], np.ndarray]) -> None:
        self.example_tokens = example_tokens  # the objective's: one example's tokens as the model sees them
        self.epoch = 0
        self.shards: dict[int, EpochShard] = defaultdict(EpochShard)
        self.tokens = 0  # trained by this rank in this attempt, up to its last optimizer step
        self.accumulating = 0  # in the micro-batches of the optimizer step under way
        self.collated: deque[int] = deque()  # tokens of each batch collated and not yet trained, in order
        self.tokens_before = 0  # every rank's, before this attempt (a resumed run's checkpoint)

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
            tokens = 0
            for example in examples:
                ids = self.example_tokens(example)
                self.shards[self.epoch].add(xxhash.xxh3_64_intdigest(ids.tobytes()))
                tokens += int(ids.size)
            self.collated.append(tokens)
            return collate(examples)

        return recording_collate

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.tokens_before = state.num_input_tokens_seen

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.epoch = int(state.epoch or 0)

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.accumulating += self.collated.popleft()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # Counted when the optimizer step lands: a run stopped mid-accumulation (pre-emption) trains those
        # micro-batches again after resuming, and counts them then.
        self.tokens += self.accumulating + self.collated.popleft()
        self.accumulating = 0

    def tokens_seen(self) -> int:
        """Every rank's trained tokens, the resumed checkpoint's included: a collective, called on every rank."""
        return self.tokens_before + distributed.sum_over_ranks(self.tokens)

    def report(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "epochs": {str(epoch): shard.as_json() for epoch, shard in sorted(self.shards.items())},
        }


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the trainable parameters, in name order: equal on every rank after a correct DDP run."""
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):
        if parameter.requires_grad:
            digest.update(name.encode())
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def peak_memory_mb() -> float:
    """This rank's peak memory: what the GPU's caching allocator reserved, or on CPU the peak resident size.

    Reserved, not allocated: it is what the process took from the GPU, what must fit, and what the
    fit check estimates (less the CUDA context, which no allocator counts).
    """
    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def gather(value: Any, world_size: int) -> list[Any]:
    """``value`` from every rank, in rank order (rank 0 included)."""
    if world_size == 1 or not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered
