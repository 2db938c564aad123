"""A local directory as a store: ``pread`` ranges, atomic writes, kernel copies, renames.

Every local spelling maps here (a path, ``~``, ``file://``, an fsspec ``LocalFileSystem``);
fsspec is never imported. What it guarantees:

* **Atomic writes.** An object is written under a temporary name next to it and renamed
  over it: readers see the old object or the new one, never half of one. The temporary
  names (:data:`TEMP_MARKER`) never appear in listings.
* **Consistent reads.** A tail read returns the object's version — ``(st_dev, st_ino,
  st_mtime_ns, st_size)`` from ``fstat`` of the very descriptor that was read — and range
  reads given that version compare it with ``fstat`` of *their* descriptor (which they
  need anyway for the object's size): an atomic rewrite replaced the inode, so the check
  fails and :class:`~sharding_store.errors.ObjectChangedError` is raised instead of
  returning bytes of another version. No extra system call.
* **Never out of the store through a link.** Reading, writing or copying a key whose file
  or any directory on its path resolves (through a symbolic link, or ``..``) outside the
  store's real directory raises :class:`~sharding_store.errors.LinkOutsideStoreError`
  naming the key. Links that stay inside keep working. Listings never descend into a link
  that leaves the store (they list the link itself, as a key that refuses to be read);
  deletes never descend into any symlinked directory: they remove the link, as ``rm -rf``
  does. Cost on the read path: the file is opened with ``O_NOFOLLOW`` (free; a link makes
  it fail, and only then is the link resolved and checked), and each directory is checked
  once per store object (one ``realpath``, then a dictionary look-up per read). A
  directory swapped for a link *after* it was checked is not noticed (an attacker racing
  this process; a store nobody writes to meanwhile is safe).
* **No empty directories left behind.** Deletes and moves remove the directories they
  empty, so listings show no ghost prefixes. A prune and a writer's ``makedirs`` take
  :data:`DIRECTORY_LOCK` (a child process gets a fresh one after ``fork``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import random
import stat
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from .. import _native
from ..errors import LinkOutsideStoreError, MigrationError, ObjectChangedError
from .base import BaseInner, ForkSafeLock, Inner, Location, Part, RangeRequest, Tail, Version

__all__ = [
    "CREATE_ATTEMPTS",
    "DIRECTORY_LOCK",
    "FILE_MODE",
    "TEMP_MARKER",
    "LocalInner",
    "atomic_local_file",
    "is_temp",
    "local_root",
    "write_all",
    "write_local_atomic",
]

#: ``O_NONBLOCK``: a named pipe at a key must not block the open (it is no object: its
#: ``fstat`` says so next); regular files ignore the flag
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_O_READ_NOFOLLOW = _O_READ | getattr(os, "O_NOFOLLOW", 0)
_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
#: directories checked per store object before the cache is emptied (bounds its memory)
_SAFE_DIRS_MAX = 1 << 16


def local_root(path: str) -> str:
    """A local path as an absolute path without a trailing slash (``~`` expanded, ``./``
    dropped), spelled as fsspec's ``LocalFileSystem`` spells it; links are *not* resolved
    (see :meth:`LocalInner.location` for the canonical, resolved form)."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif path.startswith("local://"):
        path = path[len("local://") :]
    if path.startswith("~"):
        path = os.path.expanduser(path)
    elif path.startswith("./"):
        path = path[2:]
    elif path == ".":
        path = ""
    if not path.startswith("/"):
        path = f"{os.getcwd()}/{path}"
    return path.rstrip("/") or "/"


#: A file modified less than this long ago may share its inode, mtime and size with a
#: later rewrite: inode numbers are reused at once (ext4: 89 distinct inodes in 20 000
#: rewrites of one key) and mtimes tick coarsely (about half of those rewrites shared one).
#: Versions of such files also carry a CRC32 of the object's tail, compared again by the
#: reads that check them (one more ``pread``); older files cannot be confused with a new
#: rewrite (unless its mtime is set back explicitly, as ``rsync -t``/``cp -p`` do).
RECENT_NS = 10 * 10**9
#: the tail of a whole-object read whose CRC a recent file's version carries (an index)
TAIL_CHECK = 1 << 16


def _version(st: os.stat_result, tail: Any = None, floor: int | None = None) -> Version:
    """The version of the file ``st`` describes: ``(st_dev, st_ino, st_mtime_ns, st_size)``,
    plus ``(len(tail), crc32(tail))`` when the file is recent (``tail``: its last bytes as
    read; ``floor``: ``time.time_ns() - RECENT_NS`` when the caller has it)."""
    mtime = st.st_mtime_ns
    if tail is not None and mtime > (time.time_ns() - RECENT_NS if floor is None else floor):
        return (st.st_dev, st.st_ino, mtime, st.st_size, len(tail), zlib.crc32(tail))
    return (st.st_dev, st.st_ino, mtime, st.st_size)


