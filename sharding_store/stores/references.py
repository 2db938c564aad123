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
                        "objects": {"file:///data/src/a/0.0": {"size": 5120, "modified_ns": ...,
                                                               "inode": ...},
                                    "s3://bucket/src/a/0.0": {"size": 5120, "etag": "\\"...\\""}}}}

fsspec ignores the ``"sharding-store"`` key: ``fsspec.filesystem("reference", fo=...)``
reads the file with no other dependency, but nothing there notices a source object that
changed since. :func:`open_references` is the guarded way: a zarr-python 3 store over the
same ``ReferenceFileSystem`` whose target filesystem checks, before and after every read,
that the object is what the file recorded (locally its size, ``st_mtime_ns`` and
``st_ino`` from ``fstat`` of the descriptor read; on S3 a ranged GET with ``If-Match`` on
the recorded ETag), else :class:`~sharding_store.errors.SourceChangedError` naming the URL
and what changed. The inode tells a file *replaced* by another of the same size and mtime
(``rsync -t`` or ``mv`` renaming a new file over it); a file written by an earlier version
records none and is checked without it. Neither ``st_dev`` (renumbered by a remount or a
reboot on NFS, btrfs, overlayfs) nor ``st_ctime`` (changed by chmod/chown: making the
archive read-only must not break its references) is recorded. What stays undetectable
locally: the same inode rewritten in place with the same size and its mtime set back
(``cp --preserve=timestamps new old`` onto an existing ``old`` truncates and rewrites it),
and a file deleted and recreated that happens to get the freed inode number back.

Memory: flat in the number of references. The first :data:`IN_MEMORY` of them and their
source objects are held in dictionaries (a few MiB: a store of fewer shards never touches
SQLite); beyond that all of them go into a temporary SQLite file beside the destination (a
temporary directory for a remote one; unlinked once open, so a killed run leaves nothing),
one row each. A key put again (a retried unit) replaces its reference. Only the documents
(``zarr.json``, few) are held as bytes. The commit reads the references a page at a time,
sorted by key, and streams the file
(``Inner.set_streamed``): locally into a temporary file renamed into place; on S3 as a
multipart upload (parts of ``fsspec_store.S3_UPLOAD_PART`` bytes, the most it holds)
completed at the end, aborted on an error, so readers see the previous file or the whole
new one; on another object store the file is joined in memory and uploaded in one PUT.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import heapq
import json
import json.encoder
import os
import posixpath
import sqlite3
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

from ..errors import (
    DestinationExistsError,
    LinkOutsideStoreError,
    ObjectChangedError,
    SourceChangedError,
    StoreNotFoundError,
)
from ..formats.draft_metadata import json_object
from .base import BaseInner, ChunkRef, Inner, Location, RangeRequest, Tail, Version, slice_range
from .location import resolves_below

__all__ = ["REFERENCE_KEY", "ReferenceFileSink", "describe_change", "document_bytes", "open_references",
           "read_reference_file", "recorded_objects", "checked_reference", "reference_entry", "unrecorded"]

#: the top-level key of a reference file holding what sharding-store recorded
REFERENCE_KEY = "sharding-store"
SCHEMA = 1
#: one recorded source object: (size, ETag or None, st_mtime_ns or None, st_ino or None)
ObjectInfo = tuple[int, "str | None", "int | None", "int | None"]


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
    doc = json_object(raw)
    if doc is None or doc.get("version") != 1 or not isinstance(doc.get("refs"), dict):
        raise StoreNotFoundError(f"{path}: not an fsspec reference file (version 1, with refs)", key=path)
    return doc


def _count(value: Any) -> bool:
    """Whether ``value`` is a whole number >= 0 as JSON gives it (no bool, no float)."""
    return type(value) is int and value >= 0


def reference_entry(value: Any) -> tuple[str, int, int] | None:
    """``(url, offset, length)`` of a ``refs`` value that is a well-formed reference (a URL
    string, offset and length whole numbers >= 0), else None: the one test every reader of
    a reference file makes (a damaged file is refused naming the key, never an internal error)."""
    if type(value) is list and len(value) == 3 and type(value[0]) is str and _count(value[1]) and _count(value[2]):
        return value[0], value[1], value[2]
    return None


def checked_reference(path: str, key: str, value: Any) -> tuple[str, int, int]:
    """``(url, offset, length)`` of the non-document ``refs[key]`` of the reference file at
    ``path``, else :class:`StoreNotFoundError` naming the key (every reader's refusal)."""
    ref = reference_entry(value)
    if ref is None:
        raise StoreNotFoundError(f"{path}: refs[{key!r}] is neither a document nor [url, offset, length] (offset "
                                 "and length whole numbers >= 0)", key=key)
    return ref


