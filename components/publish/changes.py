"""Did the data change since the last published model? If not, a scheduled run skips training.

The data stage's fingerprint (sha256 of the normalised rows and the data
options) is compared with the one recorded when the last model was published:
in the Hub model card's metadata when a repository is set (without a token that
is refused, not read from elsewhere), else in the dry runs' publish record on the
workspace. ``force`` always says "changed". Each source's lineage (its content's digest and the version its
server named, ``common.records.SourceLineage``) is compared too, and the reason names every source that is new,
gone, or read at another version or with other content: a new S3 object version with the same rows leaves the
data unchanged, and says so.
Training options are not part of the fingerprint: after changing them, set
``force`` for one run.

Unchanged data does not always mean nothing to do: when the run that published
the model failed after publishing (its S3 endpoint, registry or cluster was down),
the version's delivery record (``components.champion.record.DeliveryRecord``) says
which of store, register and serve it lacks, and the pipeline runs exactly those
on it, without training again. The run id comes from the Hub model card, which
anyone who can push to the repository can edit, so the version is finished only
when this workspace agrees it is the published one (``disagreement``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.records import SourceLineage
from common.run_layout import PUBLISH, UPLOAD, stage_dir
from components.champion.card import CARD_NAME, FINGERPRINT_KEY
from components.champion.published import PublishedModel, find_published
from components.champion.record import DeliveryRecord, read_record, record_path
from components.publish.options import PublishOptions

# What a run id may look like to name a run's directory (KFP's are UUIDs; kfp.local's are names with a timestamp).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


@dataclass(frozen=True)
class DataChange:
    changed: bool
    reason: str  # one sentence for the run's log and the UI
    # Unchanged data whose published version lacks steps after publish: those steps, and the run that published it.
    finish: tuple[str, ...] = ()
    version_run_id: str = ""


def compare_with_published(
    fingerprint: str,
    repo_id: str,
    workspace_root: str,
    force: bool,
    token: str | None,
    options: PublishOptions = PublishOptions(),
    lineage: Sequence[SourceLineage] = (),
) -> DataChange:
    """Whether to train: the data differs from the last published model's, nothing was published, or ``force``.
    ``lineage``: the prepared data's sources, compared with the published model's for the reason."""
    if force:
        return DataChange(True, "force is set, so the model is retrained whatever the data.")
    published = find_published(repo_id, workspace_root, token, options)
    if published is None:
        return DataChange(
            True,
            f"nothing is published at {repo_id} yet."
            if repo_id
            else f"no earlier publish is recorded at {record_path(workspace_root, repo_id)}.",
        )
    source = published.description
    if not published.data_fingerprint:
        return DataChange(True, f"{source} holds no {FINGERPRINT_KEY}, so the data cannot be compared.")
    sources = lineage_changes(published.data_lineage, lineage)
    if published.data_fingerprint == fingerprint:
        also = f" Its sources differ ({sources}), but the rows prepared from them are the same." if sources else ""
        reason = (
            f"the prepared data has the fingerprint {fingerprint}, the same as the model in {source}: "
            f"training, export and publishing are skipped.{also} Set force to retrain anyway."
        )
        return unfinished(published, workspace_root, reason) or DataChange(False, reason)
    return DataChange(
        True,
        f"the data changed: its fingerprint is {fingerprint}, the published model's ({source}) is "
        f"{published.data_fingerprint}." + (f" Since then: {sources}." if sources else ""),
    )


def lineage_changes(published: Sequence[SourceLineage], now: Sequence[SourceLineage]) -> str:
    """How the sources differ from the published model's, one clause per source ("" when they do not, or when the
    published card records none: it was published before lineage)."""
    if not published:
        return ""
    before = {entry.uri: entry for entry in published}
    clauses = []
    for current in now:
        old = before.pop(current.uri, None)
        if old is None:
            clauses.append(f"{current.uri} is a new source")
        elif old.remote != current.remote:
            clauses.append(
                f"{current.uri} was read at {old.remote.described() or 'no version'}, now at "
                f"{current.remote.described() or 'no version'}"
            )
        elif old.content != current.content:
            clauses.append(f"{current.uri} has new content ({old.content[:19]}…, now {current.content[:19]}…)")
    clauses += [f"{uri} is no longer a source" for uri in before]
    return "; ".join(clauses)


def unfinished(published: PublishedModel, workspace_root: str, reason: str) -> DataChange | None:
    """Unchanged data, with the steps after publish that the published version lacks, when its delivery record on
    this workspace names any; None when it names none or there is no record (a version published before delivery
    records, or whose run directory is not on this workspace: a fresh PVC), or when the workspace does not agree
    that the version is the published one (said so in the log)."""
    delivery = delivery_to_finish(published, workspace_root)
    if delivery is None:
        return None
    steps = listed(delivery.missing)
    upload = upload_folder(workspace_root, delivery.run_id)
    if not (upload / CARD_NAME).is_file():
        return DataChange(
            False,
            f"{reason} Run {delivery.run_id} published that model but did not complete {steps}, and its upload "
            f"folder {upload} is gone, so they cannot be finished from this workspace: set force to train and "
            "publish again.",
        )
    return DataChange(
        False,
        f"{reason} Run {delivery.run_id} published that model but did not complete {steps}: "
        f"{'that step runs' if len(delivery.missing) == 1 else 'those steps run'} now on its version, "
        "without training again.",
        finish=delivery.missing,
        version_run_id=delivery.run_id,
    )


def delivery_to_finish(published: PublishedModel, workspace_root: str) -> DeliveryRecord | None:
    """The delivery record of the run ``published`` names, when it lacks steps after publish and this workspace
    agrees that run's version is the one published; None otherwise."""
    if not is_run_id(published.run_id):  # a Hub card names it, and anyone who can push to the repository may edit it
        return None
    delivery = DeliveryRecord.read(workspace_root, published.run_id)  # its run_id is the folder's, or it is None
    if delivery is None or not delivery.missing:
        return None
    refusal = disagreement(published, delivery, workspace_root)
    if refusal:
        print(
            f"not finishing {listed(delivery.missing)} for run {delivery.run_id}: {refusal}. Nothing is stored, "
            "registered or served for it; check who last pushed to the repository, or set force to train and "
            "publish again.",
            flush=True,
        )
        return None
    return delivery


