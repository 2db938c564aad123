"""``reference_to`` (issue 24): where a source object's bytes are, by URL, with what the object was.

Local: a ``file://`` URL of the resolved path inside the store, size and ``st_mtime_ns`` from
``fstat``; never a link out; a version that no longer holds refuses. In-process stores
(mappings, memory): None. Destinations: ``takes_references``/``put_reference``/``commit``
defaults. S3: ``tests/integration/test_references_s3.py``.
"""

from __future__ import annotations

import os
from datetime import UTC

import pytest

from sharding_store.errors import LinkOutsideStoreError, ObjectChangedError
from sharding_store.stores import BaseInner, ChunkRef, LocalInner, as_inner
from sharding_store.testing import CountingInner


def test_a_local_reference_is_the_resolved_path_with_size_and_mtime(tmp_path):
    store = tmp_path / "store"
    (store / "a").mkdir(parents=True)
    (store / "a" / "obj").write_bytes(b"0123456789")
    inner = LocalInner(str(store))
    ref = inner.reference_to("a/obj", 2, 5)
    st = os.stat(store / "a" / "obj")
    assert ref == ChunkRef(f"file://{os.path.realpath(store / 'a' / 'obj')}", 2, 5, 10,
                           modified=ref.modified, modified_ns=st.st_mtime_ns, inode=st.st_ino)
    assert ref.modified.tzinfo == UTC
    assert int(ref.modified.timestamp()) == st.st_mtime_ns // 10**9
    assert ref.modified.microsecond == st.st_mtime_ns % 10**9 // 1000


def test_a_link_inside_the_store_is_followed_to_its_target(tmp_path):
    store = tmp_path / "store"
    (store / "real").mkdir(parents=True)
    (store / "real" / "obj").write_bytes(b"xyz")
    os.symlink("real", store / "alias")
    ref = LocalInner(str(store)).reference_to("alias/obj", 0, 3)
    assert ref is not None and ref.url == f"file://{os.path.realpath(store / 'real' / 'obj')}"


def test_a_link_out_of_the_store_is_refused(tmp_path):
    (tmp_path / "outside").write_bytes(b"secret")
    store = tmp_path / "store"
    store.mkdir()
    os.symlink(tmp_path / "outside", store / "obj")
    with pytest.raises(LinkOutsideStoreError):
        LocalInner(str(store)).reference_to("obj", 0, 6)


def test_a_version_that_no_longer_holds_is_refused(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "obj").write_bytes(b"0123456789")
    inner = LocalInner(str(store))
    tail = inner.get_tails([("obj", 4)])[0]
    assert inner.reference_to("obj", 0, 10, tail.version) is not None
    (store / "obj").write_bytes(b"0123456789abc")
    with pytest.raises(ObjectChangedError):
        inner.reference_to("obj", 0, 10, tail.version)


def test_missing_objects_and_directories_have_no_reference(tmp_path):
    (tmp_path / "d").mkdir()
    inner = LocalInner(str(tmp_path))
    assert inner.reference_to("missing", 0, 1) is None
    assert inner.reference_to("d", 0, 1) is None


def test_in_process_stores_have_no_url():
    assert as_inner({"a": b"1"}).reference_to("a", 0, 1) is None
    import fsspec

    memory = as_inner("memory://refs-test")
    memory.set("a", b"1")
    assert memory.reference_to("a", 0, 1) is None
    fsspec.filesystem("memory").rm("/refs-test", recursive=True)


def test_store_defaults_take_bytes_not_references():
    inner = as_inner({})
    assert isinstance(inner, BaseInner)
    assert inner.takes_references() is False
    with pytest.raises(NotImplementedError, match="takes bytes, not references"):
        inner.put_reference("k", ChunkRef("file:///x", 0, 1, 1))
    assert inner.commit("message") == ""


