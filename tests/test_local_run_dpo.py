"""`python -m pipelines.run --param objective=dpo`: preference tuning through the whole DAG on this machine.

One run on the bundled preference sample (the default data under dpo): pairs prepared and tokenised, two
torchrun processes training with TRL's DPOTrainer, the held-out pairs scored and gated on the reward accuracy, a
verified GGUF, a publish dry run whose model card says what was tuned and how. The model is conftest's tiny Llama
with SmolLM2's whole tokenizer: this run checks what goes where, and the plumbing of SmolLM2 itself (the default
base model resolved, its weights trained by two ranks, converted and verified) is tests/test_local_run.py's first
run. Training is cut short as there, with a gate that two steps can pass; a default run's numbers on SmolLM2,
gate passed, are in docs/guides/preference-tuning.md.
"""

from __future__ import annotations

import json

import pytest
from test_local_run import (
    DATA_PARAMS,
    EVERY_STEP,
    SHORT_EVALUATION,
    SHORT_TRAINING,
    executed,
    run_dirs,
    run_pipeline,
    succeeded,
)

from common.records import DataStats, EvaluationResult, TrainingSummary
from common.run_layout import EVALUATION, TRAINING_SUMMARY

pytestmark = pytest.mark.slow

PREFERENCE_PAIRS = 324  # lines of components/sample_data/practical_skills_preferences.jsonl


def test_a_dpo_run_prepares_pairs_trains_gates_on_reward_accuracy_and_publishes(tmp_path, tiny_whole_vocabulary_dir):
    output_dir = tmp_path / "out"
    result = run_pipeline(
        "--output-dir",
        output_dir,
        *DATA_PARAMS,
        *SHORT_TRAINING,
        *SHORT_EVALUATION,
        *("--param", "objective=dpo", "--param", "min_reward_accuracy_improvement=-0.5"),
        *("--param", f"base_model={tiny_whole_vocabulary_dir}"),
    )
    succeeded(result)
    assert executed(result) == list(EVERY_STEP)
    (run_dir,) = run_dirs(output_dir).values()

    stats = DataStats.read(run_dir / "data" / "stats.json")
    assert stats.kind == "preference pairs" and stats.records == PREFERENCE_PAIRS and stats.rejected == 0
    assert stats.inputs[0].endswith("practical_skills_preferences.jsonl")
    assert f"data:       {stats.train_rows} train / {stats.eval_rows} eval preference pairs" in result.stdout

    training = TrainingSummary.read(run_dir / "train" / TRAINING_SUMMARY)
    assert training.objective == "dpo" and training.world_size == 2 and training.global_step == 2
    assert training.learning_rate == pytest.approx(2e-4 / 40)  # LoRA's SFT rate, divided for DPO

    evaluation = EvaluationResult.read(run_dir / "evaluate" / EVALUATION)
    assert evaluation.base.reward_accuracy == 0.5 and evaluation.fine_tuned.reward_accuracy is not None
    assert evaluation.held_out["pairs"] == stats.eval_rows
    assert evaluation.gate.passed and evaluation.gate.measure == "reward_accuracy"
    assert "held-out reward accuracy" in evaluation.gate.reason
    assert (
        f"reward accuracy: base 0.500 (chance) -> fine-tuned {evaluation.fine_tuned.reward_accuracy:.3f}"
        in result.stdout
    )
    assert "llama.cpp:  verification passed" in result.stdout

    card = (run_dir / "publish" / "upload" / "README.md").read_text()
    assert "| objective | dpo |" in card and "| DPO beta / loss | 0.1 / sigmoid |" in card
    assert "held-out reward accuracy" in card and f"({stats.eval_rows} preference pairs;" in card
    assert "the share of pairs whose chosen answer gets the higher reward" in card
    report = (run_dir / "evaluate" / "report.md").read_text()
    assert "held-out preference pairs" in report and "Reward accuracy" in report
    history = json.loads((run_dir / "train" / "training_history.json").read_text())
    assert any("rewards/accuracies" in entry for entry in history)
