"""Migration work units: what one target shard (or batch of chunks) needs, and doing it.

Shared by :mod:`~sharding_store.migrate` (build the destination) and
:mod:`~sharding_store.verify` (compare it with the source), so both see the same plan.

A :class:`Unit` is plain, picklable data — source keys with their sizes, the target
coordinates — and an :class:`ArrayJob` says how to open the stores (a URL and storage
options) and how the array is laid out on both sides. Workers open stores themselves
(cached per process), so units run on threads or on a dask cluster alike.

Targets:

* sharded target, same ``chunks_per_shard`` as the source: one unit per source shard.
  A compact one (no dead bytes; chunks in any order) is already a valid v1.0 shard
  with the index at the end, so after reading only its index it is copied by the
  filesystem (a kernel copy on local disk, plus the 4-byte CRC32C of its index;
  S3 server-side CopyObject when there is no checksum to append). Otherwise it is
  read whole (one request), rebuilt compact with one join, written once;
* sharded target, other layout: one unit per target shard, gathering its chunks
  through :func:`~sharding_store.reshard.gather_target_shard`;
* unsharded target: batches of chunk objects, copied verbatim (or recompressed).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from crc32c import crc32c

from .draft_metadata import DraftArrayMeta
from .errors import MigrationError, UsageError
from .inner import TEMP_MARKER, FsspecInner, Inner, as_inner, atomic_local_file, write_all
from .keys import Coords
from .shard_index import (
    CHECKSUM_NBYTES,
    ShardCorruptError,
    ShardIndex,
    encode_shard,
    index_nbytes,
    live_entries,
    payload_bounds,
    read_index,
    tiles,
)
from .store import ArrayLayout
from .v3_metadata import v3_chunk_key

if TYPE_CHECKING:
    from numcodecs.abc import Codec

IndexLocation = Literal["start", "end"]
#: chunk objects per unit when copying an unsharded array chunk by chunk
CHUNK_BATCH = 256
S3_COPY_LIMIT = 5 * 2**30
#: a destination object that exists, its size unknown (stores whose listing has no sizes)
PRESENT = -1
#: a listed object: (grid coordinates, key, size in bytes if the listing said)
Source = tuple[Coords, str, "int | None"]


# --------------------------------------------------------------------------- stores


@dataclass(frozen=True)
class StoreRef:
    """How a worker reaches a store: a URL and storage options, or (threads only) an object."""

    url: str | None
    storage_options: tuple[tuple[str, str], ...] = ()  # JSON-encoded values: hashable, picklable
    obj: Any = None

    @classmethod
    def of(cls, store: Any, storage_options: Mapping[str, Any] | None = None) -> StoreRef:
        if isinstance(store, StoreRef):
            return store
        if isinstance(store, os.PathLike):
            store = os.fspath(store)
        opts = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in (storage_options or {}).items()))
        if isinstance(store, str):
            return cls(store, opts)
        return cls(None, opts, store)

    @property
    def picklable(self) -> bool:
        return self.url is not None

    def describe(self) -> str:
        return self.url if self.url is not None else type(self.obj).__name__

    def open(self) -> Inner:
        """The store's adapter, opened once per process and reused."""
        if self.url is None:
            return as_inner(self.obj)
        with _OPEN_LOCK:
            inner = _OPENED.get((self.url, self.storage_options))
            if inner is None:
                options = {k: json.loads(v) for k, v in self.storage_options}
                inner = _OPENED[(self.url, self.storage_options)] = as_inner(self.url, storage_options=options)
        return inner


_OPENED: dict[tuple[str, tuple[tuple[str, str], ...]], Inner] = {}
_OPEN_LOCK = threading.Lock()


def fsspec_of(inner: Any) -> FsspecInner | None:
    """The :class:`FsspecInner` below ``inner`` (unwrapping e.g. ``CountingInner``), if any."""
    seen = 0
    while inner is not None and seen < 8:
        if isinstance(inner, FsspecInner):
            return inner
        inner = getattr(inner, "inner", None)
        seen += 1
    return None


def local_pair(src: Inner, dst: Inner) -> tuple[FsspecInner, FsspecInner] | None:
    """Both stores' adapters when both are local directories (kernel copies, files read
    directly, one thread per core by default), else None."""
    s, d = fsspec_of(src), fsspec_of(dst)
    return (s, d) if s is not None and d is not None and s.is_local and d.is_local else None


