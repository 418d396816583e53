"""Training throughput: a plain TRL script against the trainer's defaults, on the same data and model.

(a) baseline: what a plain fine-tuning script does: TRL SFTTrainer on the chat
    ``messages``, every batch padded to ``max_length``, no packing, loss on all tokens.
(b) ours: ``python -m trainer`` with its defaults (assistant-only loss, padding-free packing).

Both train for the same epochs with the same learning rate, truncation and
precision (fp32 on CPU, bf16/fp16 on GPU) and neither recomputes activations;
the baseline takes ``--batch-size`` conversations per step, the trainer its
default of packed sequences. Each runs in its own process; the parent then
scores both final models the same
way: mean cross-entropy on the assistant tokens of the held-out split, one
unpacked conversation at a time. Throughput counts non-padding tokens only.

    python benchmarks/train_bench.py                     # CPU: SmolLM2-135M, a small subset
    python benchmarks/train_bench.py --model HuggingFaceTB/SmolLM3-3B --train-examples 0   # GPU, all data
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

TARGET_SPEEDUP = 2.0


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_baseline(args: argparse.Namespace, output: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from trainer import data
    from trainer.train import precision

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train = data.load_split(args.data_dir, "train")
    config = SFTConfig(
        output_dir=str(output),
        num_train_epochs=args.epochs,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.batch_size,
        max_length=args.max_length,
        pad_to_multiple_of=args.max_length,  # every batch padded to max_length
        packing=False,
        assistant_only_loss=False,
        # TRL's defaults turn activation checkpointing and bf16 on (bf16 even on a CPU,
        # where its matmuls are several times slower than fp32). The trainer picks
        # its precision by device and leaves checkpointing off; the baseline does the
        # same, so the ratio measures padding, packing and the loss mask alone.
        activation_checkpointing=False,
        **precision(),
        save_strategy="no",
        report_to=[],
        logging_steps=10,
        disable_tqdm=True,
        include_num_input_tokens_seen="non_padding",  # counted as the trainer counts its own
        use_cpu=not __import__("torch").cuda.is_available(),
    )
    from peft import LoraConfig

    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        args=config,
        train_dataset=Dataset.from_dict({"messages": train["messages"]}),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
    )
    runtime = trainer.train().metrics["train_runtime"]
    tokens = int(trainer.state.num_input_tokens_seen)
    merged = trainer.model.merge_and_unload()
    merged.save_pretrained(output / "merged")
    tokenizer.save_pretrained(output / "merged")
    return {"tokens": tokens, "seconds": runtime, "peak_mb": peak_memory_mb(), "model_dir": str(output / "merged")}


def run_ours(args: argparse.Namespace, output: Path) -> dict:
    from trainer.config import TrainConfig
    from trainer.train import run

    # The trainer's own batch size: with packing, one max_length sequence holds several conversations.
    config = TrainConfig(
        model=args.model,
        data_dir=args.data_dir,
        output_dir=output,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
    )
    assert run(config) == 0
    summary = json.loads((output / "training_summary.json").read_text())
    return {
        "tokens": summary["tokens_seen"],
        "seconds": summary["train_runtime_s"],
        "peak_mb": peak_memory_mb(),
        "model_dir": str(output / "merged"),
    }


def assistant_eval_loss(model_dir: str, data_dir: Path) -> float:
    """Mean cross-entropy over the assistant tokens of the eval split, measured identically for both."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer import data

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    split = data.tokenise(data.load_split(data_dir, "eval"), tokenizer, "assistant")
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in zip(split["input_ids"], split["assistant_masks"]):
            labels = torch.tensor([[token if bit else -100 for token, bit in zip(ids, mask)]])
            loss = model(input_ids=torch.tensor([ids]), labels=labels, use_cache=False).loss
            labelled = int((labels[:, 1:] != -100).sum())
            total += float(loss) * labelled
            count += labelled
    return total / count


