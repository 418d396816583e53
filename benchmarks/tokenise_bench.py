"""The data path at the sizes users bring: the tokenise step against the per-rank path it replaced, in one run.

On generated conversations of the shape people fine-tune on (half single-turn, half 4 to 6 assistant turns,
about 400 tokens each; SmolLM2's tokenizer and chat template):

1. Tokenise throughput, conversations per second, on the same ``--compare`` conversations:
   (a) today's per-rank path: each conversation tokenised alone with its assistant mask, then TRL's own
       preparation (labels, packing), as every rank did it (``tests/todays_path.py``): one process per CPU
       started together, each over every conversation, as a run of that many ranks paid before its first step;
       and, for reference, one such process alone on the machine;
   (b) TRL's own preparation of the ``messages`` with ``dataset_num_proc`` = the CPUs (it renders and tokenises
       the conversations itself; with no ``{% generation %}`` markers in the template it cannot mask them);
   (c) ours: the tokenise step with one worker per CPU.
2. Time from ``torchrun ... python -m trainer`` to its first optimizer step, 2 ranks, SmolLM2-135M LoRA, with the
   rows of ``--small`` and of ``--large`` conversations in the cache.
3. Resident anonymous memory per rank (page cache not counted: the memory-mapped rows are shared, reclaimable
   file pages) at ``--huge`` conversations against ``--small``: what the data adds above the model.
4. The whole data path at ``--huge`` conversations: JSONL -> prepare -> tokenise, each step's time and peak
   resident memory (the tokenise step's with its workers).

    python benchmarks/tokenise_bench.py                                # the issue's sizes: 2k, 200k, 1M
    python benchmarks/tokenise_bench.py --large 20000 --huge 50000     # a quick look

Prints the tables and writes ``--results`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(1, str(REPO_ROOT / "tests"))

WORDS = (
    "rope knot loop bowline hitch tent stake bread flour yeast oven camera lens shutter bicycle chain brake "
    "wheel water filter stove fuel map compass trail weather rain wind sun layer boot sock blister bandage"
).split()
FIRST_STEP = re.compile(r"^step 1/")
EVAL_ROWS = 20


def conversation(rng: random.Random, number: int) -> dict:
    """~400 tokens: half one question and answer, half 4 to 6 assistant turns."""
    turns = 1 if number % 2 == 0 else rng.randint(4, 6)
    words_per_turn = 280 // turns
    messages = [{"role": "system", "content": "You are a helpful outdoor skills assistant."}]
    for _ in range(turns):
        question = " ".join(rng.choices(WORDS, k=max(6, words_per_turn // 4)))
        answer = " ".join(rng.choices(WORDS, k=words_per_turn))
        messages += [{"role": "user", "content": f"{question}?"}, {"role": "assistant", "content": f"{answer}."}]
    return {"messages": messages}


def write_jsonl(path: Path, count: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for number in range(count):
            handle.write(json.dumps(conversation(rng, number)) + "\n")
    return path


class PeakMemory:
    """The peak, over a process and its children, of their summed resident memory (``RssAnon`` only with
    ``anonymous``: what the page cache does not hold), sampled every 0.2 s; per process too."""

    def __init__(self, pid: int, anonymous: bool = False) -> None:
        self.pid, self.anonymous = pid, anonymous
        self.total = 0
        self.per_process: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        pids, frontier = [self.pid], [self.pid]
        while frontier:
            pid = frontier.pop()
            for children in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    found = [int(child) for child in children.read_text().split()]
                except OSError:
                    continue
                pids += found
                frontier += found
        return pids

    def _rss(self, pid: int) -> int:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return 0
        key = "RssAnon:" if self.anonymous else "VmRSS:"
        line = next((line for line in status.splitlines() if line.startswith(key)), None)
        return int(line.split()[1]) * 1024 if line else 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            sizes = {pid: self._rss(pid) for pid in self._tree()}
            self.total = max(self.total, sum(sizes.values()))
            for pid, size in sizes.items():
                self.per_process[pid] = max(self.per_process.get(pid, 0), size)
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def timed(command: list[str], env: dict | None = None, anonymous: bool = False) -> tuple[float, PeakMemory, str]:
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    peak = PeakMemory(process.pid, anonymous)
    output = process.communicate()[0].decode()
    peak.stop()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return time.monotonic() - started, peak, output


def prepare(jsonl: Path, data_dir: Path) -> tuple[float, int]:
    seconds, peak, _ = timed(
        [sys.executable, "-m", "components.data.stage", "--input", str(jsonl), "--output-dir", str(data_dir)]
    )
    return seconds, peak.total


def tokenise(data_dir: Path, model: Path, cache: Path, workers: int, eval_max_rows: int) -> tuple[float, dict, Path]:
    """The step's seconds, its peak memory (summed, and each process's: what the memory check's constants assume)
    and the entry it wrote."""
    command = [sys.executable, "-m", "components.tokenise.stage", "--data-dir", str(data_dir), "--model", str(model)]
    command += ["--cache-dir", str(cache), "--workers", str(workers), "--eval-max-rows", str(eval_max_rows)]
    seconds, peak, output = timed(command)
    processes = sorted((size for size in peak.per_process.values() if size > 100 << 20), reverse=True)
    memory = {"peak_rss": peak.total, "peak_rss_per_process": processes}
    return seconds, memory, Path(output.strip().splitlines()[-1].removeprefix("tokens -> "))


def todays_rank(data_dir: Path, model: Path) -> None:
    """One rank of today's path, in its own process: ready once imported, then on "go" (stdin) it tokenises and
    prepares the whole train split, as every rank did, and prints the seconds that took."""
    from todays_path import tokenise_split, trl_prepared
    from transformers import AutoTokenizer

    from trainer import data
    from trainer.config import TrainConfig

    tokenizer = AutoTokenizer.from_pretrained(model)
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    split = tokenise_split(data.load_split(data_dir, "train"), tokenizer, "assistant")
    trl_prepared(model, split, tokenizer, TrainConfig(model=str(model)))
    print(time.monotonic() - started, flush=True)


def todays_ranks(data_dir: Path, model: Path, ranks: int) -> float:
    """Seconds until every one of ``ranks`` ranks of today's path, started together, had prepared its data."""
    command = [sys.executable, __file__, "--todays-rank", str(data_dir), str(model)]
    processes = [
        subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(ranks)
    ]
    for process in processes:
        if not any(line.strip() == "ready" for line in process.stdout):
            raise SystemExit("a rank of today's path failed to start")
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    seconds = [float(process.communicate()[0].strip().splitlines()[-1]) for process in processes]
    return max(seconds)


