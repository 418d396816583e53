"""Reading the Hub, for every step that asks it about the published model: retries and readable errors.

A call is retried on 5xx answers and connection errors, waiting longer each time
(``with_retries``); what the Hub finally answered becomes one paragraph saying
what to do, the token never part of it (``hub_errors``). The publish step's
commit (``components.publish.hub``) goes through the same two.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, TypeVar

import httpx2
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

from common.errors import UserError
from components.champion.card import CARD_NAME
from components.champion.retries import Retries
from components.hub_auth import token_refused

T = TypeVar("T")
TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
MAX_RETRY_WAIT_S = 60.0


def with_retries(call: Callable[[], T], what: str, retries: Retries, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, tried up to ``retries.attempts`` times while it fails transiently, waiting longer each time."""
    wait = retries.first_retry_wait_s
    for attempt in range(1, retries.attempts + 1):
        try:
            return call()
        except (HfHubHTTPError, httpx2.TransportError) as error:
            if not _transient(error) or attempt == retries.attempts:
                raise
            print(
                f"{what}: {_brief(error)}; retrying in {wait:g} s (attempt {attempt + 1} of {retries.attempts})",
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


def head_revision(api: HfApi, repo_id: str, retries: Retries) -> str | None:
    """The commit ``main`` of ``repo_id`` points at; None when the repository does not exist."""
    with hub_errors(f"read the repository {repo_id}", api.endpoint):
        try:
            return with_retries(lambda: api.model_info(repo_id), "read repository", retries).sha
        except RepositoryNotFoundError:
            return None


def repository_files(api: HfApi, repo_id: str, revision: str, retries: Retries) -> list[str]:
    """Every file path in ``repo_id`` at ``revision``."""
    with hub_errors(f"list the files of {repo_id}", api.endpoint):
        return with_retries(lambda: api.list_repo_files(repo_id, revision=revision), "list files", retries)


def published_card(api: HfApi, repo_id: str, retries: Retries, revision: str = "main") -> str | None:
    """The model card text of ``repo_id`` at ``revision``; None when the repository or its card does not exist."""
    url = f"{api.endpoint}/{repo_id}/resolve/{revision}/{CARD_NAME}"
    with hub_errors(f"read the model card of {repo_id}", api.endpoint):
        response = http_backoff(
            "GET",
            url,
            headers=build_hf_headers(token=api.token),
            max_retries=retries.attempts - 1,
            base_wait_time=retries.first_retry_wait_s,
            max_wait_time=MAX_RETRY_WAIT_S,
            follow_redirects=True,
        )
        try:
            hf_raise_for_status(response)
        except (RepositoryNotFoundError, RemoteEntryNotFoundError):
            return None
        return response.text
