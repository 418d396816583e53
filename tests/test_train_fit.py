"""The fit check: per-GPU memory estimated from config.json before any pod is asked for.

The configs under ``model_configs/`` are the public config.json files of Meta-Llama-3-8B,
Llama-3.2-1B and SmolLM3-3B, copied as data. The parameter counts below are the models'
published sizes, to the parameter, which pins the sizing of every weight matrix.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import run_module

from common.errors import UserError
from components.train.fit import GIB, GPU_OVERHEAD_BYTES, NF4_BYTES, ModelShape, check_fit, estimate
from pipelines.training_job import render
from trainer.config import TrainConfig

pytestmark = pytest.mark.usefixtures("no_hub")

CONFIGS = Path(__file__).parent / "model_configs"


@pytest.fixture
def model_dir(tmp_path):
    """A base model directory holding only the named model's config.json, as the fit check needs."""

    def make(name: str) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        shutil.copy(CONFIGS / f"{name}.json", directory / "config.json")
        return directory

    return make


def shape(name: str) -> ModelShape:
    return ModelShape.from_config(yaml.safe_load((CONFIGS / f"{name}.json").read_text()), name)


def test_parameter_counts_are_the_published_ones():
    assert shape("Meta-Llama-3-8B").parameters == 8_030_261_248
    assert shape("Llama-3.2-1B").parameters == 1_235_814_400
    assert shape("SmolLM3-3B").parameters == 3_075_098_624


def train_config(model: Path, **settings) -> TrainConfig:
    return TrainConfig(model=str(model), tokens_dir=Path("d"), output_dir=Path("o"), **settings)


def test_seed_003_llama_3_8b_full_on_2x8_80gb_needs_fsdp(model_dir):
    """Seed 003: a full fine-tune of Llama-3-8B on 2 nodes x 8 80 GB GPUs. Replicated (DDP) every GPU would hold the
    fp32 weights, gradients and AdamW state of 8B parameters, ~16 bytes each: refused before any pod, naming fsdp.
    Sharded over 16 GPUs it fits."""
    model = model_dir("Meta-Llama-3-8B")
    with pytest.raises(UserError) as refused:
        check_fit(train_config(model, method="full"), nodes=2, gpus_per_node=8, gpu_memory="80Gi")
    message = str(refused.value)
    assert "The job does not fit" in message and "gpu_memory is 80Gi" in message
    assert "Any one of these would fit: sharding fsdp; method lora" in message
    assert "The job was not created" in message

    lines = check_fit(train_config(model, method="full", sharding="fsdp"), nodes=2, gpus_per_node=8, gpu_memory="80Gi")
    assert lines[0].startswith("fit check: 8.03B parameters") and "sharding fsdp, 2 x 8 GPUs" in lines[0]
    assert "sharded over 16 processes" in lines[1] and lines[-1].startswith("  fits gpu_memory 80Gi")


def test_seed_000_smollm3_3b_lora_on_4x1_48gb_fits(model_dir):
    """Seed 000: LoRA of SmolLM3-3B on 4 single-L40S (48 GB) pods, the pipeline's defaults otherwise."""
    lines = check_fit(train_config(model_dir("SmolLM3-3B")), nodes=4, gpus_per_node=1, gpu_memory="48Gi")
    assert lines[-1].startswith("  fits gpu_memory 48Gi")


def test_a_job_that_fits_nowhere_as_asked_names_more_nodes(model_dir):
    """Llama-3.2-1B fully fine-tuned on one 20 GiB GPU (an A100 MIG 2g.20gb slice): its fp32 weights, gradients and
    AdamW state alone take 16 bytes x 1.24B = 18.4 GiB. LoRA would fit, and so would FSDP over two such nodes;
    gradient checkpointing would not, since the gradients, not the activations, set the peak."""
    with pytest.raises(UserError) as refused:
        check_fit(train_config(model_dir("Llama-3.2-1B"), method="full"), nodes=1, gpus_per_node=1, gpu_memory="20Gi")
    assert "Any one of these would fit: method lora; sharding fsdp with training_nodes 2." in str(refused.value)


