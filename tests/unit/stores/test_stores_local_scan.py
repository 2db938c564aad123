"""``LocalInner.get_tails`` / ``tails_to_refer`` through our loops' ``ss_read_tails`` (one C call
a run of keys in a directory) against the Python path (the reference, used without the library):
the same tails, sizes and versions, and the same references or refusals after them, on random
stores holding what the guard exists for (links inside and out, to files and to directories,
FIFOs, directories, objects shorter than the tail, missing names, recent files)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store.codec import _native
from sharding_store.errors import LinkOutsideStoreError, ObjectChangedError
from sharding_store.stores.local import LocalInner

pytestmark = pytest.mark.skipif(_native.tail_reader() is None, reason="our loops' library is not built")

OLD = 10**18  # long ago (2001): no CRC in the version
KINDS = ("file", "old", "short", "empty", "link", "link_out", "dangling", "fifo", "dir", "missing", "dir_link")


def _make(top: Path, outside: Path, name: str, kind: str, size: int) -> None:
    path = top / name
    if kind in ("file", "old", "short", "empty"):
        path.write_bytes(os.urandom(0 if kind == "empty" else size % 8 if kind == "short" else size + 8))
        if kind != "file":
            os.utime(path, ns=(OLD, OLD))
    elif kind == "link":
        (top / f"target-{name}").write_bytes(os.urandom(size + 8))
        os.symlink(f"target-{name}", path)
    elif kind == "link_out":
        (outside / name).write_bytes(os.urandom(size + 8))
        os.symlink(outside / name, path)
    elif kind == "dangling":
        os.symlink("nowhere", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()


def _store(tmp: Path, layout: list[list[tuple[str, int]]]) -> tuple[LocalInner, list[str]]:
    """A store with one directory per element of ``layout`` (``d0`` a link to ``d1`` when
    a ``dir_link`` is asked for), and the keys of every object asked for, in order."""
    root, outside = tmp / "store", tmp / "outside"
    root.mkdir()
    outside.mkdir()
    keys = []
    for j, entries in enumerate(layout):
        top = root / "a" / f"d{j}"
        top.mkdir(parents=True)
        for i, (kind, size) in enumerate(entries):
            name = f"k{i}"
            if kind == "dir_link":
                if not (root / "a" / f"alias{j}").exists():
                    os.symlink(f"d{j}", root / "a" / f"alias{j}")
                keys.append(f"a/alias{j}/{name}")
                _make(top, outside, name, "old", size)
                continue
            _make(top, outside, name, kind, size)
            keys.append(f"a/d{j}/{name}")
    return LocalInner(str(root)), keys


def _outcome(call):  # type: ignore[no-untyped-def]
    try:
        return ("ok", call())
    except (LinkOutsideStoreError, ObjectChangedError) as e:
        return (type(e).__name__, str(e))


def _run(inner: LocalInner, requests: list[tuple[str, int]], refer: bool) -> tuple[object, list[object]]:
    read = inner.tails_to_refer if refer else inner.get_tails
    tails = _outcome(lambda: read(requests))
    refs = []
    if tails[0] == "ok":
        for (key, _), tail in zip(requests, tails[1]):
            if tail is not None:
                refs.append(_outcome(lambda: inner.reference_to(key, 0, tail.size, tail.version)))  # noqa: B023
    return tails, refs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 40)), min_size=1, max_size=8),
                       min_size=1, max_size=3),
       n=st.sampled_from([0, 4, 16, 32]), refer=st.booleans(), data=st.data())
def test_the_c_scan_gives_what_the_python_path_gives(tmp_path_factory, layout, n, refer, data):
    tmp = tmp_path_factory.mktemp("scan")
    inner, keys = _store(tmp, layout)
    keys = data.draw(st.permutations(keys + ["a/d0/gone", "a/nodir/k0"]))
    requests = [(k, n) for k in keys]
    with _native.using_loops(False):
        expected = _run(LocalInner(inner.root), requests, refer)
    got = _run(inner, requests, refer)
    assert got == expected


def test_a_batch_is_read_by_one_c_call_a_directory_and_refers_without_lstat(tmp_path, monkeypatch):
    inner, keys = _store(tmp_path, [[("old", 30)] * 20, [("old", 30)] * 20])
    inner.get_tails([(keys[0], 8), (keys[20], 8)])  # the directories cached
    calls = []
    real = _native.read_tails
    monkeypatch.setattr(_native, "read_tails", lambda *a: calls.append(a[3]) or real(*a))
    tails = inner.tails_to_refer([(k, 8) for k in keys])
    assert calls == [20, 20]
    lstat = []
    monkeypatch.setattr(os, "lstat", lambda *a, **k: lstat.append(a))
    refs = [inner.reference_to(k, 0, t.size, t.version) for k, t in zip(keys, tails)]
    assert lstat == [] and not inner._vouched
    monkeypatch.undo()
    with _native.using_loops(False):
        plain = LocalInner(inner.root)
        assert refs == [plain.reference_to(k, 0, t.size, t.version) for k, t in zip(keys, tails)]


def test_plain_tail_reads_check_no_path(tmp_path, monkeypatch):
    """``get_tails`` (a read, no reference to follow) passes no directory: no ``lstat``, nothing kept."""
    inner, keys = _store(tmp_path, [[("old", 30)] * 10])
    inner.get_tails([(keys[0], 8)])
    dirs = []
    real = _native.read_tails
    monkeypatch.setattr(_native, "read_tails", lambda *a: dirs.append(a[5]) or real(*a))
    inner.get_tails([(k, 8) for k in keys])
    assert dirs == [None] and not inner._vouched


def test_recent_files_carry_a_crc_and_are_not_vouched_for(tmp_path):
    inner, keys = _store(tmp_path, [[("file", 30)] * 3])
    tails = inner.tails_to_refer([(k, 8) for k in keys])
    with _native.using_loops(False):
        plain = LocalInner(inner.root).get_tails([(k, 8) for k in keys])
    assert [t.version for t in tails] == [t.version for t in plain]
    assert all(len(t.version) == 6 for t in tails) and not inner._vouched
    assert time.time_ns() - tails[0].version[2] < 10**10
