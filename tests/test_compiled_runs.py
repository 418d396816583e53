"""The trainer's own compile path through whole runs: every graph variant fits, and a failing one costs speed only.

On CPU the path is forced on with ``--compile-backend eager``: dynamo traces, guards and counts
variants against its recompile limit exactly as with inductor, and only the code generation is
skipped. The model is a tiny SmolLM3 shaped like the cluster's default (8 blocks, NoPE every 4th:
``use_rope`` is a per-block guard), trained on packed rows of several lengths with an evaluation
every few steps, so a run meets every variant a real one does: RoPE and NoPE blocks, the first LoRA
block (its input needs no gradient), checkpointed and kept blocks under ``checkpoint_every``, the
evaluation's no-gradient variants, and new row lengths.

Failures are injected as torch.compile backends registered in a ``sitecustomize`` on the workers'
``PYTHONPATH``: one that fails to compile the training variants, one the evaluation's, one whose
compiled code fails when first run (a Triton kernel the GPU refuses at launch), each on every rank
or on rank 1 only. The run must continue on eager blocks and sdpa with the loss curve of a run that
never compiled, say so in its summary and log, and fail instead under ``--strict-compile``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from datasets import Dataset
from shared_builds import build_once
from test_trainer_run import finish, summary, torchrun, trainer_args

from trainer.rehearsal import micro_batches_by_length

pytestmark = pytest.mark.slow

STEPS = 4
EVAL_STEPS = 2
# Packed rows of up to 512 tokens, two to a micro-batch: micro-batches of 896 to 1024 tokens, eval rows of 384 and
# 512 (each padded to a multiple of 128).
MAX_LENGTH = 512
DEFAULT_RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit before the trainer raises it
LOSS_TOLERANCE = {"rel": 1e-4, "abs": 1e-5}

FAULTY_BACKENDS = """
import os
import torch._dynamo

if os.environ.get("ALLOW_FLEX_ON_CPU"):
    import trainer.config

    del trainer.config.NEEDS_PACKAGE["attention", "flex_attention"]

_rank = os.environ.get("RANK", "0")
_only = os.environ.get("FAULT_RANK")
_armed = _only is None or _only == _rank


@torch._dynamo.register_backend
def fail_training_compile(graph, inputs):
    if _armed and torch.is_grad_enabled():
        raise RuntimeError("injected: no compiler for this GPU")
    return graph.forward


@torch._dynamo.register_backend
def fail_evaluation_compile(graph, inputs):
    if _armed and not torch.is_grad_enabled():
        raise RuntimeError("injected: no compiler for this GPU")
    return graph.forward


@torch._dynamo.register_backend
def fail_first_launch(graph, inputs):
    if not _armed:
        return graph.forward

    def launch(*args):
        raise RuntimeError("injected: Triton Error [CUDA]: out of resource: shared memory")

    return launch
