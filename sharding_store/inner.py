"""Uniform synchronous access to the store under a :class:`ShardingStore`.

The wrapper needs a handful of operations — whole gets, byte-range reads (with a
suffix read for the shard index), atomic puts, deletes and listings — from very
different things: a ``dict``, an ``fsspec.FSMap``, a zarr-python 2 style store, a
zarr-python 3 ``Store``, or a path/URL. :func:`as_inner` picks the adapter that
offers the best partial reads for each.

Range requests are ``(key, start, end)``: ``start >= 0`` with ``end`` exclusive (or
``None`` for to-the-end), or ``start < 0`` with ``end is None`` for the last
``-start`` bytes. Results may be *shorter* than requested when the object is;
callers check lengths (that is how a damaged index is caught). A missing object
gives ``None``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Protocol, runtime_checkable

RangeRequest = tuple[str, int, int | None]
#: the last bytes of an object and the object's size, when the backend knows it for free
Tail = tuple[bytes, int | None]


@runtime_checkable
class Inner(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes | None]: ...
    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]: ...
    def set(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def list_prefix(self, prefix: str) -> Iterator[str]: ...
    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]: ...
    def exists(self, key: str) -> bool: ...


def _slice(data: bytes, start: int, end: int | None) -> bytes:
    if start < 0:
        return data[max(0, len(data) + start) :]
    return data[start:end]


def _list_dir_from_keys(keys: Iterable[str], prefix: str) -> tuple[list[str], list[str]]:
    """Split the keys under ``prefix`` into direct children and sub-prefixes (ending in ``/``)."""
    out_keys: set[str] = set()
    out_prefixes: set[str] = set()
    for k in keys:
        rest = k[len(prefix) :]
        head, sep, _ = rest.partition("/")
        if sep:
            out_prefixes.add(prefix + head + "/")
        else:
            out_keys.add(k)
    return sorted(out_keys), sorted(out_prefixes)


class MappingInner:
    """Any ``MutableMapping[str, bytes]``; uses its ``get_partial_values`` if it has one.

    zarr-python 2 v3 stores (and many hand-written ones) have
    ``get_partial_values([(key, (start, length))])``; otherwise a range read is one
    full get and a slice, done once per key per call.
    """

    def __init__(self, mapping: MutableMapping[str, bytes]) -> None:
        self.mapping = mapping
        self._partial = getattr(mapping, "get_partial_values", None)

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(self.mapping[key])
        except KeyError:
            return None

    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes | None]:
        if self._partial is not None:
            ranges = [(k, (s, None if e is None else e - s)) for k, s, e in requests]
            try:
                out = self._partial(ranges)
            except KeyError:
                out = None
            if out is not None:
                return [None if v is None else bytes(v) for v in out]
        cache: dict[str, bytes | None] = {}
        result: list[bytes | None] = []
        for key, start, end in requests:
            if key not in cache:
                cache[key] = self.get(key)
            data = cache[key]
            result.append(None if data is None else _slice(data, start, end))
        return result

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        if self._partial is not None:
            out = self.get_ranges([(k, -n, None) for k, n in requests])
            return [None if v is None else (v, None) for v in out]
        tails: list[Tail | None] = []
        for key, n in requests:
            data = self.get(key)
            tails.append(None if data is None else (data[max(0, len(data) - n) :], len(data)))
        return tails

    def set(self, key: str, value: bytes) -> None:
        self.mapping[key] = value

    def delete(self, key: str) -> None:
        try:
            del self.mapping[key]
        except KeyError:
            pass

    def delete_prefix(self, prefix: str) -> None:
        for k in list(self.list_prefix(prefix)):
            self.delete(k)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        lister = getattr(self.mapping, "list_prefix", None)
        keys = lister(prefix) if lister is not None else (k for k in list(self.mapping) if k.startswith(prefix))
        return iter(sorted(keys))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        return _list_dir_from_keys(self.list_prefix(prefix), prefix)

    def exists(self, key: str) -> bool:
        return key in self.mapping


class FsspecInner:
    """An fsspec filesystem below a root path: ranged reads via ``cat_ranges``.

    Local files are written through a temporary name and ``os.replace`` so a shard is
    either the old or the new object, never half of one; object stores' PUT is atomic
    already.
    """

    def __init__(self, fs: Any, root: str) -> None:
        self._fs = fs
        if fs is None:  # a plain local path (see ``local``): fsspec is imported only if needed
            self.root = root
            self.is_local = True
            return
        self.root = fs._strip_protocol(root).rstrip("/")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_local = protocol in ("file", "local")

    @classmethod
    def local(cls, path: str) -> FsspecInner:
        """A local directory without importing fsspec: ranged reads and writes are plain
        ``pread``/atomic writes; listings and deletes load fsspec's local filesystem on
        first use. ``root`` is spelled as fsspec's ``LocalFileSystem`` spells it."""
        if path.startswith("~"):
            path = os.path.expanduser(path)
        elif path.startswith("./"):
            path = path[2:]
        elif path == ".":
            path = ""
        if not path.startswith("/"):
            path = f"{os.getcwd()}/{path}"
        return cls(None, path.rstrip("/"))

    @property
    def fs(self) -> Any:
        if self._fs is None:
            from fsspec.implementations.local import LocalFileSystem

            self._fs = LocalFileSystem()
        return self._fs

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _key(self, path: str) -> str:
        path = self.fs._strip_protocol(path)
        return path[len(self.root) + 1 :] if self.root else path

    def get(self, key: str) -> bytes | None:
        try:
            if self.is_local:
                got = self._pread(key, 0, None)
                return None if got is None else got[0]
            return self.fs.cat_file(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes | None]:
        if not requests:
            return []
        if self.is_local:
            return [self._local_range(k, s, e) for k, s, e in requests]
        paths = [self._path(k) for k, _, _ in requests]
        out = self.fs.cat_ranges(
            paths, [s for _, s, _ in requests], [e for _, _, e in requests], on_error="return"
        )
        result: list[bytes | None] = []
        for (key, start, end), value in zip(requests, out):
            if isinstance(value, FileNotFoundError):
                result.append(None)
            elif isinstance(value, BaseException):
                # a suffix longer than the object, or a start past its end, is refused by
                # some servers (HTTP 416): fall back to a size-aware read, else re-raise
                result.append(self._fallback_range(key, start, end, value))
            else:
                result.append(value)
        return result

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        if self.is_local:
            return [self._local_tail(k, n) for k, n in requests]
        out = self.get_ranges([(k, -n, None) for k, n in requests])
        return [None if v is None else (v, None) for v in out]

    def _local_tail(self, key: str, n: int) -> Tail | None:
        return self._pread(key, -n, None)

    def _fallback_range(self, key: str, start: int, end: int | None, error: BaseException) -> bytes | None:
        try:
            size = self.fs.size(self._path(key))
        except FileNotFoundError:
            return None
        except Exception:
            raise error
        lo = max(0, size + start) if start < 0 else min(start, size)
        hi = size if end is None else min(end, size)
        if lo >= hi:
            return b""
        return self.fs.cat_file(self._path(key), start=lo, end=hi)

    def _local_range(self, key: str, start: int, end: int | None) -> bytes | None:
        got = self._pread(key, start, end)
        return None if got is None else got[0]

    def _pread(self, key: str, start: int, end: int | None) -> Tail | None:
        """One ``pread`` of a local file: the bytes (clamped to the file) and its size."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            size = os.fstat(fd).st_size
            lo = max(0, size + start) if start < 0 else min(start, size)
            hi = size if end is None else min(end, size)
            return (os.pread(fd, hi - lo, lo) if hi > lo else b""), size
        finally:
            os.close(fd)

    def read_local_into(self, key: str, alloc: Any) -> Any | None:
        """A whole local object read into a caller-owned buffer that is reused between
        objects (reading many objects then touches no fresh memory). ``alloc(n)`` returns a
        writable buffer of at least ``n`` bytes. The read first fills the buffer at hand and
        sizes the file only if it may be bigger, so an object that fits costs open + one
        ``preadv`` + close. Returns the bytes read (a prefix of the buffer), or None when
        the object is missing."""
        assert self.is_local, "read_local_into reads local files only"
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            buf = alloc(0)
            got = _read_full(fd, buf)
            if got == len(buf):  # perhaps more: size the file, read it again into a buffer that fits
                size = os.fstat(fd).st_size
                if size > got:
                    buf = alloc(size)
                    got = _read_full(fd, buf)
            return buf[:got]
        finally:
            os.close(fd)

    def set(self, key: str, value: bytes) -> None:
        path = self._path(key)
        if self.is_local:
            write_local_atomic(path, value)
        else:
            self.fs.pipe_file(path, bytes(value))

    def delete(self, key: str) -> None:
        try:
            if self.is_local:
                os.unlink(self._path(key))
            else:
                self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass
        self._prune(key)

    def delete_prefix(self, prefix: str) -> None:
        keys = list(self.list_prefix(prefix))
        if not keys:
            return
        if self.is_local:
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(key))
        else:
            try:
                self.fs.rm([self._path(k) for k in keys])
            except FileNotFoundError:
                pass
        for key in keys:
            self._prune(key)

    def _prune(self, key: str) -> None:
        """Remove the empty directories a local delete leaves, so listings show no ghost prefixes."""
        if not self.is_local:
            return
        parent = os.path.dirname(self._path(key))
        with DIRECTORY_LOCK:
            while parent and parent != self.root and parent.startswith(self.root + "/"):
                try:
                    os.rmdir(parent)
                except OSError:  # not empty (or already gone, or raced by a writer): stop
                    return
                parent = os.path.dirname(parent)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return iter([k for k, _ in self.list_sized(prefix, fresh=False, sizes=False)])

    def list_sized(self, prefix: str, *, fresh: bool = True, sizes: bool = True) -> list[tuple[str, int | None]]:
        """Sorted ``(key, size)`` of the objects under ``prefix``, from one listing
        (sizes come free with it, except on local disk: one ``stat`` per file, skipped
        with ``sizes=False``); temporary files of unfinished writes are left out.
        ``fresh``: drop fsspec's cached listing first (another process may have written)."""
        base = prefix.rpartition("/")[0]
        if self.is_local:
            found = _walk_local(self._path(base) if base else self.root, base, sizes)
        else:
            path = self._path(base) if base else self.root
            if fresh:
                self.fs.invalidate_cache(path)
            try:
                listed = self.fs.find(path, detail=True)
            except FileNotFoundError:
                listed = {}
            found = ((self._key(p), info.get("size")) for p, info in listed.items())
        return sorted((k, n) for k, n in found if k.startswith(prefix) and not _is_temp(k))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        if prefix and not prefix.endswith("/"):
            return _list_dir_from_keys(self.list_prefix(prefix), prefix)
        keys, prefixes = [], []
        if self.is_local:
            try:
                with os.scandir(self._path(prefix.rstrip("/")) if prefix else self.root) as it:
                    entries = [(prefix + e.name, e.is_dir()) for e in it]
            except (FileNotFoundError, NotADirectoryError):
                return [], []
        else:
            try:
                listed = self.fs.ls(self._path(prefix.rstrip("/")) if prefix else self.root or "", detail=True)
            except (FileNotFoundError, NotADirectoryError):
                return [], []
            entries = [(self._key(e["name"]).rstrip("/"), e["type"] == "directory") for e in listed]
        for k, is_dir in entries:
            if _is_temp(k):
                continue
            if is_dir:
                prefixes.append(k + "/")
            else:
                keys.append(k)
        return sorted(keys), sorted(prefixes)

    def exists(self, key: str) -> bool:
        if self.is_local:
            return os.path.isfile(self._path(key))
        return self.fs.isfile(self._path(key))

    def size(self, key: str) -> int | None:
        try:
            if self.is_local:
                return os.stat(self._path(key)).st_size
            return int(self.fs.size(self._path(key)))
        except (FileNotFoundError, NotADirectoryError):
            return None


