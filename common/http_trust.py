"""Where a bearer token may be sent: the one rule every step and command that presents a token asks.

A bearer token is a password that anyone who reads it can replay. Over plain
http it crosses the network in clear text, readable by every hop; so a token
goes only over https, or to this machine (loopback: 127.0.0.0/8, ::1, an
IPv4-mapped ::ffff:127.x.y.z, localhost), where it never reaches a network.
The exception is a network that encrypts itself (a service mesh with mTLS
between the pods), which only the user can vouch for, so it takes an explicit
parameter (``allow_http``).

Host names are judged as written, never resolved: a name that resolves to
127.0.0.1 here may resolve elsewhere in the pod, and a check that trusted DNS
would trust whoever answers it.

The host judged must be the host the client connects to. Parsers disagree on
odd URLs: ``http://evil.com\\@127.0.0.1`` is 127.0.0.1 to ``urllib.parse`` and
evil.com to urllib3 (which kfp's and requests' clients use). So a URL whose
host part holds a user name or password (``@``) or a backslash is refused,
and so is one whose host urllib3 reads otherwise than ``urllib.parse`` does.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """``host`` (as ``urlsplit`` gives it: no brackets) is this machine: a loopback address or ``localhost``.

    An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is judged by its IPv4 address, which is where a
    connection to it goes; ``ipaddress`` itself changed its answer for those in Python 3.13, so the rule says it
    here rather than inherit whichever one the interpreter gives."""
    if host.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name: not resolved (see the module's docstring)
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def token_may_go_to(url: str, allow_http: bool = False, *, https_only: bool = False) -> str | None:
    """None when a bearer token may be sent to ``url``; otherwise why not, as a clause for a one-paragraph error.

    ``allow_http``: the user vouches that the network encrypts plain http (a service mesh's mTLS).
    ``https_only``: the token is the pod's own credential (its service account's), which goes over https only,
    to loopback or not, whatever ``allow_http`` says.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an https URL, so a bearer token has nowhere safe to go"
    if why := host_in_doubt(url, parts):
        return why
    if parts.scheme.lower() == "https":
        return None
    if https_only:
        return f"{url} is plain http, and this token goes over https only"
    if is_loopback(parts.hostname) or allow_http:
        return None
    return (
        f"{url} is plain http to {parts.hostname}, which is not this machine (loopback), so the bearer token would "
        "cross the network unencrypted, readable by anyone on the way"
    )


def host_in_doubt(url: str, parts: SplitResult) -> str | None:
    """Why the host ``urlsplit`` reads from ``url`` may not be the one a client connects to, or None.

    The clause never shows a URL that holds a user name or password."""
    if "@" in parts.netloc:
        return (
            "the URL holds a user name or password before its host ('@'): a credential in a URL is logged and "
            "recorded with it, and an '@' can make one URL name different hosts to different clients; write the URL "
            "without it"
        )
    if "\\" in parts.netloc:
        return (
            f"{url} has a backslash in its host part, which clients read differently (part of the name to one, a "
            "'/' to another), so which host it names is not certain"
        )
    try:
        connected = parse_url(url).host or ""
    except LocationParseError:
        connected = ""
    if _comparable(connected) != _comparable(parts.hostname or ""):
        return (
            f"{url} names the host {parts.hostname!r} to Python's URL parser but {connected or 'no valid host'!r} to "
            "urllib3, which the HTTP clients use, so which host it names is not certain"
        )
    return None


def _comparable(host: str) -> str:
    """``host`` as both parsers should agree on it: lowercase, IPv6 brackets off, a zone's ``%25`` as ``%``, and a
    non-ASCII name in its IDNA form (urllib3 encodes one; ``urlsplit`` keeps it as written)."""
    host = host.lower().removeprefix("[").removesuffix("]").replace("%25", "%")
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host
