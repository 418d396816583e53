"""The fast path rehearsed before the first step: a compiler or kernel failure costs speed, never the run.

Compiled blocks and flex_attention are speed features, and their failures (a compile error, the
recompile limit, a Triton kernel the GPU refuses at its first launch) surface the first time each
variant runs: the first micro-batch (the training variants, forward and backward) and the first
evaluation (no gradient, eval mode). So before the first step every rank runs training
micro-batches (forward and backward) and evaluation batches through the model as training will,
with the arguments TRL's ``compute_loss`` passes, under the autocast accelerate put on the model's
forward: the data's first, rows cut from it at one and two 128-token tiles, each as one
conversation (whose attention needs no mask, a variant of its own) and as two, and a micro-batch of
each padded length the data's micro-batches can have (``micro_batches_by_length``: with
``per_device_batch_size`` above 1 a micro-batch joins its rows into one longer sequence). Every
variant the run needs is compiled and
launched once, and the compiled code is reused by the real steps; the summary counts any graph
compiled after it.

Why every length: the blocks are compiled with a symbolic length, but Inductor still splits that
length into ranges where its code differs (32-bit or 64-bit indexing, flex_attention's decoding
kernel or not) and guards each graph on its range. On an H200 on 2026-11-28, full fine-tuning of
SmolLM3-3B with checkpointing rehearsed on rows of 128, 256 and 4,096 tokens had graphs for 128-2,559
and for 4,096 and up; a shorter packed row at step 8 compiled two more mid-run. The ranges' bounds
depend on the model's widths, so the rehearsal does not guess them: it runs a micro-batch of each
length the run will meet.

The rehearsal calls the model itself, not DDP's wrapper, so no collective runs inside it and a rank
that fails cannot leave the others waiting in one; its gradients are discarded and the random
state restored, so training starts exactly as it would have. Then every rank says whether it
failed; if any did, all of them continue on the proven path (eager blocks, sdpa), said in one loud
log line, ``training_summary.json``, the evaluation report and the model card. ``strict_compile``
ends the run instead, for benchmarks.

Under FSDP nothing is rehearsed: its forward gathers weights collectively, so a failing rank would
strand the others mid-collective. There ``attention auto`` is sdpa and blocks are not compiled; a
``flex_attention`` asked for explicitly fails with ``compiled.compile_failures_explained``'s advice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy
import pyarrow.compute
import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from common.errors import UserError, one_line
from trainer import compiled, diagnostics
from trainer.distributed import Topology

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger("trainer")

PROVEN_ATTENTION = "sdpa"
# At most this many lengths are rehearsed, spread from the shortest to the longest: every length of rows up to
# 4,096 tokens (at 128 a tile), and a bounded cost beyond, where a missed range costs one compile mid-run.
LENGTHS_REHEARSED = 32


@dataclass(frozen=True)
class Failure:
    """What failed on one rank, for the log line and the summary."""

    rank: int
    during: str  # "the first training step" or "the first evaluation"
    error: str

    def describe(self) -> str:
        return f"{self.during} on rank {self.rank} ({self.error})"


def model_inputs(trainer: Trainer, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of ``rows`` as the trainer's forward gets it: collated, on the device, with the arguments TRL's
    ``SFTTrainer.compute_loss`` adds (dynamo guards on them, so the rehearsal must pass the same)."""
    batch = trainer._prepare_inputs(trainer.data_collator(rows))
    return {**batch, "use_cache": False, "fused_lm_head": True}


def transformers_model(model: torch.nn.Module) -> Any:
    """The transformers model itself, under PEFT's wrapper when there is one."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cut_rows(row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Batches cut from ``row``: its first ``PAD_MULTIPLE`` tokens and its first ``2 * PAD_MULTIPLE`` (as far as it
    reaches), each as one conversation and as two.

    transformers skips the attention mask of a row holding one sequence without padding (sdpa then runs plain
    causal) and builds one for a packed or padded row; a compiled block guards on the mask being there, so each
    is a variant of its own, and the data's first batches may show only one of them (short rows often hold a
    single conversation). The two lengths are for flex_attention's block mask, which transformers builds in a
    ``torch.compile`` of its own that is not dynamic: it is compiled for the first batch's length, and a second
    length makes it dynamic, but a row of one 128-token tile gets a graph only for one tile (on an H100 on
    2026-11-27, with one-tile cuts alone, the first training batch of another length compiled one mid-run). Every
    token is a label, so the loss has some to score.
    """
    batches = []
    for length in sorted({len(row["input_ids"][: tiles * compiled.PAD_MULTIPLE]) for tiles in (1, 2)}):
        ids = list(row["input_ids"][:length])
        half = length // 2
        batches += [
            [{"input_ids": ids, "labels": ids, "seq_lengths": lengths}] for lengths in ([length], [half, length - half])
        ]
    return batches


