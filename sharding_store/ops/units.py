"""The migration's plan and work units: what one target shard (or batch of chunks) needs, and doing it.

Shared by the two drivers of a migration, :mod:`~sharding_store.ops.migration` (build the
destination) and :mod:`~sharding_store.ops.verification` (compare it with the source), so both
see the same plan: the translation of each array (:func:`plan_array`), its units
(:func:`array_units`), and the keys and documents of the destination.

A :class:`Unit` is plain, picklable data — source objects with their sizes, the target
coordinates — and an :class:`ArrayJob` says how to open the stores
(:class:`~sharding_store.ops.jobs.StoreRef`) and how the array is laid out on both sides.
Workers open stores themselves, so units run on threads or on a dask cluster alike.

Targets:

* sharded target, same ``chunks_per_shard`` as the source: one unit per source shard.
  A compact one (no dead bytes; chunks in any order) is already a valid v1.0 shard
  with the index at the end, so after reading only its index it is copied by the
  store (:meth:`Inner.copy_to`: a kernel copy on local disk, plus the 4-byte CRC32C of
  its index; an S3 server-side CopyObject when there is no checksum to append), of the
  very version whose index was read. Otherwise it is read whole (one request), rebuilt
  compact with one join, written once;
* sharded target, other layout: one unit per target shard, gathering its chunks
  through the shard engine (:meth:`ShardEngine.gather`);
* unsharded target: batches of chunk objects, copied verbatim (or recompressed).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

from ..api.hierarchy import DraftHierarchy, Node
from ..engine.shard_engine import ArrayLayout, ShardEngine, gather, read_shard_index
from ..errors import (
    ChunkDecodeError,
    ChunkKeyError,
    DraftMetadataError,
    LinkOutsideStoreError,
    ShardCorruptError,
    StoreIOError,
)
from ..formats.draft_metadata import DraftArrayMeta
from ..formats.keys import Coords, format_key_suffix, parse_key_suffix
from ..formats.shard_index import (
    CHECKSUM_NBYTES,
    IndexLocation,
    crc32c,
    encode_shard,
    index_nbytes,
    live_counts,
    live_entries,
    tiles,
)
from ..formats.v3_documents import (
    _given_dimension_names,
    inner_codecs,
    portability_problems,
    portable_target,
    v3_array_document,
    v3_chunk_key,
    v3_chunk_key_head,
)
from ..formats.v3_layout import KeyEncoding, V3ArrayMeta, decided, final_document
from ..stores import ChunkRef, Inner, Tail
from .destination import MARKER_KEY
from .jobs import (
    Source,
    StoreRef,
    interleave,
    is_transient,
    other_prefixes,
    plan_units,
    resolve_chunks_per_shard,
    with_retries,
)
from .progress import plural

#: what damages one array only (reported, or left out with ``skip_damaged``), never the whole run
DAMAGE_ERRORS = (ShardCorruptError, ChunkDecodeError, ChunkKeyError, DraftMetadataError, LinkOutsideStoreError)
#: chunk objects per unit when copying an unsharded array chunk by chunk
CHUNK_BATCH = 256
#: a destination object that exists, its size unknown (stores whose listing has no sizes)
PRESENT = -1
MiB = 1 << 20
R = TypeVar("R")


# --------------------------------------------------------------------------- destination keys


def node_key(path: str) -> str:
    """The v3 metadata key of the node at ``path`` (``zarr.json`` for the root)."""
    return f"{path}/zarr.json" if path else "zarr.json"


def node_prefix(path: str) -> str:
    return f"{path}/" if path else ""


def json_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


def is_v3_chunk_key(rest: str, separator: str, ndim: int) -> bool:
    """True when ``rest`` (relative to the array prefix) is a default-encoded chunk key."""
    parts = rest.split(separator)
    return parts[0] == "c" and len(parts) == ndim + 1 and all(p.isdigit() for p in parts[1:])


# --------------------------------------------------------------------------- options and plans


@dataclass(frozen=True)
class Options:
    chunks_per_shard: int | tuple[int, ...] | None = None
    index_checksum: bool = True
    #: None: where the source has it (the end, for a 2022 draft shard)
    index_location: IndexLocation | None = None
    portable: bool = False
    #: array path -> names for its dimensions (``--dimension-names``), for arrays without them
    dimension_names: Mapping[str, tuple[str | None, ...]] | None = None
    #: the one chunk key spelling the destination takes (an Icechunk repository: ``default``
    #: with ``/``), whatever the source's; None: the source's separator (and a v3 source's encoding)
    key_separator: str | None = None

    def recorded(self) -> dict[str, Any]:
        """These options as the destination's marker and record keep them (:mod:`.destination`)."""
        cps = self.chunks_per_shard
        return {
            "chunks_per_shard": list(cps) if isinstance(cps, tuple) else cps,
            "index_checksum": self.index_checksum,
            "index_location": self.index_location,
            "portable": self.portable,
            "dimension_names": ({p: list(n) for p, n in sorted(self.dimension_names.items())}
                                if self.dimension_names else None),
        }


@dataclass
class ArrayReport:
    path: str
    shards: int = 0  # target objects (shards, or chunks of an unsharded array)
    bytes: int = 0  # source bytes listed
    chunks_per_shard: list[int] | None = None
    recompressed: bool = False
    portable: bool = True
    index_checksum: bool = False  # its shard indices get a crc32c (4 bytes each) they had not


