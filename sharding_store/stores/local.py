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
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from ..codec import _native
from ..errors import LinkOutsideStoreError, MigrationError, ObjectChangedError
from .base import (
    BaseInner,
    ChunkRef,
    ComposePlan,
    ForkSafeLock,
    Inner,
    Location,
    Part,
    RangeRequest,
    Tail,
    Version,
)
from .local_fd import MAX_LINKS, O_DIR, O_DIR_NOFOLLOW, DirFd, DirFds, post_order, refusal, scan, scan_sized

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
#: final key components that name a directory
_DIR_NAMES = frozenset(("", ".", ".."))
_T = TypeVar("_T")


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
#: vouched references (:meth:`LocalInner._scanned`) kept at most: more are tails nobody referred to
VOUCHED_MAX = 1 << 12


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


class LocalInner(BaseInner):
    """A local directory below ``root`` (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = local_root(os.fspath(path))
        self._real_root: str | None = None
        self._dirs = DirFds(self.root)
        self._real_dirs: dict[str, str] = {}  # directory key -> its resolved path (reference_to)
        #: key -> (version, resolved path) of files whose tail :meth:`_scanned` read and whose
        #: resolved path it found to be that very file (taken by :meth:`reference_to`)
        self._vouched: dict[str, tuple[Version, str]] = {}

    def __repr__(self) -> str:
        return f"LocalInner({self.root!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalInner, (self.root,))  # the descriptors stay with this process

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._dirs.close()

    def close(self) -> None:
        """Close the cached directory descriptors (opened again when needed)."""
        self._dirs.close()
        self._vouched.clear()

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
        return refusal(self.root, key, real)

    def _at(self, key: str, create: bool = False) -> tuple[DirFd, str, bool] | None:
        """``(directory descriptor, name, through a link)`` of the key (the descriptor held
        until released); None when its directory is missing."""
        directory, _, name = key.rpartition("/")
        if name in _DIR_NAMES:  # names a directory (``a/..``): no object, but never outside either
            got = self._dirs.resolve(key, key)
            if got is not None:
                self._dirs.release(got[0])
            if create:
                raise IsADirectoryError(errno.EISDIR, f"{key}: names a directory, not an object", key)
            return None
        got = self._dirs.resolve(directory, key, create=create)
        return None if got is None else (got[0], name, got[1])

    def _through_link(self, d: DirFd, name: str, key: str) -> tuple[DirFd, str] | None:
        """The directory (held) and name of what the link ``name`` in ``d`` leads to, links
        followed inside the store (never out: raises); None when it dangles."""
        held: DirFd | None = None
        try:
            for _ in range(MAX_LINKS):
                got = self._dirs.follow(d if held is None else held, name, key)
                if held is not None:
                    self._dirs.release(held)
                    held = None
                if got is None:
                    return None
                held, name = got
                try:
                    st = os.stat(name, dir_fd=held.fd, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    return None
                if not stat.S_ISLNK(st.st_mode):
                    got, held = (held, name), None
                    return got
            raise OSError(errno.ELOOP, f"{key}: too many levels of symbolic links")
        finally:
            if held is not None:
                self._dirs.release(held)

    def _walked(self, key: str, step: Callable[[DirFd, str, str], _T | None]) -> _T | None:
        """What ``step(directory, name, key)`` finds at the key's file, its directory walked
        by descriptors (:meth:`_at`) and held during the step (which follows links, inside
        only); None when the file is missing. The reads' way when the key's directory is not
        cached (or the hot path could not decide): where ``step`` finds the file missing (one
        of ``_MISSING``) because its directory was removed (and perhaps made again)
        meanwhile, the walk is tried again, three times at most."""
        for _ in range(3):
            at = self._at(key)
            if at is None:
                return None
            d = at[0]
            try:
                return step(d, at[1], key)
            except _MISSING:
                if not self._dirs.stale(d):
                    return None
            finally:
                self._dirs.release(d)
        return None

    def _open(self, key: str) -> int | None:
        """A read descriptor of the key's file (None when missing), never outside the store:
        opened ``O_NOFOLLOW`` in its directory's descriptor (a link is followed only inside)."""
        directory, _, name = key.rpartition("/")
        dirs = self._dirs
        d = dirs.acquire(directory)
        if d is not None:  # the hot path: a cached directory, one ``openat``
            try:
                return os.open(name, _O_READ_NOFOLLOW, dir_fd=d.fd)
            except FileNotFoundError:
                if name not in _DIR_NAMES and not dirs.stale(d):
                    return None  # missing (its directory is still there)
            except OSError:
                pass  # removed, a link, ``..``: the general way below decides
            finally:
                dirs.release(d)
        return self._walked(key, self._open_at)

    def _open_at(self, d: DirFd, name: str, key: str) -> int | None:
        """:meth:`_open`'s walked step: ``O_NOFOLLOW`` fails on a link, which is then followed."""
        try:
            return os.open(name, _O_READ_NOFOLLOW, dir_fd=d.fd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
        return self._open_link(d, name, key)

    def _open_link(self, d: DirFd, name: str, key: str) -> int | None:
        got = self._through_link(d, name, key)
        if got is None:
            return None
        try:
            return os.open(got[1], _O_READ_NOFOLLOW, dir_fd=got[0].fd)
        except _MISSING:
            return None
        finally:
            self._dirs.release(got[0])

    def open_local(self, key: str) -> int | None:
        """A read descriptor of the key's file (the caller closes it); None when missing."""
        return self._open(key)

    def local_path(self, key: str) -> str | None:
        """The key's file path (it need not exist yet), for messages and to tell a local store:
        nothing here opens a path. Raises
        :class:`~sharding_store.errors.LinkOutsideStoreError` when it leads out of the store."""
        path = self._path(key)
        at = self._at(key)
        if at is None:  # its directory is missing: no link on the rest of the way yet
            real = os.path.realpath(path.rpartition("/")[0] or "/")
            if not self._inside(real):
                raise self._refuse(key, real)
            return path
        d = at[0]
        try:
            if stat.S_ISLNK(os.stat(at[1], dir_fd=d.fd, follow_symlinks=False).st_mode):
                got = self._through_link(d, at[1], key)
                if got is not None:
                    self._dirs.release(got[0])
        except _MISSING:
            pass
        finally:
            self._dirs.release(d)
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
        """The last bytes of each object, one ``pread`` each, with its size and version. A run
        of keys in one cached directory holds its descriptor once (one ``openat`` a key);
        anything else (a miss, a link, ``..``) goes :meth:`_open`'s way, which decides. With
        our loops' library, each run is read by one C call (:meth:`_scanned`)."""
        reader = _native.tail_reader()
        if reader is None or len(requests) < 2:
            return self._tails(requests)
        return self._scanned(requests, reader, False)

    def tails_to_refer(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        """:meth:`get_tails`, and with our loops' library the ``lstat`` of each file's resolved
        path that :meth:`reference_to` would do next, in the same C call (see :meth:`_scanned`)."""
        reader = _native.tail_reader()
        if reader is None or len(requests) < 2:
            return self._tails(requests)
        return self._scanned(requests, reader, True)

    def _scanned(self, requests: Sequence[tuple[str, int]], reader: Any, refer: bool) -> list[Tail | None]:
        """:meth:`get_tails` a run at a time (keys in one directory, one tail length), each run
        read by ``ss_read_tails`` (:func:`_native.read_tails`): the same ``openat(O_NOFOLLOW)``,
        ``fstat``, ``pread``, close as :meth:`_tails` per key. ``refer``: also the ``lstat``
        that :meth:`_reference_by_stat` would do next, right after the ``fstat``; a file whose
        resolved path is that very file (no link, same device, inode, mtime and size) is
        kept in ``_vouched`` for :meth:`reference_to` (its reference then names the version
        read, checked where the index was read). A file the call did not read (missing, a
        link, no regular file, a short read) is read by :meth:`_tails` alone, which decides
        as without the library."""
        out: list[Tail | None] = []
        if len(self._vouched) > VOUCHED_MAX:
            self._vouched.clear()  # references of tails nobody referred to (empty shards)
        start, total = 0, len(requests)
        while start < total:
            key, n = requests[start]
            directory = key.rpartition("/")[0]
            stop = start + 1
            while stop < total and requests[stop][1] == n and requests[stop][0].rpartition("/")[0] == directory:
                stop += 1
            out.extend(self._scan_run(reader, requests[start:stop], directory, n, refer))
            start = stop
        return out

    def _scan_run(self, reader: Any, run: Sequence[tuple[str, int]], directory: str, n: int,
                  refer: bool) -> list[Tail | None]:
        """:meth:`_scanned`'s read of one run of keys in ``directory``, tails of ``n`` bytes."""
        d = self._dirs.acquire(directory)
        first: list[Tail | None] = []
        if d is None:  # not cached yet: the first key walks to it (and caches it) as without the library
            first, run = self._tails(run[:1]), run[1:]
            d = self._dirs.acquire(directory) if run else None
            if d is None:
                return first + self._tails(run)
        names = [k.rpartition("/")[2] for k, _ in run]
        joined = "\0".join(names) + "\0"
        try:
            if n < 0 or joined.count("\0") != len(names):  # a NUL in a key: no such file, :meth:`_tails` says so
                return first + self._tails(run)
            top = (self._real_dirs.get(directory) or self._real_dir(directory)) if refer else None
            real = None if top is None else os.fsencode("" if top == "/" else top)
            tails, meta = _native.read_tails(reader, d.fd, os.fsencode(joined), len(names), n, real)
        finally:
            self._dirs.release(d)
        return first + self._scan_results(run, names, tails, meta, n, top)

    def _scan_results(self, run: Sequence[tuple[str, int]], names: list[str], tails: bytes, meta: Any, n: int,
                      top: str | None) -> list[Tail | None]:
        """The tails of one run read by ``ss_read_tails`` (see :meth:`_scan_run`)."""
        out: list[Tail | None] = []
        floor = time.time_ns() - RECENT_NS
        vouched, other = self._vouched, _native.TAIL_OTHER
        lead = "/" if top == "/" else f"{top}/"
        for i, (key, _) in enumerate(run):
            m = _native.TAIL_META * i
            got = meta[m]
            if got == other:
                out.append(self._tails(((key, n),))[0])
                continue
            size, mtime = meta[m + 1], meta[m + 4]
            data = tails[i * n : i * n + got]
            if mtime > floor:  # recent: the tail's CRC in its version, as :func:`_version` makes it
                version: Version = (meta[m + 2], meta[m + 3], mtime, size, got, zlib.crc32(data))
            else:
                version = (meta[m + 2], meta[m + 3], mtime, size)
                if meta[m + 5]:  # its resolved path leads to this very file: no ``lstat`` again to refer to it
                    vouched[key] = (version, lead + names[i])
            out.append(_Tail((data, size, version)))
        return out

    def _tails(
        self, requests: Sequence[tuple[str, int]], held: dict[str, tuple[int, os.stat_result]] | None = None,
        most: int = 0,
    ) -> list[Tail | None]:
        """:meth:`get_tails`; with ``held``, the descriptors (and ``fstat``) of up to ``most``
        of the files are kept there for the caller to read again and close, the others closed."""
        out: list[Tail | None] = []
        floor = time.time_ns() - RECENT_NS
        dirs, in_dir, held_dir = self._dirs, None, None
        try:
            for key, n in requests:
                directory, _, name = key.rpartition("/")
                if directory != held_dir:
                    if in_dir is not None:
                        dirs.release(in_dir)
                    in_dir, held_dir = dirs.acquire(directory), directory
                fd = None
                if in_dir is not None and name not in _DIR_NAMES:
                    try:  # (no ``contextlib.suppress`` object per key: this loop runs once a shard)
                        fd = os.open(name, _O_READ_NOFOLLOW, dir_fd=in_dir.fd)
                    except OSError:
                        pass
                fd = self._open(key) if fd is None else fd
                got = None if fd is None else self._tail(n, fd, floor)
                if got is not None and held is not None and len(held) < most and key not in held:
                    held[key] = (cast(int, fd), got[0])
                elif fd is not None:
                    os.close(fd)
                out.append(None if got is None else got[1])
        finally:
            if in_dir is not None:
                dirs.release(in_dir)
        return out

    @staticmethod
    def _tail(n: int, fd: int, floor: int) -> tuple[os.stat_result, Tail] | None:
        """:meth:`get_tails`' read of one open file (closed here on an error only): its
        ``fstat`` and tail; None when it is no file."""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            size = st.st_size
            lo = max(0, size - n)
            data = os.pread(fd, size - lo, lo) if size > lo else b""
        except BaseException:
            os.close(fd)
            raise
        if st.st_mtime_ns > floor:
            version = _version(st, data, floor)
        else:
            version = (st.st_dev, st.st_ino, st.st_mtime_ns, size)
        return st, _Tail((data, size, version))

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
        directory, _, name = key.rpartition("/")
        dirs = self._dirs
        d0 = dirs.acquire(directory)
        if d0 is not None:  # the hot path: a cached directory, one ``fstatat``
            try:
                st = os.stat(name, dir_fd=d0.fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    return st
            except FileNotFoundError:
                if name not in _DIR_NAMES and not dirs.stale(d0):
                    return None  # missing (its directory is still there)
            except OSError:
                pass  # removed, ``..``: the general way below decides
            finally:
                dirs.release(d0)
        return self._walked(key, self._stat_at)

    def _stat_at(self, d: DirFd, name: str, key: str) -> os.stat_result | None:
        """:meth:`_stat`'s walked step: a link is followed (inside only); not a file: None."""
        st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            got = self._through_link(d, name, key)
            if got is None:
                return None
            try:
                st = os.stat(got[1], dir_fd=got[0].fd, follow_symlinks=False)
            finally:
                self._dirs.release(got[0])
        return st if stat.S_ISREG(st.st_mode) else None

    def exists(self, key: str) -> bool:
        return self._stat(key) is not None

    def size(self, key: str) -> int | None:
        st = self._stat(key)
        return None if st is None else st.st_size

    # ------------------------------------------------------------------ writes
    def _open_new(self, key: str) -> tuple[DirFd, str, int, str]:
        """``(directory, name, fd, temporary name)`` of a new temporary file next to the key
        (the directory held), its directories made if missing, all by descriptor.

        The directory is looked up first (it usually exists). Only when it is missing is it
        made, under :data:`DIRECTORY_LOCK`, so that no prune in this process can remove it
        before the new file is in it; another process's prune makes the create fail, and it
        is tried again (up to :data:`CREATE_ATTEMPTS` times, backing off)."""
        directory, _, name = key.rpartition("/")
        if name in _DIR_NAMES:
            self._at(key, create=True)  # raises
        for attempt in range(CREATE_ATTEMPTS):
            if attempt > 1:  # another process pruned it: let it finish, out of step with it
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
            tmp = _temp_name(name)
            with DIRECTORY_LOCK if attempt else contextlib.nullcontext():
                try:
                    got = self._dirs.resolve(directory, key, create=attempt > 0)
                except FileNotFoundError:  # pruned by another process again and again
                    if attempt == CREATE_ATTEMPTS - 1:
                        raise
                    got = None
                if got is None:
                    continue
                d = got[0]
                try:
                    return d, name, os.open(tmp, _O_NEW, 0o666, dir_fd=d.fd), tmp
                except FileNotFoundError:
                    self._dirs.stale(d)  # removed by a prune meanwhile: walk (and make) again
                    self._dirs.release(d)
                    if attempt == CREATE_ATTEMPTS - 1:
                        raise
                except FileExistsError:  # another process's name (same pid on another host)
                    self._dirs.release(d)
                    if attempt == CREATE_ATTEMPTS - 1:
                        raise
                except BaseException:
                    self._dirs.release(d)
                    raise
        raise FileNotFoundError(errno.ENOENT, f"{key}: its directory keeps being removed")

    @contextlib.contextmanager
    def _atomic(self, key: str) -> Iterator[int]:
        """A new file, renamed over the key (``renameat`` in its directory's descriptor) when
        the block ends without an error; removed on any error."""
        d, name, fd, tmp = self._open_new(key)
        try:
            try:
                try:
                    yield fd
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=d.fd)
                raise
        finally:
            self._dirs.release(d)

    def create_local(self, key: str) -> contextlib.AbstractContextManager[int]:
        """A new file's descriptor, published atomically as the key when the block ends
        without an error (see :meth:`BaseInner.create_local`)."""
        return self._atomic(key)

    def set(self, key: str, value: bytes) -> None:
        with self._atomic(key) as fd:
            write_all(fd, value)

    def set_streamed(self, key: str, pieces: Iterable[bytes]) -> int:
        """Each piece written as it comes into a temporary file renamed into place at the end
        (removed on an error; see :meth:`BaseInner.set_streamed`)."""
        n = 0
        with self._atomic(key) as fd:
            for piece in pieces:
                write_all(fd, piece)
                n += len(piece)
        return n

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """Written whole under a temporary name, then published with ``link()``, which fails
        when the key exists: atomic against any other process, and never half-written."""
        d, name, fd, tmp = self._open_new(key)
        try:
            try:
                write_all(fd, value)
            finally:
                os.close(fd)
            try:
                os.link(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd, follow_symlinks=False)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
                return _create_excl_in_place(d.fd, name, value)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=d.fd)
            self._dirs.release(d)

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """Replace the file only while it holds ``expected`` (see :meth:`BaseInner.put_if_unchanged`).

        POSIX has no compare-and-rename. Here the new bytes are written to a temporary
        file, the current file is compared, and the two are swapped with one
        ``renameat2(RENAME_EXCHANGE)`` in the directory's descriptor; the file swapped out is
        then compared again, so a writer that replaced the document (by rename, as atomic
        writers do) at any moment before the swap is caught and its version swapped back:
        nothing it wrote is lost. Remaining windows: a third writer replacing the document
        in the microseconds between the two swaps (its version is then kept beside the key
        as ``<key>.sharding-store-conflict-*`` and :class:`ObjectChangedError` names it),
        and a writer that rewrites the file *in place* (no rename) after the second compare.
        Where the exchange is not supported (not Linux, some filesystems) the compare is
        followed by a rename: a writer in that window is overwritten.
        """
        if expected is None:
            return (not self.exists(key)) if value is None else self.create_exclusive(key, value)
        if value is None:
            return self._delete_if(key, expected)
        if self.get(key) != expected:
            return False
        d, name, fd, tmp = self._open_new(key)
        keep = False
        try:
            try:
                write_all(fd, value)
                ours = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            swapped = _exchange(tmp, name, d.fd)
            if swapped is None:  # no atomic exchange here: compare, then replace (the window above)
                if self.get(key) != expected:
                    return False
                os.replace(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
                return True
            if not swapped:
                return False  # the document vanished since it was compared
            if _read_at(d.fd, tmp) == expected:
                return True  # the finally removes the original, now at the temporary name
            _exchange(tmp, name, d.fd)  # another writer's version: back at the key
            if os.stat(tmp, dir_fd=d.fd, follow_symlinks=False).st_ino != ours:
                keep = True
                raise self._conflict(key, d, tmp)
            return False
        finally:
            if not keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=d.fd)
            self._dirs.release(d)

    def _delete_if(self, key: str, expected: bytes) -> bool:
        """The delete of :meth:`put_if_unchanged`: the file is renamed aside (atomically:
        whatever is at the key then), compared, and put back with ``link()`` (which
        never replaces a file created meanwhile) when it is not ``expected``."""
        if self.get(key) != expected:
            return False
        at = self._at(key)
        if at is None:
            return False
        d, name, linked = at
        try:
            aside = _temp_name(name)
            try:
                os.rename(name, aside, src_dir_fd=d.fd, dst_dir_fd=d.fd)
            except FileNotFoundError:
                return False
            if _read_at(d.fd, aside) == expected:
                os.unlink(aside, dir_fd=d.fd)
            else:
                try:
                    os.link(aside, name, src_dir_fd=d.fd, dst_dir_fd=d.fd, follow_symlinks=False)
                except FileExistsError:
                    raise self._conflict(key, d, aside) from None
                os.unlink(aside, dir_fd=d.fd)
                return False
        finally:
            self._dirs.release(d)
        if not linked:
            self._prune(d.path)
        return True

    def _conflict(self, key: str, d: DirFd, tmp: str) -> ObjectChangedError:
        """Two other writers raced one compare-and-swap: the version not at the key is kept."""
        kept = f"{key.rpartition('/')[2]}.sharding-store-conflict-{os.getpid()}-{_TOKEN}-{next(_COUNTER)}"
        os.rename(tmp, kept, src_dir_fd=d.fd, dst_dir_fd=d.fd)
        where = self._path(_sibling(key, kept))
        return ObjectChangedError(f"{key}: replaced by two other writers while this write was checked; one "
                                  f"version is at the key, the other kept as {where}", key=key)

    def temp_leftovers(self, key: str) -> list[str]:
        """Keys of temporary files next to ``key`` (one listing of its directory); for a
        ``key`` ending in ``/``, of every temporary file below that prefix (a walk by
        descriptors that never follows a link)."""
        return self._leftovers(key, remove=False)

    def remove_temp_leftovers(self, key: str) -> int:
        return len(self._leftovers(key, remove=True))

    def _leftovers(self, key: str, *, remove: bool) -> list[str]:
        """:meth:`temp_leftovers` (``remove``: each unlinked too), by the directory's descriptor."""
        if key.endswith("/"):
            return self._leftovers_below(key, remove=remove)
        at = self._at(key)
        if at is None:
            return []
        d, name, _ = at
        try:
            try:
                fd = os.open(".", O_DIR, dir_fd=d.fd)
            except (FileNotFoundError, NotADirectoryError):
                return []
            try:
                names = sorted(n for n, _ in scan(fd) if n.startswith(name + TEMP_MARKER) and not _in_flight(n))
            finally:
                os.close(fd)
            for leftover in names if remove else ():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover, dir_fd=d.fd)
        finally:
            self._dirs.release(d)
        return [_sibling(key, n) for n in names]

    def _leftovers_below(self, prefix: str, *, remove: bool) -> list[str]:
        top = self._open_top(prefix.rstrip("/"))
        if top is None:
            return []
        fd, d, _, _ = top
        assert d is not None
        found = []
        try:
            if fd < 0:
                return []  # a link: nothing below it is ours
            for parent, name, key, is_dir in post_order(fd, prefix, lambda sub: True):
                if not is_dir and TEMP_MARKER in name:
                    found.append(key)
                    if remove:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=parent)
        finally:
            self._dirs.release(d)
        return sorted(found)

    def delete(self, key: str) -> None:
        at = self._at(key)
        if at is None:
            return
        d, name, linked = at
        try:
            os.unlink(name, dir_fd=d.fd)
        except (FileNotFoundError, NotADirectoryError):  # nothing there (or a file where a directory would be)
            pass
        except (IsADirectoryError, PermissionError):
            if not _is_dir_at(d.fd, name):  # EPERM: unlink of a directory on some systems
                raise
            return
        finally:
            self._dirs.release(d)
        if not linked:  # a key reached through a link: the link's target directory stays
            self._prune(d.path)

    def _open_top(self, base: str) -> tuple[int, DirFd | None, str, bool] | None:
        """``(fresh descriptor, parent held, name, parent through a link)`` of the directory
        ``base`` (the root for ""), opened ``O_NOFOLLOW``; None when it is missing or outside
        the store; ``(-1, parent, name, ...)`` when it is a link (or a file)."""
        parent, _, name = base.rpartition("/")
        try:
            got = self._dirs.resolve(parent, base)
        except LinkOutsideStoreError:
            return None  # a path through a link out of the store: never descended into
        if got is None:
            return None
        d, linked = got
        try:
            return os.open(name or ".", O_DIR_NOFOLLOW if name else O_DIR, dir_fd=d.fd), d, name, linked
        except FileNotFoundError:
            self._dirs.release(d)
            return None
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                self._dirs.release(d)
                raise
            return -1, d, name, linked

    def delete_prefix(self, prefix: str) -> None:
        """Every object whose key starts with ``prefix``. Links are removed, never followed
        (a linked directory keeps its contents); temporary files of writes in progress are
        left alone; directories emptied are removed. The walk goes by descriptors (see
        :func:`~.local_fd.post_order`): no directory swapped for a link is entered."""
        base = prefix.rpartition("/")[0]
        top = self._open_top(base)
        if top is None:
            return
        fd, d, name, linked = top
        assert d is not None
        try:
            if fd < 0:  # a link (or a file): never descended into; the link goes when covered
                if (base + "/").startswith(prefix) and _is_link_at(d.fd, name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=d.fd)
                    if not linked:
                        self._prune(d.path)
                return
            if self._delete_tree(fd, base + "/" if base else "", prefix):
                self._dirs.clear()
        finally:
            self._dirs.release(d)
        if base and not linked:
            self._prune(f"{d.path}/{name}" if d.path else name)

    @staticmethod
    def _delete_tree(fd: int, lead: str, prefix: str) -> bool:
        """Unlink every file and link below the directory open as ``fd`` (taken over) whose
        key starts with ``prefix``, then the directories that became empty; whether any was."""
        removed = False
        def want(sub: str) -> bool:
            return sub.startswith(prefix) or prefix.startswith(sub)

        for parent, name, key, is_dir in post_order(fd, lead, want):
            if TEMP_MARKER in name:
                continue
            if is_dir:
                if (key + "/").startswith(prefix):
                    with DIRECTORY_LOCK, contextlib.suppress(OSError):
                        os.rmdir(name, dir_fd=parent)
                        removed = True
            elif key.startswith(prefix):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(name, dir_fd=parent)
        return removed

    def _prune(self, path: str) -> None:
        """Remove the empty directories from canonical ``path`` up to (not including) the
        root, each by ``rmdir`` in its parent's descriptor."""
        with DIRECTORY_LOCK:
            while path:
                parent, _, name = path.rpartition("/")
                try:
                    got = self._dirs.resolve(parent, path)
                except (LinkOutsideStoreError, OSError):
                    return
                if got is None:
                    return
                try:
                    os.rmdir(name, dir_fd=got[0].fd)
                except OSError:  # not empty (or already gone, or raced by a writer): stop
                    return
                finally:
                    self._dirs.release(got[0])
                self._dirs.forget(path)
                path = parent

    def move(self, key: str, dst_key: str) -> None:
        """``renameat`` (atomic, no copy); the source's emptied directories are removed. A
        missing source whose destination exists is a move already done."""
        src = self._at(key)
        if src is None:
            if self._lexists(dst_key):
                return
            raise FileNotFoundError(errno.ENOENT, f"{key}: not found", self._path(key))
        s, sname, linked = src
        directory, _, dname = dst_key.rpartition("/")
        try:
            for attempt in range(CREATE_ATTEMPTS):
                with DIRECTORY_LOCK if attempt else contextlib.nullcontext():
                    got = self._dirs.resolve(directory, dst_key, create=attempt > 0)
                    if got is None:
                        continue
                    try:
                        os.replace(sname, dname, src_dir_fd=s.fd, dst_dir_fd=got[0].fd)
                        break
                    except FileNotFoundError:
                        if not _lexists_at(s.fd, sname):
                            if _lexists_at(got[0].fd, dname):
                                return
                            raise
                        self._dirs.stale(got[0])
                        if attempt == CREATE_ATTEMPTS - 1:
                            raise
                    finally:
                        self._dirs.release(got[0])
        finally:
            self._dirs.release(s)
        if not linked:
            self._prune(s.path)

    def _lexists(self, key: str) -> bool:
        at = self._at(key)
        if at is None:
            return False
        try:
            return _lexists_at(at[0].fd, at[1])
        finally:
            self._dirs.release(at[0])

    def tidy(self, prefix: str = "", *, keep_top: bool = True) -> None:
        """Temporary files of interrupted writes removed below ``prefix``, and the empty
        directories (``prefix``'s own unless ``keep_top``; never the root), by descriptor."""
        base = prefix.rstrip("/")
        top = self._open_top(base)
        if top is None:
            return
        fd, d, name, _ = top
        assert d is not None
        try:
            if fd < 0:
                return  # a link: nothing below it is ours
            removed = False
            for parent, entry, _, is_dir in post_order(fd, "", lambda sub: True):
                with contextlib.suppress(OSError):
                    if is_dir:
                        with DIRECTORY_LOCK:
                            os.rmdir(entry, dir_fd=parent)  # not empty: kept
                            removed = True
                    elif TEMP_MARKER in entry:
                        os.unlink(entry, dir_fd=parent)
            if base and not keep_top:
                with DIRECTORY_LOCK, contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=d.fd)
                    removed = True
            if removed:
                self._dirs.clear()
        finally:
            self._dirs.release(d)

    # ------------------------------------------------------------------ copies
    def can_copy_to(self, dst: Inner, *, append: bool = False) -> bool:
        return dst.location().kind == "file"

    def copy_to(
        self, key: str, dst: Inner, dst_key: str, *, size: int | None = None, append: bytes = b"",
        version: Version | None = None,
    ) -> bool:
        """A kernel copy (``copy_file_range``) into a new file at the destination
        (:meth:`create_local`, renamed over ``dst_key``): one open of each file, no byte
        through this process."""
        out = dst.create_local(dst_key)
        if out is None:
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
            with out as out_fd:
                copy_fd_into(fd, out_fd, append, st.st_size)
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
        each range from its source file into a new file at the destination, literal parts
        written, then renamed over the key: no payload byte through this process.

        Each source file is opened once (never through a link out of this store), its
        version checked against ``versions`` on that descriptor (``fstat``) and its
        ``fstat`` compared again after the copies, before the new object is published: a
        source replaced or rewritten meanwhile raises :class:`ObjectChangedError` and
        nothing is written. The new file is ``into``'s own (:meth:`create_local`, by
        directory descriptor). Another kind of destination: the generic way."""
        with _Sources(self) as sources:
            return sources.compose(self if into is None else into, key, parts, versions or {})

    def compose_from_tails(
        self, sources: Sequence[tuple[str, int]], plan: ComposePlan, *, into: Inner | None = None,
        done: Callable[[str, int], None] | None = None,
    ) -> None:
        """:meth:`BaseInner.compose_from_tails` with one open per source file: its tail is
        read from the descriptor the kernel copies then read from (kept open for the call,
        up to :data:`HELD_SOURCES` of them; a source beyond those is opened again, its
        version checked), and each source's ``fstat`` (and a recent file's tail CRC) is
        compared after the copies of each object, before the object is published: a source
        rewritten in place meanwhile raises :class:`ObjectChangedError`. Another kind of
        destination: the generic way."""
        dst = self if into is None else into
        if not self.can_compose_to(dst):
            return super().compose_from_tails(sources, plan, into=into, done=done)
        with _Sources(self) as held:
            tails = held.read_tails(sources)
            versions = {k: t.version for (k, _), t in zip(sources, tails) if t is not None}
            for key, parts in plan(tails):
                n = held.compose(dst, key, parts, versions)
                if done is not None:
                    done(key, n)
        return None

    # ------------------------------------------------------------------ listings
    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (k for k, _ in self._walk(prefix, sizes=False))

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """Sorted ``(key, size)`` under ``prefix``, lazily (one ``stat`` per file)."""
        return self._walk(prefix, sizes=True)

    def _canonical(self, spelled: str, key: str) -> str | None:
        """The canonical path of directory ``spelled``; None when missing or outside."""
        try:
            got = self._dirs.resolve(spelled, key)
        except LinkOutsideStoreError:
            return None
        if got is None:
            return None
        self._dirs.release(got[0])
        return got[0].path

    def _walk(self, prefix: str, *, sizes: bool) -> Iterator[tuple[str, int | None]]:
        base = prefix.rpartition("/")[0]
        canon = self._canonical(base, prefix)
        if canon is None:
            return
        # a stack of the directories being listed instead of recursion: any depth
        stack = [self._walk_dir(canon, base + "/" if base else "", prefix, sizes, (canon,))]
        while stack:
            for item in stack[-1]:
                if isinstance(item, tuple):
                    yield item
                else:
                    stack.append(item)
                    break
            else:
                stack.pop()

    def _walk_dir(
        self, canon: str, lead: str, prefix: str, sizes: bool, chain: tuple[str, ...]
    ) -> Iterator[Any]:
        """Keys in sorted order: entries sorted by name, a directory's as ``name/`` (all its
        keys start so). ``canon``: the directory's canonical path; ``chain``: those being
        listed. A link that stays inside the store is followed (unless it leads to a directory
        being listed, or above one: a cycle, skipped); a link out of it is listed as a key of
        its own, which refuses to be read. Yields ``(key, size)``, or for a directory to list
        in its place the iterator that lists it (:meth:`_walk` runs them as a stack)."""
        for name, kind, sub, size in self._entries(canon, lead, sizes):
            key = lead + name
            if kind == "d":
                assert sub is not None
                if not sub or any(c == sub or c.startswith(sub + "/") for c in chain):
                    continue
                below = key + "/"
                if below.startswith(prefix) or prefix.startswith(below):
                    yield self._walk_dir(sub, below, prefix, sizes, chain + (sub,))
            elif key.startswith(prefix) and not (sizes and kind == "f" and size is None):  # None: removed meanwhile
                yield key, size if sizes else None

    def _entries(self, canon: str, lead: str, sizes: bool) -> list[tuple[str, str, str | None, int | None]]:
        """``(name, kind, canonical sub-directory, size)`` of each entry of canonical directory
        ``canon``, sorted as keys sort: kind ``d`` a directory (also through a link inside),
        ``f`` a file (``size`` when asked), ``o`` a link out of the store (no size). Pipes,
        sockets, devices and dangling links are no objects: left out."""
        try:
            got = self._dirs.resolve(canon, lead)
        except LinkOutsideStoreError:
            return []  # swapped for a link out since it was listed as a directory: not entered
        if got is None:
            return []
        d = got[0]
        out: list[tuple[str, str, str | None, int | None]] = []
        try:
            try:
                fd = os.open(".", O_DIR, dir_fd=d.fd)  # our own offset: no other thread's listing moves it
            except OSError:
                return []
            try:
                raw = scan_sized(fd, sizes=sizes)
            finally:
                os.close(fd)
            for name, kind, size in raw:
                if TEMP_MARKER in name:
                    continue
                if kind == "f":
                    out.append((name, "f", None, size))
                elif kind == "d":
                    out.append((name, "d", f"{d.path}/{name}" if d.path else name, None))
                elif kind == "l":
                    item = self._link_entry(d, name, lead + name, sizes)
                    if item is not None:
                        out.append((name, *item))
        finally:
            self._dirs.release(d)
        out.sort(key=lambda t: t[0] + "/" if t[1] == "d" else t[0])
        return out

    def _link_entry(self, d: DirFd, name: str, key: str, sizes: bool) -> tuple[str, str | None, int | None] | None:
        """A link's entry (see :meth:`_entries`), its target walked by descriptors."""
        try:
            got = self._dirs.resolve(f"{d.path}/{name}" if d.path else name, key)
            if got is not None:
                self._dirs.release(got[0])
                return "d", got[0].path, None
            target = self._through_link(d, name, key)
        except LinkOutsideStoreError:
            return "o", None, None
        except OSError:
            return None
        if target is None:
            return None
        try:
            st = os.stat(target[1], dir_fd=target[0].fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            self._dirs.release(target[0])
        return ("f", None, st.st_size) if stat.S_ISREG(st.st_mode) else None

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        if prefix and not prefix.endswith("/"):
            return super().list_dir(prefix)
        base = prefix.rstrip("/")
        canon = self._canonical(base, prefix)
        if canon is None:
            return [], []
        keys: list[str] = []
        prefixes: list[str] = []
        for name, kind, sub, _ in self._entries(canon, prefix, False):
            if kind == "d":
                assert sub is not None
                if not sub or canon == sub or canon.startswith(sub + "/"):
                    continue  # a link to a directory above it: a cycle, not listed
                prefixes.append(prefix + name + "/")
            else:
                keys.append(prefix + name)
        return sorted(keys), sorted(prefixes)

    # ------------------------------------------------------------------ identity
    def location(self) -> Location:
        return Location("file", "", self.real_root())

    def reference_to(self, key: str, offset: int, length: int, version: Version | None = None) -> ChunkRef | None:
        """A ``file://`` reference to the key's file by its resolved path (links inside the
        store followed, never out), with its size and ``st_mtime_ns`` from ``fstat`` of the
        descriptor opened inside the root; the path is checked to lead to that very file.
        ``version``: from :meth:`get_tails`, else :class:`ObjectChangedError`. None: missing.
        Given a version, one ``lstat`` of the resolved path usually does (:meth:`_reference_by_stat`)."""
        if type(version) is tuple and len(version) == 4:
            vouched = self._vouched.pop(key, None) if self._vouched else None
            if vouched is not None and vouched[0] == version:  # checked as the tail was read
                return _reference(vouched[1], offset, length, version[3], version[2], version[1])
            fast = self._reference_by_stat(key, offset, length, version)
            if fast is not None:
                return fast
        fd = self._open(key)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if version is not None:
                _check(key, version, fd, st)
            real = _resolved(fd, self._path(key))
        finally:
            os.close(fd)
        if not self._inside(real):
            raise self._refuse(key, real)
        try:
            now = os.stat(real)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise ObjectChangedError(f"{key}: the file was replaced while a reference to it was taken", key=key)
        return _reference(real, offset, length, st.st_size, st.st_mtime_ns, st.st_ino)

    def _real_dir(self, directory: str) -> str | None:
        """The resolved path of the store's ``directory`` (cached), None when it leads out of
        the store. Below its resolved parent, a plain (no link) subdirectory costs one ``lstat``
        (one directory per shard is common); anything else one ``realpath``."""
        top = self._real_dirs.get(directory)
        if top is not None:
            return top
        parent, _, name = directory.rpartition("/")
        above = self._real_dir(parent) if directory and name not in ("", ".", "..") else None
        if above is not None:
            real = f"{above}/{name}" if above != "/" else f"/{name}"
            try:
                plain = stat.S_ISDIR(os.lstat(real).st_mode)
            except OSError:
                plain = False
            top = real if plain else None
        if top is None:
            top = os.path.realpath(self._path(directory) if directory else self.root)
            if not self._inside(top):
                return None
        if len(self._real_dirs) >= 4096:
            self._real_dirs.clear()
        self._real_dirs[directory] = top
        return top

    def _reference_by_stat(self, key: str, offset: int, length: int, version: tuple[Any, ...]) -> ChunkRef | None:
        """:meth:`reference_to` of a file a tail read has just seen (``version``: device, inode,
        mtime, size): its directory resolved once (cached, checked inside the store), then one
        ``lstat`` of the name there, which must be that very regular file (no link); None
        (the descriptor's way decides) otherwise."""
        directory, _, name = key.rpartition("/")
        top = self._real_dirs.get(directory) or self._real_dir(directory)
        if top is None:
            return None  # the descriptor's way refuses it, naming the key
        real = f"{top}/{name}" if top != "/" else f"/{name}"
        try:
            st = os.lstat(real)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size) != version:
            return None
        return _reference(real, offset, length, st.st_size, st.st_mtime_ns, st.st_ino)

    def describe(self) -> str:
        return self.root


