"""sharding_store.ops.jobs: the store cache workers use is per process and bounded (issue 13
item 4); one thread runner that stops at the first error; fault points only through hooks."""

from __future__ import annotations

import os
import threading

import pytest

from sharding_store.ops import jobs
from sharding_store.ops.jobs import MAX_OPENED, StoreRef, fault_point, run_all
from sharding_store.testing import fault_hook


def test_opened_stores_are_bounded(tmp_path):
    refs = [StoreRef.of(str(tmp_path / f"s{i}")) for i in range(3 * MAX_OPENED)]
    for ref in refs:
        assert ref.open() is ref.open()  # reused within the process
    assert len(jobs._OPENED) <= MAX_OPENED


def test_relative_paths_are_opened_for_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = StoreRef.of("store").open()
    monkeypatch.chdir(tmp_path / "b")
    second = StoreRef.of("store").open()
    assert first.location().path == str((tmp_path / "a" / "store").resolve())
    assert second.location().path == str((tmp_path / "b" / "store").resolve())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_opens_its_own_stores(tmp_path):
    ref = StoreRef.of(str(tmp_path / "s"))
    parent = ref.open()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            child = ref.open()
            os.write(write, b"own" if child is not parent and child is ref.open() else b"shared")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"own"
    os.close(read)
    assert ref.open() is parent


@pytest.mark.parametrize("workers", [1, 3])
def test_run_all_stops_at_the_first_error(workers):
    started: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        with lock:
            started.append(i)
        if i == 5:
            raise ValueError("item 5")

    with pytest.raises(ValueError, match="item 5"):
        run_all(work, range(1000), workers)
    # after the failure no new item starts: at most the window in flight, never the rest
    assert 5 in started and len(started) <= 6 + 2 * workers


def test_fault_points_call_only_an_installed_hook():
    seen: list[str] = []
    fault_point("unit")  # nothing installed: nothing happens
    with fault_hook(seen.append):
        fault_point("unit")
        fault_point("meta")
    fault_point("unit")
    assert seen == ["unit", "meta"]
