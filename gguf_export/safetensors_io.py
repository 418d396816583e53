"""Read a (sharded or single-file) safetensors checkpoint without loading it.

The header of every shard is parsed by ``gguf.utility.SafetensorsLocal`` (the
same parser llama.cpp's converter uses, so tensors come out in the same order).
Tensor data is then read a few rows at a time, straight into a fresh array of
just those rows, and the file is closed after each chunk: the resident memory
of a conversion follows the chunk size, not the tensor or the model, and no
mapping or handle outlives the read. Every byte range is checked against the
file size first, so a truncated download is a clear error instead of a crash in
the middle of writing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf.utility import SafetensorsLocal

from common.errors import UserError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# safetensors dtype -> numpy dtype of the stored bits (bf16 has no numpy type: its bits are uint16).
STORED_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes live: file, offset, dtype, shape."""

    name: str
    path: Path
    offset: int
    nbytes: int
    dtype: str  # safetensors name: F32, F16, BF16, ...
    shape: tuple[int, ...]

    @property
    def row_count(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_length(self) -> int:
        return (
            int(np.prod(self.shape[1:], dtype=np.int64))
            if len(self.shape) > 1
            else (self.shape[0] if self.shape else 1)
        )

    @property
    def row_bytes(self) -> int:
        return self.row_length * STORED_DTYPES[self.dtype].itemsize

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as float32 or float16 (bf16 widened exactly to float32).

        The rows' bytes are read with ``readinto`` into an array of their own, and the file is closed on return.
        This is what ``numpy.memmap`` plus a copy did, minus the mapping: a memmap can only be released early through
        its private ``_mmap``, whereas here nothing is left open (the file can be replaced or deleted at once) and
        the process only ever holds the chunk asked for.
        """
        shape = (stop - start, *self.shape[1:]) if len(self.shape) > 1 else (self.shape or (1,))
        stored = np.empty(shape, dtype=STORED_DTYPES[self.dtype])
        with open(self.path, "rb") as file:
            file.seek(self.offset + start * self.row_bytes)
            count = file.readinto(stored)  # a buffered file fills the whole buffer unless the file ends first
        if count != stored.nbytes:
            raise UserError(
                f"{self.path} ended while reading tensor {self.name} ({count} of {stored.nbytes} bytes); "
                "it was truncated or replaced during the conversion. Copy the checkpoint again."
            )
        if self.dtype == "BF16":  # bf16 is the top half of a float32: widening is exact
            widened = np.empty(stored.shape, dtype=np.uint32)
            np.left_shift(stored, 16, out=widened, dtype=np.uint32)
            return widened.view(np.float32)
        if self.dtype == "F64":
            return stored.astype(np.float32)
        return stored

    def read(self) -> np.ndarray:
        return self.read_rows(0, self.row_count)


def shard_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files, in the order llama.cpp's converter reads them."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise UserError(
                f"{index} is not a valid safetensors index ({error}); re-save the checkpoint with save_pretrained."
            ) from None
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not (model_dir / name).is_file()]
        if missing:
            raise UserError(
                f"{index} lists shard(s) {', '.join(missing)} that are not in {model_dir}; "
                "copy the complete checkpoint (every model-*.safetensors file)."
            )
        return [model_dir / name for name in names]
    files = sorted(path for path in model_dir.glob("model*.safetensors"))
    if not files:
        bins = sorted(model_dir.glob("pytorch_model*.bin"))
        hint = " It has PyTorch .bin weights: re-save it with save_pretrained(safe_serialization=True)." if bins else ""
        raise UserError(
            f"{model_dir} holds no model.safetensors (or sharded model-*.safetensors with {INDEX_FILE}).{hint}"
        )
    return files


def open_checkpoint(model_dir: Path) -> dict[str, StoredTensor]:
    """Every tensor of the checkpoint by name, validated against the files' sizes."""
    return open_safetensors(shard_files(model_dir))


def open_safetensors(paths: list[Path]) -> dict[str, StoredTensor]:
    """Every tensor of the given safetensors files by name, validated against the files' sizes."""
    tensors: dict[str, StoredTensor] = {}
    for path in paths:
        try:
            parsed = SafetensorsLocal(path).tensors
        except (ValueError, UnicodeDecodeError, KeyError) as error:
            raise UserError(
                f"{path} is not a readable safetensors file ({error}); "
                "it is probably truncated or corrupt: copy it again."
            ) from None
        size = os.stat(path).st_size
        for name, local in parsed.items():
            data_range = local.data_range
            if local.dtype not in STORED_DTYPES:
                raise UserError(
                    f"{path}: tensor {name} has dtype {local.dtype}; "
                    "only F32, F16, BF16 and F64 checkpoints are supported."
                )
            expected = int(np.prod(local.shape, dtype=np.int64)) * STORED_DTYPES[local.dtype].itemsize
            if data_range.size != expected:
                raise UserError(
                    f"{path}: tensor {name} claims {data_range.size} bytes but its shape {list(local.shape)} "
                    f"needs {expected}; the file is corrupt."
                )
            if data_range.offset + data_range.size > size:
                raise UserError(
                    f"{path} is truncated: tensor {name} ends at byte {data_range.offset + data_range.size} "
                    f"but the file has {size} bytes. Copy or download the checkpoint again."
                )
            tensors[name] = StoredTensor(
                name, path, data_range.offset, data_range.size, local.dtype, tuple(local.shape)
            )
    return tensors


def row_chunks(row_count: int, row_bytes: int, chunk_bytes: int, multiple: int = 1) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` row ranges of about ``chunk_bytes`` each, every one a multiple of ``multiple`` rows."""
    rows = max(multiple, (chunk_bytes // max(row_bytes, 1)) // multiple * multiple)
    for start in range(0, row_count, rows):
        yield start, min(start + rows, row_count)
