"""Regional compilation: each transformer block compiled by torch.compile, one compiled graph for all of them.

A model's blocks run the same code on different weights, so compiling the block (not the whole
model) traces it once and reuses the result for every layer: compile time is a block's, not the
model's, and the model's own Python (masks, loss, PEFT's wrapper) stays eager and debuggable.
This is torchtune's ``compile: True`` and torchtitan's per-block compile.

All blocks share one code object, so every variant dynamo traces of it counts against one
recompile limit (``recompile_limit``, 8 by default: blocks are not told apart by identity). A run
produces several: layers with and without RoPE (SmolLM3's NoPE layers), the first LoRA block (its
input needs no gradient), checkpointed and kept blocks under ``checkpoint_every`` > 1, and the
evaluation (no gradient, eval mode) of each. The sequence length is symbolic from the first trace
(``dynamic=True``), so a new row length adds no variant, and the limit is sized so that even one
variant per block and mode fits. The log counts the graphs; ``TORCH_LOGS=recompiles`` says why each
was needed.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from typing import Iterator

import torch
import torch._dynamo.exc
import torch._dynamo.utils
from transformers.modeling_layers import GradientCheckpointingLayer

from common.errors import UserError, one_line
from trainer.attention import FLEX_BLOCK
from trainer.config import TrainConfig

log = logging.getLogger("trainer")

PAD_MULTIPLE = FLEX_BLOCK  # a padded row fills FlexAttention's last block
# The backend that generates the blocks' kernels (Triton on CUDA). Any other backend (eager, aot_eager) traces and
# guards exactly as inductor does without generating code, so it compiles the blocks on CPU too.
INDUCTOR = "inductor"
# Variants one block can need: {training, evaluation} x {its input needs a gradient, or not}.
VARIANTS_PER_BLOCK = 4
COMPILER_PACKAGES = ("torch._dynamo", "torch._inductor", "torch._higher_order_ops", "triton")
COMPILER_PATHS = tuple(f"/{package.replace('.', '/')}/" for package in COMPILER_PACKAGES)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the layers transformers itself checkpoints one at a time."""
    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def why_not_compiled(asked: bool, cuda: bool, sharding: str, backend: str = INDUCTOR) -> str | None:
    """Why this run's blocks stay eager, or None when they are compiled."""
    if not asked:
        return "compile_blocks is false"
    if not cuda and backend == INDUCTOR:
        return "a CPU run (compile_blocks applies on CUDA GPUs)"
    if sharding == "fsdp":
        return "sharding fsdp (compiled blocks under FSDP2 are not tested here yet)"
    return None


def why_run_not_compiled(config: TrainConfig) -> str | None:
    """Why this run's blocks stay eager, or None when they are compiled."""
    if config.objective != "sft":
        return f"objective {config.objective} (the rehearsal of compiled blocks knows the rows of sft only)"
    return why_not_compiled(config.compile_blocks, torch.cuda.is_available(), config.sharding, config.compile_backend)


def recompile_budget(block_count: int) -> int:
    """A recompile limit no run of ``block_count`` blocks can reach: every block its own variant in training and
    evaluation, with and without a gradient on its input. A model that needs that many has a graph break or a
    per-layer guard (the log's graph count shows it), which costs compile time but never the run."""
    return VARIANTS_PER_BLOCK * block_count


def compile_blocks(model: torch.nn.Module, backend: str = INDUCTOR) -> int:
    """Compile every block in place (``nn.Module.compile``: the module objects, their hooks and names stay).

    torch.compile's settings changed for the whole process:

    - ``optimize_ddp`` off: inside DDP's forward, dynamo would split each block's graph at DDP's
      bucket boundaries (DDPOptimizer), losing fusion, and that splitting has failed with
      checkpointed regions (pytorch/pytorch#104674, #119440). A compiled block's backward is one
      autograd node, so DDP still overlaps its gradient all-reduce block by block.
    - ``recompile_limit`` (and the accumulated limit) raised to ``recompile_budget``: the default 8 is
      less than a SmolLM3-shaped run needs (10 graphs, 18 with ``checkpoint_every`` 3: tests/test_compiled_runs.py).
    - ``fail_on_recompile_limit_hit``: past the limit dynamo would run the blocks eager with only a
      warning; failing instead is caught by the rehearsal (``trainer.rehearsal``) or explained by
      ``compile_failures_explained``.
    """
    found = blocks(model)
    budget = recompile_budget(len(found))
    config = torch._dynamo.config
    config.optimize_ddp = False
    config.fail_on_recompile_limit_hit = True
    config.recompile_limit = max(config.recompile_limit, budget)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 2 * budget)
    for block in found:
        # dynamic: the sequence length is symbolic from the first trace, so a new length is no new variant
        block.compile(backend=backend, dynamic=True)
    return len(found)


def uncompile_blocks(model: torch.nn.Module) -> None:
    """Every block back to eager: ``nn.Module.__call__`` runs ``_compiled_call_impl`` only while it is set, and
    ``nn.Module.compile`` has no public inverse."""
    for block in blocks(model):
        block._compiled_call_impl = None


def is_compile_failure(error: BaseException) -> bool:
    """A failure of torch.compile or of what it generated, as opposed to running out of memory.

    dynamo's and inductor's own exceptions (``FailOnRecompileLimitHit`` is a plain ``Exception`` in torch 2.11
    and 2.13), Triton's compile and launch errors (``triton.compiler.errors``, ``triton.runtime.errors``: out of
    shared memory, a kernel the driver refuses), and any error raised inside a compiled region: a kernel's first
    launch happens there, and its errors are often plain ``RuntimeError``s.
    """
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if any(kind.__module__.startswith(COMPILER_PACKAGES) for kind in type(error).__mro__):
        return True
    return any(
        any(part in frame.f_code.co_filename for part in COMPILER_PATHS)
        for frame, _ in traceback.walk_tb(error.__traceback__)
    )


@contextlib.contextmanager
def compile_failures_explained() -> Iterator[None]:
    """A torch.compile failure (of the blocks, or of FlexAttention's kernel) as the way to train without it.

    These are library or driver failures, not the user's: the traceback goes to the log for a bug
    report, and the run ends with the two switches that avoid compiling. The rehearsal of the first
    step and evaluation already falls back on its own; what reaches this is a variant first met later.
    """
    try:
        yield
    except Exception as error:
        if not is_compile_failure(error):
            raise
        log.error("torch.compile failed", exc_info=error)
        raise UserError(
            f"torch.compile failed ({type(error).__name__}: {one_line(error, 300)}). What a run compiles: its "
            "transformer blocks when compile_blocks is true (on CUDA, without sharding fsdp) and the attention kernel "
            "when it is flex_attention (what attention auto picks for packed rows in compiled blocks). To train "
            "without compiling, rerun with compile_blocks false and attention sdpa (slower: packed rows then get a "
            "dense mask); the traceback above is what to report."
        ) from None


def compile_stats() -> dict[str, float]:
    """Graphs compiled so far and the seconds spent compiling them (forward and backward)."""
    spent = torch._dynamo.utils.calculate_time_spent()
    return {
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "seconds": round(spent.get("total_wall_time", 0.0), 2),
    }