@dataclass(frozen=True)
class ArrayJob:
    """One array's migration, as every worker needs it (small and picklable)."""

    path: str
    src: StoreRef
    dst: StoreRef
    src_layout: ArrayLayout  # chunks_per_shard None: unsharded source
    dst_prefix: str  # "" for the root array, else "<path>/"
    dst_cps: Coords | None  # None: unsharded target
    checksum: bool = True
    index_location: IndexLocation = "end"
    meta: DraftArrayMeta | None = None  # only needed to decode/re-encode chunks
    #: re-encode payloads as this array (``--portable``: filters applied, zstd); None: verbatim
    target: DraftArrayMeta | None = None
    #: how the destination spells chunk keys (the source's separator): ``default`` for a
    #: draft (2022) source, else the source's own encoding, kept
    dst_encoding: KeyEncoding = "default"
    #: the destination's separator when it is not the source's (:attr:`Options.key_separator`)
    dst_separator: str | None = None

    @property
    def separator(self) -> str:
        """The separator of the destination's chunk keys."""
        return self.dst_separator or self.src_layout.separator

    @property
    def keeps_keys(self) -> bool:
        """Each target object keeps its source key (a v3 source): a shard whose layout does
        not change is then copied as it is, byte for byte, dead bytes and all; a draft
        shard is respelled under a new key and compacted."""
        return self.dst_encoding == self.src_layout.encoding

    @property
    def appends(self) -> bool:
        """A copied shard gets the CRC32C of its index appended (the source index has none)."""
        return self.checksum and not self.src_layout.index_checksum

    @property
    def same_grid(self) -> bool:
        return self.src_layout.chunks_per_shard is not None and self.src_layout.chunks_per_shard == self.dst_cps

    @property
    def recompress(self) -> bool:
        return self.target is not None

    @cached_property
    def can_copy_shards(self) -> bool:
        """A compact source shard (chunks in any order) is a valid target shard byte for byte,
        followed by the CRC32C of its index when the target index has one (computed once:
        the job's fields never change)."""
        return (self.same_grid and self.index_location == "end" and self.src_layout.index_location == "end"
                and not self.recompress and (self.checksum or not self.src_layout.index_checksum))

    def dst_key(self, coords: Coords) -> str:
        if self.dst_encoding == "default":
            return self.dst_prefix + v3_chunk_key(coords, self.separator)
        return self.dst_prefix + format_key_suffix(coords, self.dst_encoding, self.separator)

    @cached_property
    def dst_key_head(self) -> str | None:
        """What :meth:`dst_key` of non-empty coordinates is followed by the coordinates
        joined by :attr:`separator` (None: keys spelled in the source's own encoding);
        computed once, for a caller spelling one key a shard."""
        if self.dst_encoding != "default":
            return None
        return self.dst_prefix + v3_chunk_key_head(self.separator)

    def is_dst_key(self, rest: str) -> bool:
        """Whether ``rest`` (a key relative to :attr:`dst_prefix`) spells a target chunk or shard."""
        return parse_key_suffix(rest, self.dst_encoding, self.separator, self.src_layout.ndim) is not None

    def dst_dir(self, coords: Coords) -> Hashable:
        """What tells the targets' directories apart, for :func:`~sharding_store.ops.jobs.interleave`:
        two targets share a directory exactly when the parts of their :meth:`dst_key` before
        the last ``/`` are equal. With the separator ``/`` that part is the prefix, ``c`` and
        every coordinate but the last (an integer spells no ``/``): those coordinates stand
        for it, and no key is formatted; with ``.`` every key lies in the prefix's directory."""
        separator = self.separator
        if separator == "/":
            return coords[:-1]
        if separator == ".":
            return None
        return self.dst_key(coords).rpartition("/")[0]  # raises what dst_key raises

    def dst_index_nbytes(self) -> int:
        assert self.dst_cps is not None
        return index_nbytes(self.dst_cps, self.checksum)

    @cached_property
    def src_index_nbytes(self) -> int:
        """Bytes of a source index (with its CRC32C where it has one) of a target-shaped
        shard, computed once."""
        assert self.dst_cps is not None
        return index_nbytes(self.dst_cps, bool(self.src_layout.index_checksum))


@dataclass
class ArrayPlan:
    node: Node
    doc: dict[str, Any]
    job: ArrayJob
    report: ArrayReport


def plan_array(node: Node, src: StoreRef, dst: StoreRef, opts: Options) -> tuple[ArrayPlan, list[str]]:
    """Translate one array's metadata and describe its job; returns warnings too.

    Driven by the array's meta alone: its geometry, codecs, key encoding and shard index
    layout (a decided one: see :func:`decide_index`). The target keeps a checksum the
    source index has (``index_checksum=False`` drops none) and the source's index location
    unless ``opts`` gives one; a v3 source keeps its key encoding and its document's
    spelling (:func:`~sharding_store.formats.v3_layout.final_document`), a draft one gets the
    shared translation (:func:`~sharding_store.formats.v3_documents.v3_array_document`)."""
    meta = node.meta
    assert meta is not None
    layout = ArrayLayout.from_meta(meta)
    target = _target_chunks_per_shard(meta, opts)
    checksum = opts.index_checksum or layout.index_checksum is True
    location = opts.index_location or layout.index_location
    portable = portable_target(meta)
    target_meta = portable if opts.portable else None
    names = None if not opts.dimension_names or node.path not in opts.dimension_names \
        else list(opts.dimension_names[node.path])
    if isinstance(meta, V3ArrayMeta):
        if names is not None:
            names = _given_dimension_names(meta, names, meta.raw.get("dimension_names"))
        doc = final_document(meta, chunks_per_shard=target, checksum=checksum, location=location,
                             inner=None if target_meta is None else inner_codecs(target_meta), dimension_names=names)
    else:
        doc = v3_array_document(target_meta or meta, chunks_per_shard=target, index_codecs_checksum=checksum,
                                index_location=location, dimension_names=names)
    problems = portability_problems(target_meta or meta)
    warnings = []
    if problems:
        hint = "; --portable makes it readable by every v3 reader" if portable is not None and not opts.portable else ""
        warnings.append(f"{node.path or '/'}: only zarr-python will read it ({'; '.join(problems)}){hint}")
    job = ArrayJob(
        path=node.path,
        src=src,
        dst=dst,
        src_layout=layout,
        dst_prefix=node_prefix(node.path),
        dst_cps=target,
        checksum=checksum,
        index_location=location,
        meta=meta if target_meta is not None else None,
        target=target_meta,
        dst_encoding="default" if layout.encoding == "draft" or opts.key_separator else layout.encoding,
        dst_separator=opts.key_separator,
    )
    if opts.key_separator:
        doc["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": opts.key_separator}}
    report = ArrayReport(node.path, chunks_per_shard=None if target is None else list(target),
                         recompressed=target_meta is not None, portable=not problems,
                         index_checksum=target is not None and checksum)
    return ArrayPlan(node, doc, job, report), warnings


def _target_chunks_per_shard(meta: DraftArrayMeta, opts: Options) -> Coords | None:
    """The chunks per shard of the target: the source's, or what ``opts`` asks. An array
    whose objects are opaque shards (their index inside an encoded object) cannot be
    regrouped: :class:`DraftMetadataError` naming its document."""
    target = meta.chunks_per_shard
    if opts.chunks_per_shard is None:
        return target
    if isinstance(meta, V3ArrayMeta) and meta.opaque and target is None and any(
            isinstance(c, dict) and c.get("name") == "sharding_indexed" for c in meta.raw.get("codecs") or []):
        raise DraftMetadataError(f"{meta.node_key}: its shard index is inside an encoded object ({meta.opaque}); "
                                 "--chunks-per-shard cannot regroup its chunks", key=meta.node_key)
    if meta.ndim == 0:
        return ()  # a 0-d array's one chunk, whatever was asked for the others
    return resolve_chunks_per_shard(meta, opts.chunks_per_shard)


