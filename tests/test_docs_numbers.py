"""The figures the docs quote are the results files' figures, and no page states a measurement of its own.

``tests/docs_numbers.py`` lists each quote (page, text, results file, formula). A quote that no longer matches
its file, a page edited by hand, or a new figure typed onto a page without an entry fails here, naming the page,
the text and what the results file gives.
"""

from __future__ import annotations

import re

import pytest
from docs_numbers import (
    BENCH_PAGE,
    GPU_CHECK_3B,
    QUOTES,
    RESULTS,
    TIMES_RECORD,
    Quote,
    misquoted,
    pages,
    unlisted,
)


def test_every_quoted_figure_is_what_its_results_file_gives():
    assert misquoted(QUOTES, pages()) == []


def test_no_page_states_a_throughput_or_a_make_run_time_that_is_not_listed():
    """Else two pages can state the same measurement and drift apart: quote it from a results file, or link to
    the page that records it (make run's and make test's times: docs/getting-started/local.md)."""
    assert unlisted(QUOTES, pages()) == []


def test_every_results_file_is_quoted():
    """A results file the docs never quote is a measurement no reader sees."""
    quoted = {quote.source for quote in QUOTES}
    assert {path.name for path in RESULTS.glob("*.json")} <= quoted


def test_the_gpu_check_of_the_3b_with_the_fixes_is_quoted_row_by_row():
    """Its table rows are ``gpu_check.py --report``'s own, from the results file."""
    rows = [quote.expected() for quote in QUOTES if quote.source == GPU_CHECK_3B and quote.text == "{}"]
    assert [row.split(" | ")[0] for row in rows] == ["| lora-defaults", "| lora-sdpa-eager", "| full-checkpointing"]
    assert "| 16,436 | 20.4% | 2.09× of 7,854 | ≥ 15,700: met |" in rows[0]


def test_a_figure_that_differs_from_its_results_file_is_named_with_what_the_page_says():
    texts = pages()
    texts[BENCH_PAGE] = texts[BENCH_PAGE].replace("| 16,436 | 20.4% |", "| 16,437 | 20.4% |")
    texts[BENCH_PAGE] = texts[BENCH_PAGE].replace(
        "the whole run averaged 272 tokens/s", "the whole run averaged 275 tokens/s"
    )
    found = misquoted(QUOTES, texts)
    assert len(found) == 2
    assert found[0].startswith(f"{BENCH_PAGE}: '| lora-defaults | flex_attention, compiled | 16,436 |")
    assert found[0].endswith("; the text is not on the page")
    assert "averaged 272 tokens/s." in found[1] and found[1].endswith("the page says 346, 29, 275")


def test_a_quote_whose_text_is_gone_is_named():
    quote = Quote("README.md", "trains at {} tokens/s", GPU_CHECK_3B, lambda results: ["16,436"])
    assert misquoted([quote], {"README.md": "no figures here"}) == [
        f"README.md: 'trains at 16,436 tokens/s' (from benchmarks/results/{GPU_CHECK_3B}); the text is not on the page"
    ]


@pytest.mark.parametrize(
    ("added", "figure"),
    [
        ("LoRA trains at 16,500 tokens/s on one H100.", "16,500 tokens/s"),
        ("The step tokenises 400 to 550 conversations per second.", "400 to 550 conversations per second"),
        ("Scoring runs at 22 requests a second.", "22 requests a second"),
        ("On two cores `make run` takes 5 to 8 minutes.", "5 to 8 minutes"),
        ("`make test` took 44 minutes from a fresh clone.", "44 minutes"),
    ],
)
def test_a_measurement_typed_onto_a_page_is_named(added, figure):
    texts = pages()
    texts["README.md"] += f"\n{added}\n"
    assert [line for line in unlisted(QUOTES, texts) if line.startswith("README.md:")] == [
        f"README.md: {figure!r} in {added!r}"
    ]


def test_a_time_is_make_runs_when_its_paragraph_names_make_run():
    """As the README once said: "`make run` runs every stage … On a 2-core host it takes 5 to 8 minutes"."""
    texts = pages()
    texts["README.md"] += "\n`make run` runs every stage here.\nOn a 2-core host it takes 5 to 8 minutes.\n"
    texts["README.md"] += "\nA training step takes 27 s.\n"  # no make run or make test in its paragraph
    assert [line for line in unlisted(QUOTES, texts) if line.startswith("README.md:")] == [
        "README.md: '5 to 8 minutes' in '`make run` runs every stage here. On a 2-core host it takes 5 to 8 minutes.'"
    ]


def test_a_listed_quote_and_the_record_of_make_runs_time_may_state_figures():
    texts = pages()
    page, heading = TIMES_RECORD
    assert re.search(r"\*\*\d+\.\d minutes\*\*", texts[page].split(heading, 1)[1]), "the record holds the times"
    assert "16,436 tokens/s" in " ".join(texts["docs/stages/train.md"].split())
    assert unlisted(QUOTES, texts) == []


def test_a_time_beside_make_run_outside_the_record_is_named():
    texts = pages()
    page, heading = TIMES_RECORD
    texts[page] = texts[page].replace(heading, "## How long it took")
    assert any(line.startswith(f"{page}: '4.8 minutes'") for line in unlisted(QUOTES, texts))
