"""The order in which the suite's tests are handed to pytest-xdist's workers (tests/conftest.py applies it).

1. ``test_lock.py``: an environment that is not the locked one makes other tests fail in ways that look like bugs,
   and its message names the cause and the fix.
2. The slow tests (``pytest.mark.slow``), with the modules whose tests mostly wait (``pytest.mark.waits``:
   timeouts, polls, a fake cluster's clock) spread among their modules, so that while one worker waits the other
   computes (a test marked both is slow). Handed out with the other short tests, at the end, the waiting ones ran
   in both workers at once: at 3bcc7b6 neither worker computed for most of the run's last minute (``/proc/stat``
   sampled every 2 s; ``ps`` showed both asleep in test_train_stalls.py's and test_train_cluster.py's tests).
3. The rest, many short tests that compute, so that both workers are busy to the end instead of one long test
   running alone.

Each list keeps the order pytest collected it in, and a module's tests of one kind stay together.
"""

from __future__ import annotations

from itertools import groupby
from typing import Callable, Literal, Sequence, TypeVar

Test = TypeVar("Test")
Kind = Literal["lock", "slow", "waits", "rest"]


def run_order(tests: Sequence[Test], kind_of: Callable[[Test], Kind], module_of: Callable[[Test], str]) -> list[Test]:
    """``tests`` in the order above. The waiting tests go between modules, a module at a time, never into one: a
    run without xdist (``make test-lowest``) would otherwise build a module's fixtures again after each."""
    by_kind: dict[Kind, list[Test]] = {"lock": [], "slow": [], "waits": [], "rest": []}
    for test in tests:
        by_kind[kind_of(test)].append(test)
    modules = {kind: [list(group) for _, group in groupby(by_kind[kind], key=module_of)] for kind in ("slow", "waits")}
    mixed = spread(modules["waits"], among=modules["slow"])
    return by_kind["lock"] + [test for module in mixed for test in module] + by_kind["rest"]


def spread(few: Sequence[Test], among: Sequence[Test]) -> list[Test]:
    """``few`` spread through ``among`` by count: the k-th of n at k/(n+1) of the way, each list in its own order."""
    placed = [((index + 1) / (len(among) + 1), 0, index) for index in range(len(among))]
    placed += [((index + 1) / (len(few) + 1), 1, index) for index in range(len(few))]
    return [(among, few)[which][index] for _, which, index in sorted(placed)]
