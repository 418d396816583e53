"""The export stage's run parameters: their defaults, help texts and validation, in one place.

The converter itself (``python -m gguf_export``) has its own options,
``gguf_export.options.ExportOptions``: one file, one type. The stage writes
several types, names the files after the model and may add a LoRA adapter GGUF,
so its options are these; the verification thresholds are
``gguf_export.options.Thresholds``, given here as overrides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from common.cli_options import run_option
from common.errors import UserError
from gguf_export.options import DEFAULT_OUTTYPE, K_QUANT_TYPES, OUTTYPES, Thresholds, normalise_outtype

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PIPELINE_OUTTYPES = [name for name in OUTTYPES if name != "auto"]  # "auto" would not say in the file name what it holds


@dataclass(frozen=True)
class ExportStageOptions:
    """What one run of the export stage writes."""

    model_name: str = run_option(
        "", "Name of the GGUF files and of the Ollama model. Empty: the base model's name followed by -ft."
    )
    outtype: str = run_option(
        DEFAULT_OUTTYPE,
        f"GGUF type(s) to export, comma-separated: {', '.join(PIPELINE_OUTTYPES)}. The first is what the "
        f"Modelfile uses. {', '.join(K_QUANT_TYPES)} are quantised by llama.cpp.",
        name="gguf_outtype",
    )
    gguf_lora_adapter: bool = run_option(
        False,
        "Also export the LoRA adapter as a GGUF adapter, to apply on top of the base model's GGUF in llama.cpp.",
    )
    thresholds: dict = run_option(
        {},
        "Verification pass thresholds overriding the defaults, as a JSON object with any of "
        + ", ".join(f"{spec.name} ({spec.default})" for spec in fields(Thresholds))
        + ". A failed verification fails the run before publishing.",
        name="gguf_thresholds",
    )


def parse_outtypes(outtype: str) -> list[str]:
    """``"q8_0"`` or ``"q8_0,q4_k_m"``: each one normalised, duplicates dropped, order kept."""
    types = [normalise_outtype(part) for part in outtype.split(",") if part.strip()]
    if not types:
        raise UserError(f"outtype {outtype!r} names no output type; use e.g. {DEFAULT_OUTTYPE!r} or 'q8_0,q4_k_m'.")
    if "auto" in types:
        raise UserError(
            "outtype 'auto' is not allowed in the pipeline: its file name would not say what it holds; "
            "name the type (e.g. f16)."
        )
    return list(dict.fromkeys(types))


def check_model_name(model_name: str) -> str:
    """``model_name`` stripped, when it is safe as a file name and an Ollama model name."""
    name = model_name.strip()
    if not NAME_PATTERN.match(name):
        raise UserError(
            f"model_name {model_name!r} must be a file-name-safe word (letters, digits, '.', '_', '-'), "
            "e.g. 'smollm2-135m-knots'."
        )
    return name


def option_problems(options: Any) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way."""
    problems = {}
    for name, check in (
        ("outtype", parse_outtypes),
        ("model_name", check_model_name),
        ("thresholds", Thresholds.from_mapping),
    ):
        value = getattr(options, name)
        if value:
            try:
                check(value)
            except UserError as error:
                problems[name] = f"is invalid: {str(error).rstrip('.')}"
    return problems


def default_model_name(base_model: str) -> str:
    """``<base model name>-ft``: what the files are called when the run form leaves model_name empty."""
    base = Path(base_model or "model").name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-._") + "-ft"


def model_name_of(model_name: str, base_model: str) -> str:
    """The model's name: ``model_name`` when set, else ``<base model name>-ft``; checked either way."""
    return check_model_name(model_name or default_model_name(base_model))
