"""Every measured figure the docs quote from a results file, in one table: where it is quoted and where it comes from.

A page that quotes a measurement (a throughput, a loss difference, a run's time) quotes it from a file under
``benchmarks/results/``, which the benchmark wrote. Typed by hand, such a figure drifts: the tokenise step's
rate was quoted as 400 to 550 conversations/s per CPU where its results files give 349 to 455. So each quote
is listed here as the page's own text with ``{}`` where each figure goes, and a function that computes those
figures from the results file, formatted as the page writes them. ``tests/test_docs_numbers.py`` checks that
every page says exactly that, and that no page states a throughput, or a time of ``make run`` / ``make test``,
that is neither listed here nor in the one section that records those times.

To quote a new measurement: add it here, then write it on the page. A measurement with no results file (the
CPU training, fit-check and GGUF benchmarks, ``make run``'s time) is stated on one page only, its record, and
other pages link there.
"""

from __future__ import annotations

import importlib
import json
import re
import statistics
import sys
from dataclasses import dataclass
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
LM_EVAL = "lm_eval_bench-cpu-2026-11-26.json"
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
    source: str  # a results file under benchmarks/results, or a script under benchmarks/ (then its module)
    figures: Figures

    def expected(self) -> str:
        return normalised(self.text.format(*self.figures(load(self.source))))


def normalised(text: str) -> str:
    """Markdown wraps lines anywhere: compare text with every run of whitespace as one space."""
    return re.sub(r"\s+", " ", text).strip()


@cache
def load(source: str) -> Any:
    """A results file's JSON, or a benchmark script imported as a module (for its constants and formulas)."""
    if source.endswith(".json"):
        return json.loads((RESULTS / source).read_text())
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
            f"{flops / bench.DATASHEET_BF16_PEAK['H100']:.1%}",
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

QUOTES: list[Quote] = [*TOKENISE_QUOTES, *GPU_TRAIN_QUOTES, *GPU_CHECK_QUOTES, *LM_EVAL_QUOTES]

# --- what a measured figure looks like on a page ---------------------------------------------------------------

# A throughput, wherever it is stated: "16,436 tokens/s", "698 conversations/s", "22 requests a second".
THROUGHPUT = re.compile(
    r"\d[\d,.]*(?:\s+to\s+\d[\d,.]*)?\s+(?:tokens|conversations|requests|records)\s*(?:/\s*s\b|a\s+second|per\s+second)"
)
# A time ("4.8 minutes", "290 s"), counted where its paragraph (or list item) names make run or make test.
TIME = re.compile(r"\d[\d,.]*(?:\s*(?:[–-]|to)\s*\d[\d,.]*)?\s+(?:minutes?|min|seconds?|s)\b")
TIMED_COMMAND = re.compile(r"make (?:run|test)\b")
# Times beside make run or make test that are settings, not measurements: (page, the text that holds one).
SETTINGS = [(BENCH_PAGE, "full fine-tuning skipped by a 1 s budget")]


def pages() -> dict[str, str]:
    """README.md and every page of the docs site, by path from the repository root."""
    found = {"README.md": (REPO_ROOT / "README.md").read_text()}
    for path in sorted((REPO_ROOT / "docs").rglob("*.md")):
        found[path.relative_to(REPO_ROOT).as_posix()] = path.read_text()
    return found


def misquoted(quotes: Sequence[Quote], texts: Mapping[str, str]) -> list[str]:
    """Each quote its page does not say as its results file gives it, with what the page says there instead."""
    found = []
    for quote in quotes:
        expected, page = quote.expected(), normalised(texts.get(quote.page, ""))
        if expected in page:
            continue
        said = re.search(_figure_pattern(quote.text), page) if quote.text.strip("{} ") else None
        instead = f"; the page says {', '.join(said.groups())}" if said else "; the text is not on the page"
        found.append(f"{quote.page}: {expected!r} (from benchmarks/{_where(quote.source)}){instead}")
    return found


def _figure_pattern(text: str) -> str:
    """The quote's text with any figure in place of each ``{}``: to say what the page quotes instead."""
    return r"([^\s|]+)".join(re.escape(part) for part in normalised(text).split("{}"))


def _where(source: str) -> str:
    return source if source.endswith(".py") else f"results/{source}"


def unlisted(quotes: Sequence[Quote], texts: Mapping[str, str]) -> list[str]:
    """Each throughput, and each time in a paragraph about make run or make test, that no quote covers.

    Times are exempt in the section that records them (``TIMES_RECORD``) and where ``SETTINGS`` lists them;
    throughputs have no exemption."""
    covered: dict[str, list[tuple[int, int]]] = {}
    allowed = [(quote.page, quote.expected()) for quote in quotes] + [
        (page, normalised(text)) for page, text in SETTINGS
    ]
    for page, expected in allowed:
        text = normalised(texts.get(page, ""))
        covered.setdefault(page, []).extend(
            (match.start(), match.end()) for match in re.finditer(re.escape(expected), text)
        )
    found = []
    for name, text in texts.items():
        spans, flat_page = covered.get(name, []), normalised(text)
        for block in _blocks(name, text):
            figures = list(THROUGHPUT.finditer(block))
            if TIMED_COMMAND.search(block):
                figures += TIME.finditer(block)
            offset = flat_page.find(block)
            for figure in figures:
                start, end = offset + figure.start(), offset + figure.end()
                if not any(low <= start and end <= high for low, high in spans):
                    found.append(f"{name}: {figure.group()!r} in {_around(block, figure)!r}")
    return found


def _around(block: str, figure: re.Match[str], width: int = 60) -> str:
    return block[max(0, figure.start() - width) : figure.end() + width]


def _blocks(name: str, text: str) -> list[str]:
    """The page's paragraphs and list items, whitespace normalised, less the section that records make run's and
    make test's times: a time counts as theirs when its paragraph names them ("it takes 5 to 8 minutes" follows
    the sentence that says what "it" is)."""
    page, heading = TIMES_RECORD
    if name == page and heading in text:
        before, after = text.split(heading, 1)
        rest = after.split("\n## ", 1)
        text = before + ("\n## " + rest[1] if len(rest) > 1 else "")
    blocks = re.split(r"\n\s*\n|\n\s*(?=[-*] |\d+\. )", text)
    return [normalised(block) for block in blocks if block.strip()]