def remove_temp_files(inner: Inner, prefix: str = "") -> None:
    """Delete the temporary files that killed writes left below ``prefix`` (local disk
    only; elsewhere a write is atomic and leaves nothing). Only for places no other
    process writes to meanwhile: a migration's destination, a reshard's staging area."""
    fs_inner = fsspec_of(inner)
    if fs_inner is None or not fs_inner.is_local:
        return
    top = fs_inner._path(prefix.rstrip("/")) if prefix.rstrip("/") else fs_inner.root
    for directory, _, files in os.walk(top):
        for name in files:
            if TEMP_MARKER in name:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))


def list_sized(inner: Inner, prefix: str) -> Iterator[tuple[str, int | None]]:
    """Keys under ``prefix`` with their sizes, from one listing (sizes are free on fsspec
    and local disk; other stores give None)."""
    fs_inner = fsspec_of(inner)
    if fs_inner is None:
        for key in inner.list_prefix(prefix):
            yield key, None
        return
    yield from fs_inner.list_sized(prefix)


def read_whole(inner: Inner, key: str, size: int | None) -> bytes | None:
    """A whole object; with its size known (from a listing) as one ranged GET, which spares
    object stores the HEAD request a plain whole-object read may cost."""
    if size is None or size < 0:
        return inner.get(key)
    return inner.get_ranges([(key, 0, size)])[0]


def can_copy(src: Inner, dst: Inner, *, appending: bool = False) -> bool:
    """Whether :func:`copy_within` works between these stores (object stores cannot append)."""
    s, d = fsspec_of(src), fsspec_of(dst)
    if s is None or d is None:
        return False
    return (s.is_local and d.is_local) or (s.fs is d.fs and not appending)


def copy_within(src: Inner, src_key: str, dst: Inner, dst_key: str, size: int | None = None, *, append: bytes = b"") -> bool:
    """Copy one object (plus ``append``) without its bytes passing through this process.

    Local disk: a kernel copy (``copy_file_range``/``sendfile``) to a temporary name, then
    ``os.replace``. The same fsspec filesystem (e.g. one S3 endpoint): a server-side
    CopyObject (nothing can be appended there). Returns False when neither applies (the
    caller reads and writes).
    """
    s, d = fsspec_of(src), fsspec_of(dst)
    if s is None or d is None:
        return False
    if s.is_local and d.is_local:
        _local_copy(s._path(src_key), d._path(dst_key), append)
        return True
    if s.fs is d.fs and not append:
        _server_copy(d.fs, s._path(src_key), d._path(dst_key), size)
        return True
    return False


def _server_copy(fs: Any, src_path: str, dst_path: str, size: int | None) -> None:
    """One CopyObject request on S3 when the size is known to be below its 5 GiB limit
    (``fs.copy`` would first list and stat); otherwise the filesystem's own copy."""
    if hasattr(fs, "call_s3") and size is not None and size < S3_COPY_LIMIT:
        src_bucket, src_key, _ = fs.split_path(src_path)
        dst_bucket, dst_key, _ = fs.split_path(dst_path)
        fs.call_s3("copy_object", Bucket=dst_bucket, Key=dst_key, CopySource={"Bucket": src_bucket, "Key": src_key})
        fs.invalidate_cache(dst_path)
        return
    fs.cp_file(src_path, dst_path)


def _local_copy(src_path: str, dst_path: str, append: bytes = b"") -> None:
    """Kernel copy of ``src_path`` (plus ``append``) into ``dst_path``, atomically:
    one open of each file, ``copy_file_range`` (no user-space copy)."""
    src_fd = os.open(src_path, os.O_RDONLY)
    try:
        _local_copy_fd(src_fd, src_path, dst_path, append)
    finally:
        os.close(src_fd)


def _local_copy_fd(src_fd: int, src_path: str, dst_path: str, append: bytes = b"", size: int | None = None) -> None:
    """:func:`_local_copy` from a file already open (``size``: its size, when known)."""
    with atomic_local_file(dst_path) as (fd, tmp):
        if not _copy_fd(src_fd, fd, size):  # no kernel copy between these files: the portable way
            os.ftruncate(fd, 0)
            shutil.copyfile(src_path, tmp)  # sendfile where it can
            os.lseek(fd, 0, os.SEEK_END)
        write_all(fd, append)


def _copy_fd(src_fd: int, dst_fd: int, size: int | None = None) -> bool:
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


