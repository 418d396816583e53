"""The base image of a modelcar: a static busybox, written as an OCI image layout with no daemon and no network.

KServe runs a modelcar image twice (kserve ``pkg/utils`` ``CreateModelcarContainer``
and ``CreateModelcarInitContainer``): as an init container with the arguments
``sh -c "... [ -d /models ] && [ \"$(ls -A /models)\" ] ..."`` and as a sidecar
with ``sh -c "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"``. Both
pass *arguments*, appended to any entrypoint, so the image must have no
entrypoint and ``sh``, ``ls``, ``[``, ``echo``, ``ln`` and ``sleep`` on its PATH.
One statically linked busybox with those applets as symlinks is all of that
(about 1 MB), and needs no base image pulled from a registry that an
air-gapped cluster may not reach.

The busybox comes from ``$MODELCAR_BUSYBOX`` (the runtime image sets it) or the
PATH (Debian's ``busybox-static``). Tar entries and gzip headers carry no time,
so the base layer's digest depends on the busybox binary alone.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

from common.errors import UserError

BUSYBOX_ENV = "MODELCAR_BUSYBOX"
APPLETS = ("sh", "ln", "sleep", "ls", "echo", "[", "test", "cat")
# ELF e_machine -> the OCI platform architecture the image is for.
ARCHITECTURES = {0x3E: "amd64", 0xB7: "arm64", 0x15: "ppc64le", 0x16: "s390x"}
PT_INTERP = 3  # a program header naming a dynamic loader: the binary is not static
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


def find_busybox() -> Path:
    """The static busybox to build the base from; refuses a missing or dynamically linked one."""
    named = os.environ.get(BUSYBOX_ENV)
    found = named or shutil.which("busybox")
    if not found or not Path(found).is_file():
        where = f"{BUSYBOX_ENV}={named!r} names no file" if named else f"no busybox on the PATH and {BUSYBOX_ENV} unset"
        raise UserError(
            f"A modelcar image needs a static busybox for its shell ({where}). Install it (Debian/Ubuntu: "
            f"apt-get install busybox-static) or set {BUSYBOX_ENV} to a statically linked busybox; the runtime "
            "image has one."
        )
    return Path(found)


def busybox_architecture(busybox: Path) -> str:
    """The OCI architecture of a static ELF busybox; refuses one that needs a dynamic loader."""
    data = busybox.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise UserError(f"{busybox} is not a 64-bit little-endian ELF binary; a modelcar needs a static busybox.")
    machine = int.from_bytes(data[18:20], "little")
    program_headers, entry_size, entries = (
        int.from_bytes(data[32:40], "little"),
        int.from_bytes(data[54:56], "little"),
        int.from_bytes(data[56:58], "little"),
    )
    for index in range(entries):
        start = program_headers + index * entry_size
        if int.from_bytes(data[start : start + 4], "little") == PT_INTERP:
            raise UserError(
                f"{busybox} is dynamically linked: inside the modelcar image, which has no libraries, it could not "
                f"start. Use a static build (Debian: busybox-static) via {BUSYBOX_ENV}."
            )
    if machine not in ARCHITECTURES:
        raise UserError(f"{busybox} is built for ELF machine {machine:#x}, which no Kubernetes node runs.")
    return ARCHITECTURES[machine]


def write_base_layout(layout: Path, busybox: Path) -> None:
    """Write a one-layer image (``/bin/busybox`` and its applets, no entrypoint) as an OCI layout at ``layout``."""
    architecture = busybox_architecture(busybox)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_entry("bin", tarfile.DIRTYPE, 0o755))
        binary = busybox.read_bytes()
        tar.addfile(_entry("bin/busybox", tarfile.REGTYPE, 0o755, size=len(binary)), io.BytesIO(binary))
        for applet in APPLETS:
            tar.addfile(_entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = {
        "architecture": architecture,
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(raw.getvalue())]},
        "history": [{"created_by": "llm-finetune-pipeline modelcar base: static busybox"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": _descriptor("application/vnd.oci.image.config.v1+json", config_bytes),
        "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer)],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for blob in (layer, config_bytes, manifest_bytes):
        (blobs / _digest(blob).removeprefix("sha256:")).write_bytes(blob)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    entry = _descriptor(MANIFEST_MEDIA_TYPE, manifest_bytes)
    entry["annotations"] = {"org.opencontainers.image.ref.name": "latest"}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))


def _entry(name: str, kind: bytes, mode: int, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname, info.mtime = kind, mode, size, link, 0
    return info


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _descriptor(media_type: str, data: bytes) -> dict:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}
