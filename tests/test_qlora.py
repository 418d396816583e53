"""QLoRA end to end on CPU: bitsandbytes' CPU backend runs the 4-bit NF4 layers forward and backward, so the path
a GPU run takes (4-bit base, LoRA on every linear layer, gradient checkpointing, compiled blocks, a kill and a
resume, the merge, the GGUF) runs here too.

The merge is the point QLoRA is easiest to get quietly wrong: merging the adapter into the dequantised 4-bit
weights bakes NF4's rounding into every layer. So the merged weights are compared with the base checkpoint's:
outside the adapted layers they must be the base's exactly, and inside them differ from it by the adapter's
low-rank product alone.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from fake_run import training_summary
from safetensors.torch import load_file
from test_trainer_run import finish, kill_rank_1_after_checkpoint_3, summary, torchrun, trainer_args

from common.errors import UserError
from gguf_export.convert import convert
from gguf_export.options import Thresholds
from gguf_export.verify import TransformersReference, verify
from trainer import preflight
from trainer.config import TrainConfig
from trainer.distributed import Topology

pytestmark = pytest.mark.slow

LORA_R = 8
STEPS = 16
# A random-initialised model's two best tokens are near ties at a few percent of positions (test_gguf_verify.py)
RANDOM_WEIGHTS = Thresholds(float_min_top1=0.97)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return {
        name: tensor.float()
        for path in sorted(directory.glob("*.safetensors"))
        for name, tensor in load_file(path).items()
    }


def test_qlora_trains_resumes_after_a_kill_merges_into_the_unquantised_base_and_exports(
    tiny_model_dir, prepared_data_dir, tmp_path
):
    output = tmp_path / "out"
    args = trainer_args(
        tiny_model_dir,
        prepared_data_dir,
        output,
        "--method",
        "qlora",
        "--lora-r",
        LORA_R,
        "--max-steps",
        STEPS,
        "--save-steps",
        "3",
        "--learning-rate",
        "2e-2",
        # the blocks compiled as on a GPU, by dynamo's eager backend: its 4-bit layers are traced into them
        "--compile-backend",
        "eager",
    )
    resume_point = kill_rank_1_after_checkpoint_3(args, output, tmp_path / "first.log")
    first_log = (tmp_path / "first.log").read_text()
    assert resume_point is not None and not (output / "training_summary.json").exists(), first_log[-3000:]
    assert "4-bit NF4 with double quantisation (bitsandbytes 0.50" in first_log and "computing in float32" in first_log
    assert "gradient checkpointing on for every block (auto for method qlora)" in first_log

    process = torchrun(args, log=tmp_path / "second.log")
    assert finish(process) == 0, (tmp_path / "second.log").read_text()[-3000:]
    result = summary(output)
    assert result["resumed_from"] == str(resume_point) and result["global_step"] == STEPS
    assert result["gradient_checkpointing"] is True and result["config"]["gradient_checkpointing"] == "auto"
    # bitsandbytes' CPU repacking of 4-bit weights in evaluation made a new graph of every block after the first
    # evaluation (trainer.train.keep_4bit_layout)
    assert result["compiled_blocks"] and result["speed_fallback"] is None
    assert result["compile"]["graphs_after_rehearsal"] == 0
    history = json.loads((output / "training_history.json").read_text())
    # the history carries on from the checkpoint's: every step once, in order
    assert [entry["step"] for entry in history if "loss" in entry] == list(range(1, STEPS + 1))
    losses = [entry["loss"] for entry in history if "loss" in entry]
    # the adapters learn: the tiny random model starts at ln(2048) = 7.62 and settles near 7.55, its steps' noise
    # about 0.02
    assert statistics.fmean(losses[-5:]) < statistics.fmean(losses[:3]) - 0.05, losses

    adapter = load_file(output / "adapter" / "adapter_model.safetensors")
    assert {tensor.dtype for tensor in adapter.values()} == {torch.float32}  # published at full precision
    base, merged = weights(tiny_model_dir), weights(output / "merged")
    assert set(merged) == set(base)
    adapted = [name for name in base if name.endswith("proj.weight")]
    assert adapted and len(adapted) < len(base)
    for name, tensor in base.items():
        difference = merged[name] - tensor
        if name in adapted:  # the adapter's B @ A: rank r at most, where NF4's rounding would be full rank
            assert 0 < torch.linalg.matrix_rank(difference) <= LORA_R, name
        else:
            assert torch.equal(difference, torch.zeros_like(difference)), name

    reference = TransformersReference(output / "merged", RANDOM_WEIGHTS.min_positions)
    gguf = convert(output / "merged", tmp_path / "merged.gguf", "f16", pre_tokenizer="smollm")  # SmolLM2's, cut
    report = verify(gguf.path, reference, "f16", RANDOM_WEIGHTS, gguf.tensor_shapes, gguf.architecture)
    assert report.passed, report.failures()


def test_qlora_without_bitsandbytes_is_refused_before_anything_loads(monkeypatch):
    """On CPU or GPU alike: the package, not a CUDA device, is what QLoRA needs."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == "bitsandbytes" else real_find_spec(name)
    )
    config, alone = TrainConfig(model="m", method="qlora"), Topology(rank=0, local_rank=0, world_size=1)
    with pytest.raises(UserError) as refused:
        preflight.check_config(config, alone)
    assert str(refused.value) == (
        "invalid training options: --method qlora needs the bitsandbytes package, and this process has no "
        "bitsandbytes; use --method lora (LoRA on the bf16 model)."
    )
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    preflight.check_config(config, alone)  # here, on a CPU, with bitsandbytes: accepted


def test_the_fit_checks_4_bit_bytes_are_what_bitsandbytes_stores(tiny_model_dir):
    """NF4_BYTES, the fit check's cost of a 4-bit weight, against the bytes of the layers the trainer loads: packed
    weights, 8-bit absmax per block of 64 and the fp32 scales of those (double quantisation)."""
    import bitsandbytes

    from components.train.fit import NF4_BYTES, ModelShape
    from trainer.train import load_model

    model = load_model(TrainConfig(model=str(tiny_model_dir), method="qlora"), tiny_model_dir, bf16=False)
    layers = [module for module in model.modules() if isinstance(module, bitsandbytes.nn.Linear4bit)]
    stored = sum(
        tensor.numel() * tensor.element_size()
        for layer in layers
        for tensor in (layer.weight, layer.weight.quant_state.absmax, layer.weight.quant_state.state2.absmax)
    )
    shape = ModelShape.from_config(json.loads((tiny_model_dir / "config.json").read_text()), "tiny")
    assert len(layers) == 7 * shape.layers  # every projection of every block, not the embeddings or the head
    assert stored == pytest.approx(NF4_BYTES * shape.linear_parameters, rel=0.01)


def test_the_evaluation_report_says_which_base_a_qlora_model_is_compared_with():
    from components.evaluate.report import training_facts

    facts = dict(training_facts(training_summary("HuggingFaceTB/SmolLM3-3B", config={"method": "qlora"})))
    assert facts["Method"] == "qlora" and facts["Base model"] == "HuggingFaceTB/SmolLM3-3B"
    assert facts["Base as evaluated"].startswith("the base model the adapter was trained against")
    assert "Base as evaluated" not in dict(training_facts(training_summary()))
