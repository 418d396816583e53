"""Every accepted record shape becomes the documented chat ``messages`` in the Parquet outputs."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import all_rows, qa, read_split, read_stats, run_cli, write_jsonl

from components.data.options import PrepareOptions
from components.data.prepare import prepare

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
    assert result.stats.rejected == 0
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
        "question_answer": 3,
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
    assert result.stats.records == 2
    assert len(all_rows(tmp_path / "out")) == 2


def test_question_answer_needs_no_topic(tmp_path):
    """The plainest Q&A file: no topic, so the question is the user's turn as written; a blank topic is no topic."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"question": "What is 2 + 2?", "answer": "4."},
            {"topic": " ", "question": "Capital of France?", "answer": "Paris."},
        ],
    )
    result = prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [
        [user("What is 2 + 2?"), assistant("4.")],
        [user("Capital of France?"), assistant("Paris.")],
    ]
    assert result.stats.shapes == {"question_answer": 2} and result.stats.rejected == 0


def test_dolly_context_joins_the_instruction_when_not_empty(tmp_path):
    """databricks-dolly-15k's shape: a non-empty context follows the instruction after a blank line."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"instruction": "Summarise.", "context": "A long text.", "response": "Short.", "category": "summarization"},
            {"instruction": "Name a knot.", "context": "", "response": "Bowline.", "category": "open_qa"},
        ],
    )
    result = prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [
        [user("Summarise.\n\nA long text."), assistant("Short.")],
        [user("Name a knot."), assistant("Bowline.")],
    ]
    assert result.stats.shapes == {"instruction_context_response": 2}


def test_sharegpt_speakers_become_roles(tmp_path):
    """ShareGPT's human/user, gpt/assistant and system speakers map onto chat roles, turn by turn."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {
                "id": "a1",
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "Hi"},
                    {"from": "gpt", "value": "Hello."},
                    {"from": "user", "value": "Bye"},
                    {"from": "assistant", "value": "Goodbye."},
                ],
            }
        ],
    )
    result = prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [
        [system("Be brief."), user("Hi"), assistant("Hello."), user("Bye"), assistant("Goodbye.")]
    ]
    assert result.stats.shapes == {"sharegpt": 1}


def test_trl_conversational_prompt_completion_is_one_conversation(tmp_path):
    """TRL's conversational prompt/completion: the prompt's messages, then the completion's."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"prompt": [system("Be brief."), user("Ping?")], "completion": [assistant("Pong.")]},
            {"prompt": [user("Colour of the sky?")], "completion": [assistant("Blue.")]},
        ],
    )
    result = prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [
        [system("Be brief."), user("Ping?"), assistant("Pong.")],
        [user("Colour of the sky?"), assistant("Blue.")],
    ]
    assert result.stats.shapes == {"prompt_completion_messages": 2}


def test_openai_messages_with_names_and_extra_keys(tmp_path):
    """OpenAI chat records: a message's name and the record's other keys are ignored, the turns kept."""
    message = {"role": "user", "content": "Who wrote it?", "name": "ann"}
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [{"messages": [message, assistant("Me.")], "id": 7, "metadata": {"source": "x"}}],
    )
    prepare(str(src), tmp_path / "out", NO_EVAL)
    assert conversations(tmp_path / "out") == [[user("Who wrote it?"), assistant("Me.")]]


def test_every_shape_in_one_file_on_both_parse_paths(tmp_path):
    """A file mixing every shape (the line-by-line parser) gives the same conversations as one file per shape
    (pyarrow's fast path, also for the conversational prompt/completion, whose lists the fast path reads on a
    second try)."""
    records = [
        {"question": "q1", "answer": "a1"},
        {"instruction": "i2", "input": "x2", "output": "o2"},
        {"instruction": "i3", "context": "c3", "response": "r3"},
        {"prompt": "p4", "completion": "c4"},
        {"prompt": [user("p5")], "completion": [assistant("c5")]},
        {"messages": [user("u6"), assistant("a6")]},
        {"conversations": [{"from": "human", "value": "u7"}, {"from": "gpt", "value": "a7"}]},
    ]
    prepare(str(write_jsonl(tmp_path / "mixed.jsonl", records)), tmp_path / "mixed", NO_EVAL)
    one_by_one = []
    for index, record in enumerate(records):
        prepare(str(write_jsonl(tmp_path / f"{index}.jsonl", [record])), tmp_path / f"out{index}", NO_EVAL)
        one_by_one += conversations(tmp_path / f"out{index}")
    assert conversations(tmp_path / "mixed") == one_by_one
    assert len(one_by_one) == 7


def test_field_map_reads_a_file_with_its_own_column_names(tmp_path):
    """Seed 003's {input, trace, answer} records: field_map {"question": "input"} reads them as Q&A; the mapped
    column is no longer Alpaca's input, and the unmapped trace is ignored. The CLI takes --field-map."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"input": "Why is the sky blue?", "trace": "t1", "answer": "Rayleigh scattering."},
            {"input": "2 + 2?", "trace": "t2", "answer": "4"},
        ],
    )
    result = run_cli(
        "--input", src, "--output-dir", tmp_path / "out", "--eval-fraction", "0", "--field-map", '{"question": "input"}'
    )
    assert result.returncode == 0, result.stderr
    assert conversations(tmp_path / "out") == [
        [user("Why is the sky blue?"), assistant("Rayleigh scattering.")],
        [user("2 + 2?"), assistant("4")],
    ]
    assert read_stats(tmp_path / "out")["options"]["field_map"] == '{"question": "input"}'


