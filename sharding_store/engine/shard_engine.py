"""The shard engine: how the draft shards of one array are read and rewritten.

One :class:`ShardEngine` per (store, array layout). Everything that touches draft shard
objects goes through it: :class:`~sharding_store.ShardingStore` (the public mapping),
:class:`~sharding_store.api.arrays.DraftArray`, the zarr-python 3 view, migrate, verify and
reshard. It owns:

* **index layouts** — the draft one (a plain index at the end: the fast paths below) and,
  for final-v3 layouts (the 2023 generation), an index followed by a CRC32C (checked on
  every read), at the start of the object, or *undeclared*: each shard's last ``16·n + 4``
  bytes decide whether a CRC32C follows its index
  (:func:`~sharding_store.formats.shard_index.index_reading`, which never guesses) and every shard
  of the array must agree, so a hidden checksum can never be read as index entries;
* **index reads** — a shard's index is the last ``16 * n`` bytes of its object, read
  with one suffix request (all shards of a batch in one inner call) and validated in full
  (:mod:`sharding_store.formats.shard_index`: half sentinels, overflow, entries outside the payload
  area — an entry pointing into the index itself included). The object's size, when the
  store knows it, is compared with the index it claims before anything is allocated.
* **the index cache** (:class:`IndexCache`, LRU), whose entries carry the object's version.
  Only existing shards are cached, and a cached index is trusted only for the chunks it
  holds (their range reads check its version): one that says a chunk is absent is read
  again, since no range read would tell that another writer added the chunk since;
* **consistent reads** — chunk ranges are read with the version of the index they come
  from, so a writer replacing the shard between the two requests makes the read fail
  with :class:`~sharding_store.errors.ObjectChangedError` instead of returning bytes of
  another chunk. The engine then drops the cached index and reads index and ranges again
  under the shard's in-process lock (so a writer of this process cannot interfere), with
  backoff for a bounded time against writers of other processes (``ObjectChangedError``
  naming the key when that runs out; see :meth:`ShardEngine._consistently`). A store that
  cannot tell versions (a zarr-python 3 store, a mapping with ``get_partial_values``, most
  non-S3 object stores) gets the index read again after the ranges and compared instead: one
  more request per batch there. A shard read whole is one request, hence one snapshot;
* **coalescing** — ranges of one shard closer than ``coalesce_gap`` are read as one;
* **rewrites** — read-modify-write of a shard under its lock (:class:`ShardLocks`),
  written compact (live chunks in C order, index at the end, no dead bytes); a shard left
  without chunks is deleted.

I/O (asserted by tests that count requests): a cold chunk read is one suffix read plus one
range read, a warm one a single range read; a batch reads every index in one call and all
chunk ranges in one more. Versions ride along those requests; they never add one.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    import numpy as np

from ..codec.buffers import io_buffer
from ..errors import ObjectChangedError, ShardCorruptError, UsageError
from ..formats import draft_metadata as dm
from ..formats.keys import (
    ZERO_D_KEYS,
    Coords,
    chunk_key_pattern,
    chunk_to_shard,
    format_chunk_suffix,
    format_key_suffix,
    key_head,
    local_to_global,
    parse_chunk_suffix,
    parse_key_suffix,
    shard_chunks,
)
from ..formats.shard_index import (
    CHECKSUM_NBYTES,
    MAX_UINT64,
    IndexLocation,
    ShardIndex,
    encode_shard_and_index,
    entry_lists,
    index_nbytes,
    index_reading,
    n_entries,
    parse_indices,
    payload_bounds,
    read_index,
)
from ..formats.v3_layout import KeyEncoding, V3ArrayMeta
from ..stores import Inner
from ..stores.base import renew_after_fork

__all__ = [
    "ArrayLayout",
    "ChunkRange",
    "IndexCache",
    "ShardContents",
    "ShardEngine",
    "ShardLocks",
    "VersionedIndex",
    "WholeShard",
    "coalesced_spans",
    "gather",
    "keep_read_buffers",
    "read_objects",
    "read_shard_index",
]

#: striped in-process locks per store: shards hash onto these
N_LOCKS = 64
#: a read buffer up to this size is kept per thread (bigger shards get a fresh one each time)
READ_KEEP = 64 * 2**20
_READ = threading.local()


def _read_buffer(nbytes: int) -> np.ndarray:
    """This thread's reusable buffer for whole shard objects, at least ``nbytes`` long.

    Reusing it means reading many shards touches no fresh memory: in a fresh process,
    faulting in new pages for every shard object costs about as much as the copy itself.
    Thread-local, so a forked child (whose only thread is the one that forked) inherits at
    most that thread's buffer, which it may keep using."""
    buf = getattr(_READ, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = io_buffer(max(nbytes, 1 << 20))
        _READ.buf = buf if nbytes <= getattr(_READ, "keep", READ_KEEP) else None
    return buf


def keep_read_buffers(limit: int) -> None:
    """This thread keeps its whole-shard read buffer (:func:`_read_buffer`) only up to
    ``limit`` bytes instead of :data:`READ_KEEP`: for the threads of a wide pool, whose
    buffers would otherwise add up to READ_KEEP each for the process's lifetime."""
    _READ.keep = limit
    buf = getattr(_READ, "buf", None)
    if buf is not None and buf.nbytes > limit:
        _READ.buf = None


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class ArrayLayout:
    """What the engine needs to know of one array to map chunks to objects."""

    path: str
    prefix: str  # the array's data prefix, "data/root/<path>/"
    ndim: int
    separator: str
    chunks_per_shard: Coords | None  # None: not sharded, one object per chunk
    grid_shape: Coords | None = None  # chunk grid, when the array's shape is known
    zero_d: str = "c0"
    #: the key spelling: the 2022 drafts' ``c1/0``, or final v3 ``default`` / ``v2``
    encoding: KeyEncoding = "draft"
    #: where each shard's index lies, and whether a CRC32C follows it (None: undeclared,
    #: each shard's bytes decide; see :func:`~sharding_store.formats.shard_index.index_reading`)
    index_location: IndexLocation = "end"
    index_checksum: bool | None = False

    @property
    def sharded(self) -> bool:
        return self.chunks_per_shard is not None

    @property
    def plain_index(self) -> bool:
        """The draft shard format: a plain index at the end (the engine's fast paths)."""
        return self.index_location == "end" and self.index_checksum is False

    @property
    def head(self) -> str:
        """What every chunk key of an ``ndim >= 1`` array starts with (prefix included)."""
        return self.prefix + key_head(self.encoding, self.separator)

    def chunk_key(self, coords: Coords) -> str:
        if self.encoding != "draft":
            return self.prefix + format_key_suffix(coords, self.encoding, self.separator)
        return self.prefix + format_chunk_suffix(coords, self.separator, zero_d=self.zero_d)

    def shard_key(self, shard: Coords, zero_d: str | None = None) -> str:
        if self.encoding != "draft":
            return self.prefix + format_key_suffix(shard, self.encoding, self.separator)
        return self.prefix + format_chunk_suffix(shard, self.separator, zero_d=zero_d or self.zero_d)

    @cached_property
    def _draft_keys(self) -> re.Pattern[str] | None:
        """The pattern of this array's whole draft chunk keys (None: 0-d, or v3 keys)."""
        if self.encoding != "draft" or not self.ndim:
            return None
        return chunk_key_pattern(self.separator, self.ndim, self.prefix)

    def parse(self, key: str) -> Coords | None:
        draft = self._draft_keys
        if draft is not None:  # one C call (a listing parses every key: one a shard)
            match = draft.fullmatch(key)
            return None if match is None else tuple(map(int, match.groups()))
        if not key.startswith(self.prefix):
            return None
        if self.encoding != "draft":
            return parse_key_suffix(key[len(self.prefix) :], self.encoding, self.separator, self.ndim)
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
        if isinstance(meta, V3ArrayMeta):
            return cls(
                path=meta.path,
                prefix=meta.data_prefix,
                ndim=meta.ndim,
                separator=meta.separator,
                chunks_per_shard=meta.chunks_per_shard,
                grid_shape=meta.chunk_grid_shape,
                zero_d=ZERO_D_KEYS[meta.key_encoding],
                encoding=meta.key_encoding,
                index_location=meta.index_location,
                index_checksum=meta.index_checksum,
            )
        return cls(
            path=meta.path,
            prefix=dm.data_prefix(meta.path),
            ndim=meta.ndim,
            separator=meta.separator,
            chunks_per_shard=meta.chunks_per_shard,
            grid_shape=meta.chunk_grid_shape,
        )


# --------------------------------------------------------------------------- named results


class VersionedIndex(NamedTuple):
    """One shard's index as read, with what ties later chunk reads to that read."""

    #: None: the shard object does not exist
    index: ShardIndex | None  # type: ignore[assignment]  # a field named like tuple.index
    #: the object's version at that read (:class:`~sharding_store.stores.Tail`), None if unknown
    version: Hashable | None = None
    #: the object's size, when known (the payload area was checked against it)
    size: int | None = None
    #: the index bytes as read, kept when there is no version (to compare with a re-read)
    raw: bytes | None = None


ABSENT = VersionedIndex(None)


class ChunkRange(NamedTuple):
    """One chunk of a shard (``local``: its coordinates in the shard), or a byte range of it:
    ``start`` (negative: from the end) and ``length`` (None: to the end)."""

    shard_key: str
    local: Coords
    start: int = 0
    length: int | None = None


class WholeShard(NamedTuple):
    """A shard object read whole: its bytes (valid until the next shard is read, see
    :meth:`ShardEngine.read_whole_shards`), their address, and its index as flat C-order
    lists, validated against the object's size (``MAX_UINT64``: absent). ``offsets`` and
    ``sizes`` are None when the caller asked for the index checked only (``lists=False``):
    it is then valid and still in the object's tail (:meth:`ShardEngine.whole_lists`)."""

    data: np.ndarray
    address: int
    offsets: list[int] | None
    sizes: list[int] | None
    key: str = ""


class ShardContents(NamedTuple):
    """A shard object read whole for copying: its live chunks (local coords -> views into
    ``blob``), the object, and the bytes its index does not account for."""

    chunks: dict[Coords, memoryview]
    blob: bytes
    dead_bytes: int
    index: ShardIndex  # type: ignore[assignment]  # a field named like tuple.index


# --------------------------------------------------------------------------- cache and locks

class IndexCache:
    """Shard indices by shard key (LRU, thread-safe), each with the version it was read at.

    ``capacity`` 0 disables it. Several engines (one per array of a store) may share one.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = max(0, int(capacity))
        self._entries: OrderedDict[str, VersionedIndex] = OrderedDict()
        self._lock = threading.Lock()
        renew_after_fork(self)  # a forked child gets fresh locks

    def __bool__(self) -> bool:
        return self.capacity > 0

    def get(self, key: str) -> VersionedIndex | None:
        if not self.capacity:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def get_many(self, keys: Sequence[str]) -> list[VersionedIndex | None]:
        if not self.capacity:
            return [None] * len(keys)
        with self._lock:
            entries = self._entries
            out = [entries.get(k) for k in keys]
            for k, e in zip(keys, out):
                if e is not None:
                    entries.move_to_end(k)
            return out

    def put(self, key: str, entry: VersionedIndex) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def drop(self, keys: Iterable[str]) -> None:
        if not self.capacity:
            return
        with self._lock:
            for k in keys:
                self._entries.pop(k, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity}  # a copy elsewhere starts cold (and with its own lock)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"])  # type: ignore[misc]

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it


class ShardLocks:
    """Serialises rewrites of one shard: a striped in-process lock per shard key, then the
    caller's ``external(shard_key)`` context manager if given (e.g.
    :func:`sharding_store.stores.locks.file_lock` for several processes)."""

    def __init__(self, external: Callable[[str], AbstractContextManager[Any]] | None = None) -> None:
        self.external = external
        self._locks = [threading.Lock() for _ in range(N_LOCKS)]
        renew_after_fork(self)  # a forked child gets fresh locks

    def __getstate__(self) -> dict[str, Any]:
        return {"external": self.external}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["external"])  # type: ignore[misc]

    def _after_fork(self) -> None:
        self._locks = [threading.Lock() for _ in range(N_LOCKS)]

    def _stripe(self, shard_key: str) -> threading.Lock:
        return self._locks[zlib.crc32(shard_key.encode()) % N_LOCKS]

    @contextlib.contextmanager
    def hold_local(self, shard_keys: Iterable[str]) -> Iterator[None]:
        """Hold the in-process locks of several shards (not ``external``): a reader that holds
        them sees no rewrite by a writer of this process. Stripes are taken in one global order
        (a writer holds one at a time), so readers and writers never deadlock."""
        stripes = sorted({zlib.crc32(k.encode()) % N_LOCKS for k in shard_keys})
        with contextlib.ExitStack() as stack:
            for i in stripes:
                stack.enter_context(self._locks[i])
            yield

    @contextlib.contextmanager
    def hold(self, shard_key: str) -> Iterator[None]:
        with self._stripe(shard_key):
            if self.external is None:
                yield
            else:
                with self.external(shard_key):
                    yield


# --------------------------------------------------------------------------- the engine


class _Changed(Exception):
    """Internal: an object changed (or vanished, or came back short) between its index read
    and a range read; the engine reads again once."""

    def __init__(self, key: str, why: str, damage: ShardCorruptError | None = None) -> None:
        super().__init__(key)
        self.key = key
        self.why = why
        #: a store without versions: bytes that contradict an index which read again the same;
        #: damage if a second read shows it again (an index can also change and change back)
        self.damage = damage


def _changed_twice(e: _Changed, seconds: float | None = None) -> ShardCorruptError | ObjectChangedError:
    if e.damage is not None:
        return e.damage
    key, why = e.key, e.why
    during = "twice" if seconds is None else f"on every read for {seconds:g} s"
    return ObjectChangedError(
        f"{key}: the shard changed {during} while its chunks were read ({why}): another writer keeps "
        "replacing it; nothing was returned, read again once it is quiet",
        key=key,
    )


#: a chunk read that finds its shard replaced by a writer of another process reads again,
#: backing off, for at most this long before raising ObjectChangedError
READ_RETRY_SECONDS = 5.0
#: the first and the longest pause between those reads
RETRY_FIRST_PAUSE = 0.001
RETRY_MAX_PAUSE = 0.1


T = TypeVar("T")


class ShardEngine:
    """Reads and rewrites the draft shards of one sharded array over one store.

    ``index_cache_size``: keep that many indices (LRU) so warm chunk reads cost one request;
    or share ``cache`` with other engines. ``coalesce_gap``: merge ranges of one shard closer
    than this. ``locks``/``lock``: see :class:`ShardLocks`. ``max_workers``: threads that
    rewrite several shards of one batch (:meth:`rewrite_shards`).
    """

    def __init__(
        self,
        inner: Inner,
        layout: ArrayLayout,
        *,
        index_cache_size: int = 0,
        cache: IndexCache | None = None,
        coalesce_gap: int = 0,
        locks: ShardLocks | None = None,
        lock: Callable[[str], AbstractContextManager[Any]] | None = None,
        max_workers: int = 8,
    ) -> None:
        if layout.chunks_per_shard is None:
            raise UsageError(f"'/{layout.path}': the shard engine needs a sharded layout (chunks_per_shard is None)")
        self.inner = inner
        self.layout = layout
        self.cps: Coords = tuple(layout.chunks_per_shard)
        self.n_entries = n_entries(self.cps)  # validates without allocating an index
        #: the draft format (plain index at the end): the fast paths below; anything else
        #: (v3: a CRC32C, an index at the start, an undeclared index) takes the general ones
        self._plain = layout.plain_index
        checksum = layout.index_checksum
        self.index_nbytes = index_nbytes(self.cps, bool(checksum))
        #: bytes read at an object's end for its index (an undeclared one: room for a CRC32C)
        self._tail_nbytes = self.index_nbytes + (CHECKSUM_NBYTES if checksum is None else 0)
        #: a range read of an object of unknown size asks for this much more (see _fetch_spans)
        self._extend = self.index_nbytes if layout.index_location == "end" else 0
        #: an undeclared index: reading -> the first shard read that way (all must agree)
        self._decided: dict[str, str] = {}
        self.cache = cache if cache is not None else IndexCache(index_cache_size)
        self.coalesce_gap = coalesce_gap
        self.locks = locks if locks is not None else ShardLocks(lock)
        self.max_workers = max(1, max_workers)
        #: how long a chunk read keeps reading again a shard that another process keeps replacing
        self.read_retry_seconds = READ_RETRY_SECONDS

    def shard_key(self, shard: Coords) -> str:
        return self.layout.shard_key(shard)

    def invalidate(self) -> None:
        """Forget cached indices (after another writer changed the store)."""
        self.cache.clear()

    # ------------------------------------------------------------------ indices
    def read_index(self, key: str, *, use_cache: bool = True) -> VersionedIndex:
        return self.read_indices([key], use_cache=use_cache)[key]

    def read_indices(
        self, keys: Sequence[str], *, use_cache: bool = True, hits: set[str] | None = None
    ) -> dict[str, VersionedIndex]:
        """Indices of several shards: cache hits (their keys added to ``hits``, if given),
        then the misses in one inner call."""
        keys = list(dict.fromkeys(keys))
        cached = self.cache.get_many(keys) if use_cache else [None] * len(keys)
        out = {k: h for k, h in zip(keys, cached) if h is not None}
        if hits is not None:
            hits.update(out)
        missing = [k for k, h in zip(keys, cached) if h is None]
        if missing:
            out.update(zip(missing, self._load(missing)))
        return out

    def _refresh(self, found: dict[str, VersionedIndex], stale: Sequence[str]) -> None:
        """Read again (into ``found``) cached indices that answered "absent" for a chunk: no
        range read checks such an answer against the shard's version, and another writer
        may have added the chunk since."""
        self.cache.drop(stale)
        found.update(zip(stale, self._load(stale)))

    def _load(self, keys: Sequence[str]) -> list[VersionedIndex]:
        """Read (one inner call for all) and validate (in bulk) the indices of ``keys``; cached.

        Nothing proportional to the index is allocated before the store has returned it: an
        object shorter than the index it claims is refused by its length alone."""
        if not self._plain:
            return self._cached(keys, self._load_general(keys))
        n = self.index_nbytes
        tails = self.inner.get_tails([(k, n) for k in keys])
        present = [(i, t) for i, t in enumerate(tails) if t is not None]
        out = [ABSENT] * len(keys)
        if present:
            raws = [t[0] for _, t in present]
            sizes = [t[1] for _, t in present]
            table = parse_indices(
                raws,
                self.cps,
                keys=[keys[i] for i, _ in present],
                payload_limits=[None if s is None else max(0, s - len(r)) for r, s in zip(raws, sizes)],
            )
            rows = table.reshape(len(present), *self.cps, 2)
            for j, (i, t) in enumerate(present):
                version = getattr(t, "version", None)
                out[i] = VersionedIndex(ShardIndex(rows[j]), version, sizes[j], None if version is not None else bytes(raws[j]))
        return self._cached(keys, out)

    def _cached(self, keys: Sequence[str], out: list[VersionedIndex]) -> list[VersionedIndex]:
        if self.cache:
            for k, e in zip(keys, out):
                if e.index is not None:  # "absent" has no version to check later: never cached
                    self.cache.put(k, e)
        return out

    # ------------------------------------------------------------------ other index layouts (v3)
    def _load_general(self, keys: Sequence[str]) -> list[VersionedIndex]:
        """:meth:`_load` for an index at the start, followed by a CRC32C (checked), or
        undeclared (each shard's bytes decide, and every shard must agree)."""
        out = [ABSENT] * len(keys)
        if self.layout.index_location == "start":
            nb = self.index_nbytes
            for i, (key, head) in enumerate(zip(keys, self.inner.get_ranges([(k, 0, nb) for k in keys]))):
                if head is None:
                    continue
                if len(head) < nb:
                    raise ShardCorruptError(f"{key}: object is {len(head)} bytes, shorter than its {nb}-byte shard index", key=key)
                index = ShardIndex.from_bytes(
                    head[:nb], self.cps, checksum=bool(self.layout.index_checksum), key=key, payload_start=nb
                )
                out[i] = VersionedIndex(index, None, None, bytes(head[:nb]))
            return out
        tails = self.inner.get_tails([(k, self._tail_nbytes) for k in keys])
        for i, (key, t) in enumerate(zip(keys, tails)):
            if t is None:
                continue
            data, size, version = t[0], t[1], getattr(t, "version", None)
            if size is None and len(data) < self._tail_nbytes:
                size = len(data)  # the tail is the whole object
            if size is None and self.layout.index_checksum is None:
                whole = self.inner.get(key)  # only the object's size can decide an undeclared index
                if whole is None:
                    continue
                data, size, version = whole[-self._tail_nbytes :], len(whole), None
            checksum = self._checksum(key, data, size)
            nb = index_nbytes(self.cps, checksum)
            if len(data) < nb:
                raise ShardCorruptError(f"{key}: object is {len(data)} bytes, shorter than its {nb}-byte shard index", key=key)
            index = ShardIndex.from_bytes(
                data[len(data) - nb :], self.cps, checksum=checksum, key=key,
                payload_limit=None if size is None else size - nb,
            )
            out[i] = VersionedIndex(index, version, size, None if version is not None else bytes(data))
        return out

    def _checksum(self, key: str, tail: Any, size: int | None) -> bool:
        """Whether a CRC32C follows this shard's index (at the end): as declared, or, when
        undeclared, as its bytes say (``tail``: its last ``16·n + 4`` bytes; never guessed,
        see :func:`index_reading`), which must be what every other shard said."""
        declared = self.layout.index_checksum
        if declared is not None:
            return declared
        reading = index_reading(tail, self.cps, size, key=key)
        self._decided.setdefault(reading, key)
        if len(self._decided) > 1:
            plain, hidden = self._decided["plain"], self._decided["crc32c-hidden"]
            raise ShardCorruptError(
                f"{key}: array '/{self.layout.path}' declares no index_codecs and its shards disagree: {plain} has a "
                f"plain index, {hidden} an index followed by its CRC32C; refusing to guess",
                key=key,
            )
        return reading == "crc32c-hidden"

    def expect_reading(self, reading: str, key: str) -> None:
        """An undeclared index: the array's shards read as ``reading`` (``key`` did), as a reader
        has already declared; a shard that reads otherwise is refused as disagreeing."""
        self._decided.setdefault(reading, key)

    def _object_index(self, key: str, data: Any) -> tuple[list[int], list[int], int]:
        """``(offsets, sizes, index bytes)`` of a whole object of another index layout."""
        n = len(data)
        if self.layout.index_location == "start":
            nb = self.index_nbytes
            checksum = bool(self.layout.index_checksum)
            raw, start, limit = data[:nb], nb, n
        else:
            checksum = self._checksum(key, data[max(0, n - self._tail_nbytes) :], n)
            nb = index_nbytes(self.cps, checksum)
            raw, start, limit = data[max(0, n - nb) :], 0, max(0, n - nb)
        offsets, sizes = entry_lists(raw, self.cps, checksum=checksum, key=key, payload_limit=limit, payload_start=start)
        return offsets, sizes, nb

    # ------------------------------------------------------------------ chunk reads
    def read_chunks(self, coords: Sequence[Coords] | np.ndarray) -> list[memoryview | None]:
        """Raw payloads of many chunks, addressed by grid coordinates (``None``: absent).

        The fast path for array reads: no key strings are parsed. Indices come in one inner
        call (through the cache), the chunk ranges in one more, coalesced per shard, read
        with the versions of those indices; payloads are zero-copy views. Everything is done
        for all shards at once (one entry table, one sort), without per-shard numpy."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        layout = self.layout
        out: list[memoryview | None] = [None] * len(coords)
        if not len(coords):
            return out
        grid = np.asarray(coords, dtype=np.int64).reshape(len(coords), layout.ndim)
        if layout.ndim:
            cps_arr = np.array(self.cps, dtype=np.int64)
            shard_ids, inverse = _unique_rows(grid // cps_arr)
            flat_local = np.ravel_multi_index(tuple((grid % cps_arr).T), self.cps)
        else:
            shard_ids = np.zeros((1, 0), np.int64)
            inverse = flat_local = np.zeros(len(grid), np.int64)
        keys = [layout.shard_key(tuple(sh)) for sh in shard_ids.tolist()]
        n = self.n_entries

        def lookup(vis: list[VersionedIndex], present: list[int]) -> np.ndarray:
            """The entries of the requested chunks in the shards that exist (an absent one
            costs nothing: no table is made for an index that no object backs)."""
            import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
            if len(present) == len(keys):
                at, have = inverse, None
            else:
                row = np.full(len(keys), -1, dtype=np.int64)
                row[present] = np.arange(len(present))
                at = row[inverse]
                have = np.flatnonzero(at >= 0)
            if len(present) == 1:
                table = vis[present[0]].index.entries.reshape(1, n, 2)  # type: ignore[union-attr]
            else:
                table = np.stack([vis[j].index.entries.reshape(n, 2) for j in present])  # type: ignore[union-attr]
            if have is None:
                return table[at if len(present) > 1 else 0, flat_local]
            entries = np.full((len(grid), 2), MAX_UINT64, dtype=np.uint64)
            entries[have] = table[at[have], flat_local[have]]
            return entries

        def attempt(first: bool) -> list[memoryview | None]:
            import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
            hits: set[str] = set()
            found = self.read_indices(keys, use_cache=first, hits=hits)
            while True:
                vis = [found[k] for k in keys]
                present = [j for j, vi in enumerate(vis) if vi.index is not None]
                if not present:
                    return out
                entries = lookup(vis, present)
                is_live = entries[:, 0] != MAX_UINT64
                stale = [] if not hits or is_live.all() else [
                    k for k in (keys[j] for j in np.unique(inverse[~is_live]).tolist()) if k in hits
                ]
                if not stale:
                    break
                hits.clear()  # "absent" answered from the cache: ask those shards themselves
                self._refresh(found, stale)
            live = np.flatnonzero(is_live)
            if not live.size:
                return out
            views = self._fetch_spans(keys, vis, inverse[live], entries[live, 0], entries[live, 1])
            for m, v in zip(live.tolist(), views):
                out[m] = v
            return out

        return self._consistently(keys, attempt)

    def _consistently(self, keys: Sequence[str], attempt: Callable[[bool], T]) -> T:
        """``attempt(first)`` until no shard of ``keys`` changed during it (a change raises
        :class:`_Changed`). The first attempt may use the index cache and takes no lock; every
        later one reads the indices again while holding the in-process locks of the shards, so
        a writer of this process (which rewrites under the same lock) cannot interfere and the
        read succeeds at once. A writer of another process can: the read is repeated, with
        pauses doubling from :data:`RETRY_FIRST_PAUSE` to :data:`RETRY_MAX_PAUSE`, for at most
        :attr:`read_retry_seconds`, then :class:`ObjectChangedError` names the shard. Bytes that
        contradict an index that read again the same are damage (:class:`ShardCorruptError`)
        at the first locked attempt, never retried."""
        try:
            return attempt(True)
        except _Changed:
            pass
        start = time.monotonic()
        pause = RETRY_FIRST_PAUSE
        while True:
            self.cache.drop(keys)
            with self.locks.hold_local(keys):
                try:
                    return attempt(False)
                except _Changed as e:
                    changed = e
            if changed.damage is not None:
                raise changed.damage from None
            waited = time.monotonic() - start
            if waited + pause > self.read_retry_seconds:
                raise _changed_twice(changed, self.read_retry_seconds) from None
            time.sleep(pause)
            pause = min(2 * pause, RETRY_MAX_PAUSE)

    def read_ranges(self, reads: Sequence[ChunkRange]) -> list[bytes | None]:
        """Chunks (or byte ranges of chunks) by shard key and local coordinates; ``None``:
        absent. Indices in one inner call, ranges in one more (coalesced, version-checked)."""
        if not reads:
            return []
        keys = list(dict.fromkeys(r.shard_key for r in reads))

        def attempt(first: bool) -> list[bytes | None]:
            hits: set[str] = set()
            indices = self.read_indices(keys, use_cache=first, hits=hits)
            if hits:  # "absent" answered from the cache: ask the shards themselves
                stale = [r.shard_key for r in reads if r.shard_key in hits and indices[r.shard_key].index.get(r.local) is None]  # type: ignore[union-attr]
                if stale:
                    self._refresh(indices, list(dict.fromkeys(stale)))
            spans: list[tuple[int, int] | None] = []
            for r in reads:
                vi = indices[r.shard_key]
                entry = None if vi.index is None else vi.index.get(r.local)
                if entry is None:
                    spans.append(None)
                    continue
                off, nb = entry
                start = r.start if r.start >= 0 else max(0, nb + r.start)
                start = min(start, nb)
                stop = nb if r.length is None else min(nb, start + r.length)
                spans.append((off + start, max(0, stop - start)))
            todo = [(i, s) for i, s in enumerate(spans) if s is not None]
            if not todo:
                return [None] * len(reads)
            pos = {k: i for i, k in enumerate(keys)}
            seg = [pos[reads[i].shard_key] for i, _ in todo]
            offsets = [s[0] for _, s in todo]
            nbytes = [s[1] for _, s in todo]
            views = self._fetch_spans(keys, [indices[k] for k in keys], seg, offsets, nbytes)
            out: list[bytes | None] = [None] * len(reads)
            for (i, _), v in zip(todo, views):
                out[i] = bytes(v)
            return out

        return self._consistently(keys, attempt)

    def contains(self, read: ChunkRange) -> bool:
        """Whether the shard's index holds the chunk (one index read, or none when cached and
        holding it: a cached "absent" is read again, as in :meth:`read_ranges`)."""
        vi = self.read_index(read.shard_key)
        if vi.index is not None and vi.index.get(read.local) is None and self.cache:
            vi = self.read_index(read.shard_key, use_cache=False)
        return vi.index is not None and vi.index.get(read.local) is not None

    def _fetch_spans(
        self,
        keys: Sequence[str],
        indices: Sequence[VersionedIndex],
        seg: np.ndarray | list[int],
        offsets: np.ndarray | list[int],
        nbytes: np.ndarray | list[int],
    ) -> list[memoryview]:
        """One inner call for the ranges ``(keys[seg[i]], offsets[i], nbytes[i])``, each shard's
        with the version of its index; adjacent ranges of a shard coalesce (one sort for all).

        Returns a zero-copy view of each range, in the order given. Where the object's size
        was unknown when its index was validated, the last span of that shard is extended by
        the index's length: an entry reaching into the index (or past the end) then comes back
        short and is refused as :class:`ShardCorruptError`, never served — at no extra request.
        """
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        if not len(seg):
            return []
        if len(seg) <= _FEW:  # a few ranges: plain Python beats a dozen numpy calls
            seg = seg if isinstance(seg, list) else seg.tolist()
            off_list = offsets if isinstance(offsets, list) else offsets.tolist()
            nb_list = nbytes if isinstance(nbytes, list) else nbytes.tolist()
            groups, seg_list, lo_list, hi_list = _few_spans(seg, off_list, nb_list, self.coalesce_gap)
        else:
            seg = np.asarray(seg, dtype=np.int64)
            offsets = np.asarray(offsets, dtype=np.uint64)
            nbytes = np.asarray(nbytes, dtype=np.uint64)
            group, span_seg, lo, hi = coalesced_spans(offsets, offsets + nbytes, self.coalesce_gap, seg)
            seg_list, lo_list, hi_list = span_seg.tolist(), lo.tolist(), hi.tolist()
            groups, off_list, nb_list = group.tolist(), offsets.tolist(), nbytes.tolist()
        extend = [0] * len(seg_list)
        unsized = {s for s in set(seg_list) if indices[s].size is None}
        if unsized:
            last: dict[int, int] = {}
            for j, s in enumerate(seg_list):
                if s in unsized:
                    last[s] = j  # spans are sorted by shard then offset: the last one ends furthest
            for j in last.values():
                extend[j] = self._extend
        requests = [(keys[s], a, b + x) for s, a, b, x in zip(seg_list, lo_list, hi_list, extend)]
        versions = [indices[s].version for s in seg_list]
        try:
            if any(v is not None for v in versions):
                blobs = self.inner.get_ranges(requests, versions=versions)
            else:
                blobs = self.inner.get_ranges(requests)
        except ObjectChangedError as e:
            raise _Changed(e.key or requests[0][0], "its version changed") from None
        views: list[memoryview] = []
        damage: list[ShardCorruptError] = []
        for s, a, b, x, blob in zip(seg_list, lo_list, hi_list, extend, blobs):
            try:
                views.append(self._checked(keys[s], a, b, x, blob, indices[s]))
            except ShardCorruptError as error:
                if indices[s].version is not None:
                    raise  # these are the bytes of the index's version: the index is wrong
                damage.append(error)  # or the object changed: the index read again tells
                views.append(memoryview(b""))
        unversioned = [s for s in dict.fromkeys(seg_list) if indices[s].version is None]
        if unversioned:
            self._reread(keys, indices, unversioned)
        if damage:
            raise _Changed(damage[0].key or keys[0], "its bytes contradicted its index", damage[0])
        return [views[g][o - lo_list[g] : o - lo_list[g] + nb] for g, o, nb in zip(groups, off_list, nb_list)]

    def _reread(self, keys: Sequence[str], indices: Sequence[VersionedIndex], segs: Sequence[int]) -> None:
        """A store that gives no versions: the index read again (one call for all these shards)
        must be the one the ranges were read with, else the object changed in between."""
        if self.layout.index_location == "start":
            heads = self.inner.get_ranges([(keys[s], 0, self.index_nbytes) for s in segs])
            tails: list[Any] = [None if h is None else (h,) for h in heads]
        else:
            tails = self.inner.get_tails([(keys[s], self._tail_nbytes) for s in segs])
        for s, t in zip(segs, tails):
            if t is None or bytes(t[0]) != indices[s].raw:
                raise _Changed(keys[s], "its index changed")

    def _checked(self, key: str, lo: int, hi: int, extra: int, blob: bytes | None, vi: VersionedIndex) -> memoryview:
        """The bytes ``[lo, hi)`` of a range read that asked for ``extra`` more."""
        if blob is None:
            raise _Changed(key, "it disappeared")
        got = len(blob)
        error = None
        if got < hi - lo:
            if vi.size is not None:  # the size was checked at the index read: the object changed
                raise _Changed(key, f"it is shorter than {hi} bytes now")
            error = ShardCorruptError(
                f"{key}: shard index points to bytes [{lo}, {hi}) but the object ends at {lo + got}", key=key
            )
        elif got < hi - lo + extra:
            error = ShardCorruptError(
                f"{key}: shard index points to bytes up to {hi}, inside the {extra}-byte shard index at the "
                f"end of the object (which ends at {lo + got})",
                key=key,
            )
        if error is not None:
            raise error
        view = memoryview(blob)
        return view if not extra else view[: hi - lo]

    # ------------------------------------------------------------------ whole objects
    def read_whole_shards(self, shards: Sequence[Coords], *, lists: bool = True) -> Iterator[WholeShard | None]:
        """Whole shard objects (``None``: absent), in order, for reads of *every* chunk of them.

        One request per shard and no separate index request: the index is the object's own
        tail, so index and payloads are one consistent snapshot even if a writer replaces the
        shard meanwhile. Indices are validated against the object's size and cached (with the
        read's version, when the store gives one).

        A local directory, and one shard of any store (a remote store's shards are each read
        by a task of their own, see ``DraftArray._read_sharded``), is read shard by shard into
        a per-thread buffer reused for the next shard
        (:meth:`~sharding_store.stores.Inner.read_into`: no fresh pages per object, and the
        object's version with it): an item is valid only until the next one is taken (and on
        the thread that took it). Other stores get several objects in one inner call.

        ``lists=False``: a draft index is only checked, natively where it can be
        (``_loops.c``'s ``ss_check_index``, the rules of
        :func:`~sharding_store.formats.shard_index.entry_lists`; anything it refuses goes through
        ``entry_lists``, which raises naming the key), and the items carry no lists: for a
        caller that reads the entries from the tail itself (the native whole-shard scatter).
        """
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)

        from ..codec import _native  # noqa: PLC0415 - ctypes and the bindings only where used (start-up)

        keys = [self.layout.shard_key(s) for s in shards]
        if not keys:
            return
        inner = self.inner
        loops = _native.loops() if not lists and self._plain else None
        check = loops.check_index if loops is not None else None
        blobs: Iterable[Any]
        if len(keys) == 1 or inner.local_path(keys[0]) is not None:
            blobs = (inner.read_into(k, _read_buffer) for k in keys)
        else:
            blobs = inner.get_ranges([(k, 0, None) for k in keys])
        for key, got in zip(keys, blobs):
            if got is None:
                yield None  # not cached: "absent" has no version a later read could check
                continue
            data, version = _data_and_version(got)
            arr = np.frombuffer(data, dtype=np.uint8)
            address = _native.data_address(arr) if len(arr) else 0
            if check is not None and self._checked_tail(key, arr, address, version, check):
                yield WholeShard(arr, address, None, None, key)
                continue
            offsets, sizes = self._whole_index(key, arr, version)
            yield WholeShard(arr, address, offsets, sizes, key)

    def _checked_tail(self, key: str, data: np.ndarray, address: int, version: Hashable | None, check: Any) -> bool:
        """Whether the draft index in ``data``'s tail passes ``ss_check_index`` (then cached
        as :meth:`_whole_index` caches it); False: the caller parses it with ``entry_lists``."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        limit = len(data) - self.index_nbytes
        if limit < 0 or check(address, len(data), self.n_entries):
            return False
        if self.cache and version is not None:
            table = data[limit:].view("<u8").astype(np.uint64)
            self.cache.put(key, VersionedIndex(ShardIndex(table.reshape(*self.cps, 2)), version, len(data)))
        return True

    def whole_lists(self, shard: WholeShard) -> tuple[list[int], list[int]]:
        """``(offsets, sizes)`` of a shard read whole (parsed again from its tail when it was
        read with ``lists=False``); raises :class:`ShardCorruptError` for a bad index."""
        if shard.offsets is not None and shard.sizes is not None:
            return shard.offsets, shard.sizes
        return self._whole_index(shard.key, shard.data, None)

    def _whole_index(self, key: str, data: np.ndarray, version: Hashable | None) -> tuple[list[int], list[int]]:
        """The index of a whole shard object as ``(offsets, sizes)`` lists, validated against
        the object's size; cached when the read's version is known (an entry without one
        could not be checked by later range reads)."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        if self._plain:
            n = self.index_nbytes
            limit = len(data) - n
            offsets, sizes = entry_lists(data[max(0, limit) :], self.cps, key=key, payload_limit=max(0, limit))
        else:
            offsets, sizes, _ = self._object_index(key, data)
        if self.cache and version is not None:
            table = np.array([offsets, sizes], dtype=np.uint64).T
            self.cache.put(key, VersionedIndex(ShardIndex(table.reshape(*self.cps, 2)), version, len(data)))
        return offsets, sizes

    def read_shard(self, key: str, size: int | None = None) -> ShardContents | None:
        """One whole shard object (``size``: as listed, to spare a HEAD), validated;
        None when it is missing. For copying shards as they are (migrate, verify, the view)."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        if size is None:
            blob = self.inner.get(key)
        else:  # one byte more: an object that grew since it was listed is read whole again
            blob = self.inner.get_ranges([(key, 0, size + 1)])[0]
            if blob is not None and len(blob) > size:
                blob = self.inner.get(key)
        if blob is None:
            return None
        n_index = self.index_nbytes
        if self._plain:
            index = read_index(blob, self.cps, key=key)
        else:
            offsets, sizes, n_index = self._object_index(key, blob)
            table = np.array([offsets, sizes], dtype=np.uint64).T
            index = ShardIndex(table.reshape(*self.cps, 2))
        view = memoryview(blob)
        chunks = {c: view[o : o + nb] for c, o, nb in index.live()}
        dead = len(blob) - n_index - index.live_nbytes()
        return ShardContents(chunks, blob, max(0, dead), index)

    # ------------------------------------------------------------------ rewrites
    def rewrite_shard(self, shard: Coords, changes: Mapping[Coords, bytes | memoryview | None], *, key: str | None = None) -> None:
        """Set (``bytes``) or erase (``None``) chunks of one shard (local coords), rewriting it
        once under its lock: a shard whose every chunk is given is built without reading it;
        otherwise its index and surviving chunks are read (consistently) first. The result is
        compact; a shard left without chunks is deleted."""
        if not self._plain:
            raise UsageError(f"'/{self.layout.path}': shards of this index layout are read-only here", key=self.layout.path)
        skey = key or self.layout.shard_key(shard)
        sets = {c: v for c, v in changes.items() if v is not None}
        erases = [c for c, v in changes.items() if v is None]
        with self.locks.hold(skey):
            if self.layout.shard_is_full(shard, changes):
                chunks: dict[Coords, bytes | memoryview] = dict(sets)  # every chunk given: no need to look
            else:
                old = self._survivors(skey, changes, erases, bool(sets))
                if old is None:
                    return  # erasing chunks that are not there: nothing to rewrite
                chunks = old
                chunks.update(sets)
            self.cache.drop([skey])  # until the new object is in place, no reader may trust the old index
            if chunks:
                blob, _ = encode_shard_and_index(chunks, self.cps)
                self.inner.set(skey, blob)
            else:
                self.inner.delete(skey)
            # the written index is not cached: without the new object's version, a later read
            # could not tell it from a version another writer put there meanwhile

    def _survivors(
        self, skey: str, changes: Mapping[Coords, Any], erases: Sequence[Coords], any_sets: bool
    ) -> dict[Coords, bytes | memoryview] | None:
        """The chunks of the current shard that ``changes`` keeps (None: nothing to do)."""
        for attempt in (0, 1):
            vi = self.read_index(skey, use_cache=False)
            index = vi.index
            if not any_sets and (index is None or not any(index.get(c) for c in erases)):
                return None
            survivors = [] if index is None else [(c, o, n) for c, o, n in index.live() if c not in changes]
            if not survivors:
                return {}
            offsets = [o for _, o, _ in survivors]
            nbytes = [n for _, _, n in survivors]
            try:
                views = self._fetch_spans([skey], [vi], [0] * len(survivors), offsets, nbytes)
            except _Changed as e:
                if attempt:
                    raise _changed_twice(e) from None
                continue
            return {c: v for (c, _, _), v in zip(survivors, views)}
        raise AssertionError("unreachable")  # pragma: no cover

    def rewrite_shards(self, jobs: Mapping[str, tuple[Coords, Mapping[Coords, bytes | memoryview | None]]]) -> None:
        """:meth:`rewrite_shard` for several shards (``shard key -> (shard, changes)``), on up to
        ``max_workers`` threads (a pool of this call's own: nothing outlives it)."""
        items = list(jobs.items())
        if len(items) <= 1 or self.max_workers == 1:
            for skey, (shard, changes) in items:
                self.rewrite_shard(shard, changes, key=skey)
            return
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - a pool's machinery only where used (start-up)

        with ThreadPoolExecutor(min(self.max_workers, len(items))) as pool:
            for f in [pool.submit(self.rewrite_shard, shard, changes, key=skey) for skey, (shard, changes) in items]:
                f.result()


