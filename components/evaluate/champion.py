"""The champion: the model published before this run, loaded to be scored exactly as the new one.

A scheduled retrain must beat the model users already have, not only its base.
That model is found where the publish step put it (``components.champion.published``):
the Hub repository at its current commit, or the upload folder of the run the
workspace's publish record names. It is loaded the way it was published: the
merged checkpoint when the repository holds one, which is exactly what the new
model is scored as, else the LoRA adapter (``adapter/``) merged into its base
model at the commit its training used (``training_summary.json``).

A published model that cannot be loaded or compared is an error
(``ChampionUnavailable``) naming what is missing and the fix, never a silent
pass: a model the gate could not compare with must not be replaced unseen.
``force`` is the way out the error names, and the report then says the new
model was published without that comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from common.errors import UserError, one_line
from common.records import TrainingSummary
from common.run_layout import ADAPTER, TRAINING_SUMMARY
from components.champion.hub import hub_errors
from components.champion.published import PublishedModel
from components.evaluate.models import load_model, load_tokenizer

# What loading needs from a published repository: the merged checkpoint, the adapter and the training record.
# The GGUFs, reports and Modelfile are left on the Hub.
NOT_DOWNLOADED = ["*.gguf", "Modelfile", "evaluation/*", "verification/*", "*.png", "README.md"]
FORCE_FIX = "Or set force=true for this run to publish the new model without comparing it with the published one."
# A published training summary the pipeline cannot read names the base the adapter needs only unreliably.
PUBLISHED_SUMMARY_FIX = (
    "It names the base model the published adapter was trained on, so the published model cannot be loaded to compare "
    "the new one with it: restore the file from the repository's history. " + FORCE_FIX
)


class ChampionUnavailable(UserError):
    """The published model exists but cannot be scored; the message says why and what to do."""


@dataclass(frozen=True)
class PublishedTarget:
    """Where the model users have now is looked for, and whether the run may publish without beating it."""

    repo_id: str  # the run's hub_repo_id; empty: the dry-run record
    workspace_root: str
    force: bool


@dataclass(frozen=True)
class Champion:
    """A published model ready to score: how to load it, and what the report calls it."""

    published: PublishedModel
    kind: str  # "merged checkpoint" or "LoRA adapter on <base>"
    load: Callable[[], PreTrainedModel]
    tokenizer: Callable[[], PreTrainedTokenizerBase]

    def entry(self) -> dict[str, Any]:
        """Who the champion is, for evaluation.json (the publish step checks it is still the published model)."""
        return {**self.published.entry(), "loaded_as": self.kind}


def published_files(published: PublishedModel, token: str | None) -> Path:
    """A local directory holding the published files: the upload folder, or a download of the Hub commit."""
    if not published.on_hub:
        assert published.folder is not None
        if not published.folder.is_dir():
            raise ChampionUnavailable(
                f"The published model cannot be loaded to compare the new one with it: {published.description}, "
                "but that folder is gone (deleted, or on a PVC that was not kept). Restore it, or delete the "
                "publish record so that the next publish starts a new history. " + FORCE_FIX
            )
        return published.folder
    from huggingface_hub import constants, snapshot_download

    with hub_errors(f"download the published model {published.repo_id}", constants.ENDPOINT):
        try:
            return Path(
                snapshot_download(
                    published.repo_id, revision=published.revision, token=token, ignore_patterns=NOT_DOWNLOADED
                )
            )
        except OSError as error:  # huggingface_hub's own failures (connection, 5xx after its retries), a full disk
            raise UserError(
                f"Could not download the published model ({published.description}) to compare the new one with it: "
                f"{one_line(error, 300)}. Check that the step can reach the Hub (HF_ENDPOINT for a "
                "mirror) and has disk space for the model, then start the run again."
            ) from None


def champion_from(published: PublishedModel, files: Path) -> Champion:
    """How to load what ``files`` holds: the merged checkpoint, else the adapter on its base."""
    if (files / "config.json").is_file() and any(files.glob("*.safetensors")):
        return Champion(
            published, "merged checkpoint", lambda: _merged(files, published), lambda: load_tokenizer(files)
        )
    adapter = files / ADAPTER
    if not (adapter / "adapter_config.json").is_file():
        raise ChampionUnavailable(
            f"The published model cannot be loaded to compare the new one with it: {published.description} holds "
            "neither a merged checkpoint (config.json and *.safetensors at the top) nor a LoRA adapter "
            "(adapter/adapter_config.json). Restore them (a repository's earlier revisions are listed in its model "
            "card), and publish with publish_adapter or publish_merged on so the next run can compare. " + FORCE_FIX
        )
    base, revision = adapter_base(files)
    return Champion(
        published,
        f"LoRA adapter on {base}",
        lambda: _with_adapter(adapter, base, revision, published),
        lambda: load_tokenizer(base, revision),
    )


def adapter_base(files: Path) -> tuple[str, str | None]:
    """The base model the adapter was trained on, and its Hub commit: the published training_summary.json, else
    the adapter's own record of it."""
    try:
        summary = TrainingSummary.read(files / TRAINING_SUMMARY, fix=PUBLISHED_SUMMARY_FIX)
    except UserError as error:
        raise ChampionUnavailable(str(error)) from None
    if summary:
        return summary.base_model, summary.base_model_commit
    config = _json_of(files / ADAPTER / "adapter_config.json")
    return str(config.get("base_model_name_or_path", "")), config.get("revision")


def _json_of(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is absent; unreadable (corrupt, an LFS pointer) is unavailable."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ChampionUnavailable(
            f"The published model's {path.name} ({path}) is not valid JSON ({error}), so the model cannot be loaded "
            "to compare the new one with it. Restore the file. " + FORCE_FIX
        ) from None
    return value if isinstance(value, dict) else {}


def _merged(files: Path, published: PublishedModel) -> PreTrainedModel:
    try:
        return load_model(files)
    except (UserError, OSError, ValueError, RuntimeError) as error:
        raise ChampionUnavailable(
            f"The published merged checkpoint in {published.description} does not load "
            f"({one_line(error, 300)}). " + FORCE_FIX
        ) from None


def _with_adapter(adapter: Path, base: str, revision: str | None, published: PublishedModel) -> PreTrainedModel:
    from peft import PeftModel

    try:
        model = load_model(base, revision)
    except (UserError, OSError, ValueError, RuntimeError) as error:
        raise ChampionUnavailable(
            f"The published model's base cannot be loaded, so the published LoRA adapter ({published.description}) "
            f"cannot be compared with the new model: {error} " + FORCE_FIX
        ) from None
    try:
        return PeftModel.from_pretrained(model, adapter).merge_and_unload()
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise ChampionUnavailable(
            f"The published LoRA adapter in {published.description} does not load on its base model {base} "
            f"({type(error).__name__}: {one_line(error, 300)}). " + FORCE_FIX
        ) from None


def check_comparable(champion: Champion, tokenizer: PreTrainedTokenizerBase) -> None:
    """Losses over the same token ids compare only when both models read them the same way."""
    try:
        published_tokenizer = champion.tokenizer()
    except (UserError, OSError, ValueError) as error:
        raise ChampionUnavailable(
            f"The published model's tokenizer ({champion.published.description}) does not load: {error} " + FORCE_FIX
        ) from None
    if published_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ChampionUnavailable(
            f"The published model ({champion.published.description}, {champion.kind}) has a different vocabulary "
            "from the new model, so their losses cannot be compared: the base model changed between the runs. "
            "Start a new history: publish to a new repository (hub_repo_id), or without one delete the publish "
            "record. " + FORCE_FIX
        )
