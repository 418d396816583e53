"""A real OCI registry on 127.0.0.1 for the modelcar tests: Debian's ``docker-registry`` (CNCF distribution 2.8).

It runs with htpasswd (Basic) authentication, as an on-premises registry does, on
a free port, with its storage in a temporary folder. ``make test`` installs the
package; run without it, the fixture fails with the command that installs it.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import requests

INSTALL = "apt-get install -y --no-install-recommends docker-registry skopeo busybox-static"
USER, PASSWORD = "ci-pusher", "s3cret-registry-password"
# A second account, for the credential KServe's pods pull with (model_oci_pull_secret). htpasswd gives every
# account the same rights, so it shows that the serve step uses its own Secret, not that the account is read-only.
PULL_USER, PULL_PASSWORD = "ci-puller", "s3cret-pull-password"


@dataclass(frozen=True)
class LocalRegistry:
    host: str  # 127.0.0.1:PORT
    auth_file: Path  # a Docker config JSON with the right credentials, as a dockerconfigjson Secret holds

    def auth_file_with(self, folder: Path, user: str, password: str) -> Path:
        """A Docker config JSON for this registry with other credentials."""
        return write_auth_file(folder / f"auth-{user}.json", self.host, user, password)


def require(command: str) -> str:
    """The path of ``command``; fails (never skips) with the install command when it is missing."""
    path = shutil.which(command)
    if path is None:
        raise RuntimeError(f"{command} is not installed; `make test` installs it as root, or run: sudo {INSTALL}")
    return path


def write_auth_file(path: Path, host: str, user: str, password: str) -> Path:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def start_registry(folder: Path, port: int = 0):
    """Start the registry under ``folder`` on ``port`` (0: a free one); returns (LocalRegistry, process)."""
    binary = require("docker-registry")
    if not port:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    host = f"127.0.0.1:{port}"
    accounts = ((USER, PASSWORD), (PULL_USER, PULL_PASSWORD))
    (folder / "htpasswd").write_bytes(
        b"\n".join(
            user.encode() + b":" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)) for user, password in accounts
        )
    )
    config = folder / "config.yml"
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(folder / "data")}, "delete": {"enabled": True}},
                "http": {"addr": host},
                "auth": {"htpasswd": {"realm": "basic-realm", "path": str(folder / "htpasswd")}},
            }
        )
    )
    log = (folder / "registry.log").open("wb")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"http://{host}/v2/", timeout=2).status_code == 401:
                break
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise RuntimeError(f"docker-registry did not start: {(folder / 'registry.log').read_text()}")
        time.sleep(0.2)
    return LocalRegistry(host, write_auth_file(folder / "auth.json", host, USER, PASSWORD)), process


if __name__ == "__main__":  # for the local --param set of docs/getting-started/local.md
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # kill or Ctrl-C: the registry goes too
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "local-run/oci-registry").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    registry, process = start_registry(folder, int(sys.argv[2]) if len(sys.argv) > 2 else 5055)
    print(f"registry at {registry.host}; REGISTRY_AUTH_FILE={registry.auth_file}; Ctrl-C stops it", flush=True)
    try:
        process.wait()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        process.terminate()