#: the epoch, aware: ``_EPOCH + timedelta(microseconds=...)`` is ``fromtimestamp`` exactly, at a third of its cost
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _reference(real: str, offset: int, length: int, size: int, ns: int, inode: int) -> ChunkRef:
    """``ChunkRef(url, offset, length, size, modified=..., modified_ns=ns, inode=inode)`` of the
    file at ``real`` (``ns``: its ``st_mtime_ns``, ``inode``: its ``st_ino``), made without
    keyword parsing (one per shard of a virtual migration)."""
    modified = _EPOCH + timedelta(0, 0, ns // 1000)  # to the microsecond, truncated (floor)
    return tuple.__new__(ChunkRef, (f"file://{real}", offset, length, size, None, modified, ns, inode))


def _resolved(fd: int, path: str) -> str:
    """The path of the file open as ``fd``, every link resolved: from ``/proc`` where there
    is one (what was opened, whatever was swapped since), else ``realpath`` of ``path``
    (the caller checks it leads to the same file)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        if real.startswith("/") and not real.endswith(" (deleted)"):
            return real
    except OSError:
        pass
    return os.path.realpath(path)


#: source files :meth:`LocalInner.compose_from_tails` keeps open between reading their tails
#: and copying from them (more are opened again; bounds the descriptors a task holds)
HELD_SOURCES = 64


class _Sources:
    """The source files of kernel copies, each opened once (never through a link out of
    the store) and closed when the block ends: those whose tails were read stay open for
    the copies (up to :data:`HELD_SOURCES`), others are opened as a copy needs them (for
    that object only), their version checked on the new descriptor."""

    def __init__(self, inner: LocalInner) -> None:
        self.inner = inner
        self.held: dict[str, tuple[int, os.stat_result]] = {}

    def __enter__(self) -> _Sources:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd, _ in self.held.values():
            os.close(fd)
        self.held.clear()

    def read_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        """:meth:`LocalInner.get_tails`, the descriptors kept (see the class docstring)."""
        return self.inner._tails(requests, self.held, HELD_SOURCES)

    def _open(self, key: str, expected: Version | None) -> tuple[int, os.stat_result]:
        fd = self.inner._open(key)
        if fd is None:
            raise ObjectChangedError(f"{key}: gone since its ranges were computed", key=key)
        try:
            st = os.fstat(fd)
            if expected is not None:
                _check(key, expected, fd, st if stat.S_ISREG(st.st_mode) else None)
            elif not stat.S_ISREG(st.st_mode):
                raise ObjectChangedError(f"{key}: not a file any more", key=key)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def compose(self, dst: Inner, key: str, parts: Sequence[Part], versions: Mapping[str, Version | None]) -> int:
        """One object of ``dst`` from ``parts`` (see :meth:`LocalInner.compose`); its size."""
        out_file = dst.create_local(key)
        if out_file is None:  # not a local destination: the generic way
            return BaseInner.compose(self.inner, key, parts, into=dst, versions=versions)
        used: dict[str, tuple[int, os.stat_result]] = {}
        opened: list[int] = []
        try:
            for part in parts:
                if isinstance(part, (bytes, bytearray, memoryview)) or part[0] in used:
                    continue
                got = self.held.get(part[0])
                if got is None:
                    got = self._open(part[0], versions.get(part[0]))
                    opened.append(got[0])
                used[part[0]] = got
            with out_file as out:
                return _compose_into(out, parts, used, versions)
        finally:
            for fd in opened:
                os.close(fd)


def _compose_into(
    out: int, parts: Sequence[Part], fds: Mapping[str, tuple[int, os.stat_result]],
    versions: Mapping[str, Version | None],
) -> int:
    """:meth:`LocalInner.compose`'s copies into ``out``; the size written. Each source's
    ``fstat`` is compared after the copies with the one taken when it was opened (and a
    recent file's tail CRC with its version's): nothing rewrote it in place meanwhile."""
    mode = [_KERNEL_COPY]
    written = 0
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
            raise ObjectChangedError(f"{src_key}: shorter than {end} bytes since its ranges were computed", key=src_key)
        _copy_range(src_key, fd, out, start, end - start, mode)
        written += end - start
    for src_key, (fd, st) in fds.items():
        now = os.fstat(fd)
        version = versions.get(src_key)
        if (now.st_ino, now.st_mtime_ns, now.st_size) != (st.st_ino, st.st_mtime_ns, st.st_size) or (
            type(version) is tuple and len(version) == 6
            and zlib.crc32(os.pread(fd, version[4], now.st_size - version[4])) != version[5]
        ):
            raise ObjectChangedError(f"{src_key}: changed while being copied", key=src_key)
    return written


def _lexists_at(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _is_link_at(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _is_dir_at(fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


#: what ``link()`` says on filesystems without hard links (exFAT, some FUSE and network mounts)
_NO_HARD_LINKS = frozenset(
    getattr(errno, name) for name in ("EPERM", "EOPNOTSUPP", "ENOTSUP", "ENOSYS") if hasattr(errno, name)
)


def _create_excl_in_place(dir_fd: int, name: str, value: bytes) -> bool:
    """``create_exclusive`` where ``link()`` is refused: ``O_EXCL`` on the key itself in its
    directory's descriptor (still atomic against other creators; a reader may see it before
    it is whole)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
    except FileExistsError:
        return False
    try:
        write_all(fd, value)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)
    return True