def test_field_map_naming_a_column_no_record_has_is_refused(tmp_path):
    """A misspelt column would otherwise reject every record as missing a field; it is named instead, and
    nothing is written."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"input": "q", "answer": "a"}])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--field-map", '{"question": "Input"}')
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "field_map reads question -> Input, but no record of" in message and "no record" in message
    assert "case-sensitive" in message
    assert not any((tmp_path / "out").glob("*.parquet"))


@pytest.mark.parametrize(
    ("field_map", "problem"),
    [
        ('{"quesiton": "input"}', "maps 'quesiton', which are not fields we read"),
        ('{"question": "a", "answer": "a"}', "maps several fields to the column 'a'"),
        ('["question"]', "must be a JSON object"),
        ('{"question": }', "is not valid JSON"),
    ],
)
def test_a_malformed_field_map_is_refused_before_any_work(tmp_path, field_map, problem):
    src = write_jsonl(tmp_path / "in.jsonl", [{"input": "q", "answer": "a"}])
    result = run_cli("--input", src, "--output-dir", tmp_path / "out", "--field-map", field_map)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert problem in " ".join(result.stderr.split()) and not (tmp_path / "out").exists()


# One record of every shape in the registry, each the same exchange. Adding a shape to
# components/data/shapes.py without an example here fails the test below.
EXAMPLES = {
    "preference_messages": {
        "prompt": [user("Name a knot.")],
        "chosen": [assistant("Bowline.")],
        "rejected": [assistant("Knot.")],
    },
    "preference": {"prompt": "Name a knot.", "chosen": "Bowline.", "rejected": "Knot."},
    "messages": {"messages": [user("Name a knot."), assistant("Bowline.")]},
    "sharegpt": {"conversations": [{"from": "human", "value": "Name a knot."}, {"from": "gpt", "value": "Bowline."}]},
    "prompt_completion_messages": {"prompt": [user("Name a knot.")], "completion": [assistant("Bowline.")]},
    "question_answer": {"question": "Name a knot.", "answer": "Bowline."},
    "instruction_context_response": {"instruction": "Name a knot.", "context": " ", "response": "Bowline."},
    "instruction_input_output": {"instruction": "Name a knot.", "input": "", "output": "Bowline."},
    "prompt_completion": {"prompt": "Name a knot.", "completion": "Bowline."},
}


def test_every_registered_shape_is_detected_and_becomes_the_same_conversation(tmp_path):
    """The registry is the one place a shape is declared: detection, conversion and the stats all follow it."""
    from components.data.shapes import SHAPES

    assert list(EXAMPLES) == [shape.name for shape in SHAPES], "every shape needs an example, in detection order"
    pair_shapes = {shape.name for shape in SHAPES if shape.is_pair}
    for name, record in EXAMPLES.items():
        out = tmp_path / name
        objective = "dpo" if name in pair_shapes else "sft"
        prepare(str(write_jsonl(tmp_path / f"{name}.jsonl", [record])), out, NO_EVAL, objective)
        if objective == "dpo":
            [row] = all_rows(out)
            assert (row["prompt"], row["chosen"], row["rejected"]) == (
                [user("Name a knot.")],
                [assistant("Bowline.")],
                [assistant("Knot.")],
            ), name
        else:
            assert conversations(out) == [[user("Name a knot."), assistant("Bowline.")]], name
        assert read_stats(out)["shapes"] == {name: 1}


def test_the_accepted_shapes_hint_and_the_parsed_columns_come_from_the_registry():
    from components.data.shapes import CONVERSATION_SHAPES_HINT, JSON_FIELDS, PAIR_SHAPES_HINT, RAW_SCHEMA, SHAPES

    for shape in SHAPES:
        assert shape.hint in (PAIR_SHAPES_HINT if shape.pair else CONVERSATION_SHAPES_HINT)
        assert shape.hint not in (CONVERSATION_SHAPES_HINT if shape.pair else PAIR_SHAPES_HINT)
        assert set(shape.fields) <= set(RAW_SCHEMA.names)
        assert {shape.key(name) for name in shape.fields} <= set(JSON_FIELDS)
        ways = [shape.turns, shape.messages, shape.pair]
        assert sum(way is not None for way in ways) == 1, f"{shape.name}: a flat, a conversation or a pair shape"
    assert set(RAW_SCHEMA.names) == {name for shape in SHAPES for name in shape.fields}
