"""Where the data stage reads from, how the CLI fails, and what a failed run leaves behind.

A failed run must say what is wrong in one readable paragraph (exit status 2, no
traceback) and leave the last good outputs exactly as they were, because the next
pipeline stage may already be reading them.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import PUBLISHED, all_rows, qa, read_rejects, read_split, read_stats, run_cli, snapshot, write_jsonl

from common.errors import UserError
from components.data.options import PrepareOptions
from components.data.prepare import prepare

NO_EVAL = PrepareOptions(eval_fraction=0.0)


def squash(text) -> str:
    """``text`` without whitespace: error paragraphs are wrapped, sometimes inside a path."""
    return "".join(str(text).split())


def assert_user_error(result, *mentions):
    """Exit 2 with one ``error:`` paragraph on stderr that names every item in ``mentions``."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert message.startswith("error: "), message
    assert message.count("error:") == 1 and "\n\n" not in message, message
    for item in mentions:
        assert squash(item) in squash(message), (item, message)
    assert result.stdout == ""
    return message


def good_run(tmp_path):
    """A successful CLI run into tmp_path/out; returns the output dir and a snapshot of it."""
    src = write_jsonl(tmp_path / "good.jsonl", [qa(i) for i in range(40)] + ["{one bad line"])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    before = snapshot(tmp_path / "out")
    assert set(before) == set(PUBLISHED)
    return tmp_path / "out", before


def leftovers(output_dir):
    """Anything in the output dir besides published files and the failed-rejects report."""
    return sorted(p.name for p in output_dir.iterdir() if p.name not in PUBLISHED + ("rejects.failed.jsonl",))


# --- where input comes from ----------------------------------------------------------------


def test_gzip_gives_the_same_result_as_plain(tmp_path):
    """Compressing a dataset must change nothing downstream: same rows, rejects and fingerprint."""
    lines = [qa(i) for i in range(60)] + ["", "{bad", {"prompt": "日本", "completion": "語"}]
    plain = write_jsonl(tmp_path / "data.jsonl", lines)
    packed = write_jsonl(tmp_path / "data.jsonl.gz", lines)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    prepare(str(plain), tmp_path / "plain", PrepareOptions())
    prepare(str(packed), tmp_path / "packed", PrepareOptions())
    for split in ("train", "eval"):
        assert read_split(tmp_path / "packed", split) == read_split(tmp_path / "plain", split)
    assert [(r["line"], r["reason"]) for r in read_rejects(tmp_path / "packed")] == [(62, "invalid_json")]
    assert read_rejects(tmp_path / "packed")[0]["source"] == str(packed)
    plain_stats, packed_stats = read_stats(tmp_path / "plain"), read_stats(tmp_path / "packed")
    assert packed_stats["fingerprint"] == plain_stats["fingerprint"]
    named = ("inputs", "lineage", "contamination")  # these name the file read
    assert {k: v for k, v in packed_stats.items() if k not in named} == {
        k: v for k, v in plain_stats.items() if k not in named
    }
    assert packed_stats["lineage"][0]["content"] == plain_stats["lineage"][0]["content"]  # the text read


def test_glob_combines_files_and_rejects_name_their_file(tmp_path):
    """With several files, a line number alone is useless; each reject must name its own file."""
    data = tmp_path / "data"
    a = write_jsonl(data / "part-a.jsonl", [qa(1), {"prompt": "p"}, qa(2)])
    b = write_jsonl(data / "part-b.jsonl.gz", ["{bad", qa(3)])
    c = write_jsonl(data / "part-c.jsonl", ["", "", {"messages": []}, qa(4)])
    write_jsonl(data / "other.jsonl", [{"text": "not matched by the glob"}])
    result = run_cli(
        "--input",
        data / "part-*",
        "--output-dir",
        tmp_path / "out",
        "--eval-fraction",
        "0",
        "--max-reject-fraction",
        "0.5",
    )
    assert result.returncode == 0, result.stderr
    rejects = [(r["source"], r["line"], r["reason"]) for r in read_rejects(tmp_path / "out")]
    assert rejects == [(str(a), 2, "missing_field"), (str(b), 1, "invalid_json"), (str(c), 3, "empty_conversation")]
    assert [row["messages"][0]["content"] for row in all_rows(tmp_path / "out")] == [
        f"For knots, question number {i}?" for i in (1, 2, 3, 4)
    ]
    assert read_stats(tmp_path / "out")["inputs"] == [str(a), str(b), str(c)]


