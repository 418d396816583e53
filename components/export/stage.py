"""Export stage: the training stage's merged model as verified GGUF file(s) and an Ollama Modelfile.

In a pipeline the stage reads ``merged/`` (and, with ``gguf_lora_adapter``,
``adapter/``) from the run's train directory on the workspace PVC and writes
into its export directory:

* ``<model-name>-<outtype>.gguf`` for each requested type (comma-separated,
  the first one is what the Modelfile uses);
* ``<model-name>-lora-<type>.gguf`` with ``gguf_lora_adapter`` (the LoRA adapter for
  llama.cpp, to apply on top of the base model's GGUF);
* ``Modelfile`` (``FROM ./<first gguf>``);
* ``verification.json`` and ``verification.md``, written last.

Every GGUF is verified in llama.cpp against transformers; a failed
verification fails the step (after the report is written, so it can be read).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from common.atomic import link_or_copy, write_text_atomic
from common.cli_options import options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.records import GgufVerification
from common.run_layout import ADAPTER, MERGED, MODELFILE, VERIFICATION_JSON, VERIFICATION_MARKDOWN, stage_dir
from components.champion.version import trained_from
from components.export.options import ExportStageOptions, model_name_of, parse_outtypes
from gguf_export.convert import ConversionResult, read_config
from gguf_export.export import export
from gguf_export.lora import adapter_outtype, convert_adapter
from gguf_export.metadata import MetadataOptions
from gguf_export.modelfile import modelfile_text
from gguf_export.options import Thresholds


def hub_id(model: str) -> str:
    """``model`` when it is a Hub id (``org/name``) rather than a local directory, else empty."""
    return model if re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not Path(model).exists() else ""


def base_model_on_disk(base_model: str, adapter_dir: Path) -> Path | None:
    """The base model's checkpoint directory if it exists on this machine (needed to check the adapter's effect)."""
    candidates = [base_model]
    adapter_config = adapter_dir / "adapter_config.json"
    if adapter_config.is_file():
        candidates.append(json.loads(adapter_config.read_text(encoding="utf-8")).get("base_model_name_or_path", ""))
    for candidate in candidates:
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate)
    return None


def export_stage(
    train_dir: Path,
    base_model: str,
    export_dir: Path,
    outtypes: list[str],
    model_name: str,
    gguf_lora_adapter: bool,
    thresholds: Thresholds,
) -> tuple[GgufVerification, str]:
    """Convert, verify, write the Modelfile and the reports; returns the verification and its Markdown.
    Raises on failure.
    """
    from gguf_export.verification_report import markdown, verification_record
    from gguf_export.verify import TransformersReference, verify_adapter, verify_conversion

    merged = train_dir / MERGED
    if not (merged / "config.json").is_file():
        raise UserError(
            f"{merged} holds no merged checkpoint (config.json); run the training stage first, "
            "or pass the train directory it wrote."
        )
    adapter_dir = train_dir / ADAPTER
    if gguf_lora_adapter and not (adapter_dir / "adapter_config.json").is_file():
        raise UserError(
            f"gguf_lora_adapter is set but {adapter_dir} holds no LoRA adapter (full fine-tuning writes none); "
            "unset gguf_lora_adapter."
        )
    metadata = MetadataOptions(model_name=model_name, base_model=hub_id(base_model))
    export_dir.mkdir(parents=True, exist_ok=True)
    (export_dir / VERIFICATION_JSON).unlink(missing_ok=True)  # the completion marker of an earlier run goes first

    reference = TransformersReference(merged, thresholds.min_positions)
    results: list[ConversionResult] = []
    reports = []
    for outtype in outtypes:
        result = export(merged, export_dir / f"{model_name}-{outtype}.gguf", outtype, metadata)
        results.append(result)
        reports.append(verify_conversion(result, reference, thresholds))
    if gguf_lora_adapter:
        adapter_type = adapter_outtype(outtypes[0])
        adapter = convert_adapter(
            adapter_dir, merged, export_dir / f"{model_name}-lora-{adapter_type}.gguf", adapter_type, metadata
        )
        results.append(adapter)
        base_gguf = None
        base_dir = base_model_on_disk(base_model, adapter_dir)
        if base_dir is not None:
            base_gguf = export_dir / f".base-{adapter_type}.gguf.partial"
            export(base_dir, base_gguf, adapter_type)
        try:
            reports.append(
                verify_adapter(adapter.path, results[0].path, base_gguf, reference, thresholds.lora_max_nmse)
            )
        finally:
            if base_gguf is not None:
                base_gguf.unlink(missing_ok=True)
    write_text_atomic(
        export_dir / MODELFILE,
        modelfile_text(
            results[0].path.name,
            reference.tokenizer.chat_template,
            merged,
            read_config(merged)["max_position_embeddings"],
        ),
    )
    verification = verification_record(reports, results, thresholds, MODELFILE)
    markdown_text = markdown(reports)
    write_text_atomic(export_dir / VERIFICATION_MARKDOWN, markdown_text)
    verification.write(export_dir / VERIFICATION_JSON)
    return verification, markdown_text


@exit_on_user_error
def run_in_pipeline(
    train_dir: str, export_dir: str, options: ExportStageOptions, gguf_artifact, metrics, report_markdown
) -> str:
    """What the KFP component does; returns the path of the Modelfile's GGUF on the workspace."""
    outtypes = parse_outtypes(options.outtype)
    base_model = trained_from(Path(train_dir))
    name = model_name_of(options.model_name, base_model)
    limits = Thresholds.from_mapping(options.thresholds)
    verification, markdown_text = export_stage(
        Path(train_dir), base_model, Path(export_dir), outtypes, name, options.gguf_lora_adapter, limits
    )
    Path(report_markdown.path).parent.mkdir(parents=True, exist_ok=True)
    Path(report_markdown.path).write_text(markdown_text, encoding="utf-8")
    print(markdown_text, flush=True)

    for file_report in verification.files:
        for key in ("top1_agreement", "nmse", "positions", "nmse_vs_merged"):
            if key in file_report.metrics:
                metrics.log_metric(f"{file_report.outtype}_{key}", file_report.metrics[key])
    for conversion in verification.conversions:
        label = "lora" if conversion["kind"] == "lora" else conversion["outtype"]
        metrics.log_metric(f"{label}_size_mb", round(conversion["size_bytes"] / 2**20, 2))
    metrics.log_metric("verification_passed", float(verification.passed))

    primary = Path(verification.conversions[0]["path"])
    if not verification.passed:
        failed = [
            f"{Path(r.gguf).name}: " + "; ".join(c["name"] for c in r.checks if not c["passed"])
            for r in verification.files
            if not r.passed
        ]
        raise UserError(
            f"GGUF verification failed ({' | '.join(failed)}); see {Path(export_dir) / VERIFICATION_MARKDOWN}. "
            "Nothing from this export should be published."
        )
    link_or_copy(primary, Path(gguf_artifact.path))
    gguf_artifact.metadata.update(
        {
            "outtype": outtypes[0],
            "workspace_path": str(primary),
            "size_bytes": primary.stat().st_size,
            "architecture": verification.conversions[0]["architecture"],
            "verification_passed": True,
            "top1_agreement": verification.files[0].metrics.get("top1_agreement"),
            "nmse": verification.files[0].metrics.get("nmse"),
            "modelfile": str(Path(export_dir) / MODELFILE),
            "files": [Path(c["path"]).name for c in verification.conversions],
        }
    )
    return str(primary)


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> str:
    """What the ``export_gguf`` component calls with every input by name; returns the Modelfile's GGUF path."""
    return run_in_pipeline(
        inputs["train_dir"],
        str(stage_dir(inputs["workspace_root"], inputs["run_id"], "export")),
        options_from_inputs(ExportStageOptions, inputs),
        inputs["gguf_model"],
        inputs["metrics"],
        inputs["report"],
    )
