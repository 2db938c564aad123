"""The check of a virtual destination: its references read back, no chunk read (issue 24).

A virtual reference's bytes *are* the source object's bytes: reading both and comparing
them proves nothing the reference itself does not say. What can be wrong in a virtual
destination is what it says: its documents (compared by :mod:`.verification` as for a
copy), which object and which bytes each reference names, a reference missing or extra,
and the source changed since the references were taken. This check reads the committed
destination back and, for every unit of the source's listing, compares the reference of
each target key with what it must be, derived here from the source itself, not from the
migration's code (:class:`SourceObjects`):

* the source object by the URL a reader resolves: locally ``file://`` and its path with
  every directory resolved (a link inside the store: its target; one out of it is never
  followed), on S3 ``s3://bucket/key``; what it is now: its size, ``st_mtime_ns`` and
  ``st_ino`` (one ``lstat``), on S3 the size and ETag its listing gave;
* the whole object: offset 0 and its current length;
* a source shard without a reference must hold no live chunk (only then is its index read).

**A reference file** (:class:`ReferenceFileBack`) is parsed as written: each reference's
URL, offset and length, and what its ``"sharding-store"`` block recorded of the object
(size, ``st_mtime_ns`` and inode or ETag) against the object now; any other reference, and any
document of no source node, is extra.

**An Icechunk repository** (:class:`IcechunkBack`): Icechunk 1.1's Python API tells no
chunk's location, offset or checksum by its key; it lists each array's chunk coordinates
and the URLs of all virtual chunks. So: each array's chunk keys (none missing, none extra);
the URLs of all virtual chunks (each source object named exactly once, nothing else); and
per shard its bytes ``[S - n, S + 1)`` read *through Icechunk* (``S`` the object's size
now, ``n`` its index's bytes): Icechunk compares the object with the reference's checksum
first (the ETag; locally inode, mtime and size), a reference reaching past the object's end
fails, one ending before it returns fewer bytes, and the ``n`` bytes must equal the
source's index (read from the source: index bytes only), which also tells two objects of
one size apart. An object without an index at its end (an unsharded chunk, an index at
the start) has its last byte read through Icechunk and its length asked of Icechunk. No
chunk payload is read from the source.
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_not
from typing import Any, NamedTuple

from ..errors import ShardCorruptError, SourceChangedError, StoreNotFoundError, UsageError
from ..formats.shard_index import live_entries
from ..stores import Inner, as_inner
from ..stores.references import (
    ObjectInfo,
    ReferenceFileSink,
    describe_change,
    document_bytes,
    read_reference_file,
    recorded_objects,
    reference_entry,
    unrecorded,
)
from .destination import extra_node_key, open_destination, read_record, resolve_target
from .jobs import StoreRef, collections_paused
from .options import StoreOptions
from .units import ArrayJob, ArrayPlan, Unit, UnitRow

__all__ = ["IcechunkBack", "ReferenceFileBack", "SourceObjects", "check_references", "collections_paused", "read_back"]

#: ``(key, what is wrong)`` -> recorded by the caller
Problem = Callable[[str, str], None]
#: units whose references are checked at a time (one batch of reads each)
BATCH = 256
#: the bits of ``st_mode`` that tell a file's type (``stat.S_IFMT`` of them, without a call)
FILE_TYPE = 0o170000
#: resolved directories kept (then forgotten: a cache, not a record)
MAX_DIRS = 65536


class Now(NamedTuple):
    """A source object as a reader of the references finds it now (``size`` None: deleted,
    or, with ``why``, no object a reference may name)."""

    url: str
    size: int | None
    etag: str | None = None
    modified_ns: int | None = None
    why: str = ""
    #: local: its ``st_ino`` (a file replaced by another of the same size and mtime)
    inode: int | None = None


class Entry(NamedTuple):
    """One target key and the source object its reference must name."""

    key: str
    src_key: str
    now: Now
    sharded: bool


class SourceObjects:
    """Each source object's URL and state now, from the source's location and the key:
    locally the path with its directories resolved (``lstat`` of the object), on S3
    ``s3://bucket/key`` with the listing's size and ETag (else one HEAD)."""

    def __init__(self, src: Inner) -> None:
        self.src = src
        where = src.location()
        self.kind, self.root = where.kind, where.path.rstrip("/")
        if self.kind not in ("file", "s3"):
            raise UsageError(f"{src.describe()}: a virtual destination refers to local or s3:// objects; this source "
                             "has no URL for its objects", key=src.describe())
        self._dirs: dict[str, str] = {}
        #: what every path inside the store starts with
        self.inside = self.root + "/"
        #: :meth:`now` of this source's kind (bound once: one call a source object)
        self.now_of: Callable[[str, int | None], Now] = self._s3 if self.kind == "s3" else self._local
        #: on S3 the listing tells each object's size and ETag now, a request per 1000
        #: objects (a HEAD each would be one per object): the check then lists the source
        #: even after a migration that just listed it; locally each object's ``lstat`` does
        self.listing_tells_state = self.kind == "s3"

    def gone(self, url: str) -> bool:
        """Whether ``url`` names an object of this source that is no longer there (a
        reference no unit accounts for: a deleted source object, not an extra reference)."""
        if self.kind == "file" and url.startswith(f"file://{self.root}/"):
            return not os.path.lexists(url[len("file://"):])
        if self.kind == "s3" and url.startswith(f"s3://{self.root}/"):
            return not self.src.exists(url[len(f"s3://{self.root}/"):])
        return False

    def now(self, key: str, listed: int | None) -> Now:
        """Source object ``key`` now (``listed``: its size as listed, what S3 refers to)."""
        return self.now_of(key, listed)

    def _s3(self, key: str, listed: int | None) -> Now:
        url = f"s3://{self.root}/{key}"
        ref = self.src.reference_to(key, 0, listed or 0)  # the object as listed (size, ETag), not a byte read
        if ref is None:
            return Now(url, None)
        return Now(url, ref.object_size, etag=ref.etag)

    def _real_dir(self, directory: str) -> str:
        """``os.path.realpath`` of the store's ``directory`` (cached). Below a resolved parent,
        a name (not ``.`` or ``..``) that is no link resolves to itself (``realpath`` takes
        a component that is no link as it is, and one it cannot ``lstat`` too): one
        ``lstat`` instead of one for every component from ``/``; a link, ``realpath``."""
        real = self._dirs.get(directory)
        if real is None:
            parent, _, name = directory.rpartition("/")
            if directory and name not in ("", ".", ".."):
                real = f"{self._real_dir(parent).rstrip('/')}/{name}"
                try:
                    link = stat.S_ISLNK(os.lstat(real).st_mode)
                except OSError:
                    link = False
                if link:
                    real = os.path.realpath(real)
            else:
                real = os.path.realpath(os.path.join(self.root, directory))
            if len(self._dirs) >= MAX_DIRS:
                self._dirs.clear()
            self._dirs[directory] = real
        return real

    def plain_dir(self, directory: str) -> str | None:
        """``<resolved directory>/`` of the store's ``directory`` where it lies inside the
        store (every object named there, if no link, is ``file://`` and this and its name:
        what :meth:`now` finds for it), else None."""
        real = (self._dirs.get(directory) or self._real_dir(directory)) + "/"
        return real if real.startswith(self.inside) else None

    def _local(self, key: str, listed: int | None = None) -> Now:
        """``listed`` is not needed locally (the ``lstat`` tells the size now)."""
        directory, _, name = key.rpartition("/")
        path = f"{self._dirs.get(directory) or self._real_dir(directory)}/{name}"
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):  # a link inside the store: a reader is referred to its target
                path = os.path.realpath(path)
                st = os.stat(path)
        except OSError:
            return Now(f"file://{path}", None)
        if not path.startswith(self.inside):
            return Now(f"file://{path}", None, why=f"leads out of the store ({key} resolves to {path})")
        if not stat.S_ISREG(st.st_mode):
            return Now(f"file://{path}", None, why="no longer a regular file")
        # Now(url, size, modified_ns=..., inode=...) without its Python-level __new__ (one a source object)
        return tuple.__new__(Now, (f"file://{path}", st.st_size, None, st.st_mtime_ns, "", st.st_ino))


