"""The train/eval split: a pure function of each row's normalised content and the seed.

A row is in eval when the top 53 bits of xxh3_64(content key, seed), read as a
number in [0, 1), fall below ``eval_fraction``. The tests here pin down what that
rule buys the user: reproducible files, a split that survives appends and
reordering, an honest eval share, and an ``id`` that names a row's content.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest
import xxhash
from conftest import all_rows, qa, read_split, read_stats, run_cli, snapshot, write_jsonl

from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.data.schema import OUTPUT_SCHEMA

TOPICS = ("knots", "first aid", "photography")


def records(start: int, stop: int) -> list[dict]:
    """Distinct valid records of mixed shapes, numbered ``start`` .. ``stop - 1``."""
    out = []
    for i in range(start, stop):
        kind = i % 3
        if kind == 0:
            out.append(qa(i, TOPICS[i % len(TOPICS)]))
        elif kind == 1:
            out.append({"prompt": f"prompt {i}", "completion": f"completion {i}"})
        else:
            out.append(
                {"messages": [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": f"hi {i}"}]}
            )
    return out


def content(row: dict) -> str:
    """A row's conversation as a hashable, order-preserving string."""
    return json.dumps(row["messages"], ensure_ascii=False)


def assignment(output_dir) -> dict[str, str]:
    """Conversation content -> "train" or "eval", asserting no content is in both."""
    where: dict[str, str] = {}
    for split in ("train", "eval"):
        for row in read_split(output_dir, split):
            assert content(row) not in where, f"{content(row)} appears twice"
            where[content(row)] = split
    return where


def ids(output_dir) -> dict[str, int]:
    return {content(row): row["id"] for row in all_rows(output_dir)}


def expected_id(messages: list[dict], seed: int) -> int:
    """The documented content hash, computed independently of the implementation.

    The content key is each turn as ``role \\x1f content``, turns joined by ``\\x1e``,
    ending in ``\\x1d``; the id is xxh3_64 of its UTF-8 bytes, stored as signed int64.
    """
    key = "\x1e".join(f"{m['role']}\x1f{m['content']}" for m in messages) + "\x1d"
    return int(np.uint64(xxhash.xxh3_64_intdigest(key.encode("utf-8"), seed)).view(np.int64))


def in_eval(row_id: int, eval_fraction: float) -> bool:
    unsigned = int(np.int64(row_id).view(np.uint64))
    return (unsigned >> 11) / 2**53 < eval_fraction


def test_same_input_twice_gives_byte_identical_outputs(tmp_path):
    """Reruns (retries, cache misses) must reproduce the very same files, so lineage and caching can trust them."""
    src = write_jsonl(tmp_path / "in.jsonl", records(0, 3000))
    for out in ("a", "b"):
        result = run_cli("--input", src, "--output-dir", tmp_path / out, "--eval-fraction", "0.2")
        assert result.returncode == 0, result.stderr
    first, second = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert set(first) == {"train.parquet", "eval.parquet", "rejects.jsonl", "report.md", "stats.json"}
    assert first == second
    assert read_stats(tmp_path / "a")["rows"]["eval"] > 0


def test_appending_records_never_moves_existing_rows(tmp_path):
    """Growing a dataset must not leak earlier eval rows into training (or vice versa); checked over several appends."""
    options = PrepareOptions(eval_fraction=0.3, seed=42)
    previous = None
    for step, size in enumerate([1000, 1400, 3000, 3050, 3051]):
        src = write_jsonl(tmp_path / "in.jsonl", records(0, size))
        prepare(str(src), tmp_path / f"out{step}", options)
        current = assignment(tmp_path / f"out{step}")
        assert len(current) == size
        if previous is not None:
            moved = {key for key, split in previous.items() if current.get(key) != split}
            assert not moved, f"append {step} moved {len(moved)} existing rows"
        previous = current
    assert set(previous.values()) == {"train", "eval"}


def test_reordering_input_lines_does_not_change_the_split(tmp_path):
    """Shuffled or re-sharded exports of the same data must split identically, with the same ids."""
    lines = records(0, 2000)
    shuffled = lines[:]
    random.Random(7).shuffle(shuffled)
    assert shuffled != lines
    options = PrepareOptions(eval_fraction=0.25)
    prepare(str(write_jsonl(tmp_path / "a.jsonl", lines)), tmp_path / "a", options)
    prepare(str(write_jsonl(tmp_path / "b.jsonl", shuffled)), tmp_path / "b", options)
    assert assignment(tmp_path / "a") == assignment(tmp_path / "b")
    assert ids(tmp_path / "a") == ids(tmp_path / "b")


def test_a_different_seed_changes_the_assignment(tmp_path):
    """--seed is the knob for drawing a fresh held-out set; it must actually reshuffle rows (and their ids)."""
    src = write_jsonl(tmp_path / "in.jsonl", records(0, 2000))
    prepare(str(src), tmp_path / "s42", PrepareOptions(eval_fraction=0.3, seed=42))
    prepare(str(src), tmp_path / "s7", PrepareOptions(eval_fraction=0.3, seed=7))
    a, b = assignment(tmp_path / "s42"), assignment(tmp_path / "s7")
    assert a.keys() == b.keys()
    changed = sum(a[key] != b[key] for key in a)
    # Independent draws at 0.3 disagree on about 2 * 0.3 * 0.7 = 42% of rows.
    assert 0.3 * len(a) < changed < 0.55 * len(a)
    ids_a, ids_b = ids(tmp_path / "s42"), ids(tmp_path / "s7")
    assert all(ids_a[key] != ids_b[key] for key in ids_a)


