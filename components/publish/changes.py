"""Did the data change since the last published model? If not, a scheduled run skips training.

The data stage's fingerprint (sha256 of the normalised rows and the data
options) is compared with the one recorded when the last model was published:
in the Hub model card's metadata when a repository and a token are available,
else in the publish record on the workspace. ``force`` always says "changed".
Training options are not part of the fingerprint: after changing them, set
``force`` for one run.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub import HfApi

from components.publish.hub import published_card
from components.publish.model_card import FINGERPRINT_KEY, read_fingerprint
from components.publish.options import PublishOptions
from components.publish.record import read_record, record_path


@dataclass(frozen=True)
class DataChange:
    changed: bool
    reason: str  # one sentence for the run's log and the UI


def compare_with_published(
    fingerprint: str,
    repo_id: str,
    workspace_root: str,
    force: bool,
    token: str | None,
    options: PublishOptions = PublishOptions(),
) -> DataChange:
    """Whether to train: the data differs from the last published model's, nothing was published, or ``force``."""
    if force:
        return DataChange(True, "force is set, so the model is retrained whatever the data.")
    if repo_id and token:
        card = published_card(HfApi(token=token), repo_id, options)
        if card is None:
            return DataChange(True, f"nothing is published at {repo_id} yet.")
        published, source = read_fingerprint(card), f"the model card of {repo_id}"
    else:
        record = read_record(workspace_root, repo_id)
        if record is None:
            return DataChange(True, f"no earlier publish is recorded at {record_path(workspace_root, repo_id)}.")
        published, source = (
            record.data_fingerprint,
            f"the publish record of run {record.run_id} ({record_path(workspace_root, repo_id)})",
        )
    if not published:
        return DataChange(True, f"{source} holds no {FINGERPRINT_KEY}, so the data cannot be compared.")
    if published == fingerprint:
        return DataChange(
            False,
            f"the prepared data has the fingerprint {fingerprint}, the same as the model in {source}: "
            "training, export and publishing are skipped. Set force to retrain anyway.",
        )
    return DataChange(
        True, f"the data changed: its fingerprint is {fingerprint}, the published model's ({source}) is {published}."
    )
