"""The data preparation stage: JSONL in, train/eval Parquet and a report out.

One streaming pass: read a chunk, parse, validate and normalise it, drop exact
duplicates, route each row to train or eval by its content hash, and append it
to the Parquet writers. Memory holds one chunk plus 8 bytes of hash and 8 bytes
of length statistics per distinct record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.ahead import mapped_ahead
from common.atomic import staging_dir
from common.errors import UserError
from common.records import EVAL_SPLIT_NAME, DataStats, Overlap, RemoteVersion, SourceLineage, SourceStats
from common.run_layout import DATA_REPORT, DATA_STATS, EVAL_SPLIT, REJECTS, TRAIN_SPLIT
from components.data.chunks import Chunk, read_chunks, resolve_inputs
from components.data.contamination import NgramIndex
from components.data.dedup import SeenHashes, content_hashes, eval_mask
from components.data.field_map import FieldMap
from components.data.lengths import LengthHistogram
from components.data.mixture import DataSource, allocate, choose_rows
from components.data.normalise import RowProblem, normalise
from components.data.options import PrepareOptions, fingerprinted
from components.data.overlaps import index_of, overlapping
from components.data.pairs import normalise_pairs
from components.data.parse import ParsedChunk, Reject, excerpt, parse_chunk, split_lines
from components.data.report import data_report
from components.data.schema import OUTPUT_SCHEMA, PAIR_SCHEMA
from components.data.shapes import SHAPES
from components.data.staged import batches as staged_batches

FAILED_REJECTS_FILE = "rejects.failed.jsonl"


@dataclass(frozen=True)
class RowKind:
    """What an objective trains on, as the data step writes it: how a chunk's rows are checked and made, and the
    Parquet columns they fill (after ``id``, each a list of messages)."""

    normalise: Callable[[pa.Table, str], tuple[Any, list[RowProblem]]]
    schema: pa.Schema
    columns: tuple[str, ...]
    name: str  # what a row is, as stats.json and the run's summary count them
    learned: tuple[str, ...]  # the columns whose text the contamination check reads (components/data/overlaps)


# By objective: supervised fine-tuning trains on conversations, preference tuning on pairs.
ROW_KINDS = {
    "sft": RowKind(normalise, OUTPUT_SCHEMA, ("messages",), "conversations", ("messages",)),
    "dpo": RowKind(
        normalise_pairs, PAIR_SCHEMA, ("prompt", "chosen", "rejected"), "preference pairs", ("prompt", "chosen")
    ),
}
PERCENTILES = (50, 90, 99)


@dataclass
class PrepareResult:
    output_dir: Path
    stats: DataStats

    @property
    def train_path(self) -> Path:
        return self.output_dir / TRAIN_SPLIT

    @property
    def eval_path(self) -> Path:
        return self.output_dir / EVAL_SPLIT

    @property
    def rejects_path(self) -> Path:
        return self.output_dir / REJECTS

    @property
    def stats_path(self) -> Path:
        return self.output_dir / DATA_STATS

    @property
    def report_path(self) -> Path:
        return self.output_dir / DATA_REPORT


@dataclass
class _Tally:
    """Running counts and statistics of one run."""

    records: int = 0
    blank_lines: int = 0
    duplicates: int = 0
    rows: Counter = field(default_factory=Counter)
    rejects: Counter = field(default_factory=Counter)
    shapes: Counter = field(default_factory=Counter)
    conversation_chars: LengthHistogram = field(default_factory=LengthHistogram)
    response_chars: LengthHistogram = field(default_factory=LengthHistogram)
    first_reject: Reject | None = None
    mapped_columns_seen: set[str] = field(default_factory=set)
    duplicates_across: int = 0  # of the duplicates, repeats of an earlier source's record (a mixture's only)


@dataclass(frozen=True)
class SourceFiles:
    """A source as the data step reads it: ``dataset_uri``, or one entry of ``dataset_sources``; the files it names,
    and how its server identified them (``sources.fetch``)."""

    source: DataSource
    files: list[Path]
    remote: RemoteVersion = RemoteVersion()


def prepare(
    inputs: str | SourceFiles | Sequence[SourceFiles],
    output_dir: Path,
    options: PrepareOptions = PrepareOptions(),
    objective: str = "sft",
    benchmarks: Mapping[str, Sequence[str]] = MappingProxyType({}),
) -> PrepareResult:
    """Run the stage; raise ``UserError`` (outputs untouched) when the input is unusable.

    ``inputs``: a path, directory or glob, read with ``options.field_map``, or one such source with its lineage; or
    several sources, each read with its own field_map into the shared eval split, their training rows mixed by
    their weights (components/data/mixture). ``benchmarks``: each benchmark task's documents
    (components/benchmark_tasks/documents.py), which every source's training rows are checked against.
    """
    mixture = not isinstance(inputs, (str, SourceFiles))
    if isinstance(inputs, str):
        inputs = SourceFiles(DataSource(inputs, field_map=options.field_map), resolve_inputs(inputs))
    sources = list(inputs) if mixture else [inputs]
    files = [path for source in sources for path in source.files]
    output_dir = Path(output_dir)
    tally = _Tally()
    seen = SeenHashes()
    digests = {TRAIN_SPLIT: hashlib.sha256(), EVAL_SPLIT: hashlib.sha256()}
    kind = ROW_KINDS[objective]
    with staging_dir(output_dir) as stage:
        eval_writer = _parquet_writer(stage.file(EVAL_SPLIT), kind)
        staged: list[Path] = []  # each source's training rows with their content keys, before the mixing
        per_source: list[_Counts] = []
        lineage: list[SourceLineage] = []
        with open(stage.file(REJECTS), "w", encoding="utf-8") as rejects_out:
            for number, source in enumerate(sources):
                fields = FieldMap.parse(source.source.field_map)  # validated with the options or the source list
                train_path = stage.file(f"{TRAIN_SPLIT}.source-{number}")
                train_writer = _parquet_writer(train_path, kind, with_keys=True)
                before = _Counts.of(tally)
                tally.mapped_columns_seen = set()  # the field_map check is each source's own
                own = SeenHashes() if mixture else None
                sink = _Sink({TRAIN_SPLIT: train_writer, EVAL_SPLIT: eval_writer}, own)
                content = hashlib.sha256()
                _read_source(source.files, fields, kind, options, seen, sink, digests, tally, rejects_out, content)
                train_writer.close()
                lineage.append(
                    SourceLineage(source.source.uri, f"sha256:{content.hexdigest()}", len(source.files), source.remote)
                )
                per_source.append(_Counts.of(tally).minus(before))
                staged.append(train_path)
                whose = f"dataset_sources source {number + 1} ({source.source.uri}): its field_map"
                _check_mapped_columns(source.files, fields, tally, whose if mixture else "field_map")
        eval_writer.close()
        held_out = index_of(stage.file(EVAL_SPLIT), kind.learned)
        tasks = {name: NgramIndex.of_documents(pa.array(texts, pa.string())) for name, texts in benchmarks.items()}
        checked = [overlapping(path, kind.learned, [held_out, *tasks.values()]) for path in staged]
        overlaps = [found[0] for found in checked]
        task_overlaps = tuple(
            Overlap(
                source.source.uri,
                name,
                len(found.rows),
                False,
                found.examples,
                documents_hit=len(found.documents),
                documents=index.document_count,
            )
            for source, per_index in zip(sources, checked, strict=True)
            for (name, index), found in zip(tasks.items(), per_index[1:], strict=True)
        )
        _refuse_contaminated(task_overlaps, options)
        usable = [
            _usable_rows(read.train, overlap.rows if options.decontaminate else None)
            for read, overlap in zip(per_source, overlaps, strict=True)
        ]
        available = [len(rows) for rows in usable]
        counts = _mixture_counts(sources, available, stage) if mixture else tuple(available)
        if not mixture and per_source[0].train and not available[0]:
            raise UserError(
                f"Every one of the {per_source[0].train} training rows of {sources[0].source.uri} shares a 13-word "
                "sequence with a row of the eval split, and decontaminate drops such rows: nothing would be left to "
                f"train on. Such overlaps are usually a passage every record repeats (a template or instructions in "
                "each question); the data step's report, with decontaminate false, quotes them. Remove the repeated "
                "passage from the records, or set decontaminate to false. Nothing was written to the output files."
            )
        tally.rows[TRAIN_SPLIT] = _mix(staged, usable, counts, stage.file(TRAIN_SPLIT), kind, options, digests)
        source_stats: tuple[SourceStats, ...] = ()
        if mixture:
            source_stats = tuple(
                read.stats(source.source, rows, count, tally.rows[TRAIN_SPLIT])
                for source, read, rows, count in zip(sources, per_source, available, counts, strict=True)
            )
        contamination = (
            tuple(
                Overlap(source.source.uri, EVAL_SPLIT_NAME, len(overlap.rows), options.decontaminate, overlap.examples)
                for source, overlap in zip(sources, overlaps, strict=True)
            )
            + task_overlaps
        )
        stats = dataclasses.replace(
            _stats(files, options, tally, digests, kind),
            sources=source_stats,
            lineage=tuple(lineage),
            contamination=contamination,
        )
        _check_usable(files, stats, options, tally, stage)
        stage.file(DATA_REPORT).write_text(data_report(stats), encoding="utf-8")
        stage.file(DATA_STATS).write_text(stats.text(), encoding="utf-8")  # published last, with the splits
        (output_dir / FAILED_REJECTS_FILE).unlink(missing_ok=True)
        stage.publish(TRAIN_SPLIT, EVAL_SPLIT, REJECTS, DATA_REPORT, DATA_STATS)
    return PrepareResult(output_dir, stats)


@dataclass(frozen=True)
class _Counts:
    """The running counts of ``_Tally`` at one moment: what one source added is the difference of two."""

    records: int
    rejects: Counter
    duplicates: int
    duplicates_across: int
    train: int
    eval: int

    @classmethod
    def of(cls, tally: _Tally) -> _Counts:
        return cls(
            tally.records,
            Counter(tally.rejects),
            tally.duplicates,
            tally.duplicates_across,
            tally.rows[TRAIN_SPLIT],
            tally.rows[EVAL_SPLIT],
        )

    def minus(self, earlier: _Counts) -> _Counts:
        return _Counts(
            self.records - earlier.records,
            self.rejects - earlier.rejects,
            self.duplicates - earlier.duplicates,
            self.duplicates_across - earlier.duplicates_across,
            self.train - earlier.train,
            self.eval - earlier.eval,
        )

    def stats(self, source: DataSource, available: int, used: int, mixture_rows: int) -> SourceStats:
        return SourceStats(
            uri=source.uri,
            weight=source.weight,
            records=self.records,
            rejected=sum(self.rejects.values()),
            rejected_by_reason=dict(sorted(self.rejects.items())),
            duplicates_within=self.duplicates - self.duplicates_across,
            duplicates_across=self.duplicates_across,
            train_available=available,
            train_rows=used,
            eval_rows=self.eval,
            realised_weight=round(used / mixture_rows, 6) if mixture_rows else 0.0,
        )


@dataclass
class _Sink:
    """Where a source's rows go: the split writers (the training rows staged with their content keys, for the
    fingerprint of the rows the mixing keeps)."""

    writers: dict[str, pq.ParquetWriter]
    own: SeenHashes | None = None  # a mixture's source's own records, to tell its repeats from an earlier source's


def _read_source(
    files: list[Path],
    fields: FieldMap,
    kind: RowKind,
    options: PrepareOptions,
    seen: SeenHashes,
    sink: _Sink,
    digests,
    tally: _Tally,
    rejects_out,
    content,
) -> None:
    """Every record of ``files`` parsed, checked and routed to the splits; rejects listed as they are found.
    ``content`` digests the text read: the source's lineage."""
    for chunk, parsed in _parsed_ahead(files, fields):
        content.update(chunk.data)
        tally.mapped_columns_seen |= parsed.mapped_columns_seen
        chunk_rejects = list(parsed.rejects)
        tally.records += parsed.table.num_rows + len(parsed.rejects)
        tally.blank_lines += parsed.blank_lines
        raw_lines = None  # the chunk split into lines, only once a row in it is rejected
        for table, lines in parsed.batches():
            normalised, problems = kind.normalise(table, options.system_prompt)
            if problems and raw_lines is None:
                raw_lines = split_lines(chunk.data)
            chunk_rejects += [
                Reject(
                    chunk.source,
                    int(lines[p.row]),
                    p.reason,
                    p.detail,
                    _line_excerpt(chunk, raw_lines, int(lines[p.row])),
                )
                for p in problems
            ]
            _route_rows(normalised, kind, options, seen, sink, digests, tally)
        _record_rejects(chunk_rejects, rejects_out, tally)


