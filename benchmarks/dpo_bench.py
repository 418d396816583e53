"""Preference tuning from pairs to trained steps: TRL's own DPOTrainer against our path, on the same pairs, in one run.

On generated preference pairs (a prompt of one or three user turns, a chosen answer of about 120 words and a
rejected one of about 30; SmolLM2-135M-Instruct's tokenizer and chat template), at two sizes:

1. **Preparation**, pairs per second: (a) TRL's own, what ``DPOTrainer`` does to text pairs before its first step
   (the chat template applied, then tokenised; ``dataset_num_proc`` = the CPUs), timed inside its process;
   (b) ours, the tokenise step with one worker per CPU, a process of its own, start-up included
   (``trainer.preference_rows``, whose rows ``tests/test_preference_rows.py`` holds equal to TRL's).
2. **Pairs to ``--steps`` optimizer steps**, one process, SmolLM2-135M LoRA: (a) a script a competent user writes
   with TRL (load the Parquet the data step wrote, ``DPOTrainer`` with a ``LoraConfig``, ``train``) against (b)
   ours (the tokenise step, then ``python -m trainer --objective dpo``), both with the same batch, length, beta,
   learning rate and LoRA settings, each in its own process, start-up included.

    python benchmarks/dpo_bench.py                          # 1,000 and 10,000 pairs
    python benchmarks/dpo_bench.py --small 200 --large 1000 --steps 2   # a quick look

Prints the tables and writes ``--results`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

WORDS = (
    "rope knot loop bowline hitch tent stake bread flour yeast oven camera lens shutter bicycle chain brake "
    "wheel water filter stove fuel map compass trail weather rain wind sun layer boot sock blister bandage"
).split()
MAX_LENGTH = 256
BATCH = 4
LORA_R = 16
LEARNING_RATE = 5e-6
BETA = 0.1
# On a CPU: TRL's configs default to bf16 and gradient checkpointing, which our run on a CPU (and LoRA) leaves off,
# so both sides do the same work.
DEVICE = {"use_cpu": True, "bf16": False}


def pair(rng: random.Random, number: int) -> dict:
    turns = 1 if number % 2 == 0 else 3
    prompt = []
    for turn in range(turns):
        prompt.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=12)) + "?"})
        if turn < turns - 1:
            prompt.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=20)) + "."})
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": " ".join(rng.choices(WORDS, k=120)) + "."}],
        "rejected": [{"role": "assistant", "content": " ".join(rng.choices(WORDS, k=30)) + "."}],
    }


def run(command: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return time.monotonic() - started, done.stdout


def prepared_pairs(work: Path, count: int) -> Path:
    """The data step's Parquet of ``count`` generated pairs (all in train)."""
    rng = random.Random(count)
    jsonl = work / f"pairs-{count}.jsonl"
    jsonl.write_text("".join(json.dumps(pair(rng, number)) + "\n" for number in range(count)))
    data_dir = work / f"data-{count}"
    command = [sys.executable, "-m", "components.data.stage", "--input", str(jsonl), "--output-dir", str(data_dir)]
    run([*command, "--objective", "dpo", "--eval-fraction", "0"])
    return data_dir


def trls_preparation(data_dir: Path, model: Path, workers: int) -> float:
    """Seconds of TRL's own preparation of the train split's text pairs, as DPOTrainer runs it in every rank."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from common.run_layout import TRAIN_SPLIT

    pairs = Dataset.from_parquet(str(data_dir / TRAIN_SPLIT)).remove_columns(["id"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    args = DPOConfig(
        output_dir=str(data_dir / "trl"), max_length=MAX_LENGTH, dataset_num_proc=workers, report_to=[], **DEVICE
    )
    started = time.monotonic()
    DPOTrainer._prepare_dataset(None, pairs, tokenizer, args, "train")  # its method reads nothing of the trainer
    return time.monotonic() - started


def tokenise(data_dir: Path, model: Path, cache: Path, workers: int) -> tuple[float, Path]:
    command = [sys.executable, "-m", "components.tokenise.stage", "--data-dir", str(data_dir), "--model", str(model)]
    command += ["--cache-dir", str(cache), "--workers", str(workers), "--objective", "dpo"]
    seconds, output = run([*command, "--max-length", str(MAX_LENGTH)])
    return seconds, Path(output.strip().splitlines()[-1].removeprefix("tokens -> "))


TRL_SCRIPT = """
import sys
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer

