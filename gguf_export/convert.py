"""Convert a merged Hugging Face checkpoint into one GGUF file, without torch.

    convert(model_dir, outfile, options) -> ConversionResult

One readable path: read config.json, pick the architecture, plan every tensor
(GGUF name from ``gguf``'s tensor-name map, shape, output type), write the
metadata and the tensor directory with ``gguf.GGUFWriter``, then stream each
tensor's data through in row chunks: mmap a few rows, permute q/k heads where
llama.cpp wants it, quantise with ``gguf.quants`` and append. Peak memory
follows the chunk size; the file appears under its final name only when it is
complete.

Output types and fallbacks are exactly llama.cpp's converter's (1-D tensors and
norms stay F32, rows that are not a multiple of the block size fall back to
F16), so f32/f16/bf16/q8_0 files carry bit-identical tensors. The 4/5-bit legacy
types (which llama.cpp's converter does not write) keep the output projection
at Q8_0, the closest type ``gguf.quants`` can write to the Q6_K that
llama-quantize keeps it at.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gguf
import numpy as np
from gguf.quants import quant_shape_to_byte_shape

from common.errors import UserError
from gguf_export.architectures import Architecture, architecture_of, permute_rows
from gguf_export.hparams import add_hparams, check_rope, llama3_rope_factors
from gguf_export.metadata import MetadataOptions, model_metadata
from gguf_export.options import DIRECT_TYPES
from gguf_export.safetensors_io import StoredTensor, open_checkpoint, row_chunks
from gguf_export.vocab import load_vocabulary

T = gguf.GGMLQuantizationType
CHUNK_BYTES = 8 << 20  # source bytes per chunk: the unit of memory and of parallel work
SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
LOW_BIT_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)


@dataclass
class PlannedTensor:
    """One tensor of the output file: where it comes from and how it is stored."""

    name: str
    shape: tuple[int, ...]
    qtype: T
    source: StoredTensor | None = None
    values: np.ndarray | None = None  # generated tensors (rope_freqs)
    permute_heads: int = 0  # >0: q/k rows permuted for llama.cpp's RoPE, this many heads

    @property
    def nbytes(self) -> int:
        return int(np.prod(quant_shape_to_byte_shape(self.shape, self.qtype), dtype=np.int64))

    def chunks(self) -> list[tuple[int, int]]:
        if self.source is None or len(self.shape) < 2:
            return [(0, self.shape[0] if self.shape else 1)]
        head_rows = self.shape[0] // self.permute_heads if self.permute_heads else 1
        return list(row_chunks(self.shape[0], self.source.row_bytes, CHUNK_BYTES, multiple=head_rows))

    def convert(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` in the output type (the whole tensor for 1-D and generated ones)."""
        if self.values is not None:
            data = self.values
        elif len(self.shape) < 2:
            data = self.source.read()
        else:
            data = self.source.read_rows(start, stop)
            if self.permute_heads:
                data = permute_rows(data, self.permute_heads * (stop - start) // self.shape[0])
        return gguf.quants.quantize(data, self.qtype)


@dataclass
class ConversionResult:
    """What was written, for logs, the verifier and the pipeline's metadata."""

    path: Path
    outtype: str
    architecture: str
    hf_architecture: str
    tensor_count: int
    parameters: int
    size_bytes: int
    seconds: float
    tensor_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kind: str = "model"  # or "lora"

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "outtype": self.outtype,
            "architecture": self.architecture,
            "hf_architecture": self.hf_architecture,
            "tensor_count": self.tensor_count,
            "parameters": self.parameters,
            "size_bytes": self.size_bytes,
            "seconds": round(self.seconds, 3),
            "fallbacks": self.fallbacks,
            "notes": self.notes,
        }


