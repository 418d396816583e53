"""A real MLflow tracking server on 127.0.0.1 (the ``mlflow`` package's own ``mlflow server``), and a proxy that dies.

The server keeps its runs in SQLite and proxies artifacts into a folder (``--artifacts-destination``), as an
OpenShift AI MLflow does into its bucket. It starts in its own process group, so that stopping it stops its
workers too. ``DyingProxy`` forwards requests to it until a condition is met, then answers nothing more (the
connection is closed without a reply): to the trainer that is the server dying mid-run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable

import requests
from local_server import LocalServer

# No telemetry, no background job runner: the server only answers the tests.
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
START_SECONDS = 120
for _name, _value in QUIET.items():  # before mlflow's client is imported, which reads them
    os.environ.setdefault(_name, _value)


@dataclass
class MlflowTestServer:
    url: str
    process: subprocess.Popen
    folder: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def client(self):
        """mlflow's own client, to read back what the pipeline logged."""
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.url)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_mlflow(folder: Path) -> MlflowTestServer:
    """``mlflow server`` under ``folder`` on a free port, once /health answers."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (folder / "server.log").open("wb")
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**os.environ, **QUIET}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = MlflowTestServer(f"http://127.0.0.1:{port}", process, folder)
    deadline = time.monotonic() + START_SECONDS
    while True:
        try:
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            server.stop()
            raise RuntimeError(f"mlflow server did not start: {(folder / 'server.log').read_text()[-3000:]}")
        time.sleep(0.2)


class DyingProxy:
    """Forwards every request to ``target`` until ``dies_after(path, body)`` is true of one it has forwarded; from
    then on it closes each connection without an answer. ``requests`` records what came, in order."""

    def __init__(self, target: str, dies_after: Callable[[str, bytes], bool]) -> None:
        self.requests: list[str] = []
        self.dead = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append(self.path)
                if proxy.dead.is_set():
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                headers = {key: value for key, value in self.headers.items() if key.lower() != "host"}
                answer = requests.request(self.command, target + self.path, data=body, headers=headers, timeout=30)
                if dies_after(self.path, body):
                    proxy.dead.set()
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = LocalServer(Handler)
        self.url = self.server.url

    def __enter__(self) -> DyingProxy:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.close()