def test_the_counting_wrapper_delegates_and_counts_the_new_capabilities(tmp_path):
    (tmp_path / "obj").write_bytes(b"abc")
    counting = CountingInner(str(tmp_path))
    assert counting.reference_to("obj", 0, 3).object_size == 3
    assert counting.takes_references() is False
    assert counting.commit("m") == ""
    assert counting.calls["reference_to"] == 1 and counting.calls["commit"] == 1 and counting.reads == 0


def test_with_a_tail_version_one_lstat_does_and_never_a_link(tmp_path, monkeypatch):
    store = tmp_path / "store"
    (store / "real").mkdir(parents=True)
    (store / "real" / "obj").write_bytes(b"0123456789")
    os.symlink("real", store / "alias")
    os.symlink("obj", store / "real" / "link")
    inner = LocalInner(str(store))
    old = 10**18  # long ago: versions of recent files carry a CRC the descriptor's way checks
    os.utime(store / "real" / "obj", ns=(old, old))
    versions = {k: inner.get_tails([(k, 4)])[0].version for k in ("alias/obj", "real/link")}
    opened = []
    monkeypatch.setattr(inner, "_open", lambda key: opened.append(key) or LocalInner._open(inner, key))
    ref = inner.reference_to("alias/obj", 0, 10, versions["alias/obj"])
    assert opened == [] and ref.url == f"file://{os.path.realpath(store / 'real' / 'obj')}"
    assert ref == LocalInner(str(store)).reference_to("alias/obj", 0, 10)  # the descriptor's way agrees
    linked = inner.reference_to("real/link", 0, 10, versions["real/link"])  # a link: the descriptor's way
    assert opened == ["real/link"] and linked.url == ref.url
    (store / "real" / "obj").write_bytes(b"0123456789")  # rewritten since the version: refused
    with pytest.raises(ObjectChangedError):
        inner.reference_to("alias/obj", 0, 10, versions["alias/obj"])


def test_a_directory_per_shard_costs_one_lstat_below_its_resolved_parent(tmp_path, monkeypatch):
    """One directory per shard (a column of shards): each new directory is one ``lstat``
    below its resolved parent, not a ``realpath`` of every component; a directory link is
    still resolved (inside: followed; out of the store: refused)."""
    store, n, old = tmp_path / "store", 40, 10**18
    for i in range(n):
        (store / "arr" / f"c{i}").mkdir(parents=True)
        (store / "arr" / f"c{i}" / "0").write_bytes(b"0123456789")
        os.utime(store / "arr" / f"c{i}" / "0", ns=(old, old))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "0").write_bytes(b"0123456789")
    os.utime(tmp_path / "outside" / "0", ns=(old, old))
    os.symlink("c0", store / "arr" / "alias")
    os.symlink(tmp_path / "outside", store / "arr" / "out")
    inner = LocalInner(str(store))
    keys = [f"arr/c{i}/0" for i in range(n)]
    versions = [t.version for t in inner.get_tails([(k, 4) for k in keys])]
    calls = {"lstat": 0, "realpath": 0}
    lstat, realpath = os.lstat, os.path.realpath

    def counted_lstat(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["lstat"] += 1
        return lstat(*args, **kwargs)

    def counted_realpath(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["realpath"] += 1
        return realpath(*args, **kwargs)

    monkeypatch.setattr(os, "lstat", counted_lstat)
    monkeypatch.setattr(os.path, "realpath", counted_realpath)
    refs = [inner.reference_to(k, 0, 10, v) for k, v in zip(keys, versions)]
    monkeypatch.undo()
    assert [r.url for r in refs] == [f"file://{realpath(store / 'arr' / f'c{i}' / '0')}" for i in range(n)]
    assert calls["realpath"] <= 2 and calls["lstat"] <= 2 * n + 2 * len(store.parts), calls
    alias = inner.reference_to("arr/alias/0", 0, 10, inner.get_tails([("arr/alias/0", 4)])[0].version)
    assert alias.url == refs[0].url
    with pytest.raises(LinkOutsideStoreError):
        inner.reference_to("arr/out/0", 0, 10, inner.get_tails([("arr/out/0", 4)])[0].version)