def throughput(data_dir: Path, model: Path, cache: Path, workers: int, repeats: int) -> dict:
    """Conversations per second of the three ways to tokenise the same split: each the best of ``repeats`` runs,
    taken in turn, so a burst of load on a shared host does not decide the ratios."""
    import pyarrow.parquet as pq
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from common.run_layout import TOKENS_MANIFEST
    from components.tokenise.build import build
    from trainer import data
    from trainer.config import TrainConfig
    from trainer.token_cache import TokenSettings

    tokenizer = AutoTokenizer.from_pretrained(model)
    count = pq.ParquetFile(data.split_path(data_dir, "train")).metadata.num_rows
    config = TrainConfig(model=str(model))
    messages = Dataset.from_dict({"messages": data.load_split(data_dir, "train")["messages"]})
    arguments = SFTConfig(
        output_dir=str(cache / "trl"),
        max_length=config.max_length,
        packing=True,
        padding_free=True,
        dataset_num_proc=workers,
        use_cpu=True,
        report_to=[],
    )
    # The step also tokenises the whole eval split (eval_max_rows 0), so its rate counts those conversations too.
    settings = TokenSettings(config.max_length, config.loss_on, config.packing, eval_max_rows=0)
    rates: dict[str, list[float]] = {"today": [], "today_one_rank": [], "trl": [], "ours": []}
    for repeat in range(repeats):
        # As a run of `workers` ranks did it: each rank tokenised every conversation, all of them at once.
        rates["today"].append(count / todays_ranks(data_dir, model, workers))
        rates["today_one_rank"].append(count / todays_ranks(data_dir, model, 1))

        loaded = AutoModelForCausalLM.from_pretrained(model)
        started = time.monotonic()
        SFTTrainer(model=loaded, args=arguments, train_dataset=messages, processing_class=tokenizer)
        rates["trl"].append(count / (time.monotonic() - started))

        started = time.monotonic()
        tokens_dir, _ = build(data_dir, model, settings, cache / f"ours-{repeat}", workers)
        seconds = time.monotonic() - started
        manifest = json.loads((tokens_dir / TOKENS_MANIFEST).read_text())
        rates["ours"].append((manifest["train"]["conversations"] + manifest["eval"]["conversations"]) / seconds)
    return {
        "conversations": count,
        "workers": workers,
        "runs_per_second": rates,
        "per_second": {path: max(runs) for path, runs in rates.items()},
    }


