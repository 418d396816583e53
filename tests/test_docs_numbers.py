"""The figures the docs quote are the results files' (or the record's) figures, and no page states a measurement
of its own.

``tests/docs_numbers.py`` lists each quote (page, text, source, formula). A quote that no longer matches its
source, a page edited by hand (one copy of a sentence, or one digit more), or a new figure typed onto a page
without an entry fails here, naming the page, the text and what the source gives.
"""

from __future__ import annotations

import re

import pytest
from docs_numbers import (
    BENCH_PAGE,
    EVALUATE_PAGE,
    GPU_CHECK_3B,
    QUOTES,
    RECORD_QUOTES,
    RESULTS,
    TIMES_RECORD,
    TRAIN_PAGE,
    Quote,
    load,
    misquoted,
    pages,
    section,
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


# --- a figure is the whole number, on every copy of its sentence ----------------------------------------------


@pytest.mark.parametrize(
    ("page", "right", "wrong", "said"),
    [
        (BENCH_PAGE, "steps, 0.056 nats at step 3, before", "steps, 10.056 nats at step 3, before", "10.056"),
        (BENCH_PAGE, "steps, 0.056 nats at step 3, before", "steps, 0.0567 nats at step 3, before", "0.0567"),
        (TRAIN_PAGE, "trained at 16,436 tokens/s", "trained at 116,436 tokens/s", "116,436"),
        (TRAIN_PAGE, "trained at 16,436 tokens/s", "trained at 16,436,1 tokens/s", "16,436,1"),
        (TRAIN_PAGE, "29 graphs, 346 s of compiling", "29 graphs, 346.5 s of compiling", "346.5"),
        (TRAIN_PAGE, "2.83× `sdpa`", "12.83× `sdpa`", "12.83"),
    ],
)
def test_a_digit_added_to_a_figure_is_a_different_figure(page, right, wrong, said):
    """The reviewer's case: "0.056 nats at step 3" made "10.056 nats at step 3" contains the right text, and
    passed. A figure now stands alone: no digit, decimal point and digits, or digit-group comma beside it."""
    texts = pages()
    flat = " ".join(texts[page].split())
    assert flat.count(right) == 1, f"the page no longer says {right!r}: choose another example"
    texts[page] = flat.replace(right, wrong)
    found = misquoted(QUOTES, texts)
    assert len(found) == 1 and found[0].startswith(f"{page}: "), found
    assert said in found[0].split("; the page says ")[1].split(", ")


def test_every_copy_of_a_quoted_sentence_must_give_the_figures():
    """A sentence quoted twice on a page (a summary repeating it) was checked only for one right copy."""
    texts = pages()
    sentence = "averaged 272 tokens/s."
    assert sentence in " ".join(texts[BENCH_PAGE].split())
    copy = "**Compiling takes about 346 s before the first step** (29 graphs, `compile.seconds` in the results): for "
    copy += "this 25-step check the whole run averaged {} tokens/s."
    texts[BENCH_PAGE] += "\n\nAgain: " + copy.format(272) + "\n"
    assert misquoted(QUOTES, texts) == [], "a second, right copy is fine"
    texts[BENCH_PAGE] += "\n\nAnd: " + copy.format(999) + "\n"
    (found,) = misquoted(QUOTES, texts)
    assert found.startswith(f"{BENCH_PAGE}: '**Compiling takes about {{}} s")
    assert "more than once, and one copy says 346, 29, 999" in found and found.endswith("gives 346, 29, 272")


def test_the_two_tokenise_tables_share_their_rows_text_and_each_keeps_its_own_figures():
    """Both tables have the row "(c) tokenise step, 2 workers": each results file's figure must be on the page,
    and no copy may give a third."""
    texts = pages()
    row = "| (c) tokenise step, 2 workers | {} | 1.00x |"
    assert texts[BENCH_PAGE].count(row.format(771)) == texts[BENCH_PAGE].count(row.format(909)) == 1
    swapped = dict(texts, **{BENCH_PAGE: texts[BENCH_PAGE].replace(row.format(909), row.format(771))})
    (found,) = misquoted(QUOTES, swapped)
    assert "| 909 | 1.00x |" in found and found.endswith("the text is not on the page")
    third = dict(texts, **{BENCH_PAGE: texts[BENCH_PAGE] + "\n" + row.format(800) + "\n"})
    (found,) = misquoted(QUOTES, third)
    assert "one copy says 800" in found


# --- a quote from the record of a measurement with no results file ---------------------------------------------


def test_a_quote_may_take_its_figure_from_the_record():
    """The evaluate page states make run's evaluation time, which has no results file, as the record states it."""
    (quote,) = [quote for quote in RECORD_QUOTES if quote.page == EVALUATE_PAGE]
    page, heading = TIMES_RECORD
    assert quote.source == page and quote.values() == ["1m 24s"]
    record = load(page)
    assert quote.figures(record.replace("evaluation 1m 24s with", "evaluation 1m 31s with")) == ["1m 31s"]
    assert "evaluation 1m 24s with" in section(record, heading) and "## S3" not in section(record, heading)
    texts = pages()
    texts[EVALUATE_PAGE] = " ".join(texts[EVALUATE_PAGE].split()).replace("step took 1m 24s", "step took 1m 31s")
    (found,) = misquoted(QUOTES, texts)
    assert found.startswith(f"{EVALUATE_PAGE}: ") and f"(from {page})" in found
    assert found.endswith("the page says 1m 31s")


def test_a_record_that_no_longer_states_the_figure_says_so():
    (quote,) = RECORD_QUOTES
    with pytest.raises(AssertionError, match="no longer states"):
        quote.figures(load(TIMES_RECORD[0]).replace("with the benchmarks", "with benchmarks"))


# --- ratios, compile times and local-run times are measurements too --------------------------------------------


@pytest.mark.parametrize(
    ("page", "added", "figures"),
    [
        (
            "README.md",
            "LoRA trains at 3.50× sdpa here; compiling takes about 999 s before the first step.",
            ["3.50×", "999 s"],
        ),
        ("README.md", "`python -m pipelines.run` takes 20 minutes on two cores.", ["20 minutes"]),
        ("README.md", "A local run takes 9 to 12 minutes.", ["9 to 12 minutes"]),
        ("docs/stages/train.md", "Liger is 1.27x faster for LoRA.", ["1.27x"]),
        ("docs/guides/kueue-and-sizing.md", "On two GPUs the step took 1.83–1.88× as long.", ["1.83–1.88×"]),
        ("docs/stages/train.md", "The 3B model's blocks compile in 5.8 minutes.", ["5.8 minutes"]),
        ("docs/index.md", "`make test` took 2m 30s.", ["2m 30s"]),
        ("docs/getting-started/openshift-ai.md", "The train step compiled its blocks for 400 s.", ["400 s"]),
    ],
)
def test_a_ratio_a_compile_time_or_a_local_runs_time_typed_onto_a_page_is_named(page, added, figures):
    texts = pages()
    texts[page] += f"\n{added}\n"
    flagged = [line for line in unlisted(QUOTES, texts) if added[:30] in line]
    assert flagged == [f"{page}: {figure!r} in {around(added, figure)!r}" for figure in figures]


def around(added: str, figure: str, width: int = 60) -> str:
    start = added.index(figure)
    return added[max(0, start - width) : start + len(figure) + width]


@pytest.mark.parametrize(
    ("page", "added"),
    [
        ("docs/stages/train.md", "The trainer's compile step times out after 30 minutes."),
        ("docs/stages/train.md", "`training_timeout_minutes` (720) bounds the compiled run; 8 GiB per CPU."),
        ("docs/stages/train.md", "Each 128 × 128 block is compiled; the limit is 4 × the number of blocks."),
        ("README.md", "On OpenShift AI 3.x the job is a TrainJob; 2.x runs a PyTorchJob for 30 minutes at most."),
        ("docs/benchmarks.md", "Compiling took 346 s, 2.83× sdpa."),  # the record: its tables are the source
        ("docs/guides/security.md", "Every request times out after 30 s, 1.5x the registry's own."),  # not local
    ],
)
def test_settings_products_versions_and_the_record_are_not_measurements_to_quote(page, added):
    """A timeout, a default, a product in a formula or a version number is not flagged; only the time rule of
    a paragraph about the local run, and ratios and compile times outside the record, are."""
    texts = pages()
    texts[page] += f"\n{added}\n"
    flagged = [line for line in unlisted(QUOTES, texts) if added[:30] in line]
    assert flagged == [] or page == "docs/guides/security.md"
    if page == "docs/guides/security.md":
        assert flagged == [f"{page}: '1.5x' in {added!r}"], "a ratio is flagged, the timeout is not"
