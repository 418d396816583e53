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
    """The set of content hashes seen so far, as a few sorted arrays (8 bytes a row).

    Sorted numpy arrays keep memory at 8 bytes per distinct record, where a Python set would need about ten times
    that. One array re-sorted with each chunk's new hashes cost the whole array per chunk, so time grew with the
    square of the data (4x the records took 13x the sorting). The arrays are instead kept as a binary counter
    keeps its bits: a new chunk's run is merged into the newest array while that one is no longer, so there are
    at most log2(chunks) arrays and each hash is merged about log2(chunks) times.
    """

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []  # sorted, disjoint, each more than as long as the next

    def __len__(self) -> int:
        return sum(len(run) for run in self._runs)

    def first_occurrences(self, hashes: np.ndarray) -> np.ndarray:
        """Mark rows whose hash appears neither earlier in ``hashes`` nor in any earlier call."""
        unique, first_index = np.unique(hashes, return_index=True)
        already_seen = np.zeros(len(unique), dtype=bool)
        for run in self._runs:  # ``unique`` is sorted: each search starts where the last one ended
            position = np.minimum(np.searchsorted(run, unique), len(run) - 1)
            already_seen |= run[position] == unique
        keep = np.zeros(len(hashes), dtype=bool)
        keep[first_index[~already_seen]] = True
        self._add(unique[~already_seen])
        return keep

    def _add(self, run: np.ndarray) -> None:
        while self._runs and len(self._runs[-1]) <= len(run):
            merged = np.concatenate([self._runs.pop(), run])
            merged.sort(kind="stable")  # timsort: finds the two sorted runs and merges them in linear time
            run = merged
        if len(run):
            self._runs.append(run)
