"""Options that change how a step is computed, not what it computes: gradient checkpointing,
and packing's token count."""

from __future__ import annotations

import dataclasses
import json
import math

import pyarrow.parquet as pq
import pytest
import torch
from conftest import tokenised
from todays_path import tokenise_split
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer import data
from trainer.compiled import blocks
from trainer.config import TrainConfig
from trainer.diagnostics import ShardRecorder
from trainer.distributed import Topology
from trainer.objectives.sft import SFT, SFTRunTrainer, sft_arguments
from trainer.train import load_model, lora_config, trained_weights_dtype, write_adapter

SINGLE = Topology(rank=0, local_rank=0, world_size=1)


def train_steps(tiny_model_dir, prepared_data_dir, output_dir, **options) -> SFTRunTrainer:
    """Three LoRA steps (unless ``options`` say otherwise) on the tiny model with the trainer's own SFT and LoRA
    settings."""
    settings = {
        **dict(max_length=128, per_device_batch_size=2, max_steps=3, logging_steps=1, learning_rate=1e-2),
        **options,
    }
    tokens = tokenised(
        tiny_model_dir, prepared_data_dir, max_length=settings["max_length"], packing=settings.get("packing", True)
    )
    config = TrainConfig(model=str(tiny_model_dir), tokens_dir=tokens, output_dir=output_dir, **settings)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    _, train_rows, _ = data.token_rows(config, tiny_model_dir, tokenizer)
    args = sft_arguments(config, SINGLE, has_eval=False)
    args.report_to = []
    torch.manual_seed(0)
    trainer = SFTRunTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=args,
        train_dataset=train_rows,
        processing_class=tokenizer,
        peft_config=lora_config(config),
        shards=ShardRecorder(SFT.example_tokens),
    )
    trainer.train()
    return trainer


@pytest.mark.slow
def test_gradient_checkpointing_changes_memory_not_the_maths(tiny_model_dir, prepared_data_dir, tmp_path):
    """With --gradient-checkpointing the model recomputes activations, and training follows the very same losses;
    with --checkpoint-every 2 only every second block does (the tiny model's block 0 of its two).

    TRL's own SFTConfig turns checkpointing on unless told otherwise, so the default
    run must really have it off (it costs about a fifth of the step time).
    """
    plain = train_steps(tiny_model_dir, prepared_data_dir, tmp_path / "plain")
    checkpointed = train_steps(
        tiny_model_dir, prepared_data_dir, tmp_path / "checkpointed", gradient_checkpointing="true"
    )
    selective = train_steps(
        tiny_model_dir, prepared_data_dir, tmp_path / "selective", gradient_checkpointing="true", checkpoint_every=2
    )

    assert not plain.model.base_model.model.is_activation_checkpointing
    assert checkpointed.model.base_model.model.is_activation_checkpointing
    recomputing = {run: [block.gradient_checkpointing for block in blocks(run.model)] for run in (plain, checkpointed)}
    assert recomputing == {plain: [False, False], checkpointed: [True, True]}
    assert [block.gradient_checkpointing for block in blocks(selective.model)] == [True, False]
    runs = (plain, checkpointed, selective)
    losses = [[entry["loss"] for entry in run.state.log_history if "loss" in entry] for run in runs]
    assert len(losses[0]) == 3 and all(math.isfinite(loss) for loss in losses[0])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4) and losses[2] == pytest.approx(losses[0], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_tokens_seen_counts_every_real_token_once(packing, tiny_model_dir, prepared_data_dir, tmp_path):
    """tokens_seen (and so the tokens/s in the summary and the benchmark) is exactly the conversations' length.

    SmolLM2's pad token is <|im_end|>, which also ends every turn: counting
    "input_ids != pad" on padding-free batches (no attention mask) would drop
    three real tokens per conversation; counting padded batches whole would add
    the padding.
    """
    subset = tmp_path / "data"
    subset.mkdir()
    pq.write_table(pq.read_table(prepared_data_dir / "train.parquet").slice(0, 6), subset / "train.parquet")
    pq.write_table(pq.read_table(prepared_data_dir / "eval.parquet"), subset / "eval.parquet")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = sum(
        len(ids) for ids in tokenise_split(data.load_split(subset, "train"), tokenizer, "assistant")["input_ids"]
    )

    trained = train_steps(
        tiny_model_dir,
        subset,
        tmp_path / "out",
        packing=packing,
        max_length=512,
        per_device_batch_size=3,
        max_steps=-1,
        epochs=1,
    )

    assert trained.state.num_input_tokens_seen == expected


@pytest.mark.parametrize(("method", "held_in"), [("full", torch.float32), ("lora", torch.bfloat16)])
def test_bf16_training_keeps_full_fine_tuning_weights_in_fp32(method, held_in, tiny_model_dir, tmp_path):
    """Under bf16 compute, a full fine-tune's weights (and so AdamW's state) stay fp32 master weights; LoRA's frozen
    base is held in bf16 while PEFT keeps the adapters it trains in fp32, which the summary then reports."""
    config = TrainConfig(model=str(tiny_model_dir), output_dir=tmp_path, method=method)
    model = load_model(config, tiny_model_dir, bf16=True)
    assert {parameter.dtype for parameter in model.parameters()} == {held_in}
    if method == "lora":
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(config))
    assert trained_weights_dtype(model) == "float32"