def _walk_local(path: str, key_prefix: str, sizes: bool = True) -> Iterator[tuple[str, int | None]]:
    """``(key, size)`` of every file below directory ``path`` (keys start with
    ``key_prefix``; size None unless ``sizes``), with ``os.scandir``: no fsspec import for
    local listings. Symbolic links are followed, as fsspec's local ``find`` does."""
    lead = key_prefix + "/" if key_prefix else ""
    try:
        it = os.scandir(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    with it:
        entries = list(it)
    for e in entries:
        key = lead + e.name
        try:
            if e.is_dir():
                yield from _walk_local(e.path, key, sizes)
            else:
                yield key, e.stat().st_size if sizes else None
        except FileNotFoundError:  # removed while we listed it
            continue


TEMP_MARKER = ".sharding-store-tmp-"
#: temporary names: pid, a per-process random token and a counter (O_EXCL catches clashes)
_TOKEN = uuid.uuid4().hex[:8]
_COUNTER = itertools.count()


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: the mode of published objects: what a plain open() gives (0o666 minus the umask)
FILE_MODE = 0o666 & ~_read_umask()


def _is_temp(key: str) -> bool:
    return TEMP_MARKER in key.rpartition("/")[2]


#: Serialises, within this process, pruning empty directories with making a directory
#: for a new file. Without it a delete in another thread can remove the directory
#: between a writer's ``makedirs`` and its ``open``, again and again: with three threads
#: churning one directory, 1 write in 15 000 needed more than 20 tries (the worst, 164).
#: Another process still can; the writer then backs off and tries again, up to
#: :data:`CREATE_ATTEMPTS` times (three processes churning: at most 10 tries in 45 000).
DIRECTORY_LOCK = threading.Lock()


def _new_directory_lock() -> None:
    """A child forked while another thread held the lock must not inherit it held."""
    global DIRECTORY_LOCK
    DIRECTORY_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_directory_lock)

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
        tmp = f"{path}{TEMP_MARKER}{os.getpid()}-{_TOKEN}-{next(_COUNTER)}"
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