def read_config(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise UserError(
            f"{model_dir} is not a directory; pass the checkpoint directory (the training stage's merged/)."
        )
    path = model_dir / "config.json"
    if not path.is_file():
        raise UserError(
            f"{model_dir} has no config.json, so it is not a Hugging Face checkpoint directory. Pass the directory "
            "that save_pretrained wrote (the training stage's merged/), which holds config.json, the safetensors "
            "and the tokenizer."
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON ({error}); save the checkpoint again.") from None
    if "text_config" in config:
        config = {**config, **config["text_config"]}
    for key in (
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "vocab_size",
        "max_position_embeddings",
    ):
        if key not in config:
            raise UserError(f"{path} lacks {key!r}; it is not a complete causal-LM config.")
    return config


def guess_outtype(tensors: dict[str, StoredTensor]) -> str:
    """``auto``: bf16 or f16 as the first matrix is stored (llama.cpp's rule), f16 otherwise."""
    for tensor in tensors.values():
        if len(tensor.shape) >= 2:
            return {"BF16": "bf16", "F16": "f16"}.get(tensor.dtype, "f16")
    return "f16"


def tensor_type(name: str, shape: tuple[int, ...], wanted: T, is_output: bool) -> tuple[T, str | None]:
    """The stored type of one tensor, and a note when it falls back from ``wanted``."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return T.F32, None
    if wanted in LOW_BIT_TYPES and is_output:
        wanted = T.Q8_0
    block_size = gguf.GGML_QUANT_SIZES[wanted][0]
    if shape[-1] % block_size:
        return (
            T.F16,
            (
                f"{name}: rows of {shape[-1]} values are not a multiple of the {wanted.name} block "
                f"({block_size}); stored as F16"
            ),
        )
    return wanted, None


def plan_tensors(
    config: dict[str, Any], arch: Architecture, tensors: dict[str, StoredTensor], wanted: T, model_dir: Path
) -> tuple[list[PlannedTensor], list[str]]:
    name_map = gguf.get_tensor_name_map(arch.gguf_arch, config["num_hidden_layers"])
    n_head = config["num_attention_heads"]
    n_kv_head = config.get("num_key_value_heads", n_head)
    planned: list[PlannedTensor] = []
    fallbacks: list[str] = []
    rope_factors = llama3_rope_factors(config)
    if rope_factors is not None:
        planned.append(
            PlannedTensor(
                gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight",
                rope_factors.shape,
                T.F32,
                values=rope_factors,
            )
        )
    tied = "lm_head.weight" not in tensors
    for hf_name, stored in tensors.items():
        if hf_name.endswith(SKIPPED_SUFFIXES):
            continue
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UserError(
                f"{stored.path}: tensor {hf_name} has no GGUF counterpart for {arch.hf_name}; the checkpoint holds "
                "weights the architecture does not have (a model with extra heads or adapters not merged?)."
            )
        permute_heads = 0
        if arch.permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            permute_heads = n_head
        elif arch.permute_qk and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            permute_heads = n_kv_head
        is_output = name == "output.weight" or (tied and name == "token_embd.weight")
        qtype, note = tensor_type(name, stored.shape, wanted, is_output)
        if note:
            fallbacks.append(note)
        planned.append(PlannedTensor(name, stored.shape, qtype, source=stored, permute_heads=permute_heads))
    check_vocab_rows(planned, config, model_dir)
    return planned, fallbacks


def check_vocab_rows(planned: list[PlannedTensor], config: dict[str, Any], model_dir: Path) -> None:
    embedding = next((t for t in planned if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise UserError(
            f"{model_dir}: the checkpoint has no token embedding (model.embed_tokens.weight); "
            "the weights are incomplete."
        )
    if embedding.shape[0] != config["vocab_size"]:
        raise UserError(
            f"Vocabulary size mismatch in {model_dir}: config.json says vocab_size {config['vocab_size']} but the "
            f"embedding matrix has {embedding.shape[0]} rows. Save config.json together with the weights it describes."
        )


class StreamedTensor:
    """What ``GGUFWriter.write_tensor_data`` needs of an array (``nbytes``, ``tofile``), fed chunk by chunk.

    The writer pads and checks the size; the data never exists as one array.
    """

    def __init__(self, nbytes: int, chunks: Iterator[np.ndarray], count: int) -> None:
        self.nbytes = nbytes
        self._chunks = chunks
        self._count = count

    def tofile(self, handle) -> None:
        written = 0
        for _ in range(self._count):
            chunk = np.ascontiguousarray(next(self._chunks))
            handle.write(memoryview(chunk).cast("B"))
            written += chunk.nbytes
        if written != self.nbytes:
            raise RuntimeError(f"tensor data is {written} bytes, its header says {self.nbytes}")


def converted_chunks(planned: list[PlannedTensor], workers: int) -> Iterator[np.ndarray]:
    """Every chunk of every tensor in file order, converted ``workers`` at a time.

    numpy releases the GIL in casts and ufuncs, so threads use several cores;
    at most ``2 * workers`` chunks are in flight, which bounds memory.
    """
    tasks: Iterator[Callable[[], np.ndarray]] = (
        (lambda t=tensor, a=start, b=stop: t.convert(a, b)) for tensor in planned for start, stop in tensor.chunks()
    )
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


@contextmanager
def atomic_output(outfile: Path) -> Iterator[Path]:
    """A temporary path next to ``outfile``, renamed onto it only if the block succeeds.

    Its name ends in ``.partial`` (never ``.gguf``), so a conversion killed
    half-way leaves nothing that looks finished; leftovers of earlier killed
    runs for the same output are removed first.
    """
    outfile.parent.mkdir(parents=True, exist_ok=True)
    for stale in outfile.parent.glob(f".{outfile.name}.*.partial"):
        stale.unlink(missing_ok=True)
    temporary = outfile.parent / f".{outfile.name}.{os.getpid()}.partial"
    try:
        yield temporary
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, outfile)
    finally:
        temporary.unlink(missing_ok=True)


def add_tensor_infos(writer: gguf.GGUFWriter, planned: list[PlannedTensor]) -> None:
    """Declare every tensor (name, shape, type, size) before any data is written."""
    for tensor in planned:
        writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32), tensor.nbytes, raw_dtype=tensor.qtype)


def write_file(writer: gguf.GGUFWriter, planned: list[PlannedTensor], outfile: Path, workers: int) -> None:
    """Header, metadata, tensor directory, then the tensors streamed in order; atomically."""
    with atomic_output(outfile) as temporary:
        try:
            writer.write_header_to_file(path=temporary)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            chunks = converted_chunks(planned, workers)
            for tensor in planned:
                writer.write_tensor_data(StreamedTensor(tensor.nbytes, chunks, len(tensor.chunks())))
        finally:
            writer.close()


def convert(
    model_dir: Path,
    outfile: Path,
    outtype: str,
    metadata: MetadataOptions | None = None,
    pre_tokenizer: str = "",
    workers: int | None = None,
) -> ConversionResult:
    """Write ``model_dir`` as a GGUF file at ``outfile`` in ``outtype`` (a direct type or ``auto``)."""
    started = time.perf_counter()
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    config_path = str(model_dir / "config.json")
    arch = architecture_of(config, config_path)
    check_rope(config, config_path)
    vocabulary = load_vocabulary(model_dir, config["vocab_size"], pre_tokenizer)
    tensors = open_checkpoint(model_dir)
    if outtype == "auto":
        outtype = guess_outtype(tensors)
    if outtype not in DIRECT_TYPES:
        raise UserError(f"outtype {outtype!r} cannot be written directly; use gguf_export.export() for K-quants.")
    wanted, file_type = DIRECT_TYPES[outtype]
    planned, fallbacks = plan_tensors(config, arch, tensors, wanted, model_dir)

    writer = gguf.GGUFWriter(path=None, arch=arch.gguf_name)
    add_tensor_infos(writer, planned)
    parameters = writer.get_total_parameter_count()
    writer.add_type(gguf.GGUFType.MODEL)
    model_metadata(model_dir, metadata or MetadataOptions(), parameters).set_gguf_meta_model(writer)
    add_hparams(writer, config, arch, file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocabulary.add_to(writer)
    write_file(writer, planned, Path(outfile), workers or min(4, os.cpu_count() or 1))
    return ConversionResult(
        path=Path(outfile),
        outtype=outtype,
        architecture=arch.gguf_name,
        hf_architecture=arch.hf_name,
        tensor_count=len(planned),
        parameters=parameters[0],
        size_bytes=Path(outfile).stat().st_size,
        seconds=time.perf_counter() - started,
        tensor_shapes={tensor.name: tuple(tensor.shape) for tensor in planned},
        fallbacks=fallbacks,
        notes=vocabulary.notes,
    )
