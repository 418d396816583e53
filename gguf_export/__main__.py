"""``python -m gguf_export MODEL_DIR --outfile OUT.gguf --outtype q8_0 [--verify]``: see ``gguf_export.options``."""

from __future__ import annotations

from pathlib import Path

from common.atomic import write_text_atomic
from common.errors import UserError, exit_on_user_error
from gguf_export.export import export
from gguf_export.lora import adapter_outtype, convert_adapter
from gguf_export.metadata import MetadataOptions
from gguf_export.options import ExportOptions, Thresholds, parse_options


def adapter_outfile(outfile: Path, model_outtype: str, adapter_type: str) -> Path:
    """``<name>-lora-<adapter type>.gguf`` beside the model's ``<name>[-<model type>].gguf``,
    as the export stage names it."""
    name = outfile.name.removesuffix(".gguf").removesuffix(f"-{model_outtype}")
    return outfile.with_name(f"{name}-lora-{adapter_type}.gguf")


def run(options: ExportOptions, thresholds: Thresholds) -> None:
    """Convert (and verify when asked); a failed verification raises UserError."""
    metadata = MetadataOptions(
        options.model_name, options.base_model, options.finetune, options.license, options.source_repo
    )
    result = export(options.model_dir, options.outfile, options.outtype, metadata, options.pre_tokenizer)
    print(
        f"wrote {result.path} ({result.outtype}, {result.size_bytes / 2**20:.1f} MiB) in {result.seconds:.1f}s",
        flush=True,
    )
    for line in result.fallbacks + result.notes:
        print(f"  note: {line}", flush=True)
    adapter = None
    if options.lora_dir is not None:
        adapter_type = adapter_outtype(result.outtype)
        adapter_file = options.lora_outfile or adapter_outfile(options.outfile, result.outtype, adapter_type)
        adapter = convert_adapter(options.lora_dir, options.model_dir, adapter_file, adapter_type, metadata)
        print(f"wrote {adapter.path} (LoRA adapter, {adapter.tensor_count} tensors)", flush=True)
    if not options.verify:
        return
    from gguf_export.verification_report import markdown, verification_record
    from gguf_export.verify import TransformersReference, verify_adapter, verify_conversion

    reference = TransformersReference(options.model_dir, thresholds.min_positions)
    reports = [verify_conversion(result, reference, thresholds)]
    if adapter is not None:
        reports.append(verify_adapter(adapter.path, result.path, None, reference, thresholds.lora_max_nmse))
    print(markdown(reports), flush=True)
    if options.report is not None:
        conversions = [result] if adapter is None else [result, adapter]
        verification_record(reports, conversions, thresholds).write(options.report)
        write_text_atomic(options.report.with_suffix(".md"), markdown(reports))
    failures = [failure for report in reports for failure in report.failures()]
    if failures:
        raise UserError(
            f"verification of {result.path} failed: {'; '.join(failures)}. "
            "The file is kept for inspection; do not publish it."
        )


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    run(*parse_options(argv))


if __name__ == "__main__":
    main()
