"""Every measured figure the docs quote, in one table: where it is quoted and where it comes from.

A page that quotes a measurement (a throughput, a loss difference, a ratio, a run's time) quotes it from a file
under ``benchmarks/results/``, which the benchmark wrote, or, for a measurement with no results file, from the
one page that records it. Typed by hand, such a figure drifts: the tokenise step's rate was quoted as 400 to 550
conversations/s per CPU where its results files give 349 to 455. So each quote is listed here as the page's own
text with ``{}`` where each figure goes, and a function that computes those figures from its source, formatted
as the page writes them. ``tests/test_docs_numbers.py`` checks that every copy of the text on its page says
exactly that, each figure standing alone (``10.056`` is not ``0.056``), and that no page states a measurement
that is neither listed here nor in the page that records it: a throughput anywhere; a time in a paragraph about
``make run``, ``make test`` or a local run (``pipelines.run``); and, outside docs/benchmarks.md, a ratio
(``2.83×``) or a time of compiling.

To quote a new measurement: add it here, then write it on the page. A measurement with no results file (the
CPU training, fit-check and GGUF benchmarks, ``make run``'s time) is stated on one page only, its record, and
other pages link there, or quote it here with that record as the source (``Quote.source`` the page, and
``recorded`` to read the figure from its section), so that the two pages cannot disagree.
"""

from __future__ import annotations

import importlib
import json
import re
import statistics
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
BENCHMARKS = REPO_ROOT / "benchmarks"
BENCH_PAGE = "docs/benchmarks.md"
EVALUATE_PAGE = "docs/stages/evaluate.md"
TRAIN_PAGE = "docs/stages/train.md"
# Where the times of make run and make test are recorded: (page, the heading of its section).
TIMES_RECORD = ("docs/getting-started/local.md", "## How long it takes")

# The results files quoted (benchmarks/results/<name>), and the benchmark script whose constants are quoted.
TOKENISE = "tokenise_bench-cpu-2026-11-26.json"
TOKENISE_COMPACT = "tokenise_bench-cpu-2026-11-26-compact-chunks.json"
GPU_TRAIN = "gpu_train_bench-h100-2026-11-24.json"
GPU_CHECK_FIRST = "gpu_check-h100-2026-11-27.json"
GPU_CHECK_SMALL = "gpu_check-h100-2026-11-27-small-model.json"
GPU_CHECK_3B = "gpu_check-h100-2026-11-27-3b-with-fixes.json"
GPU_CHECK_FULL = "gpu_check-h200-2026-11-28-full-3b.json"
GPU_CHECK_EVERY_LENGTH = "gpu_check-h200-2026-11-28-full-12-layers-every-length.json"
LM_EVAL = "lm_eval_bench-cpu-2026-11-26.json"
DPO = "dpo_bench-cpu-2026-11-28.json"
CONTAMINATION = "contamination_bench-cpu-2026-11-29.json"
TARGETS = "gpu_train_bench.py"  # ABSOLUTE_TARGETS: the H100 throughput targets, twice the 2026-11-24 figures

GIB = 2**30
SIZES = ("small", "large", "huge")  # the tokenise benchmark's three data sizes
PATHS = ("today", "today_one_rank", "trl", "ours")  # its four tokenise paths: (a), (a1), (b), (c)
Figures = Callable[[Any], Sequence[str]]


@dataclass(frozen=True)
class Quote:
    """``text`` on ``page``, each ``{}`` filled with a figure that ``figures`` computes from ``source``."""

    page: str  # from the repository root
    text: str  # the page's words; runs of whitespace (a line break) match any whitespace
    source: str  # a results file under benchmarks/results, a script under benchmarks/ (then its module), or a page
    figures: Figures

    def expected(self) -> str:
        return normalised(self.text.format(*self.values()))

    def values(self) -> list[str]:
        """The figures, each as the page writes it (whitespace normalised)."""
        return list(_compiled(self)[0])

    def pattern(self) -> re.Pattern[str]:
        """The text with its figures, each figure (and the text's ends) guarded so that no digit, decimal point
        and digits, or digit-group comma can extend it: ``0.056`` is not found in ``10.056`` or ``0.0567``."""
        return _compiled(self)[1]

    def wildcard(self) -> re.Pattern[str] | None:
        """The text with any figure of the same number of words in each ``{}`` (None for a quote that is all
        figure): finds every copy of the sentence on the page, whatever figures each copy gives."""
        return _compiled(self)[2]

    def found_in(self, page: str) -> list[tuple[int, int]]:
        """Where ``page`` (whitespace normalised) says the text with its figures, each figure standing alone."""
        expected, spans = self.expected(), []
        start = page.find(expected)
        while start >= 0:
            if self.pattern().match(page, start):  # its lookbehinds see the text before start
                spans.append((start, start + len(expected)))
            start = page.find(expected, start + 1)
        return spans


