"""The Hugging Face tokens: from the environment only, and what to say when one is missing or refused.

In the cluster a token reaches a step as the environment variable ``HF_TOKEN``,
filled from a Kubernetes Secret by kfp-kubernetes ``use_secret_as_env``; locally
it is whatever the shell exports. It is never a pipeline parameter (parameters
are stored in the run's record and shown in the UI), and nothing here prints it.
A token saved by ``hf auth login`` is deliberately ignored: what a run can reach
must not depend on who last logged in on the machine.

Two Secrets, so that the token that can write is only where a write happens. The
publish step alone gets ``hf-token`` (``WRITE_SECRET_NAME``), the token that may
write to ``hub_repo_id``. The steps that only read the Hub (prepare, the
data-change check, tokenise, the training job's launcher and pods, evaluate) get
``hf-read-token`` (``READ_SECRET_NAME``), under the same key and variable, so
the reading code does not know which it got. Both are optional mounts: a public
base model and dataset need no token, a private or gated one needs the read
token. A user with one token may put it in both; every reading step can then write.

A run with a repository and a token missing is refused, never quietly downgraded:
without the read token the repository's published model cannot be read, so the
gate would compare the new model with its base alone; without the write token
the publish would upload nothing; either way the steps after it (store, register,
serve with ``deploy``) still replace what is in production. ``missing_token``
is that refusal, in every step that reads or writes the repository
(``require_token`` where a step reads the token itself); the pipeline's first
step checks both Secrets first, by presence only (``missing_secrets_problem``),
seeing the read one under ``READ_TOKEN_CHECK_ENV``.
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

from common.errors import UserError

TOKEN_ENV = "HF_TOKEN"
SECRET_KEY = "HF_TOKEN"  # the key of both Secrets
WRITE_SECRET_NAME = "hf-token"
READ_SECRET_NAME = "hf-read-token"
# Where the first step sees hf-read-token: HF_TOKEN there is hf-token, the one the publish step gets.
READ_TOKEN_CHECK_ENV = "HF_READ_TOKEN"
READING_STEPS = "prepare, the data-change check, tokenise, the training job and evaluate"
TOKENS_PAGE = "https://huggingface.co/settings/tokens"


def hub_token() -> str | None:
    """The token in ``$HF_TOKEN``, or None when it is unset or blank."""
    return os.environ.get(TOKEN_ENV, "").strip() or None


def token_refused(status: int, action: str, writes: bool = False) -> str:
    """One paragraph for a 401/403 answer of the Hub to ``action`` (e.g. "create the repository x/y").

    ``writes``: the action writes, so only the publish step's ``hf-token`` is concerned. A read may be refused in a
    reading step (``hf-read-token``) or in the publish step, which reads the repository with ``hf-token`` before it
    commits, so the paragraph names both.
    """
    if status == 401:
        meaning = "does not accept the token (401: it is wrong, expired or revoked)"
    elif writes:
        meaning = "accepts the token but it may not do that (403: it lacks write access to the namespace or repository)"
    else:
        meaning = "accepts the token but it may not do that (403: it cannot read the repository, or it is gated)"
    return (
        f"The Hugging Face Hub {meaning}, so the step could not {action}. The token comes from the environment "
        f"variable {TOKEN_ENV}, which the pipeline fills from {_source(writes)}. {_fix(writes)} (or kubectl; delete "
        f"the old Secret first), or export {TOKEN_ENV} for a local run, then start the run again."
    )


def _source(writes: bool) -> str:
    """Which Secret the step's token came from."""
    if writes:
        return f"the Kubernetes Secret '{WRITE_SECRET_NAME}' (key {SECRET_KEY}), which only the publish step gets"
    return (
        f"the Kubernetes Secret '{READ_SECRET_NAME}' (key {SECRET_KEY}) in the steps that read the Hub "
        f"({READING_STEPS}), and from the Secret '{WRITE_SECRET_NAME}' in the publish step"
    )


def _fix(writes: bool) -> str:
    if writes:
        return (
            f"Create a token with write access at {TOKENS_PAGE} and store it with "
            f"{create_secret_command(WRITE_SECRET_NAME)}"
        )
    return (
        f"Create a token that can read it (read access is enough) at {TOKENS_PAGE} and store it with "
        f"{create_secret_command(READ_SECRET_NAME)}, or, when the publish step was refused, a token with write access "
        f"with {create_secret_command(WRITE_SECRET_NAME)}"
    )


