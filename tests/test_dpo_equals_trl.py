"""Our DPO steps are TRL's: the same pairs through TRL's own ``DPOTrainer`` (its own preparation of the text pairs,
its own training loop) and through ours (the data step, the tokenise step's rows, ``python -m trainer``) give the
same losses and gradient norms over the first steps; two ranks give the curve of one.

Full fine-tuning of the tiny model, so both hold TRL's frozen reference copy, and one micro-batch of every pair per
step, so the order the samplers draw the pairs in cannot matter: the loss is their mean.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_module
from datasets import Dataset
from test_trainer_run import finish, summary, torchrun
from transformers import AutoTokenizer

from common.run_layout import TRAIN_SPLIT
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.tokenise.build import build
from trainer.token_cache import TokenSettings

pytestmark = pytest.mark.slow

PAIRS = 8
STEPS = 3
LEARNING_RATE = 1e-3
MAX_LENGTH = 96
ANSWERS = (
    ("Turn the power off at the breaker, then test the wire before you touch it.", "Just grab it, it's fine."),
    ("Clean the cut, press on it for ten minutes, then cover it.", "Ignore it."),
    ("Let the pan cool, then soak it in warm water with soap.", "Pour cold water on the hot pan."),
    ("Tie a bowline: it holds and unties easily after a load.", "Any knot works."),
)


def pair(number: int) -> dict:
    """Conversational pairs of several lengths, some with a system prompt and an earlier exchange."""
    careful, careless = ANSWERS[number % len(ANSWERS)]
    prompt = [{"role": "user", "content": f"Question {number}: how do I do this safely?"}]
    if number % 3 == 0:
        prompt = [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Hello."},
            {"role": "assistant", "content": "Hello! What do you need?"},
            *prompt,
        ]
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": careful * (1 + number % 2)}],
        "rejected": [{"role": "assistant", "content": careless}],
    }


def logged(history: list[dict], key: str) -> list[float]:
    return [entry[key] for entry in history if key in entry and "eval_loss" not in entry][:STEPS]


def trls_own_run(model_dir, data_dir, output) -> list[dict]:
    """TRL's DPOTrainer on the data step's Parquet, preparing the text pairs itself, with our run's schedule."""
    from trl import DPOConfig, DPOTrainer

    train = Dataset.from_parquet(str(data_dir / TRAIN_SPLIT))
    args = DPOConfig(
        output_dir=str(output),
        max_steps=STEPS,
        per_device_train_batch_size=PAIRS,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        logging_steps=1,
        logging_first_step=True,
        save_strategy="no",
        report_to=[],
        seed=42,
        data_seed=42,
        use_cpu=True,
        bf16=False,  # TRL's configs default to bf16 and to gradient checkpointing; our run on a CPU has neither
        gradient_checkpointing=False,
        max_length=MAX_LENGTH,
        truncation_mode="keep_start",
        beta=0.1,
        loss_type=["sigmoid"],
        model_init_kwargs={"dtype": torch.float32},
    )
    trainer = DPOTrainer(
        model=str(model_dir), args=args, train_dataset=train, processing_class=AutoTokenizer.from_pretrained(model_dir)
    )
    trainer.train()
    return trainer.state.log_history


def test_the_first_steps_are_trls_own_and_two_ranks_follow_one(tiny_model_dir, tmp_path):
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(pair(number)) + "\n" for number in range(PAIRS)))
    data = prepare(str(source), tmp_path / "data", PrepareOptions(eval_fraction=0.0), "dpo")
    assert data.stats.train_rows == PAIRS
    settings = TokenSettings(max_length=MAX_LENGTH, loss_on="assistant", packing=True, eval_max_rows=0, objective="dpo")
    tokens_dir, _ = build(data.output_dir, tiny_model_dir, settings, tmp_path / "cache", workers=1)

    def ours(output, *extra: str) -> list[str]:
        args = ["--model", str(tiny_model_dir), "--tokens-dir", str(tokens_dir), "--output-dir", str(output)]
        args += ["--objective", "dpo", "--method", "full", "--max-length", str(MAX_LENGTH), "--seed", "42"]
        args += ["--max-steps", str(STEPS), "--learning-rate", str(LEARNING_RATE), "--warmup-ratio", "0"]
        args += ["--weight-decay", "0", "--logging-steps", "1", "--save-steps", "100", *extra]
        return args

    one = run_module("trainer", *ours(tmp_path / "one", "--per-device-batch-size", str(PAIRS)), timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two_log = tmp_path / "two.log"
    two = finish(torchrun(ours(tmp_path / "two", "--per-device-batch-size", str(PAIRS // 2)), log=two_log))
    assert two == 0, two_log.read_text()[-3000:]
    assert summary(tmp_path / "two")["world_size"] == 2

    histories = {
        "trl": trls_own_run(tiny_model_dir, data.output_dir, tmp_path / "trl"),
        "one rank": json.loads((tmp_path / "one" / "training_history.json").read_text()),
        "two ranks": json.loads((tmp_path / "two" / "training_history.json").read_text()),
    }
    losses = {name: logged(history, "loss") for name, history in histories.items()}
    norms = {name: logged(history, "grad_norm") for name, history in histories.items()}
    assert len(losses["trl"]) == STEPS and losses["trl"][0] == pytest.approx(0.6931, abs=1e-4)  # log 2 at the start
    assert losses["trl"][-1] < losses["trl"][0] - 0.01, losses  # it moves: step 1's update shows in steps 2 and 3
    for name in ("one rank", "two ranks"):
        assert losses[name] == pytest.approx(losses["trl"], rel=1e-4), losses
        assert norms[name] == pytest.approx(norms["trl"], rel=1e-3), norms
