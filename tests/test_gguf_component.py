"""The export stage as the KFP component runs it, without KFP: a train directory in, verified files out.

The train directory is built for real: a tiny Llama-family (Mistral) base, a
PEFT LoRA adapter with random (non-zero) B matrices, and the merged model, as
the trainer writes them. KFP artifacts are duck-typed stand-ins (path,
metadata, log_metric), as ``run_in_pipeline`` takes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT
from fake_run import training_summary

from common.records import GgufVerification
from components.export.options import ExportStageOptions
from components.export.stage import run_in_pipeline
from gguf_export.reader import read_gguf

RANDOM_WEIGHTS = {"float_min_top1": 0.97}  # see tests/test_gguf_verify.py


@dataclass
class Artifact:
    path: str
    metadata: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name] = value


def artifacts(tmp_path: Path) -> tuple[Artifact, Artifact, Artifact]:
    return (
        Artifact(str(tmp_path / "artifacts" / "gguf")),
        Artifact(str(tmp_path / "artifacts" / "metrics")),
        Artifact(str(tmp_path / "artifacts" / "report.md")),
    )


@pytest.fixture(scope="module")
def train_dir(gguf_models, tmp_path_factory) -> Path:
    """merged/, adapter/ and training_summary.json as the trainer writes them (LoRA on the tiny Mistral)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("train")
    base = root / "base"
    model = AutoModelForCausalLM.from_pretrained(gguf_models["mistral"], dtype=torch.float32)
    model.save_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(gguf_models["mistral"])
    tokenizer.save_pretrained(base)
    torch.manual_seed(1)
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    for name, parameter in lora.named_parameters():
        if "lora_B" in name:
            parameter.data.mul_(0.3)  # a visible change of the logits, not a different model
    lora.save_pretrained(root / "train" / "adapter")
    merged = lora.merge_and_unload()
    merged.save_pretrained(root / "train" / "merged")
    tokenizer.save_pretrained(root / "train" / "merged")
    training_summary(str(base)).write(root / "train" / "training_summary.json")
    return root / "train"


@pytest.mark.slow
def test_export_stage_writes_verified_files(train_dir, tmp_path):
    export_dir = tmp_path / "export"
    gguf, metrics, report = artifacts(tmp_path)
    options = ExportStageOptions(
        model_name="tiny-mistral", outtype="q8_0,f16", gguf_lora_adapter=True, thresholds=RANDOM_WEIGHTS
    )
    primary = run_in_pipeline(str(train_dir), str(export_dir), options, gguf, metrics, report)

    assert primary == str(export_dir / "tiny-mistral-q8_0.gguf")
    assert sorted(p.name for p in export_dir.iterdir()) == [
        "Modelfile",
        "tiny-mistral-f16.gguf",
        "tiny-mistral-lora-q8_0.gguf",
        "tiny-mistral-q8_0.gguf",
        "verification.json",
        "verification.md",
    ]
    verification = GgufVerification.read(export_dir / "verification.json")
    assert verification.passed is True and verification.modelfile == "Modelfile"
    assert [f.outtype for f in verification.files] == ["q8_0", "f16", "lora"]
    assert [Path(c["path"]).name for c in verification.conversions] == [
        "tiny-mistral-q8_0.gguf",
        "tiny-mistral-f16.gguf",
        "tiny-mistral-lora-q8_0.gguf",
    ]
    lora_report = verification.files[2]
    assert {c["name"] for c in lora_report.checks} == {"adapter_loads", "adapter_matches_merged"}
    assert lora_report.metrics["nmse_vs_merged"] < 1e-2
    assert "FROM ./tiny-mistral-q8_0.gguf" in (export_dir / "Modelfile").read_text()
    assert read_gguf(export_dir / "tiny-mistral-lora-q8_0.gguf").metadata["general.type"] == "adapter"

    assert (
        Path(gguf.path).read_bytes()[:4] == b"GGUF" and Path(gguf.path).stat().st_size == Path(primary).stat().st_size
    )
    assert gguf.metadata["outtype"] == "q8_0" and gguf.metadata["verification_passed"] is True
    assert gguf.metadata["files"] == ["tiny-mistral-q8_0.gguf", "tiny-mistral-f16.gguf", "tiny-mistral-lora-q8_0.gguf"]
    assert metrics.metrics["verification_passed"] == 1.0
    assert metrics.metrics["q8_0_top1_agreement"] >= 0.9 and metrics.metrics["f16_nmse"] < 1e-3
    assert "lora_size_mb" in metrics.metrics and "lora_nmse_vs_merged" in metrics.metrics
    assert Path(report.path).read_text() == (export_dir / "verification.md").read_text()
    assert "# GGUF verification" in Path(report.path).read_text()


