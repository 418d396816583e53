"""A fake Kubeflow Pipelines v2beta1 API server on 127.0.0.1.

No KFP server runs on the test machines, so ``pipelines.submit`` is pointed at
this one. It answers the endpoints the ``kfp_server_api`` client calls for a run
and a recurring run (healthz, experiments list/create, runs create, recurring
runs create) with the JSON shapes of the real API, requires the expected bearer
token when one is set, and records every request so tests can assert what the
server received.

Its healthz answer is the API server's own (kubeflow/pipelines
backend/src/apiserver/main.go, the /apis/v2beta1/healthz handler): commit_sha,
tag_name (the backend version; "unknown" where the image was built without one,
as OpenShift AI's are), multi_user and, since KFP 2.14.0, pipeline_store.
``tag_name`` and ``pipeline_store`` are settable; None leaves the field out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from local_server import LocalServer


@dataclass
class Received:
    method: str
    path: str
    query: dict
    authorization: str
    body: dict | None


class FakeKfp(LocalServer):
    def __init__(
        self,
        token: str | None = None,
        experiments: dict[str, str] | None = None,
        tag_name: str | None = "2.17.0",
        pipeline_store: str | None = "database",
        host: str = "127.0.0.1",
    ) -> None:
        self.token = token
        self.experiments = dict(experiments or {})  # display name -> id
        self.health = {
            "commit_sha": "4a3592cb2d",
            "tag_name": tag_name,
            "multi_user": False,
            "pipeline_store": pipeline_store,
        }
        self.received: list[Received] = []
        super().__init__(self._handler_class(), host=host)

    def bodies(self, method: str, path: str) -> list[dict]:
        return [r.body for r in self.received if r.method == method and r.path == path]

    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def _send(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                received = Received(
                    method,
                    parts.path,
                    parse_qs(parts.query),
                    self.headers.get("Authorization", ""),
                    json.loads(raw) if raw else None,
                )
                fake.received.append(received)
                if fake.token is not None and received.authorization != f"Bearer {fake.token}":
                    return self._send(401, {"error": "Unauthorized", "code": 16})
                route = (method, parts.path)
                if route == ("GET", "/apis/v2beta1/healthz"):
                    return self._send(200, {k: v for k, v in fake.health.items() if v is not None})
                if route == ("GET", "/apis/v2beta1/experiments"):
                    predicate = json.loads(received.query["filter"][0])["predicates"][0]
                    wanted = predicate.get("stringValue", predicate.get("string_value"))
                    found = [
                        {"experiment_id": eid, "display_name": name}
                        for name, eid in fake.experiments.items()
                        if name == wanted
                    ]
                    return self._send(200, {"experiments": found, "total_size": len(found)} if found else {})
                if route == ("POST", "/apis/v2beta1/experiments"):
                    experiment_id = f"exp-{len(fake.experiments) + 1}"
                    fake.experiments[received.body["display_name"]] = experiment_id
                    return self._send(
                        200, {"experiment_id": experiment_id, "display_name": received.body["display_name"]}
                    )
                if route == ("POST", "/apis/v2beta1/runs"):
                    return self._send(
                        200, {"run_id": "run-1", "display_name": received.body["display_name"], "state": "PENDING"}
                    )
                if route == ("POST", "/apis/v2beta1/recurringruns"):
                    return self._send(
                        200,
                        {
                            "recurring_run_id": "rr-1",
                            **{k: v for k, v in received.body.items() if k != "pipeline_spec"},
                        },
                    )
                return self._send(404, {"error": f"fake kfp: no route for {method} {parts.path}"})

        return Handler
