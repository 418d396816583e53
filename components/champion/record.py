"""The record of the last published model on the workspace, for runs that cannot ask the Hub.

``<workspace_root>/published/<owner>--<name>.json`` for a repository, or
``published/dry-run.json`` when no repository is configured. Publishing (a dry
run too) writes it after the upload folder or commit is complete; the fingerprint
check of the next run reads it, and its evaluation loads the named run's upload
folder as the model to beat (``components.champion.published``). It only outlives a run on a persistent workspace
(an existing PVC passed as ``pvc_name``, or the local directory of ``make run``);
with a Hub repository and a token the model card on the Hub is the record.

Beside it, each published version has its delivery record (``DeliveryRecord``,
``runs/<run id>/publish/delivery.json``): the repository it was published to, and
which of the steps after publish (store, register, serve) completed for it. The
publish step writes it before its Hub commit, so a step that dies once the commit
landed still leaves one; a run that fails after publishing leaves it incomplete,
and the next run on the same data finishes those steps on that version instead of
skipping everything (``components.publish.changes`` says when it may).
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from common.atomic import write_json
from common.records import FORMAT_VERSION
from common.run_layout import DELIVERY, PUBLISH, PUBLISHED, REGISTER, SERVE, STORE, stage_dir

DRY_RUN_NAME = "dry-run"
# The format both records here are written in (common.records.FORMAT_VERSION names its key). A record of another
# format is read as none, said so in the log, like an unreadable one: the publish record then means the data
# changed (the run trains), the delivery record that nothing is known to be missing.
RECORD_FORMAT = 1
# The steps after publish, in the order the pipeline runs them; each adds itself to the version's delivery record
# when it completes.
DELIVERY_STEPS = (STORE, REGISTER, SERVE)
Step = TypeVar("Step", bound=Callable)


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
    """Record the publish of ``record.run_id``, once its commit (or dry-run folder) is complete: the next run's
    checks read this file. Its delivery record was started before the commit (``start_delivery``)."""
    path = record_path(workspace_root, record.repo_id)
    write_json(path, {FORMAT_VERSION: RECORD_FORMAT, **asdict(record)})
    return path


def read_record(workspace_root: str, repo_id: str) -> PublishedRecord | None:
    """The record for ``repo_id`` (or the dry run), or None when there is none or it is unreadable."""
    return _record_at(record_path(workspace_root, repo_id), "; training will run")


def published_records(workspace_root: str | Path) -> list[PublishedRecord]:
    """Every publish record on the workspace, one per repository and the dry run's; unreadable ones are left out."""
    records = (_record_at(path) for path in sorted((Path(workspace_root) / PUBLISHED).glob("*.json")))
    return [record for record in records if record is not None]


def _record_at(path: Path, consequence: str = "") -> PublishedRecord | None:
    try:
        return PublishedRecord(**_of_this_format(json.loads(path.read_text(encoding="utf-8"))))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        print(f"ignoring the unreadable publish record {path} ({error}){consequence}", flush=True)
        return None