def recorded_objects(doc: Mapping[str, Any], path: str) -> dict[str, ObjectInfo]:
    """The source objects a reference file recorded, by URL (its ``"sharding-store"`` block);
    :class:`StoreNotFoundError` naming the field that is damaged."""
    block = doc.get(REFERENCE_KEY)
    objects = block.get("objects") if isinstance(block, dict) else None
    if objects is not None and not isinstance(objects, dict):
        raise StoreNotFoundError(f"{path}: {REFERENCE_KEY}.objects is not a JSON object", key=path)
    if not objects:
        return {}
    quick = _usual_objects(objects)
    if quick is not None:
        return quick
    out: dict[str, ObjectInfo] = {}
    for url, info in objects.items():
        if type(info) is dict:  # the usual entry, its types checked in one expression
            size, etag, modified_ns, inode = info.get("size"), info.get("etag"), info.get("modified_ns"), \
                info.get("inode")  # an earlier version's file: no inode (None: not compared)
            if (type(size) is int and size >= 0 and (etag is None or type(etag) is str)
                    and (modified_ns is None or type(modified_ns) is int) and (inode is None or _count(inode))):
                out[url] = (size, etag, modified_ns, inode)
                continue
        if not isinstance(info, dict) or not _count(info.get("size")):
            raise StoreNotFoundError(f"{path}: {REFERENCE_KEY}.objects[{url!r}] has no size (a whole number >= 0)",
                                     key=path)
        etag, modified_ns, inode = info.get("etag"), info.get("modified_ns"), info.get("inode")
        if (not (etag is None or type(etag) is str) or not (modified_ns is None or type(modified_ns) is int)
                or not (inode is None or _count(inode))):
            raise StoreNotFoundError(f"{path}: {REFERENCE_KEY}.objects[{url!r}]: etag must be a string, modified_ns "
                                     "a whole number, inode a whole number >= 0", key=path)
        out[url] = (info["size"], etag, modified_ns, inode)
    return out


def _usual_objects(objects: dict[str, Any]) -> dict[str, ObjectInfo] | None:
    """:func:`recorded_objects` of an ``objects`` block whose every entry is the usual one (a
    JSON object, ``size`` a whole number >= 0, ``etag`` a string or absent/null,
    ``modified_ns`` a whole number or absent/null, ``inode`` a whole number >= 0 or
    absent/null (an earlier version's file has none): exactly what the loop there accepts), in
    a few passes of C (``map``, ``zip``, a set of the values' types) instead of Python
    steps per object; None when any entry is not (the loop then names it). Exact types:
    ``bool`` and ``float`` are types of their own in the sets, so ``true`` or ``4.0`` is
    never taken for a whole number."""
    infos = objects.values()
    try:  # dict's own methods: anything but a JSON object raises TypeError, no size KeyError
        sizes = list(map(dict.__getitem__, infos, repeat("size")))
        etags = list(map(dict.get, infos, repeat("etag")))
        times = list(map(dict.get, infos, repeat("modified_ns")))
        inodes = list(map(dict.get, infos, repeat("inode")))
    except (KeyError, TypeError):
        return None
    if (not set(map(type, sizes)) <= _INT or min(sizes) < 0 or not set(map(type, etags)) <= _STR_OR_NONE
            or not set(map(type, times)) <= _INT_OR_NONE or not set(map(type, inodes)) <= _INT_OR_NONE
            or min(filter(None, inodes), default=0) < 0):  # filter(None, ...): the inodes given (and 0s)
        return None
    return dict(zip(objects, zip(sizes, etags, times, inodes)))


_INT, _STR_OR_NONE, _INT_OR_NONE = frozenset({int}), frozenset({str, type(None)}), frozenset({int, type(None)})


def document_bytes(value: Any) -> bytes | None:
    """The bytes of a ``refs`` value that is inline data (text, ``base64:``, or a JSON object
    as some writers inline documents); None for anything else (a reference)."""
    if isinstance(value, str):
        return base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode()
    if isinstance(value, dict):
        return json.dumps(value).encode()
    return None