@cache
def _compiled(quote: Quote) -> tuple[tuple[str, ...], re.Pattern[str], re.Pattern[str] | None]:
    """A quote's figures, its pattern and its wildcard, computed once: the tests ask for them many times."""
    values = tuple(normalised(str(value)) for value in quote.figures(load(quote.source)))
    parts = normalised(quote.text).split("{}")
    figures = [STANDS_ALONE.format(re.escape(value)) for value in values]
    pattern = re.compile(STANDS_ALONE.format("".join(_interleave([re.escape(part) for part in parts], figures))))
    if not "".join(parts).strip():
        return values, pattern, None
    slots = [r"([^\s|]+" + r"(?: [^\s|]+)" * value.count(" ") + ")" for value in values]
    return values, pattern, re.compile("".join(_interleave([re.escape(part) for part in parts], slots)))


def _interleave(parts: Sequence[str], slots: Sequence[str]) -> list[str]:
    assert len(parts) == len(slots) + 1, "a quote needs one figure for each {}"
    return [piece for part, slot in zip(parts, [*slots, ""]) for piece in (part, slot)]


# A figure stands alone: no digit or decimal point right before it, nor a digit and a digit-group comma; no digit
# right after it, nor a decimal point or comma and a digit.
STANDS_ALONE = r"(?<![\d.])(?<!\d,)(?:{})(?![.,]?\d)"


@cache
def normalised(text: str) -> str:
    """Markdown wraps lines anywhere: compare text with every run of whitespace as one space."""
    return re.sub(r"\s+", " ", text).strip()


@cache
def load(source: str) -> Any:
    """A results file's JSON, a benchmark script imported as a module (for its constants and formulas), or the
    text of the page that records a measurement with no results file."""
    if source.endswith(".json"):
        return json.loads((RESULTS / source).read_text())
    if source.endswith(".md"):
        return (REPO_ROOT / source).read_text()
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the benchmarks are scripts, not a package, and import each other so
    return importlib.import_module(Path(source).stem)


def thousands(value: float) -> str:
    return f"{value:,.0f}"


def rounded(value: float, places: int = 0) -> str:
    return f"{value:.{places}f}"


def gib(value_bytes: float) -> str:
    return f"{value_bytes / GIB:.2f}"


def at(*paths: str, format: Callable[[Any], str] = rounded) -> Figures:
    """The figures at dotted ``paths`` of the results (``runs.0.tokens_per_s``), each formatted by ``format``."""

    def figures(results: Any) -> list[str]:
        found = []
        for path in paths:
            value = results
            for key in path.split("."):
                value = value[int(key)] if isinstance(value, list) else value[key]
            found.append(format(value))
        return found

    return figures


# --- the tokenise benchmark: its printed tables, and the prose that reads them -----------------------------------


def tokenise_tables(source: str) -> list[Quote]:
    """The three tables ``benchmarks/tokenise_bench.py`` printed, as docs/benchmarks.md shows them."""

    def rate(path: str) -> Figures:
        def figures(results: dict) -> list[str]:
            rates = results["throughput"]["per_second"]
            return [rounded(rates[path]), f"{rates['ours'] / rates[path]:.2f}"]

        return figures

    def first_steps(results: dict) -> list[str]:
        steps, sizes = results["first_step"], [results["prepare"][name]["conversations"] for name in SIZES]
        return [
            *(f"{steps[name]['seconds']:.1f}" for name in SIZES),
            str(sizes[1]),
            str(sizes[0]),
            f"{steps['large']['seconds'] / steps['small']['seconds']:.2f}",
        ]

    def rss_anon(results: dict) -> list[str]:
        peaks = [max(results["first_step"][name]["rank_rss_anon_bytes"]) for name in SIZES]
        sizes = [results["prepare"][name]["conversations"] for name in SIZES]
        return [*(gib(peak) for peak in peaks), str(sizes[2]), str(sizes[0]), f"{(peaks[2] - peaks[0]) / GIB:+.2f}"]

    def data_path(results: dict) -> list[str]:
        prepared, tokenised = results["prepare"]["huge"], results["tokenise"]["huge"]
        return [
            str(prepared["conversations"]),
            rounded(prepared["seconds"]),
            gib(prepared["peak_rss"]),
            rounded(tokenised["seconds"]),
            gib(tokenised["peak_rss"]),
            ", ".join(gib(peak) for peak in tokenised["peak_rss_per_process"]),
            rounded(prepared["seconds"] + tokenised["seconds"]),
        ]

    return [
        Quote(
            BENCH_PAGE,
            "tokenise throughput, {} conversations, {} CPUs,",
            source,
            at("throughput.conversations", "cpus"),
        ),
        Quote(
            BENCH_PAGE,
            "| (a) today's per-rank path, 2 ranks at once (each tokenises every conversation, then TRL's preparation) "
            "| {} | {}x |",
            source,
            rate("today"),
        ),
        Quote(
            BENCH_PAGE, "| (a1) the same, one rank alone on the machine | {} | {}x |", source, rate("today_one_rank")
        ),
        Quote(
            BENCH_PAGE, "| (b) TRL's own preparation, dataset_num_proc=2 (no masks) | {} | {}x |", source, rate("trl")
        ),
        Quote(BENCH_PAGE, "| (c) tokenise step, 2 workers | {} | 1.00x |", source, at("throughput.per_second.ours")),
        Quote(
            BENCH_PAGE,
            "| trainer start to first optimizer step, 2 ranks (s) | {} | {} | {} | {}: within 1.2x of {} ({}x) |",
            source,
            first_steps,
        ),
        Quote(
            BENCH_PAGE,
            "| RssAnon per rank, peak (GiB) | {} | {} | {} | {}: at most 1 GiB above {} ({} GiB) |",
            source,
            rss_anon,
        ),
        Quote(
            BENCH_PAGE,
            "whole data path, {} conversations | step | seconds | peak resident memory (GiB) | | --- | --- | --- | "
            "| prepare (JSONL -> Parquet) | {} | {} | | tokenise (2 workers) | {} | {} (per process: {}) | "
            "| total | {} | |",
            source,
            data_path,
        ),
    ]


