"""Bad records are reported, not fatal: every reject names its file, exact line and reason.

Also covers what the run report (stats.json) counts: records, blank lines, rejects by
reason, duplicates, split sizes, length percentiles and the dataset fingerprint.
"""

from __future__ import annotations

import functools
import re
import shutil

import pyarrow.json as pajson
import pytest
from conftest import all_rows, qa, read_rejects, read_split, read_stats, run_cli, write_jsonl

import components.data.parse as parse_module
import components.data.prepare as prepare_module
from components.data.chunks import read_chunks
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.data.schema import Reason

# Keep every valid row in train and never fail on the reject share: these tests look at rejects.
LENIENT = PrepareOptions(eval_fraction=0.0, max_reject_fraction=0.9)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def line_reasons(output_dir, name="rejects.jsonl"):
    return [(r["line"], r["reason"]) for r in read_rejects(output_dir, name)]


def first_user_turns(output_dir):
    return [row["messages"][0]["content"] for row in all_rows(output_dir)]


# One line per rejection reason. Keep in step with ``Reason``: test_every_reason_has_a_case fails otherwise.
BAD_LINE = {
    Reason.INVALID_UTF8: b'{"prompt": "caf\xe9 au lait?", "completion": "Coffee with milk."}',
    Reason.INVALID_JSON: '{"prompt": "unterminated", "completion": ',
    Reason.NOT_AN_OBJECT: '["prompt", "completion"]',
    Reason.WRONG_TYPE: {"prompt": 5, "completion": "five"},
    Reason.UNKNOWN_SHAPE: {"text": "a record in some other format"},
    Reason.MISSING_FIELD: {"topic": "knots", "question": "which knot?"},
    Reason.BLANK_FIELD: {"prompt": "   ", "completion": "an answer to nothing"},
    Reason.EMPTY_CONVERSATION: {"messages": []},
    Reason.UNKNOWN_ROLE: {"messages": [{"role": "human", "content": "hi"}, assistant("hello")]},
    Reason.NOT_ENDING_WITH_ASSISTANT: {"messages": [user("hi"), assistant("hello"), user("and?")]},
    Reason.PREFERENCE_PAIR: {"prompt": "Which knot?", "chosen": "A bowline.", "rejected": "Any."},
}


# The reasons only preference tuning gives (its cases: tests/test_prepare_pairs.py), and the one it gives a
# conversation.
PAIR_REASONS = {Reason.NOT_A_PAIR, Reason.IDENTICAL_SIDES, Reason.SIDES_PART_BEFORE_THE_ANSWER}


def test_every_reason_has_a_case():
    """A new rejection reason must come with a record that triggers it, here (or, for pairs, in test_prepare_pairs)."""
    assert set(BAD_LINE) == set(Reason) - {Reason.OK} - PAIR_REASONS


@pytest.mark.parametrize("reason", list(BAD_LINE), ids=lambda r: r.label)
@pytest.mark.parametrize("unparsable_neighbour", [False, True], ids=["fast_path", "line_by_line"])
def test_each_reason_is_reported_with_file_and_line(tmp_path, reason, unparsable_neighbour):
    """Users fix data by jumping to file:line, so the line must be exact and the reason right.

    A chunk with any unparsable line is re-read line by line; a record's reason must not
    depend on which path its chunk took, so each case also runs next to an invalid JSON line.
    """
    lines = [qa(1), qa(2), BAD_LINE[reason], qa(3)]
    if unparsable_neighbour:
        lines.append("{not json")
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", LENIENT)
    rejects = read_rejects(tmp_path / "out")
    assert (rejects[0]["source"], rejects[0]["line"], rejects[0]["reason"]) == (str(src), 3, reason.label)
    assert rejects[0]["detail"]
    assert [(r["line"], r["reason"]) for r in rejects[1:]] == ([(5, "invalid_json")] if unparsable_neighbour else [])
    assert first_user_turns(tmp_path / "out") == [f"For knots, question number {i}?" for i in (1, 2, 3)]
    expected_count = 2 if unparsable_neighbour and reason == Reason.INVALID_JSON else 1
    assert read_stats(tmp_path / "out")["rejected_by_reason"][reason.label] == expected_count


