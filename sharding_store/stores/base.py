"""The store interface: what the shard engine, migrate, reshard and verify may ask of a store.

A store ("inner store", below a :class:`~sharding_store.ShardingStore`) is anything with the
methods of :class:`Inner`. The *core* is what every backend has (whole gets, byte ranges,
tails of objects, atomic puts, deletes, listings); the *capabilities* (``size``,
``set_streamed``, ``read_into``, ``local_path``, ``copy_to``, ``compose``, ``compose_from_tails``, ``move``, ``create_exclusive``,
``put_if_unchanged``, ``list_sized``, ``list_unordered``, ``location``, ``describe``, ...) let a backend do better than the generic way:
a kernel copy, a server-side copy, a rename, a conditional put. :class:`BaseInner` implements every
capability from the core, so a new backend writes the core and overrides what it can do
better; wrappers (``sharding_store.testing.CountingInner``) delegate every method. Nothing
outside this package asks *which* class a store is: it calls the method.

Range requests are ``(key, start, end)``: ``start >= 0`` with ``end`` exclusive (or ``None``
for to-the-end), or ``start < 0`` with ``end is None`` for the last ``-start`` bytes.
Results may be *shorter* than requested when the object is; callers check lengths (that is
how a damaged index is caught). A missing object gives ``None``.

Versions: :meth:`Inner.get_tails` returns a :class:`Tail` carrying the object's version at
read time (``None`` when the backend cannot tell); passing those versions to
:meth:`Inner.get_ranges` makes it raise :class:`ObjectChangedError` instead of returning
bytes of another version. That is how an index and the chunks it points to are read
consistently while a writer replaces the object.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from ..errors import LinkOutsideStoreError, ObjectChangedError, StoreIOError

__all__ = [
    "BaseInner",
    "ChunkRef",
    "ComposePlan",
    "CoreInner",
    "Inner",
    "LinkOutsideStoreError",
    "Location",
    "Part",
    "ObjectChangedError",
    "RangeRequest",
    "Relation",
    "StoreIOError",
    "Tail",
    "Version",
    "in_memory",
    "list_dir_from_keys",
    "renew_after_fork",
    "slice_range",
]

RangeRequest = tuple[str, int, "int | None"]
#: an object's identity at read time; equal versions mean the same bytes
Version = Hashable
Relation = Literal["same", "inside", "contains", None]
#: one piece of an object built by :meth:`Inner.compose`: bytes ``[start, end)`` of an object
#: of the source store, or literal bytes
Part = tuple[str, int, int] | bytes
#: what :meth:`Inner.compose_from_tails` builds from the tails it read (one per source,
#: ``None`` for a missing one): ``(key, parts)`` of each object to write
ComposePlan = Callable[[list["Tail | None"]], Iterable[tuple[str, Sequence[Part]]]]
#: ranges of one object closer than this are read as one range by the generic :meth:`BaseInner.compose`
COMPOSE_GAP = 1 << 16


class Tail(NamedTuple):
    """The last bytes of an object (as asked), with what the read learnt about the object."""

    data: bytes
    #: the object's size, when the backend knows it for free (None otherwise)
    size: int | None
    #: the object's version at read time (local: device, inode, mtime, size; S3: ETag), or None
    version: Version | None = None


class ChunkRef(NamedTuple):
    """Where the bytes of one destination object are: bytes ``[offset, offset+length)`` of a
    source object, with what that object was when the reference was taken (issue 24: a
    virtual migration writes these instead of bytes; a reader checks them before trusting
    the bytes it reads). Immutable; a named tuple, made once per shard of a virtual
    migration at a fifth of a frozen dataclass's cost."""

    #: absolute fsspec URL: ``file:///abs/path/in/store`` or ``s3://bucket/key``
    url: str
    offset: int
    length: int
    #: the source object's whole size at reference time
    object_size: int
    #: object stores: the ETag as the server sent it
    etag: str | None = None
    #: aware UTC last-modified (local: from ``st_mtime_ns``)
    modified: datetime | None = None
    #: local: the exact ``st_mtime_ns`` (``modified`` keeps microseconds only)
    modified_ns: int | None = None
    #: local: the file's ``st_ino``: a file replaced by another (a rename over it, as ``rsync``
    #: and ``mv`` do) is told apart even with the same size and mtime. Not ``st_dev`` (not
    #: stable across a remount or reboot: NFS, btrfs, overlayfs number devices as mounted),
    #: not ``st_ctime`` (a chmod/chown changes it: an archive made read-only stays readable)
    inode: int | None = None


