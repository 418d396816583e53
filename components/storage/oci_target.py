"""Push a model version as a KServe modelcar image: its files under ``/models``, with no container daemon.

olot lays each file of the version onto the static busybox base
(``modelcar_base``) as one uncompressed layer at ``/models/<path>`` (the model
card as the annotated README layer), and oras-py pushes the layout: blobs
first, in 64 MiB chunks read from disk, the manifest and its tag last, so the
tag never names a half-pushed image. A registry that already holds a blob (a
retried step, a version whose files did not change) is not sent it again.

Credentials come from a ``kubernetes.io/dockerconfigjson`` Secret, which the
pipeline mounts at ``SECRET_MOUNT``; outside the cluster, from the file
``$REGISTRY_AUTH_FILE`` names (the variable podman and skopeo read). A
registry on 127.0.0.1 or localhost is spoken to over plain HTTP, as container
runtimes do; every other one over TLS, verified against the system CAs
(``REQUESTS_CA_BUNDLE`` adds a cluster's own).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from common.errors import UserError
from components.storage.modelcar_base import find_busybox, write_base_layout

AUTH_FILE_ENV = "REGISTRY_AUTH_FILE"
SECRET_MOUNT = Path("/var/run/secrets/model-oci-registry")  # where the pipeline mounts model_oci_secret
SECRET_KEY = ".dockerconfigjson"  # the key a kubernetes.io/dockerconfigjson Secret holds its config under
PUSH_CHUNK = 64 << 20  # bytes per upload request: the memory a push holds, whatever the file's size
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# The OCI distribution spec's repository name and tag grammars.
REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
TAG_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class OciImage:
    """A modelcar image in a registry."""

    uri: str  # oci://registry/repository:tag, what an InferenceService's storageUri names
    digest: str  # the manifest's digest: the image exactly, whatever later happens to the tag
    files: int
    total_bytes: int


def oci_location_problem(uri: str) -> str | None:
    """What is wrong with ``uri`` as a repository to push versions to, or None."""
    parts = urlsplit(uri)
    repository = parts.path.lstrip("/")
    if parts.scheme != "oci" or not parts.netloc or not repository or parts.query or parts.fragment or "@" in uri:
        return f"is {uri!r}, which is not an OCI repository; write oci://registry[:port]/repository"
    if ":" in repository:
        return (
            f"is {uri!r}, which names a tag; name the repository only (oci://{parts.netloc}/"
            f"{repository.split(':')[0]}): each run's image is tagged with its run id"
        )
    if not REPOSITORY.match(repository):
        return (
            f"names the repository {repository!r}, which a registry refuses: lowercase letters and digits, "
            "separated by '.', '_', '-' or '/'"
        )
    return None


def image_uri(repository_uri: str, run_id: str) -> str:
    """The image of run ``run_id`` in ``repository_uri``: tagged with the run id, in the characters tags allow."""
    problem = oci_location_problem(repository_uri)
    if problem:
        raise UserError(f"model_oci_uri {problem}.")
    tag = TAG_CHARACTERS.sub("-", run_id).lstrip(".-")[:128]
    return f"{repository_uri.rstrip('/')}:{tag}"


def push_version(folder: Path, uri: str, work_dir: Path, secret_hint: str) -> OciImage:
    """Build the modelcar image of every file under ``folder`` in ``work_dir`` and push it as ``uri``.

    ``secret_hint`` says, in an error, where the step's credentials come from.
    """
    from olot.basics import oci_layers_on_top
    from oras.layout.layout import NewLayout

    reference = uri.removeprefix("oci://")
    host = reference.split("/", 1)[0]
    credentials = _credentials(host, secret_hint)
    registry = _registry(host, credentials, secret_hint)
    busybox = find_busybox()
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    card = folder / "README.md"
    layout = work_dir / "modelcar-layout"
    shutil.rmtree(layout, ignore_errors=True)
    write_base_layout(layout, busybox)
    oci_layers_on_top(
        layout,
        [path for path in files if path != card],
        modelcard=card if card.is_file() else None,
        root_dir=folder,
        annotations={"org.opencontainers.image.title": reference},
    )
    try:
        response = NewLayout(str(layout)).push_to_registry(
            provider=registry, target=reference, do_chunked=True, chunk_size=PUSH_CHUNK
        )
    except (ValueError, OSError) as error:  # oras-py reports a refused request as a ValueError
        raise UserError(_refusal(uri, str(error), credentials is not None, secret_hint)) from None
    shutil.rmtree(layout)
    digest = response.headers.get("Docker-Content-Digest", "")
    return OciImage(uri, digest, len(files), sum(path.stat().st_size for path in files))


def _registry(host: str, credentials: tuple[str, str] | None, secret_hint: str):
    """An oras-py client for the registry ``host``, sending ``credentials`` (user name, password) when given.

    The registry's challenge decides how they are sent: a registry that asks for Basic auth (htpasswd, as
    distribution's registry) takes them on every request; one that asks for a Bearer token (Quay, the OpenShift
    registry, Docker Hub) exchanges them for a token. oras-py's token flow sent to a Basic registry would
    take its realm for a token server and retry for minutes.
    """
    import requests
    from oras.provider import Registry

    insecure = urlsplit(f"//{host}").hostname in LOOPBACK_HOSTS
    scheme = "http" if insecure else "https"
    try:
        challenge = requests.get(f"{scheme}://{host}/v2/", timeout=30).headers.get("WWW-Authenticate", "")
    except requests.RequestException as error:
        raise UserError(
            f"Could not reach the registry {host} ({scheme}): {error}. Check model_oci_uri's host and port, and "
            "that this pod's network reaches it."
        ) from None
    basic = challenge.lower().startswith("basic")
    if basic and credentials is None:  # oras-py would retry for minutes before failing on the missing password
        raise UserError(_anonymous(host, "it asks for Basic authentication", secret_hint))
    registry = Registry(insecure=insecure, auth_backend="basic" if basic else "token")
    if credentials:
        registry.auth.set_basic_auth(*credentials)
    return registry


def _credentials(host: str, secret_hint: str) -> tuple[str, str] | None:
    """The user name and password the auth file holds for ``host``; None without one (an anonymous push)."""
    path = os.environ.get(AUTH_FILE_ENV) or SECRET_MOUNT / SECRET_KEY
    if not Path(path).is_file():
        print(f"no registry credentials at {path}: pushing to {host} anonymously", flush=True)
        return None
    try:
        auths = json.loads(Path(path).read_text()).get("auths", {})
    except (ValueError, AttributeError):
        raise UserError(
            f'{path} is not a Docker config JSON ({{"auths": {{...}}}}); {secret_hint}, and it must be of type '
            "kubernetes.io/dockerconfigjson."
        ) from None
    entry = auths.get(host) or auths.get(f"https://{host}") or auths.get(f"http://{host}")
    if entry is None:
        raise UserError(
            f"The registry credentials hold no entry for {host} (they have: {', '.join(sorted(auths)) or 'none'}); "
            f"{secret_hint}. Add one for {host}, e.g. with oc create secret docker-registry --docker-server={host}."
        )
    if entry.get("auth"):
        user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        return user, password
    return entry.get("username", ""), entry.get("password", "")


def _refusal(uri: str, detail: str, had_credentials: bool, secret_hint: str) -> str:
    """What the registry's refusal of the push of ``uri`` means, and what to fix."""
    refused = any(word in detail for word in ("Unauthorized", "authentication", "Forbidden", "denied"))
    if refused and not had_credentials:
        return _anonymous(uri, detail, secret_hint)
    if refused:
        return (
            f"The registry refused to let this step push {uri} ({detail}): the credentials are wrong or may not "
            f"push to that repository; {secret_hint}."
        )
    return f"Pushing {uri} failed: {detail}"


def _anonymous(target: str, detail: str, secret_hint: str) -> str:
    return (
        f"The registry refused an anonymous push to {target} ({detail}): this step found no registry credentials; "
        f"{secret_hint}, mounted at {SECRET_MOUNT} (outside the cluster: set {AUTH_FILE_ENV})."
    )