def subsets(source: Path, work: Path, train_examples: int, eval_examples: int) -> tuple[Path, Path]:
    """A training directory (train subset, empty eval: no evaluation inside the timed loop) and a scoring one."""
    import pyarrow.parquet as pq

    train, score = work / "train-data", work / "score-data"
    for directory in (train, score):
        directory.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(source / "train.parquet")
    pq.write_table(table.slice(0, train_examples) if train_examples else table, train / "train.parquet")
    table = pq.read_table(source / "eval.parquet")
    pq.write_table(table.slice(0, 0), train / "eval.parquet")
    pq.write_table(table.slice(0, eval_examples) if eval_examples else table, score / "eval.parquet")
    return train, score


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="base model (default: the local SmolLM2-135M-Instruct)")
    parser.add_argument("--train-examples", type=int, default=48, help="train conversations (0: all)")
    parser.add_argument("--eval-examples", type=int, default=16, help="eval conversations (0: all)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=4,
        help="conversations per step of the baseline (the trainer packs; it keeps its default)",
    )
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--run-one", choices=("baseline", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_one:
        result = (run_baseline if args.run_one == "baseline" else run_ours)(args, args.output)
        (args.output / "result.json").write_text(json.dumps(result))
        return

    from components.dataprep.options import PrepareOptions
    from components.dataprep.prepare import prepare
    from components.local_model import local_base_model
    from components.sample_data import bundled_dataset_path

    model = args.model or str(local_base_model())
    work = Path(tempfile.mkdtemp(prefix="train-bench-"))
    prepare(str(bundled_dataset_path()), work / "prepared", PrepareOptions())
    data_dir, score_dir = subsets(work / "prepared", work, args.train_examples, args.eval_examples)
    results = {}
    for name in ("baseline", "ours"):
        print(f"running {name} ...", flush=True)
        output = work / name
        output.mkdir()
        command = [
            sys.executable,
            __file__,
            "--run-one",
            name,
            "--data-dir",
            str(data_dir),
            "--output",
            str(output),
            "--model",
            model,
            "--epochs",
            str(args.epochs),
            "--learning-rate",
            str(args.learning_rate),
            "--batch-size",
            str(args.batch_size),
            "--max-length",
            str(args.max_length),
        ]
        subprocess.run(command, check=True, cwd=REPO_ROOT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        results[name] = json.loads((output / "result.json").read_text())
        results[name]["eval_loss"] = assistant_eval_loss(results[name]["model_dir"], score_dir)

    print(
        f"\nmodel {model}; {args.train_examples or 'all'} train / "
        f"{args.eval_examples or 'all'} eval conversations; "
        f"{args.epochs} epoch(s), lr {args.learning_rate}, baseline batch {args.batch_size}, "
        f"max_length {args.max_length}\n"
    )
    print(
        "| contender | non-padding tokens | seconds | non-padding tokens/s | peak memory MB "
        "| eval loss (assistant tokens) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, label in (
        ("baseline", "plain TRL (pad to max_length, no packing, loss on all)"),
        ("ours", "trainer defaults"),
    ):
        r = results[name]
        print(
            f"| {label} | {r['tokens']:,} | {r['seconds']:.1f} | {r['tokens'] / r['seconds']:,.0f} "
            f"| {r['peak_mb']:,.0f} | {r['eval_loss']:.4f} |"
        )
    speedup = (results["ours"]["tokens"] / results["ours"]["seconds"]) / (
        results["baseline"]["tokens"] / results["baseline"]["seconds"]
    )
    no_worse = results["ours"]["eval_loss"] <= results["baseline"]["eval_loss"]
    print(
        f"\nthroughput ratio ours ÷ baseline: {speedup:.2f}× "
        f"(target ≥ {TARGET_SPEEDUP}×: {'met' if speedup >= TARGET_SPEEDUP else 'NOT met'})"
    )
    print(
        f"eval loss ours {results['ours']['eval_loss']:.4f} vs baseline {results['baseline']['eval_loss']:.4f}: "
        f"{'no worse' if no_worse else 'WORSE'}"
    )
    print(f"work directory: {work}")


if __name__ == "__main__":
    main()