def holds_chunks(job: ArrayJob, src: Inner, key: str) -> bool:
    """Whether source shard ``key`` holds a live chunk (its index read): one without gets
    no reference. A gone shard holds none; an index that does not parse counts as holding
    (its reference is then missing: the migration would have refused it)."""
    assert job.dst_cps is not None
    n = job.src_index_nbytes
    at_end = job.src_layout.index_location == "end"
    tail = src.get_tails([(key, n if at_end else 0)])[0]
    if tail is None:
        return False
    raw = tail.data if at_end else src.get_ranges([(key, 0, n)])[0]
    if raw is None:
        return False
    size = tail.size if tail.size is not None else src.size(key) or 0
    try:
        return bool(live_entries(raw, job.dst_cps, checksum=bool(job.src_layout.index_checksum), key=key,
                                 payload_limit=size - n if at_end else size, payload_start=0 if at_end else n))
    except ShardCorruptError:
        return True


# --------------------------------------------------------------------------- reading DST back


@dataclass
class ReferenceFileBack:
    """A reference file as written: its documents (a store of their own, for the document
    checks), its references, and the source objects it recorded."""

    path: str
    documents: Inner
    refs: dict[str, Any]
    objects: Mapping[str, ObjectInfo]
    kind: str = "reference file"

    @classmethod
    def read(cls, path: str, storage_options: Mapping[str, Any] | None) -> ReferenceFileBack:
        doc = read_reference_file(path, storage_options)
        if doc is None:
            raise StoreNotFoundError(f"{path}: no such reference file", key=path)
        refs: dict[str, Any] = doc["refs"]  # the parse's own: its documents taken out, the references stay
        docs: dict[str, bytes] = {}
        # the keys of values that are no list (documents, few), found in C: no Python step a reference
        for key in list(compress(refs, map(is_not, map(type, refs.values()), repeat(list)))):
            data = document_bytes(refs[key])
            if data is not None:
                docs[key] = data
                del refs[key]
        return cls(path, as_inner(docs), refs, recorded_objects(doc, path))

    def check(self, job: ArrayJob, entries: list[Entry], src: Inner, problem: Problem) -> tuple[int, int]:
        """Each entry's reference against its source object; ``(references right, their bytes)``.
        A reference checked leaves :attr:`refs`: what remains at the end no unit accounts for."""
        good = nbytes = 0
        pop, objects = self.refs.pop, self.objects
        for entry in entries:
            ref = pop(entry.key, None)
            if ref is None:
                _missing(job, entry, src, problem)
                continue
            url, size, etag, modified_ns, why, inode = now = entry.now
            # the usual case at C speed: [its URL, 0, its size] (ints, not floats or bools), recorded as it is
            # now; it implies what :meth:`_wrong` finds right, which says what is wrong with any other
            if (type(ref) is list and ref == [url, 0, size] and type(ref[1]) is int and type(ref[2]) is int
                    and not why and objects.get(url) == (size, etag, modified_ns, inode)):
                good, nbytes = good + 1, nbytes + ref[2]
                continue
            what = self._wrong(ref, now)
            if what is not None:
                problem(entry.key, f"{entry.key}: {what}")
            else:
                good, nbytes = good + 1, nbytes + (size or 0)
        return good, nbytes

    def check_local(self, job: ArrayJob, units: Iterable[Unit | UnitRow], objects: SourceObjects, src: Inner,
                    problem: Problem) -> Iterator[tuple[int, int]]:
        """:func:`check_references` of a local source: per :data:`BATCH` units ``(target
        objects, bytes of the references found right)``.

        The usual unit, a shard of one source object that is a regular file (no link) in a
        directory resolving inside the store, is accepted here in one pass: its URL is
        ``file://``, the resolved directory and its name (what :meth:`SourceObjects.now`
        finds for a file that is no link), its state the same one ``lstat``, and it is
        right exactly when :meth:`check`'s quick acceptance holds: the reference is
        ``[that URL, 0, its size]`` (ints) and the file records the object as ``(its size,
        no ETag, its st_mtime_ns, its inode)`` (a file of an earlier version, no inode: by
        :meth:`check`). The same facts, compared the same way, without an
        :class:`Entry` and :class:`Now` built a shard. Every other unit (a link, not a
        regular file, gone, outside the store, unsharded, or a reference or record not
        right) is an :class:`Entry` checked by :meth:`check`, which says what is wrong."""
        pop, refs, recorded, now, key = self.refs.pop, self.refs, self.objects.get, objects.now_of, job.dst_key
        lstat, regular = os.lstat, stat.S_IFREG
        head, separator = job.dst_key_head, job.separator
        directory, base = None, None  # the last source directory and its plain_dir
        count = nbytes = 0
        slow: list[Entry] = []
        for unit in units:
            sources, target = unit[0], unit[1]
            if target is None:
                slow += [Entry(key(s[0]), s[1], now(s[1], s[2]), False) for s in sources]
                count += len(sources)
            else:
                count += 1
                _, src_key, listed = sources[0]
                at, _, name = src_key.rpartition("/")
                if at != directory:
                    directory, base = at, objects.plain_dir(at)
                dst = head + separator.join(map(str, target)) if head is not None and target else key(target)
                if base is not None:
                    try:
                        st = lstat(base + name)
                    except OSError:
                        st = None
                    if st is not None and st.st_mode & FILE_TYPE == regular:
                        size, url, ref = st.st_size, f"file://{base}{name}", pop(dst, None)
                        if (type(ref) is list and ref == [url, 0, size] and type(ref[1]) is int
                                and type(ref[2]) is int and recorded(url) == (size, None, st.st_mtime_ns, st.st_ino)):
                            nbytes += size
                            continue
                        if ref is not None:
                            refs[dst] = ref  # back, for check to diagnose
                slow.append(tuple.__new__(Entry, (dst, src_key, now(src_key, listed), True)))
            if count >= BATCH:
                if slow:
                    nbytes += self.check(job, slow, src, problem)[1]
                    slow = []
                yield count, nbytes
                count = nbytes = 0
        if slow:
            nbytes += self.check(job, slow, src, problem)[1]
        if count:
            yield count, nbytes

    def _wrong(self, ref: Any, now: Now) -> str | None:
        """What is wrong with ``ref`` (None: it names ``now``'s object whole, as recorded)."""
        entry = reference_entry(ref)
        if entry is None:
            return f"not a reference [url, offset, length]: {json.dumps(ref)[:80]}"
        url, offset, length = entry
        if url != now.url:
            return f"names {url}, not its source object {now.url}"
        if now.why:
            return f"its source object {now.url} {now.why}"
        info = self.objects.get(url)
        if info is None:
            return str(unrecorded(url))
        change = describe_change(info, now.size, now.etag, now.modified_ns, now.inode)
        if change is not None:
            return f"{url}: {change}"
        if offset != 0 or length != now.size:
            return f"names bytes [{offset}, {offset + length}) of {url}, not the whole object ({now.size} bytes)"
        return None

    def extras(self, plans: Iterable[ArrayPlan], nodes: set[str], unchecked: set[str], objects: SourceObjects,
               problem: Problem) -> None:
        """Every reference no unit accounts for (one to a source object deleted since, or an
        extra one), and under the arrays every document that is no source node's or that
        stands where a chunk would (``unchecked``: prefixes of arrays whose documents were
        found wrong: reported already)."""
        for key, ref in self.refs.items():
            if key.startswith(tuple(unchecked)):
                continue
            url = ref[0] if isinstance(ref, list) and ref and isinstance(ref[0], str) else ""
            if url and objects.gone(url):
                problem(key, f"{key}: {url}: {describe_change((0, None, None, None), None)}")
            else:
                problem(key, f"{key}: unexpected reference (the source has no chunk there)")
        for plan in plans:
            prefix = plan.job.dst_prefix
            for key in self.documents.list_prefix(prefix):
                if extra_node_key(key, prefix, nodes):
                    problem(key, f"{key}: a node the source does not have")
                elif plan.job.is_dst_key(key[len(prefix):]):
                    problem(key, f"{key}: unexpected object (inline data where the source has no chunk)")

    def finish(self, complete: bool, objects: SourceObjects, problem: Problem) -> None:
        """Nothing left to compare for a reference file."""

    def describe(self) -> str:
        return "name their source objects whole and unchanged (size, st_mtime_ns and inode or ETag as recorded)"


