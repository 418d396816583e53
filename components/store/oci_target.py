"""Push a model version as a KServe modelcar image: its files under ``/models``, with no container daemon.

olot lays each file of the version onto the static busybox base
(``modelcar_base``) as one uncompressed layer at ``/models/<path>`` (the model
card as the annotated README layer), and oras-py pushes the layout: blobs
first, in 64 MiB chunks read from disk, the manifest and its tag last, so the
tag never names a half-pushed image. A registry that already holds a blob (a
retried step, a version whose files did not change) is not sent it again.

The image's digest is computed here, from the manifest bytes the push sends,
not read from the registry's answer: the serve step deploys the image by that
digest (``pinned_uri``), so what it serves is what this step built, whatever
later happens to the tag or to a registry (or proxy) that answers with another.

Credentials come from a ``kubernetes.io/dockerconfigjson`` Secret, which the
pipeline mounts at ``SECRET_MOUNT``; outside the cluster, from the file
``$REGISTRY_AUTH_FILE`` names (the variable podman and skopeo read). A
registry on 127.0.0.1 or localhost is spoken to over plain HTTP, as container
runtimes do; every other one over TLS, verified against the system CAs
(``REQUESTS_CA_BUNDLE`` adds a cluster's own).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from common.atomic import write_file_atomic
from common.errors import UserError
from common.records import StoredCopy
from components.store.modelcar_base import find_busybox, write_base_layout
from components.store.registry_auth import SECRET_KEY, credentials_in, registry_scheme

AUTH_FILE_ENV = "REGISTRY_AUTH_FILE"
SECRET_MOUNT = Path("/var/run/secrets/model-oci-registry")  # where the pipeline mounts model_oci_secret
PUSH_CHUNK = 64 << 20  # bytes per upload request: the memory a push holds, whatever the file's size
# Seconds to connect to the registry, and to wait for its answer to any one request (a chunk, the manifest).
# oras-py sets no timeout, so a registry that stops answering would hold the step until the pipeline's own. It
# tries each request 5 times, sleeping 3, 5, 11, 29 and 83 s between (oras.decorator.retry), so one that never
# answers ends the push in under 30 minutes.
PUSH_TIMEOUT = (30.0, 300.0)
# The OCI distribution spec's repository name and tag grammars.
REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
TAG_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]")
MANIFEST_FILE = "modelcar-manifest.json"  # in the store step's folder: the manifest bytes pushed, as evidence
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")  # the only digest algorithm the modelcar is pushed with


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


def pinned_uri(uri: str, digest: str) -> str:
    """``oci://registry/repository@sha256:...``: the image ``uri`` (tagged) names, pinned to ``digest``.

    A tag can be moved by anyone who may push; a digest names the same bytes forever, so this is what an
    InferenceService's storageUri gets."""
    if not DIGEST.match(digest or ""):
        raise UserError(
            f"The store step's record holds no sha256 digest for the image {uri} (it holds {digest!r}), so it "
            "cannot be served by digest: the image may have been pushed by an older version of this pipeline. "
            "Run the store step of this run again (it computes the digest of the manifest it pushes)."
        )
    reference = uri.removeprefix("oci://")
    host_and_path, _, last = reference.rpartition("/")
    return f"oci://{host_and_path}/{last.split('@')[0].split(':')[0]}@{digest}"


