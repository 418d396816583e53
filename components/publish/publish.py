"""The publish stage: build the upload folder, then commit it to the Hub, or stop there (dry run).

A dry run happens when no repository is configured (``hub_repo_id`` empty):
``make run`` and any run that publishes nothing. It writes the same folder a
real publish uploads, so it can be inspected. A repository without a token in
the environment (the ``hf-token`` Secret, mounted in this step alone) is refused,
never dry-run: the steps after publish would still store, register and deploy a
model that was not published (``components.hub_auth.missing_token``).

The model published now must be the one the evaluation compared the new model
with (``published_model`` in evaluation.json): a run that was overtaken by
another publish stops here instead of replacing a model it never beat. The
model card carries the history of the card it replaces, extended by this run.

The version's delivery record (``components.champion.record.DeliveryRecord``) is
written before the commit and the workspace's publish record after it, so a step
that dies once the commit landed leaves a version the next run can deliver.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from huggingface_hub import HfApi

from common.errors import UserError
from common.records import EvaluationResult
from components.champion.card import read_history
from components.champion.hub import head_revision
from components.champion.published import PublishedModel, find_published, publish_identity
from components.champion.record import PublishedRecord, start_delivery, write_record
from components.champion.version import RunDirs, read_run_outputs
from components.hub_auth import missing_token
from components.publish.bundle import upload_plan, write_upload_folder
from components.publish.hub import publish_folder
from components.publish.model_card import CardContext, render_model_card
from components.publish.options import PublishOptions


@dataclass(frozen=True)
class PublishResult:
    dry_run: bool
    upload_dir: Path
    files: list[str]  # paths in the repository, README.md included
    total_bytes: int
    location: str  # the commit URL, or the upload folder of a dry run
    record_path: Path


@dataclass(frozen=True)
class Upload:
    """The folder a publish commits (and a dry run stops at), as written."""

    folder: Path
    files: list[str]  # paths in the repository, README.md included
    total_bytes: int
    fingerprint: str
    published_at: str  # ISO 8601, in the card's history and the record


def publish(
    workspace_root: str, run_id: str, dataset_uri: str, options: PublishOptions, token: str | None
) -> PublishResult:
    """Publish run ``run_id``'s model; ``token`` is the Hub token from the environment, or None.

    Without ``options.repo_id`` this is a dry run; with it and no token, ``UserError`` (nothing is written).
    """
    if options.repo_id and not token:
        raise UserError(missing_token(options.repo_id, writes=True))
    previous = find_published(options.repo_id, workspace_root, token, options)
    upload = build_upload(workspace_root, run_id, dataset_uri, options, previous)
    dry_run = not options.repo_id
    # Before the commit: once the commit lands, the version is published, and a step killed right after it must
    # still leave the record by which the next run delivers it.
    delivery = start_delivery(workspace_root, run_id, options.repo_id)
    if dry_run:
        print(
            "dry run: no repository id is set (repo_id); nothing was uploaded. The folder that would be uploaded is "
            f"{upload.folder}",
            flush=True,
        )
        location = str(upload.folder)
    else:
        location = _commit(upload, options, run_id, token, previous)
        replace(delivery, revision=commit_of(location)).write(workspace_root)
    record = PublishedRecord(
        repo_id=options.repo_id,
        uploaded=not dry_run,
        data_fingerprint=upload.fingerprint,
        run_id=run_id,
        location=location,
        published_at=upload.published_at,
    )
    return PublishResult(
        dry_run, upload.folder, upload.files, upload.total_bytes, location, write_record(workspace_root, record)
    )


def build_upload(
    workspace_root: str,
    run_id: str,
    dataset_uri: str,
    options: PublishOptions,
    previous: PublishedModel | None,
) -> Upload:
    """Check that run ``run_id`` may replace ``previous`` (the model published now), then write its upload folder.

    Touches no Hub: this is all of a dry run, and what a publish commits.
    """
    dirs = RunDirs.of(workspace_root, run_id)
    outputs = read_run_outputs(dirs)
    if not outputs.gate_passed and not options.publish_if_gate_failed:
        raise UserError(
            "The evaluation gate of this run failed "
            f"({outputs.evaluation.gate.reason}), "
            "so the model is not published. Improve the run, or set publish_if_gate_failed to publish it anyway."
        )
    check_still_published(outputs.evaluation, previous, run_id)
    published_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    history = history_after(
        previous,
        {
            "run_id": run_id,
            "published_at": published_at,
            "data_fingerprint": outputs.fingerprint,
            "eval_loss": outputs.evaluation.fine_tuned.eval_loss,
        },
    )
    plan = upload_plan(dirs, outputs, options)
    card = render_model_card(outputs, options, CardContext(options.repo_id, run_id, dataset_uri, list(plan), history))
    write_upload_folder(plan, card, dirs.upload)
    files = sorted(path.relative_to(dirs.upload).as_posix() for path in dirs.upload.rglob("*") if path.is_file())
    total_bytes = sum((dirs.upload / name).stat().st_size for name in files)
    return Upload(dirs.upload, files, total_bytes, outputs.fingerprint, published_at)


def _commit(upload: Upload, options: PublishOptions, run_id: str, token: str, previous: PublishedModel | None) -> str:
    """Commit ``upload`` to ``options.repo_id`` on top of the commit the evaluation compared with; its URL."""
    print(
        f"uploading {len(upload.files)} files ({upload.total_bytes / 1e6:.1f} MB) to {options.repo_id} as one commit",
        flush=True,
    )
    api = HfApi(token=token)
    location = publish_folder(
        api,
        options.repo_id,
        upload.folder,
        options,
        message=f"Publish the model of pipeline run {run_id}",
        description=f"Data fingerprint {upload.fingerprint}. Built by llm-finetune-pipeline.",
        # On top of the commit compared with; a repository without a model yet: its head, so nothing lands
        # unseen in between either.
        parent_commit=previous.revision if previous else head_revision(api, options.repo_id, options),
    )
    print(f"published: {location}", flush=True)
    return location


def commit_of(location: str) -> str:
    """The commit id in a Hub commit URL (``.../commit/<sha>``); empty when ``location`` is not one."""
    _, found, commit = location.rstrip("/").rpartition("/commit/")
    return commit if found else ""


def check_still_published(evaluation: EvaluationResult, previous: PublishedModel | None, run_id: str) -> None:
    """Refuse when a model is published now that is neither the one the evaluation compared the new model with nor
    this run's own (a publish step that runs again). With nothing published, there is nothing to be worse than."""
    compared = evaluation.published_model
    compared_identity = publish_identity(compared) if compared else None
    if previous is None or compared_identity == previous.identity or previous.run_id == run_id:
        return
    searched = evaluation.published_search
    if searched is None:
        looked = "did not look for a published model (it ran without --workspace-root)"
    elif compared:
        looked = f"compared the new model with {compared['description']}"
    else:
        where = f"the Hub repository {searched['repo_id']}" if searched.get("on_hub") else "the workspace's record"
        looked = f"found no published model in {where}"
    raise UserError(
        f"This run's evaluation {looked}, but {previous.description} is published now. The new model was never "
        "compared with it, so it is not published. Start the run again: its evaluation then compares the new model "
        "with the model published now (from the command line, evaluate again with --workspace-root and the same "
        "--repo-id and HF_TOKEN this publish uses)."
    )


def history_after(previous: PublishedModel | None, entry: dict) -> list[dict]:
    """The history the card being replaced lists, then ``entry``.

    Its last entry gets the Hub commit that card was found at (a publish cannot know its own commit before it
    lands); a model published without a history (by hand, or before the history existed) gets an entry of its own,
    so the model being replaced is always listed; a run publishing again replaces its own entry.
    """
    if previous is None:
        return [entry]
    history = read_history(previous.card) if previous.card else []
    if not history:
        history = [
            {
                "run_id": previous.run_id,
                "published_at": previous.published_at,
                "data_fingerprint": previous.data_fingerprint,
                "eval_loss": None,
            }
        ]
    if history[-1].get("run_id") == entry["run_id"]:
        history.pop()
    elif previous.revision and not history[-1].get("revision"):
        history[-1]["revision"] = previous.revision
    return [*history, entry]