class _Table:
    """The references and source objects of a sink, in a temporary SQLite file beside the
    destination (a local temporary directory for a remote one), unlinked once open: memory
    stays flat in the number of references (SQLite's page cache, a few MiB), a key put again
    (a retried unit) replaces its row (the last writer wins), and every read the driver and
    ``verify`` make is one indexed lookup. Not thread-safe: the sink's lock serialises it."""

    def __init__(self, where: str | None) -> None:
        try:
            fd, name = tempfile.mkstemp(prefix=".sharding-store-refs-", suffix=".sqlite", dir=where)
        except OSError:  # a directory this process may not write (verify of a file on a read-only share)
            fd, name = tempfile.mkstemp(prefix=".sharding-store-refs-", suffix=".sqlite")
        os.close(fd)
        try:
            self.db = sqlite3.connect(name, check_same_thread=False, isolation_level=None)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)  # the open connection keeps it; nothing is left after a kill
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "temp_store=FILE", "cache_size=-4096"):
            self.db.execute(f"PRAGMA {pragma}")
        self.db.execute("CREATE TABLE objects (id INTEGER PRIMARY KEY, url TEXT UNIQUE NOT NULL, size INTEGER NOT NULL,"
                        " etag TEXT, modified_ns INTEGER, inode INTEGER)")
        self.db.execute("CREATE TABLE refs (key TEXT PRIMARY KEY, object INTEGER NOT NULL, offset INTEGER NOT NULL,"
                        " length INTEGER NOT NULL) WITHOUT ROWID")
        self.db.execute("BEGIN")  # one transaction for the sink's life: nothing is ever synced

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()

    def add(self, key: str, url: str, offset: int, length: int, info: ObjectInfo) -> None:
        """``key`` -> bytes of ``url``; the object's ``info`` recorded once (a second
        reference to it with other ``info``: :class:`ObjectChangedError`)."""
        got = self.db.execute("INSERT OR IGNORE INTO objects (url, size, etag, modified_ns, inode) VALUES (?, ?, ?, ?, "
                              "?)", (url, *info))
        number = got.lastrowid if got.rowcount == 1 else None
        if number is None:
            number, *known = self.db.execute("SELECT id, size, etag, modified_ns, inode FROM objects WHERE url = ?",
                                             (url,)).fetchone()
            if tuple(known) != info:
                raise _changed_object(url, tuple(known), info)
        self.db.execute("INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)", (key, number, offset, length))

    def add_many(self, refs: Sequence[tuple[str, str, int, int, ObjectInfo]]) -> None:
        """:meth:`add` of each ``(key, url, offset, length, info)`` in two statements: the batch's
        objects inserted with the next free ids, then the refs. Where an object was recorded
        already (a unit put again) the ids and infos are read back in one query; an object
        whose recorded info differs raises :class:`ObjectChangedError` before any ref is
        inserted (all or none: the objects this batch inserted are deleted again; the table
        keeps no journal to roll back)."""
        db = self.db
        first = _batch_objects(refs)
        top = db.execute("SELECT max(id) FROM objects").fetchone()[0] or 0
        ids = {url: top + n for n, url in enumerate(first, 1)}  # what each new object gets
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO objects (id, url, size, etag, modified_ns, inode) VALUES (?, ?, ?, ?, ?, "
                       "?)",
                       [(ids[url], url, *info) for url, info in first.items()])
        if db.total_changes - before != len(first):  # some recorded already: their ids and infos read back
            known = self._known(list(first))
            for url, info in first.items():
                if known[url][1] != info:
                    db.execute("DELETE FROM objects WHERE id > ?", (top,))  # those this batch inserted
                    raise _changed_object(url, known[url][1], info)
            ids = {url: number for url, (number, _) in known.items()}
        db.executemany("INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)",
                       [(key, ids[url], offset, length) for key, url, offset, length, _ in refs])

    def _known(self, urls: Sequence[str]) -> dict[str, tuple[int, ObjectInfo]]:
        """The ids and recorded infos of the objects ``urls`` (each recorded)."""
        known: dict[str, tuple[int, ObjectInfo]] = {}
        for at in range(0, len(urls), 500):  # well under SQLite's bound on a statement's parameters
            part = urls[at : at + 500]
            for number, url, *info in self.db.execute(f"SELECT id, url, size, etag, modified_ns, inode FROM objects "
                                                      f"WHERE url IN ({','.join('?' * len(part))})", part):
                known[url] = (number, tuple(info))  # four columns
        return known

    def get(self, key: str) -> tuple[str, int, int, ObjectInfo] | None:
        """``(url, offset, length, info)`` of ``key`` (None: no reference)."""
        row = self.db.execute("SELECT url, offset, length, size, etag, modified_ns, inode FROM refs JOIN objects "
                              "ON objects.id = refs.object WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row[0], row[1], row[2], (row[3], row[4], row[5], row[6]))

    def length(self, key: str) -> int | None:
        row = self.db.execute("SELECT length FROM refs WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def object(self, url: str) -> ObjectInfo | None:
        row = self.db.execute("SELECT size, etag, modified_ns, inode FROM objects WHERE url = ?", (url,)).fetchone()
        return None if row is None else (row[0], row[1], row[2], row[3])

    def delete(self, key: str) -> None:
        self.db.execute("DELETE FROM refs WHERE key = ?", (key,))

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM refs").fetchone()[0])

    def count_objects(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM objects").fetchone()[0])

    def page(self, after: str | None, prefix: str, n: int) -> list[tuple[str, str, int, int]]:
        """Up to ``n`` ``(key, url, offset, length)``, sorted by key (code points: SQLite
        compares UTF-8 bytes), from ``prefix`` on, or past ``after``."""
        where, arg = ("key >= ?", prefix) if after is None else ("key > ?", after)
        return self.db.execute(f"SELECT key, url, offset, length FROM refs JOIN objects ON objects.id = refs.object "
                               f"WHERE {where} ORDER BY key LIMIT ?", (arg, n)).fetchall()

    def objects_after(self, after: int, n: int) -> list[tuple[int, str, int, str | None, int | None, int | None]]:
        """Up to ``n`` recorded objects with ids past ``after``, in the order first referred to."""
        return self.db.execute("SELECT id, url, size, etag, modified_ns, inode FROM objects WHERE id > ? ORDER BY id "
                               "LIMIT ?", (after, n)).fetchall()


def _changed_object(url: str, was: ObjectInfo, now: ObjectInfo) -> ObjectChangedError:
    """The refusal of a second reference to an object recorded with other (size, ETag, mtime, inode)."""
    return ObjectChangedError(f"{url}: changed between two references to it ({was} then {now})", key=url)


def _batch_objects(refs: Sequence[tuple[str, str, int, int, ObjectInfo]]) -> dict[str, ObjectInfo]:
    """Each object a batch of ``(key, url, offset, length, info)`` refers to, with its info, in
    the order first referred to; two references to one object with other infos are refused."""
    first: dict[str, ObjectInfo] = {}
    for _, url, _, _, info in refs:
        if first.setdefault(url, info) != info:  # a second reference in the batch, unlike the first
            raise _changed_object(url, first[url], info)
    return first


#: references a sink holds in memory before it moves them, and every later one, into its
#: SQLite table (:class:`_Front`): a few MiB at most, and a store of fewer shards needs no table
IN_MEMORY = 8192


class _Front:
    """A sink's references and source objects: in dictionaries up to :data:`IN_MEMORY`
    references, then (and for good) in a :class:`_Table`, so memory stays bounded; what
    every method answers is the table's answer either way (the same checks, the same
    errors, keys in code-point order, objects numbered in the order first referred to).
    A small store's references never touch SQLite: a dictionary entry, not two indexed
    rows, and the file written from a sort of the keys. Not thread-safe: the sink's lock
    serialises it."""

    def __init__(self, where: str | None) -> None:
        self.where = where
        self.sql: _Table | None = None
        self.refs: dict[str, tuple[str, int, int]] = {}  # key -> (url, offset, length)
        self.objects: dict[str, ObjectInfo] = {}  # url -> info, in the order first referred to
        self._keys: list[str] | None = None  # the keys sorted, until the next change
        self._urls: list[str] | None = None  # the objects in order, until the next change

    def _spill(self) -> _Table:
        """Move everything into a new SQLite table, which holds it from now on."""
        if self.sql is None:
            table = _Table(self.where)
            ids = {url: n for n, url in enumerate(self.objects, 1)}
            if ids:
                table.db.executemany("INSERT INTO objects (id, url, size, etag, modified_ns, inode) VALUES (?, ?, ?, ?, "
                                     "?, ?)",
                                     [(ids[url], url, *info) for url, info in self.objects.items()])
            if self.refs:
                table.db.executemany("INSERT INTO refs VALUES (?, ?, ?, ?)", [
                    (key, ids[url], offset, length) for key, (url, offset, length) in self.refs.items()])
            self.sql, self.refs, self.objects, self._keys, self._urls = table, {}, {}, None, None
        return self.sql

    def close(self) -> None:
        if self.sql is not None:
            self.sql.close()

    def add(self, key: str, url: str, offset: int, length: int, info: ObjectInfo) -> None:
        """:meth:`_Table.add`."""
        if self.sql is not None:
            self.sql.add(key, url, offset, length, info)
        else:
            self.add_many([(key, url, offset, length, info)])

    def add_many(self, refs: Sequence[tuple[str, str, int, int, ObjectInfo]]) -> None:
        """:meth:`_Table.add_many`: all or none, an object recorded with other info refused
        (:class:`ObjectChangedError`) before anything is added."""
        if self.sql is None and len(self.refs) + len(refs) > IN_MEMORY:
            self._spill()
        if self.sql is not None:
            self.sql.add_many(refs)
            return
        first = _batch_objects(refs)
        known = self.objects
        for url, info in first.items():
            was = known.get(url, info)
            if was != info:  # checked for all before any is recorded: all or none
                raise _changed_object(url, was, info)
        for url, info in first.items():
            known.setdefault(url, info)
        mine = self.refs
        for key, url, offset, length, _ in refs:
            mine[key] = (url, offset, length)
        self._keys = self._urls = None

    def get(self, key: str) -> tuple[str, int, int, ObjectInfo] | None:
        if self.sql is not None:
            return self.sql.get(key)
        got = self.refs.get(key)
        return None if got is None else (*got, self.objects[got[0]])

    def length(self, key: str) -> int | None:
        if self.sql is not None:
            return self.sql.length(key)
        got = self.refs.get(key)
        return None if got is None else got[2]

    def object(self, url: str) -> ObjectInfo | None:
        return self.sql.object(url) if self.sql is not None else self.objects.get(url)

    def delete(self, key: str) -> None:
        if self.sql is not None:
            self.sql.delete(key)
        elif self.refs.pop(key, None) is not None:
            self._keys = None

    def count(self) -> int:
        return self.sql.count() if self.sql is not None else len(self.refs)

    def count_objects(self) -> int:
        return self.sql.count_objects() if self.sql is not None else len(self.objects)

    def page(self, after: str | None, prefix: str, n: int) -> list[tuple[str, str, int, int]]:
        """:meth:`_Table.page`."""
        if self.sql is not None:
            return self.sql.page(after, prefix, n)
        if self._keys is None:
            self._keys = sorted(self.refs)
        keys = self._keys
        at = bisect.bisect_left(keys, prefix) if after is None else bisect.bisect_right(keys, after)
        refs = self.refs
        return [(key, *refs[key]) for key in keys[at : at + n]]

    def objects_after(self, after: int, n: int) -> list[tuple[int, str, int, str | None, int | None, int | None]]:
        """:meth:`_Table.objects_after` (an object's id: its place in the order first referred to)."""
        if self.sql is not None:
            return self.sql.objects_after(after, n)
        if self._urls is None:
            self._urls = list(self.objects)
        objects = self.objects
        return [(number, url, *objects[url]) for number, url in enumerate(self._urls[after : after + n], after + 1)]


class ReferenceFileSink(BaseInner):
    """A reference file being written (or read): documents held here, references and the
    source objects they point into in a temporary table (:class:`_Table`: memory flat in
    their number), written as one file at :meth:`commit`. Opened on an existing file it
    holds that file's content (a migration then finds DST not empty; ``--overwrite``
    empties this, and the commit replaces the file). ``read_only``: for verify and readers
    (no commit). ``within``: the URL prefix of the source's objects (verify): a reference
    to anything else is refused when the file is opened, and before it is read (:meth:`Guard.read`);
    the temporary table is never put inside the source's tree (a file kept there)."""

    def __init__(self, path: str, storage_options: Mapping[str, Any] | None = None, *, read_only: bool = False,
                 source: str = "", source_options: Mapping[str, Any] | None = None, within: str | None = None) -> None:
        from . import as_inner

        self.path = path
        self.storage_options = dict(storage_options or {})
        head, self.name = _split(path)
        self.parent: Inner = as_inner(head, storage_options=storage_options)
        self.read_only = read_only
        self.docs: dict[str, bytes] = {}
        self.source = source
        self.source_options = dict(source_options if source_options is not None else self.storage_options)
        self._lock = threading.Lock()
        where = self.parent.location()
        beside = where.path if where.kind == "file" and os.path.isdir(where.path) else None
        root = within[len("file://"):] if within is not None and within.startswith("file://") else None
        if beside is not None and root is not None and (beside.rstrip("/") + "/").startswith(root):
            beside = None  # verify of a file kept inside its source: no file of ours there, not even for a moment
        self._table = _Front(beside)
        #: referenced URLs the file records nothing of (each read of them is refused)
        self._unrecorded: set[str] = set()
        self._reader = Guard(_Objects(self), self.source_options, within=within)
        self._load()

    def __repr__(self) -> str:
        return f"ReferenceFileSink({self.path!r})"

    def __del__(self) -> None:
        table = getattr(self, "_table", None)
        if table is not None:
            table.close()

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
        objects = recorded_objects(doc, self.path)
        within = self._reader.within is not None
        block = doc.get(REFERENCE_KEY)
        self.source = self.source or (block.get("source", "") if isinstance(block, dict) else "")
        for key, value in doc["refs"].items():
            document = document_bytes(value)
            if document is not None:
                self.docs[key] = document
                continue
            url, offset, length = checked_reference(self.path, key, value)
            if within:  # verify: refused at once, not as the first chunk read there (taken for the source's damage)
                self._reader.refuse_outside(url)
            if url not in objects:
                self._unrecorded.add(url)  # read as the guarded reader reads it: refused (:func:`unrecorded`)
            self._add(key, url, offset, length, objects.get(url, (offset + length, None, None, None)))

    # ------------------------------------------------------------------ references
    def _add(self, key: str, url: str, offset: int, length: int, info: ObjectInfo) -> None:
        with self._lock:
            self._table.add(key, url, offset, length, info)
            self.docs.pop(key, None)

    def takes_references(self) -> bool:
        return not self.read_only

    def put_reference(self, key: str, ref: ChunkRef) -> None:
        """``key`` reads bytes ``[offset, offset+length)`` of ``ref.url``; the object's size and
        ETag or modification time and inode are recorded for the guard. Put again, the last one holds."""
        if ref.offset < 0 or ref.length < 0 or ref.offset + ref.length > ref.object_size:
            raise ObjectChangedError(f"{ref.url}: [{ref.offset}, {ref.offset + ref.length}) does not lie inside its "
                                     f"{ref.object_size} bytes", key=ref.url)
        self._add(key, ref.url, ref.offset, ref.length, (ref.object_size, ref.etag, ref.modified_ns, ref.inode))

    def put_references(self, array: str, refs: Sequence[tuple[str, tuple[int, ...], ChunkRef]]) -> None:
        """:meth:`put_reference` of each ``(key, coordinates, ref)``, checked the same way, in one
        batch of the table (:meth:`_Table.add_many`: all or none)."""
        rows = []
        for key, _, ref in refs:
            url, offset, length, size, etag, _, modified_ns, inode = ref
            if offset < 0 or length < 0 or offset + length > size:
                raise ObjectChangedError(f"{url}: [{offset}, {offset + length}) does not lie inside its {size} bytes",
                                         key=url)
            rows.append((key, url, offset, length, (size, etag, modified_ns, inode)))
        with self._lock:
            self._table.add_many(rows)
            if self.docs:
                for key, *_ in rows:
                    self.docs.pop(key, None)

    def reference(self, key: str) -> ChunkRef | None:
        """The reference ``key`` holds (None: a document, or nothing)."""
        with self._lock:
            got = self._table.get(key)
        if got is None:
            return None
        url, offset, length, (size, etag, modified_ns, inode) = got
        return ChunkRef(url, offset, length, size, etag=etag, modified_ns=modified_ns, inode=inode)

    def _rows(self, prefix: str = "", batch: int = 4096) -> Iterator[tuple[str, str, int, int]]:
        """Every ``(key, url, offset, length)`` under ``prefix``, sorted by key, read a page
        at a time (the lock is never held between pages)."""
        after: str | None = None
        while True:
            with self._lock:
                rows = self._table.page(after, prefix, batch)
            for row in rows:
                if not row[0].startswith(prefix):
                    return
                yield row
            if len(rows) < batch:
                return
            after = rows[-1][0]

    def references(self) -> Iterator[tuple[str, ChunkRef]]:
        """Every ``(key, reference)``, sorted by key."""
        for key, *_ in self._rows():
            ref = self.reference(key)
            if ref is not None:  # deleted meanwhile
                yield key, ref

    # ------------------------------------------------------------------ the file
    def encode(self, message: str = "") -> bytes:
        """The reference file's bytes (:meth:`pieces` joined)."""
        return b"".join(self.pieces(message))

    def _pages(self, batch: int) -> Iterator[list[str]]:
        """Every entry of ``refs`` as JSON text (``"key":value``), sorted by key, a page of
        references at a time: the documents (few, held here; inline as text, base64 where
        not UTF-8) merged into the references (read ``batch`` at a time; ``[url, offset,
        length]``), a document first on a tie. Each page is formatted in one loop (no
        generator step per entry: a reference file has an entry per shard)."""
        docs = sorted(self.docs.items())
        d, quoted, quoted_url = 0, _json_string, _url_quoter()
        upto = docs[0][0] if docs else None  # the next document's key
        after: str | None = None
        while True:
            with self._lock:
                rows = self._table.page(after, "", batch)
            out: list[str] = []
            for key, url, offset, length in rows:
                while upto is not None and upto <= key:
                    out.append(_doc_entry(*docs[d]))
                    d += 1
                    upto = docs[d][0] if d < len(docs) else None
                out.append(f"{quoted(key)}:[{quoted_url(url)},{int(offset)},{int(length)}]")
            if len(rows) < batch:
                yield out + [_doc_entry(*doc) for doc in docs[d:]]
                return
            yield out
            after = rows[-1][0]

    def pieces(self, message: str = "", batch: int = 4096) -> Iterator[bytes]:
        """The reference file in pieces of about ``batch`` entries, never all of it at once:
        documents inline as text (base64 where not UTF-8), references as ``[url, offset,
        length]``, keys sorted; then the source objects as recorded."""
        dumps = _dumps
        yield b'{"version":1,"refs":{'
        first = True
        for page in self._pages(batch):
            if page:
                yield ("" if first else ",").encode() + ",".join(page).encode()
                first = False
        head = {"schema": SCHEMA, "source": self.source, "message": message}
        yield f'}},{dumps(REFERENCE_KEY)}:{dumps(head)[:-1]},"objects":{{'.encode()
        after, quoted_url = 0, _url_quoter()
        while True:
            with self._lock:
                rows = self._table.objects_after(after, batch)
            if not rows:
                break
            yield ("," if after else "").encode() + ",".join(
                f"{quoted_url(url)}:{_info_json(size, etag, modified_ns, inode)}"
                for _, url, size, etag, modified_ns, inode in rows
            ).encode()
            after = rows[-1][0]
        yield b"}}}"

    def commit(self, message: str) -> str:
        """Write the reference file, atomically and streamed (:meth:`pieces` into the
        parent's :meth:`~sharding_store.stores.base.BaseInner.set_streamed`: locally a
        temporary file renamed into place, on S3 a multipart upload completed at the end;
        on an error the previous file, if any, stays); returns its name."""
        if self.read_only:
            raise StoreNotFoundError(f"{self.path}: opened read-only", key=self.path)
        self.parent.set_streamed(self.name, self.pieces(message))
        return self.path

    # ------------------------------------------------------------------ the store interface
    def _read(self, key: str, start: int, end: int | None) -> bytes | None:
        doc = self.docs.get(key)
        if doc is not None:
            return slice_range(doc, start, end)
        with self._lock:
            got = self._table.get(key)
        if got is None:
            return None
        url, offset, length, _ = got
        lo = max(0, length + start) if start < 0 else min(start, length)
        hi = length if end is None else max(lo, min(end, length))
        return self._reader.read(url, offset + lo, offset + hi)

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
            self._table.delete(key)
            self.docs[key] = bytes(value)

    def delete(self, key: str) -> None:
        with self._lock:
            self.docs.pop(key, None)
            self._table.delete(key)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        docs = sorted(k for k in self.docs if k.startswith(prefix))
        return heapq.merge(docs, (key for key, *_ in self._rows(prefix)))

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        for key in self.list_prefix(prefix):
            yield key, self.size(key)

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        doc = self.docs.get(key)
        if doc is not None:
            return len(doc)
        with self._lock:
            return self._table.length(key)

    def location(self) -> Location:
        where = self.parent.location()
        return Location(where.kind, where.authority, posixpath.join(where.path, self.name))

    def describe(self) -> str:
        return self.path


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


#: ``text`` as a JSON string, exactly as ``json`` writes it with ``ensure_ascii=False``: the
#: encoder's own C function for strings, one call (no encoder dispatch; a scan for characters
#: to escape first cost more than this call, which is that scan)
_json_string: Callable[[str], str] = json.encoder.encode_basestring


def _url_quoter(most: int = 4096) -> Callable[[str], str]:
    """:data:`_json_string` of URLs, the part up to the last ``/`` (a directory: shared by
    the objects in it) quoted once and kept (up to ``most`` of them: a cache, not a record);
    JSON escapes character by character, so the two parts quoted apart give the same text."""
    heads: dict[str, str] = {}

    def quoted(url: str) -> str:
        head, slash, name = url.rpartition("/")
        if not slash:
            return _json_string(url)
        got = heads.get(head)
        if got is None:
            if len(heads) >= most:
                heads.clear()
            got = heads[head] = _json_string(head + slash)[:-1]  # without its closing quote
        return got + _json_string(name)[1:]

    return quoted


def _doc_entry(key: str, value: bytes) -> str:
    """A document's entry of ``refs``: its text as a JSON string (base64 where not UTF-8)."""
    try:
        text = value.decode()
    except UnicodeDecodeError:
        text = "base64:" + base64.b64encode(value).decode()
    return f"{_json_string(key)}:{_dumps(text)}"


def _info_json(size: int, etag: str | None, modified_ns: int | None, inode: int | None = None) -> str:
    """One source object's entry in the ``objects`` block (size, then the ETag,
    ``st_mtime_ns`` and ``st_ino`` where known), exactly as ``json`` writes it (compact separators)."""
    out = f'{{"size":{int(size)}'
    if etag is not None:
        out += f',"etag":{_json_string(etag)}'
    if modified_ns is not None:
        out += f',"modified_ns":{int(modified_ns)}'
    if inode is not None:
        out += f',"inode":{int(inode)}'
    return out + "}"


class _Objects(Mapping[str, ObjectInfo]):
    """A sink's recorded source objects by URL (a view: nothing held twice)."""

    def __init__(self, sink: ReferenceFileSink) -> None:
        self.sink = sink

    def __getitem__(self, url: str) -> ObjectInfo:
        if url in self.sink._unrecorded:
            raise KeyError(url)
        with self.sink._lock:
            got = self.sink._table.object(url)
        if got is None:
            raise KeyError(url)
        return got

    def __iter__(self) -> Iterator[str]:
        after = 0
        while True:
            with self.sink._lock:
                rows = self.sink._table.objects_after(after, 4096)
            if not rows:
                return
            yield from (row[1] for row in rows)
            after = rows[-1][0]

    def __len__(self) -> int:
        with self.sink._lock:
            return self.sink._table.count_objects()


# --------------------------------------------------------------------------- the guard


class Guard:
    """Reads bytes of source objects by URL, each checked against what was recorded of it
    (``objects``: URL -> (size, ETag, st_mtime_ns, st_ino)) before and after the read:
    :class:`SourceChangedError` naming the URL and what changed. ``within`` (verify): the URL
    prefix of the source's objects; a URL outside it, climbing out of it with ``..`` or
    leading out of it through a link of its directories, is
    :class:`LinkOutsideStoreError` and never opened (a reference file cannot make ``verify``
    read, or call identical, another store's object)."""

    def __init__(self, objects: Mapping[str, ObjectInfo], storage_options: Mapping[str, Any] | None = None, *,
                 within: str | None = None) -> None:
        self.objects = objects
        self.storage_options = dict(storage_options or {})
        self.within = within
        self._stores: dict[str, Inner] = {}
        #: ``within``'s local directory (``/abs/dir/``), else None; the answers by directory
        #: (URL and resolved path: a dictionary look-up a reference once its directory is known)
        self._root = within[len("file://"):] if within is not None and within.startswith("file://") else None
        self._heads: dict[str, bool] = {}
        self._dirs: dict[str, bool] = {}

    def refuse_outside(self, url: str) -> None:
        """:class:`LinkOutsideStoreError` for a URL outside ``within`` (nothing without it)."""
        if self.within is None:
            return
        head, _, name = url.rpartition("/")
        inside = self._heads.get(head)
        if inside is None:
            inside = _below(head + "/", self.within) and (
                self._root is None or resolves_below(url[len("file://"):], self._root, self._dirs))
            if len(self._heads) >= 4096:
                self._heads.clear()
            self._heads[head] = inside
        if not inside or name in ("", ".", ".."):
            raise LinkOutsideStoreError(f"{url}: a reference leading outside the source {self.within}", key=url)

    def read(self, url: str, start: int, end: int) -> bytes:
        self.refuse_outside(url)
        info = self.objects.get(url)
        if info is None:
            raise unrecorded(url)
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


def _below(directory: str, prefix: str) -> bool:
    """Whether ``directory`` (a URL ending in ``/``) is ``prefix`` or a directory below it (no
    empty, ``.`` or ``..`` segment)."""
    return directory.startswith(prefix) and all(
        part not in ("", ".", "..") for part in directory[len(prefix):].split("/")[:-1])


def unrecorded(url: str) -> SourceChangedError:
    """The one error for a referenced URL of which the reference file records nothing (the
    guarded reader's, ``verify``'s and the reference check's)."""
    return SourceChangedError(f"{url}: referenced, but the reference file records nothing of it", key=url)


def describe_change(info: ObjectInfo, size: int | None, etag: str | None = None,
                    modified_ns: int | None = None, inode: int | None = None) -> str | None:
    """What differs between an object now (``size`` None: gone; its ``etag``, its
    ``st_mtime_ns``, its ``st_ino``) and what was recorded of it, in the guarded reader's
    words (None: nothing); what was not recorded (a file of an earlier version records no
    inode), or is not known now, is not compared."""
    was, recorded_etag, recorded_ns, recorded_inode = info
    if size is None:
        return "deleted since the references were taken"
    if size != was:
        return f"now {size} bytes, was {was}"
    if recorded_etag is not None and etag is not None and etag != recorded_etag:
        return f"rewritten (ETag no longer {recorded_etag})"
    if recorded_ns is not None and modified_ns is not None and modified_ns != recorded_ns:
        return f"modified since (st_mtime_ns {modified_ns}, was {recorded_ns})"
    if recorded_inode is not None and inode is not None and inode != recorded_inode:
        return (f"replaced by another file of the same size and modification time (inode {inode}, was "
                f"{recorded_inode})")
    return None


def _changed(url: str, st: os.stat_result, info: ObjectInfo) -> str | None:
    """What differs between a file's ``fstat`` and what was recorded of it (None: nothing)."""
    return describe_change(info, st.st_size, modified_ns=st.st_mtime_ns, inode=st.st_ino)


def _read_local(url: str, path: str, start: int, end: int, info: ObjectInfo) -> bytes:
    """Bytes ``[start, end)`` of a local file, its ``fstat`` compared with ``info`` before
    and after the read (of the descriptor read: never another file)."""
    try:
        # O_NONBLOCK: a FIFO put in a file's place is refused below, not waited on for ever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
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
    for key, value in doc["refs"].items():
        if document_bytes(value) is None:
            checked_reference(path, key, value)  # fsspec would read a damaged one as something else, or fail as itself
    guarded = _guarded_fs(recorded_objects(doc, path), storage_options if source_options is None else source_options)
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
