"""The train step's progress lines (components/train/progress.py) from the trainer's ``progress.json``
(trainer/progress.py), and MFU (trainer/mfu.py). A two-rank run's lines: tests/test_train_local.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import time
from types import SimpleNamespace

import pytest
import torch
from fake_run import training_progress
from transformers import AutoModelForCausalLM, TrainerControl, TrainerState, TrainingArguments

import components.train.progress as progress_module
import trainer.progress as trainer_progress
from common.records import TrainingProgress
from components.train.progress import ProgressReporter, progress_line
from trainer import mfu
from trainer.progress import ProgressFile

MOVING = training_progress()


def test_a_line_says_where_the_run_is():
    assert progress_line(MOVING) == (
        "progress: step 450/1000 (45.0%), epoch 1.35, 1,234,567 tokens, 3,400 tokens/s, MFU 38.2%, loss 1.2346, "
        "lr 1.90e-04, ETA 0:07:20, last checkpoint checkpoint-400"
    )
    first = dataclasses.replace(MOVING, step=0, tokens_per_second=None, mfu=None, loss=None, learning_rate=None)
    first = dataclasses.replace(first, eta_seconds=None, last_checkpoint=None)
    assert progress_line(first) == "progress: step 0/1000 (0.0%), epoch 1.35, 1,234,567 tokens, no checkpoint yet"
    done = dataclasses.replace(MOVING, step=1000, eta_seconds=0.0, finished=True)
    assert progress_line(done).endswith("lr 1.90e-04, done, last checkpoint checkpoint-400")


def watched(reporter: ProgressReporter):
    """A function that returns once the reporter's thread has read the file twice more: after a write, it has
    read what was written."""
    reads = []
    check = reporter.check

    def counted(final: bool = False) -> None:
        check(final)
        reads.append(final)

    reporter.check = counted

    def settle() -> None:
        wanted, deadline = len(reads) + 2, time.monotonic() + 30
        while len(reads) < wanted:
            assert time.monotonic() < deadline, "the reporter stopped reading"
            time.sleep(0.005)

    return settle


def test_lines_come_a_minute_apart_at_each_checkpoint_and_at_the_end(tmp_path, monkeypatch):
    """Rewrites between lines are not printed; a new checkpoint is, at once; the last record is, at the end; a file
    that is not a progress record is said once, and never fails the step."""
    monkeypatch.setattr(progress_module, "CHECK_SECONDS", 0.01)
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 3600.0)
    path, out = tmp_path / "progress.json", io.StringIO()
    reporter = ProgressReporter(path, out)
    settle = watched(reporter)
    recent = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    with reporter:
        settle()  # no file yet: nothing, and no error
        training_progress(updated=recent).write(path)
        settle()
        training_progress(step=451, updated=recent).write(path)  # within the minute: not printed
        settle()
        assert out.getvalue().count("\n") == 1 and reporter.last.step == 451
        path.write_text("{not json")  # a torn or foreign file: said once, then read again at the next check
        settle()
        path.write_text('{"format_version": 1, "step": "x"}')
        settle()
        training_progress(step=500, last_checkpoint="checkpoint-500", updated=recent).write(path)
        settle()
        training_progress(step=510, last_checkpoint="checkpoint-500", updated=recent).write(path)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith(f"progress: cannot read {path} (") and lines[1].endswith(
        "The trainer rewrites it at its next logging step; it is only read to report progress.); the replicas' own "
        "lines say how it goes"
    )
    assert [line.split(",")[0] for line in lines[:1] + lines[2:]] == [
        "progress: step 450/1000 (45.0%)",
        "progress: step 500/1000 (50.0%)",
        "progress: step 510/1000 (51.0%)",  # the end of the step: the last record, whatever the clock
    ]
    assert reporter.metrics() == {
        "progress_percent": 51.0,
        "total_steps": 1000,
        "final_learning_rate": 1.9e-4,
    }


def test_a_record_from_before_the_step_started_says_so(tmp_path):
    """A job the step found running, or an earlier attempt's last record: not presented as the run's state now."""
    path, out = tmp_path / "progress.json", io.StringIO()
    training_progress(updated="2026-11-28T05:00:00+00:00").write(path)
    with ProgressReporter(path, out):
        pass
    assert out.getvalue().endswith(
        ", last checkpoint checkpoint-400 (written 2026-11-28T05:00:00+00:00, before this step started)\n"
    )


@pytest.mark.parametrize(
    ("device", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H200", "fp16", 989e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA L40", "bf16", 181e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA H100 80GB HBM3", "fp32", None),  # no tensor-core peak for fp32
        ("Tesla T4", "fp16", None),  # not listed: no guess
        ("cpu", "fp32", None),
    ],
)
def test_the_peak_is_the_data_sheets_for_the_gpu_and_precision(device, precision, peak):
    assert mfu.peak_flops(device, precision) == peak


def test_mfu_counts_6n_for_full_training_and_4n_for_adapters_over_every_gpu():
    assert mfu.flops_per_token(1_000_000, trains_adapter=False) == 6_000_000
    assert mfu.flops_per_token(1_000_000, trains_adapter=True) == 4_000_000
    # 2 GPUs of 1 PFLOP/s; 100,000 tokens/s of a 1B model trained whole: 6e14 FLOP/s of 2e15
    assert mfu.utilisation(100_000, 6e9, 1e15, 2) == pytest.approx(0.3)
    assert mfu.utilisation(100_000, 6e9, None, 2) is None


def test_the_weights_counted_are_every_products_even_tied_or_in_4_bits(tiny_model_dir):
    """The output projection of a model that ties it to the embeddings is a product, counted; a 4-bit layer holds
    its weights two a byte, counted whole."""
    import bitsandbytes

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # SmolLM2's tied head
    layers = model.named_parameters()
    blocks = sum(weight.numel() for name, weight in layers if name.startswith("model.layers") and "norm" not in name)
    assert mfu.matmul_weights(model) == blocks + model.lm_head.weight.numel()
    quantised = bitsandbytes.nn.Linear4bit(64, 32, compute_dtype=torch.float32).to("cpu")  # quantised on the move
    assert quantised.weight.numel() != 64 * 32 and mfu.matmul_weights(torch.nn.Sequential(quantised)) == 64 * 32
    assert mfu.flops_per_token(100, trains_adapter=True, with_reference=True) == 600  # DPO: the reference's pass


def test_the_trainer_writes_rate_mfu_eta_and_checkpoint_on_rank_0_only(tiny_model_dir, tmp_path, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    parameters = mfu.matmul_weights(model)
    clock = [100.0]
    monkeypatch.setattr(trainer_progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    path, args, control = tmp_path / "progress.json", TrainingArguments(str(tmp_path)), TrainerControl()
    callback = ProgressFile(path, peak_flops=1e12, trains_adapter=True, devices=2)
    state = TrainerState(max_steps=40, global_step=0, num_input_tokens_seen=0)
    callback.on_train_begin(args, state, control, model=model)
    assert TrainingProgress.read(path).step == 0 and TrainingProgress.read(path).eta_seconds is None

    clock[0] = 102.0  # within WRITE_SECONDS of the last write: the rank's log line, not the file
    state.global_step, state.num_input_tokens_seen, state.epoch = 1, 5_000, 0.025
    callback.on_log(args, state, control, logs={"loss": 2.6, "learning_rate": 1e-4})
    assert TrainingProgress.read(path).step == 0
    clock[0] = 120.0
    state.global_step, state.num_input_tokens_seen, state.epoch = 10, 50_000, 0.25
    callback.on_log(args, state, control, logs={"loss": 2.5, "learning_rate": 1e-4})
    written = TrainingProgress.read(path)
    assert (written.step, written.loss, written.learning_rate, written.elapsed_seconds) == (10, 2.5, 1e-4, 20.0)
    assert written.tokens_per_second == 2500.0 and written.eta_seconds == 60.0  # 30 steps at 2 s each
    assert written.mfu == pytest.approx(2500.0 * 4 * parameters / 2e12)

    clock[0] = 121.0
    callback.on_save(args, state, control)  # a checkpoint is written at once
    assert TrainingProgress.read(path).last_checkpoint == "checkpoint-10"
    clock[0] = 122.0
    state.global_step = 40
    callback.on_train_end(args, state, control)  # and the end
    assert TrainingProgress.read(path).finished and TrainingProgress.read(path).percent == 100.0

    resumed = ProgressFile(path, None, trains_adapter=True, devices=1, resumed_from="checkpoint-7")
    clock[0] = 500.0
    resumed.on_train_begin(args, TrainerState(max_steps=40, global_step=7), control, model=model)
    assert TrainingProgress.read(path).last_checkpoint == "checkpoint-7"  # an attempt resumed from it

    path.unlink()
    other_rank = TrainerState(max_steps=40)
    other_rank.is_world_process_zero = False
    callback.on_save(args, other_rank, control)
    assert not path.exists()


def test_the_rank_logs_the_line_the_step_prints(tmp_path, capsys):
    callback = ProgressFile(tmp_path / "progress.json", None, trains_adapter=True, devices=1)
    state = TrainerState(max_steps=1000, global_step=0, num_input_tokens_seen=0)
    callback.on_train_begin(TrainingArguments(str(tmp_path)), state, TrainerControl())
    state.global_step = 450
    callback.on_log(TrainingArguments(str(tmp_path)), state, TrainerControl(), logs={"loss": 1.5})
    assert capsys.readouterr().err.startswith("step 450/1000 (45.0%), epoch 0.00, 0 tokens, ")
