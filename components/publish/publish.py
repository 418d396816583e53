"""The publish stage: build the upload folder, then commit it to the Hub, or stop there (dry run).

A dry run happens when no repository is configured or no token is in the
environment: ``make run`` and any cluster run without the ``hf-token`` Secret.
It writes the same folder a real publish uploads, so it can be inspected.

The model published now must be the one the evaluation compared the new model
with (``published_model`` in evaluation.json): a run that was overtaken by
another publish stops here instead of replacing a model it never beat. The
model card carries the history of the card it replaces, extended by this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from huggingface_hub import HfApi

from common.errors import UserError
from components.hub_auth import SECRET_NAME, TOKEN_ENV
from components.publish.bundle import RunDirs, read_run_outputs, upload_plan, write_upload_folder
from components.publish.hub import publish_folder
from components.publish.model_card import CardContext, extended_history, render_model_card
from components.publish.options import PublishOptions
from components.publish.published import PublishedModel, find_published
from components.publish.record import PublishedRecord, write_record


@dataclass(frozen=True)
class PublishResult:
    dry_run: bool
    upload_dir: Path
    files: list[str]  # paths in the repository, README.md included
    total_bytes: int
    location: str  # the commit URL, or the upload folder of a dry run
    record_path: Path


def publish(
    workspace_root: str, run_id: str, dataset_uri: str, options: PublishOptions, token: str | None
) -> PublishResult:
    """Publish run ``run_id``'s model; ``token`` is the Hub token from the environment, or None."""
    dirs = RunDirs.of(workspace_root, run_id)
    outputs = read_run_outputs(dirs)
    if not outputs.gate_passed and not options.publish_if_gate_failed:
        raise UserError(
            "The evaluation gate of this run failed "
            f"({outputs.evaluation.get('gate', {}).get('reason', 'no reason given')}), "
            "so the model is not published. Improve the run, or set publish_if_gate_failed to publish it anyway."
        )
    previous = find_published(options.repo_id, workspace_root, token, options)
    check_still_published(outputs.evaluation, previous, run_id)
    published_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    history = extended_history(
        previous.card if previous else None,
        previous.revision if previous else None,
        {
            "run_id": run_id,
            "published_at": published_at,
            "data_fingerprint": outputs.fingerprint,
            "eval_loss": outputs.evaluation.get("fine_tuned", {}).get("eval_loss"),
        },
    )
    plan = upload_plan(dirs, outputs, options)
    card = render_model_card(outputs, options, CardContext(options.repo_id, run_id, dataset_uri, list(plan), history))
    write_upload_folder(plan, card, dirs.upload)
    files = sorted(path.relative_to(dirs.upload).as_posix() for path in dirs.upload.rglob("*") if path.is_file())
    total_bytes = sum((dirs.upload / name).stat().st_size for name in files)
    dry_run = not (options.repo_id and token)
    if dry_run:
        missing = " and ".join(
            reason
            for reason, absent in (
                ("no repository id is set (repo_id)", not options.repo_id),
                (
                    f"no token is in the environment ({TOKEN_ENV}, from the Kubernetes Secret '{SECRET_NAME}')",
                    not token,
                ),
            )
            if absent
        )
        print(
            f"dry run: {missing}; nothing was uploaded. The folder that would be uploaded is {dirs.upload}", flush=True
        )
        location = str(dirs.upload)
    else:
        print(
            f"uploading {len(files)} files ({total_bytes / 1e6:.1f} MB) to {options.repo_id} as one commit", flush=True
        )
        location = publish_folder(
            HfApi(token=token),
            options.repo_id,
            dirs.upload,
            options,
            message=f"Publish the model of pipeline run {run_id}",
            description=f"Data fingerprint {outputs.fingerprint}. Built by llm-finetune-pipeline.",
            parent_commit=previous.revision if previous else None,
        )
        print(f"published: {location}", flush=True)
    record = PublishedRecord(
        repo_id=options.repo_id,
        uploaded=not dry_run,
        data_fingerprint=outputs.fingerprint,
        run_id=run_id,
        location=location,
        published_at=published_at,
    )
    return PublishResult(dry_run, dirs.upload, files, total_bytes, location, write_record(workspace_root, record))


def check_still_published(evaluation: dict, previous: PublishedModel | None, run_id: str) -> None:
    """Refuse when the published model is neither the one the evaluation compared the new model with nor this
    run's own (a publish step that runs again)."""
    compared = evaluation.get("published_model")
    compared_identity = (compared.get("revision") or f"run {compared.get('run_id')}") if compared else None
    if compared_identity == (previous.identity if previous else None) or (previous and previous.run_id == run_id):
        return
    raise UserError(
        "The published model changed after this run's evaluation: it compared the new model with "
        f"{compared['description'] if compared else 'nothing (no model was published then)'}, but what is published "
        f"now is {previous.description if previous else 'nothing'}. The new model was never compared with that, so "
        "it is not published. Start the run again (with force=true if its data is now the published model's) to "
        "compare it with the model published now."
    )
