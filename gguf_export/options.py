"""Every knob of a GGUF export, its default and its help text, in one place.

``ExportOptions`` and ``Thresholds`` are the single source of truth: the
``python -m gguf_export`` command line is generated from their fields and the
pipeline component passes the same names, so the CLI, the component and the
verification report always agree on defaults.

Why ``q8_0`` is the default output type: it is what a user who runs the result
in Ollama wants from a small fine-tuned model. It is near-lossless (llama.cpp's
own converter measures top-1 agreement above 93% and logits NMSE about 4e-3 on
SmolLM2-135M), half the size of f16, fast on CPUs, written in-process without
llama.cpp's quantizer, and bit-identical to what llama.cpp's converter writes.
Ollama's library tags default to Q4_K_M for large models, but for the 135M-3B
models this pipeline fine-tunes, 4-bit costs a noticeable share of the quality
for a saving of a few hundred megabytes; ``q4_k_m`` is one option away.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import gguf

from common.cli_options import add_options, option, options_from
from common.errors import UserError

T = gguf.GGMLQuantizationType
F = gguf.LlamaFileType

# Output types written directly by our converter: (tensor type, file type).
DIRECT_TYPES: dict[str, tuple[T, F]] = {
    "f32": (T.F32, F.ALL_F32),
    "f16": (T.F16, F.MOSTLY_F16),
    "bf16": (T.BF16, F.MOSTLY_BF16),
    "q8_0": (T.Q8_0, F.MOSTLY_Q8_0),
    "q4_0": (T.Q4_0, F.MOSTLY_Q4_0),
    "q4_1": (T.Q4_1, F.MOSTLY_Q4_1),
    "q5_0": (T.Q5_0, F.MOSTLY_Q5_0),
    "q5_1": (T.Q5_1, F.MOSTLY_Q5_1),
}
# K-quants: written by llama.cpp's quantizer (llama-cpp-python) from a lossless intermediate.
K_QUANT_TYPES: dict[str, F] = {"q4_k_m": F.MOSTLY_Q4_K_M, "q5_k_m": F.MOSTLY_Q5_K_M, "q6_k": F.MOSTLY_Q6_K}
FLOAT_TYPES = ("f32", "f16", "bf16")
OUTTYPES = (*DIRECT_TYPES, *K_QUANT_TYPES, "auto")
DEFAULT_OUTTYPE = "q8_0"


def normalise_outtype(text: str) -> str:
    """``Q4_K_M`` and ``q4_k_m`` are the same type; anything else is a clear error."""
    value = text.strip().lower()
    if value not in OUTTYPES:
        raise UserError(f"outtype {text!r} is not supported; choose one of {', '.join(OUTTYPES)}.")
    return value


@dataclass(frozen=True)
class Thresholds:
    """Pass thresholds of the verification in llama.cpp (float types vs quantised types)."""

    float_min_top1: float = option(
        0.99, "f32/f16/bf16: least share of positions where llama.cpp's top-1 token equals transformers'."
    )
    float_max_nmse: float = option(
        1e-3, "f32/f16/bf16: largest mean logits NMSE (squared error over squared reference)."
    )
    quant_min_top1: float = option(0.90, "q8_0, 4/5-bit and K-quant types: least top-1 agreement.")
    quant_max_nmse: float = option(1e-2, "q8_0, 4/5-bit and K-quant types: largest mean logits NMSE.")
    min_positions: int = option(200, "Least number of token positions whose logits are compared.")
    lora_max_nmse: float = option(
        1e-2, "Adapter check: largest NMSE between base+adapter and the merged model in llama.cpp."
    )

    def for_outtype(self, outtype: str) -> tuple[float, float]:
        """(min top-1 agreement, max NMSE) for ``outtype``."""
        if outtype in FLOAT_TYPES:
            return self.float_min_top1, self.float_max_nmse
        return self.quant_min_top1, self.quant_max_nmse

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> "Thresholds":
        """Defaults overridden by ``values``; unknown keys or bad numbers are a clear error."""
        values = dict(values or {})
        known = {spec.name for spec in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(
                f"thresholds: unknown key(s) {', '.join(unknown)}; known keys are {', '.join(sorted(known))}."
            )
        types = typing.get_type_hints(cls)
        parsed: dict[str, Any] = {}
        for name, value in values.items():
            try:
                parsed[name] = types[name](value)
            except (TypeError, ValueError):
                raise UserError(f"thresholds: {name} must be a number, got {value!r}.") from None
        return cls(**parsed)


@dataclass(frozen=True)
class ExportOptions:
    """What one run of ``python -m gguf_export`` does."""

    model_dir: Path = option(
        Path(), "Merged Hugging Face checkpoint directory (config.json, safetensors, tokenizer).", positional=True
    )
    outfile: Path = option(
        Path(), "Where the GGUF file goes (written under a temporary name, renamed when complete).", required=True
    )
    outtype: str = option(
        DEFAULT_OUTTYPE,
        "Tensor type: " + ", ".join(OUTTYPES) + " (auto: f16 or bf16 as the checkpoint stores).",
        choices=OUTTYPES,
        normalise=str.lower,
    )
    verify: bool = option(
        False, "Read the file back and compare it with transformers in llama.cpp; fail when it does not pass."
    )
    report: Path | None = option(None, "With --verify: write the report as JSON here (and Markdown beside it, .md).")
    pre_tokenizer: str = option(
        "", "llama.cpp pre-tokenizer name, for tokenizers whose family is not recognised (e.g. llama-bpe)."
    )
    model_name: str = option("", "general.name (default: derived from the directory / model card).")
    base_model: str = option(
        "",
        (
            "Base model id the checkpoint was fine-tuned from (general.base_model.*), "
            "e.g. HuggingFaceTB/SmolLM2-135M-Instruct."
        ),
    )
    finetune: str = option("", "general.finetune label, e.g. the dataset or task name.")
    license: str = option("", "general.license, e.g. apache-2.0.")
    source_repo: str = option(
        "", "Hugging Face repo (or URL) the checkpoint is published at (general.source.repo_url)."
    )
    lora_dir: Path | None = option(
        None, "Also convert this PEFT LoRA adapter directory into a GGUF adapter for llama.cpp."
    )
    lora_outfile: Path | None = option(
        None,
        (
            "Where the adapter GGUF goes (default: beside OUTFILE, <name>-lora-<adapter type>.gguf, "
            "where OUTFILE is <name>[-<type>].gguf)."
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gguf_export",
        description=(
            "Convert a Hugging Face checkpoint to GGUF (built-in converter on the gguf library) "
            "and verify it in llama.cpp."
        ),
    )
    add_options(parser, ExportOptions)
    add_options(parser.add_argument_group("verification thresholds"), Thresholds)
    return parser


def parse_options(argv: Sequence[str] | None = None) -> tuple[ExportOptions, Thresholds]:
    args = build_parser().parse_args(argv)
    return options_from(args, ExportOptions), options_from(args, Thresholds)
