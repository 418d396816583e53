"""The names in lm-eval's task registry, indexed once per lm-eval version rather than once per process.

Indexing the registry parses every task YAML lm-eval ships (14,000 of them, about 6 s on two cores), and every
check of a run's parameters pays for it before any work: that is where a misspelt ``benchmark_tasks`` entry must
fail. The names are kept in the local cache (``$LLM_FT_CACHE``, see ``components.local_model``), under lm-eval's
version, readable by everyone who shares it: local runs and the CLIs that check parameters on the user's machine
read them; a pod starts without them unless ``$LLM_FT_CACHE`` is on lasting storage.

A saved index is only ever trusted to say a name exists: a name it lacks is looked up in a fresh index before it
is called unknown, so a stale file costs seconds, never a wrong refusal. The evaluate step loads its tasks from a
live index whatever this says.
"""

from __future__ import annotations

import functools
import json
import sys
from importlib import metadata
from pathlib import Path

from common.atomic import write_json
from components.local_model import cache_root


def known(names: list[str]) -> tuple[str, ...]:
    """Registry names to check ``names`` against: the saved index when it has every one of them, else a fresh one."""
    saved = _saved()
    return saved if set(names) <= set(saved) else _indexed()


def saved_index_path() -> Path:
    return cache_root() / "lm-eval" / f"registry-names-{metadata.version('lm_eval')}.json"


def _saved() -> tuple[str, ...]:
    try:
        names = json.loads(saved_index_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    return tuple(names) if isinstance(names, list) and all(isinstance(name, str) for name in names) else ()


@functools.cache
def _indexed() -> tuple[str, ...]:
    """A fresh index of the registry, saved for later processes (a cache that cannot be written is said so)."""
    from lm_eval.tasks import TaskManager

    names = tuple(sorted(TaskManager().all_tasks))
    path = saved_index_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, list(names))
        path.chmod(0o644)  # written private (mkstemp); the cache is shared like the models in it
    except OSError as error:
        print(f"note: lm-eval's task names were not saved to {path} ({error}); each run indexes them", file=sys.stderr)
    return names
