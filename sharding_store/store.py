"""``ShardingStore``: the 2022 draft sharding storage transformer as a store wrapper.

A ``MutableMapping[str, bytes]`` whose keys are the *chunk* keys a draft-era reader
expects (``data/root/a/c3/7``) while the store below holds *shards*
(``data/root/a/c1/3`` with ``chunks_per_shard=[2, 2]``). Everything that is not a
chunk key of a sharded array passes through untouched.

I/O discipline (asserted by tests that count the inner store's calls):

* one chunk read is one suffix read of the shard index plus one range read of the
  chunk (one, with a warm index cache);
* a batch of chunk reads reads each shard's index once, all indices in one inner
  call, then all chunk ranges in one more, adjacent ranges coalesced;
* a batch of writes or erases rewrites each affected shard once; a shard whose
  chunks are all given is built without reading it; otherwise only the index and
  the surviving chunks are read. A shard left without chunks is deleted.

Written shards are compact (live chunks in C order, index at the end, no dead bytes).
Writes to one shard from several threads are serialised by a per-shard lock;
``lock=`` adds a caller-provided lock (e.g. a file lock for several processes).
"""

from __future__ import annotations

import contextlib
import math
import threading
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ContextManager, NamedTuple

import numpy as np

from . import draft_metadata as dm
from .errors import ChunkKeyError, DraftMetadataError, ShardCorruptError, UsageError
from .inner import FsspecInner, Inner, RangeRequest, as_inner
from .keys import (
    Coords,
    chunk_to_shard,
    format_chunk_suffix,
    local_to_global,
    parse_chunk_suffix,
    prefix_coords,
)
from .shard_index import MAX_UINT64, ShardIndex, encode_shard_and_index, entry_lists, index_nbytes, parse_indices

DATA_ROOT = "data/root/"
_N_LOCKS = 64
_MISSING = object()
_READ = threading.local()
#: a read buffer up to this size is kept per thread (bigger shards get a fresh one each time)
_READ_KEEP = 64 * 2**20


