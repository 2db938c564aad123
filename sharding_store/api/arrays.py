"""Draft-era arrays and groups with numpy-style reads and writes.

``open_draft`` gives a :class:`DraftArray` or :class:`DraftGroup` for any store our API
accepts: the 2022 draft layout (read and write) and the 2023 intermediate generation
(read; its arrays come as :class:`~sharding_store.formats.v3_layout.V3ArrayMeta`, whose chunk keys
and shard index layout :class:`~sharding_store.engine.shard_engine.ArrayLayout` carries). An array
reads a selection by computing the chunk keys it needs, fetching them with **one** batched call per batch (for a sharded array one
``ShardEngine.read_chunks``: each shard's index once, then coalesced ranges; a shard
whose every chunk is selected is read whole in one request, its index taken from its
own tail), and decoding the chunks on a thread pool straight into a preallocated
output. Writes go through the engine's ``rewrite_shard`` so each shard is rewritten
once per batch, and whole chunks are encoded without reading anything.

Semantics follow zarr-python 2.18's v3 ``Array``: missing chunks read as the fill
value (zeros when it is ``None``), edge chunks are stored full-size padded with the
fill value, and ``write_empty_chunks=True`` (2.18's default) stores chunks even when
they hold only the fill value.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import os
import threading
import time
from array import array as _array
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, Unpack

import numpy as np

from .. import _numcodecs_adapter
from ..codec import _native
from ..codec.buffers import io_buffer
from ..codec.chunk_codec import ChunkCodec, decode_chunk_payload, encode_chunk_payload, fill_chunk
from ..engine.shard_engine import ArrayLayout, ChunkRange, ShardEngine, WholeShard, keep_read_buffers
from ..errors import ChunkDecodeError, DestinationExistsError, ReadOnlyError, StoreNotFoundError, UsageError
from ..formats import draft_metadata as dm
from ..formats.keys import Coords, chunk_to_shard
from ..formats.shard_index import MAX_UINT64
from ..stores import Inner, in_memory
from .hierarchy import DraftHierarchy, draft_entry_point, inner_of, walked_model

if TYPE_CHECKING:
    from numcodecs.abc import Codec

__all__ = [
    "DraftArray",
    "DraftGroup",
    "SelectionError",
    "create_draft_array",
    "create_draft_group",
    "open_draft",
    "DEFAULT_COMPRESSOR",
]

_Blosc = _numcodecs_adapter.load().Blosc  # numcodecs without its entry-point scan
#: zarr-python 2.x's default compressor (``zarr.storage.default_compressor``)
DEFAULT_COMPRESSOR: Codec = _Blosc(cname="lz4", clevel=5, shuffle=_Blosc.SHUFFLE)
#: decoded bytes handled per batch: bounds memory, and lets decoding overlap the next fetch
BATCH_BYTES = 64 * 2**20
#: shard indices kept per array, so that warm reads cost one request per shard
INDEX_CACHE_SIZE = 1024
#: a read touching at most this many chunks runs on the calling thread (no pool hand-off)
INLINE_CHUNKS = 64
#: whole shards of a remote store are each read and decoded by one task on the I/O threads, as
#: they arrive (False: in runs on the decoding pool, as a local directory's)
READ_AHEAD = True
#: whole shards of a remote store read at once (the I/O threads: each waits for one object, then
#: decodes it)
READ_WINDOW = 32
#: an I/O thread keeps its read and scratch buffers only up to this size (there are READ_WINDOW
#: of them: a bigger shard gets fresh buffers, freed after it)
IO_KEEP = 2 * 2**20
#: merge chunk ranges of one shard separated by less than this (dead bytes, skipped chunks)
COALESCE_GAP = 1 * 2**20
_MODES = ("r", "r+", "a")


class SelectionError(UsageError, IndexError):
    """An index numpy's basic indexing would refuse (out of bounds, step 0, fancy indexing)."""


# --------------------------------------------------------------------------- selections


@dataclass(frozen=True)
class DimSelection:
    """One dimension of a basic selection, as a forward range ``start:stop:step`` (step > 0).

    ``drop``: an integer index (the dimension disappears from the result);
    ``reverse``: a negative-step slice, read forward and flipped afterwards.
    """

    start: int
    stop: int
    step: int
    count: int
    drop: bool = False
    reverse: bool = False


def _dim_selection(key: Any, extent: int, dim: int) -> DimSelection:
    if isinstance(key, slice):
        start, stop, step = key.indices(extent)  # raises ValueError for step 0
        rng = range(start, stop, step)
        if step > 0 or not rng:
            count = len(rng)
            return DimSelection(start if count else 0, stop if count else 0, max(step, 1), count)
        return DimSelection(rng[-1], rng[0] + 1, -step, len(rng), reverse=True)
    if isinstance(key, (bool, np.bool_)):
        raise SelectionError(f"dimension {dim}: boolean index {key!r} is not supported (basic indexing only)")
    try:
        i = operator.index(key)
    except TypeError:
        raise SelectionError(
            f"dimension {dim}: unsupported index {key!r} (integers, slices and ... only)"
        ) from None
    if not -extent <= i < extent:
        raise SelectionError(f"dimension {dim}: index {i} is out of bounds for extent {extent}")
    i %= extent
    return DimSelection(i, i + 1, 1, 1, drop=True)


def normalize_selection(key: Any, shape: tuple[int, ...]) -> tuple[tuple[DimSelection, ...], bool]:
    """Basic numpy indexing -> one :class:`DimSelection` per dimension, and whether the
    result is a scalar (every dimension integer-indexed, no ``...``)."""
    items = key if isinstance(key, tuple) else (key,)
    n_ellipsis = sum(1 for k in items if k is Ellipsis)
    if n_ellipsis > 1:
        raise SelectionError("an index can only have a single ellipsis ('...')")
    if len(items) - n_ellipsis > len(shape):
        raise SelectionError(f"too many indices: {len(items) - n_ellipsis} for a {len(shape)}-d array")
    if n_ellipsis:
        pos = next(i for i, k in enumerate(items) if k is Ellipsis)
        items = items[:pos] + (slice(None),) * (len(shape) - len(items) + 1) + items[pos + 1 :]
    else:
        items = items + (slice(None),) * (len(shape) - len(items))
    try:
        sels = tuple(_dim_selection(k, n, d) for d, (k, n) in enumerate(zip(items, shape)))
    except ValueError as e:  # slice step 0
        raise SelectionError(f"invalid slice: {e}") from None
    scalar = not n_ellipsis and all(s.drop for s in sels) and (len(shape) > 0 or key == ())
    return sels, scalar


class DimPiece(NamedTuple):
    """One chunk's share of one dimension of a selection."""

    chunk: int  # the chunk's index along the dimension
    inner: slice  # the selection inside the chunk
    outer: slice  # where it lands in the forward output
    covers: bool  # every in-bounds element of the chunk is selected


