"""A GGUF file's metadata and tensor directory, read without its weights.

gguf-py's ``GGUFReader`` builds a numpy view for every element of every metadata array before it returns: about
2 s of CPU for SmolLM2's 49,152 tokens and 48,900 merges, and it grows with the vocabulary. The verification
reads each exported file that way before llama.cpp loads it, and the chat command before its first answer. This
walks the same layout (GGUF versions 2 and 3: magic, version, counts, key/value pairs, tensor entries, then the
aligned data region) with ``struct`` over a memory map, and decodes strings as it meets them; the weights are
never read. tests/test_gguf_reader.py holds it to ``GGUFReader``'s results on the files the exporter writes.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # llama.cpp reads these; version 1 had 32-bit counts
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32


class TensorEntry(NamedTuple):
    """One entry of the tensor directory: ``dims`` in ggml's order (the fastest-varying first)."""

    name: str
    dims: tuple[int, ...]
    type: int
    offset: int  # from the start of the data region

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions in PyTorch's order, as the checkpoint holds them."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[TensorEntry]
    data: memoryview  # the data region, from its aligned start to the end of the file


class _Cursor:
    """Reads values one after another from ``buffer``; running past its end is an error."""

    def __init__(self, buffer: mmap.mmap):
        self.buffer, self.position = buffer, 0

    def need(self, size: int) -> None:
        if self.position + size > len(self.buffer):
            raise ValueError(f"the file ends at byte {len(self.buffer)}, inside its header (at {self.position})")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        self.position += size
        return value

    def string(self) -> str:
        length = self.take("<Q")
        self.need(length)
        text = self.buffer[self.position : self.position + length].decode("utf-8")
        self.position += length
        return text

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind, count = self.take("<I"), self.take("<Q")
            if item_kind == STRING:
                return [self.string() for _ in range(count)]
            if item_kind in SCALARS:  # one unpack for the whole array (token types, scores)
                fmt = f"<{count}{SCALARS[item_kind][1]}"
                self.need(struct.calcsize(fmt))
                values = list(struct.unpack_from(fmt, self.buffer, self.position))
                self.position += struct.calcsize(fmt)
                return values
            return [self.value(item_kind) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f"a metadata value at byte {self.position} has the unknown type {kind}")
        return self.take(SCALARS[kind])


def read_gguf(path: Path) -> GGUFFile:
    """The metadata, tensor directory and data region of the GGUF file at ``path``.

    Raises ``ValueError`` saying which invariant fails for anything that is not a complete GGUF header of version
    2 or 3 (callers name the file), and ``OSError`` when it cannot be opened.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < len(MAGIC) + 4:
            raise ValueError(f"{size} bytes is too short for a GGUF header")
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    if buffer[: len(MAGIC)] != MAGIC:
        raise ValueError(f"it starts with {bytes(buffer[: len(MAGIC)])!r}, not {MAGIC!r}")
    cursor = _Cursor(buffer)
    cursor.position = len(MAGIC)
    version = cursor.take("<I")
    if version not in VERSIONS:
        raise ValueError(f"it is GGUF version {version}; llama.cpp reads versions {VERSIONS[0]} and {VERSIONS[1]}")
    tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("<I"))
    tensors = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
        tensors.append(TensorEntry(name, dims, cursor.take("<I"), cursor.take("<Q")))
    alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    start = (cursor.position + alignment - 1) // alignment * alignment
    return GGUFFile(metadata, tensors, memoryview(buffer)[start:])
