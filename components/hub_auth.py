"""The Hugging Face token: from the environment only, and what to say when the Hub refuses it.

In the cluster the token reaches a step as the environment variable ``HF_TOKEN``,
filled from a Kubernetes Secret by kfp-kubernetes ``use_secret_as_env``; locally
it is whatever the shell exports. It is never a pipeline parameter (parameters
are stored in the run's record and shown in the UI), and nothing here prints it.
A token saved by ``hf auth login`` is deliberately ignored: what a run can reach
must not depend on who last logged in on the machine.
"""

from __future__ import annotations

import os

TOKEN_ENV = "HF_TOKEN"
SECRET_NAME = "hf-token"
SECRET_KEY = "HF_TOKEN"


def hub_token() -> str | None:
    """The token in ``$HF_TOKEN``, or None when it is unset or blank."""
    return os.environ.get(TOKEN_ENV, "").strip() or None


def token_refused(status: int, action: str) -> str:
    """One paragraph for a 401/403 answer of the Hub to ``action`` (e.g. "create the repository x/y")."""
    meaning = (
        "does not accept the token (401: it is wrong, expired or revoked)"
        if status == 401
        else "accepts the token but it may not do that (403: it lacks write access to the namespace or repository)"
    )
    return (
        f"The Hugging Face Hub {meaning}, so the step could not {action}. The token comes from the environment "
        f"variable {TOKEN_ENV}, which the pipeline fills from the Kubernetes Secret '{SECRET_NAME}' "
        f"(key {SECRET_KEY}). "
        "Create a token with write access at https://huggingface.co/settings/tokens and store it with "
        f"`oc create secret generic {SECRET_NAME} --from-literal={SECRET_KEY}=<token>` (or kubectl; delete the old "
        f"Secret first), or export {TOKEN_ENV} for a local run, then start the run again."
    )
