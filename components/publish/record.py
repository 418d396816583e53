"""The record of the last published model on the workspace, for runs that cannot ask the Hub.

``<workspace_root>/published/<owner>--<name>.json`` for a repository, or
``published/dry-run.json`` when no repository is configured. Publishing (a dry
run too) writes it after the upload folder or commit is complete; the fingerprint
check of the next run reads it, and its evaluation loads the named run's upload
folder as the model to beat (``components.publish.published``). It only outlives a run on a persistent workspace
(an existing PVC passed as ``pvc_name``, or the local directory of ``make run``);
with a Hub repository and a token the model card on the Hub is the record.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from common.atomic import write_json
from common.run_layout import PUBLISHED

DRY_RUN_NAME = "dry-run"


@dataclass(frozen=True)
class PublishedRecord:
    repo_id: str  # empty for a dry run without a repository
    uploaded: bool  # False for a dry run
    data_fingerprint: str
    run_id: str
    location: str  # the commit URL, or the upload folder of a dry run
    published_at: str  # ISO 8601, UTC


def record_path(workspace_root: str, repo_id: str) -> Path:
    name = repo_id.replace("/", "--") if repo_id else DRY_RUN_NAME
    return Path(workspace_root) / PUBLISHED / f"{name}.json"


def write_record(workspace_root: str, record: PublishedRecord) -> Path:
    path = record_path(workspace_root, record.repo_id)
    write_json(path, asdict(record))
    return path


def read_record(workspace_root: str, repo_id: str) -> PublishedRecord | None:
    """The record for ``repo_id`` (or the dry run), or None when there is none or it is unreadable."""
    path = record_path(workspace_root, repo_id)
    try:
        return PublishedRecord(**json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError) as error:
        print(f"ignoring the unreadable publish record {path} ({error}); training will run", flush=True)
        return None
