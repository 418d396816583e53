"""K-quants (Q4_K_M, Q5_K_M, Q6_K) through llama.cpp's own quantizer.

``gguf.quants`` cannot write K-quants, and their mixed per-tensor recipes
("_M") live in llama.cpp's ``llama_model_quantize``, which llama-cpp-python
exposes. The checkpoint is first written losslessly (f32 when it is stored in
f32, else its own 16-bit type) next to the output, then quantised; both steps
use temporary names, so only a finished file ever carries the final name.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from common.errors import UserError
from gguf_export.convert import ConversionResult, atomic_output, convert, guess_outtype
from gguf_export.metadata import MetadataOptions
from gguf_export.options import K_QUANT_TYPES
from gguf_export.safetensors_io import open_checkpoint


def llama_cpp_quantizer():
    try:
        import llama_cpp
    except ImportError:
        raise UserError(
            "K-quant output types (q4_k_m, q5_k_m, q6_k) use llama.cpp's quantizer from llama-cpp-python, "
            "a dependency of this project that is not installed here: pip install llama-cpp-python, "
            "or choose q8_0 / q4_0 / q5_0."
        ) from None
    return llama_cpp


def lossless_outtype(model_dir: Path) -> str:
    tensors = open_checkpoint(model_dir)
    first_matrix = next((t for t in tensors.values() if len(t.shape) >= 2), None)
    return "f32" if first_matrix is not None and first_matrix.dtype in ("F32", "F64") else guess_outtype(tensors)


def quantize_k(
    model_dir: Path, outfile: Path, outtype: str, metadata: MetadataOptions | None = None, pre_tokenizer: str = ""
) -> ConversionResult:
    llama_cpp = llama_cpp_quantizer()
    outfile = Path(outfile)
    with atomic_output(outfile) as temporary:
        intermediate = outfile.parent / f".{outfile.name}.{os.getpid()}.lossless.partial"
        try:
            result = convert(model_dir, intermediate, lossless_outtype(Path(model_dir)), metadata, pre_tokenizer)
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = int(K_QUANT_TYPES[outtype])
            params.nthread = os.cpu_count() or 1
            status = llama_cpp.llama_model_quantize(
                str(intermediate).encode(), str(temporary).encode(), ctypes.byref(params)
            )
        finally:
            intermediate.unlink(missing_ok=True)
        if status != 0:
            raise UserError(
                f"llama.cpp's quantizer failed to write {outtype} for {model_dir} (status {status}); see its log above."
            )
    result.path = outfile
    result.outtype = outtype
    result.size_bytes = outfile.stat().st_size
    return result