def test_the_parts_follow_the_formula():
    """The README's formula, term by term, for Llama-3-8B full fine-tuning under FSDP over 16 GPUs."""
    llama = shape("Meta-Llama-3-8B")
    config = train_config(Path("m"), method="full", sharding="fsdp", max_length=1024)
    parts = estimate(llama, config, processes=16, on_gpu=True).parts
    parameters = 8_030_261_248
    assert parts["weights"] == 4 * parameters // 16
    assert parts["gradients"] == 4 * parameters // 16 and parts["optimizer"] == 8 * parameters // 16
    assert parts["gathered"] == 2 * 2 * 128256 * 4096  # the untied embedding is the largest FSDP unit
    assert parts["activations"] == 1024 * 32 * (2 * 4096 * 4 + 2 * (5 * 4096 + 3 * 1024 + 4 * 14336))
    assert parts["logits"] == 1024 * 128256 * 10
    checkpointed = estimate(llama, train_config(Path("m"), method="full", gradient_checkpointing="true"), 16, True)
    assert checkpointed.parts["activations"] < parts["activations"] / 8
    assert "bf16 copies" in checkpointed.parts and "ddp buckets" in checkpointed.parts  # DDP's own extras


def test_dpo_counts_both_answers_and_full_fine_tunings_reference_copy():
    """Objective dpo: twice the sequences' activations and logits; full fine-tuning's frozen fp32 reference, sharded
    under FSDP and replicated under DDP; none for LoRA, whose reference is the base with the adapter off."""
    llama = shape("Meta-Llama-3-8B")
    parameters = 8_030_261_248
    sft = train_config(Path("m"), method="full", sharding="fsdp", max_length=1024)
    dpo = replace(sft, objective="dpo")
    sft_parts, dpo_parts = estimate(llama, sft, 16, True).parts, estimate(llama, dpo, 16, True).parts
    assert sft_parts["reference"] == 0 and dpo_parts["reference"] == 4 * parameters // 16
    assert dpo_parts["activations"] == 2 * sft_parts["activations"] and dpo_parts["logits"] == 2 * sft_parts["logits"]
    assert {name: size for name, size in dpo_parts.items() if name not in ("reference", "activations", "logits")} == {
        name: size for name, size in sft_parts.items() if name not in ("reference", "activations", "logits")
    }
    replicated = estimate(llama, replace(dpo, sharding="none"), 16, True).parts
    assert replicated["reference"] == 4 * parameters
    lora = estimate(llama, replace(dpo, method="lora"), 16, True).parts
    assert lora["reference"] == 0
    lines = "\n".join(estimate(llama, dpo, 16, True).lines())
    assert "reference" in lines


def test_qlora_holds_the_blocks_linear_weights_in_4_bit_and_the_rest_of_the_base_in_bf16():
    llama = shape("Meta-Llama-3-8B")
    config = train_config(Path("m"), method="qlora", max_length=1024)
    parts = estimate(llama, config, processes=1, on_gpu=True).parts
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # q, o; k, v; gate, up, down
    trainable = llama.lora_parameters(config.lora_r)
    assert llama.linear_parameters == linear
    assert parts["4-bit base"] == int(NF4_BYTES * linear) and NF4_BYTES == pytest.approx(0.5159, abs=1e-4)
    assert parts["weights"] == 4 * trainable + 2 * (8_030_261_248 - linear)  # embeddings, head and norms in bf16
    lora = estimate(llama, replace(config, method="lora"), processes=1, on_gpu=True).parts
    assert parts["4-bit base"] + parts["weights"] < (lora["weights"]) * 0.37  # 5.4 GiB against 15.0


def test_llama_3_8b_lora_on_one_24_gb_gpu_is_told_that_qlora_fits(model_dir):
    """LoRA of Llama-3-8B with checkpointing on 4,096-token rows needs about 25.8 GiB, its bf16 base 15 GiB of
    that: with gpu_memory 24Gi only QLoRA's 4-bit base, or FSDP over two nodes, fits."""
    model = model_dir("Meta-Llama-3-8B")
    settings = {"gradient_checkpointing": "true", "max_length": 4096}
    for method in ("lora", "full"):
        with pytest.raises(UserError) as refused:
            check_fit(train_config(model, method=method, **settings), nodes=1, gpus_per_node=1, gpu_memory="24Gi")
        assert "Any one of these would fit: method qlora (LoRA on the base held in 4-bit); " in str(refused.value)
    lines = check_fit(train_config(model, method="qlora", **settings), nodes=1, gpus_per_node=1, gpu_memory="24Gi")
    assert ", qlora, " in lines[0] and any(line.startswith("  4-bit base      3.4 GiB") for line in lines)
    assert lines[-1].startswith("  fits gpu_memory 24Gi")


