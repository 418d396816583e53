"""Bad input to ``python -m gguf_export``: one readable paragraph, exit status 2, nothing half-written.

Every case runs the real CLI in a subprocess on a real (broken copy of a)
checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_module


def broken_copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def convert_cli(model: Path, outfile: Path, *extra: str, env: dict | None = None):
    return run_module("gguf_export", model, "--outfile", outfile, *extra, env=env, timeout=300)


def assert_user_error(result, *phrases: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for phrase in phrases:
        assert phrase in " ".join(result.stderr.split()), (phrase, result.stderr)


def no_gguf_left(directory: Path) -> bool:
    return not list(directory.glob("*.gguf"))


def test_missing_config_json(gguf_models, tmp_path):
    model = broken_copy(gguf_models["qwen3"], tmp_path / "model")
    (model / "config.json").unlink()
    result = convert_cli(model, tmp_path / "out" / "x.gguf")
    assert_user_error(result, "has no config.json", "merged/")
    assert not (tmp_path / "out").exists() or no_gguf_left(tmp_path / "out")


def test_missing_tokenizer_files(gguf_models, tmp_path):
    model = broken_copy(gguf_models["qwen3"], tmp_path / "model")
    (model / "tokenizer.json").unlink()
    assert_user_error(convert_cli(model, tmp_path / "x.gguf"), "no tokenizer.json", "tokenizer files are missing")
    assert no_gguf_left(tmp_path)


def test_truncated_safetensors(gguf_models, tmp_path):
    model = broken_copy(gguf_models["qwen3"], tmp_path / "model")
    weights = model / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size - 1000)
    assert_user_error(
        convert_cli(model, tmp_path / "x.gguf"), "model.safetensors is truncated", "download the checkpoint again"
    )
    assert no_gguf_left(tmp_path)


def test_vocab_size_mismatch_with_tokenizer(gguf_models, tmp_path):
    model = broken_copy(gguf_models["qwen3"], tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["vocab_size"] = 1000
    (model / "config.json").write_text(json.dumps(config))
    assert_user_error(convert_cli(model, tmp_path / "x.gguf"), "Vocabulary size mismatch", "vocab_size 1000")


def test_vocab_size_mismatch_with_embeddings(gguf_models, tmp_path):
    model = broken_copy(gguf_models["qwen3"], tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["vocab_size"] += 64
    (model / "config.json").write_text(json.dumps(config))
    assert_user_error(
        convert_cli(model, tmp_path / "x.gguf"), "Vocabulary size mismatch", "embedding matrix has 49152 rows"
    )


def test_unknown_architecture_lists_the_supported_ones(gguf_models, tmp_path):
    model = broken_copy(gguf_models["qwen3"], tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GraniteForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    env = {key: value for key, value in os.environ.items() if key != "LLAMA_CPP_DIR"}
    result = convert_cli(model, tmp_path / "x.gguf", env=env)
    assert_user_error(
        result,
        "'GraniteForCausalLM' is not supported",
        "LlamaForCausalLM, MistralForCausalLM, SmolLM3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM",
        "LLAMA_CPP_DIR",
    )


@pytest.mark.slow
def test_unknown_architecture_is_delegated_to_llama_cpp(smollm2_dir, tmp_path):
    """With LLAMA_CPP_DIR set, a Granite checkpoint is converted by llama.cpp's script and loads in llama.cpp."""
    import torch
    from llama_cpp import Llama
    from transformers import AutoTokenizer, GraniteConfig, GraniteForCausalLM

    from tests.llama_cpp_reference import reference_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    model = GraniteForCausalLM(
        GraniteConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        )
    )
    model.save_pretrained(tmp_path / "granite")
    tokenizer.save_pretrained(tmp_path / "granite")
    result = convert_cli(
        tmp_path / "granite",
        tmp_path / "out" / "granite.gguf",
        "--outtype",
        "f16",
        env={**os.environ, "LLAMA_CPP_DIR": str(reference_dir())},
    )
    assert result.returncode == 0, result.stderr
    assert "converting with" in result.stderr and "convert_hf_to_gguf.py" in result.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["granite.gguf"]
    llm = Llama(str(tmp_path / "out" / "granite.gguf"), verbose=False)
    try:
        assert llm.n_vocab() == len(tokenizer)
        assert llm.tokenize(b"hello world", add_bos=False) == tokenizer("hello world")["input_ids"]
    finally:
        llm.close()


def test_smollm3_with_another_no_rope_pattern_is_refused(gguf_models, tmp_path):
    model = broken_copy(gguf_models["smollm3"], tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["no_rope_layers"] = [1, 1, 0, 1]
    (model / "config.json").write_text(json.dumps(config))
    assert_user_error(convert_cli(model, tmp_path / "x.gguf"), "no_rope_layers is [1, 1, 0, 1]", "every fourth layer")


def test_unknown_tokenizer_names_the_override(gguf_models, tmp_path):
    """The tiny Qwen2 model's tokenizer (SmolLM2 vocabulary, Qwen pre-tokenizer) is in no table."""
    result = convert_cli(gguf_models["qwen2"], tmp_path / "x.gguf")
    assert_user_error(result, "not one of the known families", "--pre-tokenizer NAME")
    assert (
        convert_cli(
            gguf_models["qwen2"], tmp_path / "x.gguf", "--pre-tokenizer", "qwen2", "--outtype", "f16"
        ).returncode
        == 0
    )


def test_bad_outtype_is_refused(gguf_models, tmp_path):
    result = convert_cli(gguf_models["qwen3"], tmp_path / "x.gguf", "--outtype", "q3_k")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_k_quants_without_llama_cpp_name_the_extra(gguf_models, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "llama_cpp":
                    raise ImportError("no llama_cpp here")
        sys.meta_path.insert(0, Refuse())
        from gguf_export.__main__ import main
        main([{str(gguf_models["qwen3"])!r}, "--outfile", {str(tmp_path / "k.gguf")!r}, "--outtype", "Q4_K_M"])
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert_user_error(result, "pip install llama-cpp-python", "q8_0")
    assert no_gguf_left(tmp_path)


@pytest.mark.slow
def test_interrupted_write_leaves_no_finished_looking_file(smollm2_dir, tmp_path):
    """SIGKILL in the middle of writing: only a hidden .partial remains, and the next run removes it."""
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "gguf_export",
        str(smollm2_dir),
        "--outfile",
        str(out / "smollm2.gguf"),
        "--outtype",
        "f32",
    ]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            partial = list(out.glob(".*.partial")) if out.exists() else []
            if partial and partial[0].stat().st_size > 50 * 2**20:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the conversion never started writing")
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    leftovers = list(out.iterdir())
    assert no_gguf_left(out)
    assert leftovers and all(path.name.startswith(".") and path.name.endswith(".partial") for path in leftovers)
    result = convert_cli(smollm2_dir, out / "smollm2.gguf", "--outtype", "q8_0")
    assert result.returncode == 0, result.stderr
    assert [path.name for path in out.iterdir()] == ["smollm2.gguf"]
