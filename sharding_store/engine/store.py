"""``ShardingStore``: the 2022 draft sharding storage transformer as a store wrapper.

A ``MutableMapping[str, bytes]`` whose keys are the *chunk* keys a draft-era reader
expects (``data/root/a/c3/7``) while the store below holds *shards*
(``data/root/a/c1/3`` with ``chunks_per_shard=[2, 2]``). Everything that is not a
chunk key of a sharded array passes through untouched.

This module is the facade: key routing (which array a key belongs to, found from the
draft metadata), the ``MutableMapping`` API and listings. How shards are read and
rewritten — index reads and cache, consistent reads, coalescing, read-modify-write,
per-shard locks — is the shard engine's (:mod:`sharding_store.engine.shard_engine`), one engine per
array, sharing this store's index cache and locks.

I/O discipline (asserted by tests that count the inner store's calls):

* one chunk read is one suffix read of the shard index plus one range read of the
  chunk (one, with a warm index cache);
* a batch of chunk reads of one array reads each shard's index once, all indices in one
  inner call, then all chunk ranges in one more, adjacent ranges coalesced;
* a batch of writes or erases rewrites each affected shard once; a shard whose
  chunks are all given is built without reading it; otherwise only the index and
  the surviving chunks are read. A shard left without chunks is deleted.

Written shards are compact (live chunks in C order, index at the end, no dead bytes).
Writes to one shard from several threads are serialised by a per-shard lock;
``lock=`` adds a caller-provided lock (e.g. a file lock for several processes).
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypedDict, Unpack

from ..errors import ChunkKeyError, DraftMetadataError, UsageError
from ..formats import draft_metadata as dm
from ..formats.keys import Coords, chunk_to_shard, local_to_global, parse_chunk_suffix, prefix_coords
from ..formats.shard_index import n_entries
from ..stores import Inner, RangeRequest, as_inner
from .shard_engine import ArrayLayout, ChunkRange, IndexCache, ShardEngine, ShardLocks, WholeShard, coalesced_spans

__all__ = ["ArrayLayout", "ShardingStore", "WholeShard", "coalesced_spans", "DATA_ROOT"]

DATA_ROOT = "data/root/"

#: chunk changes staged per shard: shard key -> (layout, shard coords, {local coords: bytes or None})
_Changes = dict[str, tuple[ArrayLayout, Coords, dict[Coords, "bytes | None"]]]


class SingleArrayKeywords(TypedDict, total=False):
    """:class:`ShardingStore`'s single-array mode spelled out (``layout`` is the other spelling)."""

    chunks_per_shard: int | Sequence[int] | None
    array_path: str
    separator: str


