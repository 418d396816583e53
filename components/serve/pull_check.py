"""Before an InferenceService is applied: can its pods pull the modelcar image with the credentials they will have?

KServe's pods pull ``storageUri``'s image with the InferenceService's
``imagePullSecrets``: the Secret ``model_oci_pull_secret`` names, or none
(anonymously). The serve step reads the image's manifest by the digest it
deploys with exactly those credentials (that Secret, mounted in this step only,
at ``PULL_SECRET_MOUNT``; outside the cluster the file ``$REGISTRY_PULL_AUTH_FILE``
names), the way a container runtime asks: the manifest, then, when the registry
challenges, its Basic credentials or a Bearer token for ``repository:...:pull``.
A refusal (401, 403, 404) stops the step with one paragraph naming
``model_oci_pull_secret`` and the fix before anything is applied, instead of
``serving_timeout_s`` later with an image that does not pull.

A registry this pod cannot reach proves nothing about the node: the kubelet
pulls through the node's network and the registry mirrors configured there.
So a connection error, a timeout or an unexpected answer is a warning, and the
step goes on; the rollout then fails with the pull error in its events if the
node cannot pull either.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlencode

from common.errors import UserError
from common.http_trust import token_may_go_to
from components.store.registry_auth import SECRET_KEY, credentials_in, registry_scheme

PULL_SECRET_MOUNT = Path("/var/run/secrets/model-oci-pull")  # where the pipeline mounts model_oci_pull_secret
PULL_AUTH_FILE_ENV = "REGISTRY_PULL_AUTH_FILE"  # outside the cluster: a Docker config JSON with the same credential
CHECK_TIMEOUT = (10.0, 30.0)  # seconds to connect, and to wait for each answer; at most three requests
REFUSED = (401, 403, 404)  # what a pull with these credentials would get too
# What a container runtime accepts: without the OCI types a registry may answer 404 for an OCI manifest.
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
PARAMETER = "model_oci_pull_secret"


def check_pull(manifest: dict[str, Any], out: TextIO | None = None) -> None:
    """Fail with one paragraph when the registry refuses the InferenceService ``manifest``'s image to the
    credentials of its ``imagePullSecrets``; warn and return when it cannot be asked. An S3 copy has no image.
    Says what it found on ``out`` (the step's output, sys.stdout as it is when called)."""
    out = out or sys.stdout
    predictor = manifest["spec"]["predictor"]
    image = predictor["model"].get("storageUri", "")
    if not image.startswith("oci://"):
        return
    secret = next((entry["name"] for entry in predictor.get("imagePullSecrets") or []), "")
    reference = image.removeprefix("oci://")
    host, _, path = reference.partition("/")
    repository, _, digest = path.partition("@")
    credentials = _pull_credentials(host, secret) if secret else None
    who = f"the Secret '{secret}' ({PARAMETER})" if secret else f"no credentials ({PARAMETER} is empty)"
    reader = f"the credentials of the Secret '{secret}'" if secret else "an anonymous client"
    import requests

    try:
        status, detail = _manifest_status(host, repository, digest, credentials)
    except requests.RequestException as error:
        print(_unreachable(image, host, who, str(error)), file=out, flush=True)
        return
    if status in REFUSED:
        raise UserError(_refusal(image, host, repository, secret, f"HTTP {status}{detail}"))
    if status != 200:
        print(_unreachable(image, host, who, f"it answered HTTP {status}{detail}"), file=out, flush=True)
        return
    print(f"the registry {host} serves {image} to {reader}: KServe's pods can pull it", file=out, flush=True)


def _pull_credentials(host: str, secret: str) -> tuple[str, str]:
    """The credentials of the pull Secret for ``host``; refused when the Secret did not reach the step."""
    path = Path(os.environ.get(PULL_AUTH_FILE_ENV) or PULL_SECRET_MOUNT / SECRET_KEY)
    hint = f"the serve step reads them from the Secret '{secret}' ({PARAMETER}), mounted at {PULL_SECRET_MOUNT}"
    if not path.is_file():
        raise UserError(
            f"{PARAMETER} names the Secret '{secret}', but this step found no {SECRET_KEY} at {path}: the Secret "
            "does not exist in the run's namespace, or is not of type kubernetes.io/dockerconfigjson, so KServe's "
            f"pods could not pull with it either. Nothing was applied. Create it with a read-only (pull) credential "
            f"for {host}: oc create secret docker-registry {secret} --docker-server={host} --docker-username=... "
            f"--docker-password=...; or set {PARAMETER} to the Secret that holds one (outside the cluster, set "
            f"{PULL_AUTH_FILE_ENV} to a Docker config JSON with the same credential)."
        )
    return credentials_in(path, host, hint)


def _manifest_status(host: str, repository: str, digest: str, credentials: tuple[str, str] | None) -> tuple[int, str]:
    """The registry's answer to a read of the manifest ``digest`` of ``repository`` with ``credentials`` (None:
    anonymously): its status and, for a refusal, the registry's own words (never a credential)."""
    import requests

    url = f"{registry_scheme(host)}://{host}/v2/{repository}/manifests/{digest}"
    with requests.Session() as session:
        session.headers["Accept"] = ", ".join(MANIFEST_TYPES)
        response = session.get(url, timeout=CHECK_TIMEOUT)
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme, _, parameters = challenge.partition(" ")
        if response.status_code == 401 and credentials and scheme.lower() == "basic":
            response = session.get(url, auth=credentials, timeout=CHECK_TIMEOUT)
        elif response.status_code == 401 and scheme.lower() == "bearer":
            token, refusal = _token(session, _challenge_parameters(parameters), repository, credentials)
            if refusal is not None:
                return refusal
            response = session.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=CHECK_TIMEOUT)
        return response.status_code, _detail(response)