def dim_pieces(sel: DimSelection, chunk: int, extent: int) -> list[DimPiece]:
    """Split one dimension's selection by chunk. ``covers``: every in-bounds element of that
    chunk is selected (a write needs no read-modify-write in this dimension)."""
    if sel.count == 0:
        return []
    last = sel.start + (sel.count - 1) * sel.step
    if sel.step >= chunk:  # at most one element per chunk: no need to visit empty chunks
        ks: Iterator[int] | range = (i // chunk for i in range(sel.start, last + 1, sel.step))
    else:
        ks = range(sel.start // chunk, last // chunk + 1)
    out = []
    for k in ks:
        lo, hi = k * chunk, min(k * chunk + chunk, extent)
        first = sel.start if sel.start >= lo else sel.start + -(-(lo - sel.start) // sel.step) * sel.step
        end = min(hi, last + 1)
        if first >= end:
            continue
        n = (end - 1 - first) // sel.step + 1
        o = (first - sel.start) // sel.step
        inner = slice(first - lo, first - lo + (n - 1) * sel.step + 1, sel.step)
        out.append(DimPiece(k, inner, slice(o, o + n), n == hi - lo))
    return out


class _Piece(NamedTuple):
    """One chunk touched by a selection (a NamedTuple: plans can hold millions of them)."""

    coords: Coords
    key: str
    chunk_sel: tuple[slice, ...]
    out_sel: tuple[slice, ...]
    covers: bool



class Segment(NamedTuple):
    """A run of consecutive chunks of one dimension of a shard that take the same selection."""

    positions: slice  # their positions in the shard's list of touched chunks
    inner: slice  # the selection inside each of them
    outer: slice  # the output range the run covers
    count: int  # type: ignore[assignment]  # elements per chunk (a field named like tuple.count)


class _DimGroup(NamedTuple):
    """The chunks one selection touches in one dimension of one shard.

    ``ks``: their chunk indices; ``segments``: runs of consecutive chunks that take the same
    selection (one vectorised copy per combination of runs); ``covers``: every in-bounds
    element of the chunk is selected; ``full``: the chunk lies wholly inside the array;
    ``every``: the shard's every chunk (of the grid) in this dimension is touched.
    """

    ks: np.ndarray
    segments: tuple[Segment, ...]
    covers: np.ndarray
    full: np.ndarray
    every: bool = False


def dim_groups(sel: DimSelection, chunk: int, extent: int, per_shard: int) -> list[_DimGroup]:
    """One dimension of a selection, split by shard and described for whole-shard copies."""
    groups = []
    for _, grp in itertools.groupby(dim_pieces(sel, chunk, extent), key=lambda piece: piece[0] // per_shard):
        pieces = list(grp)
        segments: list[Segment] = []
        for j, (_, inner, outer, _) in enumerate(pieces):
            n = outer.stop - outer.start
            if segments:
                js, prev_inner, prev_out, prev_n = segments[-1]
                if prev_inner == inner and prev_n == n and prev_out.stop == outer.start:
                    segments[-1] = Segment(slice(js.start, j + 1), inner, slice(prev_out.start, outer.stop), n)
                    continue
            segments.append(Segment(slice(j, j + 1), inner, outer, n))
        ks = np.fromiter((p[0] for p in pieces), dtype=np.int64, count=len(pieces))
        covers = np.fromiter((p[3] for p in pieces), dtype=bool, count=len(pieces))
        full = (ks + 1) * chunk <= extent
        first = pieces[0][0] // per_shard * per_shard
        every = len(pieces) == min(per_shard, -(-extent // chunk) - first)  # ks are distinct and sorted
        groups.append(_DimGroup(ks, tuple(segments), covers, full, every))
    return groups


def _shard_coords(combo: tuple[_DimGroup, ...]) -> np.ndarray:
    """Grid coordinates of a shard's touched chunks, in C order of the combination: (n, ndim)."""
    out = combo[0].ks.reshape(-1, 1)
    for g in combo[1:]:
        out = np.concatenate((np.repeat(out, len(g.ks), axis=0), np.tile(g.ks, len(out))[:, None]), axis=1)
    return out


def _outer_and(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The flat C-order product mask of per-dimension masks."""
    out = arrays[0]
    for a in arrays[1:]:
        out = np.logical_and.outer(out, a)
    return out.reshape(-1)


_NO_ROWS = object()
_SCRATCH = threading.local()
_SCRATCH_KEEP = 64 * 2**20


def _scratch_rows(n: int, row_nbytes: int) -> tuple[np.ndarray, int]:
    """:func:`_scratch` as ``n`` rows, with the buffer's address (looked up once per buffer)."""
    rows = _scratch(n * row_nbytes).reshape(n, row_nbytes)
    kept = rows.base is not None and rows.base is getattr(_SCRATCH, "buf", None)
    return rows, (_SCRATCH.address if kept else _native.data_address(rows))


def _scratch(nbytes: int) -> np.ndarray:
    """A per-thread reusable byte buffer (whole shards are decoded into it, then copied out)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = io_buffer(max(nbytes, 1 << 20))
        if nbytes <= getattr(_SCRATCH, "keep", _SCRATCH_KEEP):  # a huge shard's is not kept for the thread's lifetime
            _SCRATCH.buf = buf
            _SCRATCH.address = _native.data_address(buf)
    return buf[:nbytes]


#: outputs at least this big are faulted in ahead of the copies (see :class:`_Pages`)
POPULATE_MIN = 4 * 2**20
#: :class:`_Pages` populates huge pages this many bytes at a time, timing each step
PROBE_BYTES = 4 * 2**20
#: a huge-page step slower than this (ns per MiB) switches the rest of an output to small pages
SLOW_NS_PER_MIB = 600_000


def _output(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new array for a read's result (numpy asks for transparent huge pages on big ones;
    :class:`_Pages` decides, while the read runs, whether to keep them)."""
    return np.empty(shape, dtype=dtype)


def _advise(out: np.ndarray, advice: int) -> None:
    """``madvise`` the whole pages of a big output array (see ``_native.madvise``); advice
    only: failures (an old kernel, another OS) change nothing."""
    if out.nbytes >= POPULATE_MIN:
        _native.madvise_array(out, advice)


class _Pages:
    """Faults a big fresh output in ahead of the copies that fill it (``MADV_POPULATE_WRITE``:
    a third cheaper than a fault per page from the copies), block by block as runs of shards
    reach it, with huge pages while they come fast and small pages after the first slow block.

    What a fresh page costs is not predictable on a VM. On our benchmark machine a fresh
    2 MiB page came in at 0.1-0.25 ms per MiB while the host still backed it and at
    1.25-3.5 ms per MiB when it did not (the guest reports free 2 MiB blocks to the host,
    which drops them), against 0.5-0.9 ms per MiB for 4 KiB pages, which stay backed; which
    case a process meets changed from minute to minute (benchmarks/profile_notes.md). So the
    output is populated in blocks of :data:`PROBE_BYTES`, each timed; the first huge-page
    block slower than :data:`SLOW_NS_PER_MIB` advises the rest of the output
    ``MADV_NOHUGEPAGE``. Each block is populated once, by the first run that reaches it
    (runs of neighbouring shards share rows of the output). Advice only: nothing here
    changes a value."""

    __slots__ = ("_out", "_nbytes", "_done", "_lock", "huge")

    def __init__(self, out: np.ndarray) -> None:
        self._out, self._nbytes = out, out.nbytes
        self._done: set[int] = set()
        self._lock = threading.Lock()
        #: still populating with huge pages (False after a slow block)
        self.huge = True

    def populate(self, lo: int, hi: int) -> None:
        """Fault in the blocks of the output that bytes ``[lo, hi)`` touch, those not yet done."""
        first, last = max(0, lo) // PROBE_BYTES, (min(hi, self._nbytes) - 1) // PROBE_BYTES
        with self._lock:
            blocks = [i for i in range(first, last + 1) if i not in self._done]
            self._done.update(blocks)
        for i in blocks:
            a, b = i * PROBE_BYTES, min((i + 1) * PROBE_BYTES, self._nbytes)
            t0 = time.perf_counter_ns()
            _native.madvise_array(self._out, _native.MADV_POPULATE_WRITE, a, b)
            if self.huge and (time.perf_counter_ns() - t0) * 2**20 > (b - a) * SLOW_NS_PER_MIB:
                self.huge = False
                _native.madvise_array(self._out, _native.MADV_NOHUGEPAGE, b)


# --------------------------------------------------------------------------- chunk I/O


class _PlainChunks:
    """Chunk objects of an unsharded array: batched range reads, one object per chunk."""

    def __init__(self, inner: Inner) -> None:
        self.inner = inner

    def getitems(self, keys: Sequence[str]) -> dict[str, bytes]:
        values = self.inner.get_ranges([(k, 0, None) for k in keys]) if keys else []
        return {k: v for k, v in zip(keys, values) if v is not None}

    def update(self, items: Mapping[str, bytes]) -> None:
        list(_pool().map(lambda kv: self.inner.set(*kv), items.items()))

    def erase_values(self, keys: Sequence[str]) -> None:
        for k in keys:
            self.inner.delete(k)


_WORKERS = max(2, os.cpu_count() or 2)
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One process-wide pool: numcodecs releases the GIL, so decoding scales with cores.

    A forked child does not inherit it (see :func:`_forget_pool`): the parent's worker
    threads do not exist there, and work handed to their queue would wait forever."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(_WORKERS, thread_name_prefix="sharding-store")
        return _POOL


#: threads that read whole shards of remote stores and decode each as it arrives (see _read_sharded)
_IO_POOL: ThreadPoolExecutor | None = None


def _io_pool() -> ThreadPoolExecutor:
    """:data:`READ_WINDOW` threads, each waiting for one remote shard object and then decoding
    it (the decoding releases the GIL): requests stay in flight while others decode, and
    nothing is handed from thread to thread."""
    global _IO_POOL
    with _POOL_LOCK:
        if _IO_POOL is None:
            _IO_POOL = ThreadPoolExecutor(READ_WINDOW, thread_name_prefix="sharding-store-io", initializer=_io_thread)
        return _IO_POOL


def _io_thread() -> None:
    """An I/O thread keeps small buffers only (:data:`IO_KEEP`)."""
    keep_read_buffers(IO_KEEP)
    _SCRATCH.keep = IO_KEEP


def _forget_pool() -> None:
    """In a forked child: drop the parent's pools (their threads are gone) and their lock
    (another thread may have held it at the fork); the child makes its own on first use."""
    global _POOL, _IO_POOL, _POOL_LOCK
    _POOL = None
    _IO_POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class _ShardedChunks:
    """Chunk keys of a sharded array through its engine (the 0-d case: one key, one shard)."""

    def __init__(self, engine: ShardEngine) -> None:
        self.engine = engine
        self.layout = engine.layout

    def _locate(self, key: str) -> tuple[str, Coords, Coords]:
        coords = self.layout.parse(key)
        assert coords is not None, key
        shard, local = chunk_to_shard(coords, self.engine.cps)
        zero_d = key[len(self.layout.prefix) :] if self.layout.ndim == 0 else None
        return self.layout.shard_key(shard, zero_d), shard, local

    def getitems(self, keys: Sequence[str]) -> dict[str, bytes]:
        reads = [ChunkRange(skey, local) for skey, _, local in map(self._locate, keys)]
        return {k: v for k, v in zip(keys, self.engine.read_ranges(reads)) if v is not None}

    def update(self, items: Mapping[str, bytes | None]) -> None:
        jobs: dict[str, tuple[Coords, dict[Coords, bytes | None]]] = {}
        for key, value in items.items():
            skey, shard, local = self._locate(key)
            jobs.setdefault(skey, (shard, {}))[1][local] = value
        self.engine.rewrite_shards(jobs)

    def erase_values(self, keys: Sequence[str]) -> None:
        self.update(dict.fromkeys(keys))


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` in at most ``parts`` contiguous runs (fewer tasks, less per-chunk overhead)."""
    size = max(1, -(-len(items) // max(1, parts)))
    return [items[i : i + size] for i in range(0, len(items), size)]


def _whole(combo: tuple[_DimGroup, ...]) -> bool:
    """Whether every chunk of a shard is selected (the shard is read as one object)."""
    return all(g.every for g in combo)


def _is_all_fill(meta: dm.DraftArrayMeta, chunk: np.ndarray) -> bool:
    """zarr 2.18's ``all_equal(fill_value, chunk)`` (NaN fill matches NaN)."""
    fill = meta.fill_value
    if fill is None:
        return False
    if meta.dtype.kind in "fc" and np.isnan(fill):
        return bool(np.all(np.isnan(chunk)))
    return bool(np.all(chunk == fill))


def _fill_rows(meta: dm.DraftArrayMeta, chunks: np.ndarray) -> np.ndarray:
    """Per row of ``chunks`` (n, elements): :func:`_is_all_fill` of that chunk, vectorised."""
    fill = meta.fill_value
    if fill is None:
        return np.zeros(len(chunks), dtype=bool)
    if meta.dtype.kind in "fc" and np.isnan(fill):
        return np.isnan(chunks).all(axis=1)
    return (chunks == fill).all(axis=1)


# --------------------------------------------------------------------------- arrays


def _span(out: np.ndarray, combo: tuple[_DimGroup, ...]) -> tuple[int, int]:
    """``(first, end)``: the bytes of ``out`` a shard's selected chunks land in lie in this
    range (``out``'s strides are positive: a fresh output; reversed steps are views of it)."""
    first = sum(g.segments[0].outer.start * s for g, s in zip(combo, out.strides))
    last = sum((g.segments[-1].outer.stop - 1) * s for g, s in zip(combo, out.strides))
    return first, last + out.itemsize


class _ScatterGeometry:
    """Where each chunk of a shard read whole lands in one output array, as the ``geom``
    bytes of ``_loops.c``'s ``ss_shard_scatter``: a header per combination of touched-chunk
    counts, then one table per dimension group (built once per group for the run of shards
    it is made for: the shards of a run share their groups), each chunk as ``(start and step inside the
    chunk, elements, start in the output)``."""

    __slots__ = ("_array", "_out_strides", "_headers", "_tables")

    def __init__(self, array: DraftArray, out: np.ndarray) -> None:
        self._array = array
        self._out_strides = tuple(out.strides)
        self._headers: dict[tuple[int, ...], bytes] = {}
        self._tables: dict[int, tuple[_DimGroup, bytes]] = {}

    def of(self, combo: tuple[_DimGroup, ...]) -> bytes:
        counts = tuple(len(g.ks) for g in combo)
        header = self._headers.get(counts)
        if header is None:
            header = self._headers[counts] = self._header(counts)
        parts = [header]
        for g in combo:
            hit = self._tables.get(id(g))
            if hit is None or hit[0] is not g:
                hit = self._tables[id(g)] = (g, self._table(g))
            parts.append(hit[1])
        return b"".join(parts)

    def _header(self, counts: tuple[int, ...]) -> bytes:
        a = self._array
        meta = a.meta
        cps = tuple(meta.chunks_per_shard or ())
        itemsize = meta.dtype.itemsize
        # byte strides of a chunk in its memory order, per array dimension
        shape = tuple(meta.chunks)
        strides = [0] * len(shape)
        step = itemsize
        for d in (range(len(shape) - 1, -1, -1) if meta.order == "C" else range(len(shape))):
            strides[d] = step
            step *= shape[d]
        values = [len(shape), itemsize, a._cnb, math.prod(cps), *cps, *counts, *strides, *self._out_strides]
        return _array("q", values).tobytes()

    @staticmethod
    def _table(g: _DimGroup) -> bytes:
        values: list[int] = []
        for js, inner, outer, n in g.segments:
            for j in range(js.stop - js.start):
                values += (inner.start, inner.step or 1, n, outer.start + j * n)
        return _array("q", values).tobytes()


class DraftArray:
    """One draft-era array: metadata properties plus numpy basic indexing."""

    def __init__(
        self,
        inner: Inner,
        meta: dm.DraftArrayMeta,
        *,
        read_only: bool = True,
        write_empty_chunks: bool = True,
        index_cache_size: int = INDEX_CACHE_SIZE,
        coalesce_gap: int = COALESCE_GAP,
    ) -> None:
        self.inner = inner
        self.meta = meta
        self.read_only = read_only
        self.write_empty_chunks = write_empty_chunks
        #: how chunks map to keys and objects (the 2022 draft layout, or a final-v3 one)
        self.layout = ArrayLayout.from_meta(meta)
        self._prefix = self.layout.prefix
        #: the shard engine of a sharded array (None: one object per chunk)
        self.engine: ShardEngine | None = None
        if meta.is_sharded:
            self.engine = ShardEngine(
                inner,
                self.layout,
                index_cache_size=index_cache_size,
                coalesce_gap=coalesce_gap,
            )
        #: the array's codecs, each operation on its fastest path that gives the reference's result
        self.codec = ChunkCodec(meta)
        # whole-shard paths: chunk bytes, memory layout of a chunk, and the axes that
        # interleave (chunk position, position in chunk) for each dimension
        self._cnb = self.codec.nbytes
        self._rows_of: dict[tuple[int, ...], list[int] | None] = {}  # see _shard_rows
        n = meta.ndim
        if meta.order == "F":
            self._mem_chunks = tuple(reversed(meta.chunks))
            self._axes = tuple(a for d in range(n) for a in (d, 2 * n - 1 - d))
        else:
            self._mem_chunks = tuple(meta.chunks)
            self._axes = tuple(a for d in range(n) for a in (d, n + d))
        self._fill_flat = fill_chunk(meta, (1,))
        self._fill_bytes: np.ndarray | None = None  # see _fill_row
        self._chunks: _ShardedChunks | _PlainChunks = (
            _ShardedChunks(self.engine) if self.engine is not None else _PlainChunks(inner)
        )

    @property
    def _pool(self) -> ThreadPoolExecutor:
        # looked up on each use, not kept: an array made before a fork is used after it
        return _pool()

    # ------------------------------------------------------------ properties
    path = property(lambda self: self.meta.path, doc="Node path ('' for the root array).")
    shape = property(lambda self: self.meta.shape)
    dtype = property(lambda self: self.meta.dtype)
    chunks = property(lambda self: self.meta.chunks, doc="Inner chunk shape.")
    fill_value = property(lambda self: self.meta.fill_value)
    compressor = property(lambda self: self.meta.compressor)
    filters = property(lambda self: self.meta.filters)
    order = property(lambda self: self.meta.order)
    ndim = property(lambda self: self.meta.ndim)

    @property
    def chunks_per_shard(self) -> tuple[int, ...] | None:
        return self.meta.chunks_per_shard

    @property
    def shard_shape(self) -> tuple[int, ...] | None:
        """Elements per shard; ``None`` for an unsharded array."""
        return self.meta.shard_shape if self.meta.is_sharded else None

    @property
    def attrs(self) -> Mapping[str, Any]:
        """User attributes (read-only; ``filters`` is the codec pipeline, not an attribute)."""
        return MappingProxyType(self.meta.attributes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        shard = f", chunks_per_shard={self.chunks_per_shard}" if self.meta.is_sharded else ""
        return f"<DraftArray '/{self.path}' shape={self.shape} dtype={self.dtype.str} chunks={self.chunks}{shard}>"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self[...])
        return out if dtype is None else out.astype(dtype, copy=False)

    def invalidate(self) -> None:
        """Forget cached shard indices (after another writer changed this array's shards)."""
        if self.engine is not None:
            self.engine.invalidate()

    # ------------------------------------------------------------ planning
    def _chunk_key(self, coords: Coords) -> str:
        return self.layout.chunk_key(coords)

    def _plan(self, sels: tuple[DimSelection, ...]) -> Iterator[list[_Piece]]:
        """The chunks a selection touches, one list per shard (per chunk when unsharded),
        generated shard by shard so that no sorting is needed to keep shards together."""
        if not sels:  # 0-d: the one chunk
            yield [_Piece((), self._chunk_key(()), (), (), True)]
            return
        cps = self.meta.chunks_per_shard_or_ones
        per_dim = [
            [list(g) for _, g in itertools.groupby(dim_pieces(s, c, extent), key=lambda piece: piece[0] // k)]  # consumed at once
            for s, c, extent, k in zip(sels, self.chunks, self.shape, cps)
        ]
        head = self.layout.head
        sep = self.meta.separator
        for shard in itertools.product(*per_dim):
            pieces = []
            for combo in itertools.product(*shard):
                coords, inner, outer, covers = zip(*combo)
                pieces.append(_Piece(coords, head + sep.join(map(str, coords)), inner, outer, all(covers)))
            yield pieces

    def _batches(self, sels: tuple[DimSelection, ...]) -> Iterator[list[_Piece]]:
        """Whole shards per batch, about ``BATCH_BYTES`` of decoded chunks each."""
        per_batch = max(1, BATCH_BYTES // max(1, math.prod(self.chunks) * self.dtype.itemsize))
        batch: list[_Piece] = []
        for shard in self._plan(sels):
            batch += shard
            if len(batch) >= per_batch:
                yield batch
                batch = []
        if batch:
            yield batch

    def _fetch(self, pieces: list[_Piece]) -> Mapping[str, bytes | memoryview]:
        """Payloads of the pieces' chunks that exist, in one batched read."""
        if self.engine is not None and self.ndim:
            return self._fetch_sharded(pieces)
        keys = [p.key for p in pieces]
        found = self._chunks.getitems(keys)
        if self.ndim == 0 and not found and not self.meta.is_sharded and self.layout.encoding == "draft":
            # the spec draft spells a 0-d chunk key "c"; zarr-python 2.x wrote "c0"
            found = {keys[0]: v for v in self._chunks.getitems([self._prefix + "c"]).values()}  # noqa: B035 - one value at most
        return found

    def _fetch_sharded(self, pieces: list[_Piece]) -> dict[str, memoryview]:
        """Payloads by grid coordinates: two inner calls per batch (see ``ShardEngine.read_chunks``)."""
        assert self.engine is not None
        views = self.engine.read_chunks([p.coords for p in pieces])
        return {p.key: v for p, v in zip(pieces, views) if v is not None}

    # ------------------------------------------------------------ reading
    def __getitem__(self, key: Any) -> Any:
        sels, scalar = normalize_selection(key, self.shape)
        out = _output(tuple(s.count for s in sels), self.dtype)
        if out.size:
            self._read_into(out, sels)
        view = tuple(0 if s.drop else slice(None, None, -1 if s.reverse else 1) for s in sels)
        if view:
            return out[view]  # numpy gives a scalar when every dimension is integer-indexed
        return out[()] if scalar else out  # 0-d: a[()] is a scalar, a[...] a 0-d array

    def _read_into(self, out: np.ndarray, sels: tuple[DimSelection, ...]) -> None:
        """Fetch batch by batch; a batch decodes on the pool while the next one is fetched."""
        if self.engine is not None and self.ndim:
            return self._read_sharded(out, sels)
        _advise(out, _native.MADV_NOHUGEPAGE)  # filled by copies chunk by chunk: small pages
        parts = 4 * _WORKERS
        fill = fill_chunk(self.meta, (1,) * self.ndim)
        previous: list[Future[None]] = []
        for batch in self._batches(sels):
            payloads = self._fetch(batch)
            present = []
            for p in batch:
                payload = payloads.get(p.key)
                if payload is None:
                    out[p.out_sel] = fill
                else:
                    present.append((p, payload))
            current = [self._pool.submit(self._decode_run, out, run) for run in _split(present, parts)]
            for f in previous:
                f.result()
            previous = current
        for f in previous:
            f.result()

    def _decode_run(self, out: np.ndarray, run: list[tuple[_Piece, bytes | memoryview]]) -> None:
        scratch = np.empty(self.chunks, dtype=self.dtype, order=self.order)
        for p, payload in run:
            chunk = decode_chunk_payload(self.meta, payload, key=p.key, out=scratch)
            out[p.out_sel] = chunk[p.chunk_sel]


    # ------------------------------------------------------------ whole-shard paths (sharded arrays)
    def _shard_plans(self, sels: tuple[DimSelection, ...]) -> Iterator[tuple[_DimGroup, ...]]:
        """The shards a selection touches, each as one :class:`_DimGroup` per dimension."""
        cps = self.meta.chunks_per_shard
        assert cps is not None
        per_dim = [dim_groups(s, c, n, k) for s, c, n, k in zip(sels, self.chunks, self.shape, cps)]
        return itertools.product(*per_dim)

    def _shard_batches(self, sels: tuple[DimSelection, ...]) -> Iterator[list[tuple[_DimGroup, ...]]]:
        """Whole shards per batch, about ``BATCH_BYTES`` of decoded chunks each."""
        per_batch = max(1, BATCH_BYTES // max(1, self._cnb))
        batch: list[tuple[_DimGroup, ...]] = []
        count = 0
        for combo in self._shard_plans(sels):
            batch.append(combo)
            count += math.prod(len(g.ks) for g in combo)
            if count >= per_batch:
                yield batch
                batch, count = [], 0
        if batch:
            yield batch

    def _read_sharded(self, out: np.ndarray, sels: tuple[DimSelection, ...]) -> None:
        """Whole shards at a time: each pool task takes a run of shards, reads their indices
        in one inner call and their chunk ranges in one more, decodes every chunk into a
        chunk-major scratch buffer and lands each shard in ``out`` with one vectorised copy
        per run of alike chunks (no per-chunk numpy indexing). Reads, decoding and copies
        all run on the pool, so they scale with the cores; a small selection (a few chunks)
        is done on the calling thread. A remote store's shards selected whole are each one
        task on the I/O threads (:data:`READ_WINDOW` in flight), read and decoded there as it
        arrives: no run waits for its slowest shard, and the last shard's decode is all that
        follows the last byte."""
        parts = 2 * _WORKERS
        pending: set[Future[None]] = set()
        remote: bool | None = None
        pages = _Pages(out) if out.nbytes >= POPULATE_MIN and out.flags.c_contiguous else None
        try:
            for batch in self._shard_batches(sels):
                n = sum(math.prod(len(g.ks) for g in combo) for combo in batch)
                if n <= INLINE_CHUNKS or len(batch) == 1:
                    self._fetch_decode(out, batch, pages)
                    continue
                if remote is None:
                    remote = READ_AHEAD and self._remote_shards(batch[0])
                if remote:
                    pending.update(_io_pool().submit(self._fetch_decode, out, [c], pages) for c in batch if _whole(c))
                    batch = [c for c in batch if not _whole(c)]
                pending.update(self._pool.submit(self._fetch_decode, out, run, pages) for run in _split(batch, parts))
                # bounded (~2 batches in flight), waiting for any task, not the oldest: a slow
                # shard holds back no other
                while len(pending) > (2 * READ_WINDOW if remote else 2 * parts):
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        f.result()
            for f in list(pending):
                f.result()
                pending.discard(f)
        finally:
            for f in pending:
                f.cancel()

    def _remote_shards(self, combo: tuple[_DimGroup, ...]) -> bool:
        """Whether whole shards are read from a store whose reads wait on I/O (no local file,
        not an object of this process): one task per shard on the I/O threads overlaps the
        requests' latency with decoding. A local directory is read into per-thread buffers on
        the decoding threads; a mapping has nothing to overlap (:func:`~sharding_store.stores.in_memory`)."""
        assert self.engine is not None
        key = self.engine.layout.shard_key(self._shards_of([combo])[0])
        return self.inner.local_path(key) is None and not in_memory(self.inner)

    def _shards_of(self, run: list[tuple[_DimGroup, ...]]) -> list[Coords]:
        """The shard coordinates of each combination of a run (each lies in one shard)."""
        cps = self.meta.chunks_per_shard
        assert cps is not None
        return [tuple(int(g.ks[0]) // k for g, k in zip(combo, cps)) for combo in run]

    def _scatter(self, out: np.ndarray) -> Any:
        """The C scatter of whole shards into ``out`` (None: the reference path lands them)."""
        return self.codec.scatter if out.flags.c_contiguous else None

    def _fetch_decode(self, out: np.ndarray, batch: list[tuple[_DimGroup, ...]], pages: _Pages | None = None) -> None:
        """Read and decode a run of shards into ``out``: those whose every chunk is selected
        whole (one read each), the others chunk by chunk (their indices, then their ranges).
        ``pages``: a big output's pages, this run's part faulted in once its first bytes are
        in (after the read: a remote shard's request does not wait for it)."""
        assert self.engine is not None
        populate = None if pages is None else functools.partial(
            pages.populate, _span(out, batch[0])[0], _span(out, batch[-1])[1])
        whole = [combo for combo in batch if _whole(combo)]
        if whole:
            self._read_whole_shards(out, whole, populate)
            if len(whole) == len(batch):
                return
            batch, populate = [combo for combo in batch if not _whole(combo)], None
        coords = [_shard_coords(combo) for combo in batch]
        views = self.engine.read_chunks(np.concatenate(coords) if len(coords) > 1 else coords[0])
        if populate is not None:
            populate()
        work, pos = [], 0
        for combo, c in zip(batch, coords):
            work.append((combo, c, views[pos : pos + len(c)]))
            pos += len(c)
        self._decode_shards(out, work)

    def _read_whole_shards(
        self, out: np.ndarray, run: list[tuple[_DimGroup, ...]], populate: Callable[[], None] | None = None
    ) -> None:
        """Shards whose every chunk is selected: each object is read whole (one request, the
        index from its own tail; see ``ShardEngine.read_whole_shards``). Into a C-contiguous
        output, with the loops library: the engine only checks the index and one C call per
        shard decodes every chunk and copies it to its place
        (``ChunkCodec.scatter``, the GIL released once); otherwise, and for any shard that
        call hands back, the reference path (:meth:`_land_whole`). ``populate``: called once
        the first object has arrived, before anything lands."""
        assert self.engine is not None
        scatter = self._scatter(out)
        if scatter is not None:
            geometry = _ScatterGeometry(self, out)
            out_address, out_nbytes, fill = _native.data_address(out), out.nbytes, _native.data_address(self._fill_row())
        for combo, obj in zip(run, self.engine.read_whole_shards(self._shards_of(run), lists=scatter is None)):
            if populate is not None:
                populate()
                populate = None
            if obj is None:
                self._fill_segments(out, combo)
                continue
            if scatter is not None and obj.offsets is None:
                # index checked by the engine; every chunk decoded and copied in one C call,
                # anything it does not take (status != 0) goes through the path below
                if not scatter(obj.address, len(obj.data), geometry.of(combo), fill, out_address, out_nbytes):
                    continue
            self._land_whole(out, combo, obj)

    def _land_whole(self, out: np.ndarray, combo: tuple[_DimGroup, ...], obj: WholeShard) -> None:
        """The reference path of a shard read whole: its index as lists (raises for a bad
        one), its chunks decoded into the scratch rows (raises naming a chunk that does not
        decode), then landed in ``out``."""
        assert self.engine is not None
        cnb = self._cnb
        offsets, sizes = self.engine.whole_lists(obj)
        counts = tuple(len(g.ks) for g in combo)
        rows = self._shard_rows(counts)
        if rows is not None:  # an edge shard: the entries of the chunks inside the grid
            offsets, sizes = [offsets[r] for r in rows], [sizes[r] for r in rows]
        n = len(offsets)
        todo = [i for i, o in enumerate(offsets) if o != MAX_UINT64]
        if not todo:
            self._fill_segments(out, combo)
            return
        if len(todo) < n:
            offsets, sizes = [offsets[i] for i in todo], [sizes[i] for i in todo]
        scratch, address = _scratch_rows(n, cnb)
        self.codec.decode_many(
            obj.data, obj.address, todo, offsets, sizes, address, key_of=lambda i: self._key_in(combo, i)
        )
        chunks = scratch.view(self.dtype)
        if len(todo) < n:
            missing = np.ones(n, dtype=bool)
            missing[todo] = False
            chunks[missing] = self._fill_flat
        self._land(out, combo, chunks)

    def _fill_row(self) -> np.ndarray:
        """One chunk of the fill value as bytes (what an absent chunk lands as)."""
        row = self._fill_bytes
        if row is None:
            row = self._fill_bytes = np.ascontiguousarray(fill_chunk(self.meta)).reshape(-1).view(np.uint8)
        return row

    def _shard_rows(self, counts: tuple[int, ...]) -> list[int] | None:
        """Index entries (flat, C order of the shard) of a shard's chunks inside the grid, in
        the C order of ``counts`` chunks per dimension; None for a shard wholly inside."""
        rows = self._rows_of.get(counts, _NO_ROWS)
        if rows is _NO_ROWS:
            cps = self.meta.chunks_per_shard
            assert cps is not None
            inside = counts == tuple(cps)
            rows = None if inside else np.asarray(np.ravel_multi_index(np.indices(counts).reshape(len(counts), -1), cps)).tolist()
            self._rows_of[counts] = rows
        return rows  # type: ignore[return-value]

    def _key_in(self, combo: tuple[_DimGroup, ...], i: int) -> str:
        """The chunk key of the ``i``-th touched chunk of a shard (C order of ``combo``)."""
        local = np.unravel_index(i, tuple(len(g.ks) for g in combo))
        return self._chunk_name(tuple(int(g.ks[j]) for g, j in zip(combo, local)))

    def _chunk_name(self, coords: Coords) -> str:
        """How an error names a chunk: its key (2022: the transformer's chunk key); in a v3
        shard, which has no key of its own, the shard's key and its place in the shard."""
        if self.engine is None or self.layout.encoding == "draft":
            return self._chunk_key(coords)
        shard, local = chunk_to_shard(coords, self.engine.cps)
        return f"{self.layout.shard_key(shard)} (chunk {list(local)} of the shard)"

    def _fill_segments(self, out: np.ndarray, combo: tuple[_DimGroup, ...]) -> None:
        for seg in itertools.product(*(g.segments for g in combo)):
            out[tuple(s[2] for s in seg)] = self._fill_flat[0]

    def _land(self, out: np.ndarray, combo: tuple[_DimGroup, ...], chunks: np.ndarray) -> None:
        """Copy a shard's decoded chunks (``(n, chunk elements)`` in memory order, C order
        of the shard's chunks) to ``out``: one vectorised copy per run of alike chunks."""
        blocks = chunks.reshape(*(len(g.ks) for g in combo), *self._mem_chunks).transpose(self._axes)
        for seg in itertools.product(*(g.segments for g in combo)):
            dst = out[tuple(s[2] for s in seg)].reshape(tuple(x for js, _, _, n in seg for x in (js.stop - js.start, n)))
            dst[...] = blocks[tuple(x for js, inner, _, _ in seg for x in (js, inner))]

    def _decode_shards(self, out: np.ndarray, run: list[tuple[tuple[_DimGroup, ...], np.ndarray, list[Any]]]) -> None:
        for combo, coords, payloads in run:
            if all(p is None for p in payloads):
                self._fill_segments(out, combo)
                continue
            self._land(out, combo, self._decode_rows(coords, payloads))

    def _decode_rows(self, coords: np.ndarray, payloads: Sequence[Any], todo: np.ndarray | None = None) -> np.ndarray:
        """Decode ``payloads`` (None: absent, fill value) into this thread's scratch buffer:
        ``(n, chunk elements)`` in memory order. ``todo``: only these rows (others untouched)."""
        n = len(coords)
        cnb = self._cnb
        rows = _scratch(n * cnb).reshape(n, cnb)
        chunks = rows.view(self.dtype)
        decode_into = self.codec.decode_into
        base = _native.data_address(rows)
        missing = []
        for i in range(n) if todo is None else todo.tolist():
            p = payloads[i]
            if p is None:
                missing.append(i)
                continue
            try:
                decode_into(p, base + i * cnb)
            except ChunkDecodeError:  # again, naming the chunk (its key is made only when needed)
                decode_into(p, rows[i], key=self._chunk_name(tuple(coords[i].tolist())))
        if missing:
            chunks[missing] = self._fill_flat
        return chunks

    def _write_sharded(self, block: np.ndarray, sels: tuple[DimSelection, ...]) -> None:
        """Per batch: the old payloads of partly written chunks in one batched read; then each
        shard is assembled on the pool (one vectorised copy per run of alike chunks into a
        chunk-major scratch), its chunks encoded there, and the shard written once."""
        assert self.engine is not None
        for batch in self._shard_batches(sels):
            plans = []
            partial = []
            for combo in batch:
                coords = _shard_coords(combo)
                covers = _outer_and([g.covers for g in combo])
                plans.append((combo, coords, covers))
                if not covers.all():
                    partial.append(coords[~covers])
            old: dict[Coords, Any] = {}
            if partial:
                pc = np.concatenate(partial)
                old = dict(zip(map(tuple, pc.tolist()), self.engine.read_chunks(pc)))
            runs = _split(plans, 4 * _WORKERS)
            if len(runs) == 1:
                self._encode_shards(block, runs[0], old)
                continue
            for f in [self._pool.submit(self._encode_shards, block, run, old) for run in runs]:
                f.result()

    def _encode_shards(self, block: np.ndarray, run: list[Any], old: Mapping[Coords, Any]) -> None:
        assert self.engine is not None
        cps = np.asarray(self.meta.chunks_per_shard, dtype=np.int64)
        for combo, coords, covers in run:
            n = len(coords)
            partial = np.flatnonzero(~covers)
            payloads = [old.get(tuple(c)) for c in coords[partial].tolist()] if partial.size else []
            olds: list[Any] = [None] * n
            for i, p in zip(partial.tolist(), payloads):
                olds[i] = p
            chunks = self._decode_rows(coords, olds, partial)  # only the partly written chunks
            pad = covers & ~_outer_and([g.full for g in combo])
            if pad.any():  # edge chunks: the part outside the array holds the fill value
                chunks[pad] = self._fill_flat
            blocks = chunks.reshape(*(len(g.ks) for g in combo), *self._mem_chunks).transpose(self._axes)
            for seg in itertools.product(*(g.segments for g in combo)):
                src = block[tuple(s[2] for s in seg)].reshape(tuple(x for js, _, _, k in seg for x in (js.stop - js.start, k)))
                blocks[tuple(x for js, inner, _, _ in seg for x in (js, inner))] = src
            keep = np.ones(n, dtype=bool) if self.write_empty_chunks else ~_fill_rows(self.meta, chunks)
            changes: dict[Coords, bytes | None] = {}
            encode_row = self.codec.encode_row  # straight from the scratch rows (chunk bytes in memory order)
            base, cnb = _native.data_address(chunks), self._cnb
            for i, local in enumerate((coords % cps).tolist()):
                changes[tuple(local)] = encode_row(base + i * cnb) if keep[i] else None
            shard = tuple((coords[0] // cps).tolist())
            self.engine.rewrite_shard(shard, changes)

    # ------------------------------------------------------------ writing
    def __setitem__(self, key: Any, value: Any) -> None:
        if self.read_only:
            raise ReadOnlyError(f"'/{self.path}': array opened read-only (use mode='r+')", key=self.path)
        sels, _ = normalize_selection(key, self.shape)
        block = self._value_block(value, sels)
        if block.size == 0:
            return
        if self.engine is not None and self.ndim:
            self._write_sharded(block, sels)
            return
        for batch in self._batches(sels):
            self._write_batch(batch, block)

    def _value_block(self, value: Any, sels: tuple[DimSelection, ...]) -> np.ndarray:
        """``value`` cast, broadcast to the selection and laid out in forward order."""
        arr = np.asarray(value)
        if arr.dtype != self.dtype:
            try:
                arr = arr.astype(self.dtype)
            except (TypeError, ValueError) as e:
                raise UsageError(f"'/{self.path}': cannot store {arr.dtype} values as {self.dtype}: {e}") from None
        np_shape = tuple(s.count for s in sels if not s.drop)
        try:
            arr = np.broadcast_to(arr, np_shape)
        except ValueError:
            raise UsageError(
                f"'/{self.path}': value of shape {arr.shape} cannot be broadcast to the selection shape {np_shape}"
            ) from None
        arr = np.expand_dims(arr, tuple(d for d, s in enumerate(sels) if s.drop))
        return arr[tuple(slice(None, None, -1) if s.reverse else slice(None) for s in sels)]

    def _write_batch(self, batch: list[_Piece], block: np.ndarray) -> None:
        partial = [p for p in batch if not p.covers]
        old = self._fetch(partial) if partial else {}
        runs = _split(batch, 4 * _WORKERS)
        results = self._pool.map(lambda run: [self._encode_piece(p, block, old.get(p.key)) for p in run], runs)
        writes: dict[str, bytes] = {}
        erases: list[str] = []
        for run, payloads in zip(runs, results):
            for p, payload in zip(run, payloads):
                if payload is None:
                    erases.append(p.key)
                else:
                    writes[p.key] = payload
        if erases:
            self._chunks.erase_values(erases)
        if writes:
            self._chunks.update(writes)

    def _encode_piece(self, p: _Piece, block: np.ndarray, old: bytes | memoryview | None) -> bytes | None:
        """The new payload of one chunk, or ``None`` to erase it (``write_empty_chunks=False``)."""
        value = block[p.out_sel]
        if p.covers:
            chunk = value  # an edge chunk is padded with the fill value by the encoder
        else:
            if old is None:
                chunk = fill_chunk(self.meta)
            else:
                chunk = decode_chunk_payload(self.meta, old, key=p.key).copy(order="K")
            chunk[p.chunk_sel] = value
        if not self.write_empty_chunks and _is_all_fill(self.meta, np.asarray(chunk)):
            return None
        return encode_chunk_payload(self.meta, chunk)


# --------------------------------------------------------------------------- groups


class DraftGroup:
    """A draft-era group (explicit or implicit): member access, attributes, the tree."""

    def __init__(
        self,
        inner: Inner,
        path: str,
        attributes: dict[str, Any],
        *,
        explicit: bool,
        read_only: bool,
        hierarchy: DraftHierarchy | None = None,
    ) -> None:
        self.inner = inner
        self.path = path
        self.explicit = explicit
        self.read_only = read_only
        self._attributes = attributes
        #: given for a 2023 hierarchy (walked once when opened; its nodes are opened from it)
        self._hierarchy: DraftHierarchy | None = hierarchy

    @property
    def attrs(self) -> Mapping[str, Any]:
        return MappingProxyType(self._attributes)

    @property
    def hierarchy(self) -> DraftHierarchy:
        """The whole hierarchy's nodes, walked once (metadata keys only) and cached."""
        if self._hierarchy is None:
            self._hierarchy = DraftHierarchy(self.inner)
        return self._hierarchy

    def _join(self, name: str) -> str:
        name = dm.normalize_path(name)
        return f"{self.path}/{name}" if self.path and name else (self.path or name)

    def __getitem__(self, name: str) -> DraftArray | DraftGroup:
        if self._hierarchy is not None and self._hierarchy.walked:
            return _open_from_model(self._hierarchy, self._join(name), read_only=self.read_only)
        walked = self._hierarchy.nodes.get(self._join(name)) if self.read_only and self._hierarchy is not None else None
        if walked is not None and walked.kind == "group":  # the walk has it: no listing below it again
            return DraftGroup(self.inner, walked.path, walked.attributes, explicit=walked.explicit,
                              read_only=self.read_only, hierarchy=self._hierarchy)
        node = _open_node(self.inner, self._join(name), read_only=self.read_only)
        if isinstance(node, DraftGroup):
            node._hierarchy = self._hierarchy  # one walk per hierarchy, not one per group visited
        return node

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._join(name) in self.hierarchy.nodes

    def __iter__(self) -> Iterator[str]:
        return (n.name for n in self.hierarchy.children(self.path))

    def __len__(self) -> int:
        return len(self.hierarchy.children(self.path))

    def __repr__(self) -> str:
        kind = "" if self.explicit else " (implicit)"
        return f"<DraftGroup '/{self.path}'{kind}>"

    def arrays(self) -> Iterator[tuple[str, DraftArray]]:
        """``(name, array)`` of the direct child arrays, like zarr 2's ``Group.arrays()``."""
        for n in self.hierarchy.children(self.path):
            if n.kind == "array" and n.meta is not None:
                yield n.name, DraftArray(self.inner, n.meta, read_only=self.read_only)

    def groups(self) -> Iterator[tuple[str, DraftGroup]]:
        for n in self.hierarchy.children(self.path):
            if n.kind == "group":  # one walk per hierarchy, not one per group visited
                yield n.name, DraftGroup(
                    self.inner, n.path, n.attributes, explicit=n.explicit, read_only=self.read_only,
                    hierarchy=self._hierarchy,
                )

    def tree(self) -> str:
        """The subtree below this group, one node per line (the hierarchy's own format)."""
        return self.hierarchy.tree(self.path)


# --------------------------------------------------------------------------- opening


def _get_many(inner: Inner, keys: list[str]) -> dict[str, bytes | None]:
    """Several small documents in one inner request."""
    return dict(zip(keys, inner.get_ranges([(k, 0, None) for k in keys])))


def _check_mode(mode: str) -> bool:
    if mode not in _MODES:
        raise UsageError(f"mode {mode!r}: expected one of {', '.join(map(repr, _MODES))}")
    return mode == "r"


def _open_node(
    inner: Inner,
    path: str,
    *,
    read_only: bool,
    location: str = "store",
    assume_chunks_per_shard: Sequence[int] | None = None,
) -> DraftArray | DraftGroup:
    """Resolve ``path`` with one batched read of the entry point and both node documents."""
    path = dm.normalize_path(path)
    keys = [dm.ENTRY_POINT_KEY, dm.array_meta_key(path), dm.group_meta_key(path)]
    docs = _get_many(inner, keys)
    model = walked_model(inner, docs[dm.ENTRY_POINT_KEY])
    if model is not None:
        if assume_chunks_per_shard is not None:
            raise UsageError(f"{location}: assume_chunks_per_shard is for 2022 draft arrays that lost their transformer")
        return _open_from_model(model, path, read_only=read_only, location=location)
    suffix = draft_entry_point(inner, docs[dm.ENTRY_POINT_KEY], location).metadata_key_suffix
    if suffix != ".json":
        keys = [dm.array_meta_key(path, suffix), dm.group_meta_key(path, suffix)]
        docs.update(_get_many(inner, keys))
    akey, gkey = dm.array_meta_key(path, suffix), dm.group_meta_key(path, suffix)
    if docs.get(akey) is not None:
        meta = dm.parse_array_metadata(docs[akey], akey, path)  # type: ignore[arg-type]
        if assume_chunks_per_shard is not None:
            meta = _assume_sharded(meta, assume_chunks_per_shard, inner)
        elif not meta.is_sharded:  # only an unsharded array can have lost its transformer
            _refuse_lost_transformer(inner, meta)
        return DraftArray(inner, meta, read_only=read_only)
    if docs.get(gkey) is not None:
        attrs = dm.parse_group_metadata(docs[gkey], gkey)  # type: ignore[arg-type]
        return DraftGroup(inner, path, attrs, explicit=True, read_only=read_only)
    if path == "" or _has_children(inner, path):
        return DraftGroup(inner, path, {}, explicit=False, read_only=read_only)
    raise StoreNotFoundError(f"{location}: no array or group at '/{path}'", key=path)


def _open_from_model(h: DraftHierarchy, path: str, *, read_only: bool, location: str = "store") -> DraftArray | DraftGroup:
    """A node of a hierarchy walked whole (read-only unless the model is ``writable``: writing
    the 2023 generation is not supported; migrate it to final Zarr v3 first)."""
    if not read_only and not h.writable:
        raise UsageError(
            f"{location}: '/{path}' belongs to a {h.generation}, "
            "which open_draft reads but does not write: open it with mode='r' (or migrate it, then write "
            "the final Zarr v3 copy)",
            key=path,
        )
    node = h.node(path)  # a damaged node raises its error; a missing one StoreNotFoundError
    if node.kind == "array":
        if node.meta is None:
            raise h.unreadable[node.path]
        return DraftArray(h.inner, node.meta, read_only=read_only)
    return DraftGroup(h.inner, node.path, node.attributes, explicit=node.explicit, read_only=read_only, hierarchy=h)


def _refuse_lost_transformer(inner: Inner, meta: dm.DraftArrayMeta) -> None:
    """Never read shards as chunks: an unsharded array whose first object is really a draft
    shard (zarr-python 2.x ``resize()`` dropped the transformer) would decode to wrong
    values, since zlib and friends ignore the index after the payload. One tail read; the
    array is listed only when refusing (to offer the candidates ``info`` offers)."""
    from .evidence import refuse_lost_transformer

    refuse_lost_transformer(inner, meta)


def _assume_sharded(meta: dm.DraftArrayMeta, cps: Sequence[int], inner: Inner) -> dm.DraftArrayMeta:
    """``meta`` read with the ``chunks_per_shard`` its lost transformer had; a guess the
    array's objects contradict is refused (one listing, a few index tails and payloads)."""
    if meta.is_sharded:
        raise UsageError(
            f"'/{meta.path}' is sharded already ({meta.chunks_per_shard}); assume_chunks_per_shard is for arrays "
            "whose metadata lost its transformer",
            key=meta.path,
        )
    from .evidence import check_assumed_layout

    assumed = meta.with_chunks_per_shard(tuple(int(c) for c in cps))
    check_assumed_layout(inner, assumed)
    return assumed


def _has_children(inner: Inner, path: str) -> bool:
    """An implicit group exists when any metadata lies below ``meta/root/<path>/``."""
    return next(iter(inner.list_prefix(f"{dm.META_ROOT}/{path}/" if path else f"{dm.META_ROOT}/")), None) is not None


def _location(store_or_url: Any) -> str:
    return str(store_or_url) if isinstance(store_or_url, (str, os.PathLike)) else type(store_or_url).__name__


def open_draft(
    store_or_url: Any,
    path: str = "",
    *,
    storage_options: Mapping[str, Any] | None = None,
    mode: str = "r",
    assume_chunks_per_shard: Sequence[int] | None = None,
) -> DraftArray | DraftGroup:
    """Open the node at ``path``: a :class:`DraftArray` or a :class:`DraftGroup`.

    ``store_or_url``: a path/URL (with ``storage_options``), a mapping, a zarr-3 ``Store``
    or a ``ShardingStore`` (its inner store is used). ``mode``: ``"r"`` (read-only),
    ``"r+"``/``"a"`` (read-write; nothing is created). An unsharded array whose objects
    are really shards (the zarr-python 2.x ``resize()`` defect) is refused with a
    ``DraftMetadataError``; ``assume_chunks_per_shard`` reads it as sharded.

    A hierarchy of the 2023 intermediate generation (per-node ``zarr.json`` spelled as
    before v1.0, see ``gen2023``) is read too, through the same read path
    (:mod:`~sharding_store.formats.v3_layout` maps each array's final-v3 document onto it), and only
    read: ``mode`` other than ``"r"`` raises :class:`UsageError`. Its groups list their
    children from one walk of the hierarchy; an array whose layout cannot be mapped raises
    ``DraftMetadataError`` naming its ``zarr.json`` and the field (``open_v3`` reads it).
    """
    read_only = _check_mode(mode)
    inner = inner_of(store_or_url, storage_options)
    return _open_node(
        inner, path, read_only=read_only, location=_location(store_or_url), assume_chunks_per_shard=assume_chunks_per_shard
    )


# --------------------------------------------------------------------------- creating


def _prepare_node(inner: Inner, path: str, overwrite: bool) -> str:
    """Write the entry point if missing, refuse (or clear) an existing node; the key suffix."""
    parents = ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)] if path else []
    keys = [dm.ENTRY_POINT_KEY, dm.array_meta_key(path), dm.group_meta_key(path)]
    keys += [dm.array_meta_key(p) for p in parents]
    docs = _get_many(inner, keys)
    raw_ep = docs[dm.ENTRY_POINT_KEY]
    if raw_ep is None:
        inner.set(dm.ENTRY_POINT_KEY, dm.encode_entry_point())
        suffix = ".json"
    else:
        suffix = dm.parse_entry_point(raw_ep).metadata_key_suffix
        if suffix != ".json":
            docs = _get_many(inner, [dm.array_meta_key(path, suffix), dm.group_meta_key(path, suffix)])
            docs.update(_get_many(inner, [dm.array_meta_key(p, suffix) for p in parents]))
    for p in parents:
        if docs.get(dm.array_meta_key(p, suffix)) is not None:
            raise UsageError(f"cannot create '/{path}': '/{p}' is an array, arrays have no children", key=path)
    akey, gkey = dm.array_meta_key(path, suffix), dm.group_meta_key(path, suffix)
    exists = docs.get(akey) is not None or docs.get(gkey) is not None or _has_children(inner, path)
    if exists and not overwrite:
        raise DestinationExistsError(f"'/{path}': a node exists already (pass overwrite=True to replace it)", key=path)
    if exists:  # zarr 2.18's rmdir: the node, its children and all their data
        inner.delete(akey)
        inner.delete(gkey)
        inner.delete_prefix(f"{dm.META_ROOT}/{path}/" if path else f"{dm.META_ROOT}/")
        inner.delete_prefix(dm.data_prefix(path))
    return suffix


def _int_or_tuple(value: int | Sequence[int]) -> int | tuple[int, ...]:
    return int(value) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)


class _RequiredArrayKeywords(TypedDict):
    shape: int | Sequence[int]
    chunks: int | Sequence[int]
    dtype: Any


class DraftArrayKeywords(_RequiredArrayKeywords, total=False):
    """The array keywords of :func:`create_draft_array`, named as zarr 2.18's ``create()``."""

    chunks_per_shard: int | Sequence[int] | None
    compressor: Codec | None
    fill_value: Any
    order: str
    dimension_separator: str
    filters: Sequence[Codec] | None
    attrs: dict[str, Any] | None


#: zarr 2.18's defaults for the optional keywords of :class:`DraftArrayKeywords`
_ARRAY_DEFAULTS: dict[str, Any] = {"chunks_per_shard": None, "compressor": DEFAULT_COMPRESSOR, "fill_value": 0,
                                   "order": "C", "dimension_separator": "/", "filters": None, "attrs": None}


def draft_array_spec(path: str, given: Mapping[str, Any]) -> dm.DraftArraySpec:
    """zarr 2.18's ``create()`` keywords (``given``) as the spec of the array at ``path``;
    an unknown or missing keyword is refused as Python refuses one (:class:`TypeError`)."""
    for name in given:
        if name not in DraftArrayKeywords.__annotations__:
            raise TypeError(f"create_draft_array() got an unexpected keyword argument {name!r}")
    for name in DraftArrayKeywords.__required_keys__:
        if name not in given:
            raise TypeError(f"create_draft_array() missing required keyword argument: {name!r}")
    kw = {**_ARRAY_DEFAULTS, **given}
    cps = kw["chunks_per_shard"]
    return dm.DraftArraySpec(
        path=path, shape=_int_or_tuple(kw["shape"]), chunks=_int_or_tuple(kw["chunks"]), dtype=kw["dtype"],
        compressor=kw["compressor"], fill_value=kw["fill_value"], order=kw["order"],
        separator=kw["dimension_separator"], filters=None if kw["filters"] is None else tuple(kw["filters"]),
        attributes=kw["attrs"],
        chunks_per_shard=None if cps is None else _int_or_tuple(cps),
    )


def create_draft_array(
    store_or_url: Any,
    path: str = "",
    *,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    write_empty_chunks: bool = True,
    **array: Unpack[DraftArrayKeywords],
) -> DraftArray:
    """Create an array exactly as zarr-python 2.18's ``zarr.create(..., zarr_version=3)`` would.

    ``array``: zarr 2.18's keywords (:class:`DraftArrayKeywords`: ``shape``, ``chunks``,
    ``dtype`` required; ``chunks_per_shard``, ``compressor``, ``fill_value``, ``order``,
    ``dimension_separator``, ``filters``, ``attrs`` with 2.18's defaults). The metadata
    document is byte-identical to 2.18's; no chunk is written (reads give the fill value).
    An existing node is refused unless ``overwrite``, which removes it and everything
    below it first.
    """
    inner = inner_of(store_or_url, storage_options)
    path = dm.normalize_path(path)
    meta = dm.draft_array_document(draft_array_spec(path, array))
    suffix = _prepare_node(inner, path, overwrite)
    inner.set(dm.array_meta_key(path, suffix), dm.encode_array_metadata(meta))
    return DraftArray(inner, meta, read_only=False, write_empty_chunks=write_empty_chunks)


def create_draft_group(
    store_or_url: Any,
    path: str = "",
    attrs: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> DraftGroup:
    """Create an explicit group document (``{"attributes": ...}``) as zarr 2.18 writes it."""
    inner = inner_of(store_or_url, storage_options)
    path = dm.normalize_path(path)
    suffix = _prepare_node(inner, path, overwrite)
    inner.set(dm.group_meta_key(path, suffix), dm.encode_group_metadata(dict(attrs or {})))
    return DraftGroup(inner, path, dict(attrs or {}), explicit=True, read_only=False)
