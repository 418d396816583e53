"""Training throughput and quality: TRL as its users run it, against ``python -m trainer``, in one run.

Contenders, all LoRA (r 16, alpha 32, all-linear, the same ``--lora-dropout``) on the same model, data,
learning rate, epochs, max_length and precision (fp32 on CPU, bf16 on GPU):

(a) TRL defaults: ``SFTTrainer`` on the chat ``messages`` with ``SFTConfig``'s own defaults for
    everything else: 8 conversations per batch padded to the longest, no packing, loss on every
    token, activation checkpointing on (TRL's default).
(b) TRL best practice: (a) with ``packing=True`` and ``padding_free=True`` and activation
    checkpointing off, as a user with memory to spare runs it. (TRL's ``assistant_only_loss`` needs
    ``{% generation %}`` markers that SmolLM2's template lacks, so TRL trains on every token.)
(c) ours: ``python -m trainer`` with its defaults (assistant-only loss, packing, padding-free,
    one packed sequence per step; attention auto, which is sdpa on a CPU and flex_attention on a
    CUDA GPU; transformer blocks compiled on a CUDA GPU only; the adapters' inputs not cast to fp32,
    which changes nothing in fp32 on a CPU) except the LoRA dropout.
and, in a second table, ours on two ranks with ``--sharding none`` (DDP) against ``--sharding fsdp``.

The dropout is 0.05 for all three by default, TRL's own (``ModelConfig.lora_dropout``, its LoRA
examples). Ours defaults to 0, which skips a dropped copy of every adapted layer's input, but a TRL
user gets that by setting one LoraConfig field, and dropout is a regulariser that moves the eval loss
too: with the same value, the tokens/s ratios and the eval losses measure the trainers, not a
hyperparameter. ``--lora-dropout 0`` runs ours at its default against TRL users who set 0 as well.

Each contender trains in its own process and, as all three do by default, ends training with a
checkpoint (adapter and optimizer state; the timed run includes it). The timed run is the Trainer's
``train_runtime``, training alone: no contender evaluates during it (the training directory's eval
split is empty and TRL's trainers get no eval set; ``check_no_evaluation`` refuses a history with an
``eval_loss``), and the merge and the scoring below come after it. Throughput counts non-padding
tokens: the training split's tokens (truncated at max_length) times the epochs, the same number for
every contender.
The parent scores every final model the same way: mean cross-entropy over the assistant tokens of
the held-out split, one unpacked conversation at a time. Peak memory is the training process's
(per rank for the two-rank rows): what the GPU's caching allocator reserved at most, or on CPU the peak resident size.

    python benchmarks/train_bench.py                                   # CPU: SmolLM2-135M, a subset
    python benchmarks/train_bench.py --model /models/SmolLM3-3B --train-examples 0   # GPU, all data
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

TARGETS = {"trl-defaults": 2.0, "trl-packed": 1.0}
LABELS = {
    "trl-defaults": "(a) TRL defaults",
    "trl-packed": "(b) TRL packing + padding-free",
    "ours": "(c) python -m trainer",
    "ours-ddp": "ours, 2 ranks, sharding none (DDP)",
    "ours-fsdp": "ours, 2 ranks, sharding fsdp (FSDP2)",
}


def run_trl(args: argparse.Namespace, output: Path, packed: bool) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from trainer import data
    from trainer.diagnostics import peak_memory_mb
    from trainer.precision import native_bf16

    best_practice = {"packing": True, "padding_free": True, "activation_checkpointing": False} if packed else {}
    config = SFTConfig(
        output_dir=str(output),
        num_train_epochs=args.epochs,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        bf16=native_bf16(),  # the same precision for every contender: TRL's default would be bf16 on a CPU too
        report_to=[],
        disable_tqdm=True,
        use_cpu=not __import__("torch").cuda.is_available(),
        **best_practice,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        args=config,
        train_dataset=Dataset.from_dict({"messages": data.load_split(args.data_dir, "train")["messages"]}),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=16, lora_alpha=32, lora_dropout=args.lora_dropout, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
    )
    seconds = trainer.train().metrics["train_runtime"]
    check_no_evaluation(trainer.state.log_history)
    steps = trainer.state.global_step
    peak = peak_memory_mb()
    trainer.model.merge_and_unload().save_pretrained(output / "merged")
    tokenizer.save_pretrained(output / "merged")
    return {"seconds": seconds, "steps": steps, "peak_mb": [peak]}


def check_no_evaluation(history: list[dict]) -> None:
    """Refuse a run that evaluated while training: its time would count as training time."""
    evaluated = [entry.get("step") for entry in history if "eval_loss" in entry]
    if evaluated:
        raise RuntimeError(f"the timed training run evaluated at step(s) {evaluated}")


def run_ours(args: argparse.Namespace, output: Path, ranks: int, sharding: str) -> dict:
    import dataclasses

    from components.tokenise.options import TokeniseOptions
    from components.tokenise.stage import tokenise
    from components.train.local import local_command
    from trainer.config import TrainConfig, to_args

    config = TrainConfig(
        model=args.model,
        output_dir=output,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        lora_dropout=args.lora_dropout,
        sharding=sharding,
        save_steps=100000,
    )
    # The pipeline's tokenise step, before the trainer starts (its time is not the trainer's).
    tokens = TokeniseOptions(data_dir=args.data_dir, model=args.model, cache_dir=args.data_dir.parent / "tokens")
    config = dataclasses.replace(config, tokens_dir=tokenise(tokens, config)[0])
    command = local_command(config, ranks) if ranks > 1 else [sys.executable, "-m", "trainer", *to_args(config)]
    subprocess.run(command, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    summary = json.loads((output / "training_summary.json").read_text())
    check_no_evaluation(json.loads((output / "training_history.json").read_text()))
    return {
        "seconds": summary["train_runtime_s"],
        "steps": summary["global_step"],
        "peak_mb": [rank["peak_memory_mb"] for rank in summary["ranks"]],
        "sharding": summary["sharding"],
        "local_parameter_fraction": [rank["local_parameter_fraction"] for rank in summary["ranks"]],
    }


def training_tokens(model: str, data_dir: Path, max_length: int, epochs: float) -> int:
    """Non-padding tokens every contender trains on: each conversation once per epoch, truncated at max_length."""
    from transformers import AutoTokenizer

    from trainer import data
    from trainer.masking import tokenise_conversations

    tokenizer = AutoTokenizer.from_pretrained(model)
    encoded = tokenise_conversations(tokenizer, data.load_split(data_dir, "train")["messages"])
    return int(sum(min(len(conversation.input_ids), max_length) for conversation in encoded) * epochs)


def assistant_eval_loss(model_dir: Path, data_dir: Path) -> float:
    """Mean cross-entropy over the assistant tokens of the eval split, measured identically for all."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer import data
    from trainer.masking import tokenise_conversations

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    encoded = tokenise_conversations(tokenizer, data.load_split(data_dir, "eval")["messages"])
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in ((conversation.input_ids, conversation.assistant_masks) for conversation in encoded):
            labels = torch.tensor([[token if bit else -100 for token, bit in zip(ids, mask)]], device=device)
            loss = model(input_ids=torch.tensor([ids], device=device), labels=labels, use_cache=False).loss
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
    parser.add_argument("--train-examples", type=int, default=64, help="train conversations (0: all)")
    parser.add_argument("--eval-examples", type=int, default=24, help="eval conversations (0: all)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--lora-dropout", type=float, default=0.05, help="every contender's (see the docstring)")
    parser.add_argument("--skip-fsdp", action="store_true", help="leave out the two-rank DDP and FSDP rows")
    parser.add_argument("--run-trl", choices=("defaults", "packed"), help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def table(rows: dict[str, dict], tokens: int, reference: str | None) -> None:
    print("| contender | optimizer steps | seconds | non-padding tokens/s | peak memory MiB | eval loss | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        speed = tokens / r["seconds"]
        ratio = speed / (tokens / rows[reference]["seconds"]) if reference else None
        peak = " / ".join(f"{mb:,.0f}" for mb in r["peak_mb"])
        print(
            f"| {LABELS[name]} | {r['steps']} | {r['seconds']:.1f} | {speed:,.0f} | {peak} | {r['eval_loss']:.4f} "
            f"| {f'{ratio:.2f}×' if ratio else ''} |"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_trl:
        result = run_trl(args, args.output, packed=args.run_trl == "packed")
        (args.output / "result.json").write_text(json.dumps(result))
        return

    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.local_model import local_base_model
    from components.sample_data import bundled_dataset_path

    args.model = args.model or str(local_base_model())
    work = Path(tempfile.mkdtemp(prefix="train-bench-"))
    prepare(str(bundled_dataset_path()), work / "prepared", PrepareOptions())
    args.data_dir, score_dir = subsets(work / "prepared", work, args.train_examples, args.eval_examples)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    results: dict[str, dict] = {}
    names = ["trl-defaults", "trl-packed", "ours"] + ([] if args.skip_fsdp else ["ours-ddp", "ours-fsdp"])
    for name in names:
        print(f"running {LABELS[name]} ...", flush=True)
        output = work / name
        output.mkdir()
        if name.startswith("trl"):
            command = [sys.executable, __file__, "--run-trl", name.removeprefix("trl-"), "--model", args.model]
            command += ["--data-dir", str(args.data_dir), "--output", str(output), "--epochs", str(args.epochs)]
            command += ["--learning-rate", str(args.learning_rate), "--max-length", str(args.max_length)]
            command += ["--lora-dropout", str(args.lora_dropout)]
            subprocess.run(command, check=True, cwd=REPO_ROOT, env=env)
            results[name] = json.loads((output / "result.json").read_text())
        else:
            ranks, sharding = {"ours": (1, "none"), "ours-ddp": (2, "none"), "ours-fsdp": (2, "fsdp")}[name]
            results[name] = run_ours(args, output, ranks, sharding)
        results[name]["eval_loss"] = assistant_eval_loss(output / "merged", score_dir)

    tokens = training_tokens(args.model, args.data_dir, args.max_length, args.epochs)
    print(
        f"\nmodel {args.model}; {args.train_examples or 'all'} train / {args.eval_examples or 'all'} eval "
        f"conversations ({tokens:,} training tokens); {args.epochs} epoch(s), lr {args.learning_rate}, "
        f"max_length {args.max_length}, LoRA dropout {args.lora_dropout}\n"
    )
    table({name: results[name] for name in ("trl-defaults", "trl-packed", "ours")}, tokens, None)
    ours = tokens / results["ours"]["seconds"]
    print()
    for name, target in TARGETS.items():
        ratio = ours / (tokens / results[name]["seconds"])
        loss = "no worse" if results["ours"]["eval_loss"] <= results[name]["eval_loss"] else "WORSE"
        verdict = "met" if ratio >= target else "NOT met"
        print(
            f"ours ÷ {LABELS[name]}: {ratio:.2f}× tokens/s (target ≥ {target}×: {verdict}); "
            f"eval loss {results['ours']['eval_loss']:.4f} vs {results[name]['eval_loss']:.4f}: {loss}"
        )
    if not args.skip_fsdp:
        print()
        table({name: results[name] for name in ("ours-ddp", "ours-fsdp")}, tokens, "ours-ddp")
        fsdp = results["ours-fsdp"]
        fractions = fsdp["local_parameter_fraction"]
        print(f"\nFSDP run: sharding {fsdp['sharding']}, local parameter fraction per rank {fractions}")
    print(f"work directory: {work}")


if __name__ == "__main__":
    main()
