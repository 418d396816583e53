"""One entry point for every output type: built-in conversion, K-quants, or llama.cpp's converter.

    export(model_dir, outfile, outtype) -> ConversionResult

Direct types are written by ``convert``; K-quants go through llama.cpp's
quantizer (``kquants``); a checkpoint the built-in converter declines
(``NeedsLlamaCpp``: another architecture, a SentencePiece tokenizer) is handed
to ``convert_hf_to_gguf.py`` of the llama.cpp checkout in ``LLAMA_CPP_DIR``
when one is configured, and is a clear error otherwise.
"""

from __future__ import annotations

from pathlib import Path

from gguf_export.architectures import NeedsLlamaCpp
from gguf_export.convert import ConversionResult, convert
from gguf_export.delegate import configured_llama_cpp, delegate
from gguf_export.kquants import quantize_k
from gguf_export.metadata import MetadataOptions
from gguf_export.options import K_QUANT_TYPES, normalise_outtype


def export(
    model_dir: Path, outfile: Path, outtype: str, metadata: MetadataOptions | None = None, pre_tokenizer: str = ""
) -> ConversionResult:
    outtype = normalise_outtype(outtype)
    try:
        if outtype in K_QUANT_TYPES:
            return quantize_k(Path(model_dir), Path(outfile), outtype, metadata, pre_tokenizer)
        return convert(Path(model_dir), Path(outfile), outtype, metadata, pre_tokenizer)
    except NeedsLlamaCpp as error:
        llama_cpp_dir = configured_llama_cpp()
        if llama_cpp_dir is None:
            raise
        return delegate(Path(model_dir), Path(outfile), outtype, llama_cpp_dir, str(error))