data, model, output, steps, workers = sys.argv[1:6]
pairs = Dataset.from_parquet(data + "/train.parquet").remove_columns(["id"])
args = DPOConfig(
    output_dir=output, max_steps=int(steps), per_device_train_batch_size={batch}, learning_rate={lr}, beta={beta},
    max_length={max_length}, dataset_num_proc=int(workers), logging_steps=1, save_strategy="no", report_to=[],
    gradient_checkpointing=False, **{device},
)
lora = LoraConfig(r={lora_r}, lora_alpha={lora_r}, target_modules="all-linear", task_type="CAUSAL_LM")
DPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=AutoTokenizer.from_pretrained(model),
           peft_config=lora).train()
""".format(batch=BATCH, lr=LEARNING_RATE, beta=BETA, max_length=MAX_LENGTH, lora_r=LORA_R, device=DEVICE)


def trls_run(data_dir: Path, model: Path, output: Path, steps: int, workers: int) -> float:
    return run([sys.executable, "-c", TRL_SCRIPT, str(data_dir), str(model), str(output), str(steps), str(workers)])[0]


def our_run(data_dir: Path, model: Path, work: Path, steps: int, workers: int) -> tuple[float, float]:
    """The tokenise step into a fresh cache, then one trainer process: (tokenise seconds, total seconds)."""
    tokenise_seconds, tokens_dir = tokenise(data_dir, model, work / "cache", workers)
    command = [sys.executable, "-m", "trainer", "--model", str(model), "--tokens-dir", str(tokens_dir)]
    command += ["--output-dir", str(work / "out"), "--objective", "dpo", "--method", "lora", "--lora-r", str(LORA_R)]
    command += ["--lora-alpha", str(LORA_R), "--max-steps", str(steps), "--per-device-batch-size", str(BATCH)]
    command += ["--max-length", str(MAX_LENGTH), "--learning-rate", str(LEARNING_RATE), "--dpo-beta", str(BETA)]
    command += ["--save-steps", "1000", "--logging-steps", "1", "--no-compile-blocks"]
    train_seconds = run(command)[0]
    return tokenise_seconds, tokenise_seconds + train_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--results", type=Path, default=REPO_ROOT / "benchmarks/results/dpo_bench.json")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: the system's)")
    args = parser.parse_args()
    from components.local_model import local_base_model

    model = local_base_model()
    results: dict = {"model": "SmolLM2-135M-Instruct", "cpus": len(os.sched_getaffinity(0)), "sizes": {}}
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        for count in (args.small, args.large):
            data_dir = prepared_pairs(work, count)
            trl_prepare = trls_preparation(data_dir, model, args.workers)
            trl_total = trls_run(data_dir, model, work / f"trl-{count}", args.steps, args.workers)
            our_prepare, our_total = our_run(data_dir, model, work / f"ours-{count}", args.steps, args.workers)
            results["sizes"][count] = {
                "trl_preparation_s": trl_prepare,
                "our_tokenise_s": our_prepare,
                "trl_pairs_to_steps_s": trl_total,
                "our_pairs_to_steps_s": our_total,
            }
            print(f"{count} pairs: {json.dumps(results['sizes'][count])}", flush=True)
    print(
        f"\n| pairs | TRL's own preparation (pairs/s) | tokenise step, start-up included (pairs/s) | ours is | "
        f"pairs to {args.steps} steps, TRL's own (s) | ours (s) | ours is |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    for count, row in results["sizes"].items():
        print(
            f"| {count} | {count / row['trl_preparation_s']:.0f} | {count / row['our_tokenise_s']:.0f} | "
            f"{row['trl_preparation_s'] / row['our_tokenise_s']:.2f}x | {row['trl_pairs_to_steps_s']:.0f} | "
            f"{row['our_pairs_to_steps_s']:.0f} | {row['trl_pairs_to_steps_s'] / row['our_pairs_to_steps_s']:.2f}x |"
        )
    print(
        f"\n(TRL's preparation timed inside its process; the tokenise step as a process of its own, start-up "
        f"included. {args.workers} CPUs, SmolLM2-135M LoRA r {LORA_R}, batch {BATCH}, max_length {MAX_LENGTH})"
    )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
