"""`make test-fast`, the lane for iterating, names test files that exist and lints as `make test` does.

CI runs `make test`, not the fast lane, so a renamed or deleted file in its list would break only the next person
who iterates with it; this test, which `make test` runs, catches that.
"""

from __future__ import annotations

import re

from conftest import REPO_ROOT


def make_variable(name: str) -> list[str]:
    text = (REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    (value,) = re.findall(rf"^{name} :?= (.*)$", text, re.MULTILINE)
    return value.split()


def recipe(target: str) -> list[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    (body,) = re.findall(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    return [line.strip() for line in body.splitlines()]


def test_every_file_of_the_fast_lane_exists():
    files = make_variable("TEST_FAST")
    assert len(files) >= 10 and all((REPO_ROOT / path).is_file() for path in files), files


def test_the_fast_lane_lints_as_the_whole_suite_does():
    lint = [line for line in recipe("test") if "ruff" in line]
    assert lint and lint == [line for line in recipe("test-fast") if "ruff" in line]
    assert recipe("test-fast")[-1] == "$(PY) -m pytest -n $(TEST_WORKERS) -q $(TEST_FAST)"