def test_qlora_checkpoints_by_default_and_a_lora_job_is_told_so(model_dir):
    """gradient_checkpointing auto is on for qlora only: Llama-3-8B LoRA on 8,192-token rows on one 24 GiB GPU, on
    the defaults (no checkpointing), is told that qlora fits, with the checkpointing that method brings; the qlora
    job's first line says checkpointing is on and why, and qlora without it would not fit."""
    model = model_dir("Meta-Llama-3-8B")
    with pytest.raises(UserError) as refused:
        check_fit(train_config(model, max_length=8192), nodes=1, gpus_per_node=1, gpu_memory="24Gi")
    assert "method qlora (LoRA on the base held in 4-bit, gradient checkpointing on)" in str(refused.value)
    lines = check_fit(train_config(model, method="qlora", max_length=8192), nodes=1, gpus_per_node=1, gpu_memory="24Gi")
    assert "gradient checkpointing on for every block (auto for method qlora)" in lines[0]
    assert lines[-1].startswith("  fits gpu_memory 24Gi")
    unchecked = train_config(model, method="qlora", max_length=8192, gradient_checkpointing="false")
    with pytest.raises(UserError) as refused:
        check_fit(unchecked, nodes=1, gpus_per_node=1, gpu_memory="24Gi")
    assert "gradient_checkpointing true" in str(refused.value)


def test_sharded_qlora_counts_the_whole_4_bit_base_every_rank_loads_first(model_dir):
    """accelerate loads a quantised base on every rank and FSDP shards it only then: Llama-3-8B QLoRA over 8 GPUs
    trains in about 5.5 GiB each, but each first holds its 4-bit blocks and bf16 embeddings, 0.5159 x 6.98B + 2 x
    1.05B bytes (5.3 GiB) with the overhead, 7.5 GiB in all. That, not training, decides a 6 GiB GPU."""
    model = model_dir("Meta-Llama-3-8B")
    config = train_config(model, method="qlora", sharding="fsdp", max_length=512)
    llama = shape("Meta-Llama-3-8B")
    sharded = estimate(llama, config, processes=8, on_gpu=True)
    whole_base = NF4_BYTES * llama.linear_parameters + 2 * (llama.parameters - llama.linear_parameters)
    assert sharded.load_peak == int((int(whole_base) + GPU_OVERHEAD_BYTES) * 1.1) > sharded.training_peak
    assert sharded.total == sharded.load_peak and f"{sharded.load_peak / GIB:.1f}" == "7.5"
    assert f"{sharded.training_peak / GIB:.1f}" == "5.5"
    with pytest.raises(UserError) as refused:
        check_fit(config, nodes=1, gpus_per_node=8, gpu_memory="6Gi")
    assert "at load         7.5 GiB  (every rank loads the whole 4-bit base before FSDP shards it: the peak)" in str(
        refused.value
    )
    assert check_fit(config, nodes=1, gpus_per_node=8, gpu_memory="8Gi")[-1].startswith("  fits gpu_memory 8Gi")
    # one process, or DDP, loads the base as it trains it: no second peak
    assert estimate(llama, replace(config, sharding="none"), processes=8, on_gpu=True).load_peak == 0