@dataclass
class IcechunkBack:
    """A virtual Icechunk repository read back through Icechunk's public API (see the module
    docstring for what it tells and what is read instead)."""

    inner: Any  # an IcechunkInner
    expected: Counter[str] = field(default_factory=Counter)
    present: set[str] = field(default_factory=set)
    kind: str = "Icechunk virtual"

    @property
    def documents(self) -> Inner:
        return self.inner

    def check(self, job: ArrayJob, entries: list[Entry], src: Inner, problem: Problem) -> tuple[int, int]:
        """Each entry's virtual chunk against its source object; ``(references right, their bytes)``."""
        found = []
        for entry in entries:
            if entry.key not in self.present:
                _missing(job, entry, src, problem)
            elif entry.now.size is None:
                self.present.discard(entry.key)
                what = entry.now.why or "deleted since the references were taken"
                problem(entry.key, f"{entry.key}: its source object {entry.now.url}: {what}")
            else:
                self.present.discard(entry.key)
                self.expected[entry.now.url] += 1
                found.append(entry)
        n = job.src_index_nbytes if job.dst_cps is not None and job.src_layout.index_location == "end" else 0
        wrong = self._read_back(found, n, src)
        good = [e for e in found if e.key not in wrong]
        for key, what in sorted(wrong.items()):
            problem(key, f"{key}: {what}")
        return len(good), sum(e.now.size or 0 for e in good)

    def _read_back(self, found: list[Entry], n: int, src: Inner) -> dict[str, str]:
        """What is wrong, by key, with each found virtual chunk read back (``n``: index bytes
        at the objects' ends, compared with the source's; 0: lengths asked of Icechunk)."""
        requests = []
        for e in found:
            size = e.now.size or 0
            take = min(n, size) if n else min(1, size)
            requests.append((e.key, size - take, size + 1 if n else size))
        got = self.inner.read_each([r for r in requests if r[2] > r[1]])
        results = iter(got)
        tails = src.get_tails([(e.src_key, n) for e in found]) if n else [None] * len(found)
        wrong: dict[str, str] = {}
        for e, (key, start, end), tail in zip(found, requests, tails):
            value = next(results) if end > start else b""
            if isinstance(value, SourceChangedError) and "not enough data" not in str(value):  # its checksum
                wrong[key] = str(value).removeprefix(f"{key}: ")
            elif isinstance(value, Exception):  # past the object's end (its checksum held), or unreadable
                wrong[key] = (f"Icechunk cannot read its bytes [{start}, {e.now.size}) of {e.now.url}: its reference "
                              f"does not end where the object ends ({e.now.size} bytes) ({value})")
            elif n and (tail is None or bytes(value) != bytes(tail.data)):
                wrong[key] = (f"its last {n} bytes read through Icechunk are not the index of its source object "
                              f"{e.now.url}: it names another object, or not that object whole")
            elif not n and (length := self.inner.size(key)) != e.now.size:
                wrong[key] = f"its virtual chunk is {length} bytes, its source object {e.now.url} {e.now.size}"
        return wrong

    def extras(self, plans: Iterable[ArrayPlan], nodes: set[str], unchecked: set[str], objects: SourceObjects,
               problem: Problem) -> None:
        """Nothing left: each array's other chunk keys are reported as it ends (:meth:`end_array`)."""

    def end_array(self, problem: Problem) -> None:
        """The array's chunk keys no unit accounted for: each one's first byte read through
        Icechunk tells a source object deleted since (Icechunk's error) from an extra reference."""
        extra = sorted(self.present)
        self.present = set()
        if not extra:
            return
        from ..stores.icechunk_store import local_files_only  # an Icechunk repository: the module is loaded

        try:  # only here (few keys): a FIFO in a source file's place would hold Icechunk's read for ever
            local_files_only(self.inner.virtual_locations())
        except SourceChangedError as e:
            for key in extra:
                problem(key, f"{key}: unexpected reference, not read: {e}")
            return
        for key, got in zip(extra, self.inner.read_each([(k, 0, 1) for k in extra])):
            if isinstance(got, SourceChangedError):
                problem(key, str(got))
            else:
                problem(key, f"{key}: unexpected reference (the source has no chunk there)")

    def finish(self, complete: bool, objects: SourceObjects, problem: Problem) -> None:
        """The URLs of all virtual chunks against the source objects the units named, each
        once (only when every array was checked: another array's chunks name others)."""
        if not complete:
            return
        actual = Counter(self.inner.virtual_locations())
        for url in sorted(set(actual) | set(self.expected)):
            a, e = actual[url], self.expected[url]
            chunks = f"named by {a} virtual chunk{'s' * (a != 1)} of the repository"
            if a != e and objects.gone(url):
                problem(url, f"{url}: {chunks}, {describe_change((0, None, None, None), None)}")
            elif a != e:
                problem(url, f"{url}: {chunks}, by {e} of the migration (each source object once)")

    def describe(self) -> str:
        return ("name their source objects whole and unchanged (Icechunk's checksum passed; the last bytes of each "
                "read through Icechunk)")


