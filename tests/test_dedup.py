"""The duplicate filter of the data step (``SeenHashes``): the same answers as a set of everything seen, at a cost
that grows as n log n with the data (a few sorted arrays, merged like a binary counter), not with its square."""

from __future__ import annotations

import math

import numpy as np

from components.data.dedup import SeenHashes


def test_it_marks_exactly_the_first_occurrence_of_each_hash_over_many_chunks():
    """Chunks of random sizes (empty ones too) with repeats inside a chunk and across chunks, checked against a
    Python set."""
    rng = np.random.default_rng(1)
    seen, everything = SeenHashes(), set()
    for size in rng.integers(0, 3000, 300):
        hashes = rng.integers(0, 50_000, size).astype(np.uint64)
        expected = np.zeros(len(hashes), dtype=bool)
        for position, value in enumerate(hashes.tolist()):
            if value not in everything:
                expected[position] = True
                everything.add(value)
        assert (seen.first_occurrences(hashes) == expected).all()
    assert len(seen) == len(everything)


def test_it_keeps_few_arrays_so_each_chunk_costs_little_whatever_came_before():
    """A chunk is looked up in every array and merged into the newest ones: with distinct hashes in equal chunks
    (the usual case: few duplicates), there are never more arrays than log2 of the chunks so far, plus one."""
    rng = np.random.default_rng(2)
    seen = SeenHashes()
    for chunk in range(1, 1001):
        seen.first_occurrences(rng.integers(0, 2**63, 100, dtype=np.uint64))
        runs = seen._runs
        assert len(runs) <= math.log2(chunk) + 1
        assert all(len(older) > len(newer) for older, newer in zip(runs, runs[1:]))
        assert all((run[1:] > run[:-1]).all() for run in runs[-2:])  # sorted, each hash once
    assert len(seen) == 100_000