def _copy_local_shard(job: ArrayJob, src_path: str, src_key: str, dst_path: str) -> UnitResult | None:
    """A compact local source shard copied by the kernel after reading only its index,
    from one open of the source (the copy is of the same file the index came from)."""
    assert job.dst_cps is not None
    try:
        fd = os.open(src_path, os.O_RDONLY)
    except FileNotFoundError:
        return None  # deleted since listed: the general path reports it
    try:
        size = os.fstat(fd).st_size
        n = index_nbytes(job.dst_cps)
        plan = _shard_copy_plan(job, os.pread(fd, n, size - n) if size >= n else b"", size, src_key)
        if not isinstance(plan, tuple):
            return plan
        n_live, suffix = plan
        _local_copy_fd(fd, src_path, dst_path, suffix, size)
    finally:
        os.close(fd)
    return UnitResult(copied=1, chunks=n_live, bytes_copied=size, bytes_written=len(suffix))


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


# --------------------------------------------------------------------------- jobs and units


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
    compressor: Codec | None = None  # recompress payloads with this codec; None: verbatim

    @property
    def same_grid(self) -> bool:
        return self.src_layout.chunks_per_shard is not None and self.src_layout.chunks_per_shard == self.dst_cps

    @property
    def recompress(self) -> bool:
        return self.compressor is not None

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
    copied: int = 0  # objects copied by the filesystem (bytes never read here)
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


# --------------------------------------------------------------------------- planning


