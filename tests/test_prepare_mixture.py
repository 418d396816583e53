"""Several sources in one data step (``prepare`` with ``SourceFiles``): each read with its own field_map into one
eval split, the training rows mixed by the weights, chosen by the split seed."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

from common.errors import UserError
from common.records import DataStats
from components.data.mixture import DataSource
from components.data.options import PrepareOptions
from components.data.prepare import FAILED_REJECTS_FILE, SourceFiles, prepare


def questions(path) -> list[str]:
    return [row["messages"][0]["content"] for row in pq.read_table(path).to_pylist()]


@pytest.fixture
def two_sources(tmp_path):
    domain = write_jsonl(
        tmp_path / "domain.jsonl", [{"question": f"Domain {i}?", "answer": f"D{i}."} for i in range(400)]
    )
    general = write_jsonl(
        tmp_path / "general.jsonl", [{"input": f"General {i}?", "answer": f"G{i}."} for i in range(400)]
    )
    return domain, general


def mixture(domain, general, weights=(3, 1)):
    return [
        SourceFiles(DataSource(str(domain), weights[0]), [domain]),
        SourceFiles(DataSource(str(general), weights[1], '{"question": "input"}'), [general]),
    ]


def test_the_weights_are_the_shares_of_the_training_rows_and_eval_holds_every_source(two_sources, tmp_path):
    domain, general = two_sources
    result = prepare(mixture(domain, general), tmp_path / "out", PrepareOptions(eval_fraction=0.1))
    train = questions(result.train_path)
    from_domain = sum(question.startswith("Domain") for question in train)
    from_general = sum(question.startswith("General") for question in train)
    assert from_domain + from_general == len(train) == result.stats.train_rows
    evaluation = questions(result.eval_path)
    held_out = {name: sum(q.startswith(name) for q in evaluation) for name in ("Domain", "General")}
    assert held_out["Domain"] > 0 and held_out["General"] > 0
    # the largest mixture of these shares: every training row of the domain source, a third as many general ones
    assert from_domain == 400 - held_out["Domain"] and abs(from_general - from_domain / 3) < 1

    # stats.json accounts for each source, and reads back as written
    first, second = DataStats.read(result.stats_path).sources
    assert (first.uri, first.weight, second.weight) == (str(domain), 3.0, 1.0)
    assert (first.records, first.rejected, first.duplicates_within, first.duplicates_across) == (400, 0, 0, 0)
    assert (first.train_available, first.train_rows, first.eval_rows) == (from_domain, from_domain, held_out["Domain"])
    assert (second.train_rows, second.eval_rows) == (from_general, held_out["General"])
    assert second.train_available == 400 - held_out["General"] > second.train_rows
    assert first.realised_weight == pytest.approx(from_domain / len(train), abs=1e-6)
    assert first.realised_weight + second.realised_weight == pytest.approx(1)
    assert not set(train) & set(evaluation)


def test_the_rows_chosen_follow_the_split_seed(two_sources, tmp_path):
    domain, general = two_sources
    first = prepare(mixture(domain, general), tmp_path / "a", PrepareOptions(seed=1))
    again = prepare(mixture(domain, general), tmp_path / "b", PrepareOptions(seed=1))
    other = prepare(mixture(domain, general, (1, 3)), tmp_path / "c", PrepareOptions(seed=1))
    assert questions(first.train_path) == questions(again.train_path)
    assert first.stats.fingerprint == again.stats.fingerprint != other.stats.fingerprint


def test_without_weights_every_row_is_used_and_repeats_are_counted_where_they_come_from(tmp_path):
    records = [{"question": f"Q{i}?", "answer": "A."} for i in range(50)]
    first = write_jsonl(tmp_path / "first.jsonl", [*records, records[0], {"question": "", "answer": "A."}])
    second = write_jsonl(tmp_path / "second.jsonl", [{"question": f"Q{i}?", "answer": "A."} for i in range(40, 90)])
    sources = [SourceFiles(DataSource(str(first)), [first]), SourceFiles(DataSource(str(second)), [second])]
    result = prepare(sources, tmp_path / "out", PrepareOptions(eval_fraction=0.2, max_reject_fraction=0.5))
    assert result.stats.duplicates == 11 and result.stats.train_rows + result.stats.eval_rows == 90
    one, two = result.stats.sources
    assert (one.records, one.rejected, one.duplicates_within, one.duplicates_across) == (52, 1, 1, 0)
    assert (two.records, two.rejected, two.duplicates_within, two.duplicates_across) == (50, 0, 0, 10)
    assert one.rejected_by_reason and not two.rejected_by_reason
    assert one.train_rows == one.train_available and two.train_rows == two.train_available  # every row
    assert one.train_rows + two.train_rows == result.stats.train_rows


def test_a_source_whose_every_record_is_rejected_is_named_and_nothing_is_written(two_sources, tmp_path):
    domain, _ = two_sources
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"prompt": f"P{i}"} for i in range(20)])
    sources = [SourceFiles(DataSource(str(domain), 1), [domain]), SourceFiles(DataSource(str(broken), 1), [broken])]
    out = tmp_path / "out"
    with pytest.raises(UserError) as raised:
        prepare(sources, out, PrepareOptions(max_reject_fraction=0.5))
    message = str(raised.value)
    assert message.startswith(f"dataset_sources: {broken} has no usable training rows: each of its records was")
    assert str(out / FAILED_REJECTS_FILE) in message and (out / FAILED_REJECTS_FILE).is_file()
    assert not (out / "train.parquet").exists() and not (out / "stats.json").exists()


def test_a_misspelt_field_map_of_a_source_names_that_source(two_sources, tmp_path):
    domain, general = two_sources
    sources = [
        SourceFiles(DataSource(str(domain), 3), [domain]),
        SourceFiles(DataSource(str(general), 1, '{"question": "inptu"}'), [general]),
    ]
    with pytest.raises(UserError) as raised:
        prepare(sources, tmp_path / "out", PrepareOptions(eval_fraction=0.1))
    assert str(raised.value).startswith(
        f"dataset_sources source 2 ({general}): its field_map reads question -> inptu, but no record of {general}"
    )