def _read_full(fd: int, buf: Any) -> int:
    """Read a file from its start into ``buf`` until the buffer is full or the file ends."""
    got, view = 0, memoryview(buf).cast("B")
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


class ZarrStoreInner:
    """A zarr-python 3 ``Store`` (async) driven synchronously on zarr's own event loop."""

    def __init__(self, store: Any) -> None:
        from zarr.core.buffer import default_buffer_prototype

        self.store = store
        self._proto = default_buffer_prototype()

    def _sync(self, coro: Any) -> Any:
        from zarr.core.sync import sync

        return sync(coro)

    def get(self, key: str) -> bytes | None:
        buf = self._sync(self.store.get(key, self._proto))
        return None if buf is None else buf.to_bytes()

    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes | None]:
        from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

        def req(start: int, end: int | None) -> Any:
            if start < 0:
                return SuffixByteRequest(-start)
            if end is None:
                return OffsetByteRequest(start)
            return RangeByteRequest(start, end)

        async def run() -> list[Any]:
            import asyncio

            return await asyncio.gather(
                *(self.store.get(k, self._proto, byte_range=req(s, e)) for k, s, e in requests)
            )

        return [None if b is None else b.to_bytes() for b in self._sync(run())]

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        out = self.get_ranges([(k, -n, None) for k, n in requests])
        return [None if v is None else (v, None) for v in out]

    def set(self, key: str, value: bytes) -> None:
        self._sync(self.store.set(key, self._proto.buffer.from_bytes(bytes(value))))

    def delete(self, key: str) -> None:
        self._sync(self.store.delete(key))

    def delete_prefix(self, prefix: str) -> None:
        for k in list(self.list_prefix(prefix)):
            self.delete(k)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        async def run() -> list[str]:
            return [k async for k in self.store.list_prefix(prefix)]

        return iter(sorted(self._sync(run())))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        return _list_dir_from_keys(self.list_prefix(prefix), prefix)

    def exists(self, key: str) -> bool:
        return bool(self._sync(self.store.exists(key)))


