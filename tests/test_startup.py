"""common/startup.py: heavy imports with the garbage collector paused, then frozen out of later collections."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from conftest import REPO_ROOT

from common.startup import imports_without_collection

# Counts the collections that start while transformers (and torch under it) is imported, in a fresh interpreter.
COUNT_COLLECTIONS = """
import gc, json
started = []
gc.callbacks.append(lambda phase, info: started.append(info["generation"]) if phase == "start" else None)
from common.startup import imports_without_collection
started.clear()
{open}
    import transformers
    import torch
collected_during_imports = len(started)
frozen = gc.get_freeze_count()
print(json.dumps({{"during": collected_during_imports, "frozen": frozen, "enabled": gc.isenabled()}}))
"""


def collections_while_importing(with_pause: bool) -> dict:
    opener = "with imports_without_collection():" if with_pause else "if True:"
    done = subprocess.run(
        [sys.executable, "-c", COUNT_COLLECTIONS.format(open=opener)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_libraries_import_without_a_collection_and_stay_out_of_later_ones():
    plain = collections_while_importing(with_pause=False)
    paused = collections_while_importing(with_pause=True)
    assert plain["during"] > 10, plain  # what the pause saves: the collector ran while the libraries loaded
    assert paused["during"] == 0, paused
    assert paused["enabled"] is True
    assert plain["frozen"] == 0
    assert paused["frozen"] > 100_000, paused  # the libraries' objects, skipped by every later collection


def test_a_collector_the_caller_paused_stays_paused_and_one_running_resumes():
    assert gc.isenabled()
    with imports_without_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with imports_without_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_resumes_when_an_import_fails():
    try:
        with imports_without_collection():
            import no_such_module_here  # noqa: F401
    except ModuleNotFoundError:
        pass
    assert gc.isenabled()
