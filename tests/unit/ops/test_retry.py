"""Tests of sharding_store.ops.jobs: batched, bounded execution of work units, and retries."""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding_store.ops.jobs import MAX_BATCH, run_bounded, with_retries


class CountingExecutor(Executor):
    """A thread pool that counts the tasks it is given and the most pending at once."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(workers)
        self.tasks = 0
        self.pending = 0
        self.max_pending = 0
        self.lock = threading.Lock()

    def submit(self, fn, *args, **kwargs) -> Future:
        with self.lock:
            self.tasks += 1
            self.pending += 1
            self.max_pending = max(self.max_pending, self.pending)
        future = self.pool.submit(fn, *args, **kwargs)
        future.add_done_callback(lambda _: self._done())
        return future

    def _done(self) -> None:
        with self.lock:
            self.pending -= 1

    def shutdown(self, wait: bool = True, **kwargs) -> None:
        self.pool.shutdown(wait)


def work(i: int) -> int:
    if i % 7 == 3:
        raise ValueError(f"item {i} is bad")
    return i * i


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 300), window=st.integers(1, 9), max_batch=st.integers(1, 20))
def test_every_item_once_with_its_own_outcome(n: int, window: int, max_batch: int):
    with CountingExecutor(3) as ex:
        seen = {}
        for (i,), future in run_bounded(ex, work, ((i,) for i in range(n)), window=window, max_batch=max_batch):
            assert i not in seen
            try:
                seen[i] = future.result()
            except ValueError as e:
                seen[i] = str(e)
        assert seen == {i: (f"item {i} is bad" if i % 7 == 3 else i * i) for i in range(n)}
        assert ex.max_pending <= window  # memory stays bounded by the window
        # items travel in batches: far fewer tasks than items once batches have grown
        assert ex.tasks <= n
        if max_batch >= 4 and n >= 10 * window * max_batch:
            assert ex.tasks < n / 2


def test_batches_start_small_so_that_few_items_still_spread_over_workers():
    with CountingExecutor(4) as ex:
        list(run_bounded(ex, work, ((i,) for i in range(8)), window=8))
    assert ex.tasks == 8  # 8 items, window 8: one item per task, all workers busy


def test_batches_grow_to_the_limit():
    with CountingExecutor(2) as ex:
        list(run_bounded(ex, work, ((i,) for i in range(4000)), window=4))
    # after the ramp, 16 items per task: about 4000/16 tasks, plus the ramp
    assert 4000 // MAX_BATCH <= ex.tasks <= 4000 // MAX_BATCH + 60


def test_stopping_early_cancels_pending_batches():
    started = []

    def slow(i: int) -> int:
        started.append(i)
        threading.Event().wait(0.01)
        return i

    with ThreadPoolExecutor(1) as ex:
        it = run_bounded(ex, slow, ((i,) for i in range(1000)), window=2)
        next(it)
        it.close()
    assert len(started) < 100


def test_with_retries_retries_transient_errors_only():
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("reset")
        return "ok"

    assert with_retries(flaky, base_delay=0) == "ok" and len(calls) == 3
    calls.clear()

    def broken() -> None:
        calls.append(1)
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError):
        with_retries(broken, base_delay=0)
    assert len(calls) == 1