KEY_COLUMN = "content_key"  # a staged training row's canonical content, for the mixture's fingerprint
# Staged rows read per batch while mixing: a batch and the rows taken from it are in memory at once, and a
# conversation with its content key is a kilobyte or more (65,536 rows a batch cost 300 MB at a million records)
MIX_BATCH_ROWS = 8192


def _refuse_contaminated(overlaps: tuple[Overlap, ...], options: PrepareOptions) -> None:
    """Stop the step when a source overlaps a benchmark task's documents more than ``max_contamination`` allows."""
    above = [overlap for overlap in overlaps if (overlap.share or 0.0) > options.max_contamination]
    if not above:
        return
    found = "; ".join(
        f"{overlap.source} overlaps {overlap.documents_hit} of the {overlap.documents} documents of the benchmark "
        f"task {overlap.against} ({overlap.share:.1%}) with {overlap.rows} training rows, such as "
        f"{overlap.examples[0]!r}"
        for overlap in above
    )
    raise UserError(
        f"The training data holds benchmark answers: {found}. That is more than max_contamination "
        f"({options.max_contamination:.1%}) allows, and a model trained on them would score on the benchmark what it "
        "memorised. Remove those rows from the source (a run with max_contamination 1 lists them in its data report), "
        "take the task out of benchmark_tasks, or raise max_contamination. Nothing was written to the output files."
    )


