"""Exact length percentiles in memory that does not grow with the number of rows.

Keeping every row's length for ``np.percentile`` costs bytes per row, which is
what made the data stage's memory grow with its input. A sparse histogram
(distinct lengths and their counts) gives the same numbers: its size is bounded
by the number of distinct lengths, a few thousand in practice.
"""

from __future__ import annotations

import numpy as np


class LengthHistogram:
    """Counts of each distinct length, merged batch by batch."""

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, lengths: np.ndarray) -> None:
        if not len(lengths):
            return
        values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
        merged, inverse = np.unique(np.concatenate([self.values, values]), return_inverse=True)
        self.counts = np.bincount(inverse, weights=np.concatenate([self.counts, counts]), minlength=len(merged)).astype(
            np.int64
        )
        self.values = merged

    def _nth(self, cumulative: np.ndarray, index: int) -> int:
        """The ``index``-th smallest length (0-based), as if all lengths were sorted."""
        return int(self.values[np.searchsorted(cumulative, index, side="right")])

    def summary(self, percentiles: tuple[int, ...]) -> dict[str, int]:
        """``p50``-style percentiles (numpy's default linear interpolation, truncated) and the maximum."""
        total = int(self.counts.sum())
        if not total:
            return {}
        cumulative = np.cumsum(self.counts)
        result = {}
        for percentile in percentiles:
            # numpy's "linear" method, step by step, so the numbers match np.percentile exactly.
            quantile = np.float64(percentile) / 100
            position = (total - 1) * quantile
            below = int(np.floor(position))
            low, high = self._nth(cumulative, below), self._nth(cumulative, min(below + 1, total - 1))
            gamma, diff = position - below, np.float64(high - low)
            value = high - diff * (1 - gamma) if gamma >= 0.5 else low + diff * gamma
            result[f"p{percentile}"] = int(value)
        result["max"] = int(self.values[-1])
        return result
