"""Every knob of the publish stage, its default and its help text, in one place.

The CLI of ``python -m components.publish.stage`` is generated from these
fields and the KFP component passes the same names. The Hub token is not among
them on purpose: it comes from the environment only (``components.hub_auth``).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.cli_options import choice_problems, option, run_option
from common.errors import UserError
from components.champion.retries import DEFAULT_ATTEMPTS, DEFAULT_FIRST_RETRY_WAIT_S

MERGED_CHOICES = ("auto", "true", "false")


@dataclass(frozen=True)
class PublishOptions:
    """What one publish does."""

    repo_id: str = run_option(
        "",
        "Hugging Face Hub model repository to publish to, owner/name. Empty: dry run, the folder that would be "
        "uploaded is written to the workspace. The tokens come from Secrets, never from a parameter: "
        "'hf-token' (HF_TOKEN, may write; the publish step only) and 'hf-read-token' (HF_TOKEN, reads the "
        "published model; the steps that read the Hub). Set without both, the run is refused by its first step.",
        name="hub_repo_id",
    )
    private: bool = run_option(
        True,
        "Create the repository private when it does not exist yet (an existing one keeps its visibility).",
        name="hub_private",
    )
    publish_merged: str = run_option(
        "auto",
        "Upload the merged safetensors checkpoint, so transformers can load the repository: true, false, or auto "
        "(when the repository would otherwise hold no weights the next run's evaluation can load: training made "
        "no LoRA adapter, as with method full, or publish_adapter is false).",
        choices=MERGED_CHOICES,
    )
    publish_adapter: bool = run_option(
        True, "Also upload the LoRA adapter (PEFT) under adapter/, when training produced one."
    )
    license: str = run_option(
        "apache-2.0", "License identifier for the model card metadata; keep the base model's.", name="model_license"
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
    attempts: int = option(
        DEFAULT_ATTEMPTS, "Tries of each Hub call before giving up on 5xx answers and connection errors."
    )
    first_retry_wait_s: float = option(
        DEFAULT_FIRST_RETRY_WAIT_S,
        "Seconds before the first retry; the wait doubles after each failure, up to a minute.",
    )

    def publishes_merged(self, adapter_trained: bool) -> bool:
        """Whether the merged checkpoint goes up, ``adapter_trained`` saying whether training made an adapter."""
        if self.publish_merged == "auto":
            return not (self.publish_adapter and adapter_trained)
        return self.publish_merged == "true"

    def __post_init__(self) -> None:
        found = option_problems(self)
        if found:
            raise UserError(
                "invalid publish options: " + "; ".join(f"{name} {problem}" for name, problem in found.items()) + "."
            )


def option_problems(options: PublishOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way (CLI flag, run parameter)."""
    problems = choice_problems(PublishOptions, options)
    if options.attempts < 1:
        problems["attempts"] = f"must be at least 1 (got {options.attempts})"
    if options.first_retry_wait_s < 0:
        problems["first_retry_wait_s"] = f"must not be negative (got {options.first_retry_wait_s})"
    if options.repo_id:
        try:
            _check_repo_id(options.repo_id)
        except UserError as error:
            problems["repo_id"] = f"is invalid: {str(error).rstrip('.')}"
    return problems


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
