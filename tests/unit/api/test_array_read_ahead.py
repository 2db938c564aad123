"""Whole shards of remote stores are read ahead of decoding (array.READ_AHEAD): the same
values, the same requests, errors raised, local directories read as before."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sharding_store import ShardCorruptError
from sharding_store.api import arrays as A
from sharding_store.api.arrays import create_draft_array, open_draft
from sharding_store.testing import CountingInner

SHAPE, CHUNKS, CPS = (100, 203), (4, 8), (2, 5)  # edge shards in both dimensions


class ThreadCounting(CountingInner):
    """Also notes the threads that read ranges."""

    def __init__(self, inner):
        super().__init__(inner)
        self.threads: set[str] = set()

    def get_ranges(self, requests, versions=None):
        self.threads.add(threading.current_thread().name.rstrip("_0123456789"))
        return super().get_ranges(requests, versions)


def _store(where, values: np.ndarray) -> None:
    a = create_draft_array(where, "a", shape=SHAPE, chunks=CHUNKS, dtype="<u2", chunks_per_shard=CPS)
    a[...] = values


@pytest.fixture
def values() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 60000, SHAPE, dtype=np.uint16)


@pytest.mark.parametrize("ahead", [True, False])
@pytest.mark.parametrize("sel", [np.s_[...], np.s_[3:97, 7:190], np.s_[::3, 5:], np.s_[8:, :40]])
def test_a_remote_store_reads_the_same_values_and_requests(values, monkeypatch, ahead, sel):
    monkeypatch.setattr(A, "BATCH_BYTES", 16 * 8 * 2 * 10)  # several batches of several runs
    monkeypatch.setattr(A, "INLINE_CHUNKS", 4)
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
    assert (other.calls["get_ranges"], other.ranges) == (inner.calls["get_ranges"], inner.ranges)


def test_a_damaged_shard_read_ahead_raises_and_nothing_hangs(values, monkeypatch):
    monkeypatch.setattr(A, "BATCH_BYTES", 16 * 8 * 2 * 10)
    monkeypatch.setattr(A, "INLINE_CHUNKS", 4)
    data: dict = {}
    _store(data, values)
    data["data/root/a/c3/1"] = data["data/root/a/c3/1"][:-3]  # its index cut short
    a = open_draft(data, "a")
    with pytest.raises(ShardCorruptError, match="c3/1"):
        a[...]
    assert np.array_equal(a[:20], values[:20])  # the array reads on


def test_a_local_directory_is_read_on_the_decoding_threads(values, tmp_path, monkeypatch):
    monkeypatch.setattr(A, "BATCH_BYTES", 16 * 8 * 2 * 10)
    monkeypatch.setattr(A, "INLINE_CHUNKS", 4)
    _store(str(tmp_path), values)
    inner = ThreadCounting(str(tmp_path))
    a = open_draft(inner, "a")
    assert np.array_equal(a[...], values)
    assert "sharding-store-io" not in inner.threads and inner.calls["read_into"] > 0
