"""A fake Hugging Face Hub on 127.0.0.1 speaking the endpoints huggingface_hub uses.

No real Hub can be reached from the test machines, so tests point ``HF_ENDPOINT``
at this server (with ``HF_HUB_DISABLE_XET=1``: the fake speaks the classic LFS
protocol, not Xet). It keeps repositories in memory and implements what
publishing and downloading need, as the Hub does it:

- ``POST /api/repos/create`` (409 when the repository exists), repo info with its head commit,
- ``POST /api/validate-yaml``, ``POST /api/{type}s/{id}/preupload/{rev}`` (LFS for *.gguf,
  *.safetensors, *.png and large files; the remote oid of existing files, so unchanged files are skipped),
- the LFS batch API, object PUT and verify, checked against the sha256 the client announced,
- ``POST /api/{type}s/{id}/commit/{rev}``: an ndjson commit applied atomically, LFS pointers checked; a header
  ``parentCommit`` that is no longer the head is refused with 412 and nothing lands (the Hub's compare-and-swap:
  huggingface/datasets#7777, "HTTP 412 means a commit happened in the meantime"),
- ``GET /api/{type}s/{id}/tree/{rev}``, and ``HEAD``/``GET .../resolve/{rev}/{path}`` with the Hub's headers,
- ``GET /api/{type}s/{id}/revision/{rev}`` for ``main`` or the head commit (404 RevisionNotFound otherwise:
  files have no history here), which is what ``snapshot_download`` asks first.

Writes need ``Authorization: Bearer <a valid token>``; an invalid token is refused
on every endpoint (401), and a private repository looks missing without a token
(401 with ``X-Error-Code: RepoNotFound``), as on the Hub.
``fail_next(method, path_part, status)`` makes the next matching request answer
``status``, to test retries.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from local_server import LocalServer

LFS_SUFFIXES = (".gguf", ".safetensors", ".png", ".bin", ".parquet")
LFS_MIN_SIZE = 10 * 1024 * 1024


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    lfs_paths: set[str] = field(default_factory=set)
    commits: list[dict] = field(
        default_factory=list
    )  # {"oid", "summary", "description", "operations": [{"key", "path"}]}

    @property
    def head(self) -> str:
        return self.commits[-1]["oid"]

    def oid(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if path in self.lfs_paths else git_blob_sha(data)


class FakeHub(LocalServer):
    def __init__(self, valid_tokens: set[str]) -> None:
        self.valid_tokens = set(valid_tokens)
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs_store: dict[str, bytes] = {}
        self.log: list[tuple[str, str, int]] = []  # method, path, answered status
        self._failures: list[tuple[str, str, int]] = []
        self._lost: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        super().__init__(self._handler_class())

    def client_env(self, home: Path, token: str | None = None) -> dict[str, str]:
        """This process's environment for a huggingface_hub client of this server: no HF settings of the caller's
        (an offline flag, a token, a cache), the Hub at ``url`` with Xet off, online, its cache under ``home``."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
        env |= {
            "HF_ENDPOINT": self.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
            "HF_HOME": str(home),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "127.0.0.1",
        }
        if token:
            env["HF_TOKEN"] = token
        return env

    # --- test controls --------------------------------------------------------------------------

    def fail_next(self, method: str, path_part: str, status: int) -> None:
        """The next ``method`` request whose path contains ``path_part`` answers ``status``."""
        self._failures.append((method, path_part, status))

    def lose_next_response(self, method: str, path_part: str) -> None:
        """The next matching request is carried out, but its answer is replaced by a 503 (a lost response)."""
        self._lost.append((method, path_part))

    def add_repo(self, repo_type: str, repo_id: str, files: dict[str, bytes], private: bool = False) -> Repo:
        repo = Repo(private=private, files=dict(files))
        self.repos[(repo_type, repo_id)] = repo
        self._commit(repo, "initial commit", "", [{"key": "file", "path": p} for p in files], dict(files), set())
        return repo

    def requests_to(self, path_part: str, method: str | None = None) -> list[tuple[str, str, int]]:
        return [entry for entry in self.log if path_part in entry[1] and (method is None or entry[0] == method)]

    # --- the Hub --------------------------------------------------------------------------------

    def _commit(
        self, repo: Repo, summary: str, description: str, operations: list[dict], added: dict[str, bytes], lfs: set[str]
    ) -> str:
        oid = hashlib.sha1(f"{len(repo.commits)}:{summary}:{sorted(added)}".encode()).hexdigest()
        repo.commits.append({"oid": oid, "summary": summary, "description": description, "operations": operations})
        return oid

    def _handler_class(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self):
                self._dispatch("GET")

            def do_HEAD(self):
                self._dispatch("HEAD")

            def do_POST(self):
                self._dispatch("POST")

            def do_PUT(self):
                self._dispatch("PUT")

            # -- plumbing --

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, status: int, payload=None, headers: dict | None = None, raw: bytes | None = None) -> None:
                if getattr(self, "lose_response", False):
                    self.lose_response, status, payload, headers, raw = (
                        False,
                        503,
                        {"error": "response lost"},
                        None,
                        None,
                    )
                body = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else b"")
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                hub.log.append((self.command, self.path, status))

            def _authorised(self) -> bool:
                header = self.headers.get("Authorization", "")
                return header.startswith("Bearer ") and header[len("Bearer ") :] in hub.valid_tokens

            def _dispatch(self, method: str) -> None:
                body = self._body() if method in ("POST", "PUT") else b""
                path = urlsplit(self.path).path
                for index, (fail_method, part, status) in enumerate(hub._failures):
                    if fail_method == method and part in path:
                        del hub._failures[index]
                        return self._send(status, {"error": f"injected {status}"})
                for index, (lost_method, part) in enumerate(hub._lost):
                    if lost_method == method and part in path:
                        del hub._lost[index]
                        self.lose_response = True
                        break
                if self.headers.get("Authorization") and not self._authorised() and not path.startswith("/lfs-"):
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                with hub._lock:
                    self._route(method, path, parse_qs(urlsplit(self.path).query), body)

            def _route(self, method: str, path: str, query: dict, body: bytes) -> None:
                if method == "PUT" and path.startswith("/lfs-upload/"):
                    return self._lfs_put(path.rsplit("/", 1)[1], body)
                if method == "POST" and path == "/lfs-verify":
                    return self._send(200, {})
                if method == "POST" and path == "/api/repos/create":
                    return self._create_repo(json.loads(body))
                if method == "POST" and path == "/api/validate-yaml":
                    return self._validate_yaml(json.loads(body)["content"])
                match = re.fullmatch(r"/(?:(datasets)/)?([^/]+/[^/]+?)\.git/info/lfs/objects/batch", path)
                if match and method == "POST":
                    return self._lfs_batch(json.loads(body))
                match = re.fullmatch(
                    r"/api/(model|dataset)s/([^/]+/[^/]+)(?:/(revision|preupload|commit|tree)/([^/]+)(/.*)?)?", path
                )
                if match:
                    repo_type, repo_id, action, revision, rest = match.groups()
                    return self._api(method, repo_type, repo_id, action, unquote(revision or "main"), rest, body)
                match = re.fullmatch(r"/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if match and method in ("GET", "HEAD"):
                    repo_type = "dataset" if match.group(1) else "model"
                    return self._resolve(repo_type, match.group(2), unquote(match.group(4)))
                return self._send(404, {"error": f"fake hub: no route for {method} {path}"})

            def _repo(self, repo_type: str, repo_id: str, write: bool = False) -> Repo | None:
                """The repository when this request may see it (and write to it), else answer and return None."""
                if write and not self._authorised():
                    self._send(401, {"error": "Invalid credentials in Authorization header"})
                    return None
                repo = hub.repos.get((repo_type, repo_id))
                if repo is None or (repo.private and not self._authorised()):
                    self._send(
                        404 if self._authorised() else 401,
                        {"error": "Repository not found"},
                        {"X-Error-Code": "RepoNotFound"},
                    )
                    return None
                return repo

            # -- endpoints --

            def _create_repo(self, payload: dict) -> None:
                if not self._authorised():
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                repo_type = payload.get("type") or "model"
                repo_id = f"{payload['organization']}/{payload['name']}"
                if (repo_type, repo_id) in hub.repos:
                    return self._send(
                        409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}
                    )
                hub.add_repo(
                    repo_type,
                    repo_id,
                    {".gitattributes": b"*.gguf filter=lfs diff=lfs merge=lfs -text\n"},
                    private=payload.get("visibility") == "private" or bool(payload.get("private")),
                )
                return self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})

            def _api(self, method, repo_type, repo_id, action, revision, rest, body) -> None:
                repo = self._repo(repo_type, repo_id, write=action in ("preupload", "commit"))
                if repo is None:
                    return None
                if action == "revision" and revision not in ("main", repo.head):
                    # The Hub answers an unknown branch, tag or commit so (huggingface_hub's hf_raise_for_status
                    # turns it into RevisionNotFoundError); files here have no history, so only the head is served.
                    return self._send(
                        404, {"error": f"Invalid rev id: {revision}"}, {"X-Error-Code": "RevisionNotFound"}
                    )
                if action in (None, "revision") and method == "GET":
                    siblings = [{"rfilename": name} for name in sorted(repo.files)]
                    return self._send(
                        200, {"id": repo_id, "sha": repo.head, "private": repo.private, "siblings": siblings}
                    )
                if action == "tree" and method == "GET":
                    prefix = (rest or "").strip("/")
                    entries = [
                        {"type": "file", "path": name, "size": len(data), "oid": git_blob_sha(data)}
                        | (
                            {"lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}}
                            if name in repo.lfs_paths
                            else {}
                        )
                        for name, data in sorted(repo.files.items())
                        if not prefix or name.startswith(prefix + "/")
                    ]
                    return self._send(200, entries)
                if action == "preupload" and method == "POST":
                    files = json.loads(body)["files"]
                    return self._send(200, {"files": [self._upload_mode(repo, item) for item in files]})
                if action == "commit" and method == "POST":
                    return self._apply_commit(repo, repo_id, body)
                return self._send(404, {"error": f"fake hub: no {method} {action}"})

            def _validate_yaml(self, content: str) -> None:
                """The Hub checks the metadata against its schema; the fake knows one rule: license ids."""
                license_line = re.search(r"^license: (.+)$", content, re.MULTILINE)
                if license_line and license_line.group(1).strip() not in ("apache-2.0", "mit", "other"):
                    return self._send(400, {"errors": [{"message": '"license" must be one of [apache-2.0, mit, ...]'}]})
                return self._send(200, {"errors": [], "warnings": []})

            def _upload_mode(self, repo: Repo, item: dict) -> dict:
                lfs = item["path"].endswith(LFS_SUFFIXES) or item["size"] >= LFS_MIN_SIZE
                remote_oid = repo.oid(item["path"]) if item["path"] in repo.files else None
                if remote_oid is not None and (item["path"] in repo.lfs_paths) != lfs:
                    remote_oid = None
                return {
                    "path": item["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": remote_oid,
                }

            def _lfs_batch(self, payload: dict) -> None:
                if not self._authorised():
                    return self._send(401, {"message": "Invalid credentials"})
                objects = []
                for item in payload["objects"]:
                    entry = {"oid": item["oid"], "size": item["size"]}
                    if item["oid"] not in hub.lfs_store:
                        entry["actions"] = {
                            "upload": {"href": f"{hub.url}/lfs-upload/{item['oid']}"},
                            "verify": {"href": f"{hub.url}/lfs-verify"},
                        }
                    objects.append(entry)
                return self._send(200, {"transfer": "basic", "objects": objects})

            def _lfs_put(self, oid: str, body: bytes) -> None:
                if hashlib.sha256(body).hexdigest() != oid:
                    return self._send(400, {"error": "content does not match the announced sha256"})
                hub.lfs_store[oid] = body
                return self._send(200, {})

            def _apply_commit(self, repo: Repo, repo_id: str, body: bytes) -> None:
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                header = lines[0]["value"]
                if header.get("parentCommit") not in (None, repo.head):
                    return self._send(412, {"error": "A commit has happened since. Please refresh and try again."})
                files, lfs_paths, operations = dict(repo.files), set(repo.lfs_paths), []
                for line in lines[1:]:
                    key, value = line["key"], line["value"]
                    operations.append({"key": key, "path": value["path"]})
                    if key == "file":
                        files[value["path"]] = base64.b64decode(value["content"])
                        lfs_paths.discard(value["path"])
                    elif key == "lfsFile":
                        if value["oid"] not in hub.lfs_store:
                            return self._send(422, {"error": f"LFS object of {value['path']} was never uploaded"})
                        files[value["path"]] = hub.lfs_store[value["oid"]]
                        lfs_paths.add(value["path"])
                    elif key == "deletedFile":
                        files.pop(value["path"], None)
                        lfs_paths.discard(value["path"])
                    else:
                        return self._send(400, {"error": f"fake hub: unsupported operation {key}"})
                repo.files, repo.lfs_paths = files, lfs_paths
                oid = hub._commit(repo, header["summary"], header.get("description", ""), operations, files, lfs_paths)
                return self._send(
                    200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
                )

            def _resolve(self, repo_type: str, repo_id: str, filename: str) -> None:
                repo = self._repo(repo_type, repo_id)
                if repo is None:
                    return None
                if filename not in repo.files:
                    return self._send(
                        404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.head}
                    )
                data = repo.files[filename]
                etag = repo.oid(filename)
                headers = {"X-Repo-Commit": repo.head, "ETag": f'"{etag}"'}
                if filename in repo.lfs_paths:
                    headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
                return self._send(200, headers=headers, raw=data)

        return Handler