def test_an_adapter_peft_cannot_find_is_refused_not_written_empty(tiny_model_dir, tmp_path):
    """FSDP's own activation checkpointing wrapped each block in a CheckpointWrapper: PEFT matched none of the gathered
    weights' names to the wrapped modules and wrote an empty adapter/, so merged/ was the untrained base. The writer
    now counts what it wrote against the LoRA tensors the model holds."""
    from peft import get_peft_model
    from safetensors.torch import load_file
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    config = TrainConfig(model=str(tiny_model_dir), output_dir=tmp_path, method="lora")
    model = get_peft_model(load_model(config, tiny_model_dir, bf16=False), lora_config(config))
    write_adapter(model, config)
    assert len(load_file(config.adapter_dir / "adapter_model.safetensors")) == 2 * 7 * len(blocks(model))

    layers = model.base_model.model.model.layers
    for index, block in enumerate(layers):
        layers[index] = checkpoint_wrapper(block)
    gathered = {name.replace("_checkpoint_wrapped_module.", ""): tensor for name, tensor in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="adapter/ would hold 0 LoRA tensors but the model trained 28"):
        write_adapter(model, config, gathered)
    assert len(load_file(config.adapter_dir / "adapter_model.safetensors")) == 28  # the earlier adapter/ is kept

    # an adapted embedding also writes the base embedding's weight (PEFT's save_embedding_layers): not a shortfall
    embedding = dataclasses.replace(
        config, output_dir=tmp_path / "embedding", lora_target_modules="q_proj,embed_tokens"
    )
    write_adapter(get_peft_model(load_model(embedding, tiny_model_dir, bf16=False), lora_config(embedding)), embedding)
    written = load_file(embedding.adapter_dir / "adapter_model.safetensors")
    assert sum(".lora_" in name for name in written) == 2 * (len(blocks(model)) + 1) < len(written)


@pytest.mark.slow
def test_each_checkpoint_holds_the_tokens_trained_up_to_it(tiny_model_dir, prepared_data_dir, tmp_path):
    """A resumed run continues from the checkpoint's token count, so it must be exact at every save, not the count
    of the last logged step (here only step 1 and the end are logged)."""
    trained = train_steps(
        tiny_model_dir, prepared_data_dir, tmp_path / "out", logging_steps=10, save_steps=1, save_total_limit=3
    )
    saved = [
        json.loads((tmp_path / "out" / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())
        for step in (1, 2, 3)
    ]
    counts = [state["num_input_tokens_seen"] for state in saved]
    assert 0 < counts[0] < counts[1] < counts[2] == trained.state.num_input_tokens_seen
