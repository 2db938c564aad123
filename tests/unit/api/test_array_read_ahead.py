"""Whole shards of a remote store are each read and decoded by one task on the I/O threads
(array.READ_AHEAD, issue 26's S3 row): the same values and requests as reading them in runs
on the decoding pool, each shard decoded as soon as it arrives (no shard waits for another
shard's read), errors raised; local directories and mappings are read on the decoding
threads as before."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sharding_store import ShardCorruptError
from sharding_store.api import arrays as A
from sharding_store.api.arrays import create_draft_array, open_draft
from sharding_store.stores import Location
from sharding_store.testing import CountingInner

SHAPE, CHUNKS, CPS = (100, 203), (4, 8), (2, 5)  # edge shards in both dimensions
SHARDS = (13, 6)  # shards per dimension: ceil(100 / 8), ceil(203 / 40)


class ThreadCounting(CountingInner):
    """Notes the threads that read; ``remote``: says it is an object store (a mapping that
    waits on nothing is read on the decoding threads)."""

    def __init__(self, inner, remote: bool = True):
        super().__init__(inner)
        self.remote = remote
        self.threads: set[str] = set()
        self.read_on: dict[str, str] = {}  # whole-object reads: key -> the thread that read it

    def location(self) -> Location:
        return Location("s3", "test", f"bucket/{id(self)}") if self.remote else super().location()

    def get_ranges(self, requests, versions=None):
        self.threads.add(threading.current_thread().name.rstrip("_0123456789"))
        return super().get_ranges(requests, versions)

    def read_into(self, key, alloc):
        self.threads.add(threading.current_thread().name.rstrip("_0123456789"))
        self.read_on[key] = threading.current_thread().name
        return super().read_into(key, alloc)


def _store(where, values: np.ndarray) -> None:
    a = create_draft_array(where, "a", shape=SHAPE, chunks=CHUNKS, dtype="<u2", chunks_per_shard=CPS)
    a[...] = values


@pytest.fixture
def values() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 60000, SHAPE, dtype=np.uint16)


@pytest.fixture
def small_batches(monkeypatch) -> None:
    monkeypatch.setattr(A, "BATCH_BYTES", 16 * 8 * 2 * 10)  # several batches of several runs
    monkeypatch.setattr(A, "INLINE_CHUNKS", 4)


@pytest.mark.parametrize("ahead", [True, False])
@pytest.mark.parametrize("sel", [np.s_[...], np.s_[3:97, 7:190], np.s_[::3, 5:], np.s_[8:, :40]])
def test_a_remote_store_reads_the_same_values_and_requests(values, monkeypatch, small_batches, ahead, sel):
    monkeypatch.setattr(A, "READ_AHEAD", ahead)
    data: dict = {}
    _store(data, values)
    del data["data/root/a/c1/2"]  # an absent shard: fill value
    expected = values.copy()
    expected[8:16, 80:120] = 0
    inner = ThreadCounting(data)
    a = open_draft(inner, "a")
    inner.reset()
    got = a[sel]
    assert np.array_equal(got, expected[sel])
    assert ("sharding-store-io" in inner.threads) == ahead  # each selection has shards read whole
    # the same requests either way: one per whole shard, index then ranges for the others
    other = ThreadCounting(data)
    monkeypatch.setattr(A, "READ_AHEAD", not ahead)
    b = open_draft(other, "a")
    other.reset()
    assert np.array_equal(b[sel], got)
    assert other.reads == inner.reads and other.bytes_read == inner.bytes_read


def test_each_remote_shard_is_decoded_as_it_arrives(values, monkeypatch, small_batches):
    """The first shard's read is held until every other shard has been decoded into the
    output: no shard's decode waits for another shard's read (so the last byte is followed
    by one shard's decode, not by a run's), and each is decoded on the thread that read it."""
    data: dict = {}
    _store(data, values)
    first = "data/root/a/c0/0"
    decoded: list[tuple[str, str]] = []  # (shard key, decoding thread)
    everyone_else = threading.Event()
    total = SHARDS[0] * SHARDS[1]
    original = A.DraftArray._read_whole_shards

    def recording(self, out, run, *rest):
        original(self, out, run, *rest)
        for coords in self._shards_of(run):
            decoded.append((self.engine.layout.shard_key(coords), threading.current_thread().name))
        if len(decoded) == total - 1 and all(k != first for k, _ in decoded):
            everyone_else.set()

    class HoldFirst(ThreadCounting):
        def read_into(self, key, alloc):
            if key == first:
                everyone_else.wait(20)  # bounded: a reader that waits for this read fails below
            return super().read_into(key, alloc)

        def get_ranges(self, requests, versions=None):
            if any(k == first for k, _, _ in requests):
                everyone_else.wait(20)
            return super().get_ranges(requests, versions)

    monkeypatch.setattr(A.DraftArray, "_read_whole_shards", recording)
    inner = HoldFirst(data)
    a = open_draft(inner, "a")
    assert np.array_equal(a[...], values)
    assert everyone_else.is_set(), f"only {len(decoded)} of {total - 1} shards were decoded while the first was read"
    assert [k for k, _ in decoded][-1] == first
    assert len(decoded) == total and len({k for k, _ in decoded}) == total
    assert all(thread == inner.read_on[key] and thread.startswith("sharding-store-io") for key, thread in decoded)


def test_a_damaged_shard_read_ahead_raises_and_nothing_hangs(values, small_batches):
    data: dict = {}
    _store(data, values)
    data["data/root/a/c3/1"] = data["data/root/a/c3/1"][:-3]  # its index cut short
    a = open_draft(ThreadCounting(data), "a")
    with pytest.raises(ShardCorruptError, match="c3/1"):
        a[...]
    assert np.array_equal(a[:20], values[:20])  # the array reads on


@pytest.mark.parametrize("kind", ["directory", "mapping"])
def test_local_directories_and_mappings_are_read_on_the_decoding_threads(values, tmp_path, small_batches, kind):
    """Nothing to overlap: a directory's shards go into per-thread buffers on the decoding
    pool, a mapping's calls wait on nothing."""
    where = str(tmp_path) if kind == "directory" else {}
    _store(where, values)
    inner = ThreadCounting(where, remote=False)
    a = open_draft(inner, "a")
    assert np.array_equal(a[...], values)
    assert "sharding-store-io" not in inner.threads and inner.threads