def _check(key: str, expected: Version, fd: int | None, st: os.stat_result | None) -> None:
    """Raise :class:`ObjectChangedError` unless the file open as ``fd`` is still ``expected``."""
    if (
        st is None
        or type(expected) is not tuple
        or expected[1] != st.st_ino
        or expected[2] != st.st_mtime_ns
        or expected[3] != st.st_size
        or expected[0] != st.st_dev
        or (len(expected) == 6 and zlib.crc32(os.pread(cast(int, fd), expected[4], st.st_size - expected[4])) != expected[5])
    ):
        raise ObjectChangedError(f"{key}: the object changed between two reads of it (read it again)", key=key)


def _is_real_dir(path: str) -> bool:
    """Whether ``path`` is a directory and not a link to one (``lstat``)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


class LocalInner(BaseInner):
    """A local directory below ``root`` (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = local_root(os.fspath(path))
        self._real_root: str | None = None
        self._safe_dirs: dict[str, bool] = {}
        self._below_root = self.root.rstrip("/") + "/"

    def __repr__(self) -> str:
        return f"LocalInner({self.root!r})"

    # ------------------------------------------------------------------ paths and links
    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root != "/" else f"/{key}"

    def real_root(self) -> str:
        """The store directory with every link resolved (cached once the directory exists)."""
        real = self._real_root
        if real is None:
            real = os.path.realpath(self.root)
            if os.path.isdir(real):
                self._real_root = real
        return real

    def _inside(self, real: str) -> bool:
        top = self.real_root()
        return real == top or real.startswith(top + "/") or top == "/"

    def _refuse(self, key: str, real: str) -> LinkOutsideStoreError:
        return LinkOutsideStoreError(
            f"{key}: resolves to {real}, outside the store {self.root} (through a symbolic link or '..'); "
            "refusing to follow it",
            key=key,
        )

    def _check_dir(self, directory: str, key: str) -> None:
        """Raise unless ``directory`` (a store path's parent) resolves inside the store; once
        checked, an existing directory is remembered."""
        if directory in self._safe_dirs or self._known_inside(directory):
            return
        real = os.path.realpath(directory)
        if not self._inside(real):
            raise self._refuse(key, real)
        if os.path.isdir(real):
            self._remember_dir(directory)

    def _known_inside(self, directory: str) -> bool:
        """Whether ``directory`` is a directory inside the store, decided component by
        component (then remembered): below the root, a real directory (``lstat``: not a
        link) inside a directory known to be inside is inside. One ``lstat`` per new
        directory instead of ``realpath``'s one per component (a store of one shard per
        directory has as many directories as shards). The root, and a ``.`` or ``..``
        component, by ``realpath``. False (never an error) for a link, a missing directory
        or one outside: :meth:`_check_dir` then decides by ``realpath``."""
        if directory in self._safe_dirs:
            return True
        parent, _, name = directory.rpartition("/")
        if name in ("", ".", "..") or not directory.startswith(self._below_root):
            real = os.path.realpath(directory)
            ok = self._inside(real) and os.path.isdir(real)
        else:
            ok = self._known_inside(parent or "/") and _is_real_dir(directory)
        if ok:
            self._remember_dir(directory)
        return ok

    def _remember_dir(self, directory: str) -> None:
        if len(self._safe_dirs) >= _SAFE_DIRS_MAX:
            self._safe_dirs.clear()
        self._safe_dirs[directory] = True

    def _checked_path(self, key: str) -> str:
        path = self._path(key)
        self._check_dir(path.rpartition("/")[0] or "/", key)
        return path

    def _open(self, key: str) -> int | None:
        """A read descriptor of the key's file (None when missing), never outside the store."""
        path = self._path(key)
        directory = path.rpartition("/")[0] or "/"
        if directory not in self._safe_dirs:
            self._check_dir(directory, key)
        try:
            return os.open(path, _O_READ_NOFOLLOW)
        except _MISSING:
            return None
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
        real = os.path.realpath(path)  # the file is a link: follow it only inside the store
        if not self._inside(real):
            raise self._refuse(key, real)
        try:
            return os.open(path, _O_READ)
        except _MISSING:
            return None

    def local_path(self, key: str) -> str | None:
        """The key's file path (it need not exist yet); raises
        :class:`~sharding_store.errors.LinkOutsideStoreError` when it leads out of the store."""
        path = self._checked_path(key)
        if os.path.islink(path):
            real = os.path.realpath(path)
            if not self._inside(real):
                raise self._refuse(key, real)
        return path

    # ------------------------------------------------------------------ reads
    def _pread(self, key: str, start: int, end: int | None, fd: int | None = None) -> Tail | None:
        """One ``pread`` of a local file: the bytes (clamped to the file), its size and version."""
        handle = self._open(key) if fd is None else fd
        if handle is None:
            return None
        try:
            st = os.fstat(handle)
            if not stat.S_ISREG(st.st_mode):
                return None  # a directory (or a device) is no object
            size = st.st_size
            lo = max(0, size + start) if start < 0 else min(start, size)
            hi = size if end is None else min(end, size)
            return _Tail((os.pread(handle, hi - lo, lo) if hi > lo else b"", size, None))
        finally:
            if fd is None:  # opened here
                os.close(handle)

    def get(self, key: str) -> bytes | None:
        got = self._pread(key, 0, None)
        return None if got is None else got.data

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        """Each range with one ``pread``; consecutive requests of one key share one open."""
        out: list[bytes | None] = []
        fd: int | None = None
        fd_key: str | None = None
        st: os.stat_result | None = None
        try:
            for i, (key, start, end) in enumerate(requests):
                if key != fd_key:
                    if fd is not None:
                        os.close(fd)
                        fd = None
                    fd, fd_key = self._open(key), key
                    st = None if fd is None else os.fstat(fd)
                    if st is not None and not stat.S_ISREG(st.st_mode):
                        st = None  # a directory is no object
                if versions is not None and versions[i] is not None:
                    if i == 0 or versions[i] is not versions[i - 1] or requests[i - 1][0] != key:
                        _check(key, versions[i], fd, st)
                if fd is None or st is None:
                    out.append(None)
                    continue
                size = st.st_size
                lo = max(0, size + start) if start < 0 else min(start, size)
                hi = size if end is None else min(end, size)
                out.append(os.pread(fd, hi - lo, lo) if hi > lo else b"")
        finally:
            if fd is not None:
                os.close(fd)
        return out

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        """The last bytes of each object, one ``pread`` each, with its size and version."""
        out: list[Tail | None] = []
        floor = time.time_ns() - RECENT_NS
        for key, n in requests:
            fd = self._open(key)
            if fd is None:
                out.append(None)
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    out.append(None)
                    continue
                size = st.st_size
                lo = max(0, size - n)
                data = os.pread(fd, size - lo, lo) if size > lo else b""
                if st.st_mtime_ns > floor:
                    version = _version(st, data, floor)
                else:
                    version = (st.st_dev, st.st_ino, st.st_mtime_ns, size)
                out.append(_Tail((data, size, version)))
            finally:
                os.close(fd)
        return out

    def read_into(self, key: str, alloc: Callable[[int], Any]) -> Tail | None:
        """A whole object read into a caller-owned buffer that is reused between objects
        (reading many objects then touches no fresh memory): open, ``fstat`` (the size and
        the version), one ``preadv``, close. ``Tail.data`` is a prefix of the buffer."""
        fd = self._open(key)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            buf = alloc(st.st_size)
            got = _read_full(fd, buf, st.st_size)
            if st.st_mtime_ns > time.time_ns() - RECENT_NS:
                version = _version(st, memoryview(buf).cast("B")[max(0, got - TAIL_CHECK) : got], 0)
            else:
                version = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            return _Tail((buf[:got], got, version))
        finally:
            os.close(fd)

    def _stat(self, key: str) -> os.stat_result | None:
        """``stat`` of the key's file (None when missing), never through a link out of the store."""
        path = self._path(key)
        directory = path.rpartition("/")[0] or "/"
        if directory not in self._safe_dirs:
            self._check_dir(directory, key)
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(path)
                if not self._inside(real):
                    raise self._refuse(key, real)
                st = os.stat(path)
        except _MISSING:
            return None
        return st if stat.S_ISREG(st.st_mode) else None

    def exists(self, key: str) -> bool:
        return self._stat(key) is not None

    def size(self, key: str) -> int | None:
        st = self._stat(key)
        return None if st is None else st.st_size

    # ------------------------------------------------------------------ writes
    def set(self, key: str, value: bytes) -> None:
        write_local_atomic(self._checked_path(key), value)

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """Written whole under a temporary name, then published with ``link()``, which fails
        when the key exists: atomic against any other process, and never half-written."""
        path = self._checked_path(key)
        fd, tmp = _open_new(path)
        try:
            try:
                write_all(fd, value)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
                return _create_excl_in_place(path, value)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """Replace the file only while it holds ``expected`` (see :meth:`BaseInner.put_if_unchanged`).

        POSIX has no compare-and-rename. Here the new bytes are written to a temporary
        file, the current file is compared, and the two are swapped with one
        ``renameat2(RENAME_EXCHANGE)``; the file swapped out is then compared again, so a
        writer that replaced the document (by rename, as atomic writers do) at any moment
        before the swap is caught and its version swapped back: nothing it wrote is lost.
        Remaining windows: a third writer replacing the document in the microseconds
        between the two swaps (its version is then kept beside the key as
        ``<key>.sharding-store-conflict-*`` and :class:`ObjectChangedError` names it), and a
        writer that rewrites the file *in place* (no rename) after the second compare.
        Where the exchange is not supported (not Linux, some filesystems) the compare is
        followed by ``os.replace``: a writer in that window is overwritten.
        """
        path = self._checked_path(key)
        if expected is None:
            return (not self.exists(key)) if value is None else self.create_exclusive(key, value)
        if value is None:
            return self._delete_if(key, path, expected)
        if self.get(key) != expected:
            return False
        fd, tmp = _open_new(path)
        keep = False
        try:
            try:
                write_all(fd, value)
                ours = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            swapped = _exchange(tmp, path)
            if swapped is None:  # no atomic exchange here: compare, then replace (the window above)
                if self.get(key) != expected:
                    return False
                os.replace(tmp, path)
                return True
            if not swapped:
                return False  # the document vanished since it was compared
            if self.get(_sibling(key, tmp)) == expected:
                return True  # the finally removes the original, now at the temporary name
            _exchange(tmp, path)  # another writer's version: back at the key
            if os.lstat(tmp).st_ino != ours:
                keep = True
                raise self._conflict(key, path, tmp)
            return False
        finally:
            if not keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _delete_if(self, key: str, path: str, expected: bytes) -> bool:
        """The delete of :meth:`put_if_unchanged`: the file is renamed aside (atomically:
        whatever is at the key then), compared, and put back with ``link()`` (which
        never replaces a file created meanwhile) when it is not ``expected``."""
        if self.get(key) != expected:
            return False
        aside = _temp_name(path)
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if self.get(_sibling(key, aside)) == expected:
            os.unlink(aside)
            self._prune(path.rpartition("/")[0])
            return True
        try:
            os.link(aside, path, follow_symlinks=False)
        except FileExistsError:
            raise self._conflict(key, path, aside) from None
        os.unlink(aside)
        return False

    def _conflict(self, key: str, path: str, tmp: str) -> ObjectChangedError:
        """Two other writers raced one compare-and-swap: the version not at the key is kept."""
        kept = f"{path}.sharding-store-conflict-{os.getpid()}-{_TOKEN}-{next(_COUNTER)}"
        os.rename(tmp, kept)
        return ObjectChangedError(f"{key}: replaced by two other writers while this write was checked; one "
                                  f"version is at the key, the other kept as {kept}", key=key)

    def temp_leftovers(self, key: str) -> list[str]:
        """Keys of temporary files next to ``key`` (one listing of its directory); for a
        ``key`` ending in ``/``, of every temporary file below that prefix (a walk that
        never follows a link)."""
        if key.endswith("/"):
            return self._temps_below(key)
        path = self._checked_path(key)
        directory, _, name = path.rpartition("/")
        lead = key.rpartition("/")[0]
        try:
            with os.scandir(directory or "/") as it:
                names = sorted(e.name for e in it if e.name.startswith(name + TEMP_MARKER))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [f"{lead}/{n}" if lead else n for n in names]

    def _temps_below(self, prefix: str) -> list[str]:
        top = self._path(prefix.rstrip("/"))
        if os.path.islink(top) or not self._inside(os.path.realpath(top)):
            return []
        found = []
        for dirpath, _, files in os.walk(top):
            lead = prefix + os.path.relpath(dirpath, top).replace(os.sep, "/") + "/"
            lead = prefix if lead == prefix + "./" else lead
            found += [lead + name for name in files if TEMP_MARKER in name]
        return sorted(found)

    def remove_temp_leftovers(self, key: str) -> int:
        found = self.temp_leftovers(key)
        for leftover in found:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(leftover))
        return len(found)

    def delete(self, key: str) -> None:
        path = self._checked_path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):  # nothing there (or a file where a directory would be)
            pass
        except (IsADirectoryError, PermissionError):
            if not os.path.isdir(path):  # EPERM: unlink of a directory on some systems
                raise
            return
        self._prune(path.rpartition("/")[0])

    def delete_prefix(self, prefix: str) -> None:
        """Every object whose key starts with ``prefix``. Links are removed, never followed
        (a linked directory keeps its contents); temporary files of writes in progress are
        left alone; directories emptied are removed."""
        base = prefix.rpartition("/")[0]
        top = self._path(base) if base else self.root
        if base and (os.path.islink(top) or not self._inside(os.path.realpath(top))):
            # a link (or a path through one out of the store): never descended into; the
            # link itself goes when the prefix covers it
            if os.path.islink(top) and (base + "/").startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(top)
                self._prune(top.rpartition("/")[0])
            return
        _delete_below(top, base + "/" if base else "", prefix)
        if base:
            self._prune(top)

    def _prune(self, directory: str) -> None:
        """Remove the empty directories from ``directory`` up to (not including) the root."""
        root = self.root
        with DIRECTORY_LOCK:
            while directory and directory != root and directory.startswith(root + "/"):
                try:
                    os.rmdir(directory)
                except OSError:  # not empty (or already gone, or raced by a writer): stop
                    return
                directory = directory.rpartition("/")[0]

    def move(self, key: str, dst_key: str) -> None:
        """``os.replace`` (atomic, no copy); the source's emptied directories are removed. A
        missing source whose destination exists is a move already done."""
        src, dst = self._checked_path(key), self._checked_path(dst_key)
        directory = dst.rpartition("/")[0]
        for attempt in range(CREATE_ATTEMPTS):
            try:
                os.replace(src, dst)
                break
            except FileNotFoundError:
                if not os.path.lexists(src):
                    if os.path.lexists(dst):
                        return
                    raise
                if attempt == CREATE_ATTEMPTS - 1:
                    raise
                with DIRECTORY_LOCK, contextlib.suppress(FileNotFoundError, FileExistsError):
                    os.makedirs(directory, exist_ok=True)
        self._prune(src.rpartition("/")[0])

    def tidy(self, prefix: str = "", *, keep_top: bool = True) -> None:
        base = prefix.rstrip("/")
        top = self._path(base) if base else self.root
        if base and (os.path.islink(top) or not self._inside(os.path.realpath(top))):
            return  # the store's own directory may be spelled through a link; nothing below it
        for dirpath, _, files in os.walk(top, topdown=False):
            for name in files:
                if TEMP_MARKER in name:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(dirpath, name))
            if dirpath == self.root or (dirpath == top and keep_top):
                continue
            with DIRECTORY_LOCK, contextlib.suppress(OSError):
                os.rmdir(dirpath)  # not empty: kept

    # ------------------------------------------------------------------ copies
    def can_copy_to(self, dst: Inner, *, append: bool = False) -> bool:
        return dst.location().kind == "file"

    def copy_to(
        self, key: str, dst: Inner, dst_key: str, *, size: int | None = None, append: bytes = b"",
        version: Version | None = None,
    ) -> bool:
        """A kernel copy (``copy_file_range``) to a temporary name at the destination, then
        ``os.replace``: one open of each file, no byte through this process."""
        dst_path = dst.local_path(dst_key)
        if dst_path is None:
            return False
        fd = self._open(key)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, f"{key}: not found", self._path(key))
        try:
            # the size of the very file open (``size`` may be stale: a source rewritten
            # larger since it was listed must not be copied truncated)
            st = os.fstat(fd)
            regular = stat.S_ISREG(st.st_mode)
            if version is not None:
                _check(key, version, fd, st if regular else None)
            if not regular:
                raise FileNotFoundError(errno.ENOENT, f"{key}: not a file", self._path(key))
            copy_fd_to(fd, dst_path, append, st.st_size)
        finally:
            os.close(fd)
        return True

    def can_compose_to(self, dst: Inner) -> bool:
        return dst.location().kind == "file"

    def compose(
        self, key: str, parts: Sequence[Part], *, into: Inner | None = None,
        versions: Mapping[str, Version | None] | None = None,
    ) -> int:
        """Kernel copies (``copy_file_range``, else ``sendfile``, else ``pread``/``write``) of
        each range from its source file into a temporary file at the destination, literal
        parts written, then ``os.replace``: no payload byte through this process.

        Each source file is opened once (never through a link out of this store), its
        version checked against ``versions`` on that descriptor (``fstat``) and its
        ``fstat`` compared again after the copies, before the new object is published: a
        source replaced or rewritten meanwhile raises :class:`ObjectChangedError` and
        nothing is written. The destination path is ``into``'s own, checked the same way
        (:meth:`local_path`). Another kind of destination: the generic way."""
        dst = self if into is None else into
        dst_path = dst.local_path(key)
        if dst_path is None:
            return super().compose(key, parts, into=into, versions=versions)
        fds: dict[str, tuple[int, os.stat_result]] = {}
        try:
            for part in parts:
                if isinstance(part, (bytes, bytearray, memoryview)) or part[0] in fds:
                    continue
                src_key, start, end = part
                fd = self._open(src_key)
                if fd is None:
                    raise ObjectChangedError(f"{src_key}: gone since its ranges were computed", key=src_key)
                fds[src_key] = (fd, os.fstat(fd))
                st = fds[src_key][1]
                expected = None if versions is None else versions.get(src_key)
                if expected is not None:
                    _check(src_key, expected, fd, st if stat.S_ISREG(st.st_mode) else None)
                elif not stat.S_ISREG(st.st_mode):
                    raise ObjectChangedError(f"{src_key}: not a file any more", key=src_key)
            mode = [_KERNEL_COPY]
            written = 0
            with atomic_local_file(dst_path) as (out, _):
                for part in parts:
                    if isinstance(part, (bytes, bytearray, memoryview)):
                        write_all(out, part)
                        written += len(part)
                        continue
                    src_key, start, end = part
                    fd, st = fds[src_key]
                    if start < 0 or end < start:
                        raise ValueError(f"{src_key}: compose range [{start}, {end}) is not a forward range of the object")
                    if end > st.st_size:
                        raise ObjectChangedError(
                            f"{src_key}: shorter than {end} bytes since its ranges were computed", key=src_key
                        )
                    _copy_range(src_key, fd, out, start, end - start, mode)
                    written += end - start
                for src_key, (fd, st) in fds.items():  # nothing rewrote a source in place meanwhile
                    now = os.fstat(fd)
                    if (now.st_ino, now.st_mtime_ns, now.st_size) != (st.st_ino, st.st_mtime_ns, st.st_size):
                        raise ObjectChangedError(f"{src_key}: changed while being copied", key=src_key)
        finally:
            for fd, _ in fds.values():
                os.close(fd)
        return written

    # ------------------------------------------------------------------ listings
    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (k for k, _ in self._walk(prefix, sizes=False))

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """Sorted ``(key, size)`` under ``prefix``, lazily (one ``stat`` per file)."""
        return self._walk(prefix, sizes=True)

    def _walk(self, prefix: str, *, sizes: bool) -> Iterator[tuple[str, int | None]]:
        base = prefix.rpartition("/")[0]
        top = self._path(base) if base else self.root
        real = os.path.realpath(top) if base else self.real_root()
        if base and not self._inside(real):
            if os.path.lexists(top) and base.startswith(prefix):
                yield base, None  # a link out of the store: listed, refused when read
            return
        yield from self._walk_dir(top, real, base + "/" if base else "", prefix, sizes)

    def _walk_dir(
        self, path: str, real: str, lead: str, prefix: str, sizes: bool
    ) -> Iterator[tuple[str, int | None]]:
        """Keys in sorted order: entries sorted by name, a directory's as ``name/`` (all its
        keys start so). ``real``: ``path`` resolved. A link that stays inside the store is
        followed (unless it leads to a directory being listed: a cycle, skipped); a link out
        of it is listed as a key of its own, which refuses to be read."""
        try:
            it = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        entries = []
        with it:
            for e in it:
                if TEMP_MARKER in e.name:
                    continue
                try:
                    is_dir, sub_real, outside = e.is_dir(), f"{real}/{e.name}", False
                    if e.is_symlink():  # only links cost a realpath
                        sub_real = os.path.realpath(e.path)
                        if not self._inside(sub_real):
                            is_dir, outside = False, True
                        elif is_dir and (real == sub_real or real.startswith(sub_real + "/")):
                            continue  # a link to a directory above it
                    if not (is_dir or outside or e.is_file()):
                        continue  # a pipe, socket or device (or a dangling link) is no object
                except OSError:
                    continue
                entries.append(((e.name + "/") if is_dir else e.name, e, is_dir, sub_real, outside))
        entries.sort(key=lambda t: t[0])
        for _, e, is_dir, sub_real, outside in entries:
            key = lead + e.name
            if is_dir:
                sub = key + "/"
                if sub.startswith(prefix) or prefix.startswith(sub):
                    yield from self._walk_dir(e.path, sub_real, sub, prefix, sizes)
            elif key.startswith(prefix):
                if outside or not sizes:
                    yield key, None
                    continue
                try:
                    yield key, e.stat().st_size
                except FileNotFoundError:  # removed while we listed it
                    continue

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        if prefix and not prefix.endswith("/"):
            return super().list_dir(prefix)
        base = prefix.rstrip("/")
        path = self._path(base) if base else self.root
        here = os.path.realpath(path)
        if base and not self._inside(here):
            return [], []
        keys: list[str] = []
        prefixes: list[str] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if TEMP_MARKER in e.name:
                        continue
                    try:
                        is_dir = e.is_dir()
                        if is_dir and e.is_symlink():
                            target = os.path.realpath(e.path)
                            if not self._inside(target):
                                is_dir = False  # a link out of the store: a key that refuses to be read
                            elif here is None or here == target or here.startswith(target + "/"):
                                continue  # a link to a directory above it: a cycle, not listed
                        if not (is_dir or e.is_file()) and (
                            not e.is_symlink() or self._inside(os.path.realpath(e.path))
                        ):
                            continue  # a pipe, socket or device (or a dangling link) is no object
                    except OSError:
                        continue
                    (prefixes if is_dir else keys).append(prefix + e.name + ("/" if is_dir else ""))
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        return sorted(keys), sorted(prefixes)

    # ------------------------------------------------------------------ identity
    def location(self) -> Location:
        return Location("file", "", self.real_root())

    def describe(self) -> str:
        return self.root