# ---------------------------------------------------------------------- atomic writes

TEMP_MARKER = ".sharding-store-tmp-"
#: temporary names: pid, a per-process random token and a counter (O_EXCL catches clashes)
#: (32 random bits, what ``uuid.uuid4().hex[:8]`` gave: importing uuid loads platform, ~3 ms of start-up)
_TOKEN = os.urandom(4).hex()
_COUNTER = itertools.count()


def _temp_name(name: str) -> str:
    """A fresh temporary name next to ``name`` (pid, per-process token, counter)."""
    return f"{name}{TEMP_MARKER}{os.getpid()}-{_TOKEN}-{next(_COUNTER)}"


def _in_flight(name: str) -> bool:
    """Whether temporary file ``name`` belongs to a write that may still be running: its
    writer's pid (:func:`_temp_name`) is another live process on this host. Such a file is
    not a leftover: a run that holds a claim and tidies a key another run is racing to write
    (the upgrade journal's claim) must not pull it from under that write (which then failed
    with an I/O error, exit 12, having already swapped its claim in). A reused pid only keeps
    a dead write's file a while longer; it is never listed as a key."""
    pid_text = name.rpartition(TEMP_MARKER)[2].partition("-")[0]
    if not pid_text.isdigit() or not 0 < int(pid_text) < 2**22 or int(pid_text) == os.getpid():
        return False  # not our spelling (pids are below 2**22 on Linux), or this process's own
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def _sibling(key: str, name: str) -> str:
    """The key of file ``name`` in the directory of ``key``."""
    lead = key.rpartition("/")[0]
    return f"{lead}/{name}" if lead else name


