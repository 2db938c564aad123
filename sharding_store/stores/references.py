"""A reference file as a migration's destination, and its guarded reader (issue 24).

A virtual migration into ``DST.json`` writes no chunk byte: :class:`ReferenceFileSink` is
the store the migration driver writes into (documents through ``set``, chunks and shards
through :meth:`~ReferenceFileSink.put_reference`) and, at :meth:`~ReferenceFileSink.commit`
(after a complete run), writes one JSON file atomically: the fsspec reference format,
version 1::

    {"version": 1,
     "refs": {"zarr.json": "<the document as JSON text>",
              "a/c/0/0": ["file:///data/src/a/0.0", 0, 5120], ...},
     "sharding-store": {"schema": 1, "source": "<SRC as given>", "message": "...",
                        "objects": {"file:///data/src/a/0.0": {"size": 5120, "modified_ns": ...},
                                    "s3://bucket/src/a/0.0": {"size": 5120, "etag": "\\"...\\""}}}}

fsspec ignores the ``"sharding-store"`` key: ``fsspec.filesystem("reference", fo=...)``
reads the file with no other dependency, but nothing there notices a source object that
changed since. :func:`open_references` is the guarded way: a zarr-python 3 store over the
same ``ReferenceFileSystem`` whose target filesystem checks, before and after every read,
that the object is what the file recorded (locally its size and ``st_mtime_ns`` from
``fstat`` of the descriptor read; on S3 a ranged GET with ``If-Match`` on the recorded
ETag), else :class:`~sharding_store.errors.SourceChangedError` naming the URL and what
changed. A rewrite that keeps both the size and the modification time (``cp -p``/``rsync -t``
of other bytes) cannot be told locally.

Memory: one small tuple per reference (an index into the table of URLs, the offset, the
length) and one entry per source object; the documents as bytes.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import DestinationExistsError, ObjectChangedError, SourceChangedError, StoreNotFoundError
from .base import BaseInner, ChunkRef, Inner, Location, RangeRequest, Tail, Version, slice_range
from .local import write_all

__all__ = ["REFERENCE_KEY", "ReferenceFileSink", "open_references", "read_reference_file"]

#: the top-level key of a reference file holding what sharding-store recorded
REFERENCE_KEY = "sharding-store"
SCHEMA = 1
#: one recorded source object: (size, ETag or None, st_mtime_ns or None)
ObjectInfo = tuple[int, "str | None", "int | None"]


def _split(path: str) -> tuple[str, str]:
    """``(directory URL, file name)`` of a reference file's path or URL."""
    path = path.rstrip("/")
    head, _, name = path.rpartition("/")
    if not name:
        raise StoreNotFoundError(f"{path}: not a file name", key=path)
    return head or ".", name