@dataclass(frozen=True)
class Location:
    """Where a store's objects live, spelled one way (issue 12: store identity).

    ``kind``: ``"file"`` for a local directory, else the fsspec protocol (``"s3"``,
    ``"memory"``, ...), ``"mapping"``/``"zarr"`` for in-process objects. ``authority``:
    the endpoint of an object store ("" for the default one and locally), ``id()`` of an
    in-process object. ``path``: absolute, symlink-resolved and without a trailing slash
    locally; the bucket and prefix on object stores ("" for an in-process object).
    """

    kind: str
    authority: str
    path: str

    def relation(self, other: Location) -> Relation:
        """``"same"`` store, this one ``"inside"`` the other, this one ``"contains"`` it, or None."""
        if (self.kind, self.authority) != (other.kind, other.authority):
            return None
        if self.path == other.path:
            return "same"
        if _under(self.path, other.path):
            return "inside"
        if _under(other.path, self.path):
            return "contains"
        if self.kind == "file":
            return _file_relation(self.path, other.path)
        return None

    def __str__(self) -> str:
        if self.kind == "file":
            return self.path
        authority = f"[{self.authority}]" if self.authority else ""
        return f"{self.kind}://{authority}{self.path}"


def _under(path: str, top: str) -> bool:
    """``path`` strictly below ``top`` (component-wise: ``/a/bc`` is not below ``/a/b``)."""
    if top in ("", "/"):
        return path not in ("", "/")
    return path.startswith(top + "/")


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _ancestor_ids(path: str) -> set[tuple[int, int]]:
    """(device, inode) of every existing directory strictly above ``path``."""
    ids = set()
    while path not in ("", "/"):
        path = path.rpartition("/")[0] or "/"
        found = _file_id(path)
        if found is not None:
            ids.add(found)
    return ids


def _file_relation(a: str, b: str) -> Relation:
    """The relation of two local directories (``realpath`` spellings) that their paths
    did not show: one directory seen through a bind mount, or a case-insensitive
    filesystem (``~/Data`` and ``~/data``), is told by its (device, inode)."""
    ida, idb = _file_id(a), _file_id(b)
    if ida is not None and ida == idb:
        return "same"
    if idb is not None and idb in _ancestor_ids(a):
        return "inside"
    if ida is not None and ida in _ancestor_ids(b):
        return "contains"
    return None


@runtime_checkable
class CoreInner(Protocol):
    """The methods every store has; :func:`~sharding_store.stores.as_inner` completes such an
    object with :class:`BaseInner`'s generic capabilities."""

    def get(self, key: str) -> bytes | None: ...
    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes | None]: ...
    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Any]: ...
    def set(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def list_prefix(self, prefix: str) -> Iterator[str]: ...
    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]: ...
    def exists(self, key: str) -> bool: ...


@runtime_checkable
class Inner(Protocol):
    """The whole store interface (core and capabilities): see the module docstring."""

    def get(self, key: str) -> bytes | None: ...
    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]: ...
    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]: ...
    def set(self, key: str, value: bytes) -> None: ...
    def set_streamed(self, key: str, pieces: Iterable[bytes]) -> int: ...
    def create_exclusive(self, key: str, value: bytes) -> bool: ...
    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool: ...
    def temp_leftovers(self, key: str) -> list[str]: ...
    def remove_temp_leftovers(self, key: str) -> int: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def list_prefix(self, prefix: str) -> Iterator[str]: ...
    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]: ...
    def list_unordered(self, prefix: str) -> Iterator[tuple[str, int | None]]: ...
    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int | None: ...
    def read_into(self, key: str, alloc: Callable[[int], Any]) -> Tail | None: ...
    def local_path(self, key: str) -> str | None: ...
    def open_local(self, key: str) -> int | None: ...
    def create_local(self, key: str) -> AbstractContextManager[int] | None: ...
    def fs_path(self, key: str) -> tuple[Any, str] | None: ...
    def can_copy_to(self, dst: Inner, *, append: bool = False) -> bool: ...
    def copy_to(
        self, key: str, dst: Inner, dst_key: str, *, size: int | None = None, append: bytes = b"",
        version: Version | None = None,
    ) -> bool: ...
    def can_compose_to(self, dst: Inner) -> bool: ...
    def compose(
        self, key: str, parts: Sequence[Part], *, into: Inner | None = None,
        versions: Mapping[str, Version | None] | None = None,
    ) -> int: ...
    def compose_from_tails(
        self, sources: Sequence[tuple[str, int]], plan: ComposePlan, *, into: Inner | None = None,
        done: Callable[[str, int], None] | None = None,
    ) -> None: ...
    def move(self, key: str, dst_key: str) -> None: ...
    def tidy(self, prefix: str = "", *, keep_top: bool = True) -> None: ...
    def location(self) -> Location: ...
    def describe(self) -> str: ...
    def reference_to(self, key: str, offset: int, length: int, version: Version | None = None) -> ChunkRef | None: ...
    def tails_to_refer(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]: ...
    def takes_references(self) -> bool: ...
    def put_reference(self, key: str, ref: ChunkRef) -> None: ...
    def put_references(self, array: str, refs: Sequence[tuple[str, tuple[int, ...], ChunkRef]]) -> None: ...
    def commit(self, message: str) -> str: ...


