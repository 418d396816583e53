"""Verification in llama.cpp: our GGUF files pass, broken ones fail, and the report says why.

Real files, real llama.cpp (llama-cpp-python) and real transformers on the
same token ids; nothing is mocked.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from common.records import GgufVerification
from gguf_export.convert import convert
from gguf_export.metadata import MetadataOptions
from gguf_export.options import Thresholds
from gguf_export.reader import read_gguf
from gguf_export.verification_report import markdown, verification_record
from gguf_export.verify import TransformersReference, verify
from tests.conftest import GGUF_COMPARED_TYPES

MODELS = ("smollm2", "smollm3", "qwen2", "qwen3", "mistral")
# Untrained random weights give near-ties between the two best tokens at a few percent of
# positions (gaps of 0.005 against rounding errors of 0.05 in bf16); top-1 agreement there
# measures the ties, not the file. The trained SmolLM2 is held to the defaults (99%).
RANDOM_WEIGHTS = Thresholds(float_min_top1=0.97)
GGUF_ARCH = {"smollm2": "llama", "smollm3": "smollm3", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_every_type_passes_verification(model, gguf_models, our_ggufs):
    thresholds = Thresholds() if model == "smollm2" else RANDOM_WEIGHTS
    reference = TransformersReference(gguf_models[model], thresholds.min_positions)
    for outtype in GGUF_COMPARED_TYPES:
        report = verify(our_ggufs[model, outtype], reference, outtype, thresholds, arch=GGUF_ARCH[model])
        assert report.passed, (outtype, report.failures())
        assert report.metrics["positions"] >= 200
        names = {check.name for check in report.checks}
        assert {
            "vocabulary",
            "chat_template",
            "plain_tokens",
            "chat_tokens",
            "top1_agreement",
            "nmse",
            "end_of_turn",
            "reply_stops",
        } <= names
        if (model, outtype) == ("smollm2", "f16"):
            # The real chat model answers and stops at <|im_end|> in llama.cpp exactly as in transformers.
            assert report.metrics["reply_stopped"] and report.metrics["reply_equals_transformers"]
            assert "Paris" in report.metrics["reply"] and report.metrics["reply"].endswith("<|im_end|>")
            assert report.metrics["top1_agreement"] == 1.0 and report.metrics["nmse"] < 1e-4
            stops = next(c for c in report.checks if c.name == "reply_stops")
            assert "end-of-generation" in stops.detail and "NOT" not in stops.detail


def test_corrupted_weights_fail_verification(gguf_models, our_ggufs, tmp_path):
    """Zeroing one attention matrix in the file is caught by the logits comparison."""
    broken = tmp_path / "broken.gguf"
    shutil.copyfile(our_ggufs["qwen3", "f16"], broken)
    parsed = read_gguf(broken)
    header_size = broken.stat().st_size - len(parsed.data)
    entries = {name: offset for name, _, _, offset in parsed.tensors}
    offsets = sorted(entries.values()) + [len(parsed.data)]
    start = entries["blk.0.attn_q.weight"]
    stop = offsets[offsets.index(start) + 1]
    with open(broken, "r+b") as handle:
        handle.seek(header_size + start)
        handle.write(bytes(stop - start))
    reference = TransformersReference(gguf_models["qwen3"], 200)
    report = verify(broken, reference, "f16", Thresholds(), arch="qwen3")
    assert not report.passed
    failed = {line.split(":")[0] for line in report.failures()}
    assert "nmse" in failed
    assert "nmse" in markdown([report]) and "**FAIL**" in markdown([report])
    verification_record([report], [], Thresholds()).write(tmp_path / "verification.json")
    written = GgufVerification.read(tmp_path / "verification.json")
    assert written.passed is False and any(not check["passed"] for check in written.files[0].checks)


def test_a_file_without_architecture_or_tokens_fails_verification_naming_them(gguf_models, our_ggufs, tmp_path):
    """Keys the converter must write and did not: failed checks in the report, not an exception."""
    broken = tmp_path / "no-keys.gguf"
    content = our_ggufs["qwen3", "f16"].read_bytes()
    for key in (b"general.architecture", b"tokenizer.ggml.tokens"):
        assert content.count(key) == 1
        content = content.replace(key, key[:-1] + b"X")  # the same length: every offset stays valid
    broken.write_bytes(content)
    report = verify(broken, TransformersReference(gguf_models["qwen3"], 200), "f16", Thresholds(), arch="qwen3")
    assert not report.passed
    failures = {line.split(":")[0]: line for line in report.failures()}
    assert "missing (general.architecture)" in failures["architecture"]
    assert "0 tokens" in failures["vocabulary"]


def test_wrong_pre_tokenizer_fails_verification(gguf_models, tmp_path):
    """Forcing Llama 3's pre-tokenizer onto SmolLM's vocabulary splits digits differently: caught."""
    path = convert(
        gguf_models["smollm3"], tmp_path / "wrong-pre.gguf", "f16", MetadataOptions(), pre_tokenizer="llama-bpe"
    ).path
    report = verify(path, TransformersReference(gguf_models["smollm3"], 200), "f16", Thresholds(), arch="smollm3")
    assert not report.passed
    assert any(failure.startswith("plain_tokens") for failure in report.failures())


def test_missing_chat_template_fails_verification(gguf_models, tmp_path):
    model = tmp_path / "no-template"
    shutil.copytree(gguf_models["qwen3"], model)
    (model / "chat_template.jinja").unlink()
    result = convert(model, tmp_path / "plain.gguf", "f16")
    assert any("no chat template" in note for note in result.notes)
    report = verify(result.path, TransformersReference(model, 200), "f16", Thresholds(), arch="qwen3")
    assert not report.passed
    assert {"chat_template", "chat_tokens", "end_of_turn"} <= {line.split(":")[0] for line in report.failures()}


def test_thresholds_depend_on_the_type():
    thresholds = Thresholds()
    assert thresholds.for_outtype("bf16") == (0.99, 1e-3)
    assert thresholds.for_outtype("q8_0") == (0.90, 1e-2)
    assert thresholds.for_outtype("q4_k_m") == (0.90, 1e-2)
    assert Thresholds.from_mapping({"quant_min_top1": "0.8"}).quant_min_top1 == 0.8
    assert np.isclose(Thresholds.from_mapping({}).float_max_nmse, 1e-3)