def other_runs(results: dict) -> list[str]:
    """The run of each pair that the table does not show: the slower one."""
    return [rounded(min(results["throughput"]["runs_per_second"][path])) for path in PATHS]


def across_files(path: str, pick: Callable[[list[float]], float], per_cpu: bool = False) -> Callable[[Any], float]:
    """``pick`` over every run of ``path`` in both tokenise results files (per CPU when ``per_cpu``)."""

    def value(_: Any) -> float:
        runs = [
            rate / (load(source)["cpus"] if per_cpu else 1)
            for source in (TOKENISE, TOKENISE_COMPACT)
            for rate in load(source)["throughput"]["runs_per_second"][path]
        ]
        return pick(runs)

    return value


def each(*values: Callable[[Any], float], format: Callable[[float], str] = rounded) -> Figures:
    return lambda results: [format(value(results)) for value in values]


TOKENISE_QUOTES = [
    *tokenise_tables(TOKENISE),
    *tokenise_tables(TOKENISE_COMPACT),
    Quote(
        BENCH_PAGE,
        "The other run of each pair in the throughput table measured {}, {}, {} and {} conversations/s.",
        TOKENISE,
        other_runs,
    ),
    Quote(
        BENCH_PAGE,
        "it grew from {} GiB at 2k conversations to {} GiB at 200k and {} GiB at 1M.",
        TOKENISE,
        at("tokenise.small.peak_rss", "tokenise.large.peak_rss", "tokenise.huge.peak_rss", format=gib),
    ),
    Quote(
        BENCH_PAGE,
        "TRL's rate in (b) varied most between runs on this host ({} to {} conversations/s over the four runs of "
        "both tables)",
        TOKENISE,
        each(across_files("trl", min), across_files("trl", max)),
    ),
    Quote(BENCH_PAGE, "At 60k the step held {} GiB summed", TOKENISE_COMPACT, at("tokenise.huge.peak_rss", format=gib)),
    Quote(
        BENCH_PAGE,
        "{} to {} conversations/s per CPU, for conversations of ~400 tokens, on this host (the step's four "
        "throughput runs above, {} to {} conversations/s on 2 CPUs; 1M conversations took {} minutes",
        TOKENISE,
        lambda results: [
            *each(across_files("ours", min, per_cpu=True), across_files("ours", max, per_cpu=True))(results),
            *each(across_files("ours", min), across_files("ours", max))(results),
            rounded(results["tokenise"]["huge"]["seconds"] / 60),
        ],
    ),
]

# --- the GPU training benchmark of 2026-11-24 ------------------------------------------------------------------


def gpu_train_row(index: int, name: str) -> Quote:
    """Case ``index``'s row up to its peak memory (the fit estimate's columns are not in the results file)."""

    def figures(results: dict) -> list[str]:
        case, bench = results["cases"][index], load(TARGETS)
        flops = case["tokens_per_s"] * bench.model_flops_per_token(case["case"][0], results["matmul_weights"])
        return [
            thousands(case["tokens_per_s"]),
            f"{flops / bench.mfu.peak_flops('NVIDIA H100 80GB HBM3', 'bf16'):.1%}",
            f"{flops / results['measured_matmul_flops']:.1%}",
            f"{case['peak_mb'] / 1024:.1f}",
        ]

    return Quote(BENCH_PAGE, f"| {name} | {{}} | {{}} | {{}} | {{}} |", GPU_TRAIN, figures)


def cases(results: dict) -> list[dict]:
    return results["cases"]  # lora, lora + Liger, full, full + Liger


