"""The data step's contamination check against the eval split: a training row that shares a 13-word sequence
with a held-out row (lm-eval's normalisation) is counted per source, quoted, and dropped under decontaminate."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from conftest import run_cli, write_jsonl

from common.errors import UserError
from common.records import EVAL_SPLIT_NAME, DataStats
from components.data.mixture import DataSource
from components.data.options import PrepareOptions
from components.data.prepare import SourceFiles, prepare

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def record(i: int) -> dict:
    """A record whose every 13-word sequence is its own: the words of i's digits, spelt out, never repeat."""
    spelt = " ".join(f"{WORDS[int(digit)]}{position}" for position, digit in enumerate(f"{i:06d}" * 3))
    return {"question": f"What is record {i}?", "answer": f"Record {i} reads {spelt}."}


def questions(path) -> list[str]:
    return [row["messages"][0]["content"] for row in pq.read_table(path).to_pylist()]


@pytest.fixture
def planted(tmp_path):
    """300 records, then 40 that each copy an eval row's answer after a question of their own, in another case
    and with other punctuation: what lm-eval's normalisation reads as the same words. The second file holds the
    copies and 100 clean records; the list, the 300 and the copies."""
    options = PrepareOptions(eval_fraction=0.2, decontaminate=False)
    plain = write_jsonl(tmp_path / "plain.jsonl", [record(i) for i in range(300)])
    held_out = questions(prepare(str(plain), tmp_path / "first", options).eval_path)
    copied = [int(question.split()[-1].rstrip("?")) for question in held_out][:40]
    copies = [
        {"question": f"Which record comes after {i}?", "answer": record(i)["answer"].upper().replace(".", "!")}
        for i in copied
    ]
    with_clean_rows = copies + [record(i) for i in range(1000, 1100)]
    return plain, write_jsonl(tmp_path / "copies.jsonl", with_clean_rows), [record(i) for i in range(300)] + copies


def test_decontamination_drops_exactly_the_planted_rows_in_training(planted, tmp_path):
    _, _, records = planted
    both = write_jsonl(tmp_path / "both.jsonl", records)
    kept = prepare(str(both), tmp_path / "kept", PrepareOptions(eval_fraction=0.2, decontaminate=False))
    dropped = prepare(str(both), tmp_path / "dropped", PrepareOptions(eval_fraction=0.2))
    planted_in_training = {q for q in questions(kept.train_path) if q.startswith("Which record")}
    assert planted_in_training  # some of the copies were split into training
    assert set(questions(kept.train_path)) - set(questions(dropped.train_path)) == planted_in_training
    assert questions(dropped.eval_path) == questions(kept.eval_path)  # the eval split is never touched

    (overlap,) = dropped.stats.contamination
    assert (overlap.source, overlap.against, overlap.rows, overlap.dropped) == (
        str(both),
        EVAL_SPLIT_NAME,
        len(planted_in_training),
        True,
    )
    assert overlap.examples and all(example.startswith("Which record comes after") for example in overlap.examples)
    assert len(overlap.examples) == min(3, len(planted_in_training))
    (counted,) = kept.stats.contamination
    assert (counted.rows, counted.dropped) == (len(planted_in_training), False)  # counted, kept
    assert DataStats.read(dropped.stats_path).contamination == dropped.stats.contamination
    assert kept.stats.fingerprint != dropped.stats.fingerprint
    report = (tmp_path / "dropped" / "report.md").read_text()
    assert f"{len(planted_in_training)} of its training rows overlap the eval split, dropped" in report
    assert "  - Which record comes after" in report


def test_each_source_is_checked_against_the_eval_split_of_all(planted, tmp_path):
    plain, copies, _ = planted
    sources = [SourceFiles(DataSource(str(plain), 1), [plain]), SourceFiles(DataSource(str(copies), 1), [copies])]
    result = prepare(sources, tmp_path / "out", PrepareOptions(eval_fraction=0.2))
    first, second = result.stats.contamination
    assert (first.source, first.rows) == (str(plain), 0)
    assert second.source == str(copies) and second.rows > 0
    mixed = questions(result.train_path)
    assert not [question for question in mixed if question.startswith("Which record")]
    copied = result.stats.sources[1]  # its 140 records: held out, dropped, or available to the mixture
    assert copied.train_available == 140 - copied.eval_rows - second.rows > 0


