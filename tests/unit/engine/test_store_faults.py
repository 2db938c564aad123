"""Faults and concurrency: writes are all-or-nothing per shard, and no chunk is ever lost."""

from __future__ import annotations

import itertools
import multiprocessing
import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store import ShardingStore
from sharding_store.formats.keys import chunk_to_shard
from sharding_store.stores import as_inner
from sharding_store.stores.locks import file_lock

CPS = (2, 3)
GRID = [(i, j) for i in range(4) for j in range(6)]  # 2 x 2 shards


def key(c):
    return f"data/root/a/c{c[0]}/{c[1]}"


class FlakyInner:
    """Fails a fraction of calls with the errors object stores raise, before touching the store."""

    def __init__(self, inner, rate: float, seed: int) -> None:
        self.inner = as_inner(inner)
        self.rate = rate
        self.rng = random.Random(seed)
        self.failures = 0

    def _maybe_fail(self, what: str) -> None:
        if self.rng.random() < self.rate:
            self.failures += 1
            raise self.rng.choice([OSError(f"injected {what} failure"), TimeoutError(f"injected {what} timeout")])

    def get(self, key):
        self._maybe_fail("get")
        return self.inner.get(key)

    def get_ranges(self, requests):
        self._maybe_fail("get_ranges")
        return self.inner.get_ranges(requests)

    def get_tails(self, requests):
        self._maybe_fail("get_tails")
        return self.inner.get_tails(requests)

    def set(self, key, value):
        self._maybe_fail("set")
        self.inner.set(key, value)

    def delete(self, key):
        self._maybe_fail("delete")
        self.inner.delete(key)

    def delete_prefix(self, prefix):
        self.inner.delete_prefix(prefix)

    def list_prefix(self, prefix):
        return self.inner.list_prefix(prefix)

    def list_dir(self, prefix):
        return self.inner.list_dir(prefix)

    def exists(self, key):
        return self.inner.exists(key)


def shard_contents(store: ShardingStore) -> dict[tuple, dict[str, bytes]]:
    out: dict[tuple, dict[str, bytes]] = {}
    for k, v in store.getitems(key(c) for c in GRID).items():
        c = tuple(int(x) for x in k.rsplit("/c", 1)[1].split("/"))
        out.setdefault(chunk_to_shard(c, CPS)[0], {})[k] = v
    return out


batches = st.lists(
    st.dictionaries(st.sampled_from(GRID), st.none() | st.binary(min_size=1, max_size=6), min_size=1, max_size=10),
    min_size=1,
    max_size=12,
)


@pytest.mark.slow  # 60 runs of random failures; the eight-thread and lock tests stay in the fast loop
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=batches, seed=st.integers(0, 2**16), rate=st.sampled_from([0.1, 0.3, 0.6]))
def test_writes_are_all_or_nothing_per_shard(batches, seed, rate):
    backing: dict[str, bytes] = {}
    flaky = FlakyInner(backing, rate, seed)
    store = ShardingStore(flaky, chunks_per_shard=CPS, array_path="a", max_workers=1)
    clean = ShardingStore(backing, chunks_per_shard=CPS, array_path="a")
    for batch in batches:
        before = shard_contents(clean)
        sets = {key(c): v for c, v in batch.items() if v is not None}
        erases = [key(c) for c, v in batch.items() if v is None]
        try:
            store.update(sets)
            store.erase_values(erases)
            failed = False
        except (OSError, TimeoutError):
            failed = True
        after = shard_contents(clean)
        for shard in set(before) | set(after):
            old = before.get(shard, {})
            new = dict(old)
            for c, v in batch.items():
                if chunk_to_shard(c, CPS)[0] != shard:
                    continue
                if v is None:
                    new.pop(key(c), None)
                else:
                    new[key(c)] = v
            just_sets = dict(old)
            just_sets.update({key(c): v for c, v in batch.items() if v is not None and chunk_to_shard(c, CPS)[0] == shard})
            got = after.get(shard, {})
            # each shard is in a state some prefix of the (set, then erase) steps produced
            assert got in (old, just_sets, new), (shard, old, got)
            if not failed:
                assert got == new


@settings(max_examples=15, deadline=None)
@given(assignment=st.lists(st.integers(0, 7), min_size=len(GRID), max_size=len(GRID)), seed=st.integers(0, 1000))
def test_eight_threads_disjoint_chunks_same_shards(assignment, seed):
    """8 threads, each writing its own random subset of chunks of the same 4 shards."""
    inner: dict[str, bytes] = {}
    store = ShardingStore(inner, chunks_per_shard=CPS, array_path="a")
    owned = {t: [c for c, owner in zip(GRID, assignment) if owner == t] for t in range(8)}
    barrier = threading.Barrier(8)

    def writer(t: int) -> None:
        rng = random.Random(seed + t)
        mine = owned[t][:]
        rng.shuffle(mine)
        barrier.wait()
        for c in mine:
            if rng.random() < 0.5:
                store[key(c)] = f"{t}:{c}".encode()
            else:
                store.update({key(c): f"{t}:{c}".encode()})

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    expected = {key(c): f"{owner}:{c}".encode() for c, owner in zip(GRID, assignment)}
    assert store.getitems(expected) == expected


def _process_writer(root: str, lock_dir: str, worker: int, n_workers: int) -> None:
    store = ShardingStore(root, chunks_per_shard=CPS, array_path="a", lock=file_lock(lock_dir))
    for c in GRID[worker::n_workers]:
        for _ in range(3):  # rewrite a few times to widen the race window
            store[key(c)] = f"{worker}:{c}".encode()


@pytest.mark.slow  # two processes
def test_two_processes_with_file_lock_lose_nothing(tmp_path):
    root, locks = str(tmp_path / "store"), str(tmp_path / "locks")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_writer, args=(root, locks, w, 2)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = ShardingStore(root, chunks_per_shard=CPS, array_path="a")
    expected = {key(c): f"{i % 2}:{c}".encode() for i, c in enumerate(GRID)}
    assert store.getitems(expected) == expected
    assert not any("lock" in k for k in store.inner.list_prefix(""))  # lock files stay outside


@pytest.mark.parametrize("n", [1, 3])
def test_shard_lock_is_held_around_each_rewrite(n):
    held: list[str] = []
    events: list[tuple[str, str]] = []

    class Recorder:
        def __init__(self, k):
            self.k = k

        def __enter__(self):
            held.append(self.k)
            events.append(("enter", self.k))

        def __exit__(self, *exc):
            held.remove(self.k)
            events.append(("exit", self.k))

    inner: dict[str, bytes] = {}
    store = ShardingStore(inner, chunks_per_shard=CPS, array_path="a", lock=Recorder, max_workers=1)
    orig = store.inner.set

    def checked_set(k, v):
        assert k in held, f"{k} written without its lock"
        orig(k, v)

    store.inner.set = checked_set  # type: ignore[method-assign]
    store.update({key(c): b"x" for c in itertools.islice(GRID, 0, 6 * n)})
    assert events and all(e[0] in ("enter", "exit") for e in events)
