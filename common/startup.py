"""Import a process's heavy libraries without CPython's cyclic garbage collector running through them.

CPython starts a collection each time enough new container objects have been made since the last one, and a
collection of the oldest generation walks every object that has survived so far. Importing torch, transformers,
PEFT and TRL makes about a million such objects, all of which live as long as the process, so the collector
walks the growing heap again and again while nothing it finds is garbage: ``import trainer.train`` took 7.1 s
of CPU with it and 4.6 s without (4 pairs of runs on a 2-core CI host). Every trainer rank, and every stage
that loads a model, pays that at start-up.

``gc.freeze`` then moves what the imports built to the permanent generation, which later collections skip:
the training loop's own collections no longer walk the libraries' modules and classes either. The price is that
a reference cycle the imports left behind is never freed; such cycles are few and small next to a model.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def imports_without_collection() -> Iterator[None]:
    """Pause the collector for the imports in the block, then freeze what they built and resume it (unless it was
    paused already, by the caller)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