@pytest.mark.parametrize("eval_fraction", [0.1, 0.3])
def test_eval_share_is_close_to_eval_fraction(tmp_path, eval_fraction):
    """The hash must be uniform enough that the held-out share is what was asked for."""
    src = write_jsonl(tmp_path / "in.jsonl", records(0, 5000))
    result = prepare(str(src), tmp_path / "out", PrepareOptions(eval_fraction=eval_fraction))
    train, evals = read_split(tmp_path / "out", "train"), read_split(tmp_path / "out", "eval")
    assert len(train) + len(evals) == 5000
    assert abs(len(evals) / 5000 - eval_fraction) < 0.02
    assert result.stats.rows == {"train": len(train), "eval": len(evals)}


def test_eval_fraction_zero_writes_an_empty_eval_file_with_the_schema(tmp_path):
    """Downstream steps open eval.parquet unconditionally; with no eval share it must exist, be empty and typed."""
    src = write_jsonl(tmp_path / "in.jsonl", records(0, 500))
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0")
    assert result.returncode == 0, result.stderr
    table = pq.read_table(tmp_path / "out" / "eval.parquet")
    assert table.num_rows == 0
    assert table.schema.equals(OUTPUT_SCHEMA)
    assert pq.read_schema(tmp_path / "out" / "train.parquet").equals(OUTPUT_SCHEMA)
    assert len(read_split(tmp_path / "out", "train")) == 500
    assert read_stats(tmp_path / "out")["rows"] == {"train": 500, "eval": 0}


def test_train_and_eval_are_disjoint_even_with_duplicates_in_the_input(tmp_path):
    """An eval row that is also trained on makes the evaluation meaningless; duplicates are the usual way in."""
    base = records(0, 800)
    lines = base + base[::3] + base[::7]
    random.Random(3).shuffle(lines)
    result = prepare(
        str(write_jsonl(tmp_path / "in.jsonl", lines)), tmp_path / "out", PrepareOptions(eval_fraction=0.4)
    )
    train, evals = read_split(tmp_path / "out", "train"), read_split(tmp_path / "out", "eval")
    assert {content(r) for r in train}.isdisjoint(content(r) for r in evals)
    assert {r["id"] for r in train}.isdisjoint(r["id"] for r in evals)
    assert len(train) + len(evals) == 800
    assert result.stats.duplicates == len(lines) - 800


def test_id_is_the_seeded_xxh3_content_hash_and_decides_the_split(tmp_path):
    """``id`` is documented as the 64-bit content hash: later stages and other tools can recompute it from the row."""
    seed, eval_fraction = 1234, 0.3
    src = write_jsonl(
        tmp_path / "in.jsonl", records(0, 1500) + [{"prompt": "naïve café ☕", "completion": "日本語 ok"}]
    )
    prepare(str(src), tmp_path / "out", PrepareOptions(eval_fraction=eval_fraction, seed=seed))
    for split in ("train", "eval"):
        rows = read_split(tmp_path / "out", split)
        assert rows
        for row in rows:
            assert row["id"] == expected_id(row["messages"], seed)
            assert in_eval(row["id"], eval_fraction) == (split == "eval")
    row_ids = [r["id"] for r in all_rows(tmp_path / "out")]
    assert len(set(row_ids)) == len(row_ids) == 1501


def test_id_and_split_ignore_the_injected_system_prompt(tmp_path):
    """Changing --system-prompt changes what is trained on, but must not reshuffle which rows are held out."""
    src = write_jsonl(tmp_path / "in.jsonl", records(0, 1000))
    prepare(str(src), tmp_path / "plain", PrepareOptions(eval_fraction=0.3))
    prepare(str(src), tmp_path / "prompted", PrepareOptions(eval_fraction=0.3, system_prompt="Be brief."))

    def by_id(output_dir):
        return {r["id"]: split for split in ("train", "eval") for r in read_split(output_dir, split)}

    assert by_id(tmp_path / "plain") == by_id(tmp_path / "prompted")
    assert all(r["messages"][0] == {"role": "system", "content": "Be brief."} for r in all_rows(tmp_path / "prompted"))


def test_raising_eval_fraction_only_moves_rows_into_eval(tmp_path):
    """A threshold on a fixed per-row number: a larger eval share is a superset of a smaller one."""
    src = write_jsonl(tmp_path / "in.jsonl", records(0, 2000))
    prepare(str(src), tmp_path / "small", PrepareOptions(eval_fraction=0.1))
    prepare(str(src), tmp_path / "large", PrepareOptions(eval_fraction=0.3))
    small = {content(r) for r in read_split(tmp_path / "small", "eval")}
    large = {content(r) for r in read_split(tmp_path / "large", "eval")}
    assert small < large