GPU_TRAIN_QUOTES = [
    Quote(
        BENCH_PAGE,
        "bf16 matmul measured at {} TFLOP/s",
        GPU_TRAIN,
        lambda r: [rounded(r["measured_matmul_flops"] / 1e12)],
    ),
    gpu_train_row(0, "lora, 1 per step"),
    gpu_train_row(1, "lora, Liger, 1 per step"),
    gpu_train_row(2, "full, grad. checkpointing, 1 per step"),
    gpu_train_row(3, "full, grad. checkpointing, Liger, 1 per step"),
    Quote(
        BENCH_PAGE,
        "are {}× faster for LoRA and {}× for full fine-tuning, and save {} GiB of logits for LoRA",
        GPU_TRAIN,
        lambda r: [
            f"{cases(r)[1]['tokens_per_s'] / cases(r)[0]['tokens_per_s']:.2f}",
            f"{cases(r)[3]['tokens_per_s'] / cases(r)[2]['tokens_per_s']:.2f}",
            f"{(cases(r)[0]['peak_mb'] - cases(r)[1]['peak_mb']) / 1024:.1f}",
        ],
    ),
    Quote(
        BENCH_PAGE,
        "(LoRA {} with and without; full {} and {})",
        GPU_TRAIN,
        lambda r: [
            f"{cases(r)[0]['final_train_loss']:.4f}",
            f"{cases(r)[2]['final_train_loss']:.3f}",
            f"{cases(r)[3]['final_train_loss']:.3f}",
        ],
    ),
    Quote(
        BENCH_PAGE,
        "(the logits, 4.9 GiB estimated, {} GiB by Liger's saving)",
        GPU_TRAIN,
        lambda r: [f"{(cases(r)[0]['peak_mb'] - cases(r)[1]['peak_mb']) / 1024:.1f}"],
    ),
    Quote(
        BENCH_PAGE,
        "against the 2026-11-24 figures ({} tokens/s for LoRA, {} for full fine-tuning)",
        GPU_TRAIN,
        lambda r: [thousands(cases(r)[0]["tokens_per_s"]), thousands(cases(r)[2]["tokens_per_s"])],
    ),
    Quote(
        BENCH_PAGE,
        "(LoRA ≥ {} tokens/s; full with checkpointing ≥ {} tokens/s and ≥ {} MFU;",
        TARGETS,
        lambda bench: [
            thousands(bench.ABSOLUTE_TARGETS[("lora", False, False, 1, 4096)][0]),
            thousands(bench.ABSOLUTE_TARGETS[("full", True, False, 1, 4096)][0]),
            f"{bench.ABSOLUTE_TARGETS[('full', True, False, 1, 4096)][1]:.0%}",
        ],
    ),
]

# --- the GPU check of 2026-11-27 -------------------------------------------------------------------------------


def gpu_check_rows(source: str) -> list[Quote]:
    """Each run's row of the table, as ``benchmarks/gpu_check.py --report`` prints it from the results file."""
    count = len(load(source)["runs"])
    return [
        Quote(
            BENCH_PAGE,
            "{}",
            source,
            lambda results, index=index: [load("gpu_check.py").row(results["runs"][index], results)],
        )
        for index in range(count)
    ]


def loss_differences(results: dict) -> list[float]:
    """lora-defaults' training loss minus lora-sdpa-eager's, step by step."""
    first, second = (run["losses"] for run in results["runs"][:2])
    return [a - b for a, b in zip(first, second)]


def loss_comparison(results: dict) -> list[str]:
    comparison = results["loss_comparison"]
    return [
        f"{comparison['first_step_difference']:.1e}",
        f"{comparison['final_mean_difference']:.1e}",
        f"{comparison['max_abs_difference']:.1e}",
        str(comparison["at_step"]),
    ]


def lora_runs(results: dict) -> tuple[dict, dict]:
    return results["runs"][0], results["runs"][1]  # lora-defaults, lora-sdpa-eager


