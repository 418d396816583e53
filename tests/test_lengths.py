"""The length histogram gives exactly numpy's percentiles while holding only distinct lengths."""

from __future__ import annotations

import numpy as np
import pytest

from components.data.lengths import LengthHistogram


@pytest.mark.parametrize("seed", range(20))
def test_matches_numpy_percentile_over_batches(seed):
    """stats.json must report the same numbers as np.percentile over all rows, however rows arrive in batches."""
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, rng.integers(1, 5000), size=rng.integers(0, 200)) for _ in range(rng.integers(1, 8))]
    histogram = LengthHistogram()
    for batch in batches:
        histogram.add(batch)
    values = np.concatenate(batches)
    if not len(values):
        assert histogram.summary((50, 90, 99)) == {}
        return
    expected = {f"p{p}": int(np.percentile(values, p)) for p in (50, 90, 99)} | {"max": int(values.max())}
    assert histogram.summary((50, 90, 99)) == expected


def test_memory_is_bounded_by_distinct_lengths():
    """A million rows of ten distinct lengths are ten entries, not a million."""
    histogram = LengthHistogram()
    for _ in range(10):
        histogram.add(np.arange(100_000) % 10)
    assert len(histogram.values) == 10 and int(histogram.counts.sum()) == 1_000_000