def as_inner(store: Any, *, storage_options: Mapping[str, Any] | None = None) -> Inner:
    """Adapt ``store`` (path/URL, ``FSMap``, zarr-3 ``Store``, mapping, or an adapter) to :class:`Inner`."""
    if isinstance(store, (MappingInner, FsspecInner, ZarrStoreInner)) or (
        isinstance(store, Inner) and not isinstance(store, Mapping)
    ):
        return store
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if isinstance(store, str) and not storage_options and "://" not in store and "::" not in store:
        return FsspecInner.local(store)  # a plain local path: no fsspec import on the read path
    import fsspec

    if isinstance(store, str):
        fs, root = fsspec.core.url_to_fs(store, **dict(storage_options or {}))
        return FsspecInner(fs, root)
    if isinstance(store, fsspec.FSMap):
        return FsspecInner(store.fs, store.root)
    try:
        from zarr.abc.store import Store as ZarrStore
    except ImportError:  # pragma: no cover - zarr is a dependency
        ZarrStore = ()  # type: ignore[assignment]
    if isinstance(store, ZarrStore):
        return ZarrStoreInner(store)
    if isinstance(store, MutableMapping):
        return MappingInner(store)
    raise TypeError(f"cannot use {type(store).__name__} as a store: expected a path/URL, a mapping or a zarr Store")


def unique_suffix() -> str:
    return uuid.uuid4().hex[:12]
