"""``LocalInner.get_tails`` over a batch (what a virtual migration reads per batch of shards):
a run of keys in one directory holds its descriptor once, and each key still gets what it
would alone (a link inside followed, a missing name, a directory, a link out refused)."""

from __future__ import annotations

import os

import pytest

from sharding_store.errors import LinkOutsideStoreError
from sharding_store.stores.local import LocalInner
from sharding_store.stores.local_fd import DirFds


def _store(tmp_path) -> LocalInner:
    d = tmp_path / "store" / "a" / "c0"
    d.mkdir(parents=True)
    for i in range(20):
        (d / str(i)).write_bytes(bytes(range(i, i + 40)))
    return LocalInner(str(tmp_path / "store"))


def test_a_run_of_keys_in_one_directory_holds_its_descriptor_once(monkeypatch, tmp_path):
    inner = _store(tmp_path)
    inner.get_tails([("a/c0/0", 8)])  # the directory cached
    acquired = []
    real = DirFds.acquire

    def acquire(self, path):
        acquired.append(path)
        return real(self, path)

    monkeypatch.setattr(DirFds, "acquire", acquire)
    got = inner.get_tails([(f"a/c0/{i}", 8) for i in range(20)])
    assert [t.data for t in got] == [bytes(range(i + 32, i + 40)) for i in range(20)]
    assert all(t.size == 40 and t.version is not None for t in got)
    assert acquired == ["a/c0"], f"{len(acquired)} acquisitions for one directory"


def test_each_key_of_a_batch_gets_what_it_gets_alone(tmp_path):
    inner = _store(tmp_path)
    d = tmp_path / "store" / "a" / "c0"
    os.symlink("3", d / "linked")  # inside: followed
    (d / "sub").mkdir()  # a directory: no object
    requests = [("a/c0/1", 4), ("a/c0/linked", 4), ("a/c0/missing", 4), ("a/c0/sub", 4), ("a/c0/..", 4),
                ("a/c0/2", 100), ("a/c1/0", 4), ("a/c0/3", 0)]
    batch = inner.get_tails(requests)
    alone = [LocalInner(str(tmp_path / "store")).get_tails([r])[0] for r in requests]
    assert [None if t is None else (t.data, t.size) for t in batch] == \
        [None if t is None else (t.data, t.size) for t in alone]
    assert batch[1].data == bytes(range(39, 43)) and batch[5].data == bytes(range(2, 42)) and batch[7].data == b""
    assert [t is None for t in batch] == [False, False, True, True, True, False, True, False]
    os.symlink(str(tmp_path), d / "out")  # a link out of the store, among good keys
    with pytest.raises(LinkOutsideStoreError, match="a/c0/out"):
        inner.get_tails([("a/c0/1", 4), ("a/c0/out", 4), ("a/c0/2", 4)])
