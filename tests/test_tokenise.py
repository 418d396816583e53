"""The tokenise step: the rows it writes are the rows today's data path gave TRL, its cache is keyed by everything
that changes them, a killed build is never read, and the eval cap is a fixed sample."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO_ROOT, run_module, write_jsonl
from todays_path import tokenise_split, trl_prepared
from transformers import AutoTokenizer

import components.tokenise.build as build_module
from common.errors import UserError
from common.records import DataStats
from common.run_layout import DATA_STATS, EVAL_CONVERSATIONS, EVAL_ROWS, TOKENS_MANIFEST, TRAIN_ROWS
from components.data.mixture import DataSource
from components.data.options import PrepareOptions
from components.data.prepare import SourceFiles, prepare
from components.data.schema import OUTPUT_SCHEMA
from components.tokenise.build import (
    STALE_BUILD_SECONDS,
    build,
    clear_stale_builds,
    conversation_chunks,
    eval_sample,
    in_order,
)
from components.tokenise.stage import check_memory, source_lines
from trainer import data, token_cache
from trainer.config import TrainConfig
from trainer.token_cache import TokenManifest, TokenSettings, open_rows

TOPICS = ["knots", "first aid", "cameras", "bread", "bicycles", "tents"]


def conversation(rng: random.Random) -> list[dict]:
    """Single- or multi-turn, with or without a system turn, short or long enough to be truncated at 256 tokens."""
    messages = [{"role": "system", "content": "You answer briefly."}] if rng.random() < 0.3 else []
    for _ in range(1 if rng.random() < 0.5 else rng.randint(2, 4)):
        topic = rng.choice(TOPICS)
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {rng.randint(1, 99)}?"})
        words = " ".join(rng.choice(TOPICS) for _ in range(rng.choice([3, 10, 40, 120])))
        messages.append({"role": "assistant", "content": f"About {topic}: {words}."})
    return messages


def write_splits(data_dir: Path, train: int, evaluation: int, seed: int = 0) -> Path:
    """A data stage output of generated conversations: train.parquet and eval.parquet."""
    rng = random.Random(seed)
    data_dir.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("eval", evaluation)):
        rows = [{"id": index, "messages": conversation(rng)} for index in range(count)]
        pq.write_table(pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA), data.split_path(data_dir, split))
    return data_dir


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """More conversations than two chunks, so the rows cross chunk (and worker) boundaries."""
    return write_splits(tmp_path_factory.mktemp("many") / "data", train=5_000, evaluation=300)


@pytest.fixture(scope="module")
def todays_tokens(many, tiny_model_dir):
    """Today's per-conversation tokenisation of the train split, once for every comparison."""
    return tokenise_split(data.load_split(many, "train"), AutoTokenizer.from_pretrained(tiny_model_dir), "assistant")


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "truncated"])
@pytest.mark.parametrize("loss_on", ["assistant", "all"])
def test_rows_are_what_trl_prepared_from_todays_tokenisation(
    many, todays_tokens, tiny_model_dir, tmp_path, monkeypatch, packing, loss_on
):
    """Built by two worker processes in chunks of 2,000, the rows equal what TRL's own preparation (labels from the
    masks, then best-fit-decreasing packing in groups of 1,000 rows, or truncation dropping rows left without loss)
    makes of today's tokenisation: the trainer trains on the same batches."""
    monkeypatch.setattr(build_module, "CHUNK_ROWS", 2_000)
    settings = TokenSettings(max_length=256, loss_on=loss_on, packing=packing, eval_max_rows=0)
    tokens_dir, built = build(many, tiny_model_dir, settings, tmp_path / "cache", workers=2)
    assert built and json.loads((tokens_dir / TOKENS_MANIFEST).read_text())["workers"] == 2

    today = todays_tokens if loss_on == "assistant" else todays_tokens.remove_columns("assistant_masks")
    config = TrainConfig(model=str(tiny_model_dir), max_length=256, packing=packing, loss_on=loss_on)
    expected = trl_prepared(tiny_model_dir, today, AutoTokenizer.from_pretrained(tiny_model_dir), config)
    ours = open_rows(tokens_dir, TRAIN_ROWS)
    assert ours.column_names == expected.column_names
    assert len(ours) == len(expected) and (len(ours) < 5_000 if packing else len(ours) <= 5_000)
    for column in ours.column_names:
        assert ours[column] == expected[column], column
    if not packing:
        assert max(map(len, ours["input_ids"])) == 256  # some conversations really were truncated