def _usable_rows(staged_rows: int, dropped: np.ndarray | None) -> np.ndarray:
    """The row numbers of a source's staged training rows that may be trained on: all, or all but ``dropped``."""
    rows = np.arange(staged_rows)
    return rows if dropped is None or not len(dropped) else np.setdiff1d(rows, dropped, assume_unique=True)


def _mixture_counts(sources: list[SourceFiles], available: list[int], stage) -> tuple[int, ...]:
    """How many training rows each source gives the mixture; a source with none stops the step, its rejects
    published for the user to read."""
    try:
        return allocate([source.source for source in sources], available)
    except ValueError as error:
        _publish_failed_rejects(stage)
        raise UserError(
            f"dataset_sources: {error}. Every reject and its reason is listed in "
            f"{stage.target / FAILED_REJECTS_FILE}; fix the records, the source's field_map or the weights, or leave "
            "the source out. Nothing was written to the output files."
        ) from None


def _mix(
    staged: list[Path],
    usable: list[np.ndarray],
    counts: Sequence[int],
    target: Path,
    kind: RowKind,
    options: PrepareOptions,
    digests,
) -> int:
    """Write the training split from each source's staged rows, ``counts`` of its ``usable`` ones (chosen by the
    split seed; all of them, in order, for one source); return how many rows it holds."""
    writer = _parquet_writer(target, kind)
    for number, (path, rows, count) in enumerate(zip(staged, usable, counts, strict=True)):
        chosen = rows[choose_rows(len(rows), count, options.seed, number)] if count else rows[:0]
        start = 0
        for batch in staged_batches(path, MIX_BATCH_ROWS):
            end = start + batch.num_rows
            lo, hi = np.searchsorted(chosen, [start, end])
            if hi > lo:
                taken = pa.Table.from_batches([batch]).take(pa.array(chosen[lo:hi] - start))
                _update_digest(digests[TRAIN_SPLIT], taken.column(KEY_COLUMN).combine_chunks())
                writer.write_table(taken.drop_columns([KEY_COLUMN]))
            start = end
    writer.close()
    return int(sum(counts))