@pytest.mark.slow
def test_adapter_changes_logits_like_merging(train_dir, tmp_path):
    """llama.cpp: base + adapter ≈ merged, and clearly different from the base alone."""
    from gguf_export.convert import convert
    from gguf_export.lora import convert_adapter
    from gguf_export.verify import TransformersReference, open_llama

    base_dir = Path(json.loads((train_dir / "training_summary.json").read_text())["config"]["model"])
    base = convert(base_dir, tmp_path / "base.gguf", "f32").path
    merged = convert(train_dir / "merged", tmp_path / "merged.gguf", "f32").path
    adapter = convert_adapter(train_dir / "adapter", train_dir / "merged", tmp_path / "lora.gguf", "f32").path
    ids = TransformersReference(train_dir / "merged", 64).evaluation_ids

    def logits(path, lora=None):
        llm = open_llama(path, 512, lora_path=lora)
        try:
            llm.eval(ids)
            return np.array(llm.scores[: len(ids)])
        finally:
            llm.close()

    with_adapter, merged_logits, base_logits = logits(base, adapter), logits(merged), logits(base)
    change = ((merged_logits - base_logits) ** 2).sum() / (merged_logits**2).sum()
    error = ((with_adapter - merged_logits) ** 2).sum() / (merged_logits**2).sum()
    assert change > 0.01, change
    assert error < change / 100, (error, change)


@pytest.mark.slow
def test_failed_verification_fails_the_step_after_writing_the_report(train_dir, tmp_path, capsys):
    export_dir = tmp_path / "export"
    gguf, metrics, report = artifacts(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        options = ExportStageOptions(
            model_name="tiny", outtype="q8_0", gguf_lora_adapter=False, thresholds={"quant_max_nmse": 1e-9}
        )
        run_in_pipeline(str(train_dir), str(export_dir), options, gguf, metrics, report)
    assert exit_info.value.code == 2
    assert "GGUF verification failed" in capsys.readouterr().err
    body = json.loads((export_dir / "verification.json").read_text())
    assert body["passed"] is False
    assert any(c["name"] == "nmse" and not c["passed"] for c in body["files"][0]["checks"])
    assert not Path(gguf.path).exists()
    assert metrics.metrics["verification_passed"] == 0.0


def test_bad_parameters_are_clear_errors(train_dir, tmp_path, capsys):
    gguf, metrics, report = artifacts(tmp_path)
    cases = [
        (("q8_0", "tiny", False, {"min_top_one": 0.5}), "unknown key(s) min_top_one"),
        (("q3_k", "tiny", False, {}), "outtype 'q3_k' is not supported"),
        (("q8_0", "my model!", False, {}), "model_name 'my model!'"),
        (("auto", "tiny", False, {}), "outtype 'auto' is not allowed"),
    ]
    for (outtype, name, lora, thresholds), message in cases:
        with pytest.raises(SystemExit):
            options = ExportStageOptions(
                model_name=name, outtype=outtype, gguf_lora_adapter=lora, thresholds=thresholds
            )
            run_in_pipeline(str(train_dir), str(tmp_path / "export"), options, gguf, metrics, report)
        assert message in " ".join(capsys.readouterr().err.split())
    with pytest.raises(SystemExit):
        options = ExportStageOptions(model_name="tiny", outtype="q8_0", gguf_lora_adapter=False, thresholds={})
        run_in_pipeline(str(tmp_path / "nowhere"), str(tmp_path / "export"), options, gguf, metrics, report)
    assert "holds no merged checkpoint" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow
def test_k_quant_through_llama_cpps_quantizer(smollm2_dir, tmp_path):
    """Q4_K_M via llama_model_quantize: K-quant tensors, our metadata kept, loads and chats in llama.cpp."""
    from gguf_export.export import export
    from gguf_export.options import Thresholds
    from gguf_export.verify import TransformersReference, verify

    result = export(smollm2_dir, tmp_path / "smollm2-q4_k_m.gguf", "q4_k_m")
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-q4_k_m.gguf"]
    parsed = read_gguf(result.path)
    assert parsed.metadata["general.file_type"] == 15  # MOSTLY_Q4_K_M
    assert parsed.metadata["tokenizer.ggml.pre"] == "smollm" and parsed.metadata["tokenizer.ggml.eot_token_id"] == 2
    from gguf import GGMLQuantizationType

    kinds = {GGMLQuantizationType(kind).name for _, _, kind, _ in parsed.tensors}
    # SmolLM2's rows (576) are not a multiple of 256, so llama.cpp's recipe falls back to legacy 4/5/8-bit blocks.
    assert kinds - {"F32"} and kinds <= {"F32", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}, kinds
    report = verify(
        result.path,
        TransformersReference(smollm2_dir, 200),
        "q4_k_m",
        Thresholds(quant_min_top1=0.8, quant_max_nmse=0.1),
    )
    assert report.passed, report.failures()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("outfile", "outtype", "expected"),
    [("tiny-q4_0.gguf", "q4_0", "tiny-lora-f16.gguf"), ("my-model.gguf", "q8_0", "my-model-lora-q8_0.gguf")],
    ids=["adapter-type-differs", "no-type-in-name"],
)
def test_cli_names_the_adapter_by_the_type_it_holds(train_dir, tmp_path, outfile, outtype, expected):
    """--lora-dir without --lora-outfile: the adapter file says its own type (4-bit models get an f16 adapter)."""
    command = [
        sys.executable,
        "-m",
        "gguf_export",
        str(train_dir / "merged"),
        "--outfile",
        str(tmp_path / outfile),
        "--outtype",
        outtype,
        "--lora-dir",
        str(train_dir / "adapter"),
    ]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([outfile, expected])
    assert read_gguf(tmp_path / expected).metadata["general.type"] == "adapter"