def first_step(model: Path, tokens_dir: Path, output: Path) -> dict:
    """Seconds from starting torchrun (2 ranks) to the first optimizer step's line, and each rank's peak RssAnon."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "trainer"]
    command += ["--model", str(model), "--tokens-dir", str(tokens_dir), "--output-dir", str(output)]
    command += ["--max-steps", "3", "--logging-steps", "1", "--save-steps", "1000", "--per-device-batch-size", "1"]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = PeakMemory(process.pid, anonymous=True)
    seconds, lines = None, []
    for line in process.stdout:
        lines.append(line)
        if seconds is None and FIRST_STEP.match(line):
            seconds = time.monotonic() - started
    process.wait()
    peak.stop()
    if process.returncode or seconds is None:
        raise SystemExit("the trainer failed:\n" + "".join(lines[-40:]))
    ranks = sorted(size for pid, size in peak.per_process.items() if pid != process.pid and size > 200 << 20)
    return {"seconds": seconds, "rank_rss_anon_bytes": ranks[-2:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", type=int, default=10_000, help="conversations for the throughput table")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each path in the throughput table (best kept)")
    parser.add_argument("--small", type=int, default=2_000)
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument("--huge", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", type=Path, help="a directory to keep the files in (default: a temporary one)")
    parser.add_argument("--results", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "tokenise_bench.json")
    parser.add_argument("--todays-rank", nargs=2, type=Path, metavar=("DATA_DIR", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.todays_rank:
        todays_rank(*args.todays_rank)
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from components.local_model import local_base_model

    model = local_base_model()
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        results: dict = {"model": "SmolLM2-135M-Instruct", "cpus": len(os.sched_getaffinity(0))}
        data = {}
        for name in ("compare", "small", "large", "huge"):
            count = getattr(args, name)
            jsonl = write_jsonl(work / f"{name}.jsonl", count, seed=count)
            data[name] = work / f"{name}-data"
            seconds, peak = prepare(jsonl, data[name])
            jsonl.unlink()
            results.setdefault("prepare", {})[name] = {"conversations": count, "seconds": seconds, "peak_rss": peak}
            print(f"prepared {count} conversations in {seconds:.0f} s (peak {peak / 2**30:.2f} GiB)", flush=True)

        results["throughput"] = throughput(data["compare"], model, work / "compare-cache", args.workers, args.repeats)
        rates = results["throughput"]["per_second"]
        print(
            f"\ntokenise throughput, {results['throughput']['conversations']} conversations, {args.workers} CPUs, "
            f"best of {args.repeats} runs each\n"
            f"| path | conversations/s | ours is |\n| --- | --- | --- |\n"
            f"| (a) today's per-rank path, {args.workers} ranks at once (each tokenises every conversation, "
            f"then TRL's preparation) | {rates['today']:.0f} | {rates['ours'] / rates['today']:.2f}x |\n"
            f"| (a1) the same, one rank alone on the machine | {rates['today_one_rank']:.0f} | "
            f"{rates['ours'] / rates['today_one_rank']:.2f}x |\n"
            f"| (b) TRL's own preparation, dataset_num_proc={args.workers} (no masks) | {rates['trl']:.0f} | "
            f"{rates['ours'] / rates['trl']:.2f}x |\n"
            f"| (c) tokenise step, {args.workers} workers | {rates['ours']:.0f} | 1.00x |",
            flush=True,
        )

        steps = {}
        for name in ("small", "large", "huge"):
            # A small eval cap: the trainer evaluates once at its end, after what is measured here.
            seconds, memory, tokens_dir = tokenise(data[name], model, work / "cache", args.workers, EVAL_ROWS)
            results.setdefault("tokenise", {})[name] = {"seconds": seconds, **memory, "dir": str(tokens_dir)}
            steps[name] = first_step(model, tokens_dir, work / f"train-{name}")
            results.setdefault("first_step", {})[name] = steps[name]
            print(f"{name}: tokenised in {seconds:.0f} s; first step after {steps[name]['seconds']:.1f} s", flush=True)

        small, large, huge = (steps[name] for name in ("small", "large", "huge"))
        extra = max(huge["rank_rss_anon_bytes"]) - max(small["rank_rss_anon_bytes"])
        results["checks"] = {
            "throughput_vs_today": rates["ours"] / rates["today"],
            "throughput_vs_today_one_rank": rates["ours"] / rates["today_one_rank"],
            "first_step_large_vs_small": large["seconds"] / small["seconds"],
            "rank_rss_anon_above_small_bytes": extra,
        }
        print(
            f"\n| measure | {args.small} | {args.large} | {args.huge} | target |\n| --- | --- | --- | --- | --- |\n"
            f"| trainer start to first optimizer step, 2 ranks (s) | {small['seconds']:.1f} | {large['seconds']:.1f} | "
            f"{huge['seconds']:.1f} | {args.large}: within 1.2x of {args.small} "
            f"({large['seconds'] / small['seconds']:.2f}x) |\n"
            f"| RssAnon per rank, peak (GiB) | {max(small['rank_rss_anon_bytes']) / 2**30:.2f} | "
            f"{max(large['rank_rss_anon_bytes']) / 2**30:.2f} | {max(huge['rank_rss_anon_bytes']) / 2**30:.2f} | "
            f"{args.huge}: at most 1 GiB above {args.small} ({extra / 2**30:+.2f} GiB) |",
            flush=True,
        )
        prepared, tokenised = results["prepare"]["huge"], results["tokenise"]["huge"]
        print(
            f"\nwhole data path, {args.huge} conversations\n| step | seconds | peak resident memory (GiB) |\n"
            f"| --- | --- | --- |\n| prepare (JSONL -> Parquet) | {prepared['seconds']:.0f} | "
            f"{prepared['peak_rss'] / 2**30:.2f} |\n| tokenise ({args.workers} workers) | {tokenised['seconds']:.0f} | "
            f"{tokenised['peak_rss'] / 2**30:.2f} (per process: "
            f"{', '.join(f'{size / 2**30:.2f}' for size in tokenised['peak_rss_per_process'])}) |\n"
            f"| total | {prepared['seconds'] + tokenised['seconds']:.0f} | |",
            flush=True,
        )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
