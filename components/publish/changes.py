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

from components.publish.model_card import FINGERPRINT_KEY
from components.publish.options import PublishOptions
from components.publish.published import find_published
from components.publish.record import record_path


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
    published = find_published(repo_id, workspace_root, token, options)
    if published is None:
        return DataChange(
            True,
            f"nothing is published at {repo_id} yet."
            if repo_id and token
            else f"no earlier publish is recorded at {record_path(workspace_root, repo_id)}.",
        )
    source = published.description
    if not published.data_fingerprint:
        return DataChange(True, f"{source} holds no {FINGERPRINT_KEY}, so the data cannot be compared.")
    if published.data_fingerprint == fingerprint:
        return DataChange(
            False,
            f"the prepared data has the fingerprint {fingerprint}, the same as the model in {source}: "
            "training, export and publishing are skipped. Set force to retrain anyway.",
        )
    return DataChange(
        True,
        f"the data changed: its fingerprint is {fingerprint}, the published model's ({source}) is "
        f"{published.data_fingerprint}.",
    )
