"""Preference tuning end to end on CPU: pairs prepared and tokenised as the pipeline does, then two torchrun ranks
training with objective dpo (TRL's DPOTrainer on the token rows, the reference the base with the adapter off)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from datasets import Dataset
from test_trainer_run import finish, kill_rank_1_after_checkpoint_3, summary, torchrun

from components.data.mixture import DataSource
from components.data.options import PrepareOptions
from components.data.prepare import SourceFiles, prepare
from components.tokenise.build import build
from trainer.token_cache import TokenManifest, TokenSettings

pytestmark = pytest.mark.slow

CAREFUL = "Check it twice, then do it slowly and safely."
CARELESS = "Whatever, just do it."


def pairs(count: int) -> list[dict]:
    return [
        {"prompt": f"How should I handle task number {number}?", "chosen": CAREFUL, "rejected": CARELESS}
        for number in range(count)
    ]


@pytest.mark.parametrize(
    ("method", "sharding"), [("lora", "none"), ("lora", "fsdp"), ("full", "none"), ("full", "fsdp")]
)
def test_two_ranks_learn_to_prefer_the_chosen_answers(tiny_model_dir, tmp_path, method, sharding):
    halves = []  # two sources (dataset_sources), so the summary carries each one's share of the tokens
    for name, part in (("first", pairs(64)[:40]), ("second", pairs(64)[40:])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(pair) + "\n" for pair in part))
        halves.append(SourceFiles(DataSource(str(path)), [path]))
    data = prepare(halves, tmp_path / "data", PrepareOptions(eval_fraction=0.15), "dpo")
    settings = TokenSettings(max_length=128, loss_on="assistant", packing=True, eval_max_rows=0, objective="dpo")
    tokens_dir, _ = build(data.output_dir, tiny_model_dir, settings, tmp_path / "cache", workers=1)
    manifest = TokenManifest.read(tokens_dir)
    assert manifest.train.conversations == data.stats.train_rows and manifest.train.prompts_too_long == 0
    assert [source.conversations for source in manifest.train.sources] == [
        source.train_rows for source in data.stats.sources
    ]
    assert Dataset.from_file(str(tokens_dir / "train.arrow")).column_names == [
        "prompt_ids",
        "chosen_ids",
        "rejected_ids",
    ]

    output, log = tmp_path / "out", tmp_path / "train.log"
    args = ["--model", str(tiny_model_dir), "--tokens-dir", str(tokens_dir), "--output-dir", str(output)]
    args += ["--objective", "dpo", "--max-length", "128", "--per-device-batch-size", "4", "--max-steps", "9"]
    args += ["--logging-steps", "1", "--eval-steps", "3", "--learning-rate", "5e-4", "--sharding", sharding]
    args += ["--method", method, "--save-steps", "3"]
    resume_point = None
    if method == "lora" and sharding == "none":  # a pod lost mid-run: the relaunch resumes from checkpoint 3
        resume_point = kill_rank_1_after_checkpoint_3(args, output, tmp_path / "killed.log")
        assert resume_point is not None and not (output / "training_summary.json").exists()
    code = finish(torchrun(args, log=log))
    text = log.read_text()
    assert code == 0, text[-4000:]
    reference = {
        "lora": "the model itself with its adapter disabled (no second copy in memory)",
        "full": "a frozen copy of the starting model, "
        + ("sharded by FSDP across the ranks" if sharding == "fsdp" else "whole on every rank"),
    }[method]
    assert f"DPO reference: {reference}" in text
    result = summary(output)
    assert result["resumed_from"] == (str(resume_point) if resume_point else None)
    history = json.loads((output / "training_history.json").read_text())
    assert [entry["step"] for entry in history if "loss" in entry] == list(range(1, 10))  # every step once, in order
    assert result["config"]["objective"] == "dpo" and result["world_size"] == 2 and result["sharding"] == sharding
    assert result["source_tokens"] == [dataclasses.asdict(source) for source in manifest.train.sources]
    evaluations = [entry for entry in history if "eval_rewards/accuracies" in entry]
    assert evaluations[-1]["eval_rewards/accuracies"] == 1.0 and evaluations[-1]["eval_rewards/margins"] > 0
    assert (output / "adapter" / "adapter_model.safetensors").is_file() == (method == "lora")
    assert (output / "merged" / "config.json").is_file()
    assert result["tokens_seen"] > 0 and result["final_eval_loss"] < 0.6931  # below log 2: the chosen now preferred

    # The evaluation stage's scores of the merged model against the base equal what TRL measured in training.
    from transformers import AutoModelForCausalLM

    from common.errors import UserError
    from components.evaluate.preferences import pair_log_probs, preference_scores, usable_pairs

    rows = Dataset.from_file(str(tokens_dir / "eval.arrow"))
    base = pair_log_probs(AutoModelForCausalLM.from_pretrained(tiny_model_dir), rows, 128)
    tuned = pair_log_probs(AutoModelForCausalLM.from_pretrained(output / "merged"), rows, 128)
    scores = preference_scores(tuned, base, beta=0.1)
    assert scores.pairs == len(rows) == data.stats.eval_rows
    assert scores.reward_accuracy == evaluations[-1]["eval_rewards/accuracies"]
    assert scores.mean_margin == pytest.approx(evaluations[-1]["eval_rewards/margins"], rel=1e-3)
    assert scores.chosen_log_prob == pytest.approx(evaluations[-1]["eval_logps/chosen"], rel=1e-3)
    # The base against itself: every reward 0, so every pair a tie, counted half: chance.
    assert preference_scores(base, base, beta=0.1).reward_accuracy == 0.5
    if method == "lora" and sharding == "none":
        # A max_length below the tokenise step's drops the pairs whose prompt fills it, and none left is refused.
        lengths = [len(prompt) for prompt in rows["prompt_ids"]]
        kept = usable_pairs(tokens_dir, max(lengths))["prompt_ids"]
        assert len(kept) == sum(length < max(lengths) for length in lengths) < len(lengths)
        with pytest.raises(UserError, match="no preference pair whose prompt is shorter than max_length"):
            usable_pairs(tokens_dir, min(lengths))
        check_the_evaluation_stage(tiny_model_dir, data.output_dir, output, tmp_path / "evaluate", scores)


def check_the_evaluation_stage(base_model, data_dir, train_dir, output_dir, scores) -> None:
    """The evaluation stage on a DPO run: the held-out pairs' preferences of each model, the gate on the reward
    accuracy against the base's chance, and the reports saying so."""
    from components.evaluate.options import EvaluateOptions
    from components.evaluate.stage import evaluate

    options = EvaluateOptions(
        base_model=str(base_model),
        fine_tuned_model=train_dir / "merged",
        data_dir=data_dir,
        train_dir=train_dir,
        output_dir=output_dir,
        score_rows=3,
        max_new_tokens=4,
        benchmark_tasks="",
        min_reward_accuracy_improvement=0.4,
    )
    evaluation = evaluate(options).evaluation
    base, tuned = evaluation.base, evaluation.fine_tuned
    assert base.reward_accuracy == 0.5 and base.reward_margin == 0
    assert tuned.reward_accuracy == scores.reward_accuracy == 1.0
    assert tuned.reward_margin == pytest.approx(scores.mean_margin)
    assert tuned.chosen_log_prob == pytest.approx(scores.chosen_log_prob)
    assert tuned.rejected_log_prob == pytest.approx(scores.rejected_log_prob)
    assert evaluation.deltas["reward_accuracy"] == 0.5
    assert evaluation.held_out["pairs"] == scores.pairs
    gate = evaluation.gate
    assert gate.passed and gate.measure == "reward_accuracy" and gate.min_reward_accuracy_improvement == 0.4
    assert "The held-out reward accuracy improved by 0.5000 (base 0.5000, fine-tuned 1.0000)" in gate.reason
    written = json.loads((output_dir / "evaluation.json").read_text())
    assert written["fine_tuned"]["reward_accuracy"] == 1.0 and written["gate"]["measure"] == "reward_accuracy"
    report = (output_dir / "report.md").read_text()
    assert f"{scores.pairs} held-out preference pairs" in report and "reward accuracy" in report

    # A training run of the other objective than the token cache's is refused before any model is scored.
    summary = json.loads((train_dir / "training_summary.json").read_text())
    summary["config"]["objective"] = "sft"
    sft_train_dir = output_dir.with_name("sft-train")
    sft_train_dir.mkdir()
    (sft_train_dir / "training_summary.json").write_text(json.dumps(summary))
    from common.errors import UserError

    with pytest.raises(UserError, match="was tokenised for objective dpo, and the training run in .* objective sft"):
        evaluate(dataclasses.replace(options, train_dir=sft_train_dir, output_dir=output_dir.with_name("refused")))
