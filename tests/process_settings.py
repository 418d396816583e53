"""How the suite's processes share the host's cores and reuse memory.

Two settings, measured on the 2-core CI host (issue 42; docs/contributing.md, "Where the suite's time goes"):

* **Threads**: with several workers, each gets its share of the cores for torch's intra-op threads
  (``OMP_NUM_THREADS``). Two workers each running two threads on two cores spin against each other: the suite
  under ``-n 2`` took as long as without it until this was set. A one-rank run in a test then has one thread,
  as each rank of a multi-rank run has anyway (torchrun sets one); inductor's CPU kernels compiled in such a
  test are its one-thread variant.
* **Freed memory is kept**: a tiny model with SmolLM2's 49,152-token vocabulary makes logits of about 200 MB a
  step. glibc serves every allocation that large with a fresh ``mmap`` and returns it on free, so each step pays
  the kernel to fault in and zero that memory again: a third of a training test's CPU time was system time.
  ``MALLOC_MMAP_MAX_=0`` serves them from the heap, and a high trim threshold keeps freed memory there for the
  next step (a one-rank compiled training test: 17 s of system time to 4.6 s, 30.5 s to 23.3 s).

Both reach every process the tests start through the environment (glibc reads its variables when a process
starts, so xdist's workers and the torchrun ranks get them), and this process through ``mallopt``. A value
already in the environment is kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
# mallopt(3) parameter numbers, from glibc's malloc.h.
MALLOPT = {"MALLOC_MMAP_MAX_": -4, "MALLOC_TRIM_THRESHOLD_": -1}


def apply(workers: int) -> None:
    """Set this process's and its children's threads for ``workers`` processes sharing the host, and keep freed
    memory in the heap."""
    if workers > 1:
        cores = len(os.sched_getaffinity(0))  # the cores this process may run on, not the host's
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
    for name, value in KEEP_FREED_MEMORY.items():
        os.environ.setdefault(name, value)
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name) if libc_name else None
    if hasattr(libc, "mallopt"):  # glibc's; another libc keeps its own behaviour
        for name, parameter in MALLOPT.items():
            libc.mallopt(parameter, int(os.environ[name]))
