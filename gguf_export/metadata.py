"""The ``general.*`` metadata: name, base model, fine-tune, license, size label, source repository.

``gguf.Metadata`` derives what it can from the checkpoint directory (model card
front matter, config.json, the directory name), exactly as llama.cpp's
converter does; explicit options override it, because a pipeline knows better
than a directory called ``merged`` what the model is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

HUB = "https://huggingface.co/"


@dataclass(frozen=True)
class MetadataOptions:
    """Explicit values for general.* keys; empty means "derive from the checkpoint"."""

    model_name: str = ""
    base_model: str = ""
    finetune: str = ""
    license: str = ""
    source_repo: str = ""


def repo_url(repo: str) -> str:
    """A Hub id (``org/name``) as its URL; URLs pass through."""
    return repo if "://" in repo else HUB + repo.strip("/")


def model_metadata(model_dir: Path, options: MetadataOptions, parameters: tuple[int, int, int, int]) -> gguf.Metadata:
    total = parameters[0]
    metadata = gguf.Metadata.load(None, model_dir, options.model_name or None, total)
    if metadata.name is None:
        metadata.name = model_dir.name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(*parameters)
    if options.base_model:
        card = {"base_model": repo_url(options.base_model)}
        metadata.base_models = gguf.Metadata.apply_metadata_heuristic(
            gguf.Metadata(), card, None, None, total
        ).base_models
    if options.finetune:
        metadata.finetune = options.finetune
    if options.license:
        metadata.license = options.license
    if options.source_repo:
        metadata.source_repo_url = repo_url(options.source_repo)
    return metadata