# --------------------------------------------------------------------------- other layouts


def read_objects(inner: Inner, layout: ArrayLayout, sources: Sequence[tuple[Coords, str]]) -> tuple[dict[Coords, memoryview], int]:
    """Every chunk of whole source objects (``(object coords, key)``) by *global* chunk
    coordinates, and the bytes read: one request for all, each object one snapshot.
    ``layout`` may be unsharded (an object is one chunk). A listed object that is gone
    raises :class:`ObjectChangedError` naming it."""
    blobs = inner.get_ranges([(key, 0, None) for _, key in sources]) if sources else []
    chunks: dict[Coords, memoryview] = {}
    nread = 0
    cps = layout.chunks_per_shard
    for (coords, key), blob in zip(sources, blobs):
        if blob is None:
            raise ObjectChangedError(f"{key}: listed, but gone before it was read (is another process writing?)", key=key)
        nread += len(blob)
        view = memoryview(blob)
        if cps is None:
            chunks[coords] = view
            continue
        for local, off, nb in read_index(blob, cps, key=key).live():
            chunks[local_to_global(coords, local, cps)] = view[off : off + nb]
    return chunks, nread


def gather(
    inner: Inner,
    layout: ArrayLayout,
    target_shard: Coords,
    target_cps: Coords,
    *,
    sources: Iterable[str] | None = None,
    coalesce_gap: int = 1 << 16,
) -> dict[Coords, memoryview]:
    """Raw payloads of the chunks of one shard of *another* layout (``target_cps`` chunks per
    shard), by local coordinates in that shard, read from ``layout``'s objects.

    A sharded source costs one index read per source shard and coalesced, version-checked
    ranges; an unsharded one a batch of whole gets. ``sources`` (the keys of the existing
    source objects, if known) avoids asking for absent ones."""
    coords = list(shard_chunks(target_shard, target_cps))
    if layout.chunks_per_shard is not None:
        engine = ShardEngine(inner, layout, coalesce_gap=coalesce_gap)
        views = engine.read_chunks(coords)
        return {chunk_to_shard(c, target_cps)[1]: v for c, v in zip(coords, views) if v is not None}
    keys = {layout.chunk_key(c): c for c in coords}
    known = None if sources is None else set(sources)
    wanted = [k for k in keys if known is None or k in known]
    values = inner.get_ranges([(k, 0, None) for k in wanted]) if wanted else []
    return {chunk_to_shard(keys[k], target_cps)[1]: memoryview(v) for k, v in zip(wanted, values) if v is not None}