def decide_index(src: Inner, meta: DraftArrayMeta, ignore: tuple[str, ...] = ()) -> DraftArrayMeta:
    """``meta`` with an undeclared shard index (a v3 document without ``index_codecs``)
    decided from the tail of every shard (read in byte-bounded batches), which must all
    agree: :class:`ShardCorruptError` naming two that disagree, or the first that fits
    neither reading. Any other meta is returned as it is."""
    if not isinstance(meta, V3ArrayMeta) or meta.index_checksum is not None:
        return meta
    from ..api.evidence import decide_reading

    layout = ArrayLayout.from_meta(meta)
    assert layout.chunks_per_shard is not None
    shards = ((k, size) for k, size in src.list_sized(layout.prefix)
              if layout.parse(k) is not None and not (ignore and k.startswith(ignore)))
    reading = decide_reading(src, meta.path, shards, meta.n_chunks_per_shard)
    return decided(meta, reading == "crc32c-hidden")


# --------------------------------------------------------------------------- units


class Unit(NamedTuple):
    """One independent piece of work.

    Sharded target: ``target`` is the target shard and ``sources`` the source objects
    holding its chunks. Unsharded target: ``target`` is None and each source chunk
    object is one target object. The sizes of target objects found in the destination
    listing (resume, verify) come along: ``dst_size`` for the shard, ``dst_sizes`` per
    source chunk (None: absent).

    Immutable and picklable like the frozen dataclass it was, and made as cheaply as a
    tuple (one per shard: the frozen dataclass's ``__init__`` cost ~3 % of a compact
    shard's migration).
    """

    sources: tuple[Source, ...]
    target: Coords | None = None
    dst_size: int | None = None
    dst_sizes: tuple[int | None, ...] = ()

    @property
    def objects(self) -> int:
        """The target objects it stands for (what reports and progress bars count)."""
        return 1 if self.target is not None else len(self.sources)


@dataclass
class UnitResult:
    """What a unit did; results add up into the report."""

    written: int = 0  # objects built here and written
    copied: int = 0  # objects copied by the store (a kernel or server-side copy: bytes never read here)
    skipped: int = 0  # already complete in the destination (resume)
    empty: int = 0  # target shards without a live chunk: not written
    chunks: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_copied: int = 0
    dead_bytes: int = 0  # unreferenced source bytes dropped by compaction
    referenced: int = 0  # objects a virtual destination refers to in the source (no byte copied)

    def add(self, other: UnitResult) -> None:
        """Add ``other``'s counts (once per unit: spelled out, a loop over the fields cost
        ~10 % of a compact shard's migration; ``tests/unit/ops/test_migrate_streaming.py`` checks
        that every field is added)."""
        self.written += other.written
        self.copied += other.copied
        self.skipped += other.skipped
        self.empty += other.empty
        self.chunks += other.chunks
        self.bytes_read += other.bytes_read
        self.bytes_written += other.bytes_written
        self.bytes_copied += other.bytes_copied
        self.dead_bytes += other.dead_bytes
        self.referenced += other.referenced

    @property
    def objects(self) -> int:
        return self.written + self.copied + self.skipped + self.referenced

    @property
    def bytes_now(self) -> int:
        """Bytes that reached the destination in this run (built, copied, appended)."""
        return self.bytes_written + self.bytes_copied


@dataclass
class Listed:
    """What planning one array has seen so far, as counters (never per object): the
    numbers of its report, complete once ``done``."""

    objects: int = 0  # target objects: shards (units) of a sharded target, chunk objects of an unsharded one
    units: int = 0
    bytes: int = 0  # source bytes listed
    stray: int = 0
    first_stray: str | None = None
    done: bool = False

    def warnings(self, path: str) -> list[str]:
        if not self.stray:
            return []
        return [f"{path or '/'}: {plural(self.stray, 'stray key')} under its data prefix not migrated, e.g. {self.first_stray}"]


#: units pickled at a time into a :class:`UnitLog`
LOG_BATCH = 1024


class UnitLog:
    """The units a migration planned, array by array, for the reference check that follows
    a virtual migration: it takes them instead of listing the source a second time
    (:func:`~sharding_store.ops.verification.verify`'s ``listed``). Kept in an unlinked
    temporary file, :data:`LOG_BATCH` units at a time, so memory stays flat in their
    number; only this process writes and reads it. An array is there once its listing ran
    out (:meth:`end`): every unit of it, those of a damaged array too.

    A batch is written with ``marshal`` (built in: no module to import, no memo of every
    object as pickle keeps; this process's own file, read back by the same interpreter),
    as plain tuples, lists, strings and numbers (:func:`_log_columns`); one holding
    anything else (marshal refuses it) with ``pickle``. Each is a tag byte and its length
    before it: ``marshal.load`` of a file reads it a few bytes a call."""

    def __init__(self) -> None:
        import tempfile

        self._file = tempfile.TemporaryFile()
        self._spans: dict[str, tuple[int, int]] = {}
        self._start = 0
        self._batch: list[Unit] = []  # as planned, until written (:meth:`_flush`)

    def begin(self, path: str) -> None:
        """The units of the array at ``path`` follow."""
        self._flush()
        self._spans.pop(path, None)
        self._start = self._file.tell()

    def add(self, unit: Unit) -> None:
        """Log ``unit`` (held until its batch is written: one list append a unit)."""
        batch = self._batch
        batch.append(unit)
        if len(batch) >= LOG_BATCH:
            self._flush()

    def end(self, path: str) -> None:
        """The array at ``path`` was listed whole: its units can be taken (:meth:`units`)."""
        self._flush()
        self._spans[path] = (self._start, self._file.tell())

    def _flush(self) -> None:
        if self._batch:
            import marshal

            batch = _log_columns(self._batch)
            try:
                tag, data = b"m", marshal.dumps(batch, 4)
            except ValueError:  # a value of another type (marshal takes built-in types only)
                import pickle

                tag, data = b"p", pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
            self._file.seek(0, 2)
            self._file.write(tag + len(data).to_bytes(8, "little") + data)
            self._batch = []

    def units(self, path: str) -> Iterator[UnitRow] | None:
        """The units of the array at ``path``, in the order planned, as plain tuples shaped
        as :class:`Unit` and its :class:`Source` (read them by index); None when it was not
        listed whole here."""
        span = self._spans.get(path)
        return None if span is None else self._read(*span)

    def _read(self, start: int, end: int) -> Iterator[UnitRow]:
        import marshal

        while start < end:
            self._file.seek(start)
            head = self._file.read(9)
            data = self._file.read(int.from_bytes(head[1:], "little"))
            start = self._file.tell()
            if head[:1] == b"m":
                batch = marshal.loads(data)
            else:
                import pickle

                batch = pickle.loads(data)  # noqa: S301 - this process's own file, unlinked: no one else writes it
            if batch[0]:  # columns zipped again (a tuple a unit, which zip reuses once its reader let go)
                yield from zip(zip(batch[1]), *batch[2:])
            else:
                yield from batch[1]

    def close(self) -> None:
        self._file.close()