GPU_CHECK_QUOTES = [
    *gpu_check_rows(GPU_CHECK_FIRST),
    *gpu_check_rows(GPU_CHECK_SMALL),
    *gpu_check_rows(GPU_CHECK_3B),
    Quote(
        BENCH_PAGE,
        "(`benchmarks/results/gpu_check-h100-2026-11-27.json`, SmolLM3-3B shape, {} s)",
        GPU_CHECK_FIRST,
        at("elapsed_s"),
    ),
    Quote(
        BENCH_PAGE,
        "on the H100 on 2026-11-27 the two runs' losses were {} apart at step 1 and {} at step 2",
        GPU_CHECK_FIRST,
        lambda r: [f"{abs(loss_differences(r)[0]):.4f}", f"{abs(loss_differences(r)[1]):.4f}"],
    ),
    Quote(
        BENCH_PAGE,
        "{} nats at step 3, before training pulls them together again: {} at step 25, {} in the mean of the last 5.",
        GPU_CHECK_FIRST,
        lambda r: [
            f"{abs(loss_differences(r)[2]):.3f}",
            f"{abs(loss_differences(r)[-1]):.4f}",
            f"{abs(statistics.fmean(loss_differences(r)[-5:])):.4f}",
        ],
    ),
    Quote(
        BENCH_PAGE,
        '**The losses "differed"** by {} nats at step {}:',
        GPU_CHECK_FIRST,
        lambda r: [f"{r['loss_comparison']['max_abs_difference']:.3f}", str(r["loss_comparison"]["at_step"])],
    ),
    Quote(
        BENCH_PAGE,
        "(`benchmarks/results/gpu_check-h100-2026-11-27-small-model.json`, {} s, passed)",
        GPU_CHECK_SMALL,
        at("elapsed_s"),
    ),
    Quote(
        BENCH_PAGE,
        "(step 1 Δ {}, last 5 steps' mean Δ {}, largest {} at step {})",
        GPU_CHECK_SMALL,
        loss_comparison,
    ),
    Quote(
        BENCH_PAGE,
        "(`benchmarks/results/gpu_check-h100-2026-11-27-3b-with-fixes.json`, {} s, **passed**)",
        GPU_CHECK_3B,
        at("elapsed_s"),
    ),
    Quote(
        BENCH_PAGE,
        "Losses: step 1 Δ {}, last 5 steps' mean Δ {} (tolerance 0.02), largest |Δ| {} at step {}",
        GPU_CHECK_3B,
        loss_comparison,
    ),
    Quote(
        BENCH_PAGE,
        "LoRA on the defaults reached its target of {} tokens/s: {}× sdpa with eager blocks in the same run",
        GPU_CHECK_3B,
        lambda r: [
            thousands(load(TARGETS).ABSOLUTE_TARGETS[("lora", False, False, 1, 4096)][0]),
            f"{lora_runs(r)[0]['tokens_per_s'] / lora_runs(r)[1]['tokens_per_s']:.2f}",
        ],
    ),
    Quote(
        BENCH_PAGE,
        "**Compiling takes about {} s before the first step** ({} graphs, `compile.seconds` in the results): for "
        "this 25-step check the whole run averaged {} tokens/s.",
        GPU_CHECK_3B,
        at("runs.0.compile.seconds", "runs.0.compile.graphs", "runs.0.whole_run_tokens_per_s"),
    ),
    Quote(
        TRAIN_PAGE,
        "LoRA on these defaults trained at {} tokens/s, {}× `sdpa` with eager blocks in the same run",
        GPU_CHECK_3B,
        lambda r: [
            thousands(lora_runs(r)[0]["tokens_per_s"]),
            f"{lora_runs(r)[0]['tokens_per_s'] / lora_runs(r)[1]['tokens_per_s']:.2f}",
        ],
    ),
    Quote(
        TRAIN_PAGE,
        "On an H100 (SmolLM3-3B, LoRA, flex_attention, 2026-11-27): {} graphs, {} s of compiling before the "
        "first step.",
        GPU_CHECK_3B,
        at("runs.0.compile.graphs", "runs.0.compile.seconds"),
    ),
    # --- the GPU check of 2026-11-28: full fine-tuning alone, on an H200 ---
    *gpu_check_rows(GPU_CHECK_FULL),
    *gpu_check_rows(GPU_CHECK_EVERY_LENGTH),
    Quote(
        BENCH_PAGE,
        "On SmolLM3-3B (`benchmarks/results/gpu_check-h200-2026-11-28-full-3b.json`, {} s) the check",
        GPU_CHECK_FULL,
        at("elapsed_s"),
    ),
    Quote(
        BENCH_PAGE,
        "inside the {} timed steps, which took {} s in all,",
        GPU_CHECK_FULL,
        lambda r: [
            str(r["runs"][0]["timed_steps"]),
            f"{r['runs'][0]['timed_steps'] * r['max_length'] / r['runs'][0]['tokens_per_s']:.1f}",
        ],
    ),
    Quote(
        BENCH_PAGE,
        "`benchmarks/results/gpu_check-h200-2026-11-28-full-12-layers-every-length.json`, {} s, **passed**)",
        GPU_CHECK_EVERY_LENGTH,
        at("elapsed_s"),
    ),
    Quote(
        BENCH_PAGE,
        "compiled all {} graphs ({} s), and none compiled after it.",
        GPU_CHECK_EVERY_LENGTH,
        at("runs.0.compile.graphs", "runs.0.compile.seconds"),
    ),
]

# --- the standard benchmarks' cost (lm-eval) -------------------------------------------------------------------

ARC_200, HELLASWAG_200 = 1, 3  # rows of the results: arc_like and hellaswag_like at 200 documents
BUNDLED_REQUESTS = 160  # the bundled practical_skills_mc: 40 questions, four choices each


def lm_eval_row(index: int) -> Quote:
    def figures(results: dict) -> list[str]:
        row = results["rows"][index]
        return [
            row["task"],
            str(row["docs"]),
            str(row["requests"]),
            f"{row['ours_s']:.1f}",
            f"{row['lm_eval_cli_s']:.1f}",
            f"{row['lm_eval_cli_s'] / row['ours_s']:.2f}",
            f"{row['requests'] / row['ours_s']:.1f}",
        ]

    return Quote(BENCH_PAGE, "| {} | {} | {} | {} | {} | {}× | {} |", LM_EVAL, figures)


