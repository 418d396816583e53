"""Let kfp name the caller of a task setter without reading the source of every frame on the stack.

kfp 2.17's ``PipelineTask`` setters (``set_cpu_limit`` and its kin, ``set_accelerator_type``, ``set_env_variable``)
each begin with ``inspect.stack()[1][3]``, the name of the setter, kept for the error they raise on a task that is
not a container. ``inspect.stack()`` builds a record for every frame up to the interpreter's first: it stats each
frame's file, reads a line of its source, and for each file that is not on disk (``<string>``, frozen modules)
walks every loaded module to find its owner. Building the pipeline calls the setters 80 times: ``import
pipelines.fine_tune`` took 2.3 to 4.0 s of CPU with them and 1.1 to 1.4 s without, and a pytest worker, which has
loaded many more modules, spent about 21 s on it while collecting the tests.

:func:`install` gives kfp's task module an ``inspect`` whose ``stack()`` lists the same frames without the source
and module lookups: each record holds the frame, its code's file name, the line and the function name (what kfp
reads), and no source lines. Everything else kfp's task module asks of ``inspect`` is the real module's.
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
        """The caller's stack, innermost first, without reading sources. ``context`` (lines of source per frame) is
        taken for ``inspect.stack``'s signature and not used: no record holds source lines."""
        records = []
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            records.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return records


def install() -> None:
    """Give kfp's task module the ``inspect`` above (once per process; later calls change nothing)."""
    if not isinstance(getattr(pipeline_task, "inspect", None), _FramesWithoutSource):
        pipeline_task.inspect = _FramesWithoutSource()