def micro_batches_by_length(
    rows: Dataset, rows_per_batch: int = 1, limit: int = LENGTHS_REHEARSED
) -> list[tuple[int, int]]:
    """Micro-batches of each length a run of ``rows_per_batch`` rows per micro-batch can meet, as (row index,
    copies): that many copies of one row joined, shortest first; of more than ``limit`` lengths, ``limit`` spread
    evenly from the shortest to the longest.

    Padding-free batches join a micro-batch's rows into one sequence, padded to ``PAD_MULTIPLE`` as a whole, so
    with 2 rows a micro-batch can be up to twice the longest row: the longest row of each padded length, joined
    with itself 1 to ``rows_per_batch`` times, spans every length from the shortest row to the longest
    micro-batch. (Without packing the collator pads the rows to a [rows, length] batch instead; the copies then
    stand for its size, rows x length.)
    The lengths come from the Arrow offsets of ``input_ids`` (no token is read) of the memory-mapped token cache
    the trainer opens, so a data set of millions of rows costs milliseconds (a data set behind an index mapping,
    after a ``select`` or ``shuffle``, would be copied first)."""
    lengths = pyarrow.compute.list_value_length(rows.with_format("arrow")["input_ids"]).to_numpy()
    # the longest row of each padded length: joined with itself it reaches the longest micro-batch of that length
    by_padded_then_longest = numpy.lexsort((-lengths, padded(lengths)))
    _, first = numpy.unique(padded(lengths)[by_padded_then_longest], return_index=True)
    longest = by_padded_then_longest[first]
    by_length: dict[int, tuple[int, int]] = {}
    for copies in range(1, rows_per_batch + 1):  # the fewest copies first: the row alone where it is enough
        for index in longest:
            by_length.setdefault(int(padded(copies * lengths[index])), (int(index), copies))
    found = sorted(by_length)
    if len(found) > limit:
        found = [found[i] for i in numpy.unique(numpy.linspace(0, len(found) - 1, limit).round().astype(int))]
    return [by_length[length] for length in found]


