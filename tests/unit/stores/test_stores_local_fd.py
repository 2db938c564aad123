"""Issue 25 items 3 and 4: a directory of a local store swapped for a link to another
directory, again and again by another process, never redirects a delete, a write or a read.

A racer process flips a directory inside the store between itself and a link to a directory
outside that holds files of the same names (``renameat2(RENAME_EXCHANGE)`` with a link beside
it: the real directory stays inside the store under another name meanwhile). Deletes
(``delete_prefix``, ``ShardingStore.erase_prefix``, ``migrate --overwrite``), writes
(``set``, ``migrate`` into DST) and reads (``get``, ``get_ranges``, ``read_into``) run
meanwhile, for a bounded time; afterwards nothing outside was deleted, created or replaced,
and what the store returned was its own data (or a clear error). On 198ea53 every one of
them reached outside (deletes by path, writes by path, reads by path after one check).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import example, given, settings

import sharding_store as ss
from sharding_store.errors import LinkOutsideStoreError, ObjectChangedError
from sharding_store.stores import LocalInner

pytestmark = [
    pytest.mark.slow,  # slow: forked racers swapping directories
    pytest.mark.skipif(not hasattr(os, "fork"), reason="the racer is a forked process"),
]

#: seconds each race runs at most (it stops at the first harm on an old tree)
RACE_SECONDS = 2.5
PRECIOUS = b"precious, not the store's"


_LIBC = ctypes.CDLL(None, use_errno=True)
_RENAMEAT2 = getattr(_LIBC, "renameat2", None)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange(a: str, b: str) -> None:
    """Swap two names atomically (``renameat2(RENAME_EXCHANGE)``): no moment without ``a``."""
    if _RENAMEAT2(_AT_FDCWD, a.encode(), _AT_FDCWD, b.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)


def _can_exchange(tmp: Path) -> bool:
    if _RENAMEAT2 is None:
        return False
    (tmp / "xa").mkdir()
    (tmp / "xb").symlink_to(tmp)
    try:
        exchange(str(tmp / "xa"), str(tmp / "xb"))
    except OSError:
        return False
    finally:
        for name in ("xa", "xb"):
            p = tmp / name
            p.unlink() if p.is_symlink() else p.rmdir()
    return True


@pytest.fixture(autouse=True)
def _needs_exchange(tmp_path: Path) -> None:
    if not _can_exchange(tmp_path):
        pytest.skip("needs renameat2(RENAME_EXCHANGE) on this filesystem")


def _flip(directory: str, outside: str, stop: object, seconds: float) -> None:
    """Swap ``directory`` with a link to ``outside`` (named ``directory.swap`` while the real
    directory is away, still inside the store) and back, atomically, until ``stop`` is set."""
    swap = directory + ".swap"
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        try:
            if not os.path.lexists(swap):
                os.symlink(outside, swap)
            exchange(directory, swap)
        except OSError:
            pass  # the directory is not there (deleted, not made yet): try again


def restore(directory: Path) -> None:
    """The real directory back at its name, the link gone."""
    swap = Path(str(directory) + ".swap")
    if directory.is_symlink() and swap.is_dir() and not swap.is_symlink():
        exchange(str(directory), str(swap))
    if swap.is_symlink():
        swap.unlink()


@contextmanager
def racing(directory: Path, outside: Path) -> Iterator[None]:
    """A racer process flipping ``directory`` while the block runs."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    racer = ctx.Process(target=_flip, args=(str(directory), str(outside), stop, 120))
    racer.start()
    try:
        yield
    finally:
        stop.set()
        racer.join(30)
        if racer.is_alive():
            racer.kill()
        restore(directory)


