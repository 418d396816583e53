"""A function mapped over a stream in threads, a few items ahead of the consumer, results in order.

For work that releases the GIL (pyarrow's parsing and compute functions, numpy's array operations): the threads
overlap it with each other and with what the consumer does with the previous result, and memory holds at most
``window`` items and their results whatever the stream's length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def mapped_ahead(
    function: Callable[[Item], Result], items: Iterable[Item], threads: int, window: int, name: str
) -> Iterator[Result]:
    """``function`` of each of ``items``, in their order, computed by ``threads`` threads (named ``name``) with at
    most ``window`` items submitted and not yet yielded."""
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name) as pool:
        pending: deque[Future[Result]] = deque()
        try:
            for item in items:
                pending.append(pool.submit(function, item))
                if len(pending) > window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # a consumer that stops early (an error, a refusal) leaves nothing running
            for future in pending:
                future.cancel()
