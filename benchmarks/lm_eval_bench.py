"""What the standard benchmarks cost per model, and what scoring in the evaluation step saves.

Ours: the evaluation stage's ``benchmarks.score`` on the model the stage has already loaded (it loads
each model once for the held-out loss, the answers and the benchmarks). Baseline: lm-eval's own
command line (``lm-eval run --model hf``), which a competent user would run after training, loading
the model itself. Both score the same task with the same batch size, in the same run, on this
machine's CPU with SmolLM2-135M-Instruct; the scores must agree exactly.

The Hub's arc_easy and hellaswag cannot be downloaded here, so the tasks are synthetic with their
shapes: arc-like (a 20-word question, four 4-word answers) and hellaswag-like (a 45-word context,
four 20-word endings), at two sizes, to show the cost grows with the requests and nothing else.

    python benchmarks/lm_eval_bench.py [--docs 100 200] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

BATCH = 16
# name -> (words in the context, words per choice)
SHAPES = {"arc_like": (20, 4), "hellaswag_like": (45, 20)}
TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {name}.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""
WORDS = (
    "the a tyre oil knot fire water bread engine brake rope camp map stove kettle glove ladder hammer nail "
    "wall door garden seed soil rain wind sun shade boot sock coat tent pan lid salt sugar flour egg milk"
).split()


def write_task(directory: Path, name: str, docs: int, seed: int) -> Path:
    """A task directory of ``docs`` synthetic questions shaped like ``name`` says."""
    context_words, choice_words = SHAPES[name]
    rng = random.Random(seed)
    task_dir = directory / f"{name}_{docs}"
    task_dir.mkdir()
    (task_dir / f"{name}.yaml").write_text(TASK_YAML.format(name=name))
    with open(task_dir / f"{name}.jsonl", "w") as out:
        for _ in range(docs):
            context = " ".join(rng.choices(WORDS, k=context_words))
            choices = [" ".join(rng.choices(WORDS, k=choice_words)) for _ in range(4)]
            out.write(json.dumps({"context": context, "choices": choices, "answer": rng.randrange(4)}) + "\n")
    return task_dir


def ours(model_dir: Path, task_dir: Path) -> tuple[float, float]:
    """(seconds, acc_norm) of the stage's scoring; the model is loaded beforehand, as the stage has it."""
    from components.benchmark_tasks.tasks import BenchmarkSettings, load_tasks, score
    from components.evaluate.models import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir)
    tasks = load_tasks([f"./{task_dir.name}"], task_dir.parent, limit=0)  # a directory inside the root
    started = time.perf_counter()
    (entry,) = score(model, tokenizer, tasks, BenchmarkSettings(0, 0, BATCH)).values()
    return time.perf_counter() - started, entry["value"]


def baseline(model_dir: Path, task_dir: Path, name: str, output: Path) -> tuple[float, float]:
    """(seconds, acc_norm) of lm-eval's command line, model loading included: what it costs a user."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
         f"pretrained={model_dir},dtype=float32", "--tasks", name, "--include_path", str(task_dir),
         "--device", "cpu", "--batch_size", str(BATCH), "--output_path", str(output)],
        cwd=task_dir, check=True, capture_output=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    (results,) = output.rglob("results_*.json")
    return seconds, json.loads(results.read_text())["results"][name]["acc_norm,none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--json", type=Path, help="write the measurements here too")
    args = parser.parse_args()
    from components.local_model import local_base_model

    model_dir = local_base_model()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in SHAPES:
            for docs in args.docs:
                task_dir = write_task(Path(scratch), name, docs, seed=docs)
                our_seconds, our_score = ours(model_dir, task_dir)
                cli_seconds, cli_score = baseline(model_dir, task_dir, name, Path(scratch) / f"out-{name}-{docs}")
                assert abs(our_score - cli_score) < 1e-9, (name, docs, our_score, cli_score)
                rows.append({"task": name, "docs": docs, "requests": 4 * docs, "ours_s": our_seconds,
                             "lm_eval_cli_s": cli_seconds, "acc_norm": our_score})  # fmt: skip
    print("| task | docs | requests | ours s | lm-eval CLI s | CLI ÷ ours | ours requests/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['task']} | {row['docs']} | {row['requests']} | {row['ours_s']:.1f} | {row['lm_eval_cli_s']:.1f} "
            f"| {row['lm_eval_cli_s'] / row['ours_s']:.2f}× | {row['requests'] / row['ours_s']:.1f} |"
        )
    per_request = {name: [row["ours_s"] / row["requests"] for row in rows if row["task"] == name] for name in SHAPES}
    growth = {name: (max(args.docs) / min(args.docs), times[-1] * max(args.docs) / (times[0] * min(args.docs)))
              for name, times in per_request.items()}  # fmt: skip
    for name, (size_ratio, time_ratio) in growth.items():
        print(f"{name}: {size_ratio:.1f}× the documents took {time_ratio:.2f}× the time")
    default_set = 4000 * (per_request["arc_like"][-1] + per_request["hellaswag_like"][-1])
    print(
        f"the default set (arc_easy + hellaswag, 1000 documents each) at this rate: {default_set / 60:.1f} min "
        "per model"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "default_set_minutes_per_model": default_set / 60}, indent=2))


if __name__ == "__main__":
    main()
