"""Where the ranks read the base model from: one download per job, then the shared cache.

Every rank calling ``from_pretrained`` on a Hub id at once means N downloads of
the same gigabytes into one cache on the workspace volume, with the ranks racing
on its files (file locks are not reliable on every ReadWriteMany filesystem).
Instead rank 0 downloads the snapshot (weights, config, tokenizer) alone while
the others wait for it, then every rank loads that local directory. The
revision is pinned by ``--base-model-revision`` and the commit actually used is
recorded in ``training_summary.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from common.errors import UserError, one_line
from trainer import distributed
from trainer.distributed import Topology
from trainer.methods import Method

# What from_pretrained needs of a Hub model: configs, safetensors weights, tokenizer files. Not the duplicates many
# repositories also hold (pytorch_model.bin, original/consolidated.pth, GGUF files).
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")
# How long the other ranks wait for rank 0's download: far beyond the training collectives' timeout, which is
# meant to catch a lost peer, not a 30 GB download.
DOWNLOAD_WAIT_MINUTES = 180


# What a tokenizer needs of a Hub model: the tokenise step fetches these alone, not the weights.
TOKENIZER_FILES = ("*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken")


def download(model: str, revision: str) -> Path:
    """The snapshot of Hub model ``model`` at ``revision`` (empty: the default branch), downloaded if not cached."""
    path = _snapshot(model, revision, MODEL_FILES)
    if not any(path.glob("*.safetensors")):
        raise UserError(
            f"The base model {model!r} has no safetensors weights, which the trainer loads. Convert it, or choose "
            "a repository that publishes *.safetensors."
        )
    return path


def tokenizer_dir(model: str, revision: str, hub_cache: Path | None = None) -> Path:
    """A directory holding ``model``'s tokenizer: the local checkpoint, or its Hub files (no weights) in
    ``hub_cache`` (default: the Hub's own cache)."""
    if Path(model).is_dir():
        _check_no_revision(model, revision)
        return Path(model)
    return _snapshot(model, revision, TOKENIZER_FILES, hub_cache)


def _snapshot(model: str, revision: str, patterns: tuple[str, ...], hub_cache: Path | None = None) -> Path:
    try:
        return Path(
            snapshot_download(model, revision=revision or None, allow_patterns=list(patterns), cache_dir=hub_cache)
        )
    except (RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError, LocalEntryNotFoundError) as error:
        detail = one_line(error, 300)
        raise UserError(
            f"Could not download the base model {model!r} at revision {revision or 'main'!r} from the Hugging Face "
            f"Hub ({detail}). Check the id and the revision; a gated or private model needs a token with access in "
            "the hf-read-token Secret (HF_TOKEN); without network access (HF_HUB_OFFLINE=1), give a local checkpoint "
            "directory instead."
        ) from None


def local_copy(model: str, revision: str, topology: Topology) -> Path:
    """A directory holding the base model: ``model`` itself, or its Hub snapshot fetched once for all ranks."""
    if Path(model).is_dir():
        _check_no_revision(model, revision)
        return Path(model)
    path = str(download(model, revision)) if topology.is_main else None
    return Path(distributed.from_main(path, DOWNLOAD_WAIT_MINUTES))


def check_unquantised(source: Path, model: str, method: Method) -> None:
    """Refuse a base stored in bitsandbytes' 4 or 8 bits (its config.json's ``quantization_config``) for lora and
    full: their ranks run without bitsandbytes (trainer/unused_packages.py), so transformers would fail to load it
    with a misleading "install bitsandbytes", and their result is merged into the base's own weights. Other
    schemes are left to transformers, as before."""
    config = source / "config.json"
    settings = json.loads(config.read_text()) if config.is_file() else {}  # none: from_pretrained says so
    quantisation = settings.get("quantization_config") or {}
    if not method.quantised_base and quantisation.get("quant_method") == "bitsandbytes":
        raise UserError(
            f"The base model {model!r} is stored quantised (bitsandbytes, in its config.json), and method "
            f"{method.name} trains and merges unquantised weights. Choose the model's unquantised release as "
            "base_model (method qlora holds an unquantised base in 4-bit NF4 itself)."
        )


def _check_no_revision(model: str, revision: str) -> None:
    if revision:
        raise UserError(
            f"--base-model-revision {revision!r} pins a Hub revision, but --model {model} is a local directory. "
            "Leave the revision empty, or give a Hub id."
        )


def snapshot_commit(path: Path) -> str | None:
    """The commit a Hub snapshot directory holds (its name in the cache), or None for a local checkpoint."""
    return path.name if path.parent.name == "snapshots" else None
