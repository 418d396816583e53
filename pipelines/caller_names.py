"""Let kfp name the caller of a task setter without reading the source of every frame on the stack.

kfp 2.17's ``PipelineTask`` setters (``set_cpu_limit`` and its kin, ``set_accelerator_type``, ``set_env_variable``)
each begin with ``inspect.stack()[1][3]``, the name of the setter, kept for the error they raise on a task that is
not a container. ``inspect.stack()`` builds a record for every frame up to the interpreter's first: it stats each
frame's file, reads a line of its source, and for each file that is not on disk (``<string>``, frozen modules)
walks every loaded module to find its owner. Building the pipeline calls the setters 80 times, which took 4.3 of
the 5.5 s of a profiled ``import pipelines.fine_tune``; in a process that has loaded more modules (a test worker,
the local runner) each call costs more.

:func:`install` gives kfp's task module an ``inspect`` whose ``stack()`` returns the same records without the
source and module lookups: frame, file name, line and function name, which is all kfp reads. Everything else it
asks of ``inspect`` is the real module's.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType

from kfp.dsl import pipeline_task


class _FramesWithoutSource(ModuleType):
    """The ``inspect`` module, with a ``stack`` that names frames without reading their files."""

    def __init__(self) -> None:
        super().__init__("inspect")

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        """The caller's stack, innermost first, as ``inspect.stack(context=0)`` lists it, without reading sources."""
        records = []
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            records.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return records


def install() -> None:
    """Give kfp's task module the ``inspect`` above (once per process; later calls change nothing)."""
    if not isinstance(pipeline_task.inspect, _FramesWithoutSource):
        pipeline_task.inspect = _FramesWithoutSource()
