"""Preference pairs in the shapes people bring, made TRL's conversational prompt/chosen/rejected, and bad pairs
explained one by one (components/data/pairs.py), through the real parser."""

from __future__ import annotations

import json

import pytest

from components.data.chunks import Chunk
from components.data.normalise import normalise
from components.data.pairs import normalise_pairs
from components.data.parse import parse_chunk
from components.data.schema import Reason


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


PROMPT, CHOSEN, REJECTED = "How long do I boil an egg?", "Nine minutes for a firm yolk.", "Just guess."

# Each accepted shape, the same pair.
SHAPES = {
    "strings": {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED},
    "trl_conversational": {"prompt": [user(PROMPT)], "chosen": [assistant(CHOSEN)], "rejected": [assistant(REJECTED)]},
    "whole_conversations": {  # UltraFeedback binarized: its rows also hold the chosen conversation as messages
        "prompt_id": "x1",
        "chosen": [user(PROMPT), assistant(CHOSEN)],
        "rejected": [user(PROMPT), assistant(REJECTED)],
        "messages": [user(PROMPT), assistant(CHOSEN)],
    },
}


def parsed_pairs(records: list, system_prompt: str = ""):
    data = "\n".join(json.dumps(record) for record in records).encode() + b"\n"
    parsed = parse_chunk(Chunk("pairs.jsonl", 1, data, len(records)))
    assert not parsed.rejects
    [(table, lines)] = list(parsed.batches())
    pairs, problems = normalise_pairs(table, system_prompt)
    return pairs, {int(lines[problem.row]): problem for problem in problems}, table


@pytest.mark.parametrize("mixed", [False, True], ids=["one-shape-per-chunk", "all-shapes-in-one-chunk"])
def test_every_preference_shape_becomes_the_same_prompt_chosen_and_rejected(mixed):
    """Where the two sides part is found the same way for every shape, so all three give the same pair."""
    groups = [list(SHAPES.values())] if mixed else [[record] for record in SHAPES.values()]
    for records in groups:
        pairs, problems, _ = parsed_pairs(records, system_prompt="Answer carefully.")
        assert not problems
        assert pairs.prompt.to_pylist() == [[{"role": "system", "content": "Answer carefully."}, user(PROMPT)]] * len(
            records
        )
        assert pairs.chosen.to_pylist() == [[assistant(CHOSEN)]] * len(records)
        assert pairs.rejected.to_pylist() == [[assistant(REJECTED)]] * len(records)
        assert len(set(pairs.content_keys.to_pylist())) == 1  # the same pair, whatever its shape: a duplicate
        assert list(pairs.conversation_chars) == [len(PROMPT) + len(CHOSEN)] * len(records)
        assert list(pairs.response_chars) == [len(CHOSEN)] * len(records)


def test_a_multi_turn_prompt_is_kept_whole_and_only_the_last_answers_differ():
    earlier = [user("I have eggs."), assistant("Good."), user(PROMPT)]
    record = {"chosen": [*earlier, assistant(CHOSEN)], "rejected": [*earlier, assistant(REJECTED)]}
    pairs, problems, _ = parsed_pairs([record])
    assert not problems
    assert pairs.prompt.to_pylist() == [earlier] and pairs.chosen.to_pylist() == [[assistant(CHOSEN)]]


