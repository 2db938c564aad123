"""Defects found reviewing the stores layer (each test failed before its fix)."""

from __future__ import annotations

import os
import threading

import pytest

from sharding_store.errors import ObjectChangedError
from sharding_store.stores import LocalInner, as_inner
from sharding_store.stores import local as local_mod

# ---------------------------------------------------------------------- a FIFO in a hostile store


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
@pytest.mark.parametrize("method", ["get", "get_tails", "get_ranges", "read_into"])
def test_fifo_at_a_key_is_not_an_object_and_does_not_hang(tmp_path, method):
    """A named pipe where a chunk should be: opening it for reading blocked until a writer
    came (forever: `info`/`migrate` of such a store hung). It is no object: None."""
    os.mkfifo(tmp_path / "c0")
    inner = LocalInner(str(tmp_path))
    calls = {
        "get": lambda: inner.get("c0"),
        "get_tails": lambda: inner.get_tails([("c0", 16)])[0],
        "get_ranges": lambda: inner.get_ranges([("c0", 0, 4)])[0],
        "read_into": lambda: inner.read_into("c0", bytearray),
    }
    result: list = []
    t = threading.Thread(target=lambda: result.append(calls[method]()), daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # release the blocked open so the thread ends
        fd = os.open(tmp_path / "c0", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail(f"{method} of a FIFO blocked")
    assert result == [None]


# ---------------------------------------------------------------------- kernel copies


def test_copy_to_with_a_stale_size_copies_the_whole_object(tmp_path):
    """``size`` is a hint (from a listing); a source rewritten larger since must not be
    copied truncated (it was: the first ``size`` bytes, silently)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    src, dst = LocalInner(str(tmp_path / "src")), LocalInner(str(tmp_path / "dst"))
    src.set("k", b"0123456789")
    assert src.copy_to("k", dst, "k", size=4)
    assert dst.get("k") == b"0123456789"


def test_copy_to_fallback_copies_the_checked_version_never_a_link_out(tmp_path, monkeypatch):
    """When the kernel copy is refused, the portable fallback re-opened the source *by
    path*: a file replaced meanwhile (here by a link to a file outside the store) was
    copied instead of the version that was checked on the open descriptor."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET")
    src, dst = LocalInner(str(tmp_path / "src")), LocalInner(str(tmp_path / "dst"))
    src.set("k", b"old bytes")
    version = src.get_tails([("k", 4)])[0].version

    def refuse_after_swap(src_fd, dst_fd, size=None):
        path = tmp_path / "src" / "k"
        path.unlink()
        path.symlink_to(secret)
        return False  # "no kernel copy between these files"

    monkeypatch.setattr(local_mod, "copy_fd", refuse_after_swap)
    try:
        assert src.copy_to("k", dst, "k", version=version)
    except ObjectChangedError:
        return
    assert dst.get("k") == b"old bytes"


# ---------------------------------------------------------------------- hand-written wrappers


class _CoreWrapper:
    """A hand-written store wrapper: the core methods plus ``location`` and an atomic
    ``create_exclusive`` (delegated), but not every capability."""

    def __init__(self, inner):
        self.inner = inner
        self.exclusive_calls = 0

    def get(self, key):
        return self.inner.get(key)

    def get_ranges(self, requests):
        return self.inner.get_ranges(requests)

    def get_tails(self, requests):
        return [None if t is None else (t.data, t.size) for t in self.inner.get_tails(requests)]

    def set(self, key, value):
        self.inner.set(key, value)

    def delete(self, key):
        self.inner.delete(key)

    def delete_prefix(self, prefix):
        self.inner.delete_prefix(prefix)

    def list_prefix(self, prefix):
        return self.inner.list_prefix(prefix)

    def list_dir(self, prefix):
        return self.inner.list_dir(prefix)

    def exists(self, key):
        return self.inner.exists(key)

    def location(self):
        return self.inner.location()

    def create_exclusive(self, key, value):
        self.exclusive_calls += 1
        return self.inner.create_exclusive(key, value)


def test_wrapper_with_core_methods_keeps_its_location(tmp_path):
    """A wrapper completed with the generic capabilities reported an in-process identity
    instead of its own ``location()``: the same directory said "unrelated" (so migrate
    SRC into SRC through a wrapper was not refused)."""
    wrapper = _CoreWrapper(LocalInner(str(tmp_path)))
    inner = as_inner(wrapper)
    assert inner.location().relation(LocalInner(str(tmp_path)).location()) == "same"
    (tmp_path / "sub").mkdir()
    assert LocalInner(str(tmp_path / "sub")).location().relation(inner.location()) == "inside"


def test_wrapper_with_core_methods_keeps_its_atomic_create_exclusive(tmp_path):
    """The completed wrapper used the generic (racy) exists-then-set instead of the
    wrapper's own atomic ``create_exclusive``."""
    wrapper = _CoreWrapper(LocalInner(str(tmp_path)))
    inner = as_inner(wrapper)
    assert inner.create_exclusive("m", b"1") is True
    assert inner.create_exclusive("m", b"2") is False
    assert wrapper.exclusive_calls == 2
    assert inner.get("m") == b"1"


# ---------------------------------------------------------------------- exclusive create


@pytest.mark.parametrize("err", ["EPERM", "EOPNOTSUPP"])
def test_create_exclusive_on_a_filesystem_without_hard_links(tmp_path, monkeypatch, err):
    """``create_exclusive`` published with ``link()``, which filesystems without hard links
    (exFAT, some FUSE and network mounts) refuse: every migrate into such a destination
    failed at its claim. It falls back to an ``O_EXCL`` create of the key itself."""
    import errno

    def no_links(src, dst, *args, **kwargs):
        raise OSError(getattr(errno, err), os.strerror(getattr(errno, err)))

    monkeypatch.setattr(os, "link", no_links)
    inner = LocalInner(str(tmp_path))
    assert inner.create_exclusive("d/m", b"first") is True
    assert inner.create_exclusive("d/m", b"second") is False
    assert inner.get("d/m") == b"first"
    assert sorted(os.listdir(tmp_path / "d")) == ["m"]  # no temporary file left


# ---------------------------------------------------------------------- identity beyond realpath


@pytest.fixture
def bind_mount(tmp_path):
    """``tmp_path/alias`` a bind mount of ``tmp_path/real`` (skipped where mounts are not allowed)."""
    import shutil
    import subprocess

    real, alias = tmp_path / "real", tmp_path / "alias"
    real.mkdir()
    alias.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("needs root and mount(8)")
    if subprocess.run(["mount", "--bind", str(real), str(alias)], capture_output=True).returncode:
        pytest.skip("bind mounts not allowed here")
    try:
        yield real, alias
    finally:
        subprocess.run(["umount", str(alias)], capture_output=True)


def test_relation_sees_one_directory_under_two_mount_spellings(bind_mount):
    """``realpath`` cannot see through a bind mount (nor a case-insensitive filesystem,
    macOS's default: ``~/Data`` and ``~/data``): the two spellings were "unrelated", so
    ``migrate SRC ALIAS --overwrite`` emptied SRC. The relation also compares the
    directories' identities (device, inode)."""
    real, alias = bind_mount
    (real / "sub").mkdir()
    src = LocalInner(str(real)).location()
    assert src.relation(LocalInner(str(alias)).location()) == "same"
    assert LocalInner(str(alias / "sub")).location().relation(src) == "inside"
    assert LocalInner(str(alias / "new" / "dst")).location().relation(src) == "inside"  # not made yet
    assert src.relation(LocalInner(str(alias / "sub")).location()) == "contains"
    assert src.relation(LocalInner(str(real.parent / "elsewhere")).location()) is None


# ---------------------------------------------------------------------- zarr-python 3 LocalStore


@pytest.mark.parametrize("read_only", [False, True])
def test_zarr_localstore_never_follows_a_link_out(tmp_path, read_only):
    """A zarr-python 3 ``LocalStore`` given as the store read (and wrote) through links
    out of the root: a chunk linked to a file outside was served as data (and a write to
    it overwrote the outside file). Reads and writes go through the local store's checks."""
    import zarr

    from sharding_store.errors import LinkOutsideStoreError

    root = tmp_path / "store"
    (root / "c").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET")
    (root / "c" / "0").symlink_to(secret)
    (root / "ok").write_bytes(b"fine")
    inner = as_inner(zarr.storage.LocalStore(str(root), read_only=read_only))
    assert inner.get("ok") == b"fine"
    with pytest.raises(LinkOutsideStoreError):
        inner.get("c/0")
    with pytest.raises(LinkOutsideStoreError):
        inner.get_ranges([("c/0", 0, 3)])
    with pytest.raises(LinkOutsideStoreError):
        inner.get_tails([("c/0", 3)])
    if not read_only:
        inner.set("c/0", b"new")
        assert secret.read_bytes() == b"SECRET"
        assert inner.get("c/0") == b"new"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_is_not_listed_as_an_object(tmp_path):
    """A named pipe is no object (``exists`` False, reads None): listings agreed before
    that it was one (a listed key that then reads as missing: "gone before it was copied")."""
    os.mkfifo(tmp_path / "p")
    (tmp_path / "k").write_bytes(b"x")
    inner = LocalInner(str(tmp_path))
    assert not inner.exists("p")
    assert list(inner.list_prefix("")) == ["k"]
    assert list(inner.list_sized("")) == [("k", 1)]
    assert inner.list_dir("") == (["k"], [])


def test_tidy_works_when_the_store_is_spelled_through_a_link(tmp_path):
    """``tidy()`` did nothing when the store's own path was a symbolic link to its
    directory (``migrate --resume`` into such a DST left the killed run's temporary
    files and emptied directories behind)."""
    real = tmp_path / "real"
    (real / "a" / "empty").mkdir(parents=True)
    leftover = real / "a" / f"k{local_mod.TEMP_MARKER}123-abc-0"
    leftover.write_bytes(b"half")
    (tmp_path / "link").symlink_to(real)
    LocalInner(str(tmp_path / "link")).tidy()
    assert not leftover.exists()
    assert not (real / "a").exists()
    assert real.is_dir()