MORE_BAD_LINES = [
    ("null", "not_an_object"),
    ("  null", "not_an_object"),
    ('"just a string"', "not_an_object"),
    ("42", "not_an_object"),
    ('{"prompt": "a", "completion": "b"} {"prompt": "c", "completion": "d"}', "invalid_json"),
    ('{"prompt": "\\ud800", "completion": "lone surrogate"}', "invalid_json"),
    (b'{"prompt": "ok", "completion": "ok", "note": "\xff\xfe"}', "invalid_utf8"),
    ({"messages": {"role": "user", "content": "hi"}}, "wrong_type"),
    ({"messages": ["hi", "hello"]}, "wrong_type"),
    ({"messages": [user("hi"), {"role": "assistant", "content": 7}]}, "wrong_type"),
    ({"instruction": ["a", "list"], "output": "o"}, "wrong_type"),
    ({"messages": [None, assistant("hello")]}, "missing_field"),
    ({"messages": [{"role": "user"}, assistant("hello")]}, "missing_field"),
    ({"messages": [{"content": "hi"}, assistant("hello")]}, "missing_field"),
    ({"instruction": "Name a knot."}, "missing_field"),
    ({"prompt": "only a prompt"}, "missing_field"),
    ({"topic": "knots", "question": "q?", "answer": None}, "missing_field"),
    ({"messages": [user("hi"), assistant(" \n\t")]}, "blank_field"),
    ({"topic": "t", "question": " ", "answer": "a"}, "blank_field"),
    ({"messages": [{"role": "USER", "content": "hi"}, assistant("hello")]}, "unknown_role"),
    ({"messages": [{"role": "system", "content": "be terse"}]}, "not_ending_with_assistant"),
    ({}, "unknown_shape"),
]


@pytest.mark.parametrize(("line", "reason"), MORE_BAD_LINES)
def test_more_bad_records(tmp_path, line, reason):
    """Variants of each reason seen in real files; none may crash the stage or be accepted.

    Runs the real CLI so that a crash inside pyarrow (a top-level ``null`` used to
    segfault its JSON reader) shows up as a failed test rather than a dead test run.
    The bad line comes first, at the start of its chunk, where that crash happened.
    """
    src = write_jsonl(tmp_path / "in.jsonl", [line] + [qa(i) for i in range(30)])
    result = run_cli(
        "--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0", "--max-reject-fraction", "0.5"
    )
    assert result.returncode == 0, result.stderr
    assert line_reasons(tmp_path / "out") == [(1, reason)]
    assert len(read_split(tmp_path / "out", "train")) == 30


@pytest.mark.parametrize(("line", "reason"), MORE_BAD_LINES)
def test_more_bad_records_after_an_unparsable_line(tmp_path, line, reason):
    """The same records in a chunk that is parsed line by line get the same reason."""
    src = write_jsonl(tmp_path / "in.jsonl", ["{oops", line] + [qa(i) for i in range(30)])
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == [(1, "invalid_json"), (2, reason)]
    assert len(read_split(tmp_path / "out", "train")) == 30