def _parsed_ahead(files: list[Path], fields: FieldMap) -> Iterator[tuple[Chunk, ParsedChunk]]:
    """Each chunk with its parse, the next chunk being read and parsed meanwhile.

    pyarrow parses without holding the GIL, so on a small machine this overlaps
    parsing one chunk with validating and writing the previous one.
    """
    chunks = (chunk for path in files for chunk in read_chunks(path))
    return mapped_ahead(lambda chunk: (chunk, parse_chunk(chunk, fields)), chunks, threads=1, window=1, name="parse")


def _parquet_writer(path: Path, kind: RowKind, with_keys: bool = False) -> pq.ParquetWriter:
    # Dictionary encoding only pays off for the handful of role names; trying it
    # on unique message text costs a fifth of the write time for nothing.
    roles = [f"{column}.list.element.role" for column in kind.columns]
    schema = kind.schema.append(pa.field(KEY_COLUMN, pa.string())) if with_keys else kind.schema
    return pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=roles)


def _line_excerpt(chunk: Chunk, raw_lines: list[bytes], line: int) -> str:
    """The record as written in the file, like the line-by-line parser reports it.

    The parsed row holds only the fields we know, so it would show ``{}`` for a
    record of an unknown shape and drop the keys (ids, sources) users search for.
    """
    return excerpt(raw_lines[line - chunk.first_line])