def test_the_options_stay_out_of_the_fingerprint_and_a_system_prompt_or_template_is_no_overlap(tmp_path):
    """decontaminate and max_contamination never enter the fingerprint (what decontaminate drops shows in the rows
    themselves), so data prepared before them keeps its fingerprint. A passage every row repeats, a long system
    prompt or a template's instructions, is no overlap: otherwise every row would be dropped."""
    template = "Below is an instruction that describes a task. Write a response that appropriately completes it."
    records = [{**record(i), "question": f"{template} {record(i)['question']}"} for i in range(200)]
    data = write_jsonl(tmp_path / "templated.jsonl", records)
    system = "You are a careful assistant who answers questions about records in full sentences, citing their words."
    results = {
        decontaminate: prepare(
            str(data),
            tmp_path / str(decontaminate),
            PrepareOptions(system_prompt=system, decontaminate=decontaminate, max_contamination=0.5),
        )
        for decontaminate in (True, False)
    }
    assert results[True].stats.fingerprint == results[False].stats.fingerprint
    assert results[True].stats.overlapping_eval == 0 and results[True].stats.train_rows > 150


def test_a_source_whose_every_training_row_overlaps_is_refused_not_emptied(planted, tmp_path):
    """The eval split's own rows and copies of them under other questions: every copy split into training overlaps,
    and dropping them all would leave nothing to train on."""
    plain, copies, _ = planted
    first = prepare(str(plain), tmp_path / "first", PrepareOptions(eval_fraction=0.2))
    held_out = {question for question in questions(first.eval_path)}
    originals = [record(i) for i in range(300) if record(i)["question"] in held_out]
    copied = [row for row in map(json.loads, copies.read_text().splitlines()) if row["question"].startswith("Which")]
    data = write_jsonl(tmp_path / "copied.jsonl", originals + copied)
    with pytest.raises(UserError, match=r"^Every one of the \d+ training rows of .*copied.jsonl shares a 13-word"):
        prepare(str(data), tmp_path / "out", PrepareOptions(eval_fraction=0.2))
    assert not (tmp_path / "out" / "stats.json").exists()


# --- Benchmark tasks: the bundled practical_skills_mc, whose documents are a question and four choices ---------


def benchmark_copies(count: int) -> list[dict]:
    """Training records that quote practical_skills_mc's questions and right answers, as a scraped quiz would."""
    from components.sample_data import bundled_task_dir

    lines = (bundled_task_dir() / "practical_skills_mc.jsonl").read_text().splitlines()
    quiz = [json.loads(line) for line in lines][:count]
    return [{"question": item["question"], "answer": item["choices"][item["answer"]]} for item in quiz]


def test_a_planted_benchmark_question_is_found_and_reported_under_its_source_and_task(tmp_path):
    """The check reads the task the evaluation scores (loaded as it loads it); a source that quotes the task's
    questions and answers is counted against it, and the other source is not."""
    from components.benchmark_tasks.documents import task_documents

    documents = task_documents(["practical_skills_mc"], tmp_path, 0, False)
    checkable = sum(len(text.split()) >= 13 for text in documents["practical_skills_mc"])
    clean = write_jsonl(tmp_path / "clean.jsonl", [record(i) for i in range(200)])
    quiz = write_jsonl(tmp_path / "quiz.jsonl", benchmark_copies(40) + [record(i) for i in range(500, 600)])
    sources = [SourceFiles(DataSource(str(clean)), [clean]), SourceFiles(DataSource(str(quiz)), [quiz])]
    result = prepare(sources, tmp_path / "out", PrepareOptions(eval_fraction=0.1), benchmarks=documents)
    on_task = [overlap for overlap in result.stats.contamination if overlap.against == "practical_skills_mc"]
    assert [(overlap.source, overlap.rows > 0) for overlap in on_task] == [(str(clean), False), (str(quiz), True)]
    quoted = on_task[1]
    assert quoted.documents == checkable and 0 < quoted.documents_hit <= checkable
    assert not quoted.dropped and quoted.examples  # counted and shown, not dropped: max_contamination decides
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"`{quiz}`: {quoted.rows} of its training rows overlap the benchmark task practical_skills_mc" in report
    assert f"`{clean}`: none of its training rows overlaps the benchmark task practical_skills_mc." in report


def test_max_contamination_refuses_naming_the_source_and_the_task(tmp_path):
    """From the stage's command line, as a user runs it: one paragraph, nothing written."""
    quiz = write_jsonl(tmp_path / "quiz.jsonl", benchmark_copies(40) + [record(i) for i in range(100)])
    args = ("--input", str(quiz), "--benchmark-tasks", "practical_skills_mc", "--eval-fraction", "0.1")
    refused = run_cli(*args, "--output-dir", str(tmp_path / "out"), "--max-contamination", "0.05")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    message = " ".join(refused.stderr.split())
    assert message.startswith(f"error: The training data holds benchmark answers: {quiz} overlaps ")
    assert "documents of the benchmark task practical_skills_mc" in message
    assert "than max_contamination (5.0%) allows" in message
    assert not (tmp_path / "out" / "stats.json").exists()
    allowed = run_cli(*args, "--output-dir", str(tmp_path / "ok"))  # the default, 1, never refuses
    assert allowed.returncode == 0, allowed.stderr