def _read_at(dir_fd: int, name: str) -> bytes | None:
    """The whole file ``name`` in the directory open as ``dir_fd`` (never through a link)."""
    try:
        fd = os.open(name, _O_READ_NOFOLLOW, dir_fd=dir_fd)
    except _MISSING:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        buf = bytearray(st.st_size)
        return bytes(buf[: _read_full(fd, buf)])
    finally:
        os.close(fd)


_NO_EXCHANGE = frozenset(getattr(errno, n) for n in ("EINVAL", "ENOSYS", "EOPNOTSUPP", "ENOTSUP") if hasattr(errno, n))


def _exchange(a: str, b: str, dir_fd: int | None = None) -> bool | None:
    """Swap the files ``a`` and ``b`` (names in the directory open as ``dir_fd``; paths
    without it) atomically (``renameat2(RENAME_EXCHANGE)``): True; False when one of them is
    missing; None when this system or filesystem cannot."""
    err = _native.rename_exchange(os.fsencode(a), os.fsencode(b), dir_fd)
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
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


@contextlib.contextmanager
def atomic_local_file(path: str) -> Iterator[tuple[int, str]]:
    """``(fd, temp path)`` of a new file next to ``path``, renamed over it on success.

    Readers see the old object or the new one, never half of one; on any error the
    temporary file is removed. The directory is opened once (made if missing) and the file
    created and renamed in its descriptor: a directory swapped for a link meanwhile changes
    nothing. The file gets the mode a plain ``open()`` would give, not mkstemp's 0600.
    (A store's own writes go through :meth:`LocalInner.create_local`.)
    """
    directory, name = os.path.split(path)
    directory = directory or "."
    try:
        dir_fd = os.open(directory, O_DIR)
    except FileNotFoundError:
        with DIRECTORY_LOCK, contextlib.suppress(FileExistsError):
            os.makedirs(directory, exist_ok=True)
        dir_fd = os.open(directory, O_DIR)
    try:
        tmp = _temp_name(name)
        fd = os.open(tmp, _O_NEW, 0o666, dir_fd=dir_fd)
        try:
            try:
                yield fd, os.path.join(directory, tmp)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


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


def copy_fd_into(src_fd: int, fd: int, append: bytes = b"", size: int | None = None) -> None:
    """The whole file open as ``src_fd`` (plus ``append``) written to the new file open as
    ``fd``: ``copy_file_range`` where the kernel can, else ``pread``/``write`` from that same
    descriptor (never a path again: it may name another file by now)."""
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