def test_checkpointing_every_nth_block_keeps_the_others_activations_whole():
    """Llama-3-8B's 32 blocks checkpointed every 3rd: blocks 0, 3, ..., 30 (11) keep their input, the 21 others
    keep everything, plus one block being recomputed; every 1 is plain checkpointing."""
    llama = shape("Meta-Llama-3-8B")
    h, per_layer = 4096, 2 * 4096 * 4 + 2 * (5 * 4096 + 3 * 1024 + 4 * 14336)
    config = train_config(Path("m"), method="full", gradient_checkpointing="true", max_length=1024)
    every_third = estimate(llama, replace(config, checkpoint_every=3), 1, True).parts["activations"]
    assert every_third == 1024 * (11 * h * 4 + 21 * per_layer + per_layer)
    every_one = estimate(llama, config, 1, True).parts["activations"]
    assert every_one == 1024 * (32 * h * 4 + per_layer)
    assert estimate(llama, replace(config, checkpoint_every=32), 1, True).parts["activations"] == 1024 * (
        h * 4 + 32 * per_layer
    )


def test_a_fitting_job_is_told_the_least_checkpointing_and_largest_micro_batch_that_also_fit(model_dir):
    """SmolLM3-3B full fine-tuning with checkpointing, 8k-token rows, on one 80 GiB GPU fits with room to spare (an
    estimated 60 GiB): the check names the largest checkpoint_every and per_device_batch_size that still fit, each
    checked here against the estimate."""
    config = train_config(model_dir("SmolLM3-3B"), method="full", gradient_checkpointing="true", max_length=8192)
    lines = check_fit(config, nodes=1, gpus_per_node=1, gpu_memory="80Gi")
    assert "1 x 8192 = 8,192 tokens per micro-batch" in lines[0]
    assert "faster settings that also fit: checkpoint_every " in lines[-1]
    every = int(lines[-1].split("checkpoint_every ")[1].split(";")[0])
    batch = int(lines[-1].split("per_device_batch_size ")[1].split(" ")[0])
    smollm3, budget = shape("SmolLM3-3B"), 80 * GIB
    assert estimate(smollm3, replace(config, checkpoint_every=every), 1, True).total <= budget
    assert estimate(smollm3, replace(config, checkpoint_every=every + 1), 1, True).total > budget
    assert estimate(smollm3, replace(config, per_device_batch_size=batch), 1, True).total <= budget
    assert estimate(smollm3, replace(config, per_device_batch_size=batch + 1), 1, True).total > budget


def test_on_gpus_the_gradients_and_the_forward_pass_memory_are_not_counted_together():
    """The caching allocator reuses what the backward pass frees for the gradients it makes, so the GPU peak is the
    held state plus the larger of the two (an H100 run of SmolLM3-3B, full with checkpointing, 1 x 4096: 46.9 GiB
    allocated, estimated 52.9 GiB with the CUDA overhead and fragmentation; the sum would say 65.5). On CPU the
    resident peak is the sum (benchmarks/fit_bench.py). Liger's fused cross-entropy holds no logits."""
    smollm3 = shape("SmolLM3-3B")
    config = train_config(Path("m"), method="full", gradient_checkpointing="true", max_length=4096)
    on_gpu = estimate(smollm3, config, processes=1, on_gpu=True)
    parts = on_gpu.parts
    forward = parts["bf16 copies"] + parts["activations"] + parts["logits"]
    held = parts["weights"] + parts["optimizer"] + parts["overhead"]
    assert on_gpu.total == int((held + max(parts["gradients"], forward)) * 1.1)
    assert round(on_gpu.total / GIB, 1) == 52.9
    assert any("not held at once" in line for line in on_gpu.lines())
    on_cpu = estimate(smollm3, config, processes=1, on_gpu=False)
    assert on_cpu.total == sum(on_cpu.parts.values())
    with_liger = estimate(smollm3, replace(config, liger_kernels=True), processes=1, on_gpu=True)
    assert with_liger.parts["logits"] == 0 and with_liger.total < on_gpu.total


def test_without_gpu_memory_the_estimate_is_printed_only(model_dir):
    lines = check_fit(train_config(model_dir("Meta-Llama-3-8B"), method="full"), 2, 8, "")
    assert any("gpu_memory is empty" in line for line in lines)
    total = float(lines[1].split(": ")[1].split(" GiB")[0])
    assert total * GIB > 80 * GIB  # would not fit, but nobody said how large the GPUs are


