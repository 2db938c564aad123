"""A forked child completes a full read (issue 12 item 13, issue 13 "Fork- and process-safe").

On 6befc1a ``DraftArray`` decoded through one process-wide ``ThreadPoolExecutor``: a child
forked after the parent had read inherits the pool object but none of its threads, so its
first parallel read queues work nobody runs and waits forever. Each test here reads in the
parent first (the pools, caches and zarr's event loop exist), forks, lets the child read
everything through the public API with fresh objects and compare the values, and waits
for it with a timeout: a hang is a failure that names the cause, never a hung suite.
The child always leaves with ``os._exit`` (it never runs pytest's teardown).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sharding_store import ShardingStore, create_draft_array, open_draft, open_v3

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork.*:DeprecationWarning"),
]

CHILD_TIMEOUT = 60.0  # seconds; a healthy child needs well under one
SHAPE, CHUNKS, CPS = (96, 80), (8, 8), (2, 5)  # 12 x 10 chunks in 6 x 2 shards


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, np.ndarray]:
    """A sharded draft array ``a`` with distinct values (written in the parent)."""
    root = str(tmp_path / "s.zr3")
    values = np.arange(np.prod(SHAPE), dtype="<i4").reshape(SHAPE)
    a = create_draft_array(root, "a", shape=SHAPE, chunks=CHUNKS, dtype="<i4", chunks_per_shard=CPS)
    a[...] = values
    return root, values


def chunk_payloads(root: str | ShardingStore) -> dict[str, bytes]:
    """Every chunk key of array ``a`` and its payload, read through a ShardingStore (a fresh
    one for a path)."""
    s = ShardingStore(root) if isinstance(root, str) else root
    keys = sorted(k for k in s.list_prefix("data/root/a/"))
    got = s.getitems(keys)
    return {k: bytes(got[k]) for k in keys}


def in_child(read: Callable[[], bool], *, timeout: float = CHILD_TIMEOUT) -> None:
    """Fork; the child runs ``read`` (True: values right) and exits 0; the parent waits at
    most ``timeout`` seconds, kills a hung child and fails saying why."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 3
        try:
            os.close(r)
            code = 0 if read() else 1
            if code:
                os.write(w, b"the child read wrong values")
        except BaseException:  # noqa: BLE001 - reported to the parent through the pipe
            os.write(w, traceback.format_exc().encode()[-8000:])
            code = 2
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail(f"the forked child did not finish a full read within {timeout:.0f} s and was killed: "
                        "a thread pool, lock or cache inherited from the parent hangs it (issue 12 item 13)")
        else:
            time.sleep(0.02)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    assert code == 0, f"the forked child exited with {code}: {report or '(no report)'}"


def test_child_reads_with_open_draft_after_the_parent_read(store):
    root, values = store
    assert np.array_equal(open_draft(root, "a")[...], values)  # the parent's pool exists now
    in_child(lambda: np.array_equal(open_draft(root, "a")[...], values))
    assert np.array_equal(open_draft(root, "a")[...], values)  # and the parent still reads


def test_child_reads_with_open_v3_after_the_parent_read(store):
    root, values = store
    assert np.array_equal(open_draft(root, "a")[...], values)
    assert np.array_equal(open_v3(root, "a")[...], values)  # zarr's event loop runs too
    in_child(lambda: np.array_equal(open_v3(root, "a")[...], values))
    assert np.array_equal(open_v3(root, "a")[...], values)


def test_child_reads_through_a_sharding_store_after_the_parent_read(store):
    root, values = store
    assert np.array_equal(open_draft(root, "a")[...], values)
    expected = chunk_payloads(root)
    assert len(expected) == (SHAPE[0] // CHUNKS[0]) * (SHAPE[1] // CHUNKS[1])
    in_child(lambda: chunk_payloads(root) == expected)


def test_child_reads_through_objects_made_before_the_fork(store):
    """An array, a v3 view and a ShardingStore (index cache on) opened and used by the
    parent keep working in the child (issue 13: no inherited pool or lock hangs a child)."""
    root, values = store
    a, v, s = open_draft(root, "a"), open_v3(root, "a"), ShardingStore(root, index_cache_size=256)
    assert np.array_equal(a[...], values) and np.array_equal(v[...], values)
    expected = chunk_payloads(s)
    in_child(lambda: np.array_equal(a[...], values) and np.array_equal(v[...], values)
             and chunk_payloads(s) == expected)
    assert np.array_equal(a[...], values) and chunk_payloads(s) == expected


def test_fork_while_another_thread_is_reading(store):
    """Whatever a reading thread holds at the moment of the fork (a pool's queue, a lock,
    a cache entry being filled), the child's own full reads complete: through fresh objects
    and through the ones the reading thread is using."""
    root, values = store
    a, s = open_draft(root, "a"), ShardingStore(root, index_cache_size=256)
    expected = chunk_payloads(root)
    stop, reads, errors = threading.Event(), [0], []

    def reader() -> None:
        try:
            while not stop.is_set():
                ok = (np.array_equal(open_draft(root, "a")[...], values) and np.array_equal(a[...], values)
                      and chunk_payloads(root) == expected and chunk_payloads(s) == expected)
                assert ok, "the reading thread got wrong values"
                reads[0] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        while reads[0] < 1 and t.is_alive():
            time.sleep(0.005)
        for delay in (0.0, 0.003, 0.011):  # fork at a few moments of the reader's loop
            time.sleep(delay)
            in_child(lambda: np.array_equal(open_draft(root, "a")[...], values) and chunk_payloads(root) == expected
                     and np.array_equal(a[...], values) and chunk_payloads(s) == expected)
    finally:
        stop.set()
        t.join(CHILD_TIMEOUT)
    assert not errors, errors
    assert reads[0] >= 1
