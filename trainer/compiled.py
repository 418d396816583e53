"""Regional compilation: each transformer block compiled by torch.compile, one compiled graph for all of them.

A model's blocks run the same code on different weights, so compiling the block (not the whole
model) traces it once and reuses the result for every layer: compile time is a block's, not the
model's, and the model's own Python (masks, loss, PEFT's wrapper) stays eager and debuggable.
This is torchtune's ``compile: True`` and torchtitan's per-block compile. Packed rows vary in
length; they are padded to ``PAD_MULTIPLE`` tokens so that rows of nearly the same length share a
shape, and after the first new shape torch.compile traces a shape-generic graph, so recompilation
stops there. The log says what was compiled, how long compiling took and how often it recompiled.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterator

import torch
import torch._dynamo.exc
import torch._dynamo.utils
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer

from common.errors import UserError, one_line

log = logging.getLogger("trainer")

PAD_MULTIPLE = 128  # FlexAttention's block: a padded row fills its last block


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the layers transformers itself checkpoints one at a time."""
    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def why_not_compiled(asked: bool, cuda: bool, sharding: str) -> str | None:
    """Why this run's blocks stay eager, or None when they are compiled."""
    if not asked:
        return "compile_blocks is false"
    if not cuda:
        return "a CPU run (compile_blocks applies on CUDA GPUs)"
    if sharding == "fsdp":
        return "sharding fsdp (compiled blocks under FSDP2 are not tested here yet)"
    return None


def compile_blocks(model: torch.nn.Module) -> int:
    """Compile every block in place (``nn.Module.compile``: the module objects, their hooks and names stay)."""
    found = blocks(model)
    for block in found:
        block.compile()
    return len(found)


@contextlib.contextmanager
def compile_failures_explained() -> Iterator[None]:
    """A torch.compile failure (of the blocks, or of FlexAttention's kernel) as the way to train without it.

    These are library or driver failures, not the user's: the traceback goes to the log for a bug
    report, and the run ends with the two switches that avoid compiling.
    """
    try:
        yield
    except torch._dynamo.exc.TorchDynamoException as error:
        log.error("torch.compile failed", exc_info=error)
        raise UserError(
            f"torch.compile failed ({one_line(error, 300)}). This run compiles its transformer blocks "
            "(compile_blocks) and, with attention flex_attention (what auto picks for packed rows on GPUs), the "
            "attention kernel. To train without compiling, rerun with compile_blocks false and attention sdpa (the "
            "settings before issue 25; slower); the traceback above is what to report."
        ) from None


def compile_stats() -> dict[str, float]:
    """Graphs compiled so far and the seconds spent compiling them (forward and backward)."""
    spent = torch._dynamo.utils.calculate_time_spent()
    return {
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "seconds": spent.get("total_wall_time", 0.0),
    }


class CompileReport(TrainerCallback):
    """Logs what compiling cost: in the first step (every block shape traced once), and after it (recompilations:
    a new shape, at most once more when torch.compile switches to a shape-generic graph; more means trouble)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.after_first_step: dict[str, float] | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.started = time.monotonic()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.after_first_step is not None:
            return
        self.after_first_step = compile_stats()
        log.info(
            "compiled blocks: the first step took %.1f s, %.1f s of it compiling %d graph(s)",
            time.monotonic() - self.started,
            self.after_first_step["seconds"],
            self.after_first_step["graphs"],
        )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.after_first_step is None:
            return
        stats = compile_stats()
        recompiled = int(stats["graphs"] - self.after_first_step["graphs"])
        log.info(
            "compiled blocks: %d recompilation(s) after the first step, %.1f s%s",
            recompiled,
            stats["seconds"] - self.after_first_step["seconds"],
            "; more than one means shapes keep changing: rerun with TORCH_LOGS=recompiles to see why"
            if recompiled > 1
            else "",
        )