def _delete_below(path: str, lead: str, prefix: str) -> None:
    """Unlink every file and link below directory ``path`` whose key starts with ``prefix``
    (never following a link), then remove the directories that became empty."""
    try:
        it = os.scandir(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    with it:
        entries = list(it)
    for e in entries:
        if TEMP_MARKER in e.name:
            continue
        key = lead + e.name
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir:
            sub = key + "/"
            if sub.startswith(prefix) or prefix.startswith(sub):
                _delete_below(e.path, sub, prefix)
                if sub.startswith(prefix):
                    with DIRECTORY_LOCK, contextlib.suppress(OSError):
                        os.rmdir(e.path)
        elif key.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)


#: what ``link()`` says on filesystems without hard links (exFAT, some FUSE and network mounts)
_NO_HARD_LINKS = frozenset(
    getattr(errno, name) for name in ("EPERM", "EOPNOTSUPP", "ENOTSUP", "ENOSYS") if hasattr(errno, name)
)


def _create_excl_in_place(path: str, value: bytes) -> bool:
    """``create_exclusive`` where ``link()`` is refused: ``O_EXCL`` on the key itself (still
    atomic against other creators; a reader may see it before it is whole)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except FileExistsError:
        return False
    try:
        write_all(fd, value)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    os.close(fd)
    return True


# ---------------------------------------------------------------------- atomic writes

TEMP_MARKER = ".sharding-store-tmp-"
#: temporary names: pid, a per-process random token and a counter (O_EXCL catches clashes)
_TOKEN = uuid.uuid4().hex[:8]
_COUNTER = itertools.count()


def _temp_name(path: str) -> str:
    """A fresh temporary name next to ``path`` (pid, per-process token, counter)."""
    return f"{path}{TEMP_MARKER}{os.getpid()}-{_TOKEN}-{next(_COUNTER)}"


def _sibling(key: str, path: str) -> str:
    """The key of ``path``, a file in the directory of ``key``."""
    lead = key.rpartition("/")[0]
    name = path.rpartition("/")[2]
    return f"{lead}/{name}" if lead else name


_NO_EXCHANGE = frozenset(getattr(errno, n) for n in ("EINVAL", "ENOSYS", "EOPNOTSUPP", "ENOTSUP") if hasattr(errno, n))


def _exchange(a: str, b: str) -> bool | None:
    """Swap the files at ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``):
    True; False when one of them is missing; None when this system or filesystem cannot."""
    err = _native.rename_exchange(os.fsencode(a), os.fsencode(b))
    if err is None:
        return None
    if err == 0:
        return True
    if err == errno.ENOENT:
        return False
    if err in _NO_EXCHANGE:
        return None
    raise OSError(err, os.strerror(err), b)


def _Tail(fields: tuple[Any, int | None, Version | None]) -> Tail:
    """``Tail(*fields)`` without the Python-level ``__new__`` (on the per-read path)."""
    return tuple.__new__(Tail, fields)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: the mode of published objects: what a plain open() gives (0o666 minus the umask)
FILE_MODE = 0o666 & ~_read_umask()


def is_temp(key: str) -> bool:
    """A temporary name of an unfinished local write (never listed)."""
    return TEMP_MARKER in key.rpartition("/")[2]


#: Serialises, within this process, pruning empty directories with making a directory
#: for a new file. Without it a delete in another thread can remove the directory
#: between a writer's ``makedirs`` and its ``open``, again and again: with three threads
#: churning one directory, 1 write in 15 000 needed more than 20 tries (the worst, 164).
#: Another process still can; the writer then backs off and tries again, up to
#: :data:`CREATE_ATTEMPTS` times (three processes churning: at most 10 tries in 45 000).
DIRECTORY_LOCK = ForkSafeLock()

#: how many times a write re-makes a directory that other processes keep pruning
CREATE_ATTEMPTS = 64
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _open_new(path: str) -> tuple[int, str]:
    """``(fd, name)`` of a new temporary file next to ``path``, making its directory if missing.

    The file is tried first (the directory usually exists). Only when it is missing is
    the directory made, under :data:`DIRECTORY_LOCK`, so that no prune in this process
    can remove it before the new file is in it.
    """
    directory = os.path.dirname(path) or "."
    for attempt in range(CREATE_ATTEMPTS):
        tmp = _temp_name(path)
        try:
            if attempt == 0:
                return os.open(tmp, _O_NEW, 0o666), tmp
            with DIRECTORY_LOCK:
                # makedirs raises either error when another process prunes meanwhile; a
                # parent that is a file makes the open below raise NotADirectoryError
                with contextlib.suppress(FileNotFoundError, FileExistsError):
                    os.makedirs(directory, exist_ok=True)
                return os.open(tmp, _O_NEW, 0o666), tmp
        except FileNotFoundError:
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            if attempt:  # another process pruned it: let it finish, out of step with it
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
        except FileExistsError:  # another process's name (same pid on another host)
            if attempt == CREATE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def atomic_local_file(path: str) -> Iterator[tuple[int, str]]:
    """``(fd, temp path)`` of a new file next to ``path``, renamed over it on success.

    Readers see the old object or the new one, never half of one; on any error the
    temporary file is removed. A directory pruned by a concurrent delete is made again
    (see :func:`_open_new`). The file gets the mode a plain ``open()`` would give, not
    mkstemp's 0600.
    """
    fd, tmp = _open_new(path)
    try:
        try:
            yield fd, tmp
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


#: the most one read() returns on Linux (MAX_RW_COUNT); any shorter read of a file means its end
_MAX_READ = 0x7FFFF000


def _read_full(fd: int, buf: Any, size: int | None = None) -> int:
    """Read a file from its start into ``buf`` until the buffer is full (or ``size`` bytes
    are read) or the file ends."""
    got, view = 0, memoryview(buf).cast("B")
    if size is not None:
        view = view[:size]
    while got < len(view):
        n = os.preadv(fd, [view[got:]], got)
        got += n
        if n < min(len(view) - got + n, _MAX_READ):
            break
    return got


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_local_atomic(path: str, value: bytes) -> None:
    """Write ``path`` atomically (see :func:`atomic_local_file`)."""
    with atomic_local_file(path) as (fd, _):
        write_all(fd, value)


# ---------------------------------------------------------------------- kernel copies


def copy_fd_to(src_fd: int, dst_path: str, append: bytes = b"", size: int | None = None) -> None:
    """The whole file open as ``src_fd`` (plus ``append``) written atomically to
    ``dst_path``: ``copy_file_range`` where the kernel can, else ``pread``/``write`` from
    that same descriptor (never the path again: it may name another file by now)."""
    with atomic_local_file(dst_path) as (fd, _):
        if not copy_fd(src_fd, fd, size):  # no kernel copy between these files: the portable way
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            offset = 0
            while size is None or offset < size:
                block = os.pread(src_fd, 1 << 20 if size is None else min(1 << 20, size - offset), offset)
                if not block:
                    if size is not None:  # the file shrank after its size was read: never publish half
                        raise MigrationError(f"source object changed while being copied ({offset} of {size} bytes)")
                    break
                write_all(fd, block)
                offset += len(block)
        write_all(fd, append)


#: what ``copy_file_range``/``sendfile`` say when they cannot copy between these files
#: (another filesystem, no support in the kernel or the filesystem): the next way is tried
_NO_KERNEL_COPY_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EXDEV", "ENOSYS", "EINVAL", "EOPNOTSUPP", "ENOTSUP", "EPERM", "EBADF",
                                      "ENOTSOCK") if hasattr(errno, name)
)
_KERNEL_COPY = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile" if hasattr(os, "sendfile") else "read"


def _copy_range(key: str, src_fd: int, dst_fd: int, offset: int, count: int, mode: list[str]) -> None:
    """Append ``count`` bytes of ``src_fd`` from ``offset`` at ``dst_fd``'s position: with
    ``copy_file_range``, else ``sendfile``, else ``pread``/``write``. ``mode[0]`` is the way
    that worked so far (a refusal moves it to the next way, for this and later ranges; the
    refused call wrote nothing; so does one that copies nothing, which some filesystems answer
    instead of refusing). A source that ends early raises :class:`ObjectChangedError`."""
    while count > 0:
        way = mode[0]
        try:
            if way == "copy_file_range":
                n = os.copy_file_range(src_fd, dst_fd, count, offset)
            elif way == "sendfile":
                n = os.sendfile(dst_fd, src_fd, offset, count)
            else:
                block = os.pread(src_fd, min(count, 1 << 20), offset)
                write_all(dst_fd, block)
                n = len(block)
        except OSError as e:
            if way != "read" and e.errno in _NO_KERNEL_COPY_ERRNOS:
                mode[0] = "sendfile" if way == "copy_file_range" and hasattr(os, "sendfile") else "read"
                continue
            raise
        if n == 0:
            if way != "read":  # some filesystems answer 0 instead of refusing: the plain way tells
                mode[0] = "sendfile" if way == "copy_file_range" and hasattr(os, "sendfile") else "read"
                continue
            raise ObjectChangedError(f"{key}: ends before byte {offset + count} (changed while being copied)", key=key)
        offset += n
        count -= n


def copy_fd(src_fd: int, dst_fd: int, size: int | None = None) -> bool:
    """``copy_file_range`` the whole of ``src_fd`` (from offset 0) to ``dst_fd``; False when
    the kernel or the filesystems refuse it before anything was copied (the caller copies
    another way). With ``size`` known, no final call to find the end."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return False
    done = 0
    while size is None or done < size:
        try:
            n = copy(src_fd, dst_fd, 1 << 30 if size is None else size - done, done)
        except OSError as e:
            if done == 0 and e.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF):
                return False
            raise
        if n == 0:
            if size is not None:  # the file shrank after its size was read: never publish half
                raise MigrationError(f"source object changed while being copied ({done} of {size} bytes)")
            break
        done += n
    return True