def test_an_unreadable_config_skips_the_estimate_unless_the_check_was_asked_for(tmp_path):
    offline = train_config(Path("meta-llama/Meta-Llama-3-8B"))  # HF_HUB_OFFLINE=1 in the tests: no Hub
    (line,) = check_fit(offline, 2, 8, "")
    assert line.startswith("fit check skipped: could not download config.json of meta-llama/Meta-Llama-3-8B")
    with pytest.raises(UserError, match="gpu_memory is 80Gi, so the train step checks .* leave gpu_memory empty"):
        check_fit(offline, 2, 8, "80Gi")
    assert check_fit(offline, 2, 0, "80Gi") == [
        "fit check: the job trains on CPU (gpus_per_node 0); no GPU memory to check"
    ]


def test_render_prints_the_estimate_and_refuses_what_cannot_fit(model_dir):
    model = model_dir("Meta-Llama-3-8B")
    pairs = [f"base_model={model}", "method=full", "publish_merged=true", "training_nodes=2", "gpus_per_node=8"]
    pairs.append("gpu_memory=80Gi")
    with pytest.raises(UserError, match="Any one of these would fit: sharding fsdp"):
        render(pairs, namespace="ml", run_id="r", image="i")
    text = render([*pairs, "sharding=fsdp"], namespace="ml", run_id="r", image="i")
    comments = [line for line in text.splitlines() if line.startswith("# ")]
    assert any(line.startswith("# fit check: 8.03B parameters") for line in comments)
    assert any(line.startswith("#   fits gpu_memory 80Gi") for line in comments)
    assert yaml.safe_load(text)["kind"] == "PyTorchJob"


def test_render_command_exits_2_with_the_estimate_and_the_fixes(model_dir, tmp_path):
    model = model_dir("Meta-Llama-3-8B")
    result = run_module(
        "pipelines.training_job",
        "render",
        *("--param", f"base_model={model}", "--param", "method=full", "--param", "publish_merged=true"),
        *("--param", "training_nodes=2"),
        *("--param", "gpus_per_node=8", "--param", "gpu_memory=80Gi"),
        env={"KUBECONFIG": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: fit check: 8.03B parameters") and "Traceback" not in result.stderr


def test_the_workspace_space_is_estimated_and_a_too_small_pvc_is_warned_about(model_dir):
    """Two full fine-tuning checkpoints of Llama-3-8B (fp32 weights and AdamW moments, 12 bytes per parameter each)
    plus the bf16 merged model and base download are ~210 GiB: more than a 100Gi workspace, said before training.
    A LoRA run of SmolLM3-3B needs a fraction of that."""
    full = train_config(model_dir("Meta-Llama-3-8B"), method="full", sharding="fsdp")
    lines = check_fit(full, 2, 8, "", pvc_size="100Gi")
    (space,) = [line for line in lines if line.startswith("workspace space for training: ")]
    assert "checkpoints 179.5 GiB" in space and "merged 15.0 GiB" in space and "2 checkpoints kept" in space
    assert any(line.startswith("WARNING: that is more than pvc_size 100Gi") for line in lines)
    lora = check_fit(train_config(model_dir("SmolLM3-3B")), 4, 1, "", pvc_size="100Gi")
    assert not any(line.startswith("WARNING") for line in lora)


def test_under_fsdp_the_advice_names_selective_checkpointing_too(model_dir):
    """Under FSDP the blocks are checkpointed by transformers, as under DDP, so checkpoint_every applies there too:
    SmolLM3-3B full fine-tuning over 2 GPUs of 64 GiB on 8,192-token rows fits checkpointing 1 block in 4, which
    both the advice for the job that checkpoints every block and the fixes for the one that checkpoints none name."""
    model = model_dir("SmolLM3-3B")
    config = train_config(model, method="full", sharding="fsdp", gradient_checkpointing="true", max_length=8192)
    lines = check_fit(config, nodes=1, gpus_per_node=2, gpu_memory="64Gi")
    assert "faster settings that also fit: checkpoint_every 4; " in lines[-1]
    with pytest.raises(UserError) as refused:
        check_fit(replace(config, gradient_checkpointing="false"), nodes=1, gpus_per_node=2, gpu_memory="64Gi")
    assert "Any one of these would fit: gradient_checkpointing true, checkpoint_every 4; " in str(refused.value)