def _record_rejects(rejects: list[Reject], out, tally: _Tally) -> None:
    for reject in sorted(rejects, key=lambda r: r.line):
        out.write(reject.as_json() + "\n")
        tally.rejects[reject.reason.label] += 1
        if tally.first_reject is None:
            tally.first_reject = reject


def _route_rows(
    normalised, kind: RowKind, options: PrepareOptions, seen: SeenHashes, sink: _Sink, digests, tally: _Tally
) -> None:
    hashes = content_hashes(normalised.content_keys, options.seed)
    keep = seen.first_occurrences(hashes)
    tally.duplicates += int(len(keep) - keep.sum())
    if sink.own is not None:
        tally.duplicates_across += int((sink.own.first_occurrences(hashes) & ~keep).sum())
    by_split_key = hashes if normalised.split_keys is normalised.content_keys else None  # conversations: the same
    split_hashes = by_split_key if by_split_key is not None else content_hashes(normalised.split_keys, options.seed)
    to_eval = eval_mask(split_hashes, options.eval_fraction)
    for name, mask in ((TRAIN_SPLIT, keep & ~to_eval), (EVAL_SPLIT, keep & to_eval)):
        if not mask.any():
            continue
        selection = pa.array(mask)
        columns = [pc.filter(getattr(normalised, column), selection) for column in kind.columns]
        keys = pc.filter(normalised.content_keys, selection)
        table = pa.Table.from_arrays([pa.array(hashes[mask].view(np.int64)), *columns], schema=kind.schema)
        if name == TRAIN_SPLIT:  # its fingerprint is taken when the rows are chosen
            sink.writers[name].write_table(table.append_column(KEY_COLUMN, keys))
        else:
            sink.writers[name].write_table(table)
            _update_digest(digests[name], keys)
        tally.rows[name] += int(mask.sum())
    per_shape = np.bincount(normalised.shapes[keep], minlength=len(SHAPES))
    tally.shapes.update({shape.name: int(per_shape[code]) for code, shape in enumerate(SHAPES) if per_shape[code]})
    tally.conversation_chars.add(normalised.conversation_chars[keep])
    tally.response_chars.add(normalised.response_chars[keep])