def test_directory_input_combines_files_and_rejects_name_their_file(tmp_path):
    """A directory reads its JSONL files in name order; line numbers restart at 1 in each file."""
    data = tmp_path / "data"
    second = write_jsonl(data / "b.jsonl.gz", [qa(3), "[1]"])
    first = write_jsonl(data / "a.jsonl", [qa(1), qa(2), {"text": "?"}])
    (data / "notes.txt").write_text("{not data\n")
    (data / "shards.jsonl").mkdir()  # a directory with a data-like name is not a data file
    write_jsonl(data / "shards.jsonl" / "c.jsonl", ["{ignored: not read"])
    prepare(str(data), tmp_path / "out", PrepareOptions(eval_fraction=0.0, max_reject_fraction=0.5))
    rejects = [(r["source"], r["line"], r["reason"]) for r in read_rejects(tmp_path / "out")]
    assert rejects == [(str(first), 3, "unknown_shape"), (str(second), 2, "not_an_object")]
    assert len(all_rows(tmp_path / "out")) == 3
    assert read_stats(tmp_path / "out")["inputs"] == [str(first), str(second)]


# --- input that cannot be read -------------------------------------------------------------


def test_missing_file_is_a_user_error(tmp_path):
    """A typo in --input must read as a typo, naming the path, not as a crash."""
    missing = tmp_path / "no-such-data.jsonl"
    result = run_cli("--input", missing, "--output-dir", tmp_path / "out")
    assert_user_error(result, missing, "does not exist")


def test_glob_matching_nothing_is_a_user_error(tmp_path):
    """An empty glob would otherwise 'succeed' with no data."""
    pattern = tmp_path / "data" / "*.jsonl"
    (tmp_path / "data").mkdir()
    result = run_cli("--input", pattern, "--output-dir", tmp_path / "out")
    assert_user_error(result, pattern)