def requests_per_second(results: dict, index: int) -> float:
    row = results["rows"][index]
    return row["requests"] / row["ours_s"]


LM_EVAL_QUOTES = [
    *(lm_eval_row(index) for index in range(4)),
    Quote(
        BENCH_PAGE,
        "Twice the documents took {}× (arc-like) and {}× (hellaswag-like) the time",
        LM_EVAL,
        lambda r: [
            f"{r['rows'][1]['ours_s'] / r['rows'][0]['ours_s']:.2f}",
            f"{r['rows'][3]['ours_s'] / r['rows'][2]['ours_s']:.2f}",
        ],
    ),
    Quote(
        BENCH_PAGE,
        "would take about {} minutes per model on this CPU",
        LM_EVAL,
        at("default_set_minutes_per_model", format=lambda v: f"{v:.1f}"),
    ),
    Quote(
        EVALUATE_PAGE,
        "about {} arc-like and {} hellaswag-like requests a second (200 documents each), so the default set (1000 "
        "examples of each, 8000 requests) would take about {} minutes per model there, and the bundled 40-question "
        "task ({} requests) about {} seconds per model.",
        LM_EVAL,
        lambda r: [
            rounded(requests_per_second(r, ARC_200)),
            f"{requests_per_second(r, HELLASWAG_200):.1f}",
            f"{r['default_set_minutes_per_model']:.1f}",
            str(BUNDLED_REQUESTS),
            rounded(BUNDLED_REQUESTS / requests_per_second(r, ARC_200)),
        ],
    ),
]


def dpo_row(pairs: str) -> Quote:
    """One size's row of the DPO benchmark's table, as the benchmark prints it."""

    def figures(results: Any) -> list[str]:
        row = results["sizes"][pairs]
        trl_rate, our_rate = int(pairs) / row["trl_preparation_s"], int(pairs) / row["our_tokenise_s"]
        return [
            rounded(trl_rate),
            rounded(our_rate),
            f"{row['trl_preparation_s'] / row['our_tokenise_s']:.2f}",
            rounded(row["trl_pairs_to_steps_s"]),
            rounded(row["our_pairs_to_steps_s"]),
            f"{row['trl_pairs_to_steps_s'] / row['our_pairs_to_steps_s']:.2f}",
        ]

    return Quote(BENCH_PAGE, f"| {pairs} | {{}} | {{}} | {{}}x | {{}} | {{}} | {{}}x |", DPO, figures)


def dpo_ratio(pairs: str) -> Callable[[Any], float]:
    """How many times TRL's time, from pairs to the steps, ours took."""
    return lambda results: (
        results["sizes"][pairs]["our_pairs_to_steps_s"] / results["sizes"][pairs]["trl_pairs_to_steps_s"]
    )


DPO_QUOTES = [
    dpo_row("1000"),
    dpo_row("10000"),
    Quote(
        BENCH_PAGE,
        "from pairs to 4 steps it took {}× and {}× TRL's time",
        DPO,
        each(dpo_ratio("1000"), dpo_ratio("10000"), format=lambda v: f"{v:.2f}"),
    ),
    Quote(
        BENCH_PAGE,
        "TRL's from {} s to {} s, the tokenise step's from {} s to {} s, most of it start-up; its rate per pair is "
        "{}× TRL's at 10,000 pairs",
        DPO,
        lambda r: [
            f"{r['sizes']['1000']['trl_preparation_s']:.1f}",
            f"{r['sizes']['10000']['trl_preparation_s']:.1f}",
            f"{r['sizes']['1000']['our_tokenise_s']:.1f}",
            f"{r['sizes']['10000']['our_tokenise_s']:.1f}",
            f"{r['sizes']['10000']['trl_preparation_s'] / r['sizes']['10000']['our_tokenise_s']:.2f}",
        ],
    ),
]


def contamination_row(rows: int) -> Quote:
    """One size's row of the contamination benchmark's table, as the benchmark prints it."""

    def figures(results: Any) -> list[str]:
        (run,) = [run for run in results["runs"] if run["rows"] == rows]
        theirs, ours = run["lm_eval"], run["ours"]
        return [
            f"{rows:,}",
            f"{theirs['seconds']:.1f}",
            f"{ours['seconds']:.1f}",
            f"{theirs['seconds'] / ours['seconds']:.1f}",
            f"{theirs['peak_mib']:.0f}",
            f"{ours['peak_mib']:.0f}",
        ]

    return Quote(BENCH_PAGE, "| {} | {} | {} | {}x faster | {} | {} |", CONTAMINATION, figures)


CONTAMINATION_QUOTES = [
    contamination_row(100_000),
    contamination_row(1_000_000),
    Quote(
        BENCH_PAGE,
        "with one task's {} n-grams",
        CONTAMINATION,
        lambda results: [f"{results['runs'][0]['ours']['index_ngrams']:,}"],
    ),
]

# --- measurements with no results file, quoted from the page that records them ----------------------------------


