"""A finished run's stage directories as common.run_layout describes them, with small files.

Publishing only reads, links and uploads these files, so real models are not
needed: the GGUF and safetensors files here are a few kilobytes of bytes with
the right names, the JSON files carry every key the contract lists.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from common.records import (
    DataStats,
    EvaluationResult,
    GateComparison,
    GateVerdict,
    GgufVerification,
    ModelScores,
    RankFacts,
    RemoteVersion,
    SampleAnswer,
    SampleAnswers,
    SourceLineage,
    TrainingProgress,
    TrainingSummary,
    VerifiedGguf,
)
from common.run_layout import DATA_STATS, EVALUATION, TRAINING_SUMMARY, VERIFICATION_JSON, stage_dir

FINGERPRINT = "sha256:" + "ab" * 32
GGUF = "practical-skills-q8_0.gguf"
LORA_GGUF = "practical-skills-lora-f16.gguf"
SAMPLES = [
    {
        "question": "How many cups in a gallon?",
        "base": "A gallon is a unit.",
        "fine_tuned": "There are 16 cups in a US gallon.",
    },
    {
        "question": "What is the easiest loop knot to tie?",
        "base": "Knots are\nuseful.",
        "fine_tuned": "The overhand loop | quick and secure.",
    },
]


def _json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2), encoding="utf-8")


def _bytes(path: Path, size: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes((i * 31 + seed) % 251 for i in range(size)))


BASE_COMMIT = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"


def _score(value: float) -> dict:
    return {"metric": "acc_norm", "value": value, "stderr": 0.0157, "higher_is_better": True, "examples": 1000}


# The standard benchmarks as the evaluation records them: the fine-tune within 0.02 of its base on both.
BENCHMARKS = {
    "tasks": ["arc_easy", "hellaswag"],
    "requested": ["arc_easy", "hellaswag"],
    "limit": 1000,
    "num_fewshot": 0,
    "batch_size": 16,
    "max_drop": 0.02,
    "lm_eval_version": "0.4.13",
    "scores": {
        "base": {"arc_easy": _score(0.712), "hellaswag": _score(0.538)},
        "fine_tuned": {"arc_easy": _score(0.705), "hellaswag": _score(0.541)},
    },
}


def training_summary(model: str = "HuggingFaceTB/SmolLM3-3B", **changes) -> TrainingSummary:
    """The summary the trainer writes after a LoRA run of ``model`` on two GPUs, with ``changes`` (fields of
    common.records.TrainingSummary; ``config`` entries merge into the trainer's options)."""
    config = {
        "model": model,
        "method": "lora",
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "lora_target_modules": "all-linear",
        "epochs": 3.0,
        "learning_rate": 0.0002,
        "max_length": 1024,
        **changes.pop("config", {}),
    }
    gpu = "NVIDIA H100 80GB HBM3"
    summary = TrainingSummary(
        config=config,
        base_model_commit=BASE_COMMIT,
        world_size=2,
        devices=(gpu, gpu),
        sharding="none",
        precision="bf16",
        gradient_checkpointing=True,
        trained_weights_dtype="float32",
        learning_rate=0.0002,
        resumed_from=None,
        global_step=102,
        epochs=3.0,
        train_examples=270,
        eval_examples=30,
        train_rows=96,
        tokens_dir="/workspace/tokens/HuggingFaceTB--SmolLM3-3B/0123abcd",
        tokens_seen=412345,
        train_runtime_s=185.2,
        non_padding_tokens_per_s=2226.5,
        final_train_loss=0.8123,
        mean_train_loss=1.1,
        final_eval_loss=0.9511,
        ranks=tuple(RankFacts(rank, gpu, 206172, "9f" * 32, 1.0, 30512.0) for rank in range(2)),
        attention="flex_attention",
        compiled_blocks=True,
        compile={"graphs": 5, "graphs_after_rehearsal": 0, "seconds": 41.2},
        speed_fallback=None,
    )
    return dataclasses.replace(summary, **changes)


def evaluation(
    model: str = "HuggingFaceTB/SmolLM3-3B",
    fine_tuned_model: str = "/workspace/runs/run-1/train/merged",
    gate_passed: bool = True,
    published_model: dict | None = None,
) -> EvaluationResult:
    """What the evaluation step records of a LoRA run that beat its base (or, ``gate_passed`` False, did not);
    ``published_model``: the model it compared with, whose scores are not recorded (None: nothing was published)."""
    reason = "eval loss improved by 1.3945" if gate_passed else "eval loss got worse by 0.2"
    base = ModelScores(eval_loss=2.3456, perplexity=10.44, rouge_l=0.1234, eval_tokens=5000)
    tuned = ModelScores(eval_loss=0.9511, perplexity=2.59, rouge_l=0.4567, eval_tokens=5000)
    return EvaluationResult(
        base_model=model,
        base_model_commit=BASE_COMMIT,
        fine_tuned_model=fine_tuned_model,
        base=base,
        fine_tuned=tuned,
        deltas={key: getattr(tuned, key) - getattr(base, key) for key in ("eval_loss", "perplexity", "rouge_l")},
        scored_rows=30,
        held_out={"conversations": 40, "tokenised": 40, "split_conversations": 40, "eval_max_rows": 1000},
        benchmarks=BENCHMARKS,
        gate=GateVerdict(
            passed=gate_passed,
            min_eval_loss_improvement=0.0,
            reason=reason,
            forced=False,
            max_benchmark_drop=0.02,
            comparisons=(GateComparison("base", gate_passed, reason),),
        ),
        published_model=published_model,
    )


SOURCE_CONTENT = "sha256:" + "5e" * 32  # the digest of the source's text


def data_stats(fingerprint: str = FINGERPRINT, **changes) -> DataStats:
    """The data step's statistics of 300 records of practical-skills Q&A, none rejected."""
    stats = DataStats(
        inputs=("components/sample_data/practical_skills.jsonl",),
        options={"eval_fraction": 0.1, "seed": 42},
        records=300,
        blank_lines=0,
        rejected=0,
        rejected_by_reason={},
        reject_fraction=0.0,
        duplicates=0,
        rows={"train": 270, "eval": 30},
        shapes={"messages": 300},
        length_chars={"conversation": {"p50": 400}, "response": {"p50": 250}},
        fingerprint=fingerprint,
        lineage=(SourceLineage("s3://qa-data/skills.jsonl", SOURCE_CONTENT, 1, RemoteVersion("", '"e1"', "v1")),),
    )
    return dataclasses.replace(stats, **changes)


def training_progress(**changes) -> TrainingProgress:
    """Rank 0's progress file of a run 45% through its 1,000 steps, past its checkpoint at step 400."""
    progress = TrainingProgress(
        step=450,
        total_steps=1000,
        epoch=1.35,
        tokens_seen=1_234_567,
        tokens_per_second=3400.4,
        mfu=0.382,
        loss=1.23456,
        learning_rate=1.9e-4,
        elapsed_seconds=360.0,
        eta_seconds=440.0,
        last_checkpoint="checkpoint-400",
        updated="2026-11-29T05:00:00+00:00",
    )
    return dataclasses.replace(progress, **changes)


def gguf_verification(export: Path) -> GgufVerification:
    """A passed verification of the run's q8_0 GGUF and its LoRA adapter, as the export step writes it."""
    files = ((GGUF, "q8_0"), (LORA_GGUF, "lora"))
    return GgufVerification(
        passed=True,
        files=tuple(
            VerifiedGguf(str(export / name), outtype, True, ({"name": "loads", "passed": True, "detail": ""},), {})
            for name, outtype in files
        ),
        conversions=tuple(
            {"kind": "lora" if outtype == "lora" else "model", "path": str(export / name), "outtype": outtype}
            for name, outtype in files
        ),
        thresholds={"float_min_top1": 0.99},
        modelfile="Modelfile",
    )


def make_run(
    workspace: Path,
    run_id: str = "run-1",
    *,
    fingerprint: str = FINGERPRINT,
    gate_passed: bool = True,
    model: str = "HuggingFaceTB/SmolLM3-3B",
    published_model: dict | None = None,
) -> Path:
    """Write data, train, evaluate and export outputs of ``run_id`` under ``workspace``; return the run directory.

    ``published_model``: the model the evaluation compared with (evaluation.json); None: nothing was published."""
    data, train, evaluate, export = (
        stage_dir(str(workspace), run_id, stage) for stage in ("data", "train", "evaluate", "export")
    )
    data.mkdir(parents=True, exist_ok=True)
    data_stats(fingerprint).write(data / DATA_STATS)
    training_summary(model).write(train / TRAINING_SUMMARY)
    _json(train / "merged" / "config.json", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    _bytes(train / "merged" / "model.safetensors", 4096, 1)
    _json(train / "merged" / "tokenizer_config.json", {"chat_template": "{{ messages }}"})
    (train / "merged" / "README.md").write_text("not the model card\n")
    _json(train / "adapter" / "adapter_config.json", {"peft_type": "LORA", "r": 16})
    _bytes(train / "adapter" / "adapter_model.safetensors", 2048, 2)
    (train / "adapter" / "README.md").write_text("PEFT's own card\n")
    _bytes(train / "loss_curve.png", 512, 3)
    evaluation(model, str(train / "merged"), gate_passed, published_model).write(evaluate / EVALUATION)
    (evaluate / "demo_outputs").mkdir(parents=True)
    SampleAnswers(tuple(SampleAnswer(**sample) for sample in SAMPLES)).write(
        evaluate / "demo_outputs" / "sample_responses.json"
    )
    (evaluate / "report.md").write_text("# Evaluation\n\n![loss](loss_curve.png)\n")
    _bytes(evaluate / "loss_curve.png", 512, 3)
    _bytes(export / GGUF, 8192, 4)
    _bytes(export / LORA_GGUF, 1024, 5)
    (export / "Modelfile").write_text(f"FROM ./{GGUF}\nPARAMETER temperature 0.7\n")
    gguf_verification(export).write(export / VERIFICATION_JSON)
    (export / "verification.md").write_text("# Verification\n\npassed\n")
    return workspace / "runs" / run_id
