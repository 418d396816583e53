"""``to_args`` is the exact inverse of ``parse_config``: what the launcher writes into a job is what
the trainer runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer.config import TrainConfig, option_problems, parse_config, to_args

REQUIRED = dict(
    model="HuggingFaceTB/SmolLM3-3B",
    tokens_dir=Path("/mnt/workspace/token-cache/0123abcd"),
    output_dir=Path("/mnt/workspace/runs/r1/train"),
)


def test_defaults_round_trip():
    config = TrainConfig(**REQUIRED)
    assert parse_config(to_args(config)) == config


def test_every_field_changed_round_trips():
    """Each field set away from its default (bools flipped, awkward floats) comes back identical."""
    changed = TrainConfig(
        **REQUIRED,
        method="full",
        objective="dpo",
        dpo_beta=0.3,
        dpo_loss="ipo",
        sharding="fsdp",
        attention="eager",
        liger_kernels=True,
        compile_blocks=False,
        strict_compile=True,
        compile_backend="aot_eager",
        lora_r=8,
        lora_alpha=7,
        lora_dropout=0.1,
        lora_cast_inputs=True,
        lora_target_modules="q_proj,v_proj",
        epochs=0.3,
        max_steps=17,
        learning_rate=1.0000000000000002e-05,
        scale_lr=True,
        warmup_ratio=1 / 3,
        weight_decay=0.01,
        per_device_batch_size=3,
        gradient_accumulation_steps=8,
        max_length=333,
        packing=False,
        loss_on="all",
        mixed_precision=False,
        gradient_checkpointing="true",
        checkpoint_every=2,
        save_steps=9,
        save_total_limit=3,
        logging_steps=2,
        eval_steps=4,
        seed=7,
        base_model_revision="v1.0",
        collective_timeout_minutes=2.5,
        mlflow_tracking_uri="https://mlflow.example/mlflow",
        mlflow_experiment="team-runs",
        require_cuda=True,
        expected_world_size=8,
    )
    defaults = TrainConfig(**REQUIRED)
    unchanged = [
        spec.name
        for spec in dataclasses.fields(TrainConfig)
        if spec.name not in REQUIRED and getattr(changed, spec.name) == getattr(defaults, spec.name)
    ]
    assert unchanged == [], "the test must move every option away from its default"
    assert parse_config(to_args(changed)) == changed


def test_arguments_are_flags_and_values():
    args = to_args(TrainConfig(**REQUIRED, packing=False, scale_lr=True))
    assert "--no-packing" in args and "--scale-lr" in args
    assert args[args.index("--model") + 1] == "HuggingFaceTB/SmolLM3-3B"
    assert args[args.index("--learning-rate") + 1] == "0.0"  # the method's usual rate, resolved in the trainer


@pytest.mark.parametrize(
    ("method", "learning_rate", "peak"),
    [("lora", 0.0, 2e-4), ("qlora", 0.0, 2e-4), ("full", 0.0, 2e-5), ("full", 1e-4, 1e-4), ("lora", 5e-5, 5e-5)],
)
def test_the_learning_rate_defaults_to_the_methods_usual_one(method, learning_rate, peak):
    """A full fine-tune at LoRA's 2e-4 would overwrite what the model knew: 0 picks the method's usual rate, and
    a rate given is used as given."""
    from trainer.config import peak_learning_rate

    assert peak_learning_rate(TrainConfig(**REQUIRED, method=method, learning_rate=learning_rate)) == peak


@pytest.mark.parametrize(
    ("method", "asked", "recomputes"),
    [("qlora", "auto", True), ("lora", "auto", False), ("full", "auto", False), ("qlora", "false", False)]
    + [("lora", "true", True), ("full", "true", True)],
)
def test_gradient_checkpointing_auto_is_on_for_qlora_only(method, asked, recomputes):
    """QLoRA is chosen to save memory and its recipes all checkpoint; an explicit true or false is used as given."""
    config = TrainConfig(**REQUIRED, method=method, gradient_checkpointing=asked)
    assert config.recomputes_activations is recomputes
    assert parse_config(to_args(config)) == config


def test_gradient_checkpointing_takes_auto_true_or_false_only(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--model", "m", "--tokens-dir", "t", "--output-dir", "o", "--gradient-checkpointing", "yes"])
    assert "--gradient-checkpointing: invalid choice: 'yes'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(lora_r=0), "lora_r"),
        (dict(epochs=0), "epochs"),
        (dict(learning_rate=-1.0), "learning_rate"),
        (dict(lora_dropout=1.0), "lora_dropout"),
        (dict(save_total_limit=1), "save_total_limit"),
        (dict(method="dora"), "method"),
        (dict(checkpoint_every=0), "checkpoint_every"),
        (dict(gradient_checkpointing="on"), "gradient_checkpointing"),
        (dict(attention="flash"), "attention"),
    ],
)
def test_option_problems_name_the_field(change, field):
    assert list(option_problems(TrainConfig(**REQUIRED, **change))) == [field]


def test_defaults_have_no_problems():
    assert option_problems(TrainConfig(**REQUIRED)) == {}
    assert option_problems(TrainConfig(**REQUIRED, epochs=0, max_steps=10)) == {}
    # transformers checkpoints the blocks under FSDP too, so selective checkpointing applies there
    assert (
        option_problems(TrainConfig(**REQUIRED, sharding="fsdp", gradient_checkpointing="true", checkpoint_every=2))
        == {}
    )


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        (None, "fp32"),  # CPU
        ((6, 0), "fp16"),  # P100
        ((7, 0), "fp16"),  # V100: torch.cuda.is_bf16_supported() says True, but bf16 is emulated there
        ((7, 5), "fp16"),  # T4: likewise
        ((8, 0), "bf16"),  # A100
        ((8, 9), "bf16"),  # L4, L40S
        ((9, 0), "bf16"),  # H100, H200
    ],
)
def test_precision_is_bf16_only_where_the_gpu_has_it_natively(capability, expected):
    from trainer.precision import precision

    chosen = precision(capability)
    assert ("bf16" if chosen["bf16"] else "fp16" if chosen["fp16"] else "fp32") == expected


def test_the_capability_is_read_from_this_ranks_gpu_after_selecting_it(monkeypatch):
    """Rank 3 of a node with mixed GPUs must decide by GPU 3, and select it first, as the Trainer does later."""
    import torch

    from trainer.distributed import Topology
    from trainer.precision import device_capability

    selected = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0) if index == 3 else (7, 5))
    assert device_capability(Topology(rank=7, local_rank=3, world_size=8)) == (9, 0)
    assert selected == [3]


def test_a_lost_peer_fails_the_collective_after_the_configured_timeout(tmp_path):
    """Issue 12, defect 6: the process group's timeout (what a rank waits in a collective for a peer that is gone)
    is the option, not torch's 30-minute default, and a non-positive one is refused."""
    from trainer.distributed import Topology
    from trainer.objectives.sft import sft_arguments

    single = Topology(rank=0, local_rank=0, world_size=1)
    config = TrainConfig(model="m", tokens_dir=tmp_path, output_dir=tmp_path / "out")
    assert config.collective_timeout_minutes == 10.0
    assert sft_arguments(config, single, has_eval=False).ddp_timeout == 600
    quick = dataclasses.replace(config, collective_timeout_minutes=0.5)
    assert sft_arguments(quick, single, has_eval=False).ddp_timeout == 30
    assert "collective_timeout_minutes" in option_problems(dataclasses.replace(config, collective_timeout_minutes=0))
