"""An HTTP server on 127.0.0.1 in a background thread, the base of the fake servers in the tests."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class LocalServer:
    """Serves ``handler_class`` on ``port`` (0: a free one) of ``host`` (default 127.0.0.1) from ``start()`` (or
    ``with``) until ``close()``; with ``tls`` (certificate and key files, ``self_signed_certificate``), over https."""

    def __init__(
        self,
        handler_class: type[BaseHTTPRequestHandler],
        port: int = 0,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, port), handler_class)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{self._server.server_address[1]}"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class _IPv6Server(ThreadingHTTPServer):
    """A server on an IPv6 address (``::1``): the standard one binds IPv4 only."""

    address_family = socket.AF_INET6


def ipv6_loopback() -> bool:
    """This machine can bind ``::1`` (some containers have no IPv6, not even on loopback)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback: the one its default route leaves from.

    A server bound there is on this machine, so a test can see whether anything reached it, yet a URL naming it
    is, to the token rule (``common.http_trust``), another machine's. Connecting a UDP socket only picks the
    route; no packet is sent (192.0.2.1 is TEST-NET-1, documentation only).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError as error:
            raise RuntimeError(f"this machine has no network interface besides loopback ({error})") from None
        address = probe.getsockname()[0]
    assert not ipaddress.ip_address(address).is_loopback, address
    return address


class HeaderRecorder(LocalServer):
    """Records each request's method, path and Authorization header, and answers every one 401 (JSON): a
    server that shows what a client sent it, and accepts nothing. With ``tls`` (certificate and key files,
    ``self_signed_certificate``) it serves https."""

    def __init__(self, host: str = "127.0.0.1", tls: tuple[Path, Path] | None = None) -> None:
        self.received: list[tuple[str, str, str | None]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.received.append((self.command, self.path, self.headers.get("Authorization")))
                body = json.dumps({"code": "401", "message": "Unauthorized"}).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = _answer

        super().__init__(Handler, host=host, tls=tls)

    @property
    def authorizations(self) -> set[str | None]:
        return {authorization for _, _, authorization in self.received}


def self_signed_certificate(folder: Path, ip: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for ``ip`` and its key, as PEM files in ``folder``: (certificate, key). Trusting the
    certificate (``SSL_CERT_FILE``, which OpenSSL's default verify paths read) lets a client verify an https
    server on 127.0.0.1 the way it verifies a real one."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test server {ip}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "server.crt", folder / "server.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file
