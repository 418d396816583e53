"""Reading back the Parquet the data step wrote itself (the eval split, each source's staged training rows), a batch
at a time, with memory bounded by the batch.

pyarrow's ``ParquetFile`` pre-buffers by default: reading batch by batch, it still held about 130 MB of column
chunks ahead of the reader for a million-record split (measured with ``pa.default_memory_pool().max_memory()``),
where without it a batch of 8,192 rows held 14 MB. Pre-buffering pays off on object stores; these files are on the
step's own volume.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def batches(path: Path, batch_rows: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of the Parquet file at ``path`` (only ``columns``, when given), ``batch_rows`` at a time."""
    with pq.ParquetFile(path, pre_buffer=False) as parquet:
        yield from parquet.iter_batches(batch_size=batch_rows, columns=columns)
