"""Tokenise the data stage's Parquet splits once, over every CPU of the step, into a token-cache entry.

The train split is streamed: chunks of ``CHUNK_ROWS`` conversations go to worker
processes (each with its own tokenizer) and come back, in order, as the rows the
trainer trains on; the main process appends them to an Arrow stream. Memory is
a few chunks per worker whatever the data size.

The rows are what TRL's ``SFTTrainer`` would make of today's tokenised
conversations (``trainer.data.tokenise``): labels from the assistant masks; then
either truncation to ``max_length`` dropping rows left with no loss, or TRL's own
``pack_dataset`` (best-fit decreasing), which packs groups of ``PACK_GROUP``
consecutive rows. Chunks are whole groups, so packing chunk by chunk in the
workers gives exactly the rows packing the whole split at once gives.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets import Dataset, disable_progress_bars
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from trl.data_utils import pack_dataset

from common.errors import UserError
from common.records import DataStats, SourceStats, SourceTokens
from common.run_layout import DATA_STATS, EVAL_CONVERSATIONS, EVAL_ROWS, TOKENS_MANIFEST, TRAIN_ROWS
from trainer import token_cache
from trainer.data import SPLITS, split_path
from trainer.masking import TemplateError, tokenise_batch
from trainer.preference_rows import PAIR_COLUMNS, tokenise_pairs
from trainer.token_cache import SplitTokens, TokenManifest, TokenSettings

log = logging.getLogger(__name__)

# TRL packs with datasets.map's default batch size: best-fit decreasing within each 1,000 consecutive rows.
PACK_GROUP = 1000
# One packing group per chunk: small enough that a few thousand conversations already keep every worker busy
# (4,000-row chunks left one of two workers idle for a third of a 9,000-row split), and measured as fast per
# conversation as larger chunks.
CHUNK_ROWS = PACK_GROUP
# A partial build whose files have not changed for this long belongs to a process that is gone.
STALE_BUILD_SECONDS = 600
# The eval conversations kept under eval_max_rows are a sample drawn with this seed: the same split always
# gives the same rows, in every run and in both the trainer and the evaluation stage.
EVAL_SAMPLE_SEED = 0
PROGRESS_SECONDS = 30

ROWS_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])
PAIR_ROWS_SCHEMA = pa.schema([(name, pa.list_(pa.int32())) for name in PAIR_COLUMNS])
PACKED_SCHEMA = ROWS_SCHEMA.append(pa.field("seq_lengths", pa.list_(pa.int32())))
CONVERSATIONS_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("assistant_masks", pa.list_(pa.int8()))])


@dataclass
class SplitStats:
    """What one split became; the manifest records it so a user can predict the step's time for their data."""

    conversations: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    longest: int = 0
    rows: int = 0
    seconds: float = 0.0
    split_conversations: int | None = None  # the eval split's, of which eval_max_rows were kept
    eval_max_rows: int | None = None
    prompts_too_long: int | None = None  # preference pairs dropped for a prompt of max_length tokens or more
    sources: tuple[SourceTokens, ...] = ()  # a mixture's train split: each source's rows of it

    def counts(self) -> SplitTokens:
        """What the manifest records of this split."""
        per_second = self.conversations / self.seconds if self.seconds else None
        return SplitTokens(
            conversations=self.conversations,
            tokens=self.tokens,
            loss_tokens=self.loss_tokens,
            longest_conversation_tokens=self.longest,
            rows=self.rows,
            seconds=round(self.seconds, 2),
            conversations_per_second=round(per_second, 1) if per_second else None,
            split_conversations=self.split_conversations,
            eval_max_rows=self.eval_max_rows,
            prompts_too_long=self.prompts_too_long,
            sources=self.sources,
        )


