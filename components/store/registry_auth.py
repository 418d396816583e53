"""Registry credentials from a ``kubernetes.io/dockerconfigjson`` Secret, and how a registry is spoken to.

Shared by the store step, which pushes the modelcar with ``model_oci_secret``,
and the serve step, which checks that KServe's pods can pull it with
``model_oci_pull_secret``: both read the Secret as the file its key
``.dockerconfigjson`` is mounted as, and both speak to a registry on loopback
over plain HTTP (as container runtimes do) and to every other one over TLS only.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import urlsplit

from common.errors import UserError
from common.http_trust import is_loopback

SECRET_KEY = ".dockerconfigjson"  # the key a kubernetes.io/dockerconfigjson Secret holds its config under


def registry_scheme(host: str) -> str:
    """``http`` for a registry on this machine (``host`` as an image reference writes it, with its port), else
    ``https``: credentials never cross a network in clear text. "This machine" is the one rule the bearer tokens
    follow too (``common.http_trust.is_loopback``), so the two cannot drift apart."""
    return "http" if is_loopback(urlsplit(f"//{host}").hostname or "") else "https"


def credentials_in(path: Path, host: str, secret_hint: str) -> tuple[str, str]:
    """The user name and password the Docker config JSON at ``path`` holds for the registry ``host``.

    ``secret_hint`` says, in an error, where the file comes from. An entry may be keyed by the host alone or as a
    URL, and hold ``auth`` (base64 of user:password, what ``oc create secret docker-registry`` writes) or the
    two fields."""
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
