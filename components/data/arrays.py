"""Column operations the shapes and the checks share, vectorised over a whole chunk."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def as_bool(array: pa.Array) -> np.ndarray:
    """A boolean column as numpy, null counting as False."""
    return np.asarray(pc.fill_null(array, False), dtype=bool)


def non_blank(array: pa.Array) -> np.ndarray:
    """Which strings hold more than whitespace (null: False)."""
    return as_bool(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(array)), 0))


def joined_lists(first: pa.ListArray, second: pa.ListArray) -> pa.ListArray:
    """Row by row, the items of ``first`` followed by those of ``second`` (a null list counts as empty)."""
    first, second = (pc.fill_null(part, pa.scalar([], part.type)) for part in (first, second))
    first_offsets, second_offsets = (np.asarray(part.offsets, dtype=np.int64) for part in (first, second))
    first_lengths, second_lengths = np.diff(first_offsets), np.diff(second_offsets)
    first_values, second_values = first.flatten(), second.flatten()
    offsets = np.concatenate([[0], np.cumsum(first_lengths + second_lengths)])
    row = np.repeat(np.arange(len(first)), first_lengths + second_lengths)
    position = np.arange(offsets[-1]) - offsets[row]
    in_first = position < first_lengths[row]
    index = np.where(
        in_first,
        first_offsets[row] - first_offsets[0] + position,
        len(first_values) + second_offsets[row] - second_offsets[0] + position - first_lengths[row],
    )
    values = pc.take(pa.concat_arrays([first_values, second_values]), pa.array(index))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def sliced_lists(lists: pa.ListArray, starts: np.ndarray, stops: np.ndarray) -> pa.ListArray:
    """Row by row, the items of ``lists`` from ``starts`` up to ``stops`` (positions within each row's list)."""
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    lengths = np.maximum(stops - starts, 0)
    new_offsets = np.concatenate([[0], np.cumsum(lengths)])
    row = np.repeat(np.arange(len(lists)), lengths)
    index = offsets[row] - offsets[0] + starts[row] + np.arange(new_offsets[-1]) - new_offsets[row]
    values = pc.take(lists.flatten(), pa.array(index, pa.int64()))
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values)
