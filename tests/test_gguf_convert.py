"""Our GGUF files against llama.cpp's own converter: bit-identical tensors, same metadata.

The reference is llama.cpp's ``convert_hf_to_gguf.py`` from the llama-cpp-python
sdist (see tests/llama_cpp_reference.py), run on the very same checkpoints:
SmolLM2-135M (Llama) and tiny random SmolLM3, Qwen2, Qwen3 and Mistral models,
in f32, f16, bf16 and q8_0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from gguf_export.reader import read_gguf
from tests.conftest import GGUF_COMPARED_TYPES, REPO_ROOT
from tests.gguf_files import first_difference

MODELS = ("smollm2", "smollm3", "qwen2", "qwen3", "mistral")
# Keys we write on purpose and llama.cpp's converter does not (see gguf_export/vocab.py).
OUR_EXTRA_KEYS = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_bos_token"}


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_tensors_are_bit_identical_to_llama_cpp(model, our_ggufs, reference_ggufs):
    for outtype in GGUF_COMPARED_TYPES:
        ours, theirs = read_gguf(our_ggufs[model, outtype]), read_gguf(reference_ggufs[model, outtype])
        assert first_difference(ours, theirs) is None, outtype


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_metadata_matches_llama_cpp(model, our_ggufs, reference_ggufs):
    for outtype in GGUF_COMPARED_TYPES:
        ours = read_gguf(our_ggufs[model, outtype]).metadata
        theirs = read_gguf(reference_ggufs[model, outtype]).metadata
        assert {k: v for k, v in ours.items() if k not in OUR_EXTRA_KEYS} == {
            k: v for k, v in theirs.items() if k not in OUR_EXTRA_KEYS
        }, outtype
    # The keys that may differ carry what the Hugging Face tokenizer does: SmolLM2's adds neither BOS nor EOS.
    assert ours["tokenizer.ggml.add_bos_token"] is False and ours["tokenizer.ggml.add_eos_token"] is False
    assert ours["tokenizer.ggml.eot_token_id"] == 2  # <|im_end|>, the end of a ChatML turn


def test_fallback_types_are_llama_cpps(our_ggufs):
    """1-D tensors and norms stay F32; rows that are not a multiple of 32 fall back to F16 (Mistral's ffn_down: 80)."""
    types = {
        name: GGMLQuantizationType(kind).name for name, _, kind, _ in read_gguf(our_ggufs["mistral", "q8_0"]).tensors
    }
    assert types["blk.0.ffn_down.weight"] == "F16"
    assert types["blk.0.ffn_up.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert types["output.weight"] == "Q8_0"


def test_conversion_never_imports_torch(gguf_models, tmp_path):
    """A subprocess whose import hook refuses torch (and transformers) converts SmolLM2 and a sharded bf16 model."""
    script = textwrap.dedent(
        f"""
        import sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers"):
                    raise ImportError("conversion imported " + name)
        sys.meta_path.insert(0, Refuse())
        from pathlib import Path
        from gguf_export.convert import convert
        convert(Path({str(gguf_models["smollm2"])!r}), Path({str(tmp_path / "a.gguf")!r}), "q8_0")
        convert(Path({str(gguf_models["mistral"])!r}), Path({str(tmp_path / "b.gguf")!r}), "bf16")
        print("converted without torch")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "converted without torch" in result.stdout
    assert (tmp_path / "a.gguf").stat().st_size > 100 * 2**20 and (tmp_path / "b.gguf").is_file()


def test_auto_picks_the_stored_16_bit_type(gguf_models, tmp_path):
    from gguf_export.convert import convert

    assert convert(gguf_models["mistral"], tmp_path / "m.gguf", "auto").outtype == "bf16"
    assert convert(gguf_models["qwen2"], tmp_path / "q.gguf", "auto", pre_tokenizer="qwen2").outtype == "f16"


def test_conversion_leaves_no_mapping_or_handle_on_the_checkpoint(gguf_models, tmp_path):
    """Once converted, the shards can be replaced or deleted: no mapping or open file of them is left behind."""
    from gguf_export.convert import convert

    checkpoint = shutil.copytree(gguf_models["mistral"], tmp_path / "mistral")  # sharded bf16
    convert(checkpoint, tmp_path / "m.gguf", "f16")
    shards = {str(path) for path in checkpoint.glob("*.safetensors")}
    assert len(shards) > 1
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if line.split()[-1] in shards]
    opened = [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
    opened = [path for path in opened if path in shards]
    assert mapped == [] and opened == []


def test_metadata_options_are_written(gguf_models, tmp_path):
    from gguf_export.convert import convert
    from gguf_export.metadata import MetadataOptions

    options = MetadataOptions(
        "knots-helper", "HuggingFaceTB/SmolLM2-135M-Instruct", "knots", "apache-2.0", "acme/knots-helper"
    )
    values = read_gguf(convert(gguf_models["qwen3"], tmp_path / "x.gguf", "f16", options).path).metadata
    assert values["general.name"] == "knots-helper"
    assert values["general.finetune"] == "knots"
    assert values["general.license"] == "apache-2.0"
    assert values["general.source.repo_url"] == "https://huggingface.co/acme/knots-helper"
    assert values["general.base_model.count"] == 1
    assert values["general.base_model.0.repo_url"] == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"
    assert values["general.size_label"]
