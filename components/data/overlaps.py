"""Which of a source's training rows share a 13-word sequence with the eval split, read from the Parquet the data
step stages (``components.data.contamination`` holds the n-gram matching itself).

A row's text is what training teaches the model to produce and what it is conditioned on: a conversation's
messages, a preference pair's prompt and chosen answer (its rejected answer is what the model is taught away from,
and in preference data often another prompt's good answer). The eval split's rows are indexed the same way.
Reading is batch by batch: memory holds the index (8 bytes an eval n-gram) and one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.data.contamination import NgramIndex

BATCH_ROWS = 8192
EXAMPLES = 3  # overlapping rows quoted per source, in the report
EXAMPLE_CHARS = 200


@dataclass(frozen=True)
class SourceOverlap:
    """A source's training rows that overlap the index: their positions in its staged rows, and a few of them."""

    rows: np.ndarray  # ascending row numbers
    examples: tuple[str, ...]


def row_texts(batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.Array:
    """Each row's messages' contents (of every message column: a pair's prompt, chosen and rejected), joined by
    newlines."""
    joined = []
    for column in columns:
        messages = batch.column(column)
        contents = pc.struct_field(messages.flatten(), "content")
        as_lists = pa.ListArray.from_arrays(pc.subtract(messages.offsets, messages.offsets[0]), contents)
        joined.append(pc.binary_join(as_lists, "\n"))
    return joined[0] if len(joined) == 1 else pc.binary_join_element_wise(*joined, "\n")


def index_of(path: Path, columns: tuple[str, ...]) -> NgramIndex:
    """The n-grams of every row of the Parquet file at ``path``."""
    batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=list(columns))
    return NgramIndex.of(row_texts(batch, columns) for batch in batches)


def overlapping(path: Path, columns: tuple[str, ...], index: NgramIndex) -> SourceOverlap:
    """The rows of the Parquet file at ``path`` that share an n-gram with ``index``."""
    found: list[np.ndarray] = []
    examples: list[str] = []
    start = 0
    if len(index):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=list(columns)):
            texts = row_texts(batch, columns)
            hits = np.flatnonzero(index.overlaps(texts))
            found.append(hits + start)
            examples += [_excerpt(texts[int(row)].as_py()) for row in hits[: EXAMPLES - len(examples)]]
            start += batch.num_rows
    return SourceOverlap(np.concatenate(found) if found else np.zeros(0, np.int64), tuple(examples))


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXAMPLE_CHARS else flat[: EXAMPLE_CHARS - 1] + "…"