def create_secret_command(secret: str) -> str:
    """The command that stores a token in ``secret``, as the docs and messages show it (markdown code)."""
    return f"`oc create secret generic {secret} --from-literal={SECRET_KEY}=<token>`"


def missing_token_problem(repo_id: str, writes: bool = False) -> str:
    """What is wrong with ``hub_repo_id`` ``repo_id`` in a step that has no token, after the parameter's name.

    ``writes``: the publish step, whose token is ``hf-token``; else a step that reads the repository, whose token
    is ``hf-read-token``.
    """
    secret = WRITE_SECRET_NAME if writes else READ_SECRET_NAME
    consequence = (
        "the publish would upload nothing"
        if writes
        else "the published model cannot be read, so the quality gate would compare the new model with its base alone"
    )
    access = "has write access" if writes else "can read the repository"
    return (
        f"is {repo_id!r}, but no Hugging Face token is in the environment variable {TOKEN_ENV}, which the pipeline "
        f"fills from the Kubernetes Secret '{secret}' (key {SECRET_KEY}) in this step: without it {consequence}, "
        "while the steps after it still store, register and deploy the new model. Create the Secret with a token "
        f"that {access} ({create_secret_command(secret)}, or kubectl; for a local run, export {TOKEN_ENV}), or "
        "leave hub_repo_id empty for a run that publishes nothing"
    )


def missing_token(repo_id: str, writes: bool = False) -> str:
    """One paragraph for a step that was given the repository ``repo_id`` and no token to reach it."""
    return f"hub_repo_id {missing_token_problem(repo_id, writes)}; then start the run again."


def require_token(repo_id: str) -> str | None:
    """The token of a step that reads ``repo_id``; None when ``repo_id`` is empty (a dry run needs none).

    Raises ``UserError`` (``missing_token``) when ``repo_id`` is set and ``$HF_TOKEN`` is unset or blank.
    """
    token = hub_token()
    if repo_id and token is None:
        raise UserError(missing_token(repo_id))
    return token


def missing_secrets(environ: Mapping[str, str]) -> list[str]:
    """The Hub Secrets the first step's pod did not get (blank counts as missing), write Secret first."""
    seen = {WRITE_SECRET_NAME: TOKEN_ENV, READ_SECRET_NAME: READ_TOKEN_CHECK_ENV}
    return [secret for secret, variable in seen.items() if not environ.get(variable, "").strip()]


def missing_secrets_problem(repo_id: str, missing: list[str]) -> str:
    """What is wrong with ``hub_repo_id`` ``repo_id`` when the first step did not get the Secrets ``missing``, after
    the parameter's name: which, why each is needed, and the fix, in one paragraph."""
    several = len(missing) > 1
    named = " and ".join(f"'{secret}'" for secret in missing)
    commands = " and ".join(create_secret_command(secret) for secret in missing)
    return (
        f"is {repo_id!r}, but the Kubernetes Secret{'s' if several else ''} {named} (key {SECRET_KEY}) "
        f"{'are' if several else 'is'} missing. A run that publishes needs two Hugging Face tokens: "
        f"'{WRITE_SECRET_NAME}', which may write to the repository and which only the publish step gets, and "
        f"'{READ_SECRET_NAME}', which the steps that read the Hub get ({READING_STEPS}); without either, the publish "
        "would upload nothing or the quality gate would compare the new model with its base alone, while the steps "
        "after the publish still store, register and deploy it. "
        f"Create {'them' if several else 'it'} with {'tokens' if several else 'a token'} from {TOKENS_PAGE}: "
        f"{commands} (or kubectl; '{READ_SECRET_NAME}' needs only read access to the repository and the base model). "
        "With only one token, the same token may go in both Secrets, but then every step that reads the Hub can "
        f"write to it too: less least privilege. For a local run, export {TOKEN_ENV}, which every step reads; or "
        "leave hub_repo_id empty for a run that publishes nothing"
    )


def one_token_for_every_step(environ: MutableMapping[str, str] = os.environ) -> None:
    """A local run (kfp.local mounts no Secret): every step, reading or publishing, reads the shell's ``HF_TOKEN``,
    so the first step's check of the read Secret looks at that same token."""
    environ[READ_TOKEN_CHECK_ENV] = environ.get(TOKEN_ENV, "")
