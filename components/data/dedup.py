"""Content hashes, exact-duplicate detection and the hash-based train/eval split."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash


def content_hashes(keys: pa.StringArray, seed: int) -> np.ndarray:
    """Stable 64-bit xxh3 hash of each content key.

    xxh3's output is fixed by its specification, so a row hashes the same on
    every machine and release; that is what keeps the split stable when rows are
    appended to a dataset.
    """
    if not len(keys):
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=len(keys) + 1, offset=keys.offset * 4)
    data = memoryview(keys.buffers()[2])
    hash_bytes = xxhash.xxh3_64_intdigest
    starts, ends = offsets[:-1].tolist(), offsets[1:].tolist()
    return np.fromiter((hash_bytes(data[a:b], seed) for a, b in zip(starts, ends)), dtype=np.uint64, count=len(keys))


def eval_mask(hashes: np.ndarray, eval_fraction: float) -> np.ndarray:
    """True for rows that belong to the eval split.

    The top 53 bits of the hash map to a uniform number in [0, 1); a row is in
    eval when that number is below ``eval_fraction``. The decision depends only on
    the row's own content and the seed, never on its neighbours.
    """
    uniform = (hashes >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return uniform < eval_fraction


class SeenHashes:
    """The set of content hashes seen so far, as one sorted array (8 bytes a row).

    A sorted numpy array keeps memory at 8 bytes per distinct record, where a
    Python set would need about ten times that; merging a new sorted batch is a
    linear-time merge of two sorted runs.
    """

    def __init__(self) -> None:
        self._sorted = np.zeros(0, dtype=np.uint64)

    def __len__(self) -> int:
        return len(self._sorted)

    def first_occurrences(self, hashes: np.ndarray) -> np.ndarray:
        """Mark rows whose hash appears neither earlier in ``hashes`` nor in any earlier call."""
        unique, first_index = np.unique(hashes, return_index=True)
        if len(self._sorted):
            position = np.minimum(np.searchsorted(self._sorted, unique), len(self._sorted) - 1)
            already_seen = self._sorted[position] == unique
        else:
            already_seen = np.zeros(len(unique), dtype=bool)
        keep = np.zeros(len(hashes), dtype=bool)
        keep[first_index[~already_seen]] = True
        merged = np.concatenate([self._sorted, unique[~already_seen]])
        merged.sort()  # in place: peak memory is the old and the merged array, not three copies
        self._sorted = merged
        return keep