class SourceTally:
    """Each source's share of a mixture's train split, summed chunk by chunk: the data step wrote the split source
    by source in the order of ``stats.sources``, so the source of a row is known from its position alone."""

    def __init__(self, sources: Sequence[SourceStats]) -> None:
        self.uris = [source.uri for source in sources]
        self.ends = np.cumsum([source.train_rows for source in sources])
        self.conversations, self.tokens, self.loss_tokens = (np.zeros(len(sources), np.int64) for _ in range(3))
        self.key = tuple((source.uri, source.train_rows) for source in sources)  # part of the cache key

    def add(self, first_row: int, chunk: Chunk) -> None:
        """The counts of a chunk whose first conversation is row ``first_row`` of the split."""
        which = np.searchsorted(self.ends, first_row + np.arange(len(chunk.row_tokens)), side="right")
        np.add.at(self.conversations, which, 1)
        np.add.at(self.tokens, which, chunk.row_tokens)
        np.add.at(self.loss_tokens, which, chunk.row_loss_tokens)

    def records(self) -> tuple[SourceTokens, ...]:
        return tuple(
            SourceTokens(uri, int(conversations), int(tokens), int(loss_tokens))
            for uri, conversations, tokens, loss_tokens in zip(
                self.uris, self.conversations, self.tokens, self.loss_tokens, strict=True
            )
        )


@dataclass(frozen=True)
class Chunk:
    """What a worker makes of one chunk of conversations."""

    rows: pa.Table  # the trainer's rows (ROWS_SCHEMA, or PACKED_SCHEMA when packing; PAIR_ROWS_SCHEMA for pairs)
    conversations: pa.Table | None  # CONVERSATIONS_SCHEMA, when asked for
    longest: int
    # Per conversation (or pair) of the chunk, in order: its tokens as tokenised, and the tokens the loss is
    # computed on (none for a row dropped); the split's counts are their sums, a source's the sums over its rows
    row_tokens: np.ndarray
    row_loss_tokens: np.ndarray
    prompts_too_long: int = 0  # pairs dropped

    @property
    def tokens(self) -> int:
        return int(self.row_tokens.sum())

    @property
    def loss_tokens(self) -> int:
        return int(self.row_loss_tokens.sum())


# Each worker process loads the tokenizer once; the chunks it is sent then only carry conversations.
_worker: dict[str, Any] = {}


def start_worker(tokenizer_dir: str, settings: TokenSettings) -> None:
    # The workers already use every CPU; the tokenizer's own thread pool inside each would oversubscribe them.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    disable_progress_bars()  # packing maps over each chunk: a bar per chunk would bury the step's own lines
    _worker["tokenizer"] = AutoTokenizer.from_pretrained(tokenizer_dir)
    _worker["settings"] = settings


def tokenise_chunk(messages: pa.Table, keep_conversations: bool) -> Chunk:
    """Tokenise, mask, label and prepare (truncate or pack) one chunk, in a worker."""
    tokenizer: PreTrainedTokenizerBase = _worker["tokenizer"]
    settings: TokenSettings = _worker["settings"]
    if settings.objective == "dpo":
        return tokenise_pair_chunk(messages, tokenizer, settings.max_length)
    encoded = tokenise_batch(tokenizer, messages.column("messages").to_pylist())
    lengths, ids, masks = encoded.lengths, encoded.input_ids, encoded.assistant_masks
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
    # TRL: with an assistant mask, labels are the ids where the mask is set and -100 elsewhere; without, the ids.
    labels = ids if settings.loss_on == "all" else np.where(masks == 1, ids, np.int32(-100)).astype(np.int32)
    input_ids = pa.ListArray.from_arrays(offsets, ids)
    rows = pa.table({"input_ids": input_ids, "labels": pa.ListArray.from_arrays(offsets, labels)})
    conversations = (
        pa.table({"input_ids": input_ids, "assistant_masks": pa.ListArray.from_arrays(offsets, masks)})
        if keep_conversations
        else None
    )
    # Both truncation and TRL's packing keep a conversation's first max_length tokens (trl's _pack_bfd slices each
    # row so before packing); truncation then drops the rows left with no loss
    row_loss = labelled_per_row(pc.list_slice(rows.column("labels"), 0, settings.max_length), len(rows))
    prepared = packed(rows, settings.max_length) if settings.packing else truncated(rows, settings.max_length, row_loss)
    return Chunk(prepared, conversations, int(lengths.max(initial=0)), lengths, row_loss)