def _update_digest(digest, keys: pa.StringArray) -> None:
    """Feed the keys' bytes, each ending in a row terminator, into ``digest``.

    The bytes do not depend on chunk boundaries, so the fingerprint is a
    property of the data alone.
    """
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=len(keys) + 1, offset=keys.offset * 4)
    digest.update(memoryview(keys.buffers()[2])[offsets[0] : offsets[-1]])


def _stats(files: list[Path], options: PrepareOptions, tally: _Tally, digests, kind: RowKind) -> DataStats:
    fingerprint = hashlib.sha256()
    fingerprint.update(json.dumps(fingerprinted(options), sort_keys=True).encode())
    for name in (TRAIN_SPLIT, EVAL_SPLIT):
        fingerprint.update(digests[name].digest())
    rejected = sum(tally.rejects.values())
    return DataStats(
        inputs=tuple(str(path) for path in files),
        options=asdict(options),
        records=tally.records,
        blank_lines=tally.blank_lines,
        rejected=rejected,
        rejected_by_reason=dict(sorted(tally.rejects.items())),
        reject_fraction=round(rejected / tally.records, 6) if tally.records else 0.0,
        duplicates=tally.duplicates,
        rows={"train": tally.rows[TRAIN_SPLIT], "eval": tally.rows[EVAL_SPLIT]},
        shapes=dict(sorted(tally.shapes.items())),
        length_chars={
            "conversation": tally.conversation_chars.summary(PERCENTILES),
            "response": tally.response_chars.summary(PERCENTILES),
        },
        fingerprint="sha256:" + fingerprint.hexdigest(),
        kind=kind.name,
    )


def _check_mapped_columns(files: list[Path], fields: FieldMap, tally: _Tally, whose: str) -> None:
    """A field_map column that no record has is a misspelt name, not a file of rejects. ``whose``: the field map
    named as the user set it (the run's field_map, or a source's)."""
    missing = [column for column in fields.mapped_columns if column not in tally.mapped_columns_seen]
    if missing:
        names = ", ".join(str(path) for path in files)
        renamed = ", ".join(f"{ours} -> {column}" for ours, column in fields.renamed if column in missing)
        raise UserError(
            f"{whose} reads {renamed}, but no record of {names} has a column named "
            f"{' or '.join(map(repr, missing))}. Check the spelling against the file's keys (they are "
            "case-sensitive). Nothing was written to the output files."
        )


def _check_usable(files, stats: DataStats, options: PrepareOptions, tally: _Tally, stage) -> None:
    """Refuse to publish outputs that would mislead the next stage."""
    names = ", ".join(str(path) for path in files)
    if stats.records == 0:
        raise UserError(
            f"The input {names} holds no records (it is empty or has only blank lines). "
            "Point the input at a JSONL file with one record per line."
        )
    first = tally.first_reject
    first_text = f" The first rejected record is {first.source} line {first.line}: {first.detail}." if first else ""
    if stats.train_rows + stats.eval_rows == 0:
        _publish_failed_rejects(stage)
        raise UserError(
            f"No valid records remain in {names}: {stats.rejected} of {stats.records} were rejected and "
            f"{stats.duplicates} were duplicates.{first_text} Every reject and its reason is listed in "
            f"{stage.target / FAILED_REJECTS_FILE}."
        )
    if stats.reject_fraction > options.max_reject_fraction:
        _publish_failed_rejects(stage)
        raise UserError(
            f"{stats.rejected} of {stats.records} records ({stats.reject_fraction:.1%}) in {names} were "
            f"rejected, more than the allowed {options.max_reject_fraction:.1%} (--max-reject-fraction / "
            f"max_reject_fraction).{first_text} Every reject and its reason is listed in "
            f"{stage.target / FAILED_REJECTS_FILE}. Fix those records, or raise the limit if losing them is "
            "acceptable. Nothing was written to the output files."
        )


def _publish_failed_rejects(stage) -> None:
    stage.publish_as(REJECTS, FAILED_REJECTS_FILE)
