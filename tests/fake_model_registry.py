"""A fake Kubeflow Model Registry REST server on 127.0.0.1, for the registration tests.

No Model Registry installs here (upstream runs it as a Go server in front of
ML Metadata and a database), so this fake follows the upstream API instead:
kubeflow/model-registry ``api/openapi/model-registry.yaml`` at v1alpha3 (the
copy vendored in ``tests/schemas/model-registry-openapi.yaml``) and the behaviour of
its Go server (``internal/server/openapi/api_model_registry_service_service.go``):
find-by-name lookups answer 404 with an ``Error`` body when nothing matches,
creation answers 201, PATCH replaces the fields it is sent (``customProperties``
as a whole), ids and times are strings, and a POST to a version's artifacts
with an ``id`` updates that artifact (200) instead of creating one (201).

Every request the client sends and every answer the fake gives is validated
against the published spec with openapi-core; a violation is recorded in
``violations`` (and an invalid request is answered 400, as the real server's
generated router does), and the tests assert there is none.

``failures`` makes it answer the next requests with those statuses instead
(503, 429, ...), as a proxy or gateway in front of a restarting or busy
registry does; the requests are recorded but not served.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, urlsplit

from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse

from tests.crd_schemas import SCHEMAS
from tests.local_server import LocalServer
from tests.yaml_files import read_yaml

SPEC = SCHEMAS / "model-registry-openapi.yaml"
PREFIX = "/api/model_registry/v1alpha3"
NOW = "1764115200000"  # milliseconds since the epoch, as a string: the spec's createTimeSinceEpoch


def load_spec() -> OpenAPI:
    spec = read_yaml(SPEC)
    spec["servers"] = [{"url": "http://127.0.0.1"}]  # the fake's own host; paths are matched as published
    return OpenAPI.from_dict(spec)


class FakeModelRegistry(LocalServer):
    def __init__(self, token: str | None = None, port: int = 0) -> None:
        self.token = token
        self.openapi = load_spec()
        self.registered_models: dict[str, dict] = {}
        self.model_versions: dict[str, dict] = {}
        self.artifacts: dict[str, dict] = {}  # id -> artifact, with its version's id under "_version"
        self.requests: list[tuple[str, str]] = []
        self.violations: list[str] = []
        self.failures: list[int] = []  # statuses to answer the next requests with, in order, instead of serving them
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        super().__init__(self._handler_class(), port)

    def version_artifacts(self, version_id: str) -> list[dict]:
        return [self._public(a) for a in self.artifacts.values() if a["_version"] == version_id]

    def _public(self, artifact: dict) -> dict:
        return {key: value for key, value in artifact.items() if key != "_version"}

    def _new(self, body: dict, **extra) -> dict:
        return {
            **body,
            "id": str(next(self._ids)),
            "createTimeSinceEpoch": NOW,
            "lastUpdateTimeSinceEpoch": NOW,
        } | extra

    def _route(self, method: str, path: str, query: dict, body: dict) -> tuple[int, dict]:
        parts = path.removeprefix(PREFIX).strip("/").split("/")
        if parts == ["registered_model"] and method == "GET":
            found = [m for m in self.registered_models.values() if m["name"] == query.get("name")]
            return (200, found[0]) if found else _not_found(f"registered model {query.get('name')!r}")
        if parts == ["registered_models"] and method == "GET":
            items = list(self.registered_models.values())
            return 200, {"items": items, "size": len(items), "pageSize": len(items), "nextPageToken": ""}
        if parts == ["registered_models"] and method == "POST":
            model = self._new(body, state=body.get("state", "LIVE"))
            self.registered_models[model["id"]] = model
            return 201, model
        if parts == ["model_version"] and method == "GET":
            found = [
                v
                for v in self.model_versions.values()
                if v["name"] == query.get("name") and v["registeredModelId"] == query.get("parentResourceId")
            ]
            return (200, found[0]) if found else _not_found(f"model version {query.get('name')!r}")
        if parts == ["model_versions"] and method == "POST":
            if body["registeredModelId"] not in self.registered_models:
                return _not_found(f"registered model {body['registeredModelId']}")
            version = self._new(body, state=body.get("state", "LIVE"))
            self.model_versions[version["id"]] = version
            return 201, version
        if len(parts) == 2 and parts[0] == "model_versions" and method == "GET":
            found = self.model_versions.get(parts[1])
            return (200, found) if found else _not_found(f"model version {parts[1]}")
        if len(parts) == 2 and parts[0] == "model_versions" and method == "PATCH":
            if parts[1] not in self.model_versions:
                return _not_found(f"model version {parts[1]}")
            self.model_versions[parts[1]].update(body, lastUpdateTimeSinceEpoch=NOW)
            return 200, self.model_versions[parts[1]]
        if len(parts) == 3 and parts[0] == "model_versions" and parts[2] == "artifacts":
            if parts[1] not in self.model_versions:
                return _not_found(f"model version {parts[1]}")
            if method == "GET":
                items = self.version_artifacts(parts[1])
                return 200, {"items": items, "size": len(items), "pageSize": len(items), "nextPageToken": ""}
            if method == "POST" and body.get("id") in self.artifacts:
                self.artifacts[body["id"]].update(body, lastUpdateTimeSinceEpoch=NOW)
                return 200, self._public(self.artifacts[body["id"]])
            if method == "POST":
                artifact = self._new(body, state=body.get("state", "UNKNOWN"), _version=parts[1])
                self.artifacts[artifact["id"]] = artifact
                return 201, self._public(artifact)
        if len(parts) == 2 and parts[0] == "model_artifacts" and method == "PATCH":
            if parts[1] not in self.artifacts:
                return _not_found(f"model artifact {parts[1]}")
            self.artifacts[parts[1]].update(body, lastUpdateTimeSinceEpoch=NOW)
            return 200, self._public(self.artifacts[parts[1]])
        return _not_found(f"{method} {path} (not served by this fake)")

    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self):
                self._dispatch("GET")

            def do_POST(self):
                self._dispatch("POST")

            def do_PATCH(self):
                self._dispatch("PATCH")

            def _dispatch(self, method: str) -> None:
                url = urlsplit(self.path)
                query = dict(parse_qsl(url.query))
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                content_type = (self.headers.get("Content-Type") or "application/json").split(";")[0]
                request = MockRequest(
                    "http://127.0.0.1", method.lower(), url.path, args=query, data=raw or None,
                    headers=dict(self.headers), content_type=content_type,
                )  # fmt: skip
                with fake._lock:
                    fake.requests.append((method, self.path))
                    injected = bool(fake.failures)  # a proxy's answer, not the registry's: not in its spec
                    if injected:
                        status = fake.failures.pop(0)
                        payload = {"code": str(status), "message": "injected by the test"}
                    elif fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                        status, payload = 401, {"code": "401", "message": "Unauthorized"}
                    else:
                        try:
                            fake.openapi.validate_request(request)
                        except Exception as error:  # openapi-core's validation errors have no common base here
                            fake.violations.append(f"request {method} {self.path}: {error!r} {raw[:500]!r}")
                            status, payload = 400, {"code": "400", "message": str(error)}
                        else:
                            status, payload = fake._route(method, url.path, query, json.loads(raw or b"{}"))
                    data = json.dumps(payload).encode()
                    if status != 401 and not injected:
                        try:
                            fake.openapi.validate_response(request, MockResponse(data, status_code=status))
                        except Exception as error:
                            fake.violations.append(f"response to {method} {self.path}: {error!r} {data[:500]!r}")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _not_found(what: str) -> tuple[int, dict]:
    return 404, {"code": "404", "message": f"{what} not found"}


if __name__ == "__main__":  # for the local --param set of docs/getting-started/local.md: PORT [TOKEN]
    import sys
    import time

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8089
    token = sys.argv[2] if len(sys.argv) > 2 else None  # the bearer token it takes (the published spec requires one)
    registry = FakeModelRegistry(token=token, port=port).start()
    needs = "the bearer token given" if token else "no token: the spec's validation refuses every request"
    print(f"fake Model Registry at {registry.url} ({needs}); Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        registry.close()