def _missing(job: ArrayJob, entry: Entry, src: Inner, problem: Problem) -> None:
    """No reference for ``entry``: right only for a shard without a live chunk, or an object gone."""
    if entry.now.size is None or (entry.sharded and not holds_chunks(job, src, entry.src_key)):
        return
    problem(entry.key, f"{entry.key}: missing (no reference to its source object {entry.now.url})")


Back = ReferenceFileBack | IcechunkBack


def read_back(dst: Any, stores: StoreOptions, src: Inner) -> Back:
    """DST read back from where it was committed: a reference file parsed, an Icechunk
    repository opened again. A store a migration hands over (a :class:`StoreRef` with the
    store it wrote through) is opened again from its URL. A copy, or a materialised
    repository, is refused (:class:`UsageError`): its chunks are its own bytes."""
    written = dst.obj if isinstance(dst, StoreRef) else None if isinstance(dst, (str, os.PathLike)) else dst
    if isinstance(written, ReferenceFileSink):  # the reference file a migration wrote: the file itself
        return ReferenceFileBack.read(written.path, written.storage_options)
    url: Any = dst.url if isinstance(dst, StoreRef) else dst
    options = dict(stores.dst or {})
    if isinstance(dst, StoreRef) and dst.storage_options:
        options = {k: json.loads(v) for k, v in dst.storage_options}
    if written is not None and hasattr(written, "chunk_keys"):  # an Icechunk repository a migration wrote
        url, target = written.url, "icechunk"
    else:
        target = resolve_target(url, None, False, options) if isinstance(url, (str, os.PathLike)) else "zarr"
    if target == "references":
        return ReferenceFileBack.read(os.fspath(url), options)
    if target == "icechunk":
        inner = open_destination(url, "icechunk", False, StoreOptions(stores.src, options), src, read_only=True)
        if (read_record(inner) or {}).get("virtual") is True:
            return IcechunkBack(inner)
    name = url if isinstance(url, str) else os.fspath(url) if isinstance(url, os.PathLike) else type(dst).__name__
    raise UsageError(f"{name}: not a virtual destination (its chunks are its own bytes): only a reference file or a "
                     "virtual Icechunk repository has references to check; verify it without --references-only",
                     key=str(name))


