"""Comparing two GGUF files (ours and llama.cpp's converter's) tensor entry by tensor entry, byte for byte.

Both are read with ``gguf_export.reader``, which tests/test_gguf_reader.py holds to gguf-py's own reader.
"""

from __future__ import annotations

from gguf_export.reader import GGUFFile


def first_difference(ours: GGUFFile, theirs: GGUFFile) -> str | None:
    """None when both files hold the same tensors (names, dims, types, offsets, bytes), else the first difference."""
    if ours.tensors != theirs.tensors:
        for mine, reference in zip(ours.tensors, theirs.tensors):
            if mine != reference:
                return f"tensor entry {mine} != {reference}"
        return f"{len(ours.tensors)} tensors != {len(theirs.tensors)}"
    if ours.data == theirs.data:
        return None
    offsets = [entry.offset for entry in ours.tensors] + [len(ours.data)]
    for entry, start, stop in zip(ours.tensors, offsets, offsets[1:]):
        if ours.data[start:stop] != theirs.data[start:stop]:
            return f"tensor {entry.name} differs"
    return "data regions differ in length"
