"""Atomic file publication: write under a temporary name, then rename.

A pipeline step can be killed at any moment (pod eviction, OOM, Ctrl-C). Files
are therefore written inside a hidden staging directory next to their final
place and only renamed into place once complete, so a file with a final name is
always a finished file. ``os.replace`` is atomic within one filesystem, which is
why the staging directory lives inside the output directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

STAGING_PREFIX = ".staging-"


class StagingDir:
    """A private directory whose files are published into ``target`` on demand."""

    def __init__(self, target: Path, path: Path) -> None:
        self.target = target
        self.path = path

    def file(self, name: str) -> Path:
        """Where to write ``name`` before publishing it."""
        return self.path / name

    def publish(self, *names: str) -> None:
        """Move the named staged files into the target, in the order given.

        Callers publish their "completion marker" (e.g. stats.json) last, so a
        reader that sees the marker knows every other file is in place. A marker
        left by an earlier run is withdrawn before the first rename, so a process
        killed between renames never leaves an old marker beside new files.
        """
        if len(names) > 1:
            (self.target / names[-1]).unlink(missing_ok=True)
        for name in names:
            self.publish_as(name, name)

    def publish_as(self, name: str, final_name: str) -> None:
        """Move the staged file ``name`` into the target as ``final_name``."""
        staged = self.path / name
        with open(staged, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(staged, self.target / final_name)


@contextmanager
def staging_dir(target: Path) -> Iterator[StagingDir]:
    """Create ``target`` if needed and yield a staging area inside it.

    The staging area is removed on exit, whether the block succeeded or not;
    anything not published is discarded and files already in ``target`` are
    untouched.
    """
    target.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target))
    try:
        yield StagingDir(target, path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_file_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a hidden temporary file beside ``path``, then rename it into place.

    The file appears complete or not at all; a failure in ``write`` leaves nothing behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file so that it appears complete or not at all."""
    write_file_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def write_json(path: Path, payload: Any) -> None:
    """``payload`` as indented JSON, written atomically."""
    write_text_atomic(path, json.dumps(payload, indent=2) + "\n")


def link_or_copy(source: Path, destination: Path) -> None:
    """Put ``source`` at ``destination``, replacing what is there: a hard link (no extra space
    on the workspace), or a copy across filesystems (e.g. into a KFP artifact's local path)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.unlink(missing_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def replace_dir(final: Path, fill: Callable[[Path], None]) -> None:
    """Call ``fill(tmp_dir)`` on a fresh hidden directory beside ``final``, then swap it in.

    A reader sees the old directory or the complete new one, never a partial
    one; a failure in ``fill`` leaves ``final`` as it was.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        fill(building)
        building.chmod(0o755)  # mkdtemp makes it private; the folder is read by other steps and users
        old = final.with_name(f".{final.name}.old")
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        building.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