def _read_buffer(nbytes: int) -> np.ndarray:
    """This thread's reusable buffer for whole shard objects, at least ``nbytes`` long
    (``_READ.address``: its start).

    Reusing it means reading many shards touches no fresh memory: in a fresh process,
    faulting in new pages for every shard object costs about as much as the copy itself."""
    buf = getattr(_READ, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
        _READ.address = buf.ctypes.data
        _READ.buf = buf if nbytes <= _READ_KEEP else None
    return buf


class WholeShard(NamedTuple):
    """A shard object read whole: its bytes (valid until the next shard is read, see
    :meth:`ShardingStore.read_whole_shards`), their address, and its index as flat C-order
    lists, validated against the object's size (``MAX_UINT64``: absent)."""

    data: np.ndarray
    address: int
    offsets: list[int]
    sizes: list[int]


@dataclass(frozen=True)
class ArrayLayout:
    """What the wrapper needs to know of one array to map its keys."""

    path: str
    prefix: str  # the array's data prefix, "data/root/<path>/"
    ndim: int
    separator: str
    chunks_per_shard: Coords | None  # None: not sharded, keys pass through
    grid_shape: Coords | None = None  # chunk grid, when the array's shape is known
    zero_d: str = "c0"

    @property
    def sharded(self) -> bool:
        return self.chunks_per_shard is not None

    def chunk_key(self, coords: Coords) -> str:
        return self.prefix + format_chunk_suffix(coords, self.separator, zero_d=self.zero_d)

    def shard_key(self, shard: Coords, zero_d: str | None = None) -> str:
        return self.prefix + format_chunk_suffix(shard, self.separator, zero_d=zero_d or self.zero_d)

    def parse(self, key: str) -> Coords | None:
        if not key.startswith(self.prefix):
            return None
        return parse_chunk_suffix(key[len(self.prefix) :], self.separator, self.ndim)

    def shard_is_full(self, shard: Coords, given: Iterable[Coords]) -> bool:
        """True when ``given`` (local coords) covers every chunk the shard can hold.

        Counts instead of building sets: a shard holds ``prod(min(n, grid - s*n))``
        chunks of the grid, and ``given`` is a set of distinct local coordinates.
        """
        cps = self.chunks_per_shard
        assert cps is not None
        if self.grid_shape is None:
            limits = cps
        else:
            limits = tuple(max(0, min(n, g - s * n)) for s, n, g in zip(shard, cps, self.grid_shape))
        given = list(given)
        expected = math.prod(limits)
        if len(given) < expected:
            return False
        return sum(all(c < lim for c, lim in zip(g, limits)) for g in given) == expected

    @classmethod
    def from_meta(cls, meta: dm.DraftArrayMeta | dm.DraftArrayGeometry) -> ArrayLayout:
        return cls(
            path=meta.path,
            prefix=dm.data_prefix(meta.path),
            ndim=meta.ndim,
            separator=meta.separator,
            chunks_per_shard=meta.chunks_per_shard,
            grid_shape=meta.chunk_grid_shape,
        )


@dataclass
class _ChunkRead:
    layout: ArrayLayout
    shard_key: str
    local: Coords
    start: int = 0
    length: int | None = None


class ShardingStore(MutableMapping[str, bytes]):
    """The draft sharding storage transformer over any key-value store.

    Parameters
    ----------
    inner:
        A path or URL (opened with fsspec and ``storage_options``), an
        ``fsspec.FSMap``, any ``MutableMapping[str, bytes]``, or a zarr-python 3 ``Store``.
    chunks_per_shard, array_path, separator:
        Single-array mode for stores without metadata: every key under the data prefix
        of ``array_path`` is a chunk key of one array sharded with ``chunks_per_shard``.
        Without them the wrapper reads each array's draft metadata (hierarchy mode).
    index_cache_size:
        Keep up to this many shard indices (LRU) so warm chunk reads cost one request.
        Invalidated by this wrapper's own writes; other writers are not seen.
    coalesce_gap:
        Merge chunk ranges of one shard separated by at most this many bytes.
    lock:
        ``lock(shard_key)`` returning a context manager held around each shard rewrite,
        e.g. :func:`sharding_store.locks.file_lock` for several processes.
    max_workers:
        Threads used to rewrite several shards of one batch concurrently.
    layout:
        Single-array mode with everything known (e.g. ``ArrayLayout.from_meta(meta)``),
        including the chunk grid so edge shards are recognised as complete.
    """

    def __init__(
        self,
        inner: Any,
        *,
        chunks_per_shard: int | Sequence[int] | None = None,
        array_path: str = "",
        separator: str = "/",
        storage_options: Mapping[str, Any] | None = None,
        index_cache_size: int = 0,
        coalesce_gap: int = 0,
        lock: Callable[[str], ContextManager[Any]] | None = None,
        max_workers: int = 8,
        layout: ArrayLayout | None = None,
    ) -> None:
        self.inner: Inner = as_inner(inner, storage_options=storage_options)
        self.index_cache_size = index_cache_size
        self.coalesce_gap = coalesce_gap
        self.max_workers = max(1, max_workers)
        self._external_lock = lock
        self._locks = [threading.Lock() for _ in range(_N_LOCKS)]
        self._cache: OrderedDict[str, ShardIndex | None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._layouts: dict[str, ArrayLayout | None] = {}
        self._suffix: str | None = None
        self._fixed: ArrayLayout | None = layout
        if layout is not None and not layout.sharded:
            raise UsageError("layout=: the array must be sharded (chunks_per_shard is None)")
        if chunks_per_shard is not None and layout is None:
            if separator not in ("/", "."):
                raise UsageError(f"separator {separator!r}: must be '/' or '.'")
            cps = (chunks_per_shard,) if isinstance(chunks_per_shard, int) else tuple(chunks_per_shard)
            path = dm.normalize_path(array_path)
            self._fixed = ArrayLayout(path, dm.data_prefix(path), len(cps), separator, cps)
            ShardIndex.empty(cps)  # validates the entries

    # ------------------------------------------------------------------ metadata
    @property
    def metadata_key_suffix(self) -> str:
        if self._suffix is None:
            raw = self.inner.get(dm.ENTRY_POINT_KEY)
            self._suffix = dm.parse_entry_point(raw).metadata_key_suffix if raw is not None else ".json"
        return self._suffix

    def layout(self, path: str) -> ArrayLayout | None:
        """The layout of the array at ``path``, or ``None`` if no array is there (cached)."""
        if self._fixed is not None:
            return self._fixed if path == self._fixed.path else None
        try:
            return self._layouts[path]
        except KeyError:
            pass
        key = dm.array_meta_key(path, self.metadata_key_suffix)
        raw = self.inner.get(key)
        layout = None if raw is None else ArrayLayout.from_meta(dm.parse_array_geometry(raw, key, path))
        self._layouts[path] = layout
        return layout

    def invalidate(self) -> None:
        """Forget cached metadata and indices (after another writer changed the store)."""
        self._layouts.clear()
        self._suffix = None
        with self._cache_lock:
            self._cache.clear()

    def _candidate_paths(self, rest: str) -> Iterator[tuple[str, str]]:
        """``(array path, remainder)`` splits of a key/prefix below ``data/root/``."""
        if self._fixed is not None:
            prefix = self._fixed.prefix[len(DATA_ROOT) :]
            if rest.startswith(prefix):
                yield self._fixed.path, rest[len(prefix) :]
            return
        yield "", rest
        pos = rest.find("/")
        while pos != -1:
            yield rest[:pos], rest[pos + 1 :]
            pos = rest.find("/", pos + 1)

    def _locate(self, key: str) -> tuple[ArrayLayout, Coords] | None:
        """The sharded array and chunk coordinates of a chunk key; ``None`` for pass-through keys."""
        if not key.startswith(DATA_ROOT):
            return None
        for path, remainder in self._candidate_paths(key[len(DATA_ROOT) :]):
            if not remainder.startswith("c") or not self._is_valid_path(path):
                continue
            layout = self.layout(path)
            if layout is None:
                continue
            if not layout.sharded:
                return None
            coords = parse_chunk_suffix(remainder, layout.separator, layout.ndim)
            return (layout, coords) if coords is not None else None
        return None

    @staticmethod
    def _is_valid_path(path: str) -> bool:
        try:
            dm.normalize_path(path)
            return True
        except (DraftMetadataError, ValueError):
            return False

    def _array_for_prefix(self, prefix: str) -> tuple[ArrayLayout, str] | None:
        """The sharded array whose data prefix contains ``prefix``, and the rest of it."""
        if not prefix.startswith(DATA_ROOT):
            return None
        rest = prefix[len(DATA_ROOT) :]
        for path, remainder in self._candidate_paths(rest):
            if path == "" and rest and self._fixed is None and not remainder.startswith("c"):
                # the root is an array only when its chunks sit directly under data/root/
                continue
            layout = self.layout(path) if self._is_valid_path(path) or path == "" else None
            if layout is not None:
                return (layout, remainder) if layout.sharded else None
        return None

    # ----------------------------------------------------------------- the index
    def _lock_for(self, shard_key: str) -> threading.Lock:
        return self._locks[zlib.crc32(shard_key.encode()) % _N_LOCKS]

    @contextlib.contextmanager
    def _shard_lock(self, shard_key: str) -> Iterator[None]:
        with self._lock_for(shard_key):
            if self._external_lock is None:
                yield
            else:
                with self._external_lock(shard_key):
                    yield

    def _cache_get(self, shard_key: str) -> tuple[bool, ShardIndex | None]:
        if not self.index_cache_size:
            return False, None
        with self._cache_lock:
            if shard_key in self._cache:
                self._cache.move_to_end(shard_key)
                return True, self._cache[shard_key]
        return False, None

    def _cache_put(self, shard_key: str, index: ShardIndex | None) -> None:
        if not self.index_cache_size:
            return
        with self._cache_lock:
            self._cache[shard_key] = index
            self._cache.move_to_end(shard_key)
            while len(self._cache) > self.index_cache_size:
                self._cache.popitem(last=False)

    def read_indices(self, shards: Mapping[str, Coords], *, use_cache: bool = True) -> dict[str, ShardIndex | None]:
        """Indices of several shards (``shard key -> chunks_per_shard``) in one inner call."""
        out: dict[str, ShardIndex | None] = {}
        todo: dict[Coords, list[str]] = {}
        for key, cps in shards.items():
            hit, index = self._cache_get(key) if use_cache else (False, None)
            if hit:
                out[key] = index
            else:
                todo.setdefault(tuple(cps), []).append(key)
        if todo:
            for key, index in self._load_indices(todo).items():
                out[key] = index
        return out

    def _load_indices(self, todo: Mapping[Coords, Sequence[str]]) -> dict[str, ShardIndex | None]:
        """Read (one inner call for all) and validate (in bulk per layout) shard indices; cached."""
        flat = [(key, cps) for cps, keys in todo.items() for key in keys]
        tails = iter(self.inner.get_tails([(key, index_nbytes(cps)) for key, cps in flat]))
        out: dict[str, ShardIndex | None] = {}
        for cps, keys in todo.items():
            found = [(key, tail) for key, tail in zip(keys, tails)]
            present = [(key, tail) for key, tail in found if tail is not None]
            table = parse_indices(
                [raw for _, (raw, _) in present],
                cps,
                keys=[key for key, _ in present],
                payload_limits=[None if size is None else max(0, size - len(raw)) for _, (raw, size) in present],
            )
            rows = iter(table.reshape(len(present), *cps, 2))
            for key, tail in found:
                out[key] = None if tail is None else ShardIndex(next(rows))
        if self.index_cache_size:
            for key, index in out.items():
                self._cache_put(key, index)
        return out

    def _index_table(self, keys: Sequence[str], cps: Coords) -> np.ndarray:
        """``(len(keys), n_entries, 2)`` entries of shards of one layout (absent shards: empty),
        through the index cache; the misses in one inner call, validated in bulk."""
        n = math.prod(cps)
        table = np.empty((len(keys), n, 2), dtype=np.uint64)
        missing: list[int] = []
        if self.index_cache_size:
            with self._cache_lock:
                cache = self._cache
                for i, key in enumerate(keys):
                    index = cache.get(key, _MISSING)
                    if index is _MISSING:
                        missing.append(i)
                        continue
                    cache.move_to_end(key)
                    table[i] = MAX_UINT64 if index is None else index.entries.reshape(n, 2)  # type: ignore[union-attr]
        else:
            missing = list(range(len(keys)))
        if missing:
            loaded = self._load_indices({cps: [keys[i] for i in missing]})
            for i in missing:
                index = loaded[keys[i]]
                table[i] = MAX_UINT64 if index is None else index.entries.reshape(n, 2)
        return table

    def _read_ranges(self, wanted: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], memoryview]:
        """Read ``(shard key, offset, nbytes)`` ranges, coalescing those of one shard."""
        unique = list(dict.fromkeys(wanted))
        if not unique:
            return {}
        shard_of: dict[str, int] = {}
        seg = np.fromiter((shard_of.setdefault(k, len(shard_of)) for k, _, _ in unique), dtype=np.int64, count=len(unique))
        offsets = np.fromiter((o for _, o, _ in unique), dtype=np.uint64, count=len(unique))
        nbytes = np.fromiter((n for _, _, n in unique), dtype=np.uint64, count=len(unique))
        views = self._fetch_spans(list(shard_of), seg, offsets, nbytes)
        return dict(zip(unique, views))

    def _fetch_spans(self, keys: Sequence[str], seg: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray) -> list[memoryview]:
        """One inner call for the ranges ``(keys[seg[i]], offsets[i], nbytes[i])``; adjacent ranges
        of a shard coalesce (one sort for all shards).

        Returns a zero-copy view of each range, in the order given. A short read means the
        index points past the end of the object: :class:`ShardCorruptError`, never a short chunk.
        """
        if not len(seg):
            return []
        group, span_seg, lo, hi = coalesced_spans(offsets, offsets + nbytes, self.coalesce_gap, seg)
        lo_list, hi_list = lo.tolist(), hi.tolist()
        requests = [(keys[s], a, b) for s, a, b in zip(span_seg.tolist(), lo_list, hi_list)]
        blobs = self.inner.get_ranges(requests)
        views = [_checked_range(req, blob) for req, blob in zip(requests, blobs)]
        starts = (offsets - lo[group]).tolist()
        return [views[g][st : st + nb] for g, st, nb in zip(group.tolist(), starts, nbytes.tolist())]

    def read_chunks(self, layout: ArrayLayout, coords: Sequence[Coords] | np.ndarray) -> list[memoryview | None]:
        """Raw payloads of many chunks of one sharded array, addressed by grid coordinates.

        The fast path for array reads: no key strings are parsed. Indices come in one
        inner call (through the index cache), the chunk ranges in one more, coalesced per
        shard; payloads are zero-copy views. ``None`` marks an absent chunk. Everything
        is done for all shards at once (one entry table, one sort), without per-shard numpy.
        """
        cps = layout.chunks_per_shard
        assert cps is not None, "read_chunks needs a sharded layout"
        out: list[memoryview | None] = [None] * len(coords)
        if not len(coords):
            return out
        grid = np.asarray(coords, dtype=np.int64).reshape(len(coords), layout.ndim)
        if layout.ndim:
            cps_arr = np.array(cps, dtype=np.int64)
            shard_ids, inverse = _unique_rows(grid // cps_arr)
            flat_local = np.ravel_multi_index(tuple((grid % cps_arr).T), cps)
        else:
            shard_ids, inverse, flat_local = np.zeros((1, 0), np.int64), np.zeros(len(grid), np.int64), np.zeros(len(grid), np.int64)
        shard_keys = [layout.shard_key(tuple(sh)) for sh in shard_ids.tolist()]
        table = self._index_table(shard_keys, cps)
        entries = table[inverse, flat_local]
        live = np.flatnonzero(entries[:, 0] != MAX_UINT64)
        if not live.size:
            return out
        views = self._fetch_spans(shard_keys, inverse[live], entries[live, 0], entries[live, 1])
        for m, v in zip(live.tolist(), views):
            out[m] = v
        return out

    def read_whole_shards(self, layout: ArrayLayout, shards: Sequence[Coords]) -> Iterator[WholeShard | None]:
        """Whole shard objects (``None``: absent), in order, for reads of *every* chunk of them.

        One request per shard and no separate index request: the index is the object's own
        tail, so index and payloads are one consistent snapshot even if a writer replaces the
        shard meanwhile. Indices are validated against the object's size and cached.

        A local directory is read shard by shard, one ``pread`` each into a per-thread buffer
        reused for the next shard: an item is valid only until the next one is taken (and
        on the thread that took it). Other stores get all objects in one inner call.
        """
        cps = layout.chunks_per_shard
        assert cps is not None, "read_whole_shards needs a sharded layout"
        keys = [layout.shard_key(s) for s in shards]
        inner = self.inner
        local = isinstance(inner, FsspecInner) and inner.is_local
        if local:
            blobs: Iterable[Any] = (inner.read_local_into(k, _read_buffer) for k in keys)  # type: ignore[union-attr]
        else:
            blobs = inner.get_ranges([(k, 0, None) for k in keys]) if keys else []
        n = index_nbytes(cps)
        for key, blob in zip(keys, blobs):
            if blob is None:
                self._cache_put(key, None)
                yield None
                continue
            data = blob if local else np.frombuffer(blob, dtype=np.uint8)
            offsets, sizes = self._whole_shard_index(key, data, cps, n)
            yield WholeShard(data, _READ.address if local else data.ctypes.data, offsets, sizes)

    def _whole_shard_index(self, key: str, data: np.ndarray, cps: Coords, n: int) -> tuple[list[int], list[int]]:
        """The index of a whole shard object as ``(offsets, sizes)`` lists, validated against
        the object's size (:func:`~sharding_store.shard_index.entry_lists`), and cached."""
        limit = len(data) - n
        offsets, sizes = entry_lists(data[max(0, limit) :], cps, key=key, payload_limit=max(0, limit))
        if self.index_cache_size:
            table = np.array([offsets, sizes], dtype=np.uint64).T
            self._cache_put(key, ShardIndex(table.reshape(*cps, 2)))
        return offsets, sizes

    def _read(self, reads: Sequence[_ChunkRead]) -> list[bytes | None]:
        """The engine behind every chunk read: indices in one call, chunk ranges in one more."""
        shards = {r.shard_key: r.layout.chunks_per_shard for r in reads}
        indices = self.read_indices(shards)  # type: ignore[arg-type]
        spans: list[tuple[str, int, int] | None] = []
        for r in reads:
            index = indices[r.shard_key]
            entry = None if index is None else index.get(r.local)
            if entry is None:
                spans.append(None)
                continue
            off, nb = entry
            start = r.start if r.start >= 0 else max(0, nb + r.start)
            start = min(start, nb)
            stop = nb if r.length is None else min(nb, start + r.length)
            spans.append((r.shard_key, off + start, max(0, stop - start)))
        data = self._read_ranges([s for s in spans if s is not None])
        return [None if s is None else bytes(data[s]) for s in spans]

    def _chunk_read(self, key: str, located: tuple[ArrayLayout, Coords], start: int = 0, length: int | None = None) -> _ChunkRead:
        layout, coords = located
        shard, local = chunk_to_shard(coords, layout.chunks_per_shard)  # type: ignore[arg-type]
        return _ChunkRead(layout, layout.shard_key(shard, self._zero_d_key(key, layout)), local, start, length)

    @staticmethod
    def _zero_d_key(key: str, layout: ArrayLayout) -> str | None:
        # a 0-d array's shard key is its chunk key, whichever spelling ("c0" or "c") is used
        return key[len(layout.prefix) :] if layout.ndim == 0 else None

    # ------------------------------------------------------- MutableMapping API
    def __getitem__(self, key: str) -> bytes:
        located = self._locate(key)
        if located is None:
            value = self.inner.get(key)
        else:
            value = self._read([self._chunk_read(key, located)])[0]
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        located = self._locate(key)
        if located is None:
            return self.inner.exists(key)
        r = self._chunk_read(key, located)
        index = self.read_indices({r.shard_key: r.layout.chunks_per_shard})[r.shard_key]  # type: ignore[dict-item]
        return index is not None and index.get(r.local) is not None

    def __setitem__(self, key: str, value: bytes) -> None:
        self.update({key: value})

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self.erase_values([key])

    def __iter__(self) -> Iterator[str]:
        return self.list_prefix("")

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def getitems(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Values of the existing keys among ``keys`` (missing ones are left out), batched."""
        keys = list(keys)
        values = self.get_partial_values([(k, (0, None)) for k in keys])
        return {k: v for k, v in zip(keys, values) if v is not None}

    def get_partial_values(self, key_ranges: Iterable[tuple[str, tuple[int, int | None]]]) -> list[bytes | None]:
        """Byte ranges ``(start, length)`` of many keys; negative start counts from the end.

        All chunk reads share one index request and one coalesced range request.
        """
        key_ranges = list(key_ranges)
        out: list[bytes | None] = [None] * len(key_ranges)
        chunk_reads: list[tuple[int, _ChunkRead]] = []
        plain: list[tuple[int, RangeRequest, int | None]] = []
        for i, (key, (start, length)) in enumerate(key_ranges):
            located = self._locate(key)
            if located is not None:
                chunk_reads.append((i, self._chunk_read(key, located, start, length)))
            elif start < 0:  # a suffix; trimmed to ``length`` below
                plain.append((i, (key, start, None), length))
            else:
                plain.append((i, (key, start, None if length is None else start + length), None))
        if chunk_reads:
            for (i, _), value in zip(chunk_reads, self._read([r for _, r in chunk_reads])):
                out[i] = value
        if plain:
            for (i, _, trim), value in zip(plain, self.inner.get_ranges([req for _, req, _ in plain])):
                out[i] = value if value is None or trim is None else value[:trim]
        return out

    # ----------------------------------------------------------------- writing
    def update(self, other: Any = (), /, **kwargs: bytes) -> None:  # type: ignore[override]
        """Write many keys; each affected shard is rewritten exactly once."""
        items = dict(other.items() if isinstance(other, Mapping) else other)
        items.update(kwargs)
        changes: dict[str, tuple[ArrayLayout, Coords, dict[Coords, bytes | None]]] = {}
        plain: dict[str, bytes] = {}
        for key, value in items.items():
            value = _as_bytes(key, value)
            located = self._locate(key)
            if located is None:
                self._check_plain_write(key)
                plain[key] = value
                continue
            self._stage(changes, key, located, value)
        for key, value in plain.items():
            self.inner.set(key, value)
            self._after_plain_write(key)
        self._apply(changes)

    def _stage(
        self,
        changes: dict[str, tuple[ArrayLayout, Coords, dict[Coords, bytes | None]]],
        key: str,
        located: tuple[ArrayLayout, Coords],
        value: bytes | None,
    ) -> None:
        """Group one chunk change (``None`` erases) under its shard for :meth:`_apply`."""
        layout, coords = located
        shard, local = chunk_to_shard(coords, layout.chunks_per_shard)  # type: ignore[arg-type]
        skey = layout.shard_key(shard, self._zero_d_key(key, layout))
        changes.setdefault(skey, (layout, shard, {}))[2][local] = value

    def _check_plain_write(self, key: str) -> None:
        found = self._array_for_prefix(key)
        if found is not None:
            layout, _ = found
            raise ChunkKeyError(
                f"{key}: not a chunk key of the sharded array at '{layout.path or '/'}' "
                f"({layout.ndim}-d, separator {layout.separator!r}); refusing to write a stray object into its shards' prefix",
                key=key,
            )

    def _after_plain_write(self, key: str) -> None:
        if key.startswith("meta/") or key == dm.ENTRY_POINT_KEY:
            self._layouts.clear()
            self._suffix = None

    def _apply(self, changes: Mapping[str, tuple[ArrayLayout, Coords, dict[Coords, bytes | None]]]) -> None:
        """Rewrite each shard once: ``bytes`` sets a chunk, ``None`` erases it."""
        if not changes:
            return
        jobs = list(changes.items())
        if len(jobs) == 1 or self.max_workers == 1:
            for skey, (layout, shard, local_changes) in jobs:
                self._rewrite_shard(skey, layout, shard, local_changes)
            return
        with ThreadPoolExecutor(min(self.max_workers, len(jobs))) as pool:
            for f in [pool.submit(self._rewrite_shard, k, *v) for k, v in jobs]:
                f.result()

    def _rewrite_shard(self, skey: str, layout: ArrayLayout, shard: Coords, changes: dict[Coords, bytes | None]) -> None:
        cps = layout.chunks_per_shard
        assert cps is not None
        sets = {c: v for c, v in changes.items() if v is not None}
        erases = {c for c, v in changes.items() if v is None}
        with self._shard_lock(skey):
            if layout.shard_is_full(shard, changes):
                chunks = sets  # every chunk given: no need to look at the old shard
            else:
                index = self.read_indices({skey: cps}, use_cache=False)[skey]
                survivors = [] if index is None else [(c, o, n) for c, o, n in index.live() if c not in changes]
                if not sets and (index is None or not any(index.get(c) for c in erases)):
                    return  # erasing chunks that are not there: nothing to rewrite
                data = self._read_ranges([(skey, o, n) for _, o, n in survivors])
                chunks: dict[Coords, bytes | memoryview] = {c: data[(skey, o, n)] for c, o, n in survivors}
                chunks.update(sets)
            if chunks:
                blob, index = encode_shard_and_index(chunks, cps)
                self.inner.set(skey, blob)
                self._cache_put(skey, index)
            else:
                self.inner.delete(skey)
                self._cache_put(skey, None)

    def set_partial_values(self, key_start_values: Iterable[tuple[str, int, bytes]]) -> None:
        """Write ``value`` at byte ``start`` of each key (extending it as needed); one rewrite per shard."""
        edits: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
        for key, start, value in key_start_values:
            if start < 0:
                raise UsageError(f"{key}: set_partial_values start {start} must be >= 0")
            edits[key].append((start, _as_bytes(key, value)))
        keys = list(edits)
        current = self.get_partial_values([(k, (0, None)) for k in keys])
        new: dict[str, bytes] = {}
        for key, old in zip(keys, current):
            buf = bytearray(old or b"")
            for start, value in edits[key]:
                if len(buf) < start:
                    buf.extend(b"\0" * (start - len(buf)))
                buf[start : start + len(value)] = value
            new[key] = bytes(buf)
        self.update(new)

    def erase(self, key: str) -> None:
        """Remove ``key`` if present (no error if it is not)."""
        self.erase_values([key])

    def erase_values(self, keys: Iterable[str]) -> None:
        """Remove many keys; each affected shard is rewritten (or deleted) at most once."""
        changes: dict[str, tuple[ArrayLayout, Coords, dict[Coords, bytes | None]]] = {}
        for key in keys:
            located = self._locate(key)
            if located is None:
                self.inner.delete(key)
                self._after_plain_write(key)
                continue
            self._stage(changes, key, located, None)
        self._apply(changes)

    def erase_prefix(self, prefix: str) -> None:
        """Remove every key under ``prefix``; whole shards are deleted without being read."""
        found = self._array_for_prefix(prefix)
        if found is None or found[1] == "":
            # whole arrays (or plain keys) go: the shards under it can be dropped as they are
            self.inner.delete_prefix(prefix)
            self._after_plain_write(prefix)
            return
        self.erase_values(list(self.list_prefix(prefix)))

    # ----------------------------------------------------------------- listing
    def list(self) -> Iterator[str]:
        return self.list_prefix("")

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every key starting with ``prefix``; shards are expanded to their live chunk keys."""
        found = self._array_for_prefix(prefix)
        inner_prefix = prefix
        if found is not None:
            layout, rest = found
            pc = prefix_coords(rest, layout.separator)
            if pc is None:
                inner_prefix = prefix  # no chunk key can match: only stray keys
            else:
                fixed, _ = pc
                fixed = fixed[: max(0, layout.ndim - 1)] if layout.separator == "/" else ()
                shard_fixed = tuple(c // n for c, n in zip(fixed, layout.chunks_per_shard))  # type: ignore[arg-type]
                inner_prefix = layout.prefix + ("c" + "".join(f"{c}{layout.separator}" for c in shard_fixed) if shard_fixed else "")
        return self._expand(self.inner.list_prefix(inner_prefix), prefix)

    def _expand(self, inner_keys: Iterable[str], prefix: str, batch: int = 512) -> Iterator[str]:
        """Replace shard keys by the chunk keys they hold (indices read in batches)."""
        pending: list[tuple[str, ArrayLayout, Coords]] = []

        def flush() -> Iterator[str]:
            indices = self.read_indices({k: lay.chunks_per_shard for k, lay, _ in pending})  # type: ignore[misc]
            for skey, lay, shard in pending:
                index = indices[skey]
                if index is None:
                    continue
                for local, _, _ in index.live():
                    coords = local_to_global(shard, local, lay.chunks_per_shard)  # type: ignore[arg-type]
                    ckey = skey if lay.ndim == 0 else lay.chunk_key(coords)
                    if ckey.startswith(prefix):
                        yield ckey
            pending.clear()

        for key in inner_keys:
            located = self._locate(key)
            if located is None:
                if key.startswith(prefix):
                    yield key
                continue
            pending.append((key, located[0], located[1]))
            if len(pending) >= batch:
                yield from flush()
        if pending:
            yield from flush()

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """Direct children of ``prefix``: ``(keys, prefixes)``, prefixes ending in ``/``.

        As the spec notes, a prefix is listed for every chunk row a present shard may
        hold, without checking that row has chunks; listed full keys always exist.
        """
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        found = self._array_for_prefix(prefix)
        pc = None if found is None else prefix_coords(found[1], found[0].separator)
        if found is None or pc is None or (found[1] and found[0].separator == "."):
            return self.inner.list_dir(prefix)
        layout, _ = found
        cps = layout.chunks_per_shard
        assert cps is not None
        fixed, _ = pc
        k = len(fixed)
        if k >= max(layout.ndim, 1):
            return self.inner.list_dir(prefix)
        shard_fixed = tuple(c // n for c, n in zip(fixed, cps))
        inner_prefix = layout.prefix + ("c" + "".join(f"{c}/" for c in shard_fixed) if k else "")
        inner_keys, inner_prefixes = self.inner.list_dir(inner_prefix)
        keys = list(self._expand(inner_keys, prefix))
        prefixes: set[str] = set()
        head = "" if k else "c"
        for p in inner_prefixes:
            comp = p[len(inner_prefix) :].rstrip("/")
            digits = comp[len(head) :] if comp.startswith(head) else ""
            if layout.separator != "/" or not digits.isdigit():
                prefixes.add(p)  # not a shard row: a stray directory, passed through
                continue
            s = int(digits)
            hi = (s + 1) * cps[k]
            if layout.grid_shape is not None:
                hi = min(hi, layout.grid_shape[k])
            prefixes.update(f"{prefix}{head}{c}/" for c in range(s * cps[k], hi))
        return sorted(keys), sorted(prefixes)


def coalesced_spans(
    offsets: np.ndarray, ends: np.ndarray, gap: int, seg: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge byte ranges of one object (``seg``: of several, by object number) closer than ``gap``.

    Returns ``(span of each range, object of each span, span starts, span ends)``, spans
    sorted by object then offset. Ranges may overlap or nest (an index may share bytes).
    """
    n = len(offsets)
    seg = np.zeros(n, dtype=np.int64) if seg is None else np.asarray(seg, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.uint64)
    ends = np.asarray(ends, dtype=np.uint64)
    order = np.lexsort((offsets, seg))
    s, lo, hi = seg[order], offsets[order], ends[order]
    # the furthest end so far within each object: a running max of (object, rank of end)
    by_end = np.argsort(hi, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_end] = np.arange(n, dtype=np.int64)
    best = np.maximum.accumulate(s * n + rank) - s * n
    reach = hi[by_end[best]]
    with np.errstate(over="ignore"):
        limit = reach[:-1] + np.uint64(gap)
    limit = np.where(limit < reach[:-1], np.uint64(MAX_UINT64), limit)  # saturate instead of wrapping
    breaks = np.flatnonzero((s[1:] != s[:-1]) | (lo[1:] > limit)) + 1
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks, [n])) - 1
    group = np.empty(n, dtype=np.int64)
    group[order] = np.repeat(np.arange(len(first)), last - first + 1)
    return group, s[first], lo[first], reach[last]


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` through one linear index (much faster)."""
    lo = rows.min(axis=0)
    dims = rows.max(axis=0) - lo + 1
    if math.prod(int(d) for d in dims) >= 2**62:
        ids, inverse = np.unique(rows, axis=0, return_inverse=True)
        return ids, inverse.ravel()
    lin = np.ravel_multi_index(tuple((rows - lo).T), tuple(int(d) for d in dims))
    uniq, inverse = np.unique(lin, return_inverse=True)
    ids = np.stack(np.unravel_index(uniq, tuple(int(d) for d in dims)), axis=1) + lo
    return ids.reshape(len(uniq), rows.shape[1]), inverse.ravel()


def _checked_range(request: tuple[str, int, int], blob: bytes | None) -> memoryview:
    key, lo, hi = request
    if blob is None:
        raise ShardCorruptError(f"{key}: shard disappeared while its chunks were read", key=key)
    if len(blob) != hi - lo:
        raise ShardCorruptError(
            f"{key}: shard index points to bytes [{lo}, {hi}) but the object ends at {lo + len(blob)}", key=key
        )
    return memoryview(blob)


def _as_bytes(key: str, value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "tobytes"):
        return value.tobytes()
    raise UsageError(f"{key}: value must be bytes-like, not {type(value).__name__}")
