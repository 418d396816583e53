"""gguf_export.reader reads what gguf-py's GGUFReader reads, and refuses what is not a whole GGUF header.

The files are the exporter's own (SmolLM2's vocabulary of 49,152 tokens and 48,900 merges, and a tiny Qwen3 in f16)
and damaged copies of them; gguf-py is the reference reader llama.cpp's project ships.
"""

from __future__ import annotations

import re
import struct

import pytest
from gguf import GGUFReader

from gguf_export.reader import read_gguf


@pytest.mark.parametrize("model, outtype", [("smollm2", "q8_0"), ("qwen3", "f16")])
def test_metadata_tensors_and_data_are_what_gguf_py_reads(our_ggufs, model, outtype):
    path = our_ggufs[model, outtype]
    ours, reference = read_gguf(path), GGUFReader(path)

    expected = {name: field.contents() for name, field in reference.fields.items() if not name.startswith("GGUF.")}
    assert ours.metadata == expected
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152
    data_start = len(path.read_bytes()) - len(ours.data)
    assert data_start == reference.data_offset
    assert [(t.name, t.dims, t.type, data_start + t.offset) for t in ours.tensors] == [
        (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), int(t.data_offset)) for t in reference.tensors
    ]
    for entry, tensor in zip(ours.tensors, reference.tensors):
        assert bytes(ours.data[entry.offset : entry.offset + tensor.n_bytes]) == tensor.data.tobytes(), entry.name
        assert entry.shape == tuple(reversed(entry.dims))


def damaged(our_ggufs, change) -> bytes:
    return change(bytearray(our_ggufs["qwen3", "f16"].read_bytes()))


def with_version(data: bytearray, version: int) -> bytes:
    data[4:8] = struct.pack("<I", version)
    return bytes(data)


def with_first_value_type(data: bytearray, kind: int) -> bytes:
    """The type of the first key/value pair set to ``kind`` (it follows magic, version, two counts and the key)."""
    key_length = struct.unpack_from("<Q", data, 24)[0]
    struct.pack_into("<I", data, 32 + key_length, kind)
    return bytes(data)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda data: b"", "0 bytes is too short for a GGUF header"),
        (lambda data: b"not a model\n", "it starts with b'not ', not b'GGUF'"),
        (lambda data: with_version(data, 1), "it is GGUF version 1; llama.cpp reads versions 2 and 3"),
        (lambda data: with_first_value_type(data, 13), "has the unknown type 13"),
        (lambda data: bytes(data[:4096]), "the file ends at byte 4096, inside its header"),
    ],
    ids=["empty", "text", "version-1", "unknown-type", "truncated"],
)
def test_what_is_not_a_whole_gguf_header_is_refused_saying_why(our_ggufs, tmp_path, change, message):
    path = tmp_path / "file.gguf"
    path.write_bytes(damaged(our_ggufs, change))
    with pytest.raises(ValueError, match=re.escape(message)):
        read_gguf(path)
