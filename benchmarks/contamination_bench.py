"""Checking training rows for 13-word overlaps with a benchmark: lm-eval's own decontamination code against ours.

Generated text at two sizes of training data, checked against a hellaswag-sized task (10,042 documents of about
120 words: hellaswag's validation split), 1% of the training rows each holding a sentence of a task document:

(a) lm-eval's ``Janitor`` as its decontamination uses it, what a competent user would run: every task document's
    13-grams registered in its set of strings (``register_contaminant``), then each training row's normalised
    13-grams (``word_ngrams(normalize_string(row), 13)``) looked up in that set;
(b) ours, ``components.data.contamination.NgramIndex``: the same normalisation and n-grams, hashed into arrays.

Each method runs in a process of its own, which reads the rows in batches of 10,000 as a data step would: the
seconds counted are the check's alone (the rows are generated outside the clock), the peak memory the process's.
Both must find the same rows.

    python benchmarks/contamination_bench.py                      # 100,000 and 1,000,000 rows
    python benchmarks/contamination_bench.py --sizes 20000 100000  # a quick look

Prints the table and writes ``--results`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

TASK_DOCUMENTS = 10_042  # hellaswag's validation split
TASK_WORDS = 120
ROW_WORDS = 200
PLANTED_EVERY = 100  # one training row in a hundred holds a task document's sentence
BATCH = 10_000
VOCABULARY = 50_000


def words(count: int, generator) -> list[str]:
    """Zipf-like word frequencies over a fixed vocabulary, so that common words repeat as in real text."""
    ranks = generator.zipf(1.2, size=count) % VOCABULARY
    return [f"w{rank}" for rank in ranks]


def task_documents() -> list[str]:
    import numpy as np

    generator = np.random.default_rng(1)
    return [" ".join(words(TASK_WORDS, generator)) for _ in range(TASK_DOCUMENTS)]


def training_batches(rows: int):
    """The training rows, ``BATCH`` at a time; every ``PLANTED_EVERY``-th holds 20 words of a task document, written
    in capitals and with commas (which the normalisation removes)."""
    import numpy as np

    generator = np.random.default_rng(2)
    documents = task_documents()
    for start in range(0, rows, BATCH):
        batch = []
        for row in range(start, min(rows, start + BATCH)):
            text = words(ROW_WORDS, generator)
            if row % PLANTED_EVERY == 0:
                planted = documents[row % TASK_DOCUMENTS].split()[10:30]
                text[50:50] = [word.upper() + "," for word in planted]
            batch.append(" ".join(text))
        yield batch


def run_lm_eval(rows: int) -> dict:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from lm_eval.decontamination.janitor import Janitor, word_ngrams  # says its C++ module is missing
    janitor = Janitor(ngram_n=13)
    seconds = 0.0
    start = time.perf_counter()
    for document in task_documents():
        janitor.register_contaminant(document)
    seconds += time.perf_counter() - start
    found = 0
    for batch in training_batches(rows):
        start = time.perf_counter()
        dirt = janitor.dirt_ngrams
        found += sum(any(ngram in dirt for ngram in word_ngrams(janitor.normalize_string(text), 13)) for text in batch)
        seconds += time.perf_counter() - start
    return {"seconds": seconds, "rows_found": found}


def run_ours(rows: int) -> dict:
    import pyarrow as pa

    from components.data.contamination import NgramIndex

    documents = task_documents()
    start = time.perf_counter()
    index = NgramIndex.of([pa.array(documents[i : i + BATCH]) for i in range(0, len(documents), BATCH)])
    seconds = time.perf_counter() - start
    found = 0
    for batch in training_batches(rows):
        texts = pa.array(batch)
        start = time.perf_counter()
        found += int((index.overlaps(texts) > 0).sum())
        seconds += time.perf_counter() - start
    return {"seconds": seconds, "rows_found": found, "index_ngrams": len(index)}


METHODS = {"lm_eval": run_lm_eval, "ours": run_ours}


def measure(method: str, rows: int) -> dict:
    """One method at one size, in a process of its own (its peak memory is its own)."""
    code = (
        "import json, resource, sys; sys.path.insert(0, sys.argv[3]); import contamination_bench as b; "
        "r = b.METHODS[sys.argv[1]](int(sys.argv[2])); "
        "r['peak_mib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; print(json.dumps(r))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, method, str(rows), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--results", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "contamination_bench.json"
    )
    args = parser.parse_args()
    runs = []
    for rows in args.sizes:
        theirs, ours = measure("lm_eval", rows), measure("ours", rows)
        assert theirs["rows_found"] == ours["rows_found"] == -(-rows // PLANTED_EVERY), (theirs, ours)
        runs.append({"rows": rows, "lm_eval": theirs, "ours": ours})
    print("| training rows | lm-eval's Janitor (s) | ours (s) | ours is | Janitor's peak (MiB) | ours (MiB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        theirs, ours = run["lm_eval"], run["ours"]
        print(
            f"| {run['rows']:,} | {theirs['seconds']:.1f} | {ours['seconds']:.1f} | "
            f"{theirs['seconds'] / ours['seconds']:.1f}x faster | {theirs['peak_mib']:.0f} | {ours['peak_mib']:.0f} |"
        )
    setup = {
        "task_documents": TASK_DOCUMENTS,
        "task_words": TASK_WORDS,
        "row_words": ROW_WORDS,
        "planted_every": PLANTED_EVERY,
        "batch": BATCH,
        "machine": platform.processor() or platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
    }
    args.results.write_text(json.dumps({"setup": setup, "runs": runs}, indent=2) + "\n", encoding="utf-8")
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