def read_shard_index(
    inner: Inner, key: str, size: int, cps: Coords, *, checksum: bool = False, index_location: IndexLocation = "end"
) -> ShardIndex:
    """Parse (and checksum) the index of a shard of known ``size`` — draft or final v3 (index
    at the start, CRC32C) — reading only the index. An object too small for its index is
    refused before anything is read."""
    n = index_nbytes(cps, checksum)
    if size < n:
        raise ShardCorruptError(f"{key}: object is {size} bytes, shorter than its {n}-byte shard index", key=key)
    lo = 0 if index_location == "start" else size - n
    raw = inner.get_ranges([(key, lo, lo + n)])[0] or b""
    start, limit = payload_bounds(size, cps, checksum=checksum, index_location=index_location)
    return ShardIndex.from_bytes(raw, cps, checksum=checksum, key=key, payload_limit=limit, payload_start=start)


# --------------------------------------------------------------------------- helpers


def _data_and_version(got: Any) -> tuple[Any, Hashable | None]:
    """A whole-object read's bytes and version: ``read_into`` may give a :class:`Tail`."""
    if isinstance(got, tuple):
        return got[0], (got[2] if len(got) > 2 else None)
    return got, None


#: up to this many ranges are coalesced in plain Python (:func:`_few_spans`)
_FEW = 16


