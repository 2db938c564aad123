"""The migration's plan and work units: what one target shard (or batch of chunks) needs, and doing it.

Shared by the two drivers of a migration, :mod:`~sharding_store.migrate` (build the
destination) and :mod:`~sharding_store.verify` (compare it with the source), so both
see the same plan: the translation of each array (:func:`plan_array`), its units
(:func:`array_units`), and the keys and documents of the destination.

A :class:`Unit` is plain, picklable data — source objects with their sizes, the target
coordinates — and an :class:`ArrayJob` says how to open the stores
(:class:`~sharding_store.jobs.StoreRef`) and how the array is laid out on both sides.
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

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from crc32c import crc32c

from .draft_metadata import DraftArrayMeta
from .engine import ArrayLayout, ShardEngine, gather, read_shard_index
from .errors import ChunkDecodeError, ChunkKeyError, DraftMetadataError, LinkOutsideStoreError, ShardCorruptError
from .hierarchy import DraftHierarchy, Node
from .jobs import Source, StoreRef, interleave, other_prefixes, plan_units, resolve_chunks_per_shard
from .keys import Coords
from .shard_index import CHECKSUM_NBYTES, IndexLocation, encode_shard, index_nbytes, live_entries, tiles
from .stores import Inner
from .v3_metadata import portability_problems, portable_target, v3_array_document, v3_chunk_key

#: the object that marks a destination as a migration in progress (and records its options)
MARKER_KEY = ".sharding-store-migration.json"
#: what damages one array only (reported, or left out with ``skip_damaged``), never the whole run
DAMAGE_ERRORS = (ShardCorruptError, ChunkDecodeError, ChunkKeyError, DraftMetadataError, LinkOutsideStoreError)
#: chunk objects per unit when copying an unsharded array chunk by chunk
CHUNK_BATCH = 256
#: a destination object that exists, its size unknown (stores whose listing has no sizes)
PRESENT = -1
MiB = 1 << 20


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
    index_location: IndexLocation = "end"
    portable: bool = False
    #: array path -> names for its dimensions (``--dimension-names``), for arrays without them
    dimension_names: Mapping[str, tuple[str | None, ...]] | None = None

    def marker(self, src: str) -> dict[str, Any]:
        cps = self.chunks_per_shard
        return {
            "migration": "sharding-store",
            "src": src,
            "chunks_per_shard": list(cps) if isinstance(cps, tuple) else cps,
            "index_checksum": self.index_checksum,
            "index_location": self.index_location,
            "portable": self.portable,
            **({"dimension_names": {p: list(n) for p, n in sorted(self.dimension_names.items())}}
               if self.dimension_names else {}),
        }


@dataclass
class ArrayReport:
    path: str
    shards: int = 0  # target objects (shards, or chunks of an unsharded array)
    bytes: int = 0  # source bytes listed
    chunks_per_shard: list[int] | None = None
    recompressed: bool = False
    portable: bool = True


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

    @property
    def same_grid(self) -> bool:
        return self.src_layout.chunks_per_shard is not None and self.src_layout.chunks_per_shard == self.dst_cps

    @property
    def recompress(self) -> bool:
        return self.target is not None

    @property
    def can_copy_shards(self) -> bool:
        """A compact source shard (chunks in any order) is a valid target shard byte for byte,
        followed by the CRC32C of its index when the target index has one."""
        return self.same_grid and self.index_location == "end" and not self.recompress

    def dst_key(self, coords: Coords) -> str:
        return self.dst_prefix + v3_chunk_key(coords, self.src_layout.separator)

    def dst_index_nbytes(self) -> int:
        assert self.dst_cps is not None
        return index_nbytes(self.dst_cps, self.checksum)


@dataclass
class ArrayPlan:
    node: Node
    doc: dict[str, Any]
    job: ArrayJob
    report: ArrayReport


def plan_array(node: Node, src: StoreRef, dst: StoreRef, opts: Options) -> tuple[ArrayPlan, list[str]]:
    """Translate one array's metadata and describe its job; returns warnings too."""
    meta = node.meta
    assert meta is not None
    target = meta.chunks_per_shard
    if opts.chunks_per_shard is not None and meta.ndim == 0:
        target = ()  # a 0-d array's one chunk, whatever was asked for the others
    elif opts.chunks_per_shard is not None:
        target = resolve_chunks_per_shard(meta, opts.chunks_per_shard)
    portable = portable_target(meta)
    target_meta = portable if opts.portable else None
    doc = v3_array_document(
        target_meta or meta,
        chunks_per_shard=target,
        index_codecs_checksum=opts.index_checksum,
        index_location=opts.index_location,
        dimension_names=None if not opts.dimension_names or node.path not in opts.dimension_names
        else list(opts.dimension_names[node.path]),
    )
    problems = portability_problems(target_meta or meta)
    warnings = []
    if problems:
        hint = "; --portable makes it readable by every v3 reader" if portable is not None and not opts.portable else ""
        warnings.append(f"{node.path or '/'}: only zarr-python will read it ({'; '.join(problems)}){hint}")
    job = ArrayJob(
        path=node.path,
        src=src,
        dst=dst,
        src_layout=ArrayLayout.from_meta(meta),
        dst_prefix=node_prefix(node.path),
        dst_cps=target,
        checksum=opts.index_checksum,
        index_location=opts.index_location,
        meta=meta if target_meta is not None else None,
        target=target_meta,
    )
    report = ArrayReport(node.path, chunks_per_shard=None if target is None else list(target),
                         recompressed=target_meta is not None, portable=not problems)
    return ArrayPlan(node, doc, job, report), warnings