def tokenise_pair_chunk(pairs: pa.Table, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Chunk:
    """One chunk of preference pairs as the rows TRL's DPOTrainer makes (trainer.preference_rows)."""
    columns = [pairs.column(name).to_pylist() for name in ("prompt", "chosen", "rejected")]
    rows, dropped = tokenise_pairs(tokenizer, *columns, max_length=max_length)
    table = pa.table({name: pa.array(rows[name], pa.list_(pa.int32())) for name in PAIR_COLUMNS})
    prompt, chosen, rejected = (np.asarray(pc.list_value_length(table.column(name))) for name in PAIR_COLUMNS)
    longest = int(np.maximum(prompt + chosen, prompt + rejected).max(initial=0))
    # TRL keeps the start of prompt plus answer up to max_length: the answer tokens the loss sees
    room = max_length - prompt
    kept = np.ones(len(pairs), dtype=bool)
    kept[dropped] = False
    row_tokens, row_answers = np.zeros(len(pairs), np.int64), np.zeros(len(pairs), np.int64)
    row_tokens[kept] = 2 * prompt + chosen + rejected
    row_answers[kept] = np.minimum(chosen, room) + np.minimum(rejected, room)
    return Chunk(table, None, longest, row_tokens, row_answers, len(dropped))


def truncated(rows: pa.Table, max_length: int, row_loss: np.ndarray) -> pa.Table:
    """TRL without packing: keep the first ``max_length`` tokens, then drop rows left with no loss (``row_loss``:
    each row's labelled tokens within them)."""
    ids = pc.list_slice(rows.column("input_ids"), 0, max_length)
    labels = pc.list_slice(rows.column("labels"), 0, max_length)
    return pa.table({"input_ids": ids, "labels": labels}).filter(pa.array(row_loss > 0)).cast(ROWS_SCHEMA)


def labelled_per_row(labels: pa.ChunkedArray, count: int) -> np.ndarray:
    """How many of each row's labels are not -100: the tokens the loss is computed on."""
    labelled = pc.not_equal(pc.list_flatten(labels), -100).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(labels).to_numpy(zero_copy_only=False)
    return np.bincount(parents[labelled], minlength=count)


def packed(rows: pa.Table, max_length: int) -> pa.Table:
    """TRL with packing: its own ``pack_dataset`` (bfd), over whole groups of ``PACK_GROUP`` rows."""
    result = pack_dataset(Dataset(rows), max_length, "bfd", {"batch_size": PACK_GROUP})
    return result.data.table.cast(PACKED_SCHEMA)


def conversation_chunks(
    parquet: pq.ParquetFile, keep: np.ndarray | None, size: int, columns: list[str]
) -> Iterator[pa.Table]:
    """The split's ``columns`` (only the rows in ``keep``, when given) in tables of ``size`` rows."""
    return exact_chunks(selected(parquet.iter_batches(batch_size=size, columns=columns), keep), size)


def exact_chunks(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.Table]:
    """The rows of ``batches`` regrouped into tables of exactly ``size`` rows (the last may be shorter), each a
    copy holding only its own rows: a table is pickled to a worker with every buffer it references, so a slice
    of a larger batch would carry the whole batch (a 1,000-row slice of a 65,536-row batch pickled to 27 MB)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += batch.num_rows
        while held >= size:
            table = pa.Table.from_batches(pending)
            yield table.take(np.arange(size))
            rest = table.slice(size).to_batches()
            pending, held = list(rest), held - size
    if held:
        table = pa.Table.from_batches(pending)
        yield table.take(np.arange(held))


def eval_sample(total: int, cap: int) -> np.ndarray | None:
    """The eval rows kept under ``cap`` (sorted, so they keep the split's order), or None to keep them all."""
    if cap <= 0 or cap >= total:
        return None
    return np.sort(np.random.default_rng(EVAL_SAMPLE_SEED).choice(total, size=cap, replace=False))


def selected(batches: Iterable[pa.RecordBatch], keep: np.ndarray | None) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` whose position in the whole stream is in ``keep`` (all when None)."""
    start = 0
    for batch in batches:
        if keep is None:
            yield batch
        else:
            inside = keep[(keep >= start) & (keep < start + batch.num_rows)] - start
            if inside.size:
                yield batch.take(pa.array(inside))
        start += batch.num_rows


def in_order(run: Callable[[pa.Table], Chunk], executor: Executor | None, chunks: Iterable[pa.Table], window: int):
    """``run`` over ``chunks``, results in order, with at most ``window`` chunks in flight."""
    if executor is None:
        yield from map(run, chunks)
        return
    pending: deque[Future] = deque()
    try:
        for chunk in chunks:
            pending.append(executor.submit(run, chunk))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise UserError(
            "a tokenising worker process was killed (the kernel's OOM killer is the usual cause: the step's log or "
            "pod status says OOMKilled). Raise tokenise_memory, or lower tokenise_cpu so fewer workers share it."
        ) from None


class Builder:
    """One cache entry being written in a staging directory, its splits tokenised by a pool of workers."""

    def __init__(self, tokenizer_dir: Path, settings: TokenSettings, workers: int, staging: Path) -> None:
        self.settings = settings
        self.staging = staging
        self.workers = workers
        self.executor: Executor | None = None
        if workers > 1:
            # Forked workers start in a fraction of a second with every module already imported (spawned ones took
            # 5-10 s each importing transformers, TRL and torch). The parent has not used the tokenizer's thread
            # pool before forking, which is what makes forking it unsafe; datasets' own map(num_proc) forks too.
            self.executor = ProcessPoolExecutor(
                workers,
                mp_context=get_context("fork"),
                initializer=start_worker,
                initargs=(str(tokenizer_dir), settings),
            )
        else:
            start_worker(str(tokenizer_dir), settings)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(cancel_futures=True)

    def write_split(
        self,
        source: Path,
        keep: np.ndarray | None,
        rows_name: str,
        conversations_name: str | None,
        check_space: Callable[[int, int, int], None] | None = None,
        sources: SourceTally | None = None,
    ) -> SplitStats:
        """Tokenise one Parquet split into ``rows_name`` (and ``conversations_name``) in the staging directory;
        ``sources`` sums each source's share of it."""
        parquet = pq.ParquetFile(source, pre_buffer=False)  # pre-buffering held column chunks far ahead of us
        total = parquet.metadata.num_rows if keep is None else len(keep)
        stats = SplitStats()
        started = last_report = time.monotonic()
        pairs = self.settings.objective == "dpo"
        rows_schema = PAIR_ROWS_SCHEMA if pairs else PACKED_SCHEMA if self.settings.packing else ROWS_SCHEMA
        with ExitStack() as files:
            rows_out = files.enter_context(pa.ipc.new_stream(self.staging / rows_name, rows_schema))
            conversations_out = (
                files.enter_context(pa.ipc.new_stream(self.staging / conversations_name, CONVERSATIONS_SCHEMA))
                if conversations_name
                else None
            )
            columns = ["prompt", "chosen", "rejected"] if pairs else ["messages"]
            chunks = conversation_chunks(parquet, keep, CHUNK_ROWS, columns)
            run = _ChunkJob(keep_conversations=conversations_name is not None)
            for number, result in enumerate(in_order(run, self.executor, chunks, 2 * self.workers)):
                first_row = number * CHUNK_ROWS
                if isinstance(result, TemplateError):
                    raise UserError(
                        f"{source}, a conversation among rows {first_row}–{first_row + CHUNK_ROWS - 1}: {result}."
                    )
                if number == 0 and check_space is not None:
                    sampled = min(CHUNK_ROWS, total)
                    check_space(result.rows.nbytes * total // max(sampled, 1), sampled, total)
                rows_out.write_table(result.rows)
                if conversations_out is not None:
                    conversations_out.write_table(result.conversations)
                stats.conversations += min(CHUNK_ROWS, total - first_row)
                stats.tokens += result.tokens
                stats.loss_tokens += result.loss_tokens
                stats.longest = max(stats.longest, result.longest)
                if pairs:
                    stats.prompts_too_long = (stats.prompts_too_long or 0) + result.prompts_too_long
                stats.rows += result.rows.num_rows
                if sources is not None:
                    sources.add(first_row, result)
                if time.monotonic() - last_report > PROGRESS_SECONDS:
                    last_report = time.monotonic()
                    rate = stats.conversations / (last_report - started)
                    log.info(
                        "%s: %d of %d conversations tokenised (%.0f/s)", source.name, stats.conversations, total, rate
                    )
        stats.seconds = time.monotonic() - started
        stats.sources = sources.records() if sources is not None else ()
        return stats


@dataclass(frozen=True)
class _ChunkJob:
    """A picklable call of ``tokenise_chunk`` that returns a template problem instead of raising it across the
    pool (the main process names the file and rows)."""

    keep_conversations: bool

    def __call__(self, messages: pa.Table) -> Chunk | TemplateError:
        try:
            return tokenise_chunk(messages, self.keep_conversations)
        except TemplateError as error:
            return error


def clear_stale_builds(cache_root: Path, key: str) -> None:
    """Remove partial builds of ``key`` left by killed processes; a build still writing is left alone."""
    for partial in cache_root.glob(f".building-{key}-*"):
        newest = max((path.stat().st_mtime for path in partial.rglob("*")), default=partial.stat().st_mtime)
        if time.time() - newest > STALE_BUILD_SECONDS:
            log.info("removing %s, a partial tokenisation left by a process that stopped", partial)
            shutil.rmtree(partial, ignore_errors=True)


def check_kind(split: Path, objective: str) -> None:
    """Refuse a split of the other kind than ``objective`` trains on (conversations for sft, pairs for dpo)."""
    columns = set(pq.read_schema(split).names)
    pairs = {"prompt", "chosen", "rejected"} <= columns
    if objective == "dpo" and not pairs:
        raise UserError(
            f"{split} holds conversations, and objective dpo trains on preference pairs (prompt, chosen, rejected). "
            "Prepare the data with objective dpo (python -m components.data.stage --objective dpo), or train with "
            "objective sft."
        )
    if objective != "dpo" and pairs:
        raise UserError(
            f"{split} holds preference pairs, and objective {objective} trains on conversations. Tokenise and train "
            "with objective dpo, or prepare conversations with objective sft."
        )


def space_check(cache_root: Path, eval_conversations: int) -> Callable[[int, int, int], None]:
    """A check, given the first chunk's bytes scaled to the whole train split, that the cache entry fits."""

    def check(train_bytes: int, sampled: int, train_conversations: int) -> None:
        # The eval files hold at most as much per conversation as the train rows, twice (rows and conversations).
        needed = train_bytes + 2 * train_bytes * eval_conversations // max(train_conversations, 1)
        free = shutil.disk_usage(cache_root).free
        if needed > free:
            raise UserError(
                f"the tokenised data set needs about {needed / 2**30:.1f} GiB (estimated from the first {sampled} "
                f"of {train_conversations} train conversations) and {cache_root} has "
                f"{free / 2**30:.1f} GiB free. Raise pvc_size (a new run's PVC), free space on the workspace "
                "(old runs/ and token-cache/ entries), or train on less data."
            )

    return check


def mixture_sources(data_dir: Path, train_split: Path) -> SourceTally | None:
    """The sources of a mixture's train split, as the data step recorded them beside it (``stats.json``); None for
    one source, or for a directory without the file (splits made some other way)."""
    stats = DataStats.read(data_dir / DATA_STATS)
    if stats is None or not stats.sources:
        return None
    rows = pq.ParquetFile(train_split).metadata.num_rows
    recorded = sum(source.train_rows for source in stats.sources)
    if recorded != rows:
        raise UserError(
            f"{data_dir / DATA_STATS} says its {len(stats.sources)} sources gave {recorded} training rows, and "
            f"{train_split} holds {rows}: the two files were not written by the same data step. Run the data step "
            "again into an empty directory, and tokenise what it writes."
        )
    return SourceTally(stats.sources)


def build(
    data_dir: Path, tokenizer_dir: Path, settings: TokenSettings, cache_root: Path, workers: int
) -> tuple[Path, bool]:
    """The cache entry for these inputs, and whether it had to be written: reused when complete, else built."""
    paths = [split_path(data_dir, split) for split in SPLITS]
    for path in paths:
        if not path.is_file():
            raise UserError(
                f"{path} does not exist. --data-dir must be the output directory of the data preparation stage "
                "(python -m components.data.stage), which holds train.parquet and eval.parquet."
            )
    check_kind(paths[0], settings.objective)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.chat_template is None:
        raise UserError(f"the tokenizer in {tokenizer_dir} has no chat template; fine-tune an instruct/chat model.")
    data = token_cache.data_fingerprint(paths)
    tokenizer_print = token_cache.tokenizer_fingerprint(tokenizer_dir, tokenizer)
    sources = mixture_sources(data_dir, paths[0])
    key = token_cache.cache_key(data, tokenizer_print, settings, sources.key if sources else ())
    final = cache_root / key
    if (final / TOKENS_MANIFEST).is_file():
        log.info("reusing the tokenised data in %s (same data, tokenizer and settings)", final)
        return final, False
    cache_root.mkdir(parents=True, exist_ok=True)
    clear_stale_builds(cache_root, key)
    staging = cache_root / f".building-{key}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    # A worker process costs seconds to start; a data set of a few chunks does not need one per CPU.
    workers = max(1, min(workers, -(-pq.ParquetFile(paths[0]).metadata.num_rows // CHUNK_ROWS)))
    builder = Builder(tokenizer_dir, settings, workers, staging)
    try:
        eval_total = pq.ParquetFile(paths[1]).metadata.num_rows
        keep = eval_sample(eval_total, settings.eval_max_rows)
        eval_kept = eval_total if keep is None else len(keep)
        log.info("tokenising %s and %s with %d worker(s) into %s", paths[0], paths[1], workers, final)
        check = space_check(cache_root, eval_kept)
        train = builder.write_split(paths[0], None, TRAIN_ROWS, None, check, sources)
        # the evaluation stage's held-out loss reads whole conversations; for pairs it reads the pair rows
        conversations = None if settings.objective == "dpo" else EVAL_CONVERSATIONS
        evaluation = builder.write_split(paths[1], keep, EVAL_ROWS, conversations)
        evaluation.split_conversations, evaluation.eval_max_rows = eval_total, settings.eval_max_rows
    except BaseException:
        builder.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    builder.close()
    TokenManifest(
        format=token_cache.FORMAT_VERSION,
        key=key,
        data=data,
        data_dir=str(data_dir),
        tokenizer=tokenizer_print,
        tokenizer_dir=str(tokenizer_dir),
        settings=asdict(settings),
        workers=workers,
        train=train.counts(),
        eval=evaluation.counts(),
        bytes=sum(path.stat().st_size for path in staging.iterdir()),
    ).write(staging / TOKENS_MANIFEST)
    try:
        staging.rename(final)
    except OSError:  # another run finished the same entry first: theirs is identical
        shutil.rmtree(staging, ignore_errors=True)
        if not (final / TOKENS_MANIFEST).is_file():
            raise
    log.info("wrote %s", final)
    return final, True