def test_the_same_inputs_reuse_the_entry_and_each_key_input_makes_a_new_one(tiny_model_dir, tmp_path, monkeypatch):
    """Everything that changes the rows is in the key; a copy of the same tokenizer elsewhere is not a change."""
    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.sample_data import bundled_dataset_path

    source = tmp_path / "sample.jsonl"
    source.write_text("".join(bundled_dataset_path().read_text().splitlines(keepends=True)[:60]))
    plain, prompted = tmp_path / "plain", tmp_path / "prompted"
    prepare(str(source), plain, PrepareOptions())
    prepare(str(source), prompted, PrepareOptions(system_prompt="Answer in one sentence."))
    cache = tmp_path / "cache"
    settings = TokenSettings(max_length=128, loss_on="assistant", packing=True, eval_max_rows=0)

    def entry(data_dir: Path = plain, model: Path = tiny_model_dir, **changes) -> tuple[Path, bool]:
        return build(data_dir, model, TokenSettings(**{**settings.__dict__, **changes}), cache, workers=1)

    first, built = entry()
    assert built and entry() == (first, False)
    same_tokenizer = tmp_path / "same-tokenizer"
    shutil.copytree(tiny_model_dir, same_tokenizer)
    assert entry(model=same_tokenizer) == (first, False)

    other_template = tmp_path / "other-template"
    shutil.copytree(tiny_model_dir, other_template)
    tokenizer = AutoTokenizer.from_pretrained(other_template)
    tokenizer.chat_template = tokenizer.chat_template.replace("<|im_start|>", "<|im_start|> ")
    tokenizer.save_pretrained(other_template)
    appended = tmp_path / "appended"
    shutil.copytree(plain, appended)
    table = pq.read_table(plain / "train.parquet")
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), appended / "train.parquet")

    misses = {
        "max_length": entry(max_length=256),
        "loss_on": entry(loss_on="all"),
        "packing": entry(packing=False),
        "eval_max_rows": entry(eval_max_rows=5),
        "system prompt": entry(data_dir=prompted),
        "data": entry(data_dir=appended),
        "chat template": entry(model=other_template),
    }
    monkeypatch.setattr(token_cache, "FORMAT_VERSION", token_cache.FORMAT_VERSION + 1)
    misses["format version"] = entry()
    assert all(built for _, built in misses.values()), misses
    paths = {first, *(path for path, _ in misses.values())}
    assert len(paths) == len(misses) + 1
    assert {path.parent for path in paths} == {cache} and not list(cache.glob(".building-*"))


