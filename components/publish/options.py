"""Every knob of the publish stage, its default and its help text, in one place.

The CLI of ``python -m components.publish.stage`` is generated from these
fields and the KFP component passes the same names. The Hub token is not among
them on purpose: it comes from the environment only (``components.hub_auth``).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.cli_options import option
from common.errors import UserError


@dataclass(frozen=True)
class PublishOptions:
    """What one publish does."""

    repo_id: str = option(
        "", "Hub model repository, owner/name. Empty: dry run, the upload folder is written but nothing is sent."
    )
    private: bool = option(
        True, "Create the repository private when it does not exist yet (an existing one keeps its visibility)."
    )
    include_merged: bool = option(
        False, "Also upload the merged safetensors checkpoint (transformers can then load the repository)."
    )
    include_adapter: bool = option(
        True, "Also upload the LoRA adapter (PEFT) under adapter/, when training produced one."
    )
    license: str = option(
        "apache-2.0", "License identifier for the model card metadata; keep the base model's license."
    )
    base_model: str = option(
        "", "Hub id of the base model for the model card. Empty: the trainer's --model when it is a Hub id."
    )
    delete_stale_files: bool = option(
        True,
        "Delete files an earlier upload left in the repository that this upload does not contain "
        "(.gitattributes stays).",
    )
    publish_if_gate_failed: bool = option(
        False, "Publish even when the evaluation gate failed (the pipeline skips this stage then anyway)."
    )
    attempts: int = option(5, "Tries of each Hub call before giving up on 5xx answers and connection errors.")
    first_retry_wait_s: float = option(
        2.0, "Seconds before the first retry; the wait doubles after each failure, up to a minute."
    )

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UserError(f"attempts must be at least 1; got {self.attempts}.")
        if self.first_retry_wait_s < 0:
            raise UserError(f"first_retry_wait_s must not be negative; got {self.first_retry_wait_s}.")
        if self.repo_id:
            _check_repo_id(self.repo_id)


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    problem = "" if repo_id.count("/") == 1 else "it is not owner/name"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        problem = problem or str(error).rstrip(".")
    if problem:
        raise UserError(
            f"repo_id {repo_id!r} is not a valid Hub repository id ({problem}). Write owner/name, the user or "
            "organisation first, e.g. my-org/smollm3-practical-skills."
        )
