"""Which tests pytest-xdist must run in one worker: those that share a fixture built once for their module.

A module fixture (a local pipeline run, a trained model, a server) is built once per worker that runs one of its
tests, so the tests that share one must go to the same worker. pytest-xdist's own way, ``--dist loadgroup`` and
the ``xdist_group`` mark, renames each grouped test's node id; pytest 9.2 reads node ids from elsewhere, so with
the locked versions the groups are silently ignored (measured: the local-run module's three pipeline runs were
made twice). Instead, each worker writes the groups it collected to a file, and the controller's scheduler
(``GroupScheduling``) reads them: a grouped test's unit of work is its module, every other test is a unit of its
own, sent to whichever worker is free, in the order the workers collected them (tests/conftest.py puts the slow
ones first).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_DIR = "SUITE_WORKER_GROUPS_DIR"  # set by the controller; each worker writes <worker id>.json there
SHARED_SCOPES = ("module", "class", "package")


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture built once for its module or class."""
    fixtures = item._fixtureinfo.name2fixturedefs  # the map pytest's own --fixtures-per-test reads
    return any(definitions[-1].scope in SHARED_SCOPES for definitions in fixtures.values())


def configure(config: pytest.Config, workers: int) -> None:
    """In the controller, before its workers start (they inherit the environment): where they write their groups."""
    if workers > 1 and not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="pytest-worker-groups-")


def unconfigure() -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and GROUPS_DIR in os.environ:
        shutil.rmtree(os.environ.pop(GROUPS_DIR), ignore_errors=True)


def write_groups(items: list[pytest.Item]) -> None:
    """In a worker: record, for each test that shares a module fixture, its module as its group."""
    directory, worker = os.environ.get(GROUPS_DIR), os.environ.get("PYTEST_XDIST_WORKER")
    if not (directory and worker):
        return
    groups = {item.nodeid: item.path.name for item in items if shares_a_module_fixture(item)}
    partial = Path(directory) / f"{worker}.json.partial"
    partial.write_text(json.dumps(groups))
    partial.rename(partial.with_suffix(""))  # whole or absent: the controller reads it only after collection


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, with the scope of each test the group its worker recorded, or the test itself."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self.groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:  # first called once every worker has sent its collection
            files = sorted(Path(os.environ[GROUPS_DIR]).glob("*.json"))
            if not files:
                raise RuntimeError(f"no worker wrote its test groups into ${GROUPS_DIR} ({os.environ[GROUPS_DIR]})")
            self.groups = json.loads(files[0].read_text())
        return self.groups.get(nodeid, nodeid)