#: a :class:`Unit` as :class:`UnitLog` gives it back: a plain tuple of the same fields (its
#: sources plain ``(coords, key, size)`` tuples), read by index
UnitRow = tuple[Any, ...]


def _log_columns(units: list[Unit]) -> tuple[Any, ...]:
    """A batch of :class:`UnitLog` as pickle takes it cheaply: plain tuples (pickle writes a
    named tuple through a Python-level ``__getnewargs__`` call per object). Units of one
    source each (a shard of one source object: the usual) as ``(True, sources, targets,
    dst sizes, dst sizes per source)``, columns taken apart by ``map`` (C) with no Python
    step a unit; any other batch ``(False, rows)``, one plain row a unit."""
    from operator import itemgetter

    first = itemgetter(0)
    every = list(map(first, units))
    if set(map(len, every)) == {1}:
        return (True, list(map(tuple, map(first, every))), list(map(itemgetter(1), units)),
                list(map(itemgetter(2), units)), list(map(itemgetter(3), units)))
    return (False, [(tuple([tuple(s) for s in u[0]]), u[1], u[2], u[3]) for u in units])


class Present:
    """The destination objects under one array's prefix, from the destination's *sorted*
    listing read as a stream, side by side with units that ask for their keys in ascending
    order (a merge of two sorted streams): resume and verify learn what is already there
    without holding the listing. :meth:`size` gives a key's size (:data:`PRESENT` when the
    listing has no sizes; None: absent). Listed keys no unit asked for go to ``other``
    (verify reports the chunk keys among them) as the merge passes them, or at
    :meth:`close`. A key asked out of order is probed (``probe``) instead; a listing
    that is not sorted raises :class:`StoreIOError`."""

    def __init__(self, listing: Iterable[tuple[str, int | None]], *, other: Callable[[str], None] | None = None,
                 probe: Callable[[str], int | None] | None = None) -> None:
        self._it = iter(listing)
        self._other = other
        self._probe = probe
        self._head: tuple[str, int | None] | None = None
        self._asked: str | None = None
        self._listed: str | None = None
        self._next()

    def _next(self) -> None:
        head = next(self._it, None)
        if head is not None:
            if self._listed is not None and head[0] <= self._listed:
                raise StoreIOError(f"{head[0]}: the destination's listing is not in sorted order (after {self._listed!r})",
                                   key=head[0])
            self._listed = head[0]
        self._head = head

    def size(self, key: str) -> int | None:
        if self._asked is not None and key <= self._asked:  # not in the merge's order: ask the store
            return None if self._probe is None else self._probe(key)
        self._asked = key
        while self._head is not None and self._head[0] < key:
            if self._other is not None:
                self._other(self._head[0])
            self._next()
        if self._head is None or self._head[0] != key:
            return None
        size = self._head[1]
        self._next()
        return PRESENT if size is None else size

    def close(self) -> None:
        """Pass the rest of the listing to ``other``."""
        while self._head is not None:
            if self._other is not None:
                self._other(self._head[0])
            self._next()


#: units planned ahead at most, to interleave their target directories (:func:`~sharding_store.ops.jobs.interleave`)
INTERLEAVE_SPAN = 16384


def _sources(job: ArrayJob, listing: Iterable[tuple[str, int | None]], ignore: tuple[str, ...],
             listed: Listed) -> Iterator[Source]:
    parse = job.src_layout.parse
    for key, size in listing:
        coords = parse(key)
        if coords is None:
            _stray(key, ignore, listed)
            continue
        listed.bytes += size or 0
        yield tuple.__new__(Source, (coords, key, size))  # Source(...) without its Python-level __new__


def _stray(key: str, ignore: tuple[str, ...], listed: Listed) -> None:
    """A listed key that is no chunk or shard key of the array: counted as stray (unless
    under ``ignore``: another node's)."""
    if not (ignore and key.startswith(ignore)):
        listed.stray += 1
        if listed.first_stray is None or key < listed.first_stray:  # the least: any listing order
            listed.first_stray = key


def _shard_units(job: ArrayJob, listing: Iterable[tuple[str, int | None]], ignore: tuple[str, ...],
                 listed: Listed) -> Iterator[Unit]:
    """One unit per source shard as it is listed, counted in ``listed`` (:func:`job_units`
    with the source's grid, no destination listing, ``spread=False``; :func:`_sources` and
    the unit made in one step: a generator step and a call less a shard)."""
    parse, new = job.src_layout.parse, tuple.__new__
    for key, size in listing:
        coords = parse(key)
        if coords is None:
            _stray(key, ignore, listed)
            continue
        listed.bytes += size or 0
        listed.units += 1
        listed.objects += 1
        yield new(Unit, ((new(Source, (coords, key, size)),), coords, None, ()))  # Unit(...), as Source(...) above


