"""The publish stage's Hub commit: one commit, retried on transient failures, with readable errors.

huggingface_hub retries single requests inside an upload (preupload, LFS and Xet
transfers) itself, but not ``create_repo`` or the final commit request, and its
``upload_folder`` may split a large folder into several commits when hf_xet is
installed. So the stage builds the operations itself, sends them with one
``create_commit``, and retries the whole call on 5xx answers and connection
errors (``components.champion.hub``, which reads the Hub for every step).

The commit names its parent, the commit the evaluation compared the new model
against (``parent_commit``): if anything else reached the repository since, the
Hub refuses it with 412 and nothing lands, so a model is never published over
one it was not compared with. A retry after a lost response checks first
whether the lost commit did land (the repository's model card is then this
upload's, which names its run), and answers with it instead of trying again.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError

from common.errors import UserError
from components.champion.card import CARD_NAME
from components.champion.hub import hub_errors, published_card, with_retries
from components.publish.options import PublishOptions

# The Hub's answer to a commit whose parent_commit is no longer the head of the branch.
HEAD_MOVED_STATUS = 412
KEPT_REMOTE_FILES = {".gitattributes"}


def publish_folder(
    api: HfApi,
    repo_id: str,
    folder: Path,
    options: PublishOptions,
    message: str,
    description: str,
    parent_commit: str | None,
) -> str:
    """Create ``repo_id`` if missing and commit ``folder`` to it as one commit on top of ``parent_commit`` (None:
    the repository holds no model yet); return the commit URL."""
    with hub_errors(f"create or find the repository {repo_id}", api.endpoint, writes=True):
        with_retries(
            lambda: api.create_repo(repo_id, private=options.private, exist_ok=True), "create repository", options
        )
    local = {path.relative_to(folder).as_posix(): path for path in sorted(folder.rglob("*")) if path.is_file()}
    card = (folder / CARD_NAME).read_text(encoding="utf-8")
    tries = 0

    def commit() -> str:
        nonlocal tries
        tries += 1
        if tries > 1:
            head = api.model_info(repo_id).sha
            if head != parent_commit and published_card(api, repo_id, options, head) == card:
                return f"{api.endpoint}/{repo_id}/commit/{head}"  # the lost answer's commit did land
        # Fresh operations for every attempt: create_commit marks the ones it used.
        operations: list = []
        if options.delete_stale_files:
            remote = api.list_repo_files(repo_id)
            operations += [
                CommitOperationDelete(path) for path in remote if path not in local and path not in KEPT_REMOTE_FILES
            ]
        operations += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in local.items()]
        return api.create_commit(
            repo_id,
            operations=operations,
            commit_message=message,
            commit_description=description,
            parent_commit=parent_commit,
        ).commit_url

    with hub_errors(f"upload to the repository {repo_id}", api.endpoint, writes=True):
        try:
            return with_retries(commit, "upload", options)
        except HfHubHTTPError as error:
            if error.response is None or error.response.status_code != HEAD_MOVED_STATUS:
                raise
            raise UserError(
                f"Something else was committed to {repo_id} after this run's evaluation compared the new model with "
                f"the published one (commit {parent_commit[:12] if parent_commit else 'none'}), so the Hub refused "
                "the commit (HTTP 412) and nothing was uploaded. The new model was never compared with what is there "
                "now: start the run again, and its evaluation will compare them."
            ) from None
        except ValueError as error:  # huggingface_hub's report of the Hub's metadata validation
            if "Invalid metadata in README.md" not in str(error):
                raise
            raise UserError(
                f"The Hub rejected the model card metadata: {' '.join(str(error).split())} Fix the named field "
                "(--license takes a Hub license id such as apache-2.0; --base-model a Hub model id) and publish again."
            ) from None