def test_a_build_killed_mid_write_leaves_nothing_a_later_run_reads(tiny_model_dir, tmp_path):
    """SIGKILL while the train rows are being written (an OOM kill, a lost node): the half-written entry has another
    name and no manifest, so no reader takes it; the next run builds a complete one; stale partial builds go."""
    data_dir = write_splits(tmp_path / "data", train=12_000, evaluation=20)
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "components.tokenise.stage", "--data-dir", str(data_dir)]
    command += ["--model", str(tiny_model_dir), "--cache-dir", str(cache), "--workers", "1"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not any(path.stat().st_size for path in cache.glob(f".building-*/{TRAIN_ROWS}")):
        assert process.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()

    (partial,) = cache.iterdir()
    assert partial.name.startswith(".building-") and not (partial / TOKENS_MANIFEST).exists()
    with pytest.raises(UserError, match="manifest.json is missing"):
        TokenManifest.read(partial)

    tokens_dir, built = build(data_dir, tiny_model_dir, TokenSettings(1024, "assistant", True, 1000), cache, workers=1)
    assert built and TokenManifest.read(tokens_dir).train.conversations == 12_000
    assert partial.name.startswith(f".building-{tokens_dir.name}-")  # the same key: the command line's defaults
    assert partial.exists()  # still fresh: it could be another run's build in progress
    os.utime(partial, (0, 0))
    for path in partial.rglob("*"):
        os.utime(path, (0, 0))
    assert time.time() > STALE_BUILD_SECONDS
    clear_stale_builds(cache, tokens_dir.name)
    assert sorted(cache.iterdir()) == [tokens_dir]


def test_each_chunk_sent_to_a_worker_carries_only_its_own_rows(many):
    """The chunks of a split stored as one 5,000-row group: together the split's rows, in order, each pickling
    (which is how it reaches a worker) to about a fifth of the whole, not to the batch it was cut from."""
    split = pq.read_table(data.split_path(many, "train"), columns=["messages"])
    assert pq.ParquetFile(data.split_path(many, "train")).metadata.num_row_groups == 1
    chunks = list(conversation_chunks(pq.ParquetFile(data.split_path(many, "train")), None, 1_000, ["messages"]))
    assert [chunk.num_rows for chunk in chunks] == [1_000] * 5
    assert pa.concat_tables(chunks).column("messages").to_pylist() == split.column("messages").to_pylist()
    whole = len(pickle.dumps(split))
    assert all(len(pickle.dumps(chunk)) < whole / 4 for chunk in chunks)
    kept = list(
        conversation_chunks(
            pq.ParquetFile(data.split_path(many, "train")), eval_sample(5_000, 1_500), 1_000, ["messages"]
        )
    )
    assert [chunk.num_rows for chunk in kept] == [1_000, 500]
    assert all(len(pickle.dumps(chunk)) < whole / 4 for chunk in kept)


def test_the_eval_cap_is_a_fixed_sample_and_the_manifest_says_so(tiny_model_dir, tmp_path):
    """eval_max_rows keeps the same conversations in every build (and so in training and in the evaluation stage),
    in the split's order; the manifest records how many of how many."""
    data_dir = write_splits(tmp_path / "data", train=30, evaluation=50)
    settings = TokenSettings(max_length=128, loss_on="assistant", packing=True, eval_max_rows=10)
    first, _ = build(data_dir, tiny_model_dir, settings, tmp_path / "one", workers=1)
    second, _ = build(data_dir, tiny_model_dir, settings, tmp_path / "two", workers=1)
    for name in (EVAL_ROWS, EVAL_CONVERSATIONS):
        assert (first / name).read_bytes() == (second / name).read_bytes()

    kept = eval_sample(50, 10)
    assert list(kept) == sorted(set(kept)) and len(kept) == 10
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = tokenise_split(data.load_split(data_dir, "eval").select(kept), tokenizer, "assistant")
    assert open_rows(first, EVAL_CONVERSATIONS)["input_ids"] == expected["input_ids"]
    manifest = TokenManifest.read(first).eval
    assert (manifest.conversations, manifest.split_conversations, manifest.eval_max_rows) == (10, 50, 10)


def test_the_trainer_refuses_rows_made_for_other_settings_or_another_tokenizer(tiny_model_dir, tmp_path):
    data_dir = write_splits(tmp_path / "data", train=20, evaluation=5)
    tokens_dir, _ = build(data_dir, tiny_model_dir, TokenSettings(128, "assistant", True, 0), tmp_path / "c", 1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = TrainConfig(model=str(tiny_model_dir), tokens_dir=tokens_dir, max_length=256, loss_on="all")
    with pytest.raises(UserError) as refused:
        data.token_rows(config, tiny_model_dir, tokenizer)
    message = str(refused.value)
    assert "max_length 128 (this run: 256)" in message and "loss_on 'assistant' (this run: 'all')" in message
    assert "Run the tokenise step with this run's model and options" in message

    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    config = TrainConfig(model=str(tiny_model_dir), tokens_dir=tokens_dir, max_length=128)
    with pytest.raises(UserError, match="another tokenizer or chat template"):
        data.token_rows(config, tiny_model_dir, tokenizer)
    _, train, evaluation = data.token_rows(config, tiny_model_dir, AutoTokenizer.from_pretrained(tiny_model_dir))
    assert len(train) and len(evaluation)


def test_a_cache_that_will_not_fit_fails_before_the_work_with_the_sizes(tiny_model_dir, tmp_path, monkeypatch):
    data_dir = write_splits(tmp_path / "data", train=200, evaluation=10)
    free = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(build_module.shutil, "disk_usage", lambda path: free)
    with pytest.raises(UserError) as refused:
        build(data_dir, tiny_model_dir, TokenSettings(128, "assistant", True, 0), tmp_path / "cache", workers=1)
    message = " ".join(str(refused.value).split())
    assert "the tokenised data set needs about" in message and "has 0.0 GiB free" in message
    assert "the first 200 of 200 train conversations" in message and "Raise pvc_size" in message
    assert not list((tmp_path / "cache").iterdir())  # the partial build is gone too


def test_a_worker_killed_under_the_step_is_named_with_the_memory_fix():
    """A worker the kernel kills (OOM) breaks the pool; the step says what that usually means, not a traceback."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as executor:
        with pytest.raises(UserError, match="tokenising worker process was killed.*Raise tokenise_memory"):
            list(in_order(os._exit, executor, [9], window=1))


def test_too_little_memory_for_the_workers_is_named_before_any_work():
    check_memory(workers=2, limit=None)
    check_memory(workers=2, limit=4 << 30)
    with pytest.raises(UserError) as refused:
        check_memory(workers=8, limit=4 << 30)
    message = str(refused.value)
    assert "needs about 13.0 GiB for its 8 worker processes" in message and "memory limit is 4.0 GiB" in message
    assert "Raise tokenise_memory to at least 13Gi, or lower tokenise_cpu" in message


@pytest.mark.parametrize("version", [1, 2])
def test_the_pods_cpu_and_memory_limits_are_read_from_its_cgroup(tmp_path, monkeypatch, version):
    """A pod sees every CPU of its node in its affinity; its limits are in its cgroup (v2 on current OpenShift)."""
    import components.tokenise.stage as stage

    monkeypatch.setattr(stage, "CGROUP", tmp_path)
    monkeypatch.setattr(stage.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert (stage.usable_cpus(), stage.memory_limit()) == (64, None)
    if version == 2:
        (tmp_path / "cpu.max").write_text("400000 100000\n")
        (tmp_path / "memory.max").write_text(f"{8 << 30}\n")
    else:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
        (tmp_path / "memory").mkdir()
        (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{8 << 30}\n")
    assert (stage.usable_cpus(), stage.memory_limit()) == (4, 8 << 30)


def test_the_command_line_tokenises_once_then_reuses(tiny_model_dir, tmp_path):
    data_dir = write_splits(tmp_path / "data", train=40, evaluation=8)
    arguments = ["--data-dir", data_dir, "--model", tiny_model_dir, "--cache-dir", tmp_path / "cache"]
    first = run_module("components.tokenise.stage", *arguments, "--max-length", 256)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "tokenised now" in first.stdout and "train: 40 conversations" in first.stdout
    assert "eval:  8 of 8 conversations (eval_max_rows 1000)" in first.stdout
    tokens_dir = first.stdout.strip().splitlines()[-1].removeprefix("tokens -> ")
    again = run_module("components.tokenise.stage", *arguments, "--max-length", 256)
    assert again.returncode == 0 and "reused from the cache" in again.stdout
    assert again.stdout.strip().endswith(f"tokens -> {tokens_dir}")
    assert TokenManifest.read(Path(tokens_dir)).settings["max_length"] == 256


def test_a_missing_data_directory_is_one_paragraph(tiny_model_dir, tmp_path):
    result = run_module(
        "components.tokenise.stage",
        "--data-dir",
        tmp_path / "nowhere",
        "--model",
        tiny_model_dir,
        "--cache-dir",
        tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = " ".join(result.stderr.split())
    assert "nowhere/train.parquet does not exist. --data-dir must be the output directory of the data" in error


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda value: value.update({"format": token_cache.FORMAT_VERSION + 1}), "was written in tokenised format"),
        (lambda value: value.pop("eval"), "its token cache manifest has no eval"),
        (lambda value: value["train"].pop("rows"), "its train split has no rows"),
    ],
    ids=["other-format", "no-eval", "split-without-rows"],
)
def test_a_manifest_of_another_format_or_missing_a_field_is_refused_naming_it(tmp_path, change, says):
    """The manifest is read through its record: what the trainer and the evaluation read is there, or one
    paragraph says what is missing and to tokenise again."""
    counts = token_cache.SplitTokens(3, 300, 120, 140, 2, 0.5, 6.0)
    manifest = TokenManifest(
        format=token_cache.FORMAT_VERSION,
        key="k",
        data="d",
        data_dir="data",
        tokenizer="t",
        tokenizer_dir="model",
        settings={"max_length": 256, "loss_on": "assistant", "packing": True, "eval_max_rows": 0},
        workers=1,
        train=counts,
        eval=dataclasses.replace(counts, split_conversations=3, eval_max_rows=0),
        bytes=1000,
    )
    manifest.write(tmp_path / "manifest.json")
    assert TokenManifest.read(tmp_path) == manifest
    value = json.loads((tmp_path / "manifest.json").read_text())
    change(value)
    (tmp_path / "manifest.json").write_text(json.dumps(value))
    with pytest.raises(UserError) as refused:
        TokenManifest.read(tmp_path)
    message = str(refused.value)
    assert str(tmp_path) in message and says in message and "tokenise step again" in message
    assert "\n" not in message


def mixture_splits(tmp_path: Path, objective: str) -> Path:
    """A data step's output of two sources: long conversations (many truncated at 128 tokens) and short ones; for
    dpo, pairs, two of the second source's with a prompt too long to keep any answer."""
    rng = random.Random(7)
    if objective == "dpo":
        long = " ".join(rng.choice(TOPICS) for _ in range(150))  # cut at max_length in training
        first = [
            {"prompt": f"Which knot, case {i}?", "chosen": f"A bowline: {long}.", "rejected": "Any."}
            for i in range(300)
        ]
        second = [{"prompt": f"Tent pegs {i}?", "chosen": "Angle them away.", "rejected": "Push."} for i in range(200)]
        for i in (3, 150):
            second[i]["prompt"] = f"Tent pegs {i}: " + " ".join(rng.choice(TOPICS) for _ in range(200)) + "?"
    else:
        first = [{"messages": conversation(rng)} for _ in range(300)]
        second = [{"question": f"{rng.choice(TOPICS)} tip {i}?", "answer": f"Keep it short, {i}."} for i in range(200)]
    sources = [
        SourceFiles(DataSource(str(path)), [write_jsonl(path, rows)])
        for path, rows in ((tmp_path / "first.jsonl", first), (tmp_path / "second.jsonl", second))
    ]
    return prepare(sources, tmp_path / "data", PrepareOptions(eval_fraction=0.1), objective).output_dir


@pytest.mark.parametrize(
    ("objective", "packing"), [("sft", True), ("sft", False), ("dpo", True)], ids=["packed", "truncated", "pairs"]
)
def test_each_sources_tokens_are_what_tokenising_its_rows_alone_counts(
    tiny_model_dir, tmp_path, monkeypatch, objective, packing
):
    """A mixture's train split is tokenised in chunks that cross from one source to the next, by two workers; each
    source's share in the manifest equals what tokenising that source's rows alone counts, and the shares add up to
    the split's counts."""
    monkeypatch.setattr(build_module, "CHUNK_ROWS", 128)
    data_dir = mixture_splits(tmp_path, objective)
    stats = DataStats.read(data_dir / DATA_STATS)
    settings = TokenSettings(max_length=128, loss_on="assistant", packing=packing, eval_max_rows=0, objective=objective)
    tokens_dir, _ = build(data_dir, tiny_model_dir, settings, tmp_path / "cache", workers=2)
    manifest = TokenManifest.read(tokens_dir)
    sources = manifest.train.sources
    assert [source.uri for source in sources] == [source.uri for source in stats.sources]
    assert [source.conversations for source in sources] == [source.train_rows for source in stats.sources]
    assert sum(source.tokens for source in sources) == manifest.train.tokens
    assert sum(source.loss_tokens for source in sources) == manifest.train.loss_tokens

    train = pq.read_table(data_dir / "train.parquet")
    start = 0
    for number, source in enumerate(sources):
        alone = tmp_path / f"alone-{number}"
        alone.mkdir()
        pq.write_table(train.slice(start, source.conversations), alone / "train.parquet")
        shutil.copy(data_dir / "eval.parquet", alone / "eval.parquet")  # no stats.json: one source
        alone_tokens, _ = build(alone, tiny_model_dir, settings, tmp_path / "cache", workers=1)
        counted = TokenManifest.read(alone_tokens).train
        assert (counted.conversations, counted.tokens, counted.loss_tokens) == (
            source.conversations,
            source.tokens,
            source.loss_tokens,
        )
        assert counted.sources == ()
        if objective == "dpo":  # the answer tokens TRL keeps of the rows written: prompt and answer cut at 128
            rows = open_rows(alone_tokens, TRAIN_ROWS)
            kept = [
                min(len(answer), 128 - len(prompt))
                for prompt, chosen, rejected in zip(rows["prompt_ids"], rows["chosen_ids"], rows["rejected_ids"])
                for answer in (chosen, rejected)
            ]
            assert source.loss_tokens == sum(kept)
        start += source.conversations
    if objective == "dpo":
        assert manifest.train.prompts_too_long == 2  # both in the second source: its loss tokens leave them out
        assert sources[0].tokens > 2 * sources[0].loss_tokens  # the long answers really were cut
    else:
        assert manifest.train.longest_conversation_tokens > 128  # some rows really were truncated
        trained = open_rows(tokens_dir, TRAIN_ROWS)["labels"]  # what the trainer computes its loss on
        assert manifest.train.loss_tokens == sum(label != -100 for row in trained for label in row)
    lines = source_lines(manifest.train)
    assert lines[1].startswith(f"source 2: {stats.sources[1].uri}: {sources[1].conversations} conversations, ")


def test_stats_that_do_not_describe_the_train_split_are_refused_naming_both(tiny_model_dir, tmp_path):
    data_dir = mixture_splits(tmp_path, "sft")
    stats = DataStats.read(data_dir / DATA_STATS)
    first = dataclasses.replace(stats.sources[0], train_rows=stats.sources[0].train_rows + 1)
    dataclasses.replace(stats, sources=(first, *stats.sources[1:])).write(data_dir / DATA_STATS)
    settings = TokenSettings(max_length=128, loss_on="assistant", packing=True, eval_max_rows=0)
    with pytest.raises(UserError) as refused:
        build(data_dir, tiny_model_dir, settings, tmp_path / "cache", workers=1)
    rows = stats.train_rows
    assert f"says its 2 sources gave {rows + 1} training rows, and {data_dir / 'train.parquet'} holds {rows}" in str(
        refused.value
    )
    assert not list((tmp_path / "cache").glob("*"))  # nothing left half-built


def test_an_entry_is_reused_for_the_same_sources_and_rebuilt_for_renamed_ones(tiny_model_dir, tmp_path):
    """The sources named in the manifest are the run's: a source moved elsewhere with the same rows (same Parquet
    bytes) gets its own entry, where reusing the old one would credit its tokens to the old URI."""
    data_dir = mixture_splits(tmp_path, "sft")
    settings = TokenSettings(max_length=128, loss_on="assistant", packing=True, eval_max_rows=0)
    first, built = build(data_dir, tiny_model_dir, settings, tmp_path / "cache", workers=1)
    assert built and build(data_dir, tiny_model_dir, settings, tmp_path / "cache", workers=1) == (first, False)

    stats = DataStats.read(data_dir / DATA_STATS)
    moved = dataclasses.replace(stats.sources[0], uri="s3://new-bucket/first.jsonl")
    dataclasses.replace(stats, sources=(moved, *stats.sources[1:])).write(data_dir / DATA_STATS)
    second, built = build(data_dir, tiny_model_dir, settings, tmp_path / "cache", workers=1)
    assert built and second != first
    assert TokenManifest.read(second).train.sources[0].uri == "s3://new-bucket/first.jsonl"
