"""The suite's parallel run: module fixtures built once, independent tests spread, shared builds made once.

A small project is run by a real ``pytest -n 2`` in a subprocess, with the plugin tests/conftest.py loads
(tests/worker_groups.py) and tests/shared_builds.py. Each fixture build and each test appends a line naming its
worker to a log, and the log says what ran where.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, inner_pytest_environment

CONFTEST = f"""
import sys

sys.path.insert(0, {str(REPO_ROOT / "tests")!r})
pytest_plugins = ("worker_groups",)  # as tests/conftest.py loads it
"""

COMMON = """
import os
import time

import pytest
from shared_builds import build_once

LOG = {log!r}


def note(what):
    with open(LOG, "a") as log:
        log.write(f"{{what}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    return build_once(tmp_path_factory, "shared", lambda directory: (note("build shared"), time.sleep(1)))
"""

WITH_A_MODULE_RUN = """
@pytest.fixture(scope="module")
def run():
    note("build run")


@pytest.mark.parametrize("index", range(3))
def test_reads_the_run(run, shared, index):
    time.sleep(0.1)
    note("grouped")
"""

INDEPENDENT = """
@pytest.mark.parametrize("index", range(8))
def test_alone(shared, index):
    time.sleep(0.5)
    note("alone")
"""


def test_tests_sharing_a_module_fixture_run_in_one_worker_and_the_rest_spread(tmp_path):
    log = tmp_path / "log"
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_grouped.py").write_text(COMMON.format(log=str(log)) + WITH_A_MODULE_RUN)
    (project / "test_alone.py").write_text(COMMON.format(log=str(log)) + INDEPENDENT)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "--rootdir", project, project],
        cwd=project,
        env=inner_pytest_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    lines = [line.split() for line in log.read_text().splitlines()]
    workers = {
        what: [line[-1] for line in lines if " ".join(line[:-1]) == what]
        for what in ("build shared", "build run", "grouped", "alone")
    }
    assert len(workers["build shared"]) == 1, lines  # one build for both workers
    assert len(workers["build run"]) == 1, lines  # the module fixture: once, so its tests all ran in one worker
    assert set(workers["grouped"]) == set(workers["build run"]) and len(workers["grouped"]) == 3
    assert set(workers["alone"]) == {"gw0", "gw1"}, lines  # independent tests go to whichever worker is free


def test_a_build_that_failed_is_made_again_by_the_next_worker_that_asks(tmp_path, monkeypatch):
    from shared_builds import build_once

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the shared root is then the factory's own directory

    class Factory:
        def getbasetemp(self) -> Path:
            return tmp_path

    def fail(directory: Path) -> None:
        (directory / "half").write_text("written before the failure")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_once(Factory(), "model", fail)
    assert (tmp_path / "model" / "half").is_file()  # the failed build's files, with no marker
    built = build_once(Factory(), "model", lambda directory: (directory / "whole").write_text("ok"))
    assert sorted(path.name for path in built.iterdir()) == [".built", "whole"]
    assert build_once(Factory(), "model", fail) == built  # complete: not built again