def section(text: str, heading: str) -> str:
    """The part of a page under ``heading`` (``## How long it takes``), up to the next heading of its level."""
    level = heading.split(" ", 1)[0]
    assert heading + "\n" in text, f"the record has no section {heading!r}"
    return re.split(rf"\n#{{1,{len(level)}}} ", text.split(heading + "\n", 1)[1], maxsplit=1)[0]


def recorded(heading: str, *patterns: str) -> Figures:
    """The figures the record states in its section under ``heading``: the first group of each pattern."""

    def figures(text: str) -> list[str]:
        part = normalised(section(text, heading))
        found = [re.search(pattern, part) for pattern in patterns]
        missing = [pattern for pattern, match in zip(patterns, found) if not match]
        assert not missing, f"the record's section {heading!r} no longer states {missing}: read it and update"
        return [match[1] for match in found if match]

    return figures


RECORD_QUOTES = [
    Quote(
        EVALUATE_PAGE,
        "in `make run` (SmolLM2-135M on the 2-core host; per model the five sample questions and 10 scored rows, "
        "answers of up to 128 tokens, and the bundled benchmark) the evaluate step took {} for the base and the "
        "fine-tuned model",
        TIMES_RECORD[0],
        recorded(TIMES_RECORD[1], r"evaluation (\d+m \d+s) with the benchmarks"),
    ),
]

QUOTES: list[Quote] = [
    *TOKENISE_QUOTES,
    *GPU_TRAIN_QUOTES,
    *GPU_CHECK_QUOTES,
    *LM_EVAL_QUOTES,
    *DPO_QUOTES,
    *CONTAMINATION_QUOTES,
    *RECORD_QUOTES,
]

# --- what a measured figure looks like on a page ---------------------------------------------------------------