def job_units(
    job: ArrayJob,
    listing: Iterable[tuple[str, int | None]],
    listed: Listed,
    *,
    present: Present | None = None,
    ignore: tuple[str, ...] = (),
    spread: bool = True,
) -> Iterator[Unit]:
    """The units of one array, planned lazily as the listing of its source prefix arrives.

    Keys under ``ignore`` (other nodes' prefixes) are skipped silently; other keys that
    are not this array's chunk or shard keys are counted as stray in ``listed``, with the
    source bytes and the objects planned. ``present``: the destination's objects (resume,
    verify), asked in ascending destination key order; without it the listing may come
    in any order (what is planned and reported does not depend on it).

    Memory does not grow with the array: one unit per source object (same grid: a
    source shard is a target shard; unsharded target: batches of chunk objects) is made
    as its object is listed, and at most :data:`INTERLEAVE_SPAN` are held to interleave
    their directories. Only a target grid other than the source's (``chunks_per_shard``
    changes) groups the whole array's listing by target first (its key order is not
    the targets' order), as does a 0-d array (two spellings of its one key).

    ``spread=False`` (a virtual destination: no file is created, so there is no directory
    lock to spread the work over) yields each unit as its object is listed, in the
    listing's order: consecutive units then read from the source directory just listed,
    whose descriptor is still cached (interleaved, or planned a span ahead, over more
    directories than :data:`~sharding_store.stores.local_fd.DIR_FDS_MAX`, every read walked
    its directory again).
    """
    sources = _sources(job, listing, ignore, listed)

    def size(key: str) -> int | None:
        return None if present is None else present.size(key)

    units: Iterator[Unit]
    if job.dst_cps is None:  # unsharded target: the source's key order is the target's (same suffix)
        for batch in _batched(sources, CHUNK_BATCH):
            listed.units += 1
            listed.objects += len(batch)
            sizes = (None,) * len(batch) if present is None else tuple(present.size(job.dst_key(s.coords)) for s in batch)
            yield Unit(batch, None, None, sizes)
        listed.done = True
        return
    if job.same_grid and job.src_layout.ndim > 0:  # one unit per source shard, even one outside the grid
        if present is None and not spread:  # each as listed (a virtual destination): one generator, no key formatted
            yield from _shard_units(job, listing, ignore, listed)
            listed.done = True
            return
        if present is None:  # no destination key to look up: none is formatted
            units = (Unit((s,), s.coords) for s in sources)
        else:
            units = (Unit((s,), s.coords, present.size(job.dst_key(s.coords))) for s in sources)
    else:
        if job.same_grid:  # 0-d: "c" and "c0" spell one key; the later in key order ("c0") wins
            groups = plan_units(_last_by_key(sources), job.dst_cps, job.dst_cps)
        else:
            layout = job.src_layout
            src_cps = layout.chunks_per_shard or (1,) * layout.ndim
            groups = plan_units(sources, src_cps, job.dst_cps, grid=layout.grid_shape)
        ordered = sorted((job.dst_key(g.target), g) for g in groups if g.target is not None)  # the merge's order
        units = (Unit(g.sources, g.target, size(key)) for key, g in ordered)
    if not spread:  # each unit as its object is listed: its directory was just read
        for unit in units:
            listed.units += 1
            listed.objects += 1
            yield unit
    for span in _batched(units, INTERLEAVE_SPAN):
        listed.units += len(span)
        listed.objects += len(span)
        yield from interleave(list(span), lambda u: job.dst_dir(u.target))  # type: ignore[arg-type]  # sharded: a target
    listed.done = True


def _last_by_key(sources: Iterable[Source]) -> list[Source]:
    """One source per coordinates: of two keys spelling the same chunk, the greater (the
    later in a sorted listing), whatever order they were listed in."""
    by_coords: dict[Coords, Source] = {}
    for s in sources:
        held = by_coords.get(s.coords)
        if held is None or s.key > held.key:
            by_coords[s.coords] = s
    return list(by_coords.values())


def _batched(items: Iterable[R], n: int) -> Iterator[tuple[R, ...]]:
    it = iter(items)
    while batch := tuple(itertools.islice(it, n)):
        yield batch


def array_units(
    plan: ArrayPlan, h: DraftHierarchy, src: Inner, present: Present | None = None, *, spread: bool = True
) -> tuple[Iterator[Unit], Listed]:
    """The units of one array, lazily, and their counters; when the units are exhausted
    the counters are complete and the array's report has its shards and bytes
    (``spread``: :func:`job_units`'). Only a merge with the destination (``present``)
    needs the source listed in key order; otherwise it is listed in the store's cheapest
    order (a plain mapping: streamed, never sorted or held)."""
    listed = Listed()
    # the node's own document lies under a v3 array's prefix (never under a draft one's)
    ignore = (*other_prefixes(h, plan.node.path), node_key(plan.node.path))
    prefix = plan.job.src_layout.prefix
    listing = src.list_unordered(prefix) if present is None else src.list_sized(prefix)
    units = job_units(plan.job, listing, listed, present=present, ignore=ignore, spread=spread)

    def run() -> Iterator[Unit]:
        yield from units
        plan.report.bytes = listed.bytes
        plan.report.shards = listed.objects

    return run(), listed


# --------------------------------------------------------------------------- reading


@dataclass
class SourceChunks:
    """The payloads of one target shard (local coords -> bytes), read from the source."""

    chunks: dict[Coords, bytes | memoryview] = field(default_factory=dict)
    bytes_read: int = 0
    dead_bytes: int = 0
    blob: bytes | None = None  # the whole source shard, when it was read whole


def read_whole(inner: Inner, key: str, size: int | None) -> bytes | None:
    """A whole object; with its size known (from a listing) as one ranged GET, which spares
    object stores the HEAD request a plain whole-object read may cost."""
    if size is None or size < 0:
        return inner.get(key)
    return inner.get_ranges([(key, 0, size)])[0]


def read_source_chunks(job: ArrayJob, unit: Unit, src: Inner) -> SourceChunks:
    """Read what a sharded target needs, through the shard engine: a whole source shard
    (same grid: one request, validated, dead bytes counted) or a gather of the target's
    chunks from the source objects that hold them."""
    assert unit.target is not None and job.dst_cps is not None
    if job.same_grid:
        (_, key, size), = unit.sources
        got = ShardEngine(src, job.src_layout, max_workers=1).read_shard(key, size)
        if got is None:
            return SourceChunks()  # deleted since it was listed: nothing to carry over
        return SourceChunks(dict(got.chunks), len(got.blob), got.dead_bytes, got.blob)
    layout = job.src_layout
    if layout.ndim == 0:  # keep the source's spelling of the only key ("c0" or "c")
        layout = replace(layout, zero_d=unit.sources[0].key[len(layout.prefix) :])
    chunks = gather(src, layout, unit.target, job.dst_cps, sources=[s.key for s in unit.sources])
    return SourceChunks(dict(chunks), sum(len(v) for v in chunks.values()))


def recompress(job: ArrayJob, payload: bytes | memoryview, key: str) -> bytes:
    """Decode a draft payload and encode it again as ``job.target`` (``--portable``)."""
    from ..codec.chunk_codec import decode_chunk_payload, encode_chunk_payload

    assert job.meta is not None and job.target is not None
    return encode_chunk_payload(job.target, decode_chunk_payload(job.meta, payload, key=key))


# --------------------------------------------------------------------------- running


