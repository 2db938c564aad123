"""The local-directory store: consistent reads under rewriters, links never followed out of
the store, capabilities (exclusive create, kernel copies through wrappers, moves, tidy)."""

from __future__ import annotations

import os
import struct
import threading
import time

import numpy as np
import pytest

from sharding_store import ShardingStore
from sharding_store.errors import LinkOutsideStoreError, ObjectChangedError, ShardingStoreError
from sharding_store.stores import LocalInner, MappingInner, Tail, as_inner
from sharding_store.testing import CountingInner

# ---------------------------------------------------------------------- versions


def _blob(i: int, n: int = 4096) -> bytes:
    """Version ``i`` of an object: every 8 bytes say ``i`` (a torn read shows two numbers)."""
    return struct.pack("<Q", i) * (n // 8)


def _rewriters(store, key: str, n_threads: int, stop: threading.Event, size: int = 4096) -> list[threading.Thread]:
    def rewrite(seed: int) -> None:
        i = seed
        while not stop.is_set():
            store.set(key, _blob(i, size))
            i += n_threads

    threads = [threading.Thread(target=rewrite, args=(s + 1,)) for s in range(n_threads)]
    for t in threads:
        t.start()
    return threads


def _read_under_rewrites(store, key: str, seconds: float, size: int = 4096) -> dict[str, int]:
    """Tail (last 8 bytes: the version number) then the first 8 bytes with the tail's version:
    the same number, or ObjectChangedError — never another version's bytes."""
    store.set(key, _blob(0, size))
    stop = threading.Event()
    threads = _rewriters(store, key, 2, stop, size)
    counts = {"same": 0, "changed": 0, "mixed": 0, "unchecked_mixed": 0}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            tail = store.get_tails([(key, 8)])[0]
            assert isinstance(tail, Tail) and tail.version is not None
            expected = struct.unpack("<Q", tail.data)[0]
            try:
                head = store.get_ranges([(key, 0, 8), (key, size // 2, size // 2 + 8)], [tail.version] * 2)
            except ObjectChangedError as e:
                assert e.key == key and key in str(e)
                counts["changed"] += 1
            else:
                got = {struct.unpack("<Q", h)[0] for h in head}
                counts["same" if got == {expected} else "mixed"] += 1
            unchecked = store.get_ranges([(key, 0, 8)])[0]
            counts["unchecked_mixed"] += struct.unpack("<Q", unchecked)[0] != expected
    finally:
        stop.set()
        for t in threads:
            t.join()
    return counts


@pytest.mark.slow  # a writer racing the reads (~3 s)
def test_local_ranges_with_a_version_never_mix_two_versions_of_an_object(tmp_path):
    counts = _read_under_rewrites(LocalInner(tmp_path), "data/root/a/c0", 3.0)
    assert counts["mixed"] == 0, counts
    assert counts["same"] > 100 and counts["changed"] > 0, counts
    assert counts["unchecked_mixed"] > 0, counts  # the rewriters did race the reader: the test can fail


def test_local_version_survives_inode_reuse_within_one_mtime_tick(tmp_path, monkeypatch):
    """A rewrite may get the old inode number back and the same mtime (coarse clocks): a
    recent file's version carries its tail's CRC, checked again by the range read."""
    inner = LocalInner(tmp_path)
    inner.set("k", _blob(1))
    tail = inner.get_tails([("k", 8)])[0]
    assert len(tail.version) == 6  # recent: (dev, ino, mtime, size, tail length, crc)
    st = os.stat(tmp_path / "k")
    fd = os.open(tmp_path / "k", os.O_WRONLY)  # same inode, same size, mtime set back: ABA
    os.pwrite(fd, _blob(2), 0)
    os.close(fd)
    os.utime(tmp_path / "k", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ObjectChangedError, match="k: the object changed"):
        inner.get_ranges([("k", 0, 8)], [tail.version])
    old = time.time() - 3600  # an old file: no CRC in its version, nothing more to read
    os.utime(tmp_path / "k", (old, old))
    assert len(inner.get_tails([("k", 8)])[0].version) == 4


def test_local_version_of_a_deleted_object_raises(tmp_path):
    inner = LocalInner(tmp_path)
    inner.set("a/k", b"12345678")
    version = inner.get_tails([("a/k", 4)])[0].version
    inner.delete("a/k")
    with pytest.raises(ObjectChangedError):
        inner.get_ranges([("a/k", 0, 4)], [version])
    assert inner.get_ranges([("a/k", 0, 4)]) == [None]


def test_mapping_versions_catch_a_rewrite():
    inner = MappingInner({})
    inner.set("k", _blob(1))
    tail = inner.get_tails([("k", 8)])[0]
    assert inner.get_ranges([("k", 0, 8)], [tail.version]) == [_blob(1)[:8]]
    inner.set("k", _blob(2))
    with pytest.raises(ObjectChangedError):
        inner.get_ranges([("k", 0, 8)], [tail.version])
    inner.delete("k")
    with pytest.raises(ObjectChangedError):
        inner.get_ranges([("k", 0, 8)], [tail.version])


def test_mapping_ranges_with_a_version_never_mix_two_versions():
    counts = _read_under_rewrites(MappingInner({}), "k", 1.5)
    assert counts["mixed"] == 0 and counts["same"] > 100, counts


def test_read_into_returns_the_buffer_prefix_size_and_version(tmp_path):
    inner = LocalInner(tmp_path)
    inner.set("k", b"abcdef")
    buf = np.zeros(3, np.uint8)
    sizes = []

    def alloc(n):
        sizes.append(n)
        return buf if n <= len(buf) else np.zeros(n, np.uint8)

    got = inner.read_into("k", alloc)
    assert bytes(got.data) == b"abcdef" and got.size == 6 and sizes == [6]
    assert inner.get_ranges([("k", 1, 3)], [got.version]) == [b"bc"]
    assert inner.read_into("missing", alloc) is None
    os.mkdir(tmp_path / "d")
    assert inner.read_into("d", alloc) is None and inner.get("d") is None and not inner.exists("d")


# ---------------------------------------------------------------------- symbolic links


@pytest.fixture
def linked(tmp_path):
    """A store with links: inside it (kept working) and out of it (refused)."""
    root, outside = tmp_path / "store", tmp_path / "elsewhere"
    (root / "data" / "real").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    (outside / "keep").write_bytes(b"must survive")
    (root / "data" / "real" / "k").write_bytes(b"inside")
    (root / "data" / "out").symlink_to(outside)  # a directory link out of the store
    (root / "data" / "passwd").symlink_to(outside / "secret")  # a file link out of it
    (root / "data" / "alias").symlink_to(root / "data" / "real")  # a directory link inside
    (root / "data" / "k2").symlink_to(root / "data" / "real" / "k")  # a file link inside
    (root / "data" / "up").symlink_to("..")  # a cycle
    return root, outside


def test_reading_through_a_link_out_of_the_store_is_refused_naming_the_key(linked):
    root, _ = linked
    inner = LocalInner(root)
    for key in ("data/passwd", "data/out/secret", "../elsewhere/secret"):
        for read in (
            lambda: inner.get(key),
            lambda: inner.get_ranges([(key, 0, 4)]),
            lambda: inner.get_tails([(key, 4)]),
            lambda: inner.read_into(key, lambda n: bytearray(n)),
            lambda: inner.size(key),
            lambda: inner.local_path(key),
        ):
            with pytest.raises(LinkOutsideStoreError) as info:
                read()
            assert info.value.key == key and key in str(info.value) and info.value.exit_code == 13
    with pytest.raises(LinkOutsideStoreError):
        inner.set("data/out/new", b"x")  # nor written through
    assert not (linked[1] / "new").exists()
    assert isinstance(LinkOutsideStoreError("x"), ShardingStoreError)


def test_links_inside_the_store_keep_working(linked):
    root, _ = linked
    inner = LocalInner(root)
    assert inner.get("data/k2") == b"inside" and inner.get("data/alias/k") == b"inside"
    assert inner.get_ranges([("data/alias/k", 0, 2)]) == [b"in"]
    assert inner.exists("data/k2") and inner.size("data/alias/k") == 6


def test_listing_never_follows_a_link_out_of_the_store(linked):
    root, _ = linked
    inner = LocalInner(root)
    keys = list(inner.list_prefix(""))
    # the escaping links are listed as keys of their own (reading them is refused);
    # nothing of /elsewhere is listed; the inside links are followed; the cycle is not
    assert keys == ["data/alias/k", "data/k2", "data/out", "data/passwd", "data/real/k"]
    assert dict(inner.list_sized("data/")) == {
        "data/alias/k": 6, "data/k2": 6, "data/out": None, "data/passwd": None, "data/real/k": 6}
    assert list(inner.list_prefix("data/out/")) == []
    assert inner.list_dir("data/") == (["data/k2", "data/out", "data/passwd"], ["data/alias/", "data/real/"])


def test_deletes_remove_links_never_what_they_point_to(linked):
    root, outside = linked
    inner = LocalInner(root)
    inner.delete_prefix("")
    assert sorted(os.listdir(outside)) == ["keep", "secret"]  # rm -rf semantics: links removed
    assert os.listdir(root) == []
    assert (outside / "secret").read_bytes() == b"not yours"


def test_overwriting_a_destination_holding_a_link_keeps_the_target(tmp_path):
    """create_draft_array(overwrite=True) / migrate --overwrite into DST with link -> elsewhere."""
    dst, outside = tmp_path / "dst", tmp_path / "elsewhere"
    dst.mkdir()
    outside.mkdir()
    (outside / "precious").write_bytes(b"x" * 10)
    (dst / "link").symlink_to(outside)
    inner = LocalInner(dst)
    inner.delete_prefix("link/")
    inner.delete("link")
    assert (outside / "precious").read_bytes() == b"x" * 10 and not (dst / "link").is_symlink()


def test_the_read_path_adds_no_system_call_for_links(tmp_path, monkeypatch):
    """O_NOFOLLOW on the file; each directory resolved once per store object."""
    inner = LocalInner(tmp_path)
    for i in range(5):
        inner.set(f"a/b/{i}", b"x")
    calls = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    for _ in range(3):
        assert inner.get_ranges([(f"a/b/{i}", 0, 1) for i in range(5)]) == [b"x"] * 5
    assert calls == []  # the directory was checked by the writes already


def test_a_store_reached_through_a_link_reads(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    inner = LocalInner(tmp_path / "link")
    inner.set("a/k", b"v")
    assert inner.get("a/k") == b"v" and list(inner.list_prefix("")) == ["a/k"]
    assert inner.location().path == str((tmp_path / "real").resolve())


# ---------------------------------------------------------------------- capabilities


def test_create_exclusive_lets_exactly_one_writer_win(tmp_path):
    inner = LocalInner(tmp_path)
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        barrier.wait()
        results.append(inner.create_exclusive("claim/marker", f"run {i}".encode()))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert inner.get("claim/marker").startswith(b"run ")
    assert os.listdir(tmp_path / "claim") == ["marker"]  # no temporary file left


@pytest.mark.parametrize("wrap_src", [False, True])
@pytest.mark.parametrize("wrap_dst", [False, True])
def test_kernel_copy_works_through_wrappers(tmp_path, wrap_src, wrap_dst):
    src, dst = LocalInner(tmp_path / "s"), LocalInner(tmp_path / "d")
    src.set("a/k", b"payload")
    s = CountingInner(src) if wrap_src else src
    d = CountingInner(dst) if wrap_dst else dst
    assert s.can_copy_to(d) and s.can_copy_to(d, append=True)
    version = s.get_tails([("a/k", 4)])[0].version
    assert s.copy_to("a/k", d, "x/y", append=b"+crc", version=version)
    assert dst.get("x/y") == b"payload+crc" and d.size("x/y") == 11
    if wrap_src:
        assert s.calls["copy_to"] == 1 and s.writes == 1
    src.set("a/k", b"changed")
    with pytest.raises(ObjectChangedError):
        s.copy_to("a/k", d, "x/z", version=version)
    assert not dst.exists("x/z")
    with pytest.raises(FileNotFoundError):
        s.copy_to("missing", d, "x/w")


def test_copy_to_a_store_without_the_capability_says_false(tmp_path):
    src = LocalInner(tmp_path)
    src.set("k", b"v")
    other = MappingInner({})
    assert not src.can_copy_to(other) and src.copy_to("k", other, "k") is False
    assert other.copy_to("k", src, "k") is False


def test_move_renames_and_prunes_emptied_directories(tmp_path):
    inner = CountingInner(LocalInner(tmp_path))
    inner.set("stage/a/b/k", b"v")
    inner.move("stage/a/b/k", "final/k")
    assert inner.get("final/k") == b"v" and not (tmp_path / "stage").exists()
    inner.move("stage/a/b/k", "final/k")  # a move already done (a resumed run): no error
    with pytest.raises(FileNotFoundError):
        inner.move("nothing", "final/none")
    assert inner.calls["move"] == 2


def test_tidy_removes_leftovers_of_killed_writes_and_empty_directories(tmp_path):
    from sharding_store.stores import TEMP_MARKER

    inner = LocalInner(tmp_path)
    inner.set("keep/k", b"v")
    (tmp_path / "stage" / "x").mkdir(parents=True)
    (tmp_path / "stage" / "x" / f"k{TEMP_MARKER}1-abc-0").write_bytes(b"half")
    (tmp_path / "keep" / f"k{TEMP_MARKER}1-abc-1").write_bytes(b"half")
    assert list(inner.list_prefix("")) == ["keep/k"]  # never listed
    inner.tidy("stage/", keep_top=False)
    assert not (tmp_path / "stage").exists() and len(os.listdir(tmp_path / "keep")) == 2
    inner.tidy()
    assert os.listdir(tmp_path / "keep") == ["k"] and tmp_path.exists()


def test_list_sized_is_sorted_lazily_across_directories(tmp_path):
    inner = LocalInner(tmp_path)
    keys = ["a.b", "a/b", "a/c/d", "a0", "a-", "b", "a/b.c", "a/b/c"[:3] + "x"]
    for k in keys:
        inner.set(k, k.encode())
    listing = inner.list_sized("")
    assert not isinstance(listing, (list, tuple))  # an iterator
    assert list(listing) == sorted((k, len(k)) for k in keys)
    assert list(inner.list_prefix("a/b")) == ["a/b", "a/b.c", "a/bx"]


@pytest.mark.parametrize("spelling", ["plain", "relative", "file", "tilde", "dotdot", "slash", "fsspec"])
def test_every_local_spelling_is_a_local_inner(tmp_path, monkeypatch, spelling):
    import fsspec

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "s").mkdir()
    store = {
        "plain": str(tmp_path / "s"), "relative": "s", "file": f"file://{tmp_path}/s", "tilde": "~/s",
        "dotdot": f"{tmp_path}/s/../s", "slash": f"{tmp_path}/s/", "fsspec": fsspec.get_mapper(f"file://{tmp_path}/s"),
    }[spelling]
    inner = as_inner(store)
    assert isinstance(inner, LocalInner)
    assert inner.location() == LocalInner(tmp_path / "s").location()


def test_a_sharding_store_reads_through_counting_the_same_branch_as_without(tmp_path):
    """Whole-shard reads through a wrapper use the same capability (read_into) as production."""
    store = ShardingStore(str(tmp_path), chunks_per_shard=(2,), array_path="a")
    store.update({f"data/root/a/c{i}": bytes([i]) * 3 for i in range(4)})
    counting = CountingInner(str(tmp_path))
    got = counting.read_into("data/root/a/c0", lambda n: bytearray(n))
    assert got.size == len(got.data) and counting.calls["read_into"] == 1 and counting.reads == 1



@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_holds_the_directory_lock_can_write(tmp_path):
    """The lock that serialises prunes with makedirs is made anew in a forked child."""
    import multiprocessing

    from sharding_store.stores import local

    inner = LocalInner(tmp_path)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with local.DIRECTORY_LOCK:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        ctx = multiprocessing.get_context("fork")
        child = ctx.Process(target=inner.set, args=("new/dir/k", b"v"))  # a missing directory: takes the lock
        child.start()
        child.join(20)
        hung = child.is_alive()
        if hung:
            child.kill()
    finally:
        release.set()
        holder.join()
    assert not hung and child.exitcode == 0 and inner.get("new/dir/k") == b"v"


def test_deleting_a_prefix_through_a_link_out_of_the_store_touches_nothing_there(linked):
    root, outside = linked
    (outside / "sub").mkdir()
    (outside / "sub" / "x").write_bytes(b"x")
    inner = LocalInner(root)
    inner.delete_prefix("data/out/sub/")
    inner.delete_prefix("data/out/s")
    inner.tidy("data/out/", keep_top=False)
    assert (outside / "sub" / "x").exists() and (root / "data" / "out").is_symlink()
    inner.delete_prefix("data/alias/")  # a link inside the store: the link goes, its target stays
    assert not (root / "data" / "alias").exists() and inner.get("data/real/k") == b"inside"
    with pytest.raises(LinkOutsideStoreError):
        inner.exists("data/passwd")
    with pytest.raises(LinkOutsideStoreError):
        inner.get_ranges([("data/real/k", 0, 1), ("data/passwd", 0, 1)])  # after a good key: no fd leak


def test_every_store_and_the_counting_wrapper_have_the_whole_interface():
    from sharding_store.stores import BaseInner, FsspecInner, Inner, ZarrStoreInner

    names = sorted(n for n in vars(BaseInner) if not n.startswith("_"))
    assert {"copy_to", "create_exclusive", "list_sized", "location", "move", "read_into", "size"} <= set(names)
    for cls in (LocalInner, FsspecInner, MappingInner, ZarrStoreInner):
        assert issubclass(cls, BaseInner)
    for name in names:  # defined on the wrapper itself: nothing reaches the wrapped store unseen
        assert name in vars(CountingInner), name
    assert "__getattr__" not in vars(CountingInner)
    assert isinstance(CountingInner({}), Inner)


@pytest.mark.parametrize("kind", ["local", "mapping", "counting"])
def test_set_streamed_writes_the_pieces_atomically_and_keeps_the_old_object_on_an_error(tmp_path, kind):
    """``set_streamed`` (issue 24: a reference file written as it is generated): the pieces
    joined as the object; an exception from the pieces leaves the previous object whole and
    no temporary file (locally streamed into a file renamed into place; elsewhere joined)."""
    inner = {"local": lambda: LocalInner(str(tmp_path)), "mapping": lambda: MappingInner({}),
             "counting": lambda: CountingInner(LocalInner(str(tmp_path)))}[kind]()
    assert inner.set_streamed("d/k", (bytes([i]) * 1000 for i in range(5))) == 5000
    assert inner.get("d/k") == b"".join(bytes([i]) * 1000 for i in range(5))

    def failing():
        yield b"new bytes"
        raise RuntimeError("generator failed")

    with pytest.raises(RuntimeError, match="generator failed"):
        inner.set_streamed("d/k", failing())
    with pytest.raises(RuntimeError, match="generator failed"):
        inner.set_streamed("d/other", failing())
    assert inner.get("d/k") == b"".join(bytes([i]) * 1000 for i in range(5)) and not inner.exists("d/other")
    assert list(inner.list_prefix("")) == ["d/k"] and inner.temp_leftovers("d/") == []


def test_a_temporary_file_of_a_live_writer_is_no_leftover(tmp_path):
    """``remove_temp_leftovers(key)`` removed every temporary file of ``key``, also one a
    live process was about to rename: the upgrade journal's claim race then failed the
    racing run with an I/O error (exit 12) after it had swapped its claim in. A live
    writer's file is neither listed nor removed; a dead one's and this process's are."""
    import subprocess
    import sys

    from sharding_store.stores import TEMP_MARKER

    inner = LocalInner(tmp_path)
    inner.set("d/k", b"v")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {who: f"k{TEMP_MARKER}{pid}-abcd1234-0"
                 for who, pid in (("live", live.pid), ("dead", dead.pid), ("mine", os.getpid()))}
        for name in names.values():
            (tmp_path / "d" / name).write_bytes(b"half")
        assert inner.temp_leftovers("d/k") == sorted(f"d/{names[w]}" for w in ("dead", "mine"))
        assert inner.remove_temp_leftovers("d/k") == 2
        assert sorted(os.listdir(tmp_path / "d")) == sorted(["k", names["live"]])
    finally:
        live.kill()
        live.wait()
    assert inner.remove_temp_leftovers("d/k") == 1 and os.listdir(tmp_path / "d") == ["k"]