def _entries(job: ArrayJob, units: Iterable[Unit | UnitRow], objects: SourceObjects) -> Iterator[list[Entry]]:
    """The units' target keys with their source objects now, :data:`BATCH` units at a time."""
    batch: list[Entry] = []
    n = 0
    now, key, new = objects.now_of, job.dst_key, tuple.__new__
    for unit in units:
        sources, target = unit[0], unit[1]  # by index: a Unit, or a plain row of the unit log
        if target is not None:
            _, src_key, listed = sources[0]
            batch.append(new(Entry, (key(target), src_key, now(src_key, listed), True)))  # Entry(...), cheaper
        else:
            batch += [Entry(key(s[0]), s[1], now(s[1], s[2]), False) for s in sources]
        n += 1
        if n == BATCH:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def check_references(back: Back, job: ArrayJob, units: Iterable[Unit | UnitRow], objects: SourceObjects, src: Inner,
                     problem: Problem) -> Iterator[tuple[int, int]]:
    """One array's references checked, a batch of units at a time: per batch ``(target
    objects, bytes of the references found right)`` (for the progress bar and the report)."""
    if isinstance(back, IcechunkBack):
        back.present = set(back.inner.chunk_keys(job.path))
    elif objects.kind == "file":
        yield from back.check_local(job, units, objects, src, problem)
        return
    for batch in _entries(job, units, objects):
        _, nbytes = back.check(job, batch, src, problem)
        yield len(batch), nbytes
    if isinstance(back, IcechunkBack):
        back.end_array(problem)