BAD_PAIRS = {
    "identical": (
        {"prompt": PROMPT, "chosen": CHOSEN, "rejected": CHOSEN},
        Reason.IDENTICAL_SIDES,
        "the chosen and the rejected answer are the same",
    ),
    "missing-side": (
        {"prompt": PROMPT, "chosen": CHOSEN},
        Reason.MISSING_FIELD,
        "field 'rejected' is missing or null (a preference pair needs 'prompt', 'chosen', 'rejected')",
    ),
    "blank-side": (
        {"prompt": PROMPT, "chosen": " ", "rejected": REJECTED},
        Reason.BLANK_FIELD,
        "field 'chosen' is blank",
    ),
    "empty-side": (
        {"prompt": [user(PROMPT)], "chosen": [assistant(CHOSEN)], "rejected": []},
        Reason.NOT_ENDING_WITH_ASSISTANT,
        'the rejected conversation: the conversation ends with a "user" turn',
    ),
    "other-prompt": (
        {"chosen": [user(PROMPT), assistant(CHOSEN)], "rejected": [user("Another question?"), assistant(REJECTED)]},
        Reason.SIDES_PART_BEFORE_THE_ANSWER,
        'part at their first message: chosen has {"role": "user", "content": "How long do I boil an egg?"}, '
        'rejected has {"role": "user", "content": "Another question?"}',
    ),
    "answers-go-on": (
        {
            "chosen": [user(PROMPT), assistant(CHOSEN), user("And then?"), assistant("Cool it.")],
            "rejected": [user(PROMPT), assistant(REJECTED), user("And then?"), assistant("Eat it.")],
        },
        Reason.SIDES_PART_BEFORE_THE_ANSWER,
        'after the prompt (message 1) the chosen conversation has {"role": "user", "content": "And then?"} (message 3)',
    ),
    "one-side-stops-at-the-prompt": (
        {"chosen": [user(PROMPT), assistant(CHOSEN)], "rejected": [user(PROMPT), assistant(CHOSEN), user("More?")]},
        Reason.NOT_ENDING_WITH_ASSISTANT,
        "the rejected conversation: the conversation ends with a",
    ),
    "unknown-role": (
        {"prompt": [user(PROMPT)], "chosen": [assistant(CHOSEN)], "rejected": [{"role": "bot", "content": "x"}]},
        Reason.UNKNOWN_ROLE,
        'the rejected conversation: message 2 has role "bot"',
    ),
    "a-conversation": (
        {"messages": [user(PROMPT), assistant(CHOSEN)]},
        Reason.NOT_A_PAIR,
        "the record is a conversation (messages), and preference tuning (objective dpo) trains on pairs",
    ),
}


def test_each_bad_pair_is_refused_on_its_line_with_what_is_wrong_and_the_good_ones_kept():
    good = SHAPES["strings"]
    records = [good, *(record for record, _, _ in BAD_PAIRS.values()), good]
    pairs, problems, _ = parsed_pairs(records)
    assert list(pairs.rows) == [0, len(records) - 1]
    for line, (name, (_, reason, says)) in enumerate(BAD_PAIRS.items(), start=2):
        assert problems[line].reason == reason, name
        assert says in problems[line].detail, (name, problems[line].detail)
        assert "\n" not in problems[line].detail


def test_supervised_fine_tuning_refuses_a_pair_saying_what_it_is():
    _, _, table = parsed_pairs([SHAPES["strings"], {"messages": [user(PROMPT), assistant(CHOSEN)]}])
    conversations, problems = normalise(table, "")
    assert list(conversations.rows) == [1]
    [problem] = problems
    assert problem.reason == Reason.PREFERENCE_PAIR and "train on the pairs with objective dpo" in problem.detail


def test_a_pair_beside_a_whole_conversation_is_that_conversation_for_supervised_fine_tuning():
    """UltraFeedback-binarized's rows hold messages beside prompt, chosen and rejected: objective sft reads the
    messages, as it did before preference pairs were a shape; dpo reads the pair."""
    conversation = [user(PROMPT), assistant(CHOSEN)]
    record = {**SHAPES["strings"], "messages": conversation}
    pairs, pair_problems, table = parsed_pairs([record])
    conversations, problems = normalise(table, "")
    assert problems == [] and list(conversations.rows) == [0]
    assert conversations.messages.to_pylist() == [conversation]
    assert pair_problems == {} and list(pairs.rows) == [0]


def test_sides_that_share_an_answer_and_then_part_are_refused_naming_where():
    record = {
        "chosen": [user(PROMPT), assistant(CHOSEN)],
        "rejected": [user(PROMPT), assistant(CHOSEN), user("More?"), assistant(REJECTED)],
    }
    _, problems, _ = parsed_pairs([record])
    assert problems[1].reason == Reason.SIDES_PART_BEFORE_THE_ANSWER
    assert problems[1].detail.startswith(
        "the chosen and the rejected conversation part after message 2 (the assistant's turn): chosen has nothing "
        '(it ends there), rejected has {"role": "user", "content": "More?"}.'
    )


