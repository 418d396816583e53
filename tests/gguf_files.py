"""GGUF files for tests: comparing two (ours and llama.cpp's converter's) tensor entry by tensor entry, byte for
byte, and writing small hand-made ones, broken on purpose, byte by byte.

Files are read with ``gguf_export.reader``, which tests/test_gguf_reader.py holds to gguf-py's own reader.
"""

from __future__ import annotations

import struct

from gguf_export.reader import GGUFFile


def string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack("<Q", len(encoded)) + encoded


def key_value(key: str, kind: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", kind) + payload


def tensor_entry(name: str, dims: tuple[int, ...], kind: int = 0, offset: int = 0) -> bytes:
    return string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)


def gguf_bytes(key_values: list[bytes], tensors: list[bytes], version: bytes = struct.pack("<I", 3)) -> bytes:
    """A GGUF header from encoded key/value pairs and tensor entries, then 64 bytes of data."""
    header = b"GGUF" + version + struct.pack("<QQ", len(tensors), len(key_values)) + b"".join(key_values + tensors)
    return header + bytes(-len(header) % 32) + bytes(64)


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
