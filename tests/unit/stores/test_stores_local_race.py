"""The local store's reads (``_open``/``_stat`` and their shared walk) when a key's directory is
removed, and perhaps made again, by someone else: the cached descriptor goes stale, the walk is
tried again, and a read says "missing" or returns the object as written, never another error."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from sharding_store.stores import LocalInner


def _write(path: Path, data: bytes) -> None:
    """``data`` at ``path`` as another program writes it: a temporary file renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _reads(inner: LocalInner, key: str) -> dict[str, object]:
    """What every read of ``key`` says (the ``_open`` readers and the ``_stat`` readers)."""
    tail = inner.get_tails([(key, 4)])[0]
    into = inner.read_into(key, lambda n: np.empty(max(n, 1), np.uint8))
    return {
        "get": inner.get(key),
        "ranges": inner.get_ranges([(key, 0, 3)])[0],
        "tail": None if tail is None else bytes(tail.data),
        "into": None if into is None else bytes(into.data),
        "size": inner.size(key),
        "exists": inner.exists(key),
    }


def _expected(data: bytes | None) -> dict[str, object]:
    if data is None:
        return {"get": None, "ranges": None, "tail": None, "into": None, "size": None, "exists": False}
    return {"get": data, "ranges": data[:3], "tail": data[-4:], "into": data, "size": len(data), "exists": True}


def test_reads_follow_a_directory_removed_and_made_again(tmp_path: Path) -> None:
    root = tmp_path / "store"
    inner = LocalInner(root)
    inner.set("a/b/k", b"first version")
    os.symlink("a", root / "l")  # a link inside the store: its reads take the walk every time
    for key in ("a/b/k", "l/b/k"):
        assert _reads(inner, key) == _expected(b"first version")  # the directories are cached now
    shutil.rmtree(root / "a")
    _write(root / "a" / "b" / "k", b"second, longer version")
    for key in ("a/b/k", "l/b/k"):
        assert _reads(inner, key) == _expected(b"second, longer version")
    shutil.rmtree(root / "a")
    for key in ("a/b/k", "l/b/k"):
        assert _reads(inner, key) == _expected(None)
    os.mkdir(root / "a")  # made again, without the object
    for key in ("a/b/k", "l/b/k"):
        assert _reads(inner, key) == _expected(None)


def test_reads_racing_a_remover_say_missing_or_return_the_object(tmp_path: Path) -> None:
    """A real race (bounded in time): one thread removes the directory and makes it again with
    the object; the reader sees the object or nothing, and the stale descriptors were met."""
    root = tmp_path / "store"
    data = bytes(range(256)) * 8
    inner = LocalInner(root)
    inner.set("d/e/k", data)
    os.symlink("d", root / "l")
    stale = {"yes": 0}
    check = inner._dirs.stale

    def counting(d):  # type: ignore[no-untyped-def]
        gone = check(d)
        stale["yes"] += gone
        return gone

    inner._dirs.stale = counting  # type: ignore[method-assign]
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            shutil.rmtree(root / "d", ignore_errors=True)
            _write(root / "d" / "e" / "k", data)
            time.sleep(0.002)  # there most of the time: reads find it, and race its removal

    thread = threading.Thread(target=churn)
    thread.start()
    seen: dict[str, set[str]] = {"d/e/k": set(), "l/e/k": set()}
    try:
        deadline = time.monotonic() + 10  # a loaded machine; usually well under a second
        while time.monotonic() < deadline and (stale["yes"] < 20 or not all("found" in s for s in seen.values())):
            for key in ("d/e/k", "l/e/k"):
                got = _reads(inner, key)
                for name, value in got.items():  # each read alone: the object or nothing
                    assert value in (_expected(data)[name], _expected(None)[name]), (key, name, value)
                seen[key].add("found" if got["get"] is not None else "missing")
    finally:
        stop.set()
        thread.join()
    assert stale["yes"] > 0, "the race never made a cached directory stale: it tested nothing"
    assert "found" in seen["d/e/k"] and "found" in seen["l/e/k"]