"""


# Session fixtures built once for all of xdist's workers (tests/shared_builds.py): each test here is a run of its
# own, and the runs spread over the workers.


@pytest.fixture(scope="session")
def smollm3_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """8 blocks of 64 wide, NoPE every 4th block, with the tiny models' tokenizer (SmolLM2's, cut to 2048 ids)."""
    from conftest import save_tiny_model, tiny_shape
    from transformers import AutoTokenizer, SmolLM3Config

    def build(target: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        config = SmolLM3Config(**tiny_shape(tokenizer), num_hidden_layers=8, no_rope_layer_interval=4)
        assert config.no_rope_layers.count(0) == 2  # blocks 3 and 7 have no RoPE
        save_tiny_model(config, tokenizer, target)

    return build_once(tmp_path_factory, "smollm3-nope", build)


@pytest.fixture(scope="session")
def faulty_backends(tmp_path_factory) -> Path:
    return build_once(
        tmp_path_factory,
        "faulty-backends",
        lambda directory: (directory / "sitecustomize.py").write_text(FAULTY_BACKENDS),
    )


def train(
    model: Path,
    data: Path,
    output: Path,
    *extra: str,
    ranks: int = 1,
    env: dict[str, str] | None = None,
    max_length: int = MAX_LENGTH,
) -> tuple[dict, str]:
    args = trainer_args(
        model,
        data,
        output,
        "--max-steps",
        STEPS,
        "--eval-steps",
        EVAL_STEPS,
        "--learning-rate",
        "1e-3",
        "--collective-timeout-minutes",
        "2",
        *extra,
    )
    args[args.index("--max-length") + 1] = str(max_length)
    args[args.index("--tokens-dir") + 1] = str(tokenised_for(model, data, max_length))
    log = output.parent / f"{output.name}.log"
    process = torchrun(args, env={"TORCH_LOGS": "recompiles", **(env or {})}, log=log, ranks=ranks)
    code = finish(process)
    text = log.read_text()
    assert code == 0, text[-4000:]
    return summary(output), text


def tokenised_for(model: Path, data: Path, max_length: int = MAX_LENGTH) -> Path:
    from conftest import tokenised

    return tokenised(model, data, max_length=max_length)


def losses(output: Path) -> list[float]:
    history = json.loads((output / "training_history.json").read_text())
    return [entry["loss"] for entry in history if "loss" in entry] + [
        entry["eval_loss"] for entry in history if "eval_loss" in entry
    ]


# QLoRA's compiled blocks are checked by its own run (tests/test_qlora.py).
@pytest.mark.parametrize(
    ("method", "checkpoint_every"),
    [("lora", 0), ("lora", 1), ("lora", 2), ("lora", 3), ("full", 1), ("full", 2), ("full", 3)],
    ids=lambda value: str(value),
)
def test_every_variant_of_a_run_fits_the_compiled_blocks(
    smollm3_dir, prepared_data_dir, tmp_path, method, checkpoint_every
):
    checkpointing = (
        ["--gradient-checkpointing", "true", "--checkpoint-every", str(checkpoint_every)] if checkpoint_every else []
    )
    result, log = train(
        smollm3_dir,
        prepared_data_dir,
        tmp_path / "run",
        "--method",
        method,
        "--compile-backend",
        "eager",
        *checkpointing,
    )

    assert result["compiled_blocks"] and result["speed_fallback"] is None, log[-3000:]
    assert result["compile"]["graphs_after_rehearsal"] == 0, log[-3000:]
    assert result["global_step"] == STEPS
    evaluations = json.loads((tmp_path / "run" / "training_history.json").read_text())
    assert sum("eval_loss" in entry for entry in evaluations) >= STEPS // EVAL_STEPS
    assert "SPEED FALLBACK" not in log and "recompile_limit" not in log
    rows = tokenised_for(smollm3_dir, prepared_data_dir)
    assert padded_lengths(rows / "eval.arrow") == {384, 512}
    # a micro-batch of each length was rehearsed, 2 rows joined among them (per_device_batch_size 2): Inductor's
    # length ranges (an H200's, 2026-11-28) hold no surprise
    micro_batches = micro_batches_by_length(Dataset.from_file(str(rows / "train.arrow")), rows_per_batch=2)
    assert len(micro_batches) > len(padded_lengths(rows / "train.arrow"))
    assert f"micro-batches of {len(micro_batches)} training and 2 evaluation lengths" in log
    graphs, recompiles = result["compile"]["graphs"], len(re.findall(r"Recompiling function", log))
    assert recompiles == graphs - 1  # one graph per variant of the one code object: the first, then recompiles
    if checkpoint_every == 3:  # RoPE/NoPE x checkpointed/kept, in training and evaluation, and the first block
        assert graphs > DEFAULT_RECOMPILE_LIMIT
    print(f"{method} checkpoint_every={checkpoint_every}: {graphs} graphs")


def test_rows_of_one_conversation_are_rehearsed_too(smollm3_dir, prepared_data_dir, tmp_path):
    """At 128 tokens a row holds one conversation: one that fills the row needs no attention mask, the padded ones
    do (padding is a sequence of its own), and a compiled block guards on the mask being there."""
    result, log = train(smollm3_dir, prepared_data_dir, tmp_path / "run", "--compile-backend", "eager", max_length=128)
    assert result["compiled_blocks"] and result["speed_fallback"] is None, log[-3000:]
    assert result["compile"]["graphs_after_rehearsal"] == 0, log[-3000:]


def padded_lengths(rows: Path) -> set[int]:
    return {-(-len(ids) // 128) * 128 for ids in Dataset.from_file(str(rows))["input_ids"]}


@pytest.fixture(scope="session")
def eager_losses(tiny_model_dir, prepared_data_dir, tmp_path_factory):
    """The loss curve of a run that never compiles, per number of ranks: what a run that fell back must train like."""

    def of(ranks: int) -> list[float]:
        def build(directory: Path) -> None:
            train(tiny_model_dir, prepared_data_dir, directory / "run", "--no-compile-blocks", ranks=ranks)

        return losses(build_once(tmp_path_factory, f"eager-{ranks}", build) / "run")

    return of


def faulty_environment(faulty_backends: Path, fault_rank: str | None) -> dict[str, str]:
    from conftest import REPO_ROOT

    env = {"PYTHONPATH": f"{faulty_backends}{os.pathsep}{REPO_ROOT}"}
    return {**env, "FAULT_RANK": fault_rank} if fault_rank is not None else env


@pytest.mark.parametrize(
    ("backend", "ranks", "fault_rank", "during"),
    [
        ("fail_training_compile", 1, None, "the first training step"),
        ("fail_evaluation_compile", 1, None, "the first evaluation"),
        ("fail_training_compile", 2, "1", "the first training step"),
        ("fail_evaluation_compile", 2, "1", "the first evaluation"),
        ("fail_first_launch", 2, "0", "the first training step"),
    ],
)
def test_a_failure_in_the_rehearsal_moves_every_rank_to_the_proven_path(
    tiny_model_dir, prepared_data_dir, tmp_path, faulty_backends, eager_losses, backend, ranks, fault_rank, during
):
    output = tmp_path / "run"
    env = faulty_environment(faulty_backends, fault_rank)
    result, log = train(tiny_model_dir, prepared_data_dir, output, "--compile-backend", backend, ranks=ranks, env=env)

    assert result["speed_fallback"].startswith("compiled blocks, sdpa failed in the rehearsal of " + during)
    assert f"on rank {fault_rank or 0} (" in result["speed_fallback"]
    assert "trained on the proven path: eager blocks, sdpa" in result["speed_fallback"]
    assert (result["compiled_blocks"], result["attention"], result["compile"]) == (False, "sdpa", None)
    assert log.count("SPEED FALLBACK") == ranks, log[-4000:]  # every rank took it
    assert "injected:" in log  # the failing rank's traceback, for the bug report
    assert result["global_step"] == STEPS
    assert losses(output) == pytest.approx(eager_losses(ranks), **LOSS_TOLERANCE)


def test_flex_attention_that_fails_falls_back_to_sdpa(
    tiny_model_dir, prepared_data_dir, tmp_path, faulty_backends, eager_losses
):
    """A real failure, not an injected one: FlexAttention has no backward on CPU. The sitecustomize lets the
    trainer ask for it there (it refuses flex_attention without CUDA and Triton, rightly, before loading)."""
    output = tmp_path / "run"
    env = {**faulty_environment(faulty_backends, None), "ALLOW_FLEX_ON_CPU": "1"}
    result, log = train(
        tiny_model_dir,
        prepared_data_dir,
        output,
        "--attention",
        "flex_attention",
        "--compile-backend",
        "eager",
        env=env,
    )

    assert result["speed_fallback"].startswith(
        "compiled blocks, flex_attention failed in the rehearsal of the first training step on rank 0 ("
    )
    assert (result["compiled_blocks"], result["attention"]) == (False, "sdpa")
    assert "FlexAttention does not support backward on CPU" in log
    assert losses(output) == pytest.approx(eager_losses(1), **LOSS_TOLERANCE)


def test_strict_compile_ends_the_run_with_one_paragraph(tiny_model_dir, prepared_data_dir, tmp_path, faulty_backends):
    from conftest import run_module

    output = tmp_path / "run"
    args = trainer_args(tiny_model_dir, prepared_data_dir, output, "--max-steps", STEPS)
    env = {**os.environ, **faulty_environment(faulty_backends, None)}
    result = run_module("trainer", *args, "--compile-backend", "fail_training_compile", "--strict-compile", env=env)

    assert result.returncode == 2, result.stderr[-3000:]
    paragraph = result.stderr[result.stderr.index("error: ") :]
    assert paragraph.startswith(
        "error: The speed path (compiled blocks, sdpa) failed in its rehearsal: the first training step on rank 0"
    )
    assert "strict_compile is set" in paragraph and "Traceback" not in paragraph
    assert "injected:" in result.stderr[: result.stderr.index("error: ")]  # the traceback stays in the log above
    assert not (output / "training_summary.json").exists()