# --------------------------------------------------------------------------- units


@dataclass(frozen=True)
class Unit:
    """One independent piece of work.

    Sharded target: ``target`` is the target shard and ``sources`` the source objects
    holding its chunks. Unsharded target: ``target`` is None and each source chunk
    object is one target object. The sizes of target objects found in the destination
    listing (resume, verify) come along: ``dst_size`` for the shard, ``dst_sizes`` per
    source chunk (None: absent).
    """

    sources: tuple[Source, ...]
    target: Coords | None = None
    dst_size: int | None = None
    dst_sizes: tuple[int | None, ...] = ()


@dataclass
class UnitResult:
    """What a unit did; results add up into the report."""

    written: int = 0  # objects built here and written
    copied: int = 0  # objects copied by the store (bytes never read here)
    skipped: int = 0  # already complete in the destination (resume)
    empty: int = 0  # target shards without a live chunk: not written
    chunks: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_copied: int = 0
    dead_bytes: int = 0  # unreferenced source bytes dropped by compaction

    def add(self, other: UnitResult) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def objects(self) -> int:
        return self.written + self.copied + self.skipped


def job_units(
    job: ArrayJob,
    listing: Iterable[tuple[str, int | None]],
    *,
    existing: Mapping[str, int | None] | None = None,
    ignore: tuple[str, ...] = (),
) -> tuple[list[Unit], list[str], int]:
    """The units of one array from a listing of its source prefix.

    Returns ``(units, stray keys, source bytes)``. Keys under ``ignore`` (other nodes'
    prefixes) are skipped silently; other keys that are not this array's chunk or shard
    keys are reported as stray. ``existing`` maps destination keys to sizes (resume).
    """
    layout = job.src_layout
    existing = existing or {}

    def dst_size(key: str) -> int | None:
        if key not in existing:
            return None
        size = existing[key]
        return PRESENT if size is None else size

    objects: list[Source] = []
    stray: list[str] = []
    nbytes = 0
    for key, size in listing:
        coords = layout.parse(key)
        if coords is None:
            if not (ignore and key.startswith(ignore)):
                stray.append(key)
            continue
        objects.append(Source(coords, key, size))
        nbytes += size or 0
    if job.dst_cps is None:
        units = []
        for i in range(0, len(objects), CHUNK_BATCH):
            batch = tuple(objects[i : i + CHUNK_BATCH])
            units.append(Unit(batch, None, None, tuple(dst_size(job.dst_key(s.coords)) for s in batch)))
        return units, stray, nbytes
    if job.same_grid:  # one unit per source shard, even one outside the grid (copied as it is)
        by_coords = {s.coords: s for s in objects}  # two spellings of one key: the later wins
        groups = plan_units(by_coords.values(), job.dst_cps, job.dst_cps)
    else:
        src_cps = layout.chunks_per_shard or (1,) * layout.ndim
        groups = plan_units(objects, src_cps, job.dst_cps, grid=layout.grid_shape)
    units = [Unit(g.sources, g.target, dst_size(job.dst_key(g.target))) for g in groups if g.target is not None]
    return interleave(units, lambda u: job.dst_key(u.target).rpartition("/")[0]), stray, nbytes  # type: ignore[arg-type]