def test_two_objects_on_one_line_next_to_a_blank_line(tmp_path):
    """pyarrow reads ``{...} {...}`` as two rows and skips blank lines; when the two cancel out the
    row count still matches the line count, which must not fool the stage into accepting the line
    and numbering every later record one line off."""
    lines = [qa(1), '{"prompt": "a", "completion": "b"} {"prompt": "c", "completion": "d"}', {"text": "x"}, "", qa(2)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == [(2, "invalid_json"), (3, "unknown_shape")]
    assert first_user_turns(tmp_path / "out") == ["For knots, question number 1?", "For knots, question number 2?"]


def test_blank_lines_are_skipped_and_later_line_numbers_stay_exact(tmp_path):
    """Blank and whitespace-only lines are common (trailing newlines, hand edits); they are not
    records, not rejects, and must not shift the line numbers reported after them."""
    lines = ["", qa(1), "   ", "", {"text": "no shape"}, "\t", qa(2), "\r", {"messages": []}, "", qa(3), ""]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == [(5, "unknown_shape"), (9, "empty_conversation")]
    stats = read_stats(tmp_path / "out")
    assert (stats["records"], stats["blank_lines"], stats["rejected"]) == (5, 7, 2)
    assert len(all_rows(tmp_path / "out")) == 3


def test_blank_lines_with_an_unparsable_line_in_the_same_chunk(tmp_path):
    """The line-by-line fallback counts blank lines itself; its numbering must match the fast path's."""
    lines = ["", qa(1), "  ", "{oops", "", qa(2), "", "[1, 2]", qa(3)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == [(4, "invalid_json"), (8, "not_an_object")]
    stats = read_stats(tmp_path / "out")
    assert (stats["records"], stats["blank_lines"]) == (5, 4)


def test_invalid_utf8_rejects_only_that_line(tmp_path):
    """A few Latin-1 bytes in a big UTF-8 file must cost one record, not the run (nor a crash),
    and the neighbours' real non-ASCII text must come through intact."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"prompt": "Qu'est-ce qu'un nœud de chaise ?", "completion": "Un nœud qui ne glisse pas — très utile."},
            b'{"prompt": "Stra\xdfe?", "completion": "street"}',
            {"prompt": "日本語で？", "completion": "はい。"},
        ],
    )
    prepare(str(src), tmp_path / "out", LENIENT)
    (reject,) = read_rejects(tmp_path / "out")
    assert (reject["source"], reject["line"], reject["reason"]) == (str(src), 2, "invalid_utf8")
    assert "UTF-8" in reject["detail"]
    assert "Stra" in reject["record"]
    assert [row["messages"][1]["content"] for row in all_rows(tmp_path / "out")] == [
        "Un nœud qui ne glisse pas — très utile.",
        "はい。",
    ]


@pytest.mark.parametrize("unparsable_neighbour", [False, True], ids=["fast_path", "line_by_line"])
def test_reject_entries_carry_an_excerpt_of_the_record(tmp_path, unparsable_neighbour):
    """The excerpt lets users find the record without opening a multi-GB file: it is the line as
    written (unknown keys such as ids included, whichever parse path ran) and stays short."""
    lines = [qa(1), {"weird": "x" * 5000}, {"id": "rec-17", "prompt": "p"}] + (
        ["{oops"] if unparsable_neighbour else []
    )
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", LENIENT)
    weird, missing = read_rejects(tmp_path / "out")[:2]
    assert weird["record"].startswith('{"weird": "xxx')
    assert len(weird["record"]) < 400
    assert missing["record"] == '{"id": "rec-17", "prompt": "p"}'


def test_mixed_file_reports_every_bad_line(tmp_path):
    """A realistic messy file: every bad line is reported once, with its own reason, in line order."""
    lines = [
        qa(1),  # 1
        "{broken",  # 2
        "",  # 3 blank
        {"prompt": "p", "completion": 3},  # 4
        qa(2),  # 5
        "null",  # 6
        {"instruction": "i"},  # 7
        b'{"prompt": "\xc3\x28", "completion": "c"}',  # 8
        {"question": "q", "answer": " ", "topic": "t"},  # 9
        {"messages": [user("u"), {"role": "bot", "content": "b"}]},  # 10
        qa(3),  # 11
        {"messages": [user("u")]},  # 12
        {"messages": []},  # 13
        {"unrelated": 1},  # 14
        "   ",  # 15 blank
        {"messages": [user("u"), assistant("a")]},  # 16
        "[]",  # 17
    ]
    expected = [
        (2, "invalid_json"),
        (4, "wrong_type"),
        (6, "not_an_object"),
        (7, "missing_field"),
        (8, "invalid_utf8"),
        (9, "blank_field"),
        (10, "unknown_role"),
        (12, "not_ending_with_assistant"),
        (13, "empty_conversation"),
        (14, "unknown_shape"),
        (17, "not_an_object"),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == expected
    stats = read_stats(tmp_path / "out")
    assert stats["rejected_by_reason"] == {
        "blank_field": 1,
        "empty_conversation": 1,
        "invalid_json": 1,
        "invalid_utf8": 1,
        "missing_field": 1,
        "not_an_object": 2,
        "not_ending_with_assistant": 1,
        "unknown_role": 1,
        "unknown_shape": 1,
        "wrong_type": 1,
    }
    assert (stats["records"], stats["blank_lines"], stats["rejected"]) == (15, 2, 11)
    assert first_user_turns(tmp_path / "out") == [
        "For knots, question number 1?",
        "For knots, question number 2?",
        "For knots, question number 3?",
        "u",
    ]


# --- many chunks ---------------------------------------------------------------------------


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Make prepare read 512-byte chunks (and pyarrow parse 1 KiB blocks) so small files span many.

    ``read_chunks`` takes its size as a default argument bound at import time, so patching
    ``chunks.CHUNK_BYTES`` would do nothing; prepare's own reference to ``read_chunks`` is
    what gets replaced. Returns counters of chunks parsed and chunks that fell back.
    """
    counts = {"chunks": 0, "line_by_line": 0}
    monkeypatch.setattr(prepare_module, "read_chunks", functools.partial(read_chunks, chunk_bytes=512))
    monkeypatch.setattr(parse_module, "_READ_OPTIONS", pajson.ReadOptions(use_threads=True, block_size=1024))
    real_parse_chunk, real_parse_lines = parse_module.parse_chunk, parse_module._parse_lines

    def counting_parse_chunk(chunk, *fields):
        counts["chunks"] += 1
        return real_parse_chunk(chunk, *fields)

    def counting_parse_lines(chunk, fields):
        counts["line_by_line"] += 1
        return real_parse_lines(chunk, fields)

    monkeypatch.setattr(prepare_module, "parse_chunk", counting_parse_chunk)
    monkeypatch.setattr(parse_module, "_parse_lines", counting_parse_lines)
    return counts


def many_chunk_file(path):
    """About 600 lines with bad records spread through the file; returns the expected (line, reason)."""
    lines, expected = [], []
    for i in range(1, 601):
        if i % 97 == 0:
            lines.append("{not json")  # forces its chunk onto the line-by-line path
            expected.append((i, "invalid_json"))
        elif i % 41 == 0:
            lines.append({"messages": [user(f"u{i}")]})  # found after parsing, on whichever path
            expected.append((i, "not_ending_with_assistant"))
        elif i % 53 == 0:
            lines.append({"prompt": f"p{i}"})
            expected.append((i, "missing_field"))
        elif i % 29 == 0:
            lines.append("")
        elif i == 300:
            lines.append({"prompt": "long " + "y" * 3000, "completion": "a line longer than a chunk"})
        else:
            lines.append(qa(i))
    write_jsonl(path, lines)
    return expected


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz"])
def test_line_numbers_exact_across_many_chunks(tmp_path, tiny_chunks, name):
    """Big files are read in chunks; a chunk's first line number is carried from the one before.

    Bad lines sit in chunks that stay on pyarrow's fast path and in chunks that fall back to
    the line-by-line parse, and pyarrow splits each chunk into several record batches; an
    off-by-one anywhere in that bookkeeping shows up as a wrong line here.
    """
    src = tmp_path / name
    expected = many_chunk_file(src)
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == expected
    assert tiny_chunks["chunks"] > 50
    assert 0 < tiny_chunks["line_by_line"] < tiny_chunks["chunks"]
    stats = read_stats(tmp_path / "out")
    blank = sum(1 for i in range(1, 601) if i % 29 == 0 and i % 97 and i % 41 and i % 53)
    assert (stats["records"], stats["blank_lines"]) == (600 - blank, blank)
    assert len(all_rows(tmp_path / "out")) == 600 - blank - len(expected)


def test_chunking_does_not_change_the_result(tmp_path, monkeypatch):
    """Chunk size is a performance knob: rows, rejects and fingerprint must not depend on it."""
    src = tmp_path / "in.jsonl"
    many_chunk_file(src)
    prepare(str(src), tmp_path / "big", PrepareOptions(eval_fraction=0.2, max_reject_fraction=0.9))
    monkeypatch.setattr(prepare_module, "read_chunks", functools.partial(read_chunks, chunk_bytes=700))
    prepare(str(src), tmp_path / "small", PrepareOptions(eval_fraction=0.2, max_reject_fraction=0.9))
    for split in ("train", "eval"):
        assert read_split(tmp_path / "small", split) == read_split(tmp_path / "big", split)
    assert read_rejects(tmp_path / "small") == read_rejects(tmp_path / "big")
    assert read_stats(tmp_path / "small") == read_stats(tmp_path / "big")


def test_last_line_without_newline_and_overlong_lines(tmp_path, tiny_chunks):
    """A missing final newline and lines longer than a chunk are both normal; numbering survives them."""
    body = b"".join(
        [
            b'{"prompt": "' + b"z" * 2000 + b'", "completion": "long"}\n',  # line 1, ~4 chunks
            b'{"prompt": "p2"}\n',  # line 2
            b'{"prompt": "p3", "completion": "c3"}\n',  # line 3
            b'{"prompt": "' + b"w" * 1500 + b'"}\n',  # line 4, long and bad
            b'{"prompt": "p5", "completion": "c5"}\n',  # line 5
            b'{"prompt": "p6", "completion": ""}',  # line 6, no newline
        ]
    )
    src = tmp_path / "in.jsonl"
    src.write_bytes(body)
    prepare(str(src), tmp_path / "out", LENIENT)
    assert line_reasons(tmp_path / "out") == [(2, "missing_field"), (4, "missing_field"), (6, "blank_field")]
    assert [turn[0]["content"][:2] for turn in (row["messages"] for row in all_rows(tmp_path / "out"))] == [
        "zz",
        "p3",
        "p5",
    ]


# --- duplicates ----------------------------------------------------------------------------


def test_exact_duplicates_dropped_and_counted(tmp_path):
    """Repeated records would be over-weighted in training; the first copy is kept, the rest counted."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(1), qa(2), qa(1), qa(3), qa(2), qa(1)])
    prepare(str(src), tmp_path / "out", LENIENT)
    assert first_user_turns(tmp_path / "out") == [f"For knots, question number {i}?" for i in (1, 2, 3)]
    stats = read_stats(tmp_path / "out")
    assert (stats["records"], stats["duplicates"], stats["rejected"]) == (6, 3, 0)
    assert stats["rows"] == {"train": 3, "eval": 0}


def test_duplicates_are_judged_on_the_normalised_conversation(tmp_path):
    """Dedup compares what training sees: the same turns written in different shapes are one record."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"prompt": "What is a bowline?", "completion": "A knot."},
            {"messages": [user("What is a bowline?"), assistant("A knot.")]},
            {"instruction": "What is a bowline?", "input": "", "output": "A knot.", "id": 99},
            {"topic": "knots", "question": "what is a bowline?", "answer": "A knot."},
            {"messages": [user("For knots, what is a bowline?"), assistant("A knot.")]},
        ],
    )
    prepare(str(src), tmp_path / "out", LENIENT)
    rows = all_rows(tmp_path / "out")
    assert [row["messages"][0]["content"] for row in rows] == ["What is a bowline?", "For knots, what is a bowline?"]
    stats = read_stats(tmp_path / "out")
    assert stats["duplicates"] == 3
    assert stats["shapes"] == {"prompt_completion": 1, "question_answer": 1}


