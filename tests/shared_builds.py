"""Fixture files built once per test run and read by every pytest-xdist worker.

``make test`` runs the suite in one process per core (pytest-xdist), and each of them has its own session: a
session fixture that saves a model or trains a run would do so once per worker. A fixture that builds through
``build_once`` builds into a directory of the run's shared temporary root instead (the parent of the workers'
own temporary directories under xdist, the session's temporary directory without it), under a file lock: the
first worker to get there builds, the others wait for the lock and read what it built.

The directory is built in place, not renamed into it (what is built may record its own path: a token cache
names its data directory), and a marker written last says it is complete; a build that failed or was killed
leaves no marker, so the next worker to ask removes it and builds again. Tests read these directories and never
change them: a test that must change one copies it first.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

COMPLETE = ".built"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every worker of this run sees: xdist gives each worker a subdirectory of it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The directory ``name`` of the shared root, made by ``build(directory)`` in the first worker that asks."""
    root = shared_root(tmp_path_factory)
    target = root / name
    with FileLock(root / f"{name}.lock"):
        if not (target / COMPLETE).is_file():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            (target / COMPLETE).touch()
    return target