# A throughput, wherever it is stated: "16,436 tokens/s", "698 conversations/s", "22 requests a second".
THROUGHPUT = re.compile(
    r"\d[\d,.]*(?:\s+to\s+\d[\d,.]*)?\s+(?:tokens|conversations|requests|records)\s*(?:/\s*s\b|a\s+second|per\s+second)"
)
# A time ("4.8 minutes", "290 s", "2m 49s"), counted where its paragraph (or list item, or table row) names the local
# run (TIMED_COMMAND), and, on the pages of MEASURED_ELSEWHERE, where its sentence is about compiling (COMPILING).
TIME = re.compile(r"\d[\d,.]*(?:\s*(?:[–-]|to)\s*\d[\d,.]*)?\s+(?:minutes?|min|seconds?|s)\b|\b\d+m\s*\d+s\b")
TIMED_COMMAND = re.compile(r"make (?:run|test)\b|pipelines[./]run\b|\blocal runs?\b", re.I)
COMPILING = re.compile(r"compil", re.I)
# A time right after these words is a limit someone set ("times out after 30 minutes"), not a measurement. Other
# settings that look like measurements are listed in SETTINGS.
LIMIT = re.compile(
    r"(?:times?\s+out\s+after|timeout(?:\s+of)?|limit(?:\s+of)?|at\s+most|up\s+to)\s+(?:about\s+)?$", re.I
)
# A ratio, measured: "2.83×", "1.83–1.88×", "3.06x". Not a product, which has spaces ("128 × 128", "4 × the
# blocks"), nor a version ("3.x").
RATIO = re.compile(r"\d(?:[\d,.]*\d)?(?:\s*(?:[–-]|to)\s*\d(?:[\d,.]*\d)?)?[×x](?!\w)")
# Where a ratio, or a time in a sentence about compiling, is a measurement quoted from elsewhere: every page but
# docs/benchmarks.md, the measured record, whose tables are the source (its prose is covered by QUOTES), and
# docs/contributing.md, which tells how to quote. (local.md's record of make run's times is left out by _blocks.)
MEASURED_ELSEWHERE = (
    "README.md",
    "docs/index.md",
    "docs/architecture.md",
    "docs/getting-started/*.md",
    "docs/stages/*.md",
    "docs/guides/*.md",
)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*\[(\"])")


@dataclass(frozen=True)
class Setting:
    """A figure that looks like a measurement but is a setting, a default or a limit: ``text`` on ``page``."""

    page: str
    text: str  # the words around the figure, as the page writes them
    why: str


SETTINGS = [
    Setting(BENCH_PAGE, "full fine-tuning skipped by a 1 s budget", "the CPU mode's --budget, beside make test"),
]


def pages() -> dict[str, str]:
    """README.md and every page of the docs site, by path from the repository root."""
    found = {"README.md": (REPO_ROOT / "README.md").read_text()}
    for path in sorted((REPO_ROOT / "docs").rglob("*.md")):
        found[path.relative_to(REPO_ROOT).as_posix()] = path.read_text()
    return found


def misquoted(quotes: Sequence[Quote], texts: Mapping[str, str]) -> list[str]:
    """Each quote its page does not say as its source gives it, with what the page says there instead, and each
    copy of a quoted sentence whose figures are not its source's.

    Quotes of one text on one page (the two tokenise tables) are judged together: every copy of the text must give
    the figures of one of them, and each of them must be on the page."""
    groups: dict[tuple[str, str], list[Quote]] = {}
    for quote in quotes:
        groups.setdefault((quote.page, normalised(quote.text)), []).append(quote)
    flat = {name: normalised(text) for name, text in texts.items()}
    found = []
    for (name, _), group in groups.items():
        page = flat.get(name, "")
        wanted = {tuple(quote.values()) for quote in group}
        wildcard = group[0].wildcard()
        wrong = [said.groups() for said in wildcard.finditer(page) if said.groups() not in wanted] if wildcard else []
        for quote in group:
            if quote.found_in(page):
                continue
            instead = f"; the page says {', '.join(wrong.pop(0))}" if wrong else "; the text is not on the page"
            found.append(f"{name}: {quote.expected()!r} (from {_where(quote.source)}){instead}")
        for said in wrong:
            sources = " or ".join(f"{', '.join(figures)}" for figures in sorted(wanted))
            found.append(
                f"{name}: {group[0].text!r} is on the page more than once, and one copy says {', '.join(said)} "
                f"where {' or '.join(sorted({_where(quote.source) for quote in group}))} gives {sources}"
            )
    return found


def _where(source: str) -> str:
    if source.endswith(".md"):
        return source
    return f"benchmarks/{source}" if source.endswith(".py") else f"benchmarks/results/{source}"


def unlisted(quotes: Sequence[Quote], texts: Mapping[str, str]) -> list[str]:
    """Each measurement no quote covers: a throughput; a time in a paragraph about the local run (``make run``,
    ``make test``, ``pipelines.run``); and on the pages of ``MEASURED_ELSEWHERE`` a ratio, or a time in a sentence
    about compiling.

    Times are exempt in the section that records them (``TIMES_RECORD``); a figure ``SETTINGS`` lists is exempt
    anywhere; throughputs have no exemption but a quote."""
    flat = {name: normalised(text) for name, text in texts.items()}
    covered: dict[str, list[tuple[int, int]]] = {}
    for quote in quotes:
        covered.setdefault(quote.page, []).extend(quote.found_in(flat.get(quote.page, "")))
    for setting in SETTINGS:
        covered.setdefault(setting.page, []).extend(
            match.span() for match in re.finditer(re.escape(normalised(setting.text)), flat.get(setting.page, ""))
        )
    found = []
    for name, text in texts.items():
        spans, flat_page = covered.get(name, []), flat[name]
        elsewhere = any(fnmatch(name, pattern) for pattern in MEASURED_ELSEWHERE)
        for block in _blocks(name, text):
            offset = flat_page.find(block)
            for figure in measurements(block, elsewhere):
                start, end = offset + figure.start(), offset + figure.end()
                if not any(low <= start and end <= high for low, high in spans):
                    found.append(f"{name}: {figure.group()!r} in {_around(block, figure)!r}")
    return found


def measurements(block: str, elsewhere: bool) -> list[re.Match[str]]:
    """The figures of one paragraph that are measurements (``elsewhere``: on a page of ``MEASURED_ELSEWHERE``),
    in the order they appear."""
    times: list[re.Match[str]] = []
    if TIMED_COMMAND.search(block):
        times += TIME.finditer(block)
    if elsewhere:
        for start, end in _sentences(block):
            if COMPILING.search(block, start, end):
                times += TIME.finditer(block, start, end)
    figures = [*THROUGHPUT.finditer(block), *(RATIO.finditer(block) if elsewhere else [])]
    figures += [time for time in times if not LIMIT.search(block, 0, time.start())]
    unique = {figure.span(): figure for figure in figures}
    return [unique[span] for span in sorted(unique)]


def _sentences(block: str) -> list[tuple[int, int]]:
    """Where each sentence of the paragraph starts and ends."""
    starts = [0, *(end.end() for end in SENTENCE_END.finditer(block))]
    ends = [end.start() for end in SENTENCE_END.finditer(block)] + [len(block)]
    return list(zip(starts, ends))


def _around(block: str, figure: re.Match[str], width: int = 60) -> str:
    return block[max(0, figure.start() - width) : figure.end() + width]


@cache
def _blocks(name: str, text: str) -> tuple[str, ...]:
    """The page's paragraphs, list items and table rows, whitespace normalised, less the section that records
    make run's and make test's times: a time counts as theirs when its paragraph names them ("it takes 5 to 8
    minutes" follows the sentence that says what "it" is)."""
    page, heading = TIMES_RECORD
    if name == page and heading in text:
        before, after = text.split(heading, 1)
        rest = after.split("\n## ", 1)
        text = before + ("\n## " + rest[1] if len(rest) > 1 else "")
    blocks = re.split(r"\n\s*\n|\n\s*(?=[-*] |\d+\. |\|)", text)
    return tuple(normalised(block) for block in blocks if block.strip())
