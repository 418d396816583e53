"""The model users have now: where the last publish of a repository (or of dry runs) can be found.

Three steps ask about it: the data-change check (is its data fingerprint the
prepared data's?), the evaluation (the champion the new model must beat) and
the publish step (has it changed since the evaluation compared against it?). All
three find it the same way: on the Hub when a repository is set, since the Hub
is then where users get the model; else (no repository: a dry run) from the
publish record on the workspace, which names the run whose ``publish/upload/``
folder holds exactly what would have been uploaded. A repository without a
token is refused (``components.hub_auth.missing_token``): the Hub's model could
not be read, and looking anywhere else would let a run replace it unseen.

A Hub repository holds a published model when it holds model files (safetensors,
GGUF, an adapter), whoever put them there: a repository with only a README is
empty, one with weights but no card of ours is a model the next publish would
replace, so it must be compared with too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi

from common.errors import UserError
from common.records import SourceLineage
from common.run_layout import PUBLISH, UPLOAD, stage_dir
from components.champion.card import CARD_NAME, read_fingerprint, read_history, read_lineage
from components.champion.hub import head_revision, published_card, repository_files
from components.champion.record import read_record, record_path
from components.champion.retries import DefaultRetries, Retries
from components.hub_auth import missing_token


@dataclass(frozen=True)
class PublishedModel:
    """The last published model of a repository, or of the dry runs."""

    description: str  # for logs and reports: "the model card of o/n at commit abc1234", "the publish of run ..."
    data_fingerprint: str | None
    run_id: str | None  # the pipeline run that published it (None for a Hub card this pipeline did not write)
    repo_id: str  # empty for dry runs without a repository
    revision: str | None  # the Hub commit; None for a workspace publish
    folder: Path | None  # the upload folder of a workspace publish; None on the Hub
    card: str | None  # the model card text, None when there is none (or a workspace folder has lost it)
    published_at: str | None  # ISO 8601, from the workspace record; on the Hub, the card's history says

    @property
    def data_lineage(self) -> tuple[SourceLineage, ...]:
        """Its data's sources as its card records them; none for a card from before lineage, or no card."""
        return read_lineage(self.card) if self.card else ()

    @property
    def on_hub(self) -> bool:
        return self.revision is not None

    @property
    def identity(self) -> str:
        return publish_identity(self.entry())

    def entry(self) -> dict[str, Any]:
        """Which publish this is, as evaluation.json records it for the publish step's check."""
        return {"description": self.description, "run_id": self.run_id, "revision": self.revision}


def publish_identity(entry: dict[str, Any]) -> str:
    """What identifies a publish (``PublishedModel.entry``): the Hub commit, else the run that wrote the record."""
    return entry.get("revision") or f"run {entry.get('run_id')}"


def find_published(
    repo_id: str, workspace_root: str, token: str | None, retries: Retries = DefaultRetries()
) -> PublishedModel | None:
    """The last published model, or None when nothing was published yet (no model card, no record).

    Raises ``UserError`` when ``repo_id`` is set without a ``token``.
    """
    if repo_id and not token:
        raise UserError(missing_token(repo_id))
    if repo_id:
        api = HfApi(token=token)
        revision = head_revision(api, repo_id, retries)
        if revision is None or not any(
            is_model_file(name) for name in repository_files(api, repo_id, revision, retries)
        ):
            return None
        card = published_card(api, repo_id, retries, revision)
        history = read_history(card) if card else []
        return PublishedModel(
            description=f"the model card of {repo_id} at commit {revision[:12]}",
            data_fingerprint=read_fingerprint(card) if card else None,
            run_id=history[-1].get("run_id") if history else None,
            repo_id=repo_id,
            revision=revision,
            folder=None,
            card=card,
            published_at=history[-1].get("published_at") if history else None,
        )
    record = read_record(workspace_root, repo_id)
    if record is None:
        return None
    folder = stage_dir(workspace_root, record.run_id, PUBLISH) / UPLOAD
    card_path = folder / CARD_NAME
    return PublishedModel(
        description=f"the publish of run {record.run_id} recorded in {record_path(workspace_root, repo_id)} "
        f"(files in {folder})",
        data_fingerprint=record.data_fingerprint,
        run_id=record.run_id,
        repo_id=repo_id,
        revision=None,
        folder=folder,
        card=card_path.read_text(encoding="utf-8") if card_path.is_file() else None,
        published_at=record.published_at,
    )


def is_model_file(path_in_repo: str) -> bool:
    """Weights a publish uploads (or a person did): what makes a repository hold a model."""
    return path_in_repo.endswith((".safetensors", ".gguf", ".bin")) or path_in_repo.endswith("adapter_config.json")