def read_reference_file(path: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The JSON object of the reference file at ``path`` (None: no such file).
    :class:`StoreNotFoundError` when it is not a version-1 reference file."""
    from . import as_inner

    head, name = _split(path)
    raw = as_inner(head, storage_options=storage_options).get(name)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("refs"), dict):
        raise StoreNotFoundError(f"{path}: not an fsspec reference file (version 1, with refs)", key=path)
    return doc


def _objects(doc: Mapping[str, Any], path: str) -> dict[str, ObjectInfo]:
    """The source objects a reference file recorded, by URL."""
    block = doc.get(REFERENCE_KEY)
    objects = block.get("objects") if isinstance(block, dict) else None
    out: dict[str, ObjectInfo] = {}
    for url, info in (objects or {}).items():
        if not isinstance(info, dict) or not isinstance(info.get("size"), int):
            raise StoreNotFoundError(f"{path}: {REFERENCE_KEY}.objects[{url!r}] has no size", key=path)
        out[url] = (info["size"], info.get("etag"), info.get("modified_ns"))
    return out


class ReferenceFileSink(BaseInner):
    """A reference file being written (or read): documents and references held here,
    written as one file at :meth:`commit`. Opened on an existing file it holds that file's
    content (a migration then finds DST not empty; ``--overwrite`` empties this, and the
    commit replaces the file). ``read_only``: for verify and readers (no commit)."""

    def __init__(self, path: str, storage_options: Mapping[str, Any] | None = None, *, read_only: bool = False,
                 source: str = "", source_options: Mapping[str, Any] | None = None) -> None:
        from . import as_inner

        self.path = path
        self.storage_options = dict(storage_options or {})
        head, self.name = _split(path)
        self.parent: Inner = as_inner(head, storage_options=storage_options)
        self.read_only = read_only
        self.docs: dict[str, bytes] = {}
        self.refs: dict[str, tuple[int, int, int]] = {}  # key -> (URL number, offset, length)
        self.urls: list[str] = []
        self.numbers: dict[str, int] = {}
        self.objects: list[ObjectInfo] = []
        self.source = source
        self.source_options = dict(source_options if source_options is not None else self.storage_options)
        self._lock = threading.Lock()
        self._reader = Guard(_Objects(self), self.source_options)
        self._load()

    def __repr__(self) -> str:
        return f"ReferenceFileSink({self.path!r})"

    def _load(self) -> None:
        try:
            doc = read_reference_file(self.path, self.storage_options)
        except StoreNotFoundError as e:
            if self.read_only:
                raise
            raise DestinationExistsError(f"{e}; choose another destination (a reference file ends in .json)",
                                         key=self.path) from None
        if doc is None:
            if self.read_only:
                raise StoreNotFoundError(f"{self.path}: no such reference file", key=self.path)
            return
        objects = _objects(doc, self.path)
        block = doc.get(REFERENCE_KEY)
        self.source = self.source or (block.get("source", "") if isinstance(block, dict) else "")
        for key, value in doc["refs"].items():
            if isinstance(value, str):
                self.docs[key] = base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode()
            elif isinstance(value, dict):
                self.docs[key] = json.dumps(value).encode()
            elif isinstance(value, list) and len(value) == 3:
                url, offset, length = value
                size = objects.get(url, (offset + length, None, None))
                self._add(key, url, offset, length, size)
            else:
                raise StoreNotFoundError(f"{self.path}: refs[{key!r}] is neither a document nor [url, offset, length]",
                                         key=key)

    # ------------------------------------------------------------------ references
    def _add(self, key: str, url: str, offset: int, length: int, info: ObjectInfo) -> None:
        with self._lock:
            number = self.numbers.get(url)
            if number is None:
                number = self.numbers[url] = len(self.urls)
                self.urls.append(url)
                self.objects.append(info)
            elif self.objects[number] != info:
                raise ObjectChangedError(f"{url}: changed between two references to it ({self.objects[number]} "
                                         f"then {info})", key=url)
            self.docs.pop(key, None)
            self.refs[key] = (number, offset, length)

    def takes_references(self) -> bool:
        return not self.read_only

    def put_reference(self, key: str, ref: ChunkRef) -> None:
        """``key`` reads bytes ``[offset, offset+length)`` of ``ref.url``; the object's size and
        ETag or modification time are recorded for the guard."""
        if ref.offset < 0 or ref.length < 0 or ref.offset + ref.length > ref.object_size:
            raise ObjectChangedError(f"{ref.url}: [{ref.offset}, {ref.offset + ref.length}) does not lie inside its "
                                     f"{ref.object_size} bytes", key=ref.url)
        self._add(key, ref.url, ref.offset, ref.length, (ref.object_size, ref.etag, ref.modified_ns))

    def reference(self, key: str) -> ChunkRef | None:
        """The reference ``key`` holds (None: a document, or nothing)."""
        got = self.refs.get(key)
        if got is None:
            return None
        number, offset, length = got
        size, etag, modified_ns = self.objects[number]
        return ChunkRef(self.urls[number], offset, length, size, etag=etag, modified_ns=modified_ns)

    def references(self) -> Iterator[tuple[str, ChunkRef]]:
        """Every ``(key, reference)``, sorted by key."""
        for key in sorted(self.refs):
            ref = self.reference(key)
            assert ref is not None
            yield key, ref

    # ------------------------------------------------------------------ the file
    def encode(self, message: str = "") -> bytes:
        """The reference file's bytes (:meth:`pieces` joined)."""
        return b"".join(self.pieces(message))

    def pieces(self, message: str = "", batch: int = 4096) -> Iterator[bytes]:
        """The reference file in pieces of ``batch`` entries, never all of it at once besides
        what this sink holds: documents inline as text (base64 where not UTF-8), references as
        ``[url, offset, length]``, keys sorted; then the source objects as recorded."""
        dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        yield b'{"version":1,"refs":{'
        keys = sorted({*self.docs, *self.refs})
        for at in range(0, len(keys), batch):
            out = []
            for key in keys[at : at + batch]:
                doc = self.docs.get(key)
                if doc is None:
                    number, offset, length = self.refs[key]
                    value: Any = [self.urls[number], offset, length]
                else:
                    try:
                        value = doc.decode()
                    except UnicodeDecodeError:
                        value = "base64:" + base64.b64encode(doc).decode()
                out.append(f"{dumps(key)}:{dumps(value)}")
            yield ("," if at else "").encode() + ",".join(out).encode()
        head = {"schema": SCHEMA, "source": self.source, "message": message}
        yield f'}},{dumps(REFERENCE_KEY)}:{dumps(head)[:-1]},"objects":{{'.encode()
        for at in range(0, len(self.urls), batch):
            out = []
            for url, (size, etag, modified_ns) in zip(self.urls[at : at + batch], self.objects[at : at + batch]):
                info: dict[str, Any] = {"size": size}
                if etag is not None:
                    info["etag"] = etag
                if modified_ns is not None:
                    info["modified_ns"] = modified_ns
                out.append(f"{dumps(url)}:{dumps(info)}")
            yield ("," if at else "").encode() + ",".join(out).encode()
        yield b"}}}"

    def commit(self, message: str) -> str:
        """Write the reference file, atomically (a local file written piece by piece and
        renamed into place; one PUT on an object store); returns its name."""
        if self.read_only:
            raise StoreNotFoundError(f"{self.path}: opened read-only", key=self.path)
        local = self.parent.create_local(self.name)
        if local is None:
            self.parent.set(self.name, self.encode(message))
            return self.path
        with local as fd:
            for piece in self.pieces(message):
                write_all(fd, piece)
        return self.path

    # ------------------------------------------------------------------ the store interface
    def _read(self, key: str, start: int, end: int | None) -> bytes | None:
        doc = self.docs.get(key)
        if doc is not None:
            return slice_range(doc, start, end)
        got = self.refs.get(key)
        if got is None:
            return None
        number, offset, length = got
        lo = max(0, length + start) if start < 0 else min(start, length)
        hi = length if end is None else max(lo, min(end, length))
        return self._reader.read(self.urls[number], offset + lo, offset + hi)

    def get(self, key: str) -> bytes | None:
        return self._read(key, 0, None)

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        return [self._read(k, start, end) for k, start, end in requests]

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        out: list[Tail | None] = []
        for key, n in requests:
            data = self._read(key, -n, None) if n > 0 else self._read(key, 0, 0)
            out.append(None if data is None else Tail(data, self.size(key), None))
        return out

    def set(self, key: str, value: bytes) -> None:
        if self.read_only:
            raise StoreNotFoundError(f"{self.path}: opened read-only", key=key)
        with self._lock:
            self.refs.pop(key, None)
            self.docs[key] = bytes(value)

    def delete(self, key: str) -> None:
        with self._lock:
            self.docs.pop(key, None)
            self.refs.pop(key, None)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return iter(sorted(k for k in {*self.docs, *self.refs} if k.startswith(prefix)))

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        for key in self.list_prefix(prefix):
            yield key, self.size(key)

    def exists(self, key: str) -> bool:
        return key in self.docs or key in self.refs

    def size(self, key: str) -> int | None:
        doc = self.docs.get(key)
        if doc is not None:
            return len(doc)
        got = self.refs.get(key)
        return None if got is None else got[2]

    def location(self) -> Location:
        where = self.parent.location()
        return Location(where.kind, where.authority, posixpath.join(where.path, self.name))

    def describe(self) -> str:
        return self.path


# --------------------------------------------------------------------------- the guard


class _Objects(Mapping[str, ObjectInfo]):
    """A sink's recorded source objects by URL (a view: nothing held twice)."""

    def __init__(self, sink: ReferenceFileSink) -> None:
        self.sink = sink

    def __getitem__(self, url: str) -> ObjectInfo:
        return self.sink.objects[self.sink.numbers[url]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sink.urls)

    def __len__(self) -> int:
        return len(self.sink.urls)


class Guard:
    """Reads bytes of source objects by URL, each checked against what was recorded of it
    (``objects``: URL -> (size, ETag, st_mtime_ns)) before and after the read:
    :class:`SourceChangedError` naming the URL and what changed."""

    def __init__(self, objects: Mapping[str, ObjectInfo], storage_options: Mapping[str, Any] | None = None) -> None:
        self.objects = objects
        self.storage_options = dict(storage_options or {})
        self._stores: dict[str, Inner] = {}

    def read(self, url: str, start: int, end: int) -> bytes:
        info = self.objects.get(url)
        if info is None:
            raise SourceChangedError(f"{url}: referenced, but the reference file records nothing of it", key=url)
        if end > info[0]:
            raise SourceChangedError(f"{url}: a reference reaches byte {end}, past the object's recorded {info[0]} "
                                     "bytes", key=url)
        if url.startswith("file://"):
            return _read_local(url, url[len("file://"):], start, end, info)
        if url.startswith("s3://"):
            return self._read_s3(url, start, end, info)
        raise SourceChangedError(f"{url}: no guarded reader for this protocol", key=url)

    def _read_s3(self, url: str, start: int, end: int, info: ObjectInfo) -> bytes:
        from . import as_inner

        bucket, _, key = url[len("s3://"):].partition("/")
        store = self._stores.get(bucket)
        if store is None:
            store = self._stores[bucket] = as_inner(f"s3://{bucket}", storage_options=self.storage_options)
        size, etag = info[0], info[1]
        try:
            got = store.get_ranges([(key, start, end)], versions=[etag] if etag else None)[0]
        except ObjectChangedError:
            now = store.size(key)
            what = "deleted" if now is None else f"rewritten (ETag no longer {etag}; {now} bytes, was {size})"
            raise SourceChangedError(f"{url}: {what} since the references were taken", key=url) from None
        if got is None or len(got) != end - start:
            raise SourceChangedError(f"{url}: deleted or shortened since the references were taken", key=url)
        return got


def _changed(url: str, st: os.stat_result, info: ObjectInfo) -> str | None:
    """What differs between a file's ``fstat`` and what was recorded of it (None: nothing)."""
    size, _, modified_ns = info
    if st.st_size != size:
        return f"now {st.st_size} bytes, was {size}"
    if modified_ns is not None and st.st_mtime_ns != modified_ns:
        return f"modified since (st_mtime_ns {st.st_mtime_ns}, was {modified_ns})"
    return None


def _read_local(url: str, path: str, start: int, end: int, info: ObjectInfo) -> bytes:
    """Bytes ``[start, end)`` of a local file, its ``fstat`` compared with ``info`` before
    and after the read (of the descriptor read: never another file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SourceChangedError(f"{url}: deleted since the references were taken", key=url) from None
    except OSError as e:
        raise SourceChangedError(f"{url}: cannot be opened as the file it was ({e.strerror})", key=url) from None
    try:
        st = os.fstat(fd)
        what = "no longer a regular file" if not stat.S_ISREG(st.st_mode) else _changed(url, st, info)
        if what is None:
            data = os.pread(fd, end - start, start) if end > start else b""
            what = _changed(url, os.fstat(fd), info)
    finally:
        os.close(fd)
    if what is not None:
        raise SourceChangedError(f"{url}: {what}; the reference file no longer describes it", key=url)
    return data


def _guarded_fs(objects: Mapping[str, ObjectInfo], storage_options: Mapping[str, Any] | None) -> Any:
    """An asynchronous fsspec filesystem whose ``cat_file(url, start, end)`` is the guard's
    read, for ``ReferenceFileSystem``'s ``fs=`` (one per protocol)."""
    from fsspec import AbstractFileSystem
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

    guard = Guard(objects, storage_options)

    class GuardedFileSystem(AbstractFileSystem):
        protocol = ("file", "s3")
        cachable = False

        def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
            info = guard.objects.get(path)
            size = info[0] if info is not None else 0
            lo = 0 if start is None else (max(0, size + start) if start < 0 else start)
            hi = size if end is None else (max(0, size + end) if end < 0 else end)
            return guard.read(path, lo, max(lo, hi))

    return AsyncFileSystemWrapper(GuardedFileSystem(), asynchronous=True)


def open_references(path: str, storage_options: Mapping[str, Any] | None = None, *,
                    source_options: Mapping[str, Any] | None = None) -> Any:
    """A read-only zarr-python 3 store of the reference file at ``path`` whose every read of
    a source object is checked against what the file recorded of it
    (:class:`~sharding_store.errors.SourceChangedError` naming the URL and what changed).
    ``storage_options``: for the file (and the sources, unless ``source_options``: for
    ``s3://`` sources, e.g. an endpoint and credentials)."""
    from fsspec.implementations.reference import ReferenceFileSystem
    from zarr.storage import FsspecStore

    doc = read_reference_file(path, storage_options)
    if doc is None:
        raise StoreNotFoundError(f"{path}: no such reference file", key=path)
    guarded = _guarded_fs(_objects(doc, path), storage_options if source_options is None else source_options)
    fs = ReferenceFileSystem(fo={"version": 1, "refs": doc["refs"]}, fs={"file": guarded, "s3": guarded},
                             asynchronous=True)

    class GuardedStore(FsspecStore):
        """zarr's fsspec store, a changed source raised as itself (fsspec wraps it)."""

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            try:
                return await super().get(key, prototype, byte_range)
            except Exception as e:
                raise _unwrapped(e) from None

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
            try:
                return await super().get_partial_values(prototype, key_ranges)
            except Exception as e:
                raise _unwrapped(e) from None

    return GuardedStore(fs, read_only=True, path="")


def _unwrapped(error: BaseException) -> BaseException:
    """The :class:`SourceChangedError` behind ``error`` (fsspec wraps a target's errors in
    its own ``ReferenceNotReachable``), else ``error`` itself."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, SourceChangedError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error
