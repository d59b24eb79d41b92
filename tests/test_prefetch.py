"""The read-ahead iterator: same items in the same order, errors surface, early exit is clean."""

from __future__ import annotations

import threading
import time

import pytest

from voxjet.io.prefetch import prefetch


def test_prefetch_keeps_order_and_reads_ahead():
    produced = []

    def gen():
        for i in range(20):
            produced.append(i)
            yield i

    it = prefetch(gen(), depth=3)
    assert next(it) == 0
    time.sleep(0.05)
    assert len(produced) >= 3  # the thread ran ahead while we "trained"
    assert [0, *it] == list(range(20))


def test_prefetch_raises_the_producers_error():
    def gen():
        yield 1
        raise OSError("shard_0003.h5: truncated")

    it = prefetch(gen())
    assert next(it) == 1
    with pytest.raises(OSError, match="truncated"):
        next(it)


def test_leaving_early_stops_the_thread():
    def gen():
        i = 0
        while True:
            i += 1
            yield i

    before = threading.active_count()
    for x in prefetch(gen(), depth=2):
        if x == 5:
            break
    time.sleep(0.3)
    assert threading.active_count() == before


def test_depth_zero_is_plain_iteration():
    assert list(prefetch(iter([1, 2, 3]), depth=0)) == [1, 2, 3]