def outside_tree(path: Path, names: list[str]) -> dict[str, bytes]:
    """Files of the given relative names outside the store; returns what must stay."""
    for name in names:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(PRECIOUS + name.encode())
    return snapshot(path)


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def until(seconds: float, harmed: Callable[[], bool]) -> Iterator[int]:
    """Round numbers for at most ``seconds``, stopping early once ``harmed()``."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline and not harmed():
        yield i
        i += 1


# ---------------------------------------------------------------------- deletes (item 3)


NAMES = [f"k{i}" for i in range(300)]


@pytest.mark.parametrize("how", ["delete_prefix", "erase_prefix"])
def test_deletes_never_reach_outside_through_a_swapped_directory(tmp_path: Path, how: str) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    kept = outside_tree(outside, NAMES)
    x = store / "data" / "root" / "x"
    inner = LocalInner(str(store))
    erase = inner.delete_prefix if how == "delete_prefix" else ss.ShardingStore(str(store)).erase_prefix
    rounds = 0
    for _ in until(RACE_SECONDS, lambda: snapshot(outside) != kept):
        for name in NAMES:
            inner.set(f"data/root/x/{name}", b"ours")
        with racing(x, outside):
            try:
                erase("data/root/")
            except ObjectChangedError:
                pass  # a directory moved while being walked: left alone, said so
        rounds += 1
    assert snapshot(outside) == kept, f"files outside the store deleted or changed after {rounds} rounds"
    assert rounds >= 2


def _src(tmp_path: Path, n: int = 128) -> Path:
    """A draft store with one array of ``n // 8`` x 8 shards (a directory per shard row)."""
    src = tmp_path / "src"
    a = ss.create_draft_array(str(src), "a", shape=(n, 64), chunks=(4, 4), dtype="<u2", chunks_per_shard=(2, 2))
    a[...] = np.arange(n * 64, dtype="<u2").reshape(n, 64)
    return src


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharding_store.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_migrate_overwrite_never_deletes_outside_dst_through_a_swapped_directory(tmp_path: Path) -> None:
    src, dst, outside = _src(tmp_path), tmp_path / "dst", tmp_path / "outside"
    assert cli("migrate", src, dst).returncode == 0
    names = [str(p.relative_to(dst / "a" / "c")) for p in (dst / "a" / "c").rglob("*") if p.is_file()]
    kept = outside_tree(outside, names)
    codes = []
    for _ in until(4 * RACE_SECONDS, lambda: snapshot(outside) != kept):
        with racing(dst / "a" / "c", outside):
            got = cli("migrate", src, dst, "--overwrite")
        codes.append(got.returncode)
        # done, or refused naming the key (13: the link met on a fresh walk; 12: a directory
        # moved while a delete walked it), one line on stderr
        assert got.returncode in (0, 12, 13) and len(got.stderr.strip().splitlines()) <= 1, got.stderr
        if len(codes) == 2:
            break
    assert snapshot(outside) == kept, f"migrate --overwrite deleted files outside DST (exits {codes})"


# ---------------------------------------------------------------------- writes (item 4)


def test_writes_never_create_or_replace_outside_through_a_swapped_directory(tmp_path: Path) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    kept = outside_tree(outside, NAMES[:50])
    inner = LocalInner(str(store))
    inner.set("x/k0", b"first")
    written: dict[str, bytes] = {}
    with racing(store / "x", outside):
        for i in until(RACE_SECONDS, lambda: snapshot(outside) != kept):
            key, value = f"x/{NAMES[i % 50]}", b"ours %d" % i
            try:
                inner.set(key, value)
                written[key] = value
            except (OSError, LinkOutsideStoreError):
                pass
    assert snapshot(outside) == kept, "a write created or replaced a file outside the store"
    assert written
    for key, value in written.items():  # the directory is back: every write is where it belongs
        assert inner.get(key) == value


def test_migrate_never_writes_outside_dst_through_a_swapped_directory(tmp_path: Path) -> None:
    src, dst, outside = _src(tmp_path), tmp_path / "dst", tmp_path / "outside"
    names = [f"{i}/{j}" for i in range(16) for j in range(16)]  # every shard key below a/c/
    kept = outside_tree(outside, names)
    codes = []
    for _ in until(4 * RACE_SECONDS, lambda: snapshot(outside) != kept):
        with racing(dst / "a" / "c", outside):
            got = cli("migrate", src, dst, "--overwrite")
        codes.append(got.returncode)
        # done, or refused naming the key (13: the link met on a fresh walk; 12: a directory
        # moved while a delete walked it), one line on stderr
        assert got.returncode in (0, 12, 13) and len(got.stderr.strip().splitlines()) <= 1, got.stderr
        if len(codes) == 2:
            break
    assert snapshot(outside) == kept, f"migrate wrote outside DST (exits {codes})"
    if codes[-1] == 0:
        assert cli("verify", src, dst).returncode == 0


# ---------------------------------------------------------------------- reads (item 4)