@pytest.mark.parametrize("scatter", [True, False])
def test_io_threads_keep_small_buffers_only(monkeypatch, scatter):
    """Each of the READ_WINDOW I/O threads reads and decodes shards; none keeps a read or a
    scratch buffer bigger than IO_KEEP once done (READ_KEEP each would stay allocated for the
    process's lifetime: 32 threads of 64 MiB)."""
    from sharding_store.engine import shard_engine

    monkeypatch.setattr(A, "INLINE_CHUNKS", 4)
    if not scatter:
        monkeypatch.setattr(A.DraftArray, "_scatter", lambda self, out: None)  # the scratch-row path
    shape, chunks = (2048, 2560), (512, 640)  # 4 shards of 4 chunks, ~2.5 MiB each (random: no compression)
    values = np.random.default_rng(5).integers(0, 65536, shape, dtype=np.uint16)
    data: dict = {}
    a = create_draft_array(data, "a", shape=shape, chunks=chunks, dtype="<u2", chunks_per_shard=(2, 2))
    a[...] = values
    assert min(len(v) for k, v in data.items() if k.startswith("data/")) > A.IO_KEEP
    inner = ThreadCounting(data)
    assert np.array_equal(open_draft(inner, "a")[...], values)
    assert "sharding-store-io" in inner.threads
    barrier = threading.Barrier(A.READ_WINDOW, timeout=20)

    def kept() -> list[int]:
        barrier.wait()  # one probe on each I/O thread
        return [getattr(b, "nbytes", 0) for b in (getattr(shard_engine._READ, "buf", None), getattr(A._SCRATCH, "buf", None))]

    sizes = [f.result() for f in [A._io_pool().submit(kept) for _ in range(A.READ_WINDOW)]]
    assert max(max(s) for s in sizes) <= A.IO_KEEP, sizes


def test_a_remote_shards_request_does_not_wait_for_the_outputs_pages(values, monkeypatch, small_batches):
    """A big output is faulted in ahead of the copies (``_Pages``), but only once a task's
    shard has arrived: the first request of the read goes out before any page is populated,
    and every populated block follows its task's read on that thread."""
    from sharding_store.codec import _native

    monkeypatch.setattr(A, "POPULATE_MIN", 1)  # this small output is populated like a big one
    events: list[tuple[str, str]] = []  # (what, thread), in order
    lock = threading.Lock()

    def madvise(address: int, nbytes: int, advice: int) -> bool:
        if advice == _native.MADV_POPULATE_WRITE:
            with lock:
                events.append(("populate", threading.current_thread().name))
        return True

    class Recording(ThreadCounting):
        def read_into(self, key, alloc):
            with lock:
                events.append(("read", threading.current_thread().name))
            return super().read_into(key, alloc)

    monkeypatch.setattr(_native, "madvise", madvise)
    data: dict = {}
    _store(data, values)
    a = open_draft(Recording(data), "a")
    assert np.array_equal(a[...], values)
    assert events and events[0][0] == "read", events[:5]
    populated = [t for what, t in events if what == "populate"]
    assert populated and all(any(e == ("read", t) for e in events[: events.index(("populate", t))]) for t in populated)
