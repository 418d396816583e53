"""The publish stage's Hub calls: one commit, retries on transient failures, readable errors.

huggingface_hub retries single requests inside an upload (preupload, LFS and Xet
transfers) itself, but not ``create_repo`` or the final commit request, and its
``upload_folder`` may split a large folder into several commits when hf_xet is
installed. So the stage builds the operations itself, sends them with one
``create_commit``, and retries the whole call on 5xx answers and connection
errors.

The commit names its parent, the commit the evaluation compared the new model
against (``parent_commit``): if anything else reached the repository since, the
Hub refuses it with 412 and nothing lands, so a model is never published over
one it was not compared with. A retry after a lost response checks first
whether the lost commit did land (the repository's model card is then this
upload's, which names its run), and answers with it instead of trying again.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import httpx2
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

from common.errors import UserError
from components.hub_auth import token_refused
from components.publish.bundle import CARD_NAME
from components.publish.options import PublishOptions

T = TypeVar("T")
TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
# The Hub's answer to a commit whose parent_commit is no longer the head of the branch.
HEAD_MOVED_STATUS = 412
MAX_RETRY_WAIT_S = 60.0
KEPT_REMOTE_FILES = {".gitattributes"}


def with_retries(
    call: Callable[[], T], what: str, options: PublishOptions, sleep: Callable[[float], None] = time.sleep
) -> T:
    """``call()``, tried up to ``options.attempts`` times while it fails transiently, waiting longer each time."""
    wait = options.first_retry_wait_s
    for attempt in range(1, options.attempts + 1):
        try:
            return call()
        except (HfHubHTTPError, httpx2.TransportError) as error:
            if not _transient(error) or attempt == options.attempts:
                raise
            print(
                f"{what}: {_brief(error)}; retrying in {wait:g} s (attempt {attempt + 1} of {options.attempts})",
                flush=True,
            )
            sleep(wait)
            wait = min(MAX_RETRY_WAIT_S, wait * 2)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _transient(error: Exception) -> bool:
    if isinstance(error, HfHubHTTPError):
        return error.response is not None and error.response.status_code in TRANSIENT_STATUS
    return True  # connection refused or reset, timeouts, protocol errors


def _brief(error: Exception) -> str:
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return f"HTTP {error.response.status_code}"
    return type(error).__name__


@contextlib.contextmanager
def hub_errors(action: str, endpoint: str, writes: bool = False) -> Iterator[None]:
    """Turn what the Hub answered into a paragraph saying what to do (the token is never part of it); ``writes``:
    the action writes, so a refused token is the publish step's ``hf-token``."""
    try:
        yield
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else 0
        if status in (401, 403):
            raise UserError(token_refused(status, action, writes)) from None
        server_message = getattr(error, "server_message", None) or ""
        raise UserError(
            f"The Hugging Face Hub answered HTTP {status} when trying to {action}"
            f"{': ' + server_message if server_message else ''}. "
            + (
                "It kept failing after all retries; try again later."
                if status in TRANSIENT_STATUS
                else "Check the repository id and its settings."
            )
        ) from None
    except httpx2.TransportError as error:
        raise UserError(
            f"Could not reach the Hugging Face Hub at {endpoint} to {action} "
            f"({type(error).__name__}, also after all retries). "
            "Check that the cluster can reach it (proxy, egress rules; HF_ENDPOINT for a mirror) and try again."
        ) from None


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


def head_revision(api: HfApi, repo_id: str, options: PublishOptions) -> str | None:
    """The commit ``main`` of ``repo_id`` points at; None when the repository does not exist."""
    with hub_errors(f"read the repository {repo_id}", api.endpoint):
        try:
            return with_retries(lambda: api.model_info(repo_id), "read repository", options).sha
        except RepositoryNotFoundError:
            return None


def repository_files(api: HfApi, repo_id: str, revision: str, options: PublishOptions) -> list[str]:
    """Every file path in ``repo_id`` at ``revision``."""
    with hub_errors(f"list the files of {repo_id}", api.endpoint):
        return with_retries(lambda: api.list_repo_files(repo_id, revision=revision), "list files", options)


def published_card(api: HfApi, repo_id: str, options: PublishOptions, revision: str = "main") -> str | None:
    """The model card text of ``repo_id`` at ``revision``; None when the repository or its card does not exist."""
    url = f"{api.endpoint}/{repo_id}/resolve/{revision}/{CARD_NAME}"
    with hub_errors(f"read the model card of {repo_id}", api.endpoint):
        response = http_backoff(
            "GET",
            url,
            headers=build_hf_headers(token=api.token),
            max_retries=options.attempts - 1,
            base_wait_time=options.first_retry_wait_s,
            max_wait_time=MAX_RETRY_WAIT_S,
            follow_redirects=True,
        )
        try:
            hf_raise_for_status(response)
        except (RepositoryNotFoundError, RemoteEntryNotFoundError):
            return None
        return response.text