def test_directory_without_jsonl_files_is_a_user_error(tmp_path):
    """A directory of CSVs is the wrong directory; say so instead of producing empty splits."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("q,a\n")
    result = run_cli("--input", tmp_path / "data", "--output-dir", tmp_path / "out")
    assert_user_error(result, tmp_path / "data", "No .jsonl")


@pytest.mark.parametrize("damage", ["not_gzip", "truncated"])
def test_corrupt_gzip_is_a_user_error_and_keeps_outputs(tmp_path, damage):
    """A half-copied .gz is common; the error must name the file, and the last good outputs survive
    even though some of the file was read before the damage was found."""
    out, before = good_run(tmp_path)
    data = gzip.compress(b"".join(json.dumps(qa(i)).encode() + b"\n" for i in range(3000)))
    bad = tmp_path / "broken.jsonl.gz"
    bad.write_bytes(b"this is not gzip at all\n" if damage == "not_gzip" else data[: len(data) // 2])
    result = run_cli("--input", bad, "--output-dir", out)
    assert_user_error(result, bad, "could not be decompressed")
    assert snapshot(out) == before
    assert leftovers(out) == []


# --- input that holds no usable data -------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\n\n   \n\t\n"], ids=["empty", "only_blank_lines"])
def test_input_without_records_fails_and_keeps_outputs(tmp_path, content):
    """An empty export must not replace yesterday's training data with empty splits."""
    out, before = good_run(tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(content)
    result = run_cli("--input", empty, "--output-dir", out)
    assert_user_error(result, empty, "no records")
    assert snapshot(out) == before
    assert leftovers(out) == []


def test_nothing_valid_fails_keeps_outputs_and_reports_rejects(tmp_path):
    """Data in the wrong format entirely: fail, point at the first bad line, and keep the reasons
    in rejects.failed.jsonl (the published rejects.jsonl still belongs to the good run)."""
    out, before = good_run(tmp_path)
    src = write_jsonl(tmp_path / "wrong.jsonl", [{"text": f"row {i}"} for i in range(5)] + ["", "{bad"])
    result = run_cli("--input", src, "--output-dir", out)
    assert_user_error(result, src, "No valid records", "6 of 6", "line 1", "rejects.failed.jsonl")
    assert snapshot(out) == before
    failed = read_rejects(out, "rejects.failed.jsonl")
    assert [(r["source"], r["line"], r["reason"]) for r in failed] == [
        (str(src), i, "unknown_shape") for i in range(1, 6)
    ] + [(str(src), 7, "invalid_json")]
    assert leftovers(out) == []


def test_nothing_valid_through_the_library_raises_and_publishes_nothing(tmp_path):
    """The pipeline calls prepare() directly: it gets a UserError and no half-made outputs."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "p"}] * 4)
    with pytest.raises(UserError, match="No valid records"):
        prepare(str(src), tmp_path / "out", NO_EVAL)
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_reject_share_over_the_limit_fails_and_keeps_outputs(tmp_path):
    """Many bad records usually mean a format mistake; publishing the rest would silently train on
    a fraction of the data. The message names the option to change and the counts."""
    out, before = good_run(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [qa(i) for i in range(17)] + ["{bad", {"prompt": "p"}, "[]"])
    result = run_cli("--input", src, "--output-dir", out)
    message = assert_user_error(result, src, "--max-reject-fraction", "3 of 20", "15.0%", "5.0%", "line 18")
    assert "rejects.failed.jsonl" in squash(message)
    assert snapshot(out) == before
    assert [(r["line"], r["reason"]) for r in read_rejects(out, "rejects.failed.jsonl")] == [
        (18, "invalid_json"),
        (19, "missing_field"),
        (20, "not_an_object"),
    ]
    assert leftovers(out) == []


def test_reject_share_limit_is_inclusive_and_configurable(tmp_path):
    """Exactly at the limit passes; one more reject fails; raising the limit lets it through."""
    at_limit = write_jsonl(tmp_path / "one.jsonl", [qa(i) for i in range(19)] + ["{bad"])
    over = write_jsonl(tmp_path / "two.jsonl", [qa(i) for i in range(18)] + ["{bad", "{bad"])
    assert run_cli("--input", at_limit, "--output-dir", tmp_path / "a").returncode == 0
    assert_user_error(run_cli("--input", over, "--output-dir", tmp_path / "b"), "2 of 20")
    raised = run_cli("--input", over, "--output-dir", tmp_path / "c", "--max-reject-fraction", "0.1")
    assert raised.returncode == 0, raised.stderr
    assert read_stats(tmp_path / "c")["rejected"] == 2


def test_later_success_replaces_outputs_and_removes_failed_rejects(tmp_path):
    """After the user fixes the data, the stale failure report must go so nobody reads it as current."""
    out, before = good_run(tmp_path)
    broken = write_jsonl(tmp_path / "broken.jsonl", [qa(1), "{bad", "{bad"])
    assert run_cli("--input", broken, "--output-dir", out).returncode == 2
    assert (out / "rejects.failed.jsonl").exists()
    fixed = write_jsonl(tmp_path / "fixed.jsonl", [qa(i) for i in range(100, 130)])
    result = run_cli("--input", fixed, "--output-dir", out)
    assert result.returncode == 0, result.stderr
    assert not (out / "rejects.failed.jsonl").exists()
    assert snapshot(out)["stats.json"] != before["stats.json"]
    assert read_stats(out)["inputs"] == [str(fixed)]
    assert len(all_rows(out)) == 30
    assert leftovers(out) == []


# --- command line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--eval-fraction", "1.5"], "--eval-fraction"),
        (["--eval-fraction", "abc"], "--eval-fraction"),
        (["--eval-fraction", "1"], "--eval-fraction"),
        (["--max-reject-fraction", "-0.1"], "--max-reject-fraction"),
        (["--seed", "lucky"], "--seed"),
    ],
)
def test_bad_option_values_exit_2_naming_the_option(tmp_path, args, option):
    """A bad value must be caught before any work, with the option named so it can be fixed."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(1)])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"argument {option}" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["--input", "--output-dir"])
def test_required_options(tmp_path, missing):
    """Both paths are required; forgetting one is a usage error, not a crash."""
    args = {"--input": tmp_path / "in.jsonl", "--output-dir": tmp_path / "out"}
    del args[missing]
    result = run_cli(*[str(x) for pair in args.items() for x in pair])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert missing in result.stderr


@pytest.mark.parametrize("field", ["eval_fraction", "max_reject_fraction"])
@pytest.mark.parametrize("value", [-0.01, 1.0, 2.0])
def test_options_are_validated_for_library_callers_too(field, value):
    """The pipeline builds PrepareOptions directly, bypassing argparse; it must refuse the same values."""
    with pytest.raises(UserError, match=field):
        PrepareOptions(**{field: value})


def test_successful_run_prints_a_summary(tmp_path):
    """The summary is what people see in the pipeline log: counts, fingerprint and where files went."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(i) for i in range(40)] + [qa(0), "{bad"])
    out = tmp_path / "out"
    result = run_cli("--input", src, "--output-dir", out, "--eval-fraction", "0.25")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    stats = read_stats(out)
    train, eval_ = stats["rows"]["train"], stats["rows"]["eval"]
    assert train + eval_ == 40 and eval_ > 0
    lines = result.stdout.splitlines()
    assert (
        lines[0] == f"records 42: train {train}, eval {eval_}, rejected 1, duplicates 1, overlapping the eval split 0"
    )
    assert lines[1] == f"fingerprint {stats['fingerprint']}"
    assert lines[2] == f"source  {src} (content {stats['lineage'][0]['content'][:19]}…)"  # a local file: no version
    for name in PUBLISHED:
        assert any(line.endswith(str(out / name)) for line in lines[2:]), name
    assert set(snapshot(out)) == set(PUBLISHED)
    assert leftovers(out) == []


def test_system_prompt_framing(tmp_path):
    """--system-prompt adds a system turn first, but keeps a record's own system turn untouched."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"prompt": "q1", "completion": "a1"},
            {
                "messages": [
                    {"role": "system", "content": "Own."},
                    {"role": "user", "content": "q2"},
                    {"role": "assistant", "content": "a2"},
                ]
            },
            {"messages": [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "a3"}]},
        ],
    )
    result = run_cli(
        "--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0", "--system-prompt", "Answer briefly."
    )
    assert result.returncode == 0, result.stderr
    firsts = [row["messages"][0] for row in all_rows(tmp_path / "out")]
    assert firsts == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "system", "content": "Own."},
        {"role": "system", "content": "Answer briefly."},
    ]
    assert [len(row["messages"]) for row in all_rows(tmp_path / "out")] == [3, 3, 3]
    assert read_stats(tmp_path / "out")["options"]["system_prompt"] == "Answer briefly."


