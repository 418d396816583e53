"""Every accepted record shape becomes the documented chat ``messages`` in the Parquet outputs."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import all_rows, qa, read_split, read_stats, run_cli, write_jsonl

from components.dataprep.options import PrepareOptions
from components.dataprep.prepare import prepare

NO_EVAL = PrepareOptions(eval_fraction=0.0)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


def conversations(output_dir, split="train"):
    return [row["messages"] for row in read_split(output_dir, split)]


def test_topic_question_answer(tmp_path):
    """The bundled data's shape: the topic is folded into the user turn so the model sees the context."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [{"topic": "first aid", "question": "how do I treat a burn?", "answer": "Cool it under running water."}],
    )
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [
        [user("For first aid, how do I treat a burn?"), assistant("Cool it under running water.")]
    ]


def test_instruction_with_input_joins_with_blank_line(tmp_path):
    """Alpaca-style records: the input is context for the instruction, separated by one blank line."""
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"instruction": "Summarise this.", "input": "A long text.", "output": "Short."}]
    )
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [[user("Summarise this.\n\nA long text."), assistant("Short.")]]


@pytest.mark.parametrize(
    "record",
    [
        {"instruction": "Name a knot.", "output": "Bowline."},
        {"instruction": "Name a knot.", "input": None, "output": "Bowline."},
        {"instruction": "Name a knot.", "input": "", "output": "Bowline."},
    ],
    ids=["absent", "null", "empty"],
)
def test_instruction_without_input_is_instruction_alone(tmp_path, record):
    """Most Alpaca rows have no (or an empty) input; they must not get a dangling blank line."""
    src = write_jsonl(tmp_path / "in.jsonl", [record])
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [[user("Name a knot."), assistant("Bowline.")]]


def test_prompt_completion(tmp_path):
    """Prompt/completion pairs map directly onto one user and one assistant turn."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "What is 1 cup in ml?", "completion": "About 240 ml."}])
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [[user("What is 1 cup in ml?"), assistant("About 240 ml.")]]


def test_messages_kept_as_is_including_system_turn(tmp_path):
    """Chat records are already in the target form; multi-turn structure and their own system turn survive."""
    convo = [system("You are terse."), user("Hi"), assistant("Hello."), user("Knot for a loop?"), assistant("Bowline.")]
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": convo}])
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [convo]


def test_output_schema_has_id_and_messages(tmp_path):
    """Later stages read ``id`` and ``messages`` by name; the schema is part of the contract."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(1)])
    prepare(str(src), tmp_path / "out", NO_EVAL)
    for split in ("train", "eval"):
        schema = pq.read_schema(tmp_path / "out" / f"{split}.parquet")
        assert schema.names == ["id", "messages"]
        assert str(schema.field("id").type) == "int64"


def test_system_prompt_prepended_only_where_no_system_turn(tmp_path):
    """--system-prompt fills in a missing system turn but must never override or duplicate a record's own."""
    own = [system("Own system."), user("q1"), assistant("a1")]
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"messages": own},
            {"messages": [user("q2"), assistant("a2")]},
            {"prompt": "q3", "completion": "a3"},
            {"topic": "knots", "question": "q4", "answer": "a4"},
        ],
    )
    result = run_cli(
        "--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0", "--system-prompt", "Be helpful."
    )
    assert result.returncode == 0, result.stderr
    assert conversations(tmp_path / "out") == [
        own,
        [system("Be helpful."), user("q2"), assistant("a2")],
        [system("Be helpful."), user("q3"), assistant("a3")],
        [system("Be helpful."), user("For knots, q4"), assistant("a4")],
    ]