def test_prepare_writes_pairs_deduplicated_across_shapes_and_split(tmp_path):
    """prepare(objective="dpo"): TRL's conversational columns in both splits; the same pair in another shape is a
    duplicate; a conversation is a reject naming objective sft."""
    import pyarrow.parquet as pq

    from components.data.options import PrepareOptions
    from components.data.prepare import prepare

    records = [
        {"prompt": f"Question {number}?", "chosen": f"Careful {number}.", "rejected": "Whatever."}
        for number in range(40)
    ]
    records.append(
        {
            "chosen": [user("Question 1?"), assistant("Careful 1.")],
            "rejected": [user("Question 1?"), assistant("Whatever.")],
        }
    )
    records.append({"messages": [user(PROMPT), assistant(CHOSEN)]})
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records))
    result = prepare(str(source), tmp_path / "out", PrepareOptions(eval_fraction=0.1, max_reject_fraction=0.5), "dpo")
    stats = result.stats
    assert (stats.records, stats.duplicates, stats.rejected_by_reason) == (42, 1, {"not_a_pair": 1})
    assert stats.train_rows + stats.eval_rows == 40 and stats.eval_rows > 0
    rows = pq.read_table(result.train_path).to_pylist() + pq.read_table(result.eval_path).to_pylist()
    assert pq.read_schema(result.train_path).names == ["id", "prompt", "chosen", "rejected"]
    assert sorted(row["prompt"][0]["content"] for row in rows) == sorted(f"Question {n}?" for n in range(40))
    assert all(row["rejected"] == [assistant("Whatever.")] for row in rows)


def test_the_field_map_the_sft_refusal_names_reads_one_side_as_the_conversation(tmp_path):
    """The paragraph for a pair given to sft suggests field_map; it works: the chosen side read as the completion."""
    from components.data.options import PrepareOptions
    from components.data.prepare import prepare

    _, _, table = parsed_pairs([SHAPES["strings"]])
    [problem] = normalise(table, "")[1]
    assert '{"completion": "chosen"}' in problem.detail
    source = tmp_path / "pairs.jsonl"
    source.write_text(json.dumps(SHAPES["strings"]) + "\n")
    options = PrepareOptions(eval_fraction=0.0, field_map='{"completion": "chosen"}')
    result = prepare(str(source), tmp_path / "out", options, "sft")
    assert result.stats.rejected == 0 and result.stats.shapes == {"prompt_completion": 1}


def test_every_pair_of_one_prompt_lands_in_the_same_split(tmp_path):
    """Several answers per prompt make several pairs of it: the split is drawn by the prompt, so the held-out
    pairs' prompts, on which the gate measures the reward accuracy, are never trained on."""
    import pyarrow.parquet as pq

    from components.data.options import PrepareOptions
    from components.data.prepare import prepare

    records = [
        {"prompt": f"Question {number}?", "chosen": f"Careful {number}, way {way}.", "rejected": f"No {way}."}
        for number in range(30)
        for way in range(4)
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records))
    result = prepare(str(source), tmp_path / "out", PrepareOptions(eval_fraction=0.3), "dpo")
    prompts = {
        split: {row["prompt"][0]["content"] for row in pq.read_table(path).to_pylist()}
        for split, path in (("train", result.train_path), ("eval", result.eval_path))
    }
    assert prompts["train"] and prompts["eval"] and prompts["train"].isdisjoint(prompts["eval"])
    assert result.stats.eval_rows == 4 * len(prompts["eval"])


def test_every_reason_only_pairs_give_has_a_case_here():
    from test_prepare_rejects import PAIR_REASONS

    assert PAIR_REASONS <= {reason for _, reason, _ in BAD_PAIRS.values()}


def test_the_bundled_preference_sample_prepares_cleanly_as_the_default_data_of_dpo(tmp_path):
    """Every bundled pair is kept: its careful answer chosen over a careless or unsafe one, for each question of
    the bundled conversations."""
    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.data.stage import locate_dataset_uri
    from components.sample_data import bundled_dataset_path

    result = prepare(
        locate_dataset_uri("", tmp_path / "source", "dpo").input, tmp_path / "out", PrepareOptions(), "dpo"
    )
    questions = len(bundled_dataset_path().read_text().splitlines())
    stats = result.stats
    assert (stats.records, stats.rejected, stats.duplicates) == (questions, 0, 0)
    assert stats.shapes == {"preference": questions} and stats.eval_rows >= 15


def test_the_tokenise_step_refuses_data_of_the_other_kind_than_its_objective(tiny_model_dir, tmp_path):
    from common.errors import UserError
    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.data.stage import locate_dataset_uri
    from components.tokenise.build import build
    from trainer.token_cache import TokenSettings

    for objective, other in (("sft", "dpo"), ("dpo", "sft")):
        data = tmp_path / objective
        prepare(locate_dataset_uri("", tmp_path / "source", objective).input, data, PrepareOptions(), objective)
        settings = TokenSettings(128, "assistant", True, 0, objective=other)
        with pytest.raises(UserError, match=f"objective {other} trains on"):
            build(data, tiny_model_dir, settings, tmp_path / "cache", workers=1)