def run_unit(job: ArrayJob, unit: Unit) -> UnitResult:
    """Write one unit's target objects (idempotent: every write replaces a whole object);
    into a destination that takes references, references to the source's objects."""
    src, dst = job.src.open(), job.dst.open()
    if dst.takes_references():
        return _refer_chunks(unit, src, dst, job) if unit.target is None else _refer_shard(job, unit, src, dst)
    if unit.target is None:
        return _copy_chunks(job, unit, src, dst)
    key = job.dst_key(unit.target)
    if unit.dst_size is not None and _is_complete(dst, key, unit.dst_size, job):
        return UnitResult(skipped=1)
    if job.can_copy_shards:  # the stores copy it, or it passes through here: one check decides which
        if src.can_copy_to(dst, append=job.appends):
            copied = _try_copy_shard(job, unit, src, dst, key)
        else:
            copied = _try_pass_shard(job, unit, src, dst, key)
        if copied is not None:
            return copied
    got = read_source_chunks(job, unit, src)
    if not got.chunks:
        return UnitResult(empty=1, bytes_read=got.bytes_read, dead_bytes=got.dead_bytes)
    chunks = got.chunks
    if job.recompress:
        chunks = {c: recompress(job, p, f"{key} chunk {c}") for c, p in chunks.items()}
    blob = encode_shard(chunks, job.dst_cps, checksum=job.checksum, index_location=job.index_location)  # type: ignore[arg-type]
    dst.set(key, blob)
    return UnitResult(written=1, chunks=len(chunks), bytes_read=got.bytes_read, bytes_written=len(blob), dead_bytes=got.dead_bytes)


def _is_complete(dst: Inner, key: str, size: int, job: ArrayJob) -> bool:
    if size == PRESENT:
        size = len(dst.get(key) or b"")
    try:
        read_shard_index(dst, key, size, job.dst_cps, checksum=job.checksum, index_location=job.index_location)  # type: ignore[arg-type]
        return True
    except ShardCorruptError:
        return False


def _shard_copy_plan(job: ArrayJob, raw: bytes, size: int, src_key: str) -> tuple[int, bytes] | UnitResult | None:
    """Whether a source shard of ``size`` bytes whose index is ``raw`` can be copied as it
    is: ``(live chunks, bytes to append)``; ``UnitResult(empty=1)`` when it has no live
    chunk (nothing to write); None when it has dead bytes or a bad index (the general path
    rebuilds it, or reports the damage with the whole object in hand). A job that keeps
    its keys (:attr:`ArrayJob.keeps_keys`) copies every shard whose index is sound as it is."""
    assert job.dst_cps is not None
    limit = size - job.src_index_nbytes
    try:
        live = live_entries(raw, job.dst_cps, checksum=bool(job.src_layout.index_checksum), key=src_key,
                            payload_limit=max(0, limit))
    except ShardCorruptError:
        return None
    if not live and not job.keeps_keys:
        return UnitResult(empty=1)
    if not job.keeps_keys and not tiles(live, 0, limit):
        return None
    body = raw[: len(raw) - CHECKSUM_NBYTES] if job.src_layout.index_checksum else raw
    return len(live), (crc32c(body).to_bytes(CHECKSUM_NBYTES, "little") if job.appends else b"")


def _try_copy_shard(job: ArrayJob, unit: Unit, src: Inner, dst: Inner, key: str) -> UnitResult | None:
    """Copy a compact source shard as it is, after reading only its index, by the store
    (:meth:`Inner.copy_to`), of the version whose index was read; None when it has dead
    bytes, a bad index, or no listed size (the general path). :func:`run_unit` calls it
    only when ``src.can_copy_to(dst, append=job.checksum)``."""
    (_, src_key, size), = unit.sources
    if size is None:
        return None  # reading the index would be wasted: the shard is read whole next
    n = job.src_index_nbytes
    tail = src.get_tails([(src_key, n)])[0]
    if tail is None:
        return None  # deleted since listed: the general path reports it
    size = tail.size if tail.size is not None else size
    plan = _shard_copy_plan(job, tail.data if size >= n else b"", size, src_key)
    if not isinstance(plan, tuple):
        return plan
    n_live, suffix = plan
    if not src.copy_to(src_key, dst, key, size=size, append=suffix, version=tail.version):
        return None
    return UnitResult(copied=1, chunks=n_live, bytes_copied=size, bytes_written=len(suffix))


def _try_pass_shard(job: ArrayJob, unit: Unit, src: Inner, dst: Inner, key: str) -> UnitResult | None:
    """Between stores that cannot copy (a mapping, two object stores): a compact source
    shard read whole (one request) is written as it is, followed by its index's CRC32C,
    after the same check of its index as :func:`_try_copy_shard` makes; neither the shard
    engine nor a re-encoding is needed. A size the listing did not give (a plain mapping's
    listing has none) is the length of what was read: the read is one whole get either
    way, as the general path's would be. None when it has dead bytes or a bad index (the
    general path reads it again, to rebuild it or report the damage), or it is gone.
    :func:`run_unit` calls it only when ``src.can_copy_to(dst, append=job.checksum)`` is false."""
    (_, src_key, size), = unit.sources
    listed = size is not None and size >= 0
    blob = read_whole(src, src_key, size if listed else None)
    if blob is None or (listed and len(blob) != size):
        return None  # deleted or changed since listed: the general path reads it afresh
    size = len(blob)
    n = job.src_index_nbytes
    plan = _shard_copy_plan(job, blob[-n:] if size >= n else b"", size, src_key)
    if isinstance(plan, UnitResult):
        plan.bytes_read = size
        return plan
    if plan is None:
        return None
    n_live, suffix = plan
    out = blob + suffix if suffix else blob
    dst.set(key, out)
    return UnitResult(written=1, chunks=n_live, bytes_read=size, bytes_written=len(out))


def virtual_refusal(job: ArrayJob) -> str | None:
    """Why a virtual destination cannot hold this array's objects as the source's (its
    objects would need new bytes), in words naming the option; None when it can: the same
    shards (chunks per shard), the index where the source has it, with the source's
    checksum, payloads as they are."""
    layout, where = job.src_layout, job.path or "/"
    if job.dst_cps != layout.chunks_per_shard:
        cps = "unsharded" if layout.chunks_per_shard is None else "x".join(map(str, layout.chunks_per_shard)) or "1"
        return (f"--chunks-per-shard with --virtual: regrouping chunks writes new shards, and a virtual destination "
                f"refers to the source's objects as they are ({where}: {cps} chunks per shard in the source)")
    if job.dst_cps is not None and job.index_location != layout.index_location:
        return (f"--index-location {job.index_location} with --virtual: moving the shard index writes new shards "
                f"({where}: the index is at the {layout.index_location} in the source)")
    if job.dst_cps is not None and job.checksum != bool(layout.index_checksum):
        return (f"an index checksum with --virtual: adding one writes new shards ({where}: the source's index "
                f"has {'one' if layout.index_checksum else 'none'})")
    if job.recompress:
        return f"--portable with --virtual: re-encoding chunks writes new bytes ({where})"
    return None


#: ``_source_index``'s "no tail read yet"
NOT_READ: Any = object()