def _few_spans(seg: list[int], offsets: list[int], nbytes: list[int], gap: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """:func:`coalesced_spans` for a few ranges, as lists (the same spans, the same order)."""
    order = sorted(range(len(seg)), key=lambda i: (seg[i], offsets[i]))
    groups = [0] * len(seg)
    span_seg: list[int] = []
    lo: list[int] = []
    hi: list[int] = []
    for i in order:
        s, a, b = seg[i], offsets[i], offsets[i] + nbytes[i]
        if span_seg and span_seg[-1] == s and a <= hi[-1] + gap:
            hi[-1] = max(hi[-1], b)
        else:
            span_seg.append(s)
            lo.append(a)
            hi.append(b)
        groups[i] = len(lo) - 1
    return groups, span_seg, lo, hi


def coalesced_spans(
    offsets: np.ndarray, ends: np.ndarray, gap: int, seg: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge byte ranges of one object (``seg``: of several, by object number) closer than ``gap``.

    Returns ``(span of each range, object of each span, span starts, span ends)``, spans
    sorted by object then offset. Ranges may overlap or nest (an index may share bytes).
    """
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    lo = rows.min(axis=0)
    dims = rows.max(axis=0) - lo + 1
    if math.prod(int(d) for d in dims) >= 2**62:
        ids, inverse = np.unique(rows, axis=0, return_inverse=True)
        return ids, inverse.ravel()
    lin = np.ravel_multi_index(tuple((rows - lo).T), tuple(int(d) for d in dims))
    uniq, inverse = np.unique(lin, return_inverse=True)
    ids = np.stack(np.unravel_index(uniq, tuple(int(d) for d in dims)), axis=1) + lo
    return ids.reshape(len(uniq), rows.shape[1]), inverse.ravel()