def _single_array_layout(given: Mapping[str, Any]) -> ArrayLayout | None:
    """The layout of ``ShardingStore(..., chunks_per_shard=, array_path=, separator=)``, or
    None (hierarchy mode) without ``chunks_per_shard``; an unknown keyword is refused as
    Python refuses one (:class:`TypeError`), naming it."""
    for name in given:
        if name not in SingleArrayKeywords.__annotations__:
            raise TypeError(f"ShardingStore() got an unexpected keyword argument {name!r}")
    chunks_per_shard = given.get("chunks_per_shard")
    if chunks_per_shard is None:
        return None
    separator = given.get("separator", "/")
    if separator not in ("/", "."):
        raise UsageError(f"separator {separator!r}: must be '/' or '.'")
    cps = (chunks_per_shard,) if isinstance(chunks_per_shard, int) else tuple(chunks_per_shard)
    path = dm.normalize_path(given.get("array_path", ""))
    n_entries(cps)  # validates the entries (without allocating an index)
    return ArrayLayout(path, dm.data_prefix(path), len(cps), separator, cps)


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
        Each entry carries the version of the object it was read from: a chunk read
        through it fails over to a fresh index read when another writer replaced the shard.
    coalesce_gap:
        Merge chunk ranges of one shard separated by at most this many bytes.
    lock:
        ``lock(shard_key)`` returning a context manager held around each shard rewrite,
        e.g. :func:`sharding_store.stores.locks.file_lock` for several processes.
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
        storage_options: Mapping[str, Any] | None = None,
        index_cache_size: int = 0,
        coalesce_gap: int = 0,
        lock: Callable[[str], AbstractContextManager[Any]] | None = None,
        max_workers: int = 8,
        layout: ArrayLayout | None = None,
        **single_array: Unpack[SingleArrayKeywords],
    ) -> None:
        single = _single_array_layout(single_array)  # before the store is opened: nothing done on a bad keyword
        self.inner: Inner = as_inner(inner, storage_options=storage_options)
        self.index_cache_size = index_cache_size
        self.coalesce_gap = coalesce_gap
        self.max_workers = max(1, max_workers)
        self._cache = IndexCache(index_cache_size)
        self._locks = ShardLocks(lock)
        self._layouts: dict[str, ArrayLayout | None] = {}
        self._engines: dict[ArrayLayout, ShardEngine] = {}
        self._suffix: str | None = None
        self._fixed: ArrayLayout | None = single if layout is None else layout
        if layout is not None and not layout.sharded:
            raise UsageError("layout=: the array must be sharded (chunks_per_shard is None)")

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

    def engine(self, layout: ArrayLayout) -> ShardEngine:
        """The shard engine of one sharded array of this store (sharing its index cache and locks)."""
        engine = self._engines.get(layout)
        if engine is None:
            engine = self._engines[layout] = ShardEngine(
                self.inner, layout, cache=self._cache, coalesce_gap=self.coalesce_gap,
                locks=self._locks, max_workers=self.max_workers,
            )
        return engine

    def invalidate(self) -> None:
        """Forget cached metadata and indices (after another writer changed the store)."""
        self._layouts.clear()
        self._engines.clear()
        self._suffix = None
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

    @staticmethod
    def _zero_d_key(key: str, layout: ArrayLayout) -> str | None:
        # a 0-d array's shard key is its chunk key, whichever spelling ("c0" or "c") is used
        return key[len(layout.prefix) :] if layout.ndim == 0 else None

    def _chunk_range(self, key: str, located: tuple[ArrayLayout, Coords], start: int = 0, length: int | None = None) -> ChunkRange:
        layout, coords = located
        shard, local = chunk_to_shard(coords, layout.chunks_per_shard)  # type: ignore[arg-type]
        return ChunkRange(layout.shard_key(shard, self._zero_d_key(key, layout)), local, start, length)

    def _read(self, reads: Sequence[tuple[ArrayLayout, ChunkRange]]) -> list[bytes | None]:
        """Chunk reads, through each array's engine (per array: one index call, one range call)."""
        by_layout: dict[ArrayLayout, list[int]] = defaultdict(list)
        for i, (layout, _) in enumerate(reads):
            by_layout[layout].append(i)
        out: list[bytes | None] = [None] * len(reads)
        for layout, positions in by_layout.items():
            values = self.engine(layout).read_ranges([reads[i][1] for i in positions])
            for i, v in zip(positions, values):
                out[i] = v
        return out

    # ------------------------------------------------------- MutableMapping API
    def __getitem__(self, key: str) -> bytes:
        located = self._locate(key)
        if located is None:
            value = self.inner.get(key)
        else:
            value = self._read([(located[0], self._chunk_range(key, located))])[0]
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        located = self._locate(key)
        if located is None:
            return self.inner.exists(key)
        return self.engine(located[0]).contains(self._chunk_range(key, located))

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

        The chunk reads of one array share one index request and one coalesced range request.
        """
        key_ranges = list(key_ranges)
        out: list[bytes | None] = [None] * len(key_ranges)
        chunk_reads: list[tuple[int, tuple[ArrayLayout, ChunkRange]]] = []
        plain: list[tuple[int, RangeRequest, int | None]] = []
        for i, (key, (start, length)) in enumerate(key_ranges):
            located = self._locate(key)
            if located is not None:
                chunk_reads.append((i, (located[0], self._chunk_range(key, located, start, length))))
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
    def update(self, other: Any = (), /, **kwargs: bytes) -> None:
        """Write many keys; each affected shard is rewritten exactly once."""
        items = dict(other.items() if isinstance(other, Mapping) else other)
        items.update(kwargs)
        changes: _Changes = {}
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

    def _stage(self, changes: _Changes, key: str, located: tuple[ArrayLayout, Coords], value: bytes | None) -> None:
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
            # a layout may have changed: indices cached under the old one would be misread
            self.invalidate()

    def _apply(self, changes: _Changes) -> None:
        """Rewrite each shard once (``bytes`` sets a chunk, ``None`` erases it), per array
        through its engine (several shards on up to ``max_workers`` threads)."""
        by_layout: dict[ArrayLayout, dict[str, tuple[Coords, dict[Coords, bytes | None]]]] = defaultdict(dict)
        for skey, (layout, shard, local_changes) in changes.items():
            by_layout[layout][skey] = (shard, local_changes)
        for layout, jobs in by_layout.items():
            self.engine(layout).rewrite_shards(jobs)

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
        changes: _Changes = {}
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
            self._cache.clear()
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
            by_layout: dict[ArrayLayout, list[str]] = defaultdict(list)
            for skey, lay, _ in pending:
                by_layout[lay].append(skey)
            indices = {}
            for lay, skeys in by_layout.items():
                indices.update(self.engine(lay).read_indices(skeys))
            for skey, lay, shard in pending:
                index = indices[skey].index
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

    def list_dir(self, prefix: str) -> tuple[builtins.list[str], builtins.list[str]]:  # ``list``: the method above
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


def _as_bytes(key: str, value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "tobytes"):
        return value.tobytes()
    raise UsageError(f"{key}: value must be bytes-like, not {type(value).__name__}")
