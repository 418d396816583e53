"""FSDP2 sharding as it runs in the pods: real torchrun on gloo with 2 and 4 ranks, a tiny Llama.

Each FSDP run is checked against a DDP run of the same configuration on the same data and seed: the
loss curves agree to 1e-3 (FSDP reduces gradients in a different order, so bit equality is not
expected; measured agreement is about 1e-4). The tiny model is randomly initialised, so loss is near
ln(vocab) and the learning rate is raised to make the curve move.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import TINY_PRE_TOKENIZER
from safetensors.torch import load_file
from test_trainer_run import finish, kill_rank_1_after_checkpoint_3, summary, torchrun, trainer_args
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from gguf_export.convert import convert
from gguf_export.verify import Thresholds, TransformersReference, verify
from trainer import checkpoints
from trainer.config import TrainConfig
from trainer.sharding import check_sharded, local_parameter_fraction

pytestmark = pytest.mark.slow

LOSS_TOLERANCE = 1e-3
STEPS = 8


def losses(output: Path) -> list[float]:
    history = json.loads((output / "training_history.json").read_text())
    return [entry["loss"] for entry in history if "loss" in entry]


def train(
    model: Path,
    data: Path,
    output: Path,
    log: Path,
    ranks: int,
    *extra: str,
    learning_rate: str = "1e-3",
    killed: bool = False,
) -> dict:
    """A run to the end; ``killed``: first lose rank 1 (SIGKILL) after checkpoint 3, then relaunch, which must resume
    from that sharded checkpoint."""
    args = trainer_args(model, data, output, "--max-steps", STEPS, "--learning-rate", learning_rate, *extra)
    args += ["--collective-timeout-minutes", "2"]
    if killed:
        resume_point = kill_rank_1_after_checkpoint_3(args, output, log.with_name(f"killed-{log.name}"))
        assert resume_point is not None and (resume_point / "pytorch_model_fsdp_0").is_dir()
    process = torchrun(args, log=log, ranks=ranks)
    assert finish(process) == 0, log.read_text()[-3000:]
    result = summary(output)
    assert result["resumed_from"] == (str(resume_point) if killed else None) and result["global_step"] == STEPS
    return result


# LoRA's low-rank updates move the random model's loss more slowly than full fine-tuning: a higher rate for them.
# QLoRA's 4-bit weights are sharded too: under fsdp they are packed into the compute dtype (2 ranks, to keep a shard of
# each of the tiny model's 4-bit weights whole). QLoRA checkpoints every block (gradient_checkpointing auto), the LoRA
# case every second one: with FSDP's own checkpointing the adapter in every checkpoint and in adapter/ came out empty.
# The full fine-tuning run loses a rank after its first checkpoint and is relaunched: a rank lost under FSDP costs the
# steps since the last complete sharded checkpoint, and the resumed run still learns what an uninterrupted DDP run does.
@pytest.mark.parametrize(
    ("method", "ranks", "learning_rate", "checkpointing", "killed"),
    [
        ("full", 2, "1e-3", (), True),
        ("lora", 4, "3e-3", ("--gradient-checkpointing", "true", "--checkpoint-every", "2"), False),
        ("qlora", 2, "3e-3", (), False),
    ],
)
def test_fsdp_shards_matches_ddp_and_leaves_a_merged_model_that_loads_and_converts(
    tiny_model_dir, prepared_data_dir, tmp_path, method, ranks, learning_rate, checkpointing, killed
):
    """The run is sharded (each rank holds ~1/ranks of the parameters, asserted per rank, not inferred from the
    settings), learns what DDP learns, and ``merged/`` is one consolidated checkpoint for the next stages."""
    sharded, replicated = tmp_path / "fsdp", tmp_path / "ddp"
    extra = ("--method", method, "--save-steps", "3", *checkpointing)
    result = train(
        *(tiny_model_dir, prepared_data_dir, sharded, tmp_path / "fsdp.log", ranks, *extra, "--sharding", "fsdp"),
        learning_rate=learning_rate,
        killed=killed,
    )
    reference = train(
        tiny_model_dir, prepared_data_dir, replicated, tmp_path / "ddp.log", ranks, *extra, learning_rate=learning_rate
    )

    assert result["sharding"] == "fsdp" and reference["sharding"] == "none"
    assert result["gradient_checkpointing"] is (method != "full") and reference["gradient_checkpointing"] is (
        method != "full"
    )
    fractions = [rank["local_parameter_fraction"] for rank in result["ranks"]]
    assert len(fractions) == ranks and all(abs(f - 1 / ranks) < 0.02 for f in fractions), fractions
    assert [rank["local_parameter_fraction"] for rank in reference["ranks"]] == [1.0] * ranks

    # the history carries on from a resumed checkpoint's: every step once, in order
    logged = json.loads((sharded / "training_history.json").read_text())
    assert [entry["step"] for entry in logged if "loss" in entry] == list(range(1, STEPS + 1))
    assert losses(sharded) == pytest.approx(losses(replicated), abs=LOSS_TOLERANCE)
    assert losses(sharded)[-1] < losses(sharded)[0] - 0.04  # it learned
    assert result["final_eval_loss"] == pytest.approx(reference["final_eval_loss"], abs=LOSS_TOLERANCE)

    # Every rank wrote its own shards of weights and optimizer state (torch.distributed.checkpoint files).
    checkpoint = sharded / "checkpoints" / "checkpoint-6"
    assert checkpoints.inspect(checkpoint, 6).complete
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(path.name for path in (checkpoint / part).glob("*.distcp")) == [
            f"__{rank}_0.distcp" for rank in range(ranks)
        ]

    merged = AutoModelForCausalLM.from_pretrained(sharded / "merged")
    expected = AutoModelForCausalLM.from_pretrained(replicated / "merged")
    for (name, weight), (_, reference_weight) in zip(merged.state_dict().items(), expected.state_dict().items()):
        assert (weight - reference_weight).abs().max() < 1e-3, name
    if method != "full":
        adapter = load_file(sharded / "adapter" / "adapter_model.safetensors")
        assert adapter.keys() == load_file(replicated / "adapter" / "adapter_model.safetensors").keys()
        # a PEFT run's sharded checkpoint holds the adapter only: all of it
        assert len(FileSystemReader(checkpoint / "pytorch_model_fsdp_0").read_metadata().state_dict_metadata) == len(
            adapter
        )

    gguf = tmp_path / "model.gguf"
    convert(sharded / "merged", gguf, "f32", pre_tokenizer=TINY_PRE_TOKENIZER)
    thresholds = Thresholds(float_min_top1=0.97)  # near-ties of a barely trained random model, see test_gguf_verify
    report = verify(gguf, TransformersReference(sharded / "merged", thresholds.min_positions), "f32", thresholds)
    assert report.passed, report.failures()


# Stands in for the library fall-back measured before the workaround: accelerate drops the FSDP plugin on a
# CPU-only job and the Trainer wraps the model in DDP (see trainer/sharding.py).
WITHOUT_CPU_WORKAROUND = """
import trainer.sharding
trainer.sharding.use_fsdp_on_cpu = lambda trainer: None
"""


def test_a_run_asked_for_fsdp_that_is_not_sharded_stops_before_training(tiny_model_dir, prepared_data_dir, tmp_path):
    """Never a silent fall-back: when FSDP is not applied, every rank holds the whole model and the run stops."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WITHOUT_CPU_WORKAROUND)
    output, log = tmp_path / "out", tmp_path / "log"
    args = trainer_args(tiny_model_dir, prepared_data_dir, output, "--sharding", "fsdp", "--max-steps", "4")
    process = torchrun(args, env={"PYTHONPATH": f"{hooks}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}, log=log)
    assert finish(process) != 0
    text = " ".join(log.read_text().split())
    assert "--sharding fsdp was asked for, but the model is not sharded (rank 0: 100%, rank 1: 100%" in text
    assert "step 1/" not in text and not (output / "merged").exists()


def test_local_parameter_fraction_and_the_check():
    from torch import nn

    assert local_parameter_fraction(nn.Linear(4, 4)) == 1.0
    check_sharded(TrainConfig(sharding="none"), [1.0, 1.0])  # DDP holds everything, as it should
    check_sharded(TrainConfig(sharding="fsdp"), [0.5, 0.5])
    with pytest.raises(Exception, match="not sharded"):
        check_sharded(TrainConfig(sharding="fsdp"), [0.5, 1.0])


@pytest.mark.parametrize(
    ("option", "message", "fix"),
    [
        (
            ("--attention", "flash_attention_2"),
            "--attention flash_attention_2 needs a CUDA GPU and the flash_attn",
            "use --attention auto",
        ),
        (
            ("--liger-kernels",),
            "--liger-kernels needs a CUDA GPU and the liger_kernel package",
            "leave it out or pass --no-liger-kernels",
        ),
    ],
)
def test_gpu_kernels_are_refused_where_they_cannot_run(
    tiny_model_dir, prepared_data_dir, tmp_path, option, message, fix
):
    """On this CPU machine the fast GPU kernels cannot run: the trainer says so at start instead of using others."""
    from conftest import run_module

    result = run_module("trainer", *trainer_args(tiny_model_dir, prepared_data_dir, tmp_path / "out", *option))
    stderr = " ".join(result.stderr.split())
    assert result.returncode == 2 and message in stderr and "no CUDA device" in stderr and fix in stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()