@pytest.mark.parametrize("how", ["get", "get_ranges", "read_into"])
def test_reads_never_return_a_file_outside_through_a_swapped_directory(tmp_path: Path, how: str) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside_tree(outside, ["k"])
    ours = b"the store's own bytes"
    inner = LocalInner(str(store))
    inner.set("x/k", ours)
    read = {
        "get": lambda: inner.get("x/k"),
        "get_ranges": lambda: inner.get_ranges([("x/k", 0, None)])[0],
        "read_into": lambda: (lambda t: None if t is None else bytes(t.data))(inner.read_into("x/k", bytearray)),
    }[how]
    seen: set[bytes | None] = set()
    with racing(store / "x", outside):
        for _ in until(RACE_SECONDS, lambda: any(v not in (ours, None) for v in seen)):
            for _ in range(200):
                try:
                    seen.add(read())
                except (LinkOutsideStoreError, ObjectChangedError):
                    pass  # the directory was a link when first reached: refused naming the key
    assert seen <= {ours, None}, f"read another file's bytes: {seen - {ours, None}}"
    assert ours in seen


# ---------------------------------------------------------------------- a model of the walk

MODEL_NAMES = ["a", "b", "c"]


@st.composite
def store_cases(draw: st.DrawFn) -> tuple[list[tuple[str, str, str | None]], list[tuple[str, str]]]:
    """(tree entries: (path, kind, link target), operations: (op, key)) over a few names,
    with links inside and out of the store and ``.``/``..`` in the keys' directories."""
    entries, made = [], [""]
    for _ in range(draw(st.integers(1, 10))):
        parent = draw(st.sampled_from(made))
        rel = f"{parent}/{draw(st.sampled_from(MODEL_NAMES))}".lstrip("/")
        if rel in made:
            continue
        kind = draw(st.sampled_from(["dir", "dir", "file", "file", "link-in", "link-out", "link-up"]))
        entries.append((rel, kind, draw(st.sampled_from(made)) if kind == "link-in" else None))
        made.append(rel)
    dirs = st.lists(st.sampled_from(MODEL_NAMES + [".", ".."]), max_size=3)
    keys = st.builds(lambda d, n: "/".join([*d, n]), dirs, st.sampled_from(MODEL_NAMES))
    ops = st.lists(st.tuples(st.sampled_from(["get", "exists", "size", "set", "delete", "list"]), keys),
                   min_size=1, max_size=12)
    return entries, draw(ops)


def _build(root: str, outside: str, tmp: str, entries: list[tuple[str, str, str | None]]) -> None:
    for rel, kind, target in entries:
        path = os.path.join(root, rel)
        if not os.path.isdir(os.path.dirname(path)) or os.path.lexists(path):
            continue
        if kind == "dir":
            os.mkdir(path)
        elif kind == "file":
            Path(path).write_bytes(b"file " + rel.encode())
        elif kind == "link-in":
            os.symlink(os.path.join(root, target) if target else root, path)
        elif kind == "link-out":
            os.symlink(outside, path)
        else:  # a relative link up and out of the store, then back in
            os.symlink("../" * (rel.count("/") + 2) + os.path.basename(tmp) + "/store", path)


def _files(top: str) -> dict[str, bytes]:
    """Every regular file below ``top`` (links not followed), by real path."""
    out = {}
    for dirpath, _, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and os.path.isfile(path):
                out[os.path.realpath(path)] = Path(path).read_bytes()
    return out


def _way(root: str, real_root: str, key: str) -> str:
    """What the model says of the key's directories: ``out``, ``missing``, ``blocked`` (a
    file where a directory would be) or ``ok``."""
    parts = key.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        here = os.path.join(root, *parts[:i])
        real = os.path.realpath(here)
        if not (real == real_root or real.startswith(real_root + "/")):
            return "out"
        if not os.path.isdir(here):
            return "blocked" if os.path.exists(here) else "missing"
    return "ok"


def _model_read(root: str, real_root: str, model: dict[str, bytes], key: str) -> bytes | None | type:
    way = _way(root, real_root, key)
    if way == "out":
        return LinkOutsideStoreError
    if way != "ok":
        return None
    real = os.path.realpath(os.path.join(root, key))
    if not (real == real_root or real.startswith(real_root + "/")):
        return LinkOutsideStoreError
    return model.get(real) if os.path.isfile(real) else None