@pytest.mark.parametrize(
    "near_copy",
    [
        {"prompt": "What is a bowline?", "completion": "A knot. "},
        {"prompt": "what is a bowline?", "completion": "A knot."},
        {"messages": [{"role": "system", "content": "Be terse."}, user("What is a bowline?"), assistant("A knot.")]},
        {
            "messages": [
                user("What is a bowline?"),
                assistant("A knot."),
                user("What is a bowline?"),
                assistant("A knot."),
            ]
        },
        {"messages": [{"role": "system", "content": "What is a bowline?"}, assistant("A knot.")]},
    ],
    ids=["trailing_space", "case", "system_turn", "repeated_turns", "role_differs"],
)
def test_near_duplicates_are_kept(tmp_path, near_copy):
    """Only exact duplicates go: any difference in text, roles or turns is a different example."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "What is a bowline?", "completion": "A knot."}, near_copy])
    prepare(str(src), tmp_path / "out", LENIENT)
    assert read_stats(tmp_path / "out")["duplicates"] == 0
    assert len(all_rows(tmp_path / "out")) == 2


def test_duplicates_across_chunks_and_files(tmp_path, tiny_chunks):
    """Dedup is global: a copy in a later chunk or another file is still a copy."""
    write_jsonl(tmp_path / "data" / "a.jsonl", [qa(i) for i in range(40)])
    write_jsonl(tmp_path / "data" / "b.jsonl", [qa(i) for i in range(30, 50)] + [qa(0)])
    prepare(str(tmp_path / "data"), tmp_path / "out", LENIENT)
    assert tiny_chunks["chunks"] > 5
    stats = read_stats(tmp_path / "out")
    assert (stats["records"], stats["duplicates"]) == (61, 11)
    assert sorted(int(t.split()[-1].rstrip("?")) for t in first_user_turns(tmp_path / "out")) == list(range(50))


def test_duplicates_do_not_count_as_rejects(tmp_path):
    """A heavily duplicated file is not broken data; it must not trip --max-reject-fraction."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(1)] * 10 + [qa(2)])
    result = prepare(str(src), tmp_path / "out", PrepareOptions(eval_fraction=0.0))
    assert (result.stats.duplicates, result.stats.rejected, result.stats.reject_fraction) == (9, 0, 0.0)