def padded(lengths: Any) -> Any:
    """Token counts rounded up to ``PAD_MULTIPLE``, as the collator pads a micro-batch."""
    return -(-lengths // compiled.PAD_MULTIPLE) * compiled.PAD_MULTIPLE


class SpeedPath(TrainerCallback):
    """Which blocks and attention this run trains with, rehearsed at ``on_train_begin`` (after accelerate has
    prepared the model and the Trainer enabled gradient checkpointing, so the variants are the real ones)."""

    def __init__(
        self, trainer: Trainer, topology: Topology, *, blocks_compiled: bool, attention: str, strict: bool
    ) -> None:
        self.trainer = trainer
        self.topology = topology
        self.blocks_compiled = blocks_compiled
        self.attention = attention
        self.strict = strict
        self.fallback: str | None = None
        self.compile: dict[str, float] | None = None
        self.rehearsal_totals: dict[str, float] | None = None
        self.lengths_rehearsed = (0, 0)  # training, evaluation

    @property
    def rehearsed(self) -> bool:
        """Whether this run has a fast path to rehearse: compiled blocks or flex_attention, outside FSDP."""
        return (self.blocks_compiled or self.attention == "flex_attention") and not self.trainer.is_fsdp_enabled

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self.rehearsed:
            return
        started = time.monotonic()
        failure = self._rehearse()
        failures = [found for found in diagnostics.gather(failure, self.topology.world_size) if found]
        self.rehearsal_totals = compiled.compile_stats()
        if not failures:
            log.info(
                "speed path: %s rehearsed on the first training and evaluation batches, rows cut from them and "
                "micro-batches of %d training and %d evaluation lengths in %.1f s, %d graph(s) compiled",
                self.path(),
                *self.lengths_rehearsed,
                time.monotonic() - started,
                self.rehearsal_totals["graphs"],
            )
            return
        self._fall_back(failures)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self.blocks_compiled or self.rehearsal_totals is None:
            return
        totals = compiled.compile_stats()
        self.compile = {
            "graphs": totals["graphs"],
            "graphs_after_rehearsal": totals["graphs"] - self.rehearsal_totals["graphs"],
            "seconds": totals["seconds"],
        }
        log.info(
            "compiled blocks: %d graph(s) in all, %d of them after the rehearsal (a variant it did not meet: "
            "TORCH_LOGS=recompiles says which), %.1f s compiling",
            self.compile["graphs"],
            self.compile["graphs_after_rehearsal"],
            self.compile["seconds"],
        )

    def path(self) -> str:
        return f"{'compiled' if self.blocks_compiled else 'eager'} blocks, {self.attention}"

    def summary(self) -> dict[str, Any]:
        """The fields ``training_summary.json`` records about it."""
        return {
            "attention": self.attention,
            "compiled_blocks": self.blocks_compiled,
            "compile": self.compile,
            "speed_fallback": self.fallback,
        }

    def _rehearse(self) -> Failure | None:
        """The training micro-batches (forward and backward), then the evaluation batches, on this rank; what
        failed. Each phase runs the data's first batch, those of ``cut_rows`` and a micro-batch of each length its
        micro-batches can have (``micro_batches_by_length``)."""
        trainer, model = self.trainer, self.trainer.model
        train_rows, eval_rows = trainer.train_dataset, trainer.eval_dataset
        per_batch = trainer.args.per_device_train_batch_size
        first = [train_rows[i] for i in range(min(len(train_rows), per_batch))]
        cut = cut_rows(first[0])
        train_lengths = micro_batches_by_length(train_rows, per_batch)
        eval_lengths = micro_batches_by_length(eval_rows) if eval_rows is not None and len(eval_rows) else []
        self.lengths_rehearsed = (len(train_lengths), len(eval_lengths))
        # row 0 alone may be among them: not again where a phase's first batch is row 0 alone
        train_by_length = [
            [train_rows[i]] * copies for i, copies in train_lengths if (i, copies) != (0, 1) or per_batch > 1
        ]
        eval_by_length = [[eval_rows[i]] for i, _ in eval_lengths if i]
        during = "the first training step"
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        try:
            with torch.random.fork_rng(devices=devices):
                model.train()
                for batch in (first, *cut, *train_by_length):
                    model(**model_inputs(trainer, batch)).loss.backward()
                    model.zero_grad(set_to_none=True)
                if eval_lengths:
                    during = "the first evaluation"
                    model.eval()
                    with torch.no_grad():
                        for batch in ([eval_rows[0]], *cut, *eval_by_length):
                            model(**model_inputs(trainer, batch))
        except Exception as error:
            if not compiled.is_compile_failure(error):
                raise
            log.error("speed path: %s failed in the rehearsal of %s", self.path(), during, exc_info=error)
            return Failure(self.topology.rank, during, f"{type(error).__name__}: {one_line(error, 300)}")
        finally:
            model.zero_grad(set_to_none=True)
            model.train()
        return None

    def _fall_back(self, failures: list[Failure]) -> None:
        """Every rank onto eager blocks and sdpa, or the run ended under ``strict_compile``."""
        what = "; ".join(failure.describe() for failure in failures)
        if self.strict:
            raise UserError(
                f"The speed path ({self.path()}) failed in its rehearsal: {what}. strict_compile is set, so the run "
                "ends here; unset it to continue on eager blocks and sdpa, or set compile_blocks false and attention "
                "sdpa. The traceback in the failing rank's log is what to report."
            )
        failed_path = self.path()
        compiled.uncompile_blocks(self.trainer.model)
        if self.attention == "flex_attention":
            transformers_model(self.trainer.model).set_attn_implementation(PROVEN_ATTENTION)
        self.blocks_compiled, self.attention = False, PROVEN_ATTENTION
        torch._dynamo.reset()  # nothing compiled runs any more; drop its code and guards
        self.fallback = (
            f"{failed_path} failed in the rehearsal of {what}; trained on the proven path: {self.path()} (slower)"
        )
        log.warning(
            "SPEED FALLBACK: %s. The run goes on; set strict_compile to fail instead. The traceback above (on the "
            "failing rank) is what to report.",
            self.fallback,
        )
