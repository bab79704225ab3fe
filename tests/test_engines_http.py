"""engines.http.map_bounded: server mode's concurrent requests (bounded, in order, first error raised)."""

from __future__ import annotations

import threading
import time

import pytest

from speclock.engines.http import map_bounded


def test_results_keep_the_items_order_whatever_order_the_calls_finish_in():
    def slow_first(i: int) -> int:
        time.sleep(0.05 * (5 - i))  # item 0 finishes last
        return i * 10

    assert map_bounded(slow_first, list(range(6)), 8) == [0, 10, 20, 30, 40, 50]


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_no_more_than_concurrency_calls_are_in_flight(concurrency):
    lock, now, peak = threading.Lock(), [0], [0]

    def call(i: int) -> int:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return i

    assert map_bounded(call, list(range(20)), concurrency) == list(range(20))
    assert peak[0] <= concurrency
    assert peak[0] > 1 or concurrency == 1  # they do overlap (a busy machine may not reach the full bound)


def test_the_earliest_failed_items_error_is_raised_and_nothing_new_starts_after_a_failure():
    started = []

    def call(i: int) -> int:
        started.append(i)
        if i in (2, 3):
            time.sleep(0.05 if i == 2 else 0.0)
            raise RuntimeError(f"item {i}")
        time.sleep(0.05)
        return i

    with pytest.raises(RuntimeError, match="item 2"):
        map_bounded(call, list(range(50)), 4)
    assert len(started) < 50


def test_concurrency_below_one_is_refused():
    with pytest.raises(ValueError):
        map_bounded(lambda i: i, [1, 2], 0)