def _source_index(job: ArrayJob, src: Inner, key: str, listed: int | None,
                  tail: Any = NOT_READ) -> tuple[bytes, int, Any] | None:
    """The encoded index of source shard ``key`` with the shard's size and version: its last
    bytes (one tail read, or ``tail`` read already by :func:`refer_units`), or its first
    ones (index at the start: the tail read then only learns the size and version). None
    when the object is gone."""
    n = job.src_index_nbytes
    at_end = job.src_layout.index_location == "end"
    if tail is NOT_READ:
        tail = src.get_tails([(key, n if at_end else 0)])[0]
    if tail is None:
        return None
    size = tail.size if tail.size is not None else listed
    if size is None:
        size = src.size(key) or 0
    if size < n:
        raise ShardCorruptError(f"{key}: {size} bytes, shorter than its shard index ({n} bytes)", key=key)
    if at_end:
        return bytes(tail.data), size, tail.version
    head = src.get_ranges([(key, 0, n)], versions=[tail.version] if tail.version is not None else None)[0]
    return (None if head is None else (bytes(head), size, tail.version))


#: what takes a reference unit's ``(key, coordinates, reference)`` (:func:`refer_units`: a batch's list)
Put = Callable[[str, Coords, ChunkRef], None]


def _refer_shard(job: ArrayJob, unit: Unit, src: Inner, dst: Inner, tail: Any = None, put: Put | None = None,
                 live: int | None = None) -> UnitResult:
    """A virtual destination: a source shard becomes a reference to the whole object after
    only its index was read and found sound (every live entry inside the object; a bad
    index is the damage error the copy raises). A shard without a live chunk gets no
    reference (it reads as the fill value); dead bytes stay where they are (offsets are
    absolute in the shard). ``put``: takes the reference instead of ``dst`` (the caller
    puts a batch of them at once); ``live``: the live entries of ``tail``'s index, checked
    already (:func:`_checked`)."""
    assert job.dst_cps is not None
    (_, src_key, listed), = unit.sources
    key = job.dst_key(unit.target)  # type: ignore[arg-type]  # a sharded unit has a target
    if unit.dst_size is not None:
        return UnitResult(skipped=1)
    got = _source_index(job, src, src_key, listed, NOT_READ if tail is None else tail[0])
    if got is None:
        return UnitResult(empty=1)  # deleted since it was listed: nothing to refer to
    raw, size, version = got
    n = job.src_index_nbytes
    at_end = job.src_layout.index_location == "end"
    if live is None:
        live = len(live_entries(raw, job.dst_cps, checksum=bool(job.src_layout.index_checksum), key=src_key,
                                payload_limit=size - n if at_end else size, payload_start=0 if at_end else n))
    if not live:
        return UnitResult(empty=1, bytes_read=len(raw))
    ref = src.reference_to(src_key, 0, size, version)
    if ref is None:
        return UnitResult(empty=1, bytes_read=len(raw))  # deleted since its index was read
    if put is None:
        dst.put_reference(key, ref)
    else:
        put(key, unit.target, ref)  # type: ignore[arg-type]  # a sharded unit has a target
    return UnitResult(referenced=1, chunks=live, bytes_read=len(raw))


def _prefetchable(job: ArrayJob, unit: Unit) -> bool:
    """A unit whose reference needs only its shard's index tail (:func:`refer_units`)."""
    return unit.target is not None and unit.dst_size is None and job.src_layout.index_location == "end"


def refer_units(items: Sequence[tuple[Any, ...]]) -> list[tuple[bool, Any]]:
    """The units of a virtual migration (``(job, unit, attempts, delay)`` items), a batch
    at a time in this thread: the index tails of its shards read with one ``tails_to_refer`` per
    source store (retried as a unit is), each unit's reference made from its tail, then the
    references of each array put with one ``put_references`` (:func:`_put_batch`). A unit
    that fails here on a transient error runs again alone (``run_unit``, retried), so each
    fails as it would alone. ``(ok, result or error)`` per item, in order: no thread, no
    future per shard (a reference unit is a tail read and a few microseconds of work).
    Units with equal counts share one :class:`UnitResult` (the driver only adds them up)."""
    stores: dict[int, tuple[Inner, Inner]] = {}  # per job: its stores, opened once a batch
    for item in items:
        if id(item[0]) not in stores:
            stores[id(item[0])] = (item[0].src.open(), item[0].dst.open())
    tails = _batch_tails(items, stores)
    checked = _checked(items, tails)
    puts: dict[int, list[tuple[int, str, Coords, ChunkRef]]] = {}  # per job: (item, key, coordinates, reference)
    results: dict[tuple[int, int], UnitResult] = {}  # (live entries, bytes read) -> the result of such a unit
    out: list[tuple[bool, Any]] = []
    for i, (job, unit, attempts, delay) in enumerate(items):
        try:
            try:
                live = checked.get(i)
                if live is not None:  # its index checked with the batch's: only the reference to take
                    batch = puts.get(id(job)) or puts.setdefault(id(job), [])
                    result = _refer_checked(job, unit, stores[id(job)][0], tails[i], live, batch, i, results)
                elif i in tails:
                    batch = puts.setdefault(id(job), [])
                    result = _refer_shard(job, unit, *stores[id(job)], (tails[i],),
                                          put=lambda key, coords, ref: batch.append((i, key, coords, ref)))  # noqa: B023 - called at once
                else:
                    result = with_retries(run_unit, job, unit, attempts=attempts, base_delay=delay)
            except Exception as e:  # noqa: BLE001 - a transient one: run alone, retried
                if not is_transient(e) or i not in tails:
                    raise
                result = with_retries(run_unit, job, unit, attempts=attempts, base_delay=delay)
            out.append((True, result))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, item by item
            out.append((False, e))
    for batch in puts.values():
        _put_batch(items, stores, batch, out)
    return out


def _refer_checked(job: ArrayJob, unit: Unit, src: Inner, tail: Tail, live: int,
                   batch: list[tuple[int, str, Coords, ChunkRef]], i: int,
                   results: dict[tuple[int, int], UnitResult]) -> UnitResult:
    """:func:`_refer_shard` of a unit whose index tail :func:`_checked` found sound with
    ``live`` live entries (at the end of its shard, its size known, ``dst_size`` None): the
    reference to the whole object of the version read, added to ``batch`` as item ``i``;
    its result the one of ``results`` with its counts (made there the first time)."""
    n = len(tail.data)
    if not live:
        return UnitResult(empty=1, bytes_read=n)
    _, src_key, listed = unit.sources[0]
    size = tail.size if tail.size is not None else listed
    assert size is not None  # :func:`_checked` checks only indices of a known size
    ref = src.reference_to(src_key, 0, size, tail.version)
    if ref is None:
        return UnitResult(empty=1, bytes_read=n)  # deleted since its index was read
    batch.append((i, job.dst_key(unit.target), unit.target, ref))  # type: ignore[arg-type]  # a prefetchable unit has a target
    result = results.get((live, n))
    if result is None:
        result = results[live, n] = UnitResult(referenced=1, chunks=live, bytes_read=n)
    return result


