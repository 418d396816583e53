"""Benchmark the data preparation stage against two common baselines.

What is measured: the time and peak memory needed to turn one JSONL file of
topic/question/answer records into Parquet, by three contenders:

* ``ours``: ``components.data.prepare.prepare`` (parse, validate,
  normalise to chat messages, deduplicate, split into train/eval Parquet with
  zstd, write rejects.jsonl and stats.json);
* ``datasets``: Hugging Face ``datasets.load_dataset("json")`` into a fresh
  cache, then ``Dataset.to_parquet``;
* ``pandas``: ``pandas.read_json(lines=True)`` then ``DataFrame.to_parquet``.

The baselines do less work than our stage (no validation, normalisation,
deduplication or split), so the comparison is conservative for us.

The input file is generated deterministically (``random.Random(seed)``), so
every run with the same ``--records`` and ``--seed`` times the same bytes.

Each contender runs in its own fresh Python process. Peak RSS
(``ru_maxrss``) is a high-water mark that never goes down within a process, so
running the contenders one after another in one process would let the first
one's peak hide the others'; separate processes also keep one contender's
allocator state, imported modules and warmed caches from helping or hurting
the next. The child measures wall time around the work only (imports are
excluded) and reads its own ``ru_maxrss`` when the work is done, which does
include the interpreter and the imported libraries. The operating system's page
cache is shared: the freshly written input is typically cached for all three.

Usage: ``python benchmarks/prep_bench.py [--records N] [--large] [--workdir DIR] [--keep]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_RECORDS = 1_000_000
LARGE_RECORDS = 3_000_000
WRITE_BATCH = 50_000
SENTENCE_WORDS = 12

TARGET_VS_DATASETS = 3.0
TARGET_VS_PANDAS = 2.0
TARGET_RSS_MB = 500.0

TOPICS: dict[str, tuple[str, ...]] = {
    "car maintenance": ("oil", "tyre", "brake", "filter", "battery", "coolant", "engine", "pressure", "spark", "belt"),
    "first aid": ("bandage", "wound", "burn", "pulse", "airway", "splint", "bleeding", "shock", "casualty", "pressure"),
    "knots": ("bowline", "hitch", "loop", "rope", "cleat", "reef", "sheet", "bend", "line", "tension"),
    "gardening": ("soil", "compost", "seedling", "pruning", "mulch", "watering", "roots", "frost", "weeds", "bed"),
    "cooking": ("pan", "simmer", "dough", "oven", "seasoning", "knife", "stock", "sauce", "heat", "rest"),
    "home repair": ("drill", "plaster", "hinge", "leak", "valve", "grout", "screw", "stud", "sealant", "joint"),
    "cycling": ("chain", "gear", "saddle", "puncture", "derailleur", "brake", "spoke", "cadence", "tube", "lever"),
    "camping": ("tent", "stove", "tarp", "stake", "sleeping", "water", "fire", "map", "pack", "shelter"),
    "bike repair": ("cable", "bearing", "hub", "rim", "pedal", "crank", "cassette", "tyre", "valve", "wrench"),
    "sewing": ("needle", "thread", "seam", "hem", "bobbin", "stitch", "fabric", "pattern", "zip", "button"),
}
COMMON_WORDS: tuple[str, ...] = (
    "the",
    "a",
    "you",
    "should",
    "check",
    "before",
    "after",
    "make",
    "sure",
    "it",
    "is",
    "carefully",
    "then",
    "slowly",
    "always",
    "never",
    "when",
    "because",
    "keep",
    "hold",
    "use",
    "small",
    "firm",
    "clean",
    "dry",
    "replace",
    "tighten",
    "loosen",
    "again",
    "each",
    "time",
    "side",
    "end",
    "until",
    "both",
    "hands",
    "safe",
    "enough",
    "good",
    "first",
    "second",
    "step",
    "remove",
    "place",
    "with",
    "without",
    "over",
    "under",
)
QUESTION_OPENERS: tuple[tuple[str, ...], ...] = (
    ("How", "do", "I"),
    ("What", "is", "the", "best", "way", "to"),
    ("Why", "does", "my"),
    ("When", "should", "I"),
    ("Can", "you", "explain", "how", "to"),
    ("What", "should", "I", "do", "if", "the"),
)


@dataclass(frozen=True)
class Measurement:
    """What one child process reports about its contender."""

    name: str
    seconds: float
    records: int
    rss_mb: float

    @property
    def throughput(self) -> float:
        return self.records / self.seconds


# --- input generation -------------------------------------------------------


def _question(rng: random.Random, pool: list[str], number: int) -> str:
    opener = rng.choice(QUESTION_OPENERS)
    reference = ("(ref", f"{number})")
    filler = rng.randint(8, 20) - len(opener) - len(reference)
    return " ".join((*opener, *rng.choices(pool, k=max(filler, 1)), *reference)) + "?"


def _answer(rng: random.Random, pool: list[str]) -> str:
    words = rng.choices(pool, k=rng.randint(30, 80))
    sentences = (" ".join(words[i : i + SENTENCE_WORDS]) for i in range(0, len(words), SENTENCE_WORDS))
    return " ".join(s[:1].upper() + s[1:] + "." for s in sentences)


def generate_input(path: Path, records: int, seed: int) -> None:
    """Write ``records`` distinct JSONL records to ``path``, deterministically."""
    rng = random.Random(seed)
    # Topic words appear three times so answers stay recognisably on topic.
    pools = {topic: [*words, *words, *words, *COMMON_WORDS] for topic, words in TOPICS.items()}
    topics = list(TOPICS)
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, records, WRITE_BATCH):
            batch = []
            for number in range(start, min(start + WRITE_BATCH, records)):
                topic = rng.choice(topics)
                record = {
                    "topic": topic,
                    "question": _question(rng, pools[topic], number),
                    "answer": _answer(rng, pools[topic]),
                }
                batch.append(json.dumps(record))
            out.write("\n".join(batch) + "\n")


# --- contenders (run inside the child process) ------------------------------


def _run_ours(input_path: Path, out_dir: Path) -> tuple[int, float]:
    from components.data.prepare import prepare

    start = time.perf_counter()
    result = prepare(str(input_path), out_dir / "prepared")
    seconds = time.perf_counter() - start
    rows = result.stats.train_rows + result.stats.eval_rows
    if rows != result.stats.records:
        print(f"note: ours read {result.stats.records} records but wrote {rows} rows", file=sys.stderr)
    return result.stats.records, seconds


def _run_datasets(input_path: Path, out_dir: Path) -> tuple[int, float]:
    import datasets

    datasets.disable_progress_bars()
    start = time.perf_counter()
    dataset = datasets.load_dataset("json", data_files=str(input_path), split="train", cache_dir=str(out_dir / "cache"))
    dataset.to_parquet(str(out_dir / "datasets.parquet"))
    return dataset.num_rows, time.perf_counter() - start


def _run_pandas(input_path: Path, out_dir: Path) -> tuple[int, float]:
    import pandas
    import pyarrow.parquet  # noqa: F401  (imported here so to_parquet's lazy import is not timed)

    start = time.perf_counter()
    frame = pandas.read_json(input_path, lines=True)
    frame.to_parquet(out_dir / "pandas.parquet")
    return len(frame), time.perf_counter() - start


CONTENDERS: dict[str, Callable[[Path, Path], tuple[int, float]]] = {
    "ours": _run_ours,
    "datasets": _run_datasets,
    "pandas": _run_pandas,
}


def run_one(name: str, input_path: Path, out_dir: Path) -> None:
    """Child mode: run one contender and print its measurement as one JSON line."""
    records, seconds = CONTENDERS[name](input_path, out_dir)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"name": name, "seconds": seconds, "records": records, "rss_mb": rss_mb}), flush=True)


# --- parent: orchestration and report ---------------------------------------


def measure(name: str, input_path: Path, workdir: Path) -> Measurement:
    """Run contender ``name`` in a fresh interpreter and parse its report."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    script = str(Path(__file__).resolve())
    command = [sys.executable, script, "--run-one", name, "--input", str(input_path), "--out", str(out_dir)]
    completed = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"contender {name!r} failed with exit status {completed.returncode}")
    last_line = completed.stdout.strip().splitlines()[-1]
    return Measurement(**json.loads(last_line))


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def report(results: dict[str, Measurement]) -> str:
    """The Markdown table of all contenders followed by the target checks."""
    lines = [
        "| contender | records | seconds | records/s | peak RSS MB |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in results.values():
        lines.append(f"| {m.name} | {m.records:,} | {m.seconds:.2f} | {m.throughput:,.0f} | {m.rss_mb:,.0f} |")
    ours = results["ours"]
    vs_datasets = ours.throughput / results["datasets"].throughput
    vs_pandas = ours.throughput / results["pandas"].throughput
    lines += [
        "",
        "| check | value | target | verdict |",
        "|---|---:|---:|---|",
        f"| ours ÷ datasets throughput | {vs_datasets:.2f}× | ≥ {TARGET_VS_DATASETS:g}× | "
        f"{_verdict(vs_datasets >= TARGET_VS_DATASETS)} |",
        f"| ours ÷ pandas throughput | {vs_pandas:.2f}× | ≥ {TARGET_VS_PANDAS:g}× | "
        f"{_verdict(vs_pandas >= TARGET_VS_PANDAS)} |",
        f"| ours peak RSS | {ours.rss_mb:,.0f} MB | < {TARGET_RSS_MB:g} MB | {_verdict(ours.rss_mb < TARGET_RSS_MB)} |",
    ]
    return "\n".join(lines)


def benchmark(records: int, seed: int, workdir: Path) -> None:
    input_path = workdir / f"input-{records}.jsonl"
    start = time.perf_counter()
    generate_input(input_path, records, seed)
    size_mb = input_path.stat().st_size / 1e6
    print(
        f"input: {input_path} ({records:,} records, {size_mb:,.1f} MB, generated in "
        f"{time.perf_counter() - start:.1f} s)"
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; each contender runs in its own process; "
        "seconds exclude interpreter start-up and imports; peak RSS includes them"
    )
    results: dict[str, Measurement] = {}
    for name in CONTENDERS:
        print(f"running {name} ...", flush=True)
        results[name] = measure(name, input_path, workdir)
    print()
    print(report(results))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=None, help=f"records to generate (default {DEFAULT_RECORDS:,})")
    parser.add_argument("--large", action="store_true", help=f"generate {LARGE_RECORDS:,} records")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="directory for the input and outputs, created if missing and never removed "
        "(default: a fresh temp dir under /tmp)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the input generator")
    parser.add_argument("--run-one", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.records is not None and args.large:
        parser.error("--records and --large are mutually exclusive")
    if args.records is not None and args.records < 1:
        parser.error("--records must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_one:
        run_one(args.run_one, args.input, args.out)
        return
    records = args.records or (LARGE_RECORDS if args.large else DEFAULT_RECORDS)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        benchmark(records, args.seed, args.workdir)
        return
    workdir = Path(tempfile.mkdtemp(prefix="prep-bench-", dir="/tmp"))
    try:
        benchmark(records, args.seed, workdir)
    finally:
        if args.keep:
            print(f"kept work directory {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