def test_no_system_turn_added_by_default(tmp_path):
    """Without --system-prompt the conversations are exactly what the records say."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "q", "completion": "a"}])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0")
    assert result.returncode == 0, result.stderr
    assert conversations(tmp_path / "out") == [[user("q"), assistant("a")]]


def test_output_order_follows_input_order_across_shapes(tmp_path):
    """Rows of different shapes are built separately; they must still come out in input order."""
    records = []
    expected = []
    for i in range(60):
        kind = i % 4
        if kind == 0:
            records.append(qa(i))
            expected.append(f"For knots, question number {i}?")
        elif kind == 1:
            records.append({"prompt": f"p{i}", "completion": f"c{i}"})
            expected.append(f"p{i}")
        elif kind == 2:
            records.append({"instruction": f"i{i}", "output": f"o{i}"})
            expected.append(f"i{i}")
        else:
            records.append({"messages": [user(f"m{i}"), assistant(f"r{i}")]})
            expected.append(f"m{i}")
    src = write_jsonl(tmp_path / "in.jsonl", records)
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert [convo[0]["content"] for convo in conversations(tmp_path / "out")] == expected


def test_each_split_keeps_input_order(tmp_path):
    """With a real eval share, both splits are subsequences of the input in the original order."""
    src = write_jsonl(tmp_path / "in.jsonl", [qa(i) for i in range(400)])
    prepare(str(src), tmp_path / "out", PrepareOptions(eval_fraction=0.3))
    for split in ("train", "eval"):
        numbers = [int(convo[0]["content"].split()[-1].rstrip("?")) for convo in conversations(tmp_path / "out", split)]
        assert numbers, split
        assert numbers == sorted(numbers)


def test_unknown_keys_are_ignored(tmp_path):
    """Real datasets carry ids, metadata and per-message extras; they must neither reject nor leak into output."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"id": 7, "source": "web", "meta": {"tags": ["a", 1]}, "prompt": "q", "completion": "a"},
            {
                "messages": [{"role": "user", "content": "hi", "name": "bob", "weight": 1}, assistant("hey")],
                "lang": "en",
            },
        ],
    )
    result = prepare(str(src), tmp_path / "out", NO_EVAL)
    assert result.stats["rejected"] == 0
    assert conversations(tmp_path / "out") == [[user("q"), assistant("a")], [user("hi"), assistant("hey")]]


def test_gzip_input(tmp_path):
    """.jsonl.gz files are read transparently."""
    src = write_jsonl(tmp_path / "in.jsonl.gz", [qa(1), {"prompt": "p", "completion": "c"}])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0")
    assert result.returncode == 0, result.stderr
    assert conversations(tmp_path / "out") == [
        [user("For knots, question number 1?"), assistant("Answer number 1.")],
        [user("p"), assistant("c")],
    ]


def test_glob_over_several_files_counts_shapes(tmp_path):
    """A quoted glob reads every matching file (sorted), and stats.json counts records per shape."""
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", [qa(1), qa(2), {"prompt": "p", "completion": "c"}])
    write_jsonl(
        data / "b.jsonl.gz",
        [{"instruction": "i", "input": "x", "output": "o"}, {"messages": [user("u"), assistant("v")]}],
    )
    write_jsonl(data / "c.jsonl", [qa(3)])
    (data / "notes.txt").write_text("not data\n")
    result = run_cli("--input", data / "*.jsonl*", "--output-dir", tmp_path / "out", "--eval-fraction", "0")
    assert result.returncode == 0, result.stderr
    stats = read_stats(tmp_path / "out")
    assert stats["records"] == 6
    assert stats["shapes"] == {
        "messages": 1,
        "topic_question_answer": 3,
        "instruction_input_output": 1,
        "prompt_completion": 1,
    }
    firsts = [convo[0]["content"] for convo in conversations(tmp_path / "out")]
    assert firsts == [
        "For knots, question number 1?",
        "For knots, question number 2?",
        "p",
        "i\n\nx",
        "u",
        "For knots, question number 3?",
    ]


def test_directory_input(tmp_path):
    """A directory reads its .jsonl and .jsonl.gz files and nothing else."""
    data = tmp_path / "data"
    write_jsonl(data / "one.jsonl", [qa(1)])
    write_jsonl(data / "two.jsonl.gz", [qa(2)])
    (data / "readme.md").write_text("# not data\n")
    result = prepare(str(data), tmp_path / "out", NO_EVAL)
    assert result.stats["records"] == 2
    assert len(all_rows(tmp_path / "out")) == 2
