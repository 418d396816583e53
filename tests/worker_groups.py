"""Which tests pytest-xdist must run in one worker: those that share a fixture built once for their module.

A module fixture (a local pipeline run, a trained model, a server) is built once per worker that runs one of its
tests, so the tests that share one must go to the same worker. pytest-xdist's own way, ``--dist loadgroup`` and
the ``xdist_group`` mark, renames each grouped test's node id; pytest 9.2 reads node ids from elsewhere, so with
the locked versions the groups are silently ignored (measured: the local-run module's three pipeline runs were
made twice). Instead, each worker writes the groups it collected to a file, and the controller's scheduler
(``GroupScheduling``) reads them (this module is a pytest plugin, which tests/conftest.py loads by name): a grouped
test's unit of work is its module, every other test is a unit of its own, sent to whichever worker is free, in
the order the workers collected them (tests/conftest.py puts the slow ones first).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_INPUT = "suite_groups_dir"  # the key of the controller's directory in each worker's workerinput
GROUPS_DIR = pytest.StashKey[Path]()
SHARED_SCOPES = ("module", "class", "package")


def is_worker(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker: from its config, not the environment, which a pytest that a test
    starts in a subprocess inherits."""
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist controller (``-n N``, any N): the directory its workers write their groups into."""
    if getattr(config.option, "tx", None) and not is_worker(config):
        config.stash[GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="pytest-worker-groups-"))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: plain pytest (-p no:xdist) never calls it
def pytest_configure_node(node) -> None:
    """In the controller, for each worker it starts: tell the worker where to write."""
    node.workerinput[GROUPS_INPUT] = str(node.config.stash[GROUPS_DIR])


def pytest_unconfigure(config: pytest.Config) -> None:
    if GROUPS_DIR in config.stash:
        shutil.rmtree(config.stash[GROUPS_DIR], ignore_errors=True)


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture built once for its module or class."""
    fixtures = item._fixtureinfo.name2fixturedefs  # the map pytest's own --fixtures-per-test reads
    return any(definitions[-1].scope in SHARED_SCOPES for definitions in fixtures.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: record, for each test that shares a module fixture, its module as its group."""
    if not is_worker(config):
        return
    groups = {item.nodeid: item.nodeid.split("::")[0] for item in items if shares_a_module_fixture(item)}
    partial = Path(config.workerinput[GROUPS_INPUT]) / f"{config.workerinput['workerid']}.json.partial"
    partial.write_text(json.dumps(groups))
    partial.rename(partial.with_suffix(""))  # whole or absent: the controller reads it only after collection


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, with the scope of each test the group its worker recorded, or the test itself.

    Units are handed out in the order the workers collected them (xdist would otherwise put the largest first)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False
        self.directory = config.stash[GROUPS_DIR]
        self.groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:  # first called once every worker has sent its collection
            files = sorted(self.directory.glob("*.json"))
            if not files:
                raise RuntimeError(f"no xdist worker wrote its test groups into {self.directory}")
            self.groups = json.loads(files[0].read_text())
        return self.groups.get(nodeid, nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> GroupScheduling:
    """Tests that share a module fixture run in one worker; every other test goes to whichever worker is free."""
    return GroupScheduling(config, log)