def _token(session, challenge: dict[str, str], repository: str, credentials: tuple[str, str] | None):
    """A Bearer token for pulling ``repository`` from the challenge's realm, asked with ``credentials`` (a
    registry hands an anonymous one to a public repository): (token, None), or (None, (status, detail)) when
    the token service refuses."""
    import requests

    realm = challenge.get("realm", "")
    if credentials and (why := token_may_go_to(realm)):
        raise UserError(
            f"The registry's token service for {PARAMETER}'s credentials is {realm!r}: {why}. The serve step does "
            "not send the credentials there; use a registry whose token service is https."
        )
    query = {"scope": f"repository:{repository}:pull", **({"service": s} if (s := challenge.get("service")) else {})}
    response = session.get(f"{realm}?{urlencode(query)}", auth=credentials, timeout=CHECK_TIMEOUT)
    if response.status_code != 200:
        return None, (response.status_code, _detail(response))
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
    if not token:
        raise requests.RequestException(f"the token service {realm} answered without a token")
    return token, None


def _challenge_parameters(text: str) -> dict[str, str]:
    """``realm="https://auth/token",service="registry",scope="..."`` as a dict (values hold no commas that
    matter here: a scope's actions are asked afresh)."""
    pairs = (part.split("=", 1) for part in text.split(",") if "=" in part)
    return {key.strip().lower(): value.strip().strip('"') for key, value in pairs}


def _detail(response) -> str:
    """The registry's error codes and messages (the distribution spec's ``errors``), as ``: CODE message``."""
    try:
        errors = response.json().get("errors") or []
    except (ValueError, AttributeError):
        return ""
    said = "; ".join(f"{e.get('code', '')} {e.get('message', '')}".strip() for e in errors if isinstance(e, dict))
    return f": {said}" if said else ""


def _refusal(image: str, host: str, repository: str, secret: str, answer: str) -> str:
    """The paragraph for a registry that refuses the pods' credentials."""
    create = (
        f"oc create secret docker-registry NAME --docker-server={host} --docker-username=... --docker-password=... "
        "with a robot account or token that may only pull"
    )
    if secret:
        return (
            f"The registry {host} refused to let the credentials in the Secret '{secret}' ({PARAMETER}) read the "
            f"image {image} ({answer}), so KServe's pods, which pull it with that Secret, would fail to start. "
            f"Nothing was applied. Give that credential read (pull) access to {repository}, or put one that has it "
            f"in a Secret ({create}) and set {PARAMETER} to its name."
        )
    return (
        f"The registry {host} refused an anonymous read of the image {image} ({answer}), and {PARAMETER} is empty, "
        "so KServe's pods would pull it with no credentials and fail to start. Nothing was applied. Create a Secret "
        f"with a read-only (pull) credential for {repository} ({create}) and set {PARAMETER} to its name (if the "
        f"namespace's service account has such a pull Secret linked, name that one); not model_oci_secret, which "
        "can push."
    )


def _unreachable(image: str, host: str, who: str, what: str) -> str:
    """The warning for a registry that could not be asked from this pod."""
    return (
        f"WARNING: could not check that KServe's pods can pull {image} with {who}: asking the registry {host} "
        f"from this pod failed ({what}). Going on: the node's container runtime pulls the image, through the node's "
        "network and any registry mirror configured there, which may reach it when this pod cannot. If it cannot, "
        "the InferenceService does not become Ready and the step fails with the pull error in its events."
    )
