"""``common.ahead.mapped_ahead``: results in the items' order, never more than the window pulled ahead of the
consumer, and nothing left running when the consumer stops early."""

from __future__ import annotations

import random
import threading
import time

from common.ahead import mapped_ahead


def test_results_come_in_order_with_at_most_the_window_pulled_ahead():
    pulled, consumed = [], []

    def items():
        for number in range(200):
            assert len(pulled) - len(consumed) <= 3 + 1  # the window, and the item being submitted
            pulled.append(number)
            yield number

    def slow_square(number: int) -> int:
        time.sleep(random.random() / 1000)
        return number * number

    for result in mapped_ahead(slow_square, items(), threads=2, window=3, name="test"):
        consumed.append(result)
    assert consumed == [number * number for number in range(200)]


def test_a_consumer_that_stops_early_leaves_no_work_queued():
    started = []
    lock = threading.Lock()

    def record(number: int) -> int:
        with lock:
            started.append(number)
        time.sleep(0.01)
        return number

    results = mapped_ahead(record, range(1000), threads=1, window=2, name="test")
    assert next(results) == 0
    results.close()  # the consumer gives up (an error, a refusal)
    time.sleep(0.1)
    assert len(started) <= 4  # the first, and the few in flight when it stopped; not the thousand
