"""A fake of Kubeflow Trainer's status server: where a training pod posts its progress into the TrainJob's status.

No Kubeflow Trainer runs here, so this follows its source (kubeflow/trainer v2.3.0, pkg/statusserver/server.go,
auth.go and the integration tests; KEP-2779): HTTPS, ``POST
/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status`` with ``Authorization: Bearer
<token>`` (the pod's projected service account token), a body ``{"trainerStatus": {...}}`` of at most 64 KiB.
Answers as upstream's: 403 "Forbidden" for a missing or wrong token, 413 for a larger body, 422 "Invalid payload"
for one that is not such JSON, 200 ``{}`` without ``trainerStatus``, 422 for a status the CRD refuses (checked
against the vendored CRD, tests/schemas, with its ``lastUpdatedTime`` rule), 404 for another job, and otherwise 200
with the request echoed, ``lastUpdatedTime`` cut to whole seconds in UTC. Each update replaces the whole status,
as the controller's server-side apply does. The environment it gives a trainer is the controller's injection:
the URL, and the paths of the CA certificate and of the token.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from crd_schemas import trainer_status_errors
from local_server import LocalServer, self_signed_certificate

MAX_BODY = 64 * 1024
PATH = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)/status$")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


class FakeTrainerStatus(LocalServer):
    """The status server for TrainJob ``namespace/name``; ``updates`` holds every accepted ``trainerStatus``, in
    order, and ``refused`` every refusal (code, message)."""

    def __init__(self, folder: Path, namespace: str = "team-a", name: str = "llm-finetune-run-1") -> None:
        self.namespace, self.name = namespace, name
        self.updates: list[dict[str, Any]] = []
        self.refused: list[tuple[int, str]] = []
        self.token = secrets.token_urlsafe(24)
        folder.mkdir(parents=True, exist_ok=True)
        self.ca_file, key_file = self_signed_certificate(folder)
        self.token_file = folder / "token"
        self.token_file.write_text(self.token)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                if code != 200:
                    fake.refused.append((code, body.get("message", "")))
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                match = PATH.match(self.path)
                if not match:
                    return self._send(404, _status(404, "NotFound", "Not found"))
                if self.headers.get("Authorization") != f"Bearer {fake.token}" or match[1] != fake.namespace:
                    return self._send(403, _status(403, "Forbidden", "Forbidden"))
                if length > MAX_BODY:
                    return self._send(413, _status(413, "RequestEntityTooLarge", "Payload too large"))
                try:
                    body = json.loads(raw)
                    trainer_status = body.get("trainerStatus") if isinstance(body, dict) else None
                except ValueError:
                    return self._send(422, _status(422, "Invalid", "Invalid payload"))
                if trainer_status is None:
                    return self._send(200, {})
                if match[2] != fake.name:
                    return self._send(404, _status(404, "NotFound", "Train job not found"))
                errors = trainer_status_errors(trainer_status) + _time_errors(trainer_status)
                if errors:
                    message = f'TrainJob.trainer.kubeflow.org "{fake.name}" is invalid: ' + "; ".join(errors)
                    return self._send(422, _status(422, "Invalid", message))
                fake.updates.append(trainer_status)
                return self._send(200, body)

            def do_GET(self) -> None:
                self._send(404, _status(404, "NotFound", "Not found"))

        super().__init__(Handler, tls=(self.ca_file, key_file))

    @property
    def status_url(self) -> str:
        return f"{self.url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{self.namespace}/trainjobs/{self.name}/status"

    def environment(self) -> dict[str, str]:
        """What the controller injects into a trainer container when its TrainJobStatus gate is on."""
        return {
            "KUBEFLOW_TRAINER_SERVER_URL": self.status_url,
            "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(self.ca_file),
            "KUBEFLOW_TRAINER_SERVER_TOKEN": str(self.token_file),
        }


def _time_errors(trainer_status: dict[str, Any]) -> list[str]:
    """The API server parses ``lastUpdatedTime`` as an RFC 3339 time (jsonschema does not check ``date-time``)."""
    value = trainer_status.get("lastUpdatedTime")
    try:
        dt.datetime.fromisoformat(str(value))
    except ValueError:
        return [f"lastUpdatedTime: {value!r} is not an RFC 3339 time"]
    return []
