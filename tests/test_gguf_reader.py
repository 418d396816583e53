"""gguf_export.reader reads what gguf-py's GGUFReader reads, and refuses what is not a whole GGUF header.

The files are the exporter's own (SmolLM2's vocabulary of 49,152 tokens and 48,900 merges, and a tiny Qwen3 in
f16), one gguf-py's writer makes with a value of every type and its own alignment, and hand-made broken ones;
gguf-py is the reference reader llama.cpp's project ships.
"""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from gguf_export.reader import read_gguf
from tests.gguf_files import gguf_bytes, key_value, string, tensor_entry


def assert_reads_as_gguf_py_does(path) -> None:
    ours, reference = read_gguf(path), GGUFReader(path)
    expected = {name: field.contents() for name, field in reference.fields.items() if not name.startswith("GGUF.")}
    assert ours.metadata == expected
    data_start = path.stat().st_size - len(ours.data)
    assert data_start == reference.data_offset
    assert [(t.name, t.dims, t.type, data_start + t.offset) for t in ours.tensors] == [
        (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), int(t.data_offset)) for t in reference.tensors
    ]
    for entry, tensor in zip(ours.tensors, reference.tensors):
        assert bytes(ours.data[entry.offset : entry.offset + tensor.n_bytes]) == tensor.data.tobytes(), entry.name


@pytest.mark.parametrize("model, outtype", [("smollm2", "q8_0"), ("qwen3", "f16")])
def test_the_exporters_files_read_as_gguf_py_reads_them(gguf_models, our_ggufs, model, outtype):
    path = our_ggufs[model, outtype]
    assert_reads_as_gguf_py_does(path)
    written = read_gguf(path)
    assert len(written.metadata["tokenizer.ggml.tokens"]) == 49152
    hidden = json.loads((gguf_models[model] / "config.json").read_text())["hidden_size"]
    assert {t.name: t.shape for t in written.tensors}["token_embd.weight"] == (49152, hidden)  # as in the checkpoint


def test_a_value_of_every_type_and_a_custom_alignment_read_as_gguf_py_reads_them(tmp_path):
    path = tmp_path / "every-type.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(64)
    for name, add, value in [
        ("u8", writer.add_uint8, 200),
        ("i8", writer.add_int8, -100),
        ("u16", writer.add_uint16, 60000),
        ("i16", writer.add_int16, -30000),
        ("u32", writer.add_uint32, 4_000_000_000),
        ("i32", writer.add_int32, -2_000_000_000),
        ("f32", writer.add_float32, 0.1),
        ("bool", writer.add_bool, True),
        ("text", writer.add_string, "héllo ✓"),
        ("u64", writer.add_uint64, 2**60),
        ("i64", writer.add_int64, -(2**60)),
        ("f64", writer.add_float64, 0.1),
        ("floats", writer.add_array, [0.5, -1.25, 3.0]),
        ("ints", writer.add_array, [1, -2, 3]),
        ("flags", writer.add_array, [True, False]),
        ("words", writer.add_array, ["a", "", "ünï"]),
    ]:
        add(f"test.{name}", value)
    writer.add_tensor("a.weight", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    writer.add_tensor("b.weight", np.ones((5, 7), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    assert_reads_as_gguf_py_does(path)
    written = read_gguf(path)
    assert written.metadata["general.alignment"] == 64 and written.metadata["test.words"] == ["a", "", "ünï"]
    assert [t.shape for t in written.tensors] == [(2, 3, 4), (5, 7)]


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


# The value types the broken headers below use, by gguf-py's (the specification's) numbers.
UINT32, STRING, ARRAY = GGUFValueType.UINT32, GGUFValueType.STRING, GGUFValueType.ARRAY
NAME = key_value("general.name", STRING, string("x"))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "0 bytes is too short for a GGUF header"),
        (b"not a model\n", "it starts with b'not ', not b'GGUF'"),
        (gguf_bytes([], [], version=u32(1)), "it is GGUF version 1; llama.cpp reads versions 2 and 3"),
        (gguf_bytes([], [], version=struct.pack(">I", 3)), "it is a big-endian GGUF; llama.cpp reads little-endian"),
        (gguf_bytes([key_value("general.name", 13, u32(0))], []), "has the unknown type 13"),
        (gguf_bytes([key_value("words", ARRAY, u32(13) + struct.pack("<Q", 1))], []), "items of the unknown type 13"),
        (gguf_bytes([key_value("words", ARRAY, u32(STRING) + struct.pack("<Q", 2**62))], []), "the file ends at byte"),
        (gguf_bytes([key_value("ids", ARRAY, u32(UINT32) + struct.pack("<Q", 2**62))], []), "the file ends at byte"),
        (gguf_bytes([NAME, NAME], []), "the key general.name appears twice"),
        (gguf_bytes([], [tensor_entry("a", (4,)), tensor_entry("a", (4,))]), "the tensor a appears twice"),
        (gguf_bytes([], [tensor_entry("a", (1, 1, 1, 1, 4))]), "the tensor a has 5 dimensions; ggml has at most 4"),
        (gguf_bytes([], [tensor_entry("a", (4,), kind=99)]), "the tensor a has the unknown ggml type 99"),
        (gguf_bytes([key_value("general.alignment", UINT32, u32(0))], []), "general.alignment is 0, not a power of"),
        (gguf_bytes([key_value("general.alignment", UINT32, u32(48))], []), "general.alignment is 48, not a power"),
        (gguf_bytes([key_value("general.alignment", STRING, string("32"))], []), "general.alignment is '32', not"),
    ],
    ids=[
        "empty",
        "text",
        "version-1",
        "big-endian",
        "unknown-type",
        "unknown-item-type",
        "string-count-past-the-end",
        "number-count-past-the-end",
        "repeated-key",
        "repeated-tensor",
        "five-dimensions",
        "unknown-tensor-type",
        "alignment-0",
        "alignment-48",
        "alignment-text",
    ],
)
def test_what_is_not_a_whole_gguf_header_is_refused_saying_why(tmp_path, content, message):
    path = tmp_path / "file.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_gguf(path)


def test_a_file_cut_inside_its_header_is_refused(our_ggufs, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(our_ggufs["qwen3", "f16"].read_bytes()[:4096])
    with pytest.raises(ValueError, match="the file ends at byte 4096, inside its header"):
        read_gguf(path)