def _target_shards(coords: Coords, src_cps: Coords, dst_cps: Coords, grid: Coords) -> Iterator[Coords]:
    """Target shards overlapping the chunks of source object ``coords`` (clipped to the grid)."""
    ranges = []
    for c, a, b, g in zip(coords, src_cps, dst_cps, grid):
        lo, hi = c * a, min((c + 1) * a, g) - 1
        if hi < lo:
            return  # an object wholly outside the array: nothing of it is readable
        ranges.append(range(lo // b, hi // b + 1))
    yield from itertools.product(*ranges)


def plan_units(
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
        objects.append((coords, key, size))
        nbytes += size or 0
    if job.dst_cps is None:
        units = []
        for i in range(0, len(objects), CHUNK_BATCH):
            batch = tuple(objects[i : i + CHUNK_BATCH])
            units.append(Unit(batch, None, None, tuple(dst_size(job.dst_key(c)) for c, _, _ in batch)))
        return units, stray, nbytes
    if job.same_grid:
        groups: dict[Coords, list[Source]] = {c: [(c, k, s)] for c, k, s in objects}
    else:
        src_cps = layout.chunks_per_shard or (1,) * layout.ndim
        grid = layout.grid_shape or ()
        groups = {}
        for obj in objects:
            for target in _target_shards(obj[0], src_cps, job.dst_cps, grid):
                groups.setdefault(target, []).append(obj)
    units = [Unit(tuple(srcs), t, dst_size(job.dst_key(t))) for t, srcs in groups.items()]
    return interleave_directories(units, job), stray, nbytes


def interleave_directories(units: list[Unit], job: ArrayJob) -> list[Unit]:
    """Units reordered so that consecutive ones write into different directories.

    Creating a file costs far more than copying a small shard's bytes, and a filesystem
    creates files in one directory one at a time (the directory is locked), but in
    different directories in parallel: workers taking units in key order would queue
    on one directory's lock. Round-robin over the target directories instead.
    """
    by_dir: dict[str, list[Unit]] = {}
    for unit in units:
        assert unit.target is not None
        by_dir.setdefault(job.dst_key(unit.target).rpartition("/")[0], []).append(unit)
    if len(by_dir) < 2:
        return units
    return [u for group in itertools.zip_longest(*by_dir.values()) for u in group if u is not None]


# --------------------------------------------------------------------------- reading


@dataclass
class SourceChunks:
    """The payloads of one target shard (local coords -> bytes), read from the source."""

    chunks: dict[Coords, bytes | memoryview] = field(default_factory=dict)
    bytes_read: int = 0
    dead_bytes: int = 0
    blob: bytes | None = None  # the whole source shard, when it was read whole


def read_source_chunks(job: ArrayJob, unit: Unit, src: Inner) -> SourceChunks:
    """Read what a sharded target needs: a whole source shard (same grid) or a gather."""
    from .reshard import gather_target_shard

    assert unit.target is not None and job.dst_cps is not None
    if job.same_grid:
        (_, key, size), = unit.sources
        blob = read_whole(src, key, size)
        if blob is None:
            return SourceChunks()  # deleted since it was listed: nothing to carry over
        index = read_index(blob, job.dst_cps, key=key)
        view = memoryview(blob)
        chunks = {c: view[o : o + n] for c, o, n in index.live()}
        dead = len(blob) - index_nbytes(job.dst_cps) - index.live_nbytes()
        return SourceChunks(chunks, len(blob), max(0, dead), blob)
    layout = job.src_layout
    if layout.ndim == 0:  # keep the source's spelling of the only key ("c0" or "c")
        layout = replace(layout, zero_d=unit.sources[0][1][len(layout.prefix) :])
    chunks = gather_target_shard(src, layout, unit.target, job.dst_cps, sources=[k for _, k, _ in unit.sources])
    return SourceChunks(dict(chunks), sum(len(v) for v in chunks.values()))


def read_shard_index(
    inner: Inner, key: str, size: int, cps: Coords, *, checksum: bool = False, index_location: IndexLocation = "end"
) -> ShardIndex:
    """Parse (and checksum) the index of a shard of known size, reading only the index."""
    n = index_nbytes(cps, checksum)
    if size < n:
        raise ShardCorruptError(f"{key}: object is {size} bytes, shorter than its {n}-byte shard index", key=key)
    lo = 0 if index_location == "start" else size - n
    raw = inner.get_ranges([(key, lo, lo + n)])[0] or b""
    start, limit = payload_bounds(size, cps, checksum=checksum, index_location=index_location)
    return ShardIndex.from_bytes(raw, cps, checksum=checksum, key=key, payload_limit=limit, payload_start=start)


def recompress(job: ArrayJob, payload: bytes | memoryview, key: str) -> bytes:
    """Decode a draft payload and encode it again with ``job.compressor`` (``--portable``)."""
    from .chunk_codec import decode_chunk_payload, encode_chunk_payload

    assert job.meta is not None
    return encode_chunk_payload(job.meta, decode_chunk_payload(job.meta, payload, key=key), compressor=job.compressor)


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


def _try_copy_shard(job: ArrayJob, unit: Unit, src: Inner, dst: Inner, key: str) -> UnitResult | None:
    """Copy a compact source shard as it is; None when it has dead bytes or cannot be copied."""
    (_, src_key, size), = unit.sources
    if size is None or not can_copy(src, dst, appending=job.checksum):
        return None  # reading the index would be wasted: the shard is read whole next
    local = local_pair(src, dst)
    if local is not None:
        return _copy_local_shard(job, local[0]._path(src_key), src_key, local[1]._path(key))
    n = index_nbytes(job.dst_cps)  # type: ignore[arg-type]
    raw = (src.get_ranges([(src_key, size - n, size)])[0] or b"") if size >= n else b""
    plan = _shard_copy_plan(job, raw, size, src_key)
    if not isinstance(plan, tuple):
        return plan
    n_live, suffix = plan
    if not copy_within(src, src_key, dst, key, size, append=suffix):
        return None
    return UnitResult(copied=1, chunks=n_live, bytes_copied=size, bytes_written=len(suffix))


def _copy_chunks(job: ArrayJob, unit: Unit, src: Inner, dst: Inner) -> UnitResult:
    """Unsharded target: each chunk object copied verbatim (or recompressed) under its v3 key."""
    result = UnitResult()
    present = unit.dst_sizes or (None,) * len(unit.sources)
    for (coords, src_key, size), dst_size in zip(unit.sources, present):
        if dst_size is not None:  # each chunk object is written whole: present means complete
            result.skipped += 1
            continue
        dst_key = job.dst_key(coords)
        if not job.recompress and copy_within(src, src_key, dst, dst_key, size):
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


def check_picklable(*refs: StoreRef) -> None:
    """Work sent to another process must open its stores from a URL."""
    for ref in refs:
        if not ref.picklable:
            raise UsageError(
                f"{ref.describe()}: an executor runs work in other processes, which need a store "
                "URL (path, file://, s3://...), not a store object"
            )


__all__ = [
    "ArrayJob",
    "StoreRef",
    "Unit",
    "UnitResult",
    "copy_within",
    "list_sized",
    "can_copy",
    "check_picklable",
    "interleave_directories",
    "local_pair",
    "plan_units",
    "read_source_chunks",
    "read_shard_index",
    "remove_temp_files",
    "run_unit",
]