def push_version(folder: Path, uri: str, work_dir: Path, secret_hint: str) -> StoredCopy:
    """Build the modelcar image of every file under ``folder`` in ``work_dir`` and push it as ``uri``.

    ``secret_hint`` says, in an error, where the step's credentials come from.
    """
    import requests
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
    image = NewLayout(str(layout))
    manifest = _manifest_bytes(image, layout)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    try:
        response = image.push_to_registry(provider=registry, target=reference, do_chunked=True, chunk_size=PUSH_CHUNK)
    except requests.Timeout:
        raise UserError(
            f"The registry {host} stopped answering while this step pushed {uri} (no answer to one request in "
            f"{PUSH_TIMEOUT[1]:.0f} s, or no connection in {PUSH_TIMEOUT[0]:.0f} s). Nothing was tagged: the tag is "
            "pushed last. Run the step again; blobs the registry already holds are not sent again."
        ) from None
    except (ValueError, OSError) as error:  # oras-py reports a refused request as a ValueError
        raise UserError(_refusal(uri, str(error), credentials is not None, secret_hint)) from None
    shutil.rmtree(layout)
    _check_registry_digest(uri, digest, response.headers.get("Docker-Content-Digest", ""))
    write_file_atomic(work_dir / MANIFEST_FILE, lambda handle: handle.write(manifest))
    return StoredCopy(uri, len(files), sum(path.stat().st_size for path in files), digest)


def _manifest_bytes(image, layout: Path) -> bytes:
    """The manifest bytes ``push_to_registry`` sends: it pushes the layout's blobs in order and PUTs the last,
    the manifest, under the tag, as the bytes of its file. They are read here to be hashed by this step rather
    than taken from the registry's answer.

    The layout names each blob by its digest; a manifest whose bytes do not hash to its name is refused, as a
    registry would refuse it, before anything is sent."""
    named = image.get_ordered_blobs()[-1]
    data = image.digest_to_blob_path(named).read_bytes()
    if "sha256:" + hashlib.sha256(data).hexdigest() != named:
        raise UserError(
            f"The modelcar image built in {layout} names its manifest {named}, but its bytes hash to something "
            "else: the build folder was changed while the step ran. Run the store step again."
        )
    return data


def _check_registry_digest(uri: str, digest: str, answered: str) -> None:
    """Fail when the registry says it stored another manifest than the one pushed: the image could then not
    be pulled by the digest the serve step deploys. A registry that does not say is taken at the bytes sent."""
    if answered and answered != digest:
        raise UserError(
            f"The registry answered the push of {uri} with the digest {answered}, but the manifest pushed hashes "
            f"to {digest}: it stored something else than what was sent (a registry or proxy that rewrites "
            "manifests), so the image cannot be served by digest. Push to a registry that keeps manifests as "
            "sent (model_oci_uri)."
        )


def _registry(host: str, credentials: tuple[str, str] | None, secret_hint: str):
    """An oras-py client for the registry ``host``, sending ``credentials`` (user name, password) when given.

    The registry's challenge decides how they are sent: a registry that asks for Basic auth (htpasswd, as
    distribution's registry) takes them on every request; one that asks for a Bearer token (Quay, the OpenShift
    registry, Docker Hub) exchanges them for a token. oras-py's token flow sent to a Basic registry would
    take its realm for a token server and retry for minutes.
    """
    import requests
    from oras.provider import Registry

    scheme = registry_scheme(host)
    insecure = scheme == "http"
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
    _time_out(registry.session, PUSH_TIMEOUT)
    if credentials:
        registry.auth.set_basic_auth(*credentials)
    return registry


def _time_out(session, timeout: tuple[float, float]) -> None:
    """Give every request of ``session`` ``timeout`` unless it sets one. oras-py sends its pushes, and its auth
    backend its token requests, through this one session and never passes a timeout; ``Session.get`` and the rest
    call ``request``, so this covers them all."""
    send = session.request

    def request(method, url, **kwargs):
        kwargs.setdefault("timeout", timeout)
        return send(method, url, **kwargs)

    session.request = request


def _credentials(host: str, secret_hint: str) -> tuple[str, str] | None:
    """The user name and password the auth file holds for ``host``; None without one (an anonymous push)."""
    path = os.environ.get(AUTH_FILE_ENV) or SECRET_MOUNT / SECRET_KEY
    if not Path(path).is_file():
        print(f"no registry credentials at {path}: pushing to {host} anonymously", flush=True)
        return None
    return credentials_in(Path(path), host, secret_hint)


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