def _run_op(inner: LocalInner, root: str, real_root: str, model: dict[str, bytes], op: str, key: str) -> None:
    want = _model_read(root, real_root, model, key)
    if op in ("get", "exists", "size"):
        read = {"get": inner.get, "exists": inner.exists, "size": inner.size}[op]
        if want is LinkOutsideStoreError:
            with pytest.raises(LinkOutsideStoreError):
                read(key)
            return
        expect = {"get": want, "exists": want is not None, "size": None if want is None else len(want)}[op]
        assert read(key) == expect, (op, key)
        return
    if op == "list":
        for listed in inner.list_prefix(""):
            assert _model_read(root, real_root, model, listed) is not None, listed
        canonical = {p for p in model if p.startswith(real_root + "/") and TEMP not in p}
        assert canonical <= {os.path.realpath(os.path.join(root, k)) for k in inner.list_prefix("")}
        return
    way = _way(root, real_root, key)
    directory = os.path.realpath(os.path.join(root, os.path.dirname(key)))
    target = os.path.join(directory, os.path.basename(key))
    if way == "out":
        with pytest.raises(LinkOutsideStoreError):
            getattr(inner, op)(key, *([b"new"] if op == "set" else []))
        return
    if op == "set":
        if way == "missing" and not (directory == real_root or directory.startswith(real_root + "/")):
            with pytest.raises(LinkOutsideStoreError):  # ``b/../../a``: ``b`` made on the way, then above the root
                inner.set(key, b"new " + key.encode())
            return
        if way == "blocked":
            with pytest.raises(OSError):
                inner.set(key, b"new " + key.encode())
            return
        if os.path.isdir(target) and not os.path.islink(target):
            return  # a directory at the key: replacing it is refused (not modelled)
        try:
            inner.set(key, b"new " + key.encode())
        except IsADirectoryError:  # ``a/x/../x`` with ``a/x`` made on the way: the key is that directory
            assert way == "missing" and os.path.isdir(target), key
            return
        except NotADirectoryError:  # a link on the way leads below a file: nothing can be made there
            assert way == "missing" and _below_a_file(directory), key
            return
        model[target] = b"new " + key.encode()
    elif way == "ok":
        inner.delete(key)
        if not os.path.islink(target) and target in model:
            model.pop(target)


TEMP = ".sharding-store-tmp-"


def _below_a_file(path: str) -> bool:
    """Whether the nearest existing ancestor of ``path`` is no directory."""
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return not os.path.isdir(path)


@settings(max_examples=60, deadline=None)
@given(case=store_cases())
@example(case=([("a", "dir", None)], [("set", "b/../../a")]))  # found once: a missing dir made, then above the root
def test_the_store_agrees_with_a_dict_model_over_trees_with_links(case) -> None:
    """Reads, writes, deletes and listings through ``LocalInner`` against a dict of real
    paths to contents, decided by ``realpath`` on the tree as it is at each step: every
    answer agrees, refusals name links out, and afterwards every file on disk (the store's
    and the outside directory's) is exactly the model's: nothing written, replaced or
    deleted anywhere else."""
    entries, ops = case
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = os.path.join(tmp, "store"), os.path.join(tmp, "outside")
        os.makedirs(os.path.join(outside, "a"))
        os.makedirs(root)
        for name in MODEL_NAMES:
            Path(outside, name if name != "a" else "a/a").write_bytes(b"outside " + name.encode())
        _build(root, outside, tmp, entries)
        real_root = os.path.realpath(root)
        model = _files(tmp)
        inner = LocalInner(root)
        for op, key in ops:
            _run_op(inner, root, real_root, model, op, key)
        assert _files(tmp) == model
        inner.close()


# ---------------------------------------------------------------------- the descriptor cache


def test_the_descriptor_cache_is_bounded_closed_and_fresh_after_fork(tmp_path: Path) -> None:
    """At most ``DIR_FDS_MAX`` directory descriptors per store object, all closed by
    ``close()``; a forked child starts without its parent's and reads by its own."""
    from sharding_store.stores.local_fd import DIR_FDS_MAX

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    inner = LocalInner(str(tmp_path / "s"))
    for i in range(3 * DIR_FDS_MAX):
        inner.set(f"d{i}/e/k", b"%d" % i)
    assert len(inner._dirs._cache) <= DIR_FDS_MAX
    assert open_fds() - before <= DIR_FDS_MAX
    assert [inner.get(f"d{i}/e/k") for i in range(0, 3 * DIR_FDS_MAX, 17)] == [
        b"%d" % i for i in range(0, 3 * DIR_FDS_MAX, 17)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            ok = not inner._dirs._cache and inner.get("d5/e/k") == b"5"
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"1", "the child inherited the cache or could not read"
    inner.close()
    assert open_fds() == before


def test_dropping_a_store_object_closes_its_descriptors_at_once(tmp_path: Path) -> None:
    """No reference cycle: the last reference gone, the descriptors are closed without
    waiting for the garbage collector (stores are opened per call in many places)."""
    import gc

    before = len(os.listdir("/proc/self/fd"))
    gc.disable()
    try:
        for i in range(20):
            inner = LocalInner(str(tmp_path / "s"))
            inner.set(f"a{i}/b/k", b"v")
            del inner
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        gc.enable()