# --- stats.json ----------------------------------------------------------------------------


def test_stats_counts_and_reject_fraction(tmp_path):
    """stats.json is what people and dashboards read; its counts must add up."""
    lines = [qa(i) for i in range(30)] + ["", qa(0), "{bad", {"prompt": "p"}, "  ", {"text": "t"}]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    prepare(str(src), tmp_path / "out", PrepareOptions(eval_fraction=0.3, max_reject_fraction=0.2))
    stats = read_stats(tmp_path / "out")
    assert stats["records"] == 34
    assert stats["blank_lines"] == 2
    assert stats["rejected"] == 3
    assert stats["rejected_by_reason"] == {"invalid_json": 1, "missing_field": 1, "unknown_shape": 1}
    assert stats["reject_fraction"] == round(3 / 34, 6)
    assert stats["duplicates"] == 1
    assert stats["rows"]["train"] + stats["rows"]["eval"] == 30
    assert stats["rows"] == {
        "train": len(read_split(tmp_path / "out", "train")),
        "eval": len(read_split(tmp_path / "out", "eval")),
    }
    assert stats["rows"]["eval"] > 0 and stats["rows"]["train"] > 0
    assert stats["inputs"] == [str(src)]
    assert stats["options"] == {
        "eval_fraction": 0.3,
        "seed": 42,
        "max_reject_fraction": 0.2,
        "system_prompt": "",
        "field_map": "",
        "decontaminate": True,
        "max_contamination": 1.0,
    }