def disagreement(published: PublishedModel, delivery: DeliveryRecord, workspace_root: str) -> str | None:
    """Why this workspace does not take ``delivery``'s version for ``published``, or None when it does.

    It does when the version was published to this very repository (or as a dry run, when that is what is
    published), and the workspace's publish record names its run, or still names the run it replaced while the
    Hub's model card is, byte for byte, the card that run committed (its publish died between the commit and the
    publish record). A card pointed at another run, one published elsewhere or whose commit never landed, gets
    neither.
    """
    repo = published.repo_id
    if delivery.repo_id != repo:
        where = DeliveryRecord.path(workspace_root, delivery.run_id)
        written = (
            "was not started by a publish step"
            if delivery.repo_id is None
            else f"was written for {target(delivery.repo_id)}, not {target(repo)}"
        )
        return f"{published.description} names run {delivery.run_id}, whose delivery record {where} {written}"
    record = read_record(workspace_root, repo)
    recorded = record.run_id if record else ""
    if recorded == delivery.run_id:
        return None
    if (
        published.on_hub
        and recorded == delivery.replaces
        and card_is_committed(published.card, workspace_root, delivery)
    ):
        return None  # the commit landed and the step died before its publish record
    names = f"run {recorded}" if recorded else "no run"
    return (
        f"{published.description} names run {delivery.run_id}, but this workspace's publish record "
        f"{record_path(workspace_root, repo)} names {names}"
        + (f", and that card is not the one run {delivery.run_id} committed" if published.on_hub else "")
    )


def target(repo_id: str) -> str:
    """A delivery record's ``repo_id`` in a sentence."""
    return repo_id or "a dry run"


def card_is_committed(card: str | None, workspace_root: str, delivery: DeliveryRecord) -> bool:
    """``card`` (the Hub's) is the model card run ``delivery.run_id`` committed: its upload folder's, byte for byte
    (the Hub keeps a committed file as it was sent). False when either is missing."""
    committed = upload_folder(workspace_root, delivery.run_id) / CARD_NAME
    return card is not None and committed.is_file() and committed.read_text(encoding="utf-8") == card


def upload_folder(workspace_root: str, run_id: str) -> Path:
    """Where run ``run_id``'s publish wrote what it committed (or, in a dry run, would have)."""
    return stage_dir(workspace_root, run_id, PUBLISH) / UPLOAD


def is_run_id(run_id: str | None) -> bool:
    """``run_id`` can name a directory under ``runs/``: one path component, never ``..``, nothing that leads out."""
    return bool(run_id) and RUN_ID.fullmatch(run_id) is not None and run_id not in (".", "..")


def listed(steps: tuple[str, ...]) -> str:
    """'store', 'store and serve', 'store, register and serve'."""
    return steps[0] if len(steps) == 1 else f"{', '.join(steps[:-1])} and {steps[-1]}"