@dataclass(frozen=True)
class DeliveryRecord:
    """Which of the steps after publish (``DELIVERY_STEPS``) completed for one published version, the run
    ``run_id``'s, and where that version was published.

    Written through this class only: by the publish step before its Hub commit, with none completed
    (``start_delivery``), again with the commit once it landed, then by each of store, register and serve as it
    completes (``completes``), each time whole and atomically. A record for a commit that never landed is harmless:
    no publish record names its run, and the next run finishes a version only when the workspace's publish record
    names it, or the Hub's model card is the very card that run committed (``components.publish.changes``). A
    version published before these records existed has none; nothing is then known to be missing, so nothing is
    redone for it.
    """

    run_id: str
    completed: dict[str, str] = field(default_factory=dict)  # step -> when it completed (ISO 8601, UTC)
    # The repository published to ("" for a dry run); None when no publish step wrote the record (a step after
    # publish started it for a version published before these records): such a record is never finished.
    repo_id: str | None = None
    # The run the workspace's publish record named when this publish began ("" for none): while the publish record
    # still names it, this publish died between its commit and its publish record.
    replaces: str = ""
    revision: str = ""  # the Hub commit, once the publish step saw it land ("" before, and for a dry run)

    @property
    def missing(self) -> tuple[str, ...]:
        """The steps after publish that have not completed for this version, in the order they run."""
        return tuple(step for step in DELIVERY_STEPS if step not in self.completed)

    @staticmethod
    def path(workspace_root: str | Path, run_id: str) -> Path:
        return stage_dir(workspace_root, run_id, PUBLISH) / DELIVERY

    @classmethod
    def read(cls, workspace_root: str | Path, run_id: str) -> DeliveryRecord | None:
        """The version's record, or None when it has none or it is unreadable (said so)."""
        path = cls.path(workspace_root, run_id)
        try:
            record = _of_this_format(json.loads(path.read_text(encoding="utf-8")))
            if record["run_id"] != run_id:
                raise ValueError(f"it is the record of run {record['run_id']!r}")
            return cls(
                run_id=run_id,
                completed=dict(record["completed"]),
                repo_id=record.get("repo_id"),
                replaces=str(record.get("replaces") or ""),
                revision=str(record.get("revision") or ""),
            )
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            print(f"ignoring the unreadable delivery record {path} ({error})", flush=True)
            return None

    def write(self, workspace_root: str | Path) -> Path:
        path = self.path(workspace_root, self.run_id)
        write_json(path, {FORMAT_VERSION: RECORD_FORMAT, **asdict(self)})
        return path

    def with_completed(self, step: str) -> DeliveryRecord:
        if step not in DELIVERY_STEPS:
            raise ValueError(f"unknown step {step!r}; the steps after publish are {', '.join(DELIVERY_STEPS)}")
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return replace(self, completed={**self.completed, step: when})


def _of_this_format(value: Any) -> dict[str, Any]:
    """``value`` (a record's JSON) without its format version; a record from before format versions (2026-11-28)
    holds the same fields. Raises ValueError for another format, TypeError for something that is not a record."""
    if not isinstance(value, dict):
        raise TypeError("it is not a JSON object")
    found = value.pop(FORMAT_VERSION, RECORD_FORMAT)
    if found != RECORD_FORMAT:
        raise ValueError(f"it is in format {found}, and this version of the pipeline reads format {RECORD_FORMAT}")
    return value


def start_delivery(workspace_root: str | Path, run_id: str, repo_id: str) -> DeliveryRecord:
    """Write run ``run_id``'s delivery record, nothing after publish completed, before its publish commits to
    ``repo_id`` (or, for a dry run, records its folder): a step killed once the commit landed still leaves the
    record the next run finishes the version by. A publish step that runs again starts its version's record anew."""
    previous = read_record(str(workspace_root), repo_id)
    record = DeliveryRecord(run_id, repo_id=repo_id, replaces=previous.run_id if previous else "")
    record.write(workspace_root)
    return record


def record_completed(workspace_root: str | Path, run_id: str, step: str) -> None:
    """Add ``step`` to the delivery record of run ``run_id``'s version (one is started when it has none: the step
    ran on a version published before these records)."""
    record = DeliveryRecord.read(workspace_root, run_id) or DeliveryRecord(run_id)
    record.with_completed(step).write(workspace_root)


def completed_at(workspace_root: str | Path, run_id: str, step: str) -> str | None:
    """When ``step`` completed for run ``run_id``'s version, None when it has not (or nothing says so)."""
    record = DeliveryRecord.read(workspace_root, run_id)
    return record.completed.get(step) if record else None


def completes(step: str) -> Callable[[Step], Step]:
    """Decorate a step function taking ``workspace_root`` and ``run_id``: when it returns, ``step`` is recorded as
    completed for that version; when it raises, nothing is, so the next run on the same data runs it again."""

    def decorate(function: Step) -> Step:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def run(*args, **kwargs):
            result = function(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            record_completed(bound["workspace_root"], bound["run_id"], step)
            return result

        return run  # type: ignore[return-value]

    return decorate