def test_stats_of_a_clean_file_have_no_rejects(tmp_path):
    """No rejects means an empty rejects.jsonl and an empty breakdown, not missing keys."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(i) for i in range(5)])
    prepare(str(src), tmp_path / "out", LENIENT)
    stats = read_stats(tmp_path / "out")
    assert (stats["rejected"], stats["rejected_by_reason"], stats["reject_fraction"]) == (0, {}, 0.0)
    assert (tmp_path / "out" / "rejects.jsonl").read_text() == ""


def test_length_percentiles_cover_kept_rows_only(tmp_path):
    """Length percentiles size the training context; rejected and duplicate rows must not skew them.

    Responses are 1..100 characters and prompts 4, so the percentiles are known exactly
    (numpy's linear interpolation, truncated to int).
    """
    records = [{"prompt": f"p{i:03d}", "completion": "r" * (i + 1)} for i in range(100)]
    records += [records[99]] * 50  # duplicates of the longest
    records += [{"prompt": "x" * 9000}]  # a long reject
    src = write_jsonl(tmp_path / "in.jsonl", records)
    prepare(str(src), tmp_path / "out", LENIENT)
    lengths = read_stats(tmp_path / "out")["length_chars"]
    assert lengths["response"] == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert lengths["conversation"] == {"p50": 54, "p90": 94, "p99": 103, "max": 104}


def test_length_percentiles_count_every_turn_in_characters(tmp_path):
    """Multi-turn conversations count all turns; non-ASCII text counts characters, not bytes."""
    convo = [user("héé"), assistant("ab"), user("c"), assistant("日本語")]
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": convo}])
    prepare(str(src), tmp_path / "out", LENIENT)
    lengths = read_stats(tmp_path / "out")["length_chars"]
    assert lengths["conversation"]["max"] == 3 + 2 + 1 + 3
    assert lengths["response"]["max"] == 3


def fingerprint(output_dir):
    return read_stats(output_dir)["fingerprint"]


def test_fingerprint_is_stable_for_the_same_data(tmp_path):
    """The fingerprint tells later stages (and caches) whether the data changed; same data, same value,
    whatever the run, output directory or file location."""
    src = write_jsonl(tmp_path / "a" / "in.jsonl", [qa(i) for i in range(50)])
    copy = tmp_path / "b" / "renamed.jsonl"
    copy.parent.mkdir()
    shutil.copyfile(src, copy)
    prepare(str(src), tmp_path / "out1", PrepareOptions())
    prepare(str(src), tmp_path / "out2", PrepareOptions())
    prepare(str(copy), tmp_path / "out3", PrepareOptions())
    value = fingerprint(tmp_path / "out1")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", value)
    assert fingerprint(tmp_path / "out2") == value
    assert fingerprint(tmp_path / "out3") == value


def test_fingerprint_describes_the_output_not_the_noise(tmp_path):
    """Blank lines, duplicates and rejects do not change the produced dataset, so not its fingerprint."""
    clean = write_jsonl(tmp_path / "clean.jsonl", [qa(i) for i in range(50)])
    noisy = write_jsonl(
        tmp_path / "noisy.jsonl", [qa(i) for i in range(25)] + ["", qa(3), "{bad"] + [qa(i) for i in range(25, 50)]
    )
    prepare(str(clean), tmp_path / "clean", PrepareOptions())
    prepare(str(noisy), tmp_path / "noisy", PrepareOptions())
    assert fingerprint(tmp_path / "noisy") == fingerprint(tmp_path / "clean")


@pytest.mark.parametrize(
    "change",
    ["one_character", "extra_row", "dropped_row", "seed", "eval_fraction", "system_prompt"],
)
def test_fingerprint_changes_with_content_or_options(tmp_path, change):
    """Any change to the rows or to how they were split and framed must give a new fingerprint."""
    records = [qa(i) for i in range(50)]
    options = PrepareOptions()
    base = write_jsonl(tmp_path / "base.jsonl", records)
    prepare(str(base), tmp_path / "base", options)
    if change == "one_character":
        records[17] = dict(records[17], answer="Answer number 17!")
    elif change == "extra_row":
        records.append(qa(50))
    elif change == "dropped_row":
        records.pop(3)
    else:
        value = {"seed": 7, "eval_fraction": 0.25, "system_prompt": "Be brief."}[change]
        options = PrepareOptions(**{change: value})
    changed = write_jsonl(tmp_path / "changed.jsonl", records)
    prepare(str(changed), tmp_path / "changed", options)
    assert fingerprint(tmp_path / "changed") != fingerprint(tmp_path / "base")


@pytest.mark.parametrize(
    ("record", "reason", "detail"),
    [
        (
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]},
            "unknown_role",
            'turn 2 has from "bot"; ShareGPT speakers must be human, gpt or system',
        ),
        (
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": " "}]},
            "blank_field",
            "turn 2 (assistant) has blank value",
        ),
        (
            {"conversations": [{"from": "human", "value": "hi"}]},
            "not_ending_with_assistant",
            "the last turn must be the assistant's answer",
        ),
        ({"conversations": [{"from": "human"}]}, "missing_field", "turn 1 has no 'value'"),
        (
            {"conversations": "hi"},
            "wrong_type",
            "field 'conversations' is a JSON string; it must be a list of {from, value}",
        ),
        (
            {"prompt": [{"role": "user", "content": "q"}]},
            "missing_field",
            "field 'completion' is missing or null (a conversational record needs a prompt and a completion list)",
        ),
        (
            {"prompt": 3, "completion": "c"},
            "wrong_type",
            "field 'prompt' is a JSON number; it must be a string or a list",
        ),
        ({"instruction": "i", "context": "c"}, "missing_field", "field 'response' is missing or null"),
        (
            {"topic": "t", "answer": "a"},
            "missing_field",
            "field 'question' is missing or null (required: question, answer)",
        ),
    ],
    ids=[
        "sharegpt-role",
        "sharegpt-blank",
        "sharegpt-no-answer",
        "sharegpt-no-value",
        "sharegpt-type",
        "conversational-no-completion",
        "prompt-type",
        "dolly-no-response",
        "qa-no-question",
    ],
)
def test_new_shapes_reject_with_file_line_and_reason(tmp_path, record, reason, detail):
    """Each new shape's bad records are listed in rejects.jsonl with the file, the line and what to fix."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(1), record, qa(2)])
    prepare(str(src), tmp_path / "out", PrepareOptions(eval_fraction=0.0, max_reject_fraction=0.5))
    (reject,) = read_rejects(tmp_path / "out")
    assert (reject["source"], reject["line"], reject["reason"]) == (str(src), 2, reason)
    assert detail in reject["detail"]