def _batch_tails(items: Sequence[tuple[Any, ...]], stores: Mapping[int, tuple[Inner, Inner]]) -> dict[int, Any]:
    """The index tails of the batch's prefetchable units (item number -> tail), one
    ``tails_to_refer`` per source store (their references are taken next), retried as a unit is; a store's read that fails leaves
    its units to read (and fail) alone."""
    wanted: dict[int, tuple[Inner, list[int], list[tuple[str, int]]]] = {}  # per store: items, requests
    for i, (job, unit, _, _) in enumerate(items):
        # :func:`_prefetchable`, spelled out (once a shard)
        if unit.target is not None and unit.dst_size is None and job.src_layout.index_location == "end":
            src = stores[id(job)][0]
            mine = wanted.get(id(src)) or wanted.setdefault(id(src), (src, [], []))
            mine[1].append(i)
            mine[2].append((unit.sources[0].key, job.src_index_nbytes))
    tails: dict[int, Any] = {}
    for src, at, requests in wanted.values():
        _, _, attempts, delay = items[at[0]]
        try:
            got = with_retries(src.tails_to_refer, requests, attempts=attempts, base_delay=delay)
        except Exception:  # noqa: BLE001 - each unit then reads (and fails) alone
            continue
        tails.update(zip(at, got))
    return tails


def _checked(items: Sequence[tuple[Any, ...]], tails: Mapping[int, Any]) -> dict[int, int]:
    """The live entries of the batch's index tails that pass :func:`live_counts` (one
    numpy pass per array), by item number; any other is checked alone by
    :func:`_refer_shard` (which raises the damage error naming its shard). The payload
    area ends where :func:`_source_index` puts it: at the shard's size (the tail's, else the
    listed one) less the index."""
    by_job: dict[int, tuple[Any, list[int], list[bytes], list[int]]] = {}  # per job: items, tails, payload limits
    for i, tail in tails.items():
        if tail is None:
            continue
        size = tail.size if tail.size is not None else items[i][1].sources[0].size
        if size is not None:
            job = items[i][0]
            mine = by_job.get(id(job)) or by_job.setdefault(id(job), (job, [], [], []))
            mine[1].append(i)
            mine[2].append(tail.data)
            mine[3].append(size - job.src_index_nbytes)
    out: dict[int, int] = {}
    for job, at, data, limits in by_job.values():
        counts = live_counts(data, job.dst_cps, limits, checksum=bool(job.src_layout.index_checksum))
        out.update((i, count) for i, count in zip(at, counts) if count is not None)
    return out


def _put_batch(items: Sequence[tuple[Any, ...]], stores: Mapping[int, tuple[Inner, Inner]],
               batch: Sequence[tuple[int, str, Coords, ChunkRef]], out: list[tuple[bool, Any]]) -> None:
    """One array's references of a batch (``(item, key, coordinates, reference)``) with one
    ``put_references``, retried as a unit is; when that fails, each is put alone (retried)
    and a reference that fails then fails its own unit (``out[item]``)."""
    if not batch:
        return
    job, _, attempts, delay = items[batch[0][0]]
    dst = stores[id(job)][1]
    try:
        with_retries(dst.put_references, job.path, [(key, coords, ref) for _, key, coords, ref in batch],
                     attempts=attempts, base_delay=delay)
        return
    except Exception:  # noqa: BLE001 - each alone below: an error is its own unit's
        pass
    for i, key, _, ref in batch:
        try:
            with_retries(dst.put_reference, key, ref, attempts=items[i][2], base_delay=items[i][3])
        except Exception as e:  # noqa: BLE001 - handed to the consumer, item by item
            out[i] = (False, e)


def _refer_chunks(unit: Unit, src: Inner, dst: Inner, job: ArrayJob) -> UnitResult:
    """A virtual destination, unsharded target: one reference per chunk object, its length
    from the listing (no byte read)."""
    result = UnitResult()
    refs: list[tuple[str, Coords, ChunkRef]] = []
    present = unit.dst_sizes or (None,) * len(unit.sources)
    for (coords, src_key, size), dst_size in zip(unit.sources, present):
        if dst_size is not None:
            result.skipped += 1
            continue
        if size is None or size < 0:
            size = src.size(src_key)
        ref = None if size is None else src.reference_to(src_key, 0, size)
        if ref is None:
            continue  # deleted since listed
        if ref.object_size != size:  # rewritten since listed: refer to what it is now
            ref = ref._replace(length=ref.object_size)
        refs.append((job.dst_key(coords), coords, ref))
        result.referenced += 1
        result.chunks += 1
    dst.put_references(job.path, refs)  # the unit's chunk objects at once
    return result


def _copy_chunks(job: ArrayJob, unit: Unit, src: Inner, dst: Inner) -> UnitResult:
    """Unsharded target: each chunk object copied verbatim (or recompressed) under its v3 key."""
    result = UnitResult()
    present = unit.dst_sizes or (None,) * len(unit.sources)
    copy = not job.recompress and src.can_copy_to(dst)
    for (coords, src_key, size), dst_size in zip(unit.sources, present):
        if dst_size is not None:  # each chunk object is written whole: present means complete
            result.skipped += 1
            continue
        dst_key = job.dst_key(coords)
        if copy and src.copy_to(src_key, dst, dst_key, size=size):
            result.add(UnitResult(copied=1, chunks=1, bytes_copied=size or 0))
            continue
        payload = read_whole(src, src_key, size)
        if payload is None:
            continue  # deleted since listed
        if job.recompress:
            payload = recompress(job, payload, src_key)
        dst.set(dst_key, payload)
        result.add(UnitResult(written=1, chunks=1, bytes_read=len(payload), bytes_written=len(payload)))
    return result


__all__ = [
    "MARKER_KEY",
    "ArrayJob",
    "ArrayPlan",
    "ArrayReport",
    "Listed",
    "Options",
    "Present",
    "Unit",
    "UnitLog",
    "UnitResult",
    "array_units",
    "job_units",
    "node_key",
    "plan_array",
    "read_source_chunks",
    "read_whole",
    "run_unit",
    "virtual_refusal",
]