def array_units(
    plan: ArrayPlan, h: DraftHierarchy, src: Inner, existing: Mapping[str, int | None] | None = None
) -> tuple[list[Unit], list[str]]:
    """The units of one array; ``existing``: the destination listing (key -> size)."""
    units, stray, nbytes = job_units(
        plan.job, src.list_sized(plan.job.src_layout.prefix), existing=existing, ignore=other_prefixes(h, plan.node.path)
    )
    plan.report.bytes = nbytes
    plan.report.shards = len(units) if plan.job.dst_cps is not None else sum(len(u.sources) for u in units)
    warnings = [f"{plan.node.path or '/'}: {len(stray)} stray key(s) under its data prefix not migrated, e.g. {stray[0]}"] if stray else []
    return units, warnings


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
    from .chunk_codec import decode_chunk_payload, encode_chunk_payload

    assert job.meta is not None and job.target is not None
    return encode_chunk_payload(job.target, decode_chunk_payload(job.meta, payload, key=key))


# --------------------------------------------------------------------------- running


def run_unit(job: ArrayJob, unit: Unit) -> UnitResult:
    """Write one unit's target objects (idempotent: every write replaces a whole object)."""
    src, dst = job.src.open(), job.dst.open()
    if unit.target is None:
        return _copy_chunks(job, unit, src, dst)
    key = job.dst_key(unit.target)
    if unit.dst_size is not None and _is_complete(dst, key, unit.dst_size, job):
        return UnitResult(skipped=1)
    if job.can_copy_shards:
        copied = _try_copy_shard(job, unit, src, dst, key)
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
    rebuilds it, or reports the damage with the whole object in hand)."""
    assert job.dst_cps is not None
    limit = size - index_nbytes(job.dst_cps)
    try:
        live = live_entries(raw, job.dst_cps, key=src_key, payload_limit=max(0, limit))
    except ShardCorruptError:
        return None
    if not live:
        return UnitResult(empty=1)
    if not tiles(live, 0, limit):
        return None
    return len(live), (crc32c(raw).to_bytes(CHECKSUM_NBYTES, "little") if job.checksum else b"")


def _try_copy_shard(job: ArrayJob, unit: Unit, src: Inner, dst: Inner, key: str) -> UnitResult | None:
    """Copy a compact source shard as it is, after reading only its index, by the store
    (:meth:`Inner.copy_to`), of the version whose index was read; None when it has dead
    bytes, a bad index, or these stores cannot copy between them (the general path)."""
    (_, src_key, size), = unit.sources
    if size is None or not src.can_copy_to(dst, append=job.checksum):
        return None  # reading the index would be wasted: the shard is read whole next
    n = index_nbytes(job.dst_cps)  # type: ignore[arg-type]
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
    "Options",
    "Unit",
    "UnitResult",
    "array_units",
    "job_units",
    "node_key",
    "plan_array",
    "read_source_chunks",
    "read_whole",
    "run_unit",
]
