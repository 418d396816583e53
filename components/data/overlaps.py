"""Which of a source's training rows share a 13-word sequence with the eval split, read from the Parquet the data
step stages (``components.data.contamination`` holds the n-gram matching itself).

A row's text is what training teaches the model to produce and what it is conditioned on: a conversation's
messages, a preference pair's prompt and chosen answer (its rejected answer is what the model is taught away from,
and in preference data often another prompt's good answer). The eval split's rows are indexed the same way.
Reading is batch by batch: memory holds the index (8 bytes an eval n-gram) and one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.ahead import mapped_ahead
from components.data.contamination import NgramIndex, ngram_hashes, text_ngrams
from components.data.staged import batches

BATCH_ROWS = 8192
# Threads hashing batches ahead of the lookups: the prepare step's default CPUs. At a million records on two cores,
# the check took 12.6 s in one thread, 8.8 s with one hashing ahead and 7.9 s with two (three: 8.8 s).
HASH_THREADS = 2
HASH_AHEAD = 3  # batches hashed and not yet looked up, at most
Hashed = TypeVar("Hashed")
EXAMPLES = 3  # overlapping rows quoted per source, in the report
EXAMPLE_CHARS = 200


@dataclass(frozen=True)
class SourceOverlap:
    """A source's training rows that overlap an index: their positions in its staged rows, a few of them, and the
    index's documents they overlap."""

    rows: np.ndarray  # ascending row numbers
    examples: tuple[str, ...]
    documents: np.ndarray  # distinct, sorted; empty for an index of the eval split (made without documents)


def row_texts(batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.Array:
    """Each row's messages' contents (of every message column: a pair's prompt and chosen answer), joined by
    newlines; system messages left out, since a system prompt is the same in every row of a data set."""
    joined = []
    for column in columns:
        messages = batch.column(column)
        flat = messages.flatten()
        kept = pc.not_equal(pc.struct_field(flat, "role"), "system").to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(messages).to_numpy(zero_copy_only=False)
        counts = np.bincount(parents[kept], minlength=len(messages))
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int32())
        contents = pc.filter(pc.struct_field(flat, "content"), pa.array(kept))
        joined.append(pc.binary_join(pa.ListArray.from_arrays(offsets, contents), "\n"))
    return joined[0] if len(joined) == 1 else pc.binary_join_element_wise(*joined, "\n")


def index_of(path: Path, columns: tuple[str, ...]) -> NgramIndex:
    """The n-grams of the rows of the Parquet file at ``path`` (boilerplate left out: ``NgramIndex.of``)."""
    return NgramIndex.of_parts(_texts(path, columns, text_ngrams))


def overlapping(path: Path, columns: tuple[str, ...], indexes: list[NgramIndex]) -> list[SourceOverlap]:
    """The rows of the Parquet file at ``path`` that share an n-gram with each of ``indexes``: one pass, each
    batch's n-grams hashed once."""
    found: list[list[np.ndarray]] = [[] for _ in indexes]
    documents: list[list[np.ndarray]] = [[] for _ in indexes]
    examples: list[list[str]] = [[] for _ in indexes]
    start = 0
    if any(len(index) for index in indexes):
        for texts, (hashes, rows) in _texts(path, columns, lambda texts: (texts, ngram_hashes(texts))):
            for number, index in enumerate(indexes):
                counts, hit = index.matches(hashes, rows, len(texts))
                overlapping_rows = np.flatnonzero(counts)
                found[number].append(overlapping_rows + start)
                documents[number].append(hit)
                wanted = EXAMPLES - len(examples[number])
                examples[number] += [_excerpt(texts[int(row)].as_py()) for row in overlapping_rows[:wanted]]
            start += len(texts)
    return [
        SourceOverlap(_joined(rows), tuple(quoted), np.unique(_joined(hit)))
        for rows, quoted, hit in zip(found, examples, documents, strict=True)
    ]


def _texts(path: Path, columns: tuple[str, ...], hashing: Callable[[pa.Array], Hashed]) -> Iterator[Hashed]:
    """``hashing`` of each batch's row texts, in order, computed in ``HASH_THREADS`` threads a few batches ahead of
    the caller: the part of the check that releases the GIL."""
    return mapped_ahead(
        lambda batch: hashing(row_texts(batch, columns)),
        batches(path, BATCH_ROWS, list(columns)),
        HASH_THREADS,
        HASH_AHEAD,
        "ngrams",
    )


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXAMPLE_CHARS else flat[: EXAMPLE_CHARS - 1] + "…"
