"""A GGUF file's metadata and tensor directory, read without its weights.

gguf-py's ``GGUFReader`` builds a numpy view for every element of every metadata array before it returns: 2.57 s
of CPU for SmolLM2's 49,152 tokens and merges, 6.88 s at Llama 3's 128,256 (docs/benchmarks.md). The verification
reads each exported file before llama.cpp loads it, and the chat command before its first answer. This walks the
same layout (GGUF versions 2 and 3, little-endian as llama.cpp reads them: magic, version, counts, key/value
pairs, tensor entries, then the aligned data region) with ``struct`` over a memory map, and decodes strings as it
meets them; the weights are never read. It refuses what ``GGUFReader`` and llama.cpp refuse (a repeated key or
tensor name, an alignment that is not a power of two, an unknown tensor type) with a ``ValueError`` saying which
invariant fails, and bounds every count by the bytes left, so a corrupt count fails at once instead of walking
the weights. The data region is returned too: the exporter's tests compare files byte for byte through it.
tests/test_gguf_reader.py holds the reader to ``GGUFReader``'s results.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gguf.constants import GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # llama.cpp reads these; version 1 had 32-bit counts
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
SMALLEST_VALUE = {STRING: 8, ARRAY: 12}  # a string's length; an array's item type and count
ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
TENSOR_TYPES = frozenset(int(kind) for kind in GGMLQuantizationType)


class TensorEntry(NamedTuple):
    """One entry of the tensor directory: ``dims`` in ggml's order (the fastest-varying first)."""

    name: str
    dims: tuple[int, ...]
    type: int  # a GGMLQuantizationType
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

    def __init__(self, buffer: mmap.mmap, position: int):
        self.buffer, self.position = buffer, position

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
            item_size = struct.calcsize(SCALARS[item_kind]) if item_kind in SCALARS else SMALLEST_VALUE.get(item_kind)
            if item_size is None:
                raise ValueError(f"an array at byte {self.position} has items of the unknown type {item_kind}")
            self.need(count * item_size)  # at least that many bytes follow, or the count is corrupt
            if item_kind in SCALARS:  # one unpack for the whole array (token types, scores)
                values = list(struct.unpack_from(f"<{count}{SCALARS[item_kind][1]}", self.buffer, self.position))
                self.position += count * item_size
                return values
            return [self.value(item_kind) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f"a metadata value at byte {self.position} has the unknown type {kind}")
        return self.take(SCALARS[kind])


def read_gguf(path: Path) -> GGUFFile:
    """The metadata, tensor directory and data region of the GGUF file at ``path``.

    Raises ``ValueError`` saying which invariant fails for anything that is not a complete, little-endian GGUF
    header of version 2 or 3 (callers name the file), and ``OSError`` when it cannot be opened.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < len(MAGIC) + 4:
            raise ValueError(f"{size} bytes is too short for a GGUF header")
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    if buffer[: len(MAGIC)] != MAGIC:
        raise ValueError(f"it starts with {bytes(buffer[: len(MAGIC)])!r}, not {MAGIC!r}")
    cursor = _Cursor(buffer, len(MAGIC))
    version = cursor.take("<I")
    if version not in VERSIONS:
        if struct.unpack(">I", struct.pack("<I", version))[0] in VERSIONS:
            raise ValueError("it is a big-endian GGUF; llama.cpp reads little-endian files")
        raise ValueError(f"it is GGUF version {version}; llama.cpp reads versions {VERSIONS[0]} and {VERSIONS[1]}")
    tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        if key in metadata:
            raise ValueError(f"the key {key} appears twice")
        metadata[key] = cursor.value(cursor.take("<I"))
    tensors, names = [], set()
    for _ in range(tensor_count):
        name = cursor.string()
        if name in names:
            raise ValueError(f"the tensor {name} appears twice")
        names.add(name)
        dimensions = cursor.take("<I")
        if dimensions > MAX_DIMS:
            raise ValueError(f"the tensor {name} has {dimensions} dimensions; ggml has at most {MAX_DIMS}")
        dims = tuple(cursor.take("<Q") for _ in range(dimensions))
        kind = cursor.take("<I")
        if kind not in TENSOR_TYPES:
            raise ValueError(f"the tensor {name} has the unknown ggml type {kind}")
        tensors.append(TensorEntry(name, dims, kind, cursor.take("<Q")))
    alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{ALIGNMENT_KEY} is {alignment!r}, not a power of two")
    start = (cursor.position + alignment - 1) // alignment * alignment
    return GGUFFile(metadata, tensors, memoryview(buffer)[start:])
