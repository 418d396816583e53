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
from trainer.attention import FLEX_BLOCK

log = logging.getLogger("trainer")

PAD_MULTIPLE = FLEX_BLOCK  # a padded row fills FlexAttention's last block


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
    """Compile every block in place (``nn.Module.compile``: the module objects, their hooks and names stay).

    Two of torch.compile's defaults are changed for the whole process:

    - ``optimize_ddp`` off: inside DDP's forward, dynamo would split each block's graph at DDP's
      bucket boundaries (DDPOptimizer), losing fusion, and that splitting has failed with
      checkpointed regions (pytorch/pytorch#104674, #119440). A compiled block's backward is one
      autograd node, so DDP still overlaps its gradient all-reduce block by block.
    - ``fail_on_recompile_limit_hit``: all blocks share one code object and its variants
      (checkpointed or not, training or evaluation, static then dynamic shapes) count against
      dynamo's recompile limit; past it dynamo would run the blocks eager with only a warning.
      Failing instead ends the run with ``compile_failures_explained``'s advice.
    """
    torch._dynamo.config.optimize_ddp = False
    torch._dynamo.config.fail_on_recompile_limit_hit = True
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
            f"torch.compile failed ({one_line(error, 300)}). What a run compiles: its transformer blocks when "
            "compile_blocks is true (on CUDA, without sharding fsdp) and the attention kernel when it is "
            "flex_attention (what attention auto picks for packed rows on GPUs). To train without compiling, rerun "
            "with compile_blocks false and attention sdpa (slower: packed rows then get a dense mask); the "
            "traceback above is what to report."
        ) from None


def compile_stats() -> dict[str, float]:
    """Graphs compiled so far and the seconds spent compiling them (forward and backward)."""
    spent = torch._dynamo.utils.calculate_time_spent()
    return {
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "seconds": spent.get("total_wall_time", 0.0),
    }


class CompileReport(TrainerCallback):
    """Logs what compiling cost: in the first step (every block traced once), and in all after it.

    Later compilations are expected a few times (the evaluation's no-gradient variant, the switch to a
    shape-generic graph at the first new shape); a number that keeps growing from run to run of the same
    data means shapes or guards keep changing, which ``TORCH_LOGS=recompiles`` explains.
    """

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
        log.info(
            "compiled blocks: %d more graph(s) compiled after the first step (evaluation, new shapes), %.1f s; "
            "TORCH_LOGS=recompiles says why each was needed",
            stats["graphs"] - self.after_first_step["graphs"],
            stats["seconds"] - self.after_first_step["seconds"],
        )
