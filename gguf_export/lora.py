"""A PEFT LoRA adapter as a GGUF adapter that llama.cpp applies on top of the base GGUF.

The format is the one llama.cpp's ``convert_lora_to_gguf.py`` writes and
``llama_adapter_lora_init`` reads: ``general.type = adapter``,
``adapter.type = lora``, ``adapter.lora.alpha``, and for every adapted matrix
``<gguf name>.lora_a`` (rank x in) and ``.lora_b`` (out x rank). llama.cpp
scales the update by alpha / rank; an rsLoRA adapter (alpha / sqrt(rank)) is
written with alpha multiplied by sqrt(rank) so the scale comes out the same.
Where the base weights' rows are permuted for llama.cpp's RoPE (q/k of the
Llama family), ``lora_b``'s rows are permuted the same way, since
W + B·A permuted by rows is permuted(W) + permuted(B)·A.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from common.errors import UserError
from gguf_export.architectures import architecture_of
from gguf_export.convert import ConversionResult, PlannedTensor, add_tensor_infos, read_config, tensor_type, write_file
from gguf_export.metadata import MetadataOptions, model_metadata
from gguf_export.options import DIRECT_TYPES, FLOAT_TYPES
from gguf_export.safetensors_io import open_safetensors

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_OUTTYPES = (*FLOAT_TYPES, "q8_0")


def adapter_outtype(model_outtype: str) -> str:
    """The adapter is written in the model's type when it can be, else f16 (K-quants and 4/5-bit types)."""
    return model_outtype if model_outtype in ADAPTER_OUTTYPES else "f16"


def read_adapter_config(adapter_dir: Path) -> dict[str, Any]:
    path = adapter_dir / "adapter_config.json"
    if not path.is_file() or not (adapter_dir / ADAPTER_FILE).is_file():
        raise UserError(
            f"{adapter_dir} is not a PEFT adapter directory: it needs adapter_config.json and {ADAPTER_FILE}."
        )
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("peft_type", "LORA") != "LORA":
        raise UserError(
            f"{path}: peft_type {config.get('peft_type')!r} is not LoRA; only LoRA adapters become GGUF adapters."
        )
    if config.get("modules_to_save"):
        raise UserError(
            f"{path}: the adapter also trains whole modules ({', '.join(config['modules_to_save'])}), "
            "which a GGUF LoRA adapter cannot hold; use the merged model's GGUF instead."
        )
    return config


def convert_adapter(
    adapter_dir: Path, base_dir: Path, outfile: Path, outtype: str = "f16", metadata: MetadataOptions | None = None
) -> ConversionResult:
    """Write the adapter in ``adapter_dir`` for the architecture described by ``base_dir``'s config.json."""
    started = time.perf_counter()
    if outtype not in ADAPTER_OUTTYPES:
        raise UserError(f"adapter outtype {outtype!r} is not supported; choose one of {', '.join(ADAPTER_OUTTYPES)}.")
    adapter_config = read_adapter_config(adapter_dir)
    config = read_config(base_dir)
    arch = architecture_of(config, str(base_dir / "config.json"))
    name_map = gguf.get_tensor_name_map(arch.gguf_arch, config["num_hidden_layers"])
    wanted = DIRECT_TYPES[outtype][0]
    n_head = config["num_attention_heads"]
    heads = {"q_proj": n_head, "k_proj": config.get("num_key_value_heads", n_head)}

    planned: list[PlannedTensor] = []
    fallbacks: list[str] = []
    for hf_name, stored in open_safetensors([adapter_dir / ADAPTER_FILE]).items():
        base_name = hf_name.replace("base_model.model.", "")
        for marker, suffix in ((".lora_A.weight", ".lora_a"), (".lora_B.weight", ".lora_b")):
            if base_name.endswith(marker):
                break
        else:
            raise UserError(
                f"{adapter_dir / ADAPTER_FILE}: tensor {hf_name} is neither lora_A nor lora_B; "
                "the adapter cannot be converted."
            )
        module = base_name[: -len(marker)]
        name = name_map.get_name(module + ".weight", try_suffixes=(".weight",))
        if name is None:
            raise UserError(f"{adapter_dir}: adapted module {module} has no GGUF counterpart for {arch.hf_name}.")
        permute = heads.get(module.rsplit(".", 1)[-1], 0) if arch.permute_qk and suffix == ".lora_b" else 0
        qtype, note = tensor_type(name + suffix, stored.shape, wanted, is_output=False)
        if note:
            fallbacks.append(note)
        planned.append(PlannedTensor(name + suffix, stored.shape, qtype, source=stored, permute_heads=permute))

    alpha = float(adapter_config["lora_alpha"])
    if adapter_config.get("use_rslora"):
        alpha *= math.sqrt(adapter_config["r"])
    writer = gguf.GGUFWriter(path=None, arch=arch.gguf_name)
    add_tensor_infos(writer, planned)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    model_metadata(adapter_dir, metadata or MetadataOptions(), writer.get_total_parameter_count()).set_gguf_meta_model(
        writer
    )
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_file(writer, planned, Path(outfile), workers=1)
    return ConversionResult(
        path=Path(outfile),
        outtype=outtype,
        architecture=arch.gguf_name,
        hf_architecture=arch.hf_name,
        tensor_count=len(planned),
        parameters=sum(int(np.prod(t.shape)) for t in planned),
        size_bytes=Path(outfile).stat().st_size,
        seconds=time.perf_counter() - started,
        fallbacks=fallbacks,
        kind="lora",
    )