def test_system_prompt_does_not_reshuffle_the_split(tmp_path):
    """Row ids and the train/eval split come from the record's own content, so changing the system
    prompt re-frames rows without moving any of them between train and eval."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(i) for i in range(200)])
    prepare(str(src), tmp_path / "plain", PrepareOptions(eval_fraction=0.3))
    prepare(str(src), tmp_path / "framed", PrepareOptions(eval_fraction=0.3, system_prompt="Be brief."))
    for split in ("train", "eval"):
        plain, framed = read_split(tmp_path / "plain", split), read_split(tmp_path / "framed", split)
        assert [r["id"] for r in framed] == [r["id"] for r in plain]
        assert [r["messages"][1:] for r in framed] == [r["messages"] for r in plain]
        assert all(r["messages"][0] == {"role": "system", "content": "Be brief."} for r in framed)
    assert read_split(tmp_path / "plain", "eval")


def test_utf8_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    """Windows editors save UTF-8 with a BOM; the first line is still a valid record, not invalid JSON."""
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps(qa(1)).encode() + b"\n" + json.dumps(qa(2)).encode() + b"\n")
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0")
    assert result.returncode == 0, result.stderr
    assert read_stats(tmp_path / "out")["rejected"] == 0
    assert len(read_split(tmp_path / "out", "train")) == 2


def test_blank_system_prompt_is_refused(tmp_path):
    """A whitespace-only system prompt would add a blank turn to every row, which the stage rejects in records."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(1)])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--system-prompt", "   ")
    assert result.returncode == 2
    assert "system_prompt" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "stats.json").exists()
