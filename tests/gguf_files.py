"""A fast, read-only look at a GGUF file for comparisons in tests.

``gguf.GGUFReader`` builds numpy views for every element of every metadata
array (50k tokens, 49k merges), which takes seconds per file; comparing forty
files that way would dominate the test run. This walks the same structure with
``struct`` and returns the metadata values, the tensor directory and where the
tensor data starts, so two files can be compared key by key, tensor entry by
tensor entry, and their data regions byte for byte.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
ALIGNMENT_KEY = "general.alignment"


@dataclass
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[tuple[str, tuple[int, ...], int, int]]  # name, ggml dims, type, offset in the data region
    data: memoryview  # the data region, from its aligned start to the end of the file


def read_gguf(path: Path) -> GGUFFile:
    with open(path, "rb") as handle:
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    position = 0

    def take(fmt: str) -> Any:
        nonlocal position
        value = struct.unpack_from(fmt, buffer, position)[0]
        position += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal position
        length = take("<Q")
        value = bytes(buffer[position : position + length]).decode("utf-8")
        position += length
        return value

    def value(kind: int) -> Any:
        if kind == STRING:
            return string()
        if kind == ARRAY:
            item_kind, count = take("<I"), take("<Q")
            return [value(item_kind) for _ in range(count)]
        return take(SCALARS[kind])

    assert buffer[:4] == b"GGUF", path
    position = 4
    take("<I")  # version
    tensor_count, kv_count = take("<Q"), take("<Q")
    metadata = {}
    for _ in range(kv_count):
        key = string()
        metadata[key] = value(take("<I"))
    tensors = []
    for _ in range(tensor_count):
        name = string()
        dims = tuple(take("<Q") for _ in range(take("<I")))
        tensors.append((name, dims, take("<I"), take("<Q")))
    alignment = metadata.get(ALIGNMENT_KEY, 32)
    start = (position + alignment - 1) // alignment * alignment
    return GGUFFile(metadata, tensors, memoryview(buffer)[start:])


def first_difference(ours: GGUFFile, theirs: GGUFFile) -> str | None:
    """None when both files hold the same tensors (names, dims, types, offsets, bytes), else the first difference."""
    if ours.tensors != theirs.tensors:
        for mine, reference in zip(ours.tensors, theirs.tensors):
            if mine != reference:
                return f"tensor entry {mine} != {reference}"
        return f"{len(ours.tensors)} tensors != {len(theirs.tensors)}"
    if ours.data == theirs.data:
        return None
    offsets = [offset for *_, offset in ours.tensors] + [len(ours.data)]
    for (name, *_), start, stop in zip(ours.tensors, offsets, offsets[1:]):
        if ours.data[start:stop] != theirs.data[start:stop]:
            return f"tensor {name} differs"
    return "data regions differ in length"