def in_memory(inner: Inner) -> bool:
    """Whether a store is an object of this process (a ``dict``, a user's ``MutableMapping``,
    a zarr ``MemoryStore``): its calls hold the interpreter and wait on no I/O, so threads
    have nothing to overlap and only add a hand-off per call."""
    return inner.location().kind == "mapping"


def slice_range(data: bytes, start: int, end: int | None) -> bytes:
    """What a range request returns from a whole object's bytes."""
    if start < 0:
        return data[max(0, len(data) + start) :]
    return data[start:end]


def list_dir_from_keys(keys: Iterable[str], prefix: str) -> tuple[list[str], list[str]]:
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


class BaseInner:
    """Generic capabilities from the core methods (subclasses implement ``get``,
    ``get_ranges``, ``get_tails``, ``set``, ``delete``, ``list_prefix``, ``exists``).

    Each default is correct for any store and costs what it says; backends override the
    ones they can do better.
    """

    # ------------------------------------------------------------------ core (abstract)
    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        raise NotImplementedError

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        raise NotImplementedError

    def set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list_prefix(self, prefix: str) -> Iterator[str]:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------ generic capabilities
    def delete_prefix(self, prefix: str) -> None:
        """Every object under ``prefix`` (a listing, then one delete each)."""
        for k in list(self.list_prefix(prefix)):
            self.delete(k)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        return list_dir_from_keys(self.list_prefix(prefix), prefix)

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """Sorted ``(key, size)`` under ``prefix``; sizes None where the listing has none."""
        for key in self.list_prefix(prefix):
            yield key, None

    def list_unordered(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """Every ``(key, size)`` under ``prefix`` once, in whatever order the store lists
        cheapest, for a caller that needs no order (no merge with another listing). Here:
        :meth:`list_sized` (a store that lists sorted anyway); a store that must sort
        (a plain mapping) streams instead of holding its keys."""
        return self.list_sized(prefix)

    def set_streamed(self, key: str, pieces: Iterable[bytes]) -> int:
        """Write ``key``, atomically, as the concatenation of ``pieces`` (an iterable producing
        the bytes as they are made); returns its size. Readers see the old object (or none)
        until the whole new one: an exception from ``pieces`` or from the store leaves ``key``
        as it was. Where a store can, it never holds more than a part of the object (a local
        temporary file renamed into place, a multipart upload on S3): a reference file of
        millions of entries. Here: the pieces joined, one ``set``."""
        value = b"".join(pieces)
        self.set(key, value)
        return len(value)

    def size(self, key: str) -> int | None:
        """The object's size (here: one whole get), None when missing."""
        value = self.get(key)
        return None if value is None else len(value)

    def read_into(self, key: str, alloc: Callable[[int], Any]) -> Tail | None:
        """A whole object in a caller-owned buffer: ``alloc(n)`` returns a writable buffer of
        at least ``n`` bytes. Returns a :class:`Tail` whose ``data`` is the prefix of that
        buffer holding the object (with its size and version), None when the object is
        missing. Here: one get and a copy (no version)."""
        value = self.get(key)
        if value is None:
            return None
        buf = alloc(len(value))
        memoryview(buf).cast("B")[: len(value)] = value
        return Tail(buf[: len(value)], len(value), None)

    def local_path(self, key: str) -> str | None:
        """The path of the key's local file (which need not exist yet), when the store is a
        local directory and the path stays inside it; else None. For messages and to tell a
        local store: opening it by path would follow a directory swapped for a link since
        (use :meth:`open_local` and :meth:`create_local`)."""
        return None

    def open_local(self, key: str) -> int | None:
        """A read descriptor of the key's local file (the caller closes it), opened without
        following a link out of the store; None when the store is not local or the key is
        missing."""
        return None

    def create_local(self, key: str) -> AbstractContextManager[int] | None:
        """A context manager giving the descriptor of a new local file that becomes the key,
        atomically, when the block ends without an error (and is removed on an error); None
        when the store is not a local directory. For kernel copies into this store."""
        return None

    def fs_path(self, key: str) -> tuple[Any, str] | None:
        """``(fsspec filesystem, path)`` of a remote object, for server-side copies; else None."""
        return None

    def can_copy_to(self, dst: Inner, *, append: bool = False) -> bool:
        """Whether :meth:`copy_to` can copy from this store to ``dst`` without the bytes
        passing through this process (object stores cannot ``append``)."""
        return False

    def copy_to(
        self, key: str, dst: Inner, dst_key: str, *, size: int | None = None, append: bytes = b"",
        version: Version | None = None,
    ) -> bool:
        """Copy one object (plus ``append``) to ``dst_key`` of ``dst`` without its bytes
        passing through this process; False when this pair of stores cannot (the caller
        reads and writes). ``size``: the object's size if known (spares a request);
        ``version``: a version from :meth:`get_tails`; the copy raises
        :class:`ObjectChangedError` rather than copy another version."""
        return False

    def can_compose_to(self, dst: Inner) -> bool:
        """Whether :meth:`compose` into ``dst`` builds objects without their bytes passing
        through this process (else it reads and writes, which callers may do better)."""
        return False

    def compose(
        self, key: str, parts: Sequence[Part], *, into: Inner | None = None,
        versions: Mapping[str, Version | None] | None = None,
    ) -> int:
        """Write object ``key`` of ``into`` (default: this store), atomically, as the
        concatenation of ``parts``: byte ranges ``(src_key, start, end)`` of this store's
        objects and literal ``bytes``. Returns its size.

        ``versions``: source key -> a version from :meth:`get_tails`; the ranges are read
        from that version or :class:`ObjectChangedError` is raised (also when a range
        reaches past its object's end or the object is gone: the caller computed the ranges
        from what it read before). Here: the ranges of each source object coalesced (one
        range per object unless they lie more than :data:`COMPOSE_GAP` apart), all in one
        :meth:`get_ranges` call, then one ``set``.
        """
        ranges = [p for p in parts if not isinstance(p, (bytes, bytearray, memoryview))]
        spans = coalesce_parts(ranges)
        requests = [(k, lo, hi) for k, lo, hi, _ in spans]
        if versions and any(versions.get(k) is not None for k, _, _ in requests):
            blobs = self.get_ranges(requests, versions=[versions.get(k) for k, _, _ in requests])
        else:
            blobs = self.get_ranges(requests) if requests else []
        pieces: list[bytes | memoryview] = []
        at: dict[tuple[str, int, int], memoryview] = {}
        for (k, lo, hi, members), blob in zip(spans, blobs):
            if blob is None or len(blob) < hi - lo:
                raise ObjectChangedError(
                    f"{k}: shorter than {hi} bytes or gone since its ranges were computed (is another process "
                    "writing?)", key=k,
                )
            view = memoryview(blob)
            for start, end in members:
                at[(k, start, end)] = view[start - lo : end - lo]
        for p in parts:
            pieces.append(p if isinstance(p, (bytes, bytearray, memoryview)) else at[p])
        value = b"".join(pieces)
        (self if into is None else into).set(key, value)
        return len(value)

    def compose_from_tails(
        self, sources: Sequence[tuple[str, int]], plan: ComposePlan, *, into: Inner | None = None,
        done: Callable[[str, int], None] | None = None,
    ) -> None:
        """Read the last ``n`` bytes of each ``(key, n)`` of ``sources`` (as :meth:`get_tails`),
        then write each object ``plan(tails)`` names, as :meth:`compose` would, from ranges
        of those sources *as read*: a source that changed since raises
        :class:`ObjectChangedError`. ``done(key, size)`` after each object is written.

        Why one call: a store that holds open what it read (local files) copies from the
        very descriptors it read the tails from, one open per source (reshard reads a
        shard's index and copies its payload). Here: :meth:`get_tails`, then :meth:`compose`
        with the tails' versions."""
        tails = self.get_tails(sources) if sources else []
        versions = {k: t.version for (k, _), t in zip(sources, tails) if t is not None}
        for key, parts in plan(tails):
            n = self.compose(key, parts, into=into, versions=versions)
            if done is not None:
                done(key, n)

    def move(self, key: str, dst_key: str) -> None:
        """Move an object within this store (here: get, set, delete); a missing source
        whose destination exists is taken as a move already done."""
        value = self.get(key)
        if value is not None:
            self.set(dst_key, value)
            self.delete(key)

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """Create ``key`` only if it does not exist; False if it did. Here: ``exists`` then
        ``set``, which two writers can race (backends with an atomic primitive override it)."""
        if self.exists(key):
            return False
        self.set(key, value)
        return True

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """Replace ``key`` with ``value`` (None: delete it) only while it holds exactly
        ``expected`` (None: missing); False, nothing written, when it holds anything else.
        Here: ``get``, compare, ``set``: a writer between the two is overwritten (backends
        with a conditional primitive override it; see each backend's window)."""
        if expected is None:
            return not self.exists(key) if value is None else self.create_exclusive(key, value)
        if self.get(key) != expected:
            return False
        if value is None:
            self.delete(key)
        else:
            self.set(key, value)
        return True

    def temp_leftovers(self, key: str) -> list[str]:
        """Names (keys) of temporary files a killed write of ``key`` left next to it (a
        ``key`` ending in ``/``: below that prefix). Only stores whose writes leave such
        files (local directories) have any."""
        return []

    def remove_temp_leftovers(self, key: str) -> int:
        """Remove :meth:`temp_leftovers` of ``key``; how many were removed. Only call it
        where no write of ``key`` by this tool is running (a recovery that holds its claim)."""
        return 0

    def tidy(self, prefix: str = "", *, keep_top: bool = True) -> None:
        """Remove what killed writes left below ``prefix`` (temporary files) and empty
        directories (``keep_top``: keep ``prefix``'s own). Only stores with such leftovers
        (local directories) do anything; only call it where nobody else writes meanwhile."""

    def location(self) -> Location:
        return Location("mapping", str(id(self)), "")

    def describe(self) -> str:
        return type(self).__name__

    # ------------------------------------------------------------------ virtual copies (issue 24)
    def reference_to(self, key: str, offset: int, length: int, version: Version | None = None) -> ChunkRef | None:
        """SOURCE side: a :class:`ChunkRef` to bytes ``[offset, offset+length)`` of ``key``, with
        what the object is now (``version``: one from :meth:`get_tails`; the reference is of
        that version or :class:`ObjectChangedError` is raised). None: this store's objects
        have no URL another process can read (a dict, a memory store), so a virtual
        migration from it is refused; also None when the key is missing."""
        return None

    def tails_to_refer(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        """SOURCE side: :meth:`get_tails` of objects the caller takes references to next
        (:meth:`reference_to` with the versions returned, at once): a store may check what
        those references will name in the same pass (a local directory: the resolved path's
        ``lstat``, with the tail reads in one C call). Here: :meth:`get_tails`."""
        return self.get_tails(requests)

    def takes_references(self) -> bool:
        """DESTINATION side: whether :meth:`put_reference` stores references instead of bytes
        (a reference file, an Icechunk repository written virtually)."""
        return False

    def put_reference(self, key: str, ref: ChunkRef) -> None:
        """Make ``key`` a reference to ``ref``'s bytes (only where :meth:`takes_references`)."""
        raise NotImplementedError(f"{self.describe()}: this store takes bytes, not references")

    def put_references(self, array: str, refs: Sequence[tuple[str, tuple[int, ...], ChunkRef]]) -> None:
        """:meth:`put_reference` of each ``(key, chunk grid coordinates, ref)`` of the array at
        path ``array`` ("" the root), in one call where the store can batch them (a reference
        file: three SQLite statements, not two per key; Icechunk: one ``set_virtual_refs``).
        All or none where the store batches: on an error the caller may put them one by one."""
        for key, _, ref in refs:
            self.put_reference(key, ref)

    def commit(self, message: str) -> str:
        """Make what was written visible as one unit, after a complete migration (a
        reference file written at once, an Icechunk snapshot); returns its id ("" here:
        a plain store's writes are visible as they are made)."""
        return ""


class CompletedInner(BaseInner):
    """A store object with the core methods only (a hand-written wrapper), given the
    generic capabilities. Its tails carry no version: whatever it wraps, its ``get_ranges``
    cannot be asked to check one."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get(self, key: str) -> bytes | None:
        return self.store.get(key)

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        return self.store.get_ranges(requests)

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        return [None if t is None else Tail(t[0], t[1], None) for t in self.store.get_tails(requests)]

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def delete(self, key: str) -> None:
        self.store.delete(key)

    def delete_prefix(self, prefix: str) -> None:
        self.store.delete_prefix(prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return self.store.list_prefix(prefix)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        return self.store.list_dir(prefix)

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """The store's own (it may be atomic where the generic one is not)."""
        own = getattr(self.store, "create_exclusive", None)
        return own(key, value) if own is not None else super().create_exclusive(key, value)

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """The store's own (it may be atomic where the generic one is not)."""
        own = getattr(self.store, "put_if_unchanged", None)
        return own(key, value, expected) if own is not None else super().put_if_unchanged(key, value, expected)

    def location(self) -> Location:
        """The store's own location when it has one (else an in-process identity): a
        wrapper of a directory is that directory for "same store / nested" decisions."""
        own = getattr(self.store, "location", None)
        return own() if own is not None else Location("mapping", str(id(self.store)), "")

    def describe(self) -> str:
        own = getattr(self.store, "describe", None)
        return own() if own is not None else type(self.store).__name__

    def reference_to(self, key: str, offset: int, length: int, version: Version | None = None) -> ChunkRef | None:
        own = getattr(self.store, "reference_to", None)
        return own(key, offset, length, version) if own is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def coalesce_parts(
    ranges: Sequence[tuple[str, int, int]], gap: int = COMPOSE_GAP
) -> list[tuple[str, int, int, list[tuple[int, int]]]]:
    """The ranges of :meth:`Inner.compose` as ``(key, start, end, [(start, end) of each range
    inside])`` spans: the ranges of one object merged where they overlap, touch or lie
    less than ``gap`` bytes apart. Refuses a range with ``start < 0`` or ``end < start``."""
    by_key: dict[str, list[tuple[int, int]]] = {}
    for k, start, end in ranges:
        if start < 0 or end < start:
            raise ValueError(f"{k}: compose range [{start}, {end}) is not a forward range of the object")
        by_key.setdefault(k, []).append((start, end))
    spans: list[tuple[str, int, int, list[tuple[int, int]]]] = []
    for k, rs in by_key.items():
        rs = sorted(set(rs))
        lo, hi, members = rs[0][0], rs[0][1], [rs[0]]
        for start, end in rs[1:]:
            if start <= hi + gap:
                hi = max(hi, end)
                members.append((start, end))
            else:
                spans.append((k, lo, hi, members))
                lo, hi, members = start, end, [(start, end)]
        spans.append((k, lo, hi, members))
    return spans


def check_versions(key: str, expected: Version | None, actual: Version | None) -> None:
    """Raise :class:`ObjectChangedError` naming ``key`` when a version no longer holds."""
    if expected is not None and expected != actual:
        raise ObjectChangedError(
            f"{key}: the object changed between two reads of it (read it again)", key=key
        )


#: caches and locks alive in this process whose ``_after_fork()`` a forked child calls
_FORKABLE: weakref.WeakSet[Any] = weakref.WeakSet()


def renew_after_fork(obj: Any) -> None:
    """Have a forked child call ``obj._after_fork()`` (``obj`` held weakly), where it renews
    its locks (another thread of the parent may have held one at the fork, and no thread of
    the child would release it) or forgets what belongs to the parent (descriptors)."""
    _FORKABLE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORKABLE):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ForkSafeLock:
    """A process-wide lock that a forked child gets fresh, so a child forked while another
    thread held it can never inherit it held (and hang on it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        renew_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
