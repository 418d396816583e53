"""An HTTP server on 127.0.0.1 in a background thread, the base of the fake servers in the tests."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalServer:
    """Serves ``handler_class`` on ``port`` (0: a free one) of 127.0.0.1 from ``start()`` (or ``with``) until
    ``close()``."""

    def __init__(self, handler_class: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler_class)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
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
