"""Per-array storage statistics: what ``info`` prints and the migrator's dry run plans with.

For each array: how many objects hold its data (shards, or chunks when unsharded), how
many inner chunks are live, the bytes stored, the *dead bytes* zarr-python 2.x leaves in
a shard when it deletes a chunk (object size minus live payloads minus the index),
stray keys under its data prefix, its codec chain and whether every v3 reader could
decode those codecs. Data keys are listed once; shard indices are read in batches with
one tail request each, and the object size comes with the tail where the backend knows
it (local files, mappings) or from ``size()`` otherwise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import draft_metadata as dm
from .chunk_codec import decode_chunk_payload
from .errors import DraftMetadataError, ShardCorruptError, ShardingStoreError
from .hierarchy import DraftHierarchy, open_hierarchy
from .inner import Inner
from .keys import Coords, parse_chunk_suffix
from .shard_index import MAX_INDEX_ENTRIES, MAX_UINT64, ShardIndex, index_nbytes

__all__ = [
    "ArrayStats",
    "PROBLEM_HOOKS",
    "array_stats",
    "codec_chain",
    "codec_chain_text",
    "covered_bytes",
    "data_keys",
    "hierarchy_stats",
    "LostTransformer",
    "detect_lost_transformer",
    "first_shard_damage",
]

BATCH = 512
#: bytes read from the end of a sampled chunk object to look for a draft shard index
LOST_TRANSFORMER_TAIL = 1 << 16
#: payloads decoded to confirm a suspected shard index (each must decode to a full chunk)
LOST_TRANSFORMER_PROBES = 4
ObjectSizes = Sequence[tuple[str, int | None]]


@dataclass(frozen=True)
class ArrayStats:
    """Storage statistics of one array (``None``: unknown, e.g. sizes a backend does not report)."""

    meta: dm.DraftArrayMeta
    n_objects: int  # shard objects, or chunk objects when unsharded
    n_chunks: int  # live inner chunks
    bytes_stored: int | None
    dead_bytes: int | None
    stray_keys: tuple[str, ...] = ()
    portable: bool | None = None  # None: portability check unavailable
    portability_problems: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # damaged shards, suspected legacy defects
    damage: ShardingStoreError | None = None  # the first problem as an error (``info --strict`` raises it)

    @property
    def path(self) -> str:
        return self.meta.path

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable summary (the ``info --json`` entry of this array)."""
        m = self.meta
        return {
            "path": m.path,
            "shape": list(m.shape),
            "dtype": m.dtype.str,
            "chunks": list(m.chunks),
            "chunks_per_shard": None if m.chunks_per_shard is None else list(m.chunks_per_shard),
            "shard_shape": list(m.shard_shape) if m.is_sharded else None,
            "order": m.order,
            "separator": m.separator,
            "fill_value": m.raw.get("fill_value"),  # as stored (JSON already)
            "codecs": codec_chain(m),
            "n_shards" if m.is_sharded else "n_objects": self.n_objects,
            "n_chunks": self.n_chunks,
            "bytes_stored": self.bytes_stored,
            "dead_bytes": self.dead_bytes,
            "stray_keys": list(self.stray_keys),
            "portable": self.portable,
            "portability_problems": list(self.portability_problems),
            "problems": list(self.problems),
        }


# --------------------------------------------------------------------------- codecs


def codec_chain(meta: dm.DraftArrayMeta) -> list[dict[str, Any]]:
    """Filters then compressor, as numcodecs configurations with their role."""
    chain = [{"role": "filter", **f.get_config()} for f in meta.filters]
    if meta.compressor is not None:
        chain.append({"role": "compressor", **meta.compressor.get_config()})
    return chain


def codec_chain_text(meta: dm.DraftArrayMeta) -> str:
    """``delta(dtype='<i4') -> blosc(cname='lz4', ...)``; ``none`` without codecs."""
    parts = []
    for c in codec_chain(meta):
        args = ", ".join(f"{k}={v!r}" for k, v in c.items() if k not in ("id", "role"))
        parts.append(f"{c['id']}({args})")
    return " -> ".join(parts) or "none"


def _portability(meta: dm.DraftArrayMeta) -> tuple[bool | None, tuple[str, ...]]:
    try:
        from .v3_metadata import portability_problems
    except ImportError:  # pragma: no cover - v3_metadata is built by another engineer
        return None, ()
    problems = tuple(portability_problems(meta))
    return not problems, problems


# --------------------------------------------------------------------------- lost transformer


@dataclass(frozen=True)
class LostTransformer:
    """An unsharded-looking array whose objects are draft shards (the 2.x ``resize()`` defect).

    ``n_chunks``: entries of the shard index found at the end of ``key``; ``candidates``:
    the ``chunks_per_shard`` shapes with that many entries that fit the array's chunk grid
    (several when the index alone cannot tell, e.g. ``(2, 2)`` or ``(4, 1)``).
    """

    path: str
    key: str
    n_chunks: int
    candidates: tuple[Coords, ...]

    def message(self) -> str:
        shapes = " or ".join("(" + ", ".join(map(str, c)) + ")" for c in self.candidates[:6])
        name = self.path or "/"
        option = f"{self.path}=" + ",".join(map(str, self.candidates[0])) if self.candidates else f"{self.path}=N,..."
        return (
            f"array '{name}' looks sharded with chunks_per_shard {shapes} although its metadata has no "
            f"storage transformer ({self.key} ends in a {self.n_chunks}-entry shard index; it lost its storage "
            f"transformer to the zarr-python 2.x resize()/append() defect); rerun with --assume-chunks-per-shard {option}"
        )

    def error(self) -> DraftMetadataError:
        return DraftMetadataError(self.message(), key=dm.array_meta_key(self.path))


def _factorizations(n: int, ndim: int) -> Iterator[Coords]:
    """Every ``ndim``-tuple of positive ints whose product is ``n`` (C order)."""
    if ndim == 0:
        if n == 1:
            yield ()
        return
    if ndim == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _factorizations(n // d, ndim - 1):
                yield (d, *rest)


def _index_lengths(tail: bytes, size: int) -> list[int]:
    """Entry counts ``n`` for which the last ``16 n`` bytes of an object of ``size`` bytes
    (``tail`` = its last bytes) parse as a draft shard index with at least one live entry.

    Entries are read backwards from the end, where the last entry is the same for every
    ``n``; the first invalid entry (or a payload reaching into the index) ends the scan,
    so the cost is linear in the index found, not in the object.
    """
    found: list[int] = []
    max_end, live = 0, 0
    for k in range(min(len(tail), size) // 16):
        lo = len(tail) - 16 * (k + 1)
        offset = int.from_bytes(tail[lo : lo + 8], "little")
        nbytes = int.from_bytes(tail[lo + 8 : lo + 16], "little")
        limit = size - 16 * (k + 1)
        if offset == MAX_UINT64 and nbytes == MAX_UINT64:
            pass
        elif offset == MAX_UINT64 or nbytes == MAX_UINT64 or nbytes == 0 or offset + nbytes > limit:
            break
        else:
            live += 1
            max_end = max(max_end, offset + nbytes)
        if max_end > limit or k + 1 > MAX_INDEX_ENTRIES:
            break
        if live:
            found.append(k + 1)
    return found


def detect_lost_transformer(inner: Inner, meta: dm.DraftArrayMeta, keys: Sequence[str]) -> LostTransformer | None:
    """Is this unsharded array really sharded? One tail read of its first object (plus up to
    a few payload ranges when a shard index is found there).

    A chunk object of an unsharded array is one encoded chunk; a draft shard ends in an
    index whose live entries point inside the object at payloads that each decode to a
    full chunk. Decoding the whole object is no test (zlib ignores the trailing bytes), so
    the index is looked for first and its payloads are decoded to confirm it.
    """
    if meta.is_sharded or not keys or meta.ndim == 0:
        return None
    key = keys[0]
    got = inner.get_tails([(key, LOST_TRANSFORMER_TAIL)])[0]
    if got is None:
        return None
    tail, size = got
    size = len(tail) if size is None else size
    for n in reversed(_index_lengths(tail, size)):
        entries = [
            (int.from_bytes(tail[i : i + 8], "little"), int.from_bytes(tail[i + 8 : i + 16], "little"))
            for i in range(len(tail) - 16 * n, len(tail), 16)
        ]
        probes = [(o, b) for o, b in entries if o != MAX_UINT64][:LOST_TRANSFORMER_PROBES]
        payloads = inner.get_ranges([(key, o, o + b) for o, b in probes])
        try:
            for (o, _), payload in zip(probes, payloads):
                decode_chunk_payload(meta, payload or b"", key=f"{key} bytes at {o}")
        except ShardingStoreError:
            continue
        return LostTransformer(meta.path, key, n, _fitting_candidates(meta, keys, n))
    return None


def _fitting_candidates(meta: dm.DraftArrayMeta, keys: Sequence[str], n: int) -> tuple[Coords, ...]:
    """Shapes with ``n`` chunks that put every object (a shard key) inside the chunk grid;
    all shapes if none does (the array may have shrunk)."""
    grid = tuple(math.ceil(s / c) for s, c in zip(meta.shape, meta.chunks))
    prefix = dm.data_prefix(meta.path)
    coords = [c for k in keys if (c := parse_chunk_suffix(k[len(prefix) :], meta.separator, meta.ndim)) is not None]
    top = tuple(max(c[d] for c in coords) for d in range(meta.ndim)) if coords else (0,) * meta.ndim
    shapes = list(itertools.islice(_factorizations(n, meta.ndim), 10_000))
    fitting = [s for s in shapes if all(t * c < max(g, 1) for t, c, g in zip(top, s, grid))]
    return tuple(fitting or shapes)


def _lost_transformer_problem(inner: Inner, meta: dm.DraftArrayMeta, keys: Sequence[str]) -> ShardingStoreError | None:
    found = detect_lost_transformer(inner, meta, keys)
    return None if found is None else found.error()


#: checks run on every unsharded array's objects (keys sorted); each returns an error or None.
#: Other modules may append to this list.
PROBLEM_HOOKS: list[Callable[[Inner, dm.DraftArrayMeta, Sequence[str]], ShardingStoreError | None]] = [
    _lost_transformer_problem
]


# --------------------------------------------------------------------------- scanning


def _batches(items: Sequence[Any], n: int = BATCH) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _size(inner: Inner, key: str, known: int | None) -> int | None:
    if known is not None:
        return known
    size = getattr(inner, "size", None)
    return size(key) if callable(size) else None


def covered_bytes(index: ShardIndex) -> int:
    """Bytes covered by live payloads, shared bytes counted once (overlaps are legal)."""
    total, end = 0, -1
    for lo, hi in sorted((o, o + n) for _, o, n in index.live()):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def data_keys(
    inner: Inner, meta: dm.DraftArrayMeta, exclude_prefixes: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """``(object keys, stray keys)`` under the array's data prefix."""
    prefix = dm.data_prefix(meta.path)
    excluded = tuple(exclude_prefixes)
    objects, stray = [], []
    for key in inner.list_prefix(prefix):
        if excluded and key.startswith(excluded):
            continue
        ok = parse_chunk_suffix(key[len(prefix) :], meta.separator, meta.ndim) is not None
        (objects if ok else stray).append(key)
    return objects, stray


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _sharded_stats(
    inner: Inner, meta: dm.DraftArrayMeta, keys: list[str]
) -> tuple[int, int | None, int | None, list[ShardCorruptError]]:
    """``(live chunks, bytes stored, dead bytes, problems)`` from the shards' indices."""
    cps = meta.chunks_per_shard
    assert cps is not None
    n_index = index_nbytes(cps)
    n_chunks = 0
    sizes: list[int | None] = []
    dead: list[int | None] = []
    problems: list[ShardCorruptError] = []
    for batch in _batches(keys):
        for key, tail in zip(batch, inner.get_tails([(k, n_index) for k in batch])):
            if tail is None:  # deleted while we looked
                continue
            raw, known = tail
            size = _size(inner, key, known)
            sizes.append(size)
            try:
                limit = None if size is None else max(0, size - len(raw))
                index = ShardIndex.from_bytes(raw, cps, key=key, payload_limit=limit)
            except ShardCorruptError as e:
                problems.append(e)
                dead.append(None)
                continue
            n_chunks += index.n_live()
            dead.append(None if size is None else max(0, size - n_index - covered_bytes(index)))
    return n_chunks, _sum_or_none(sizes), _sum_or_none(dead), problems


def _object_sizes(inner: Inner, keys: list[str]) -> list[tuple[str, int | None]]:
    out = []
    for batch in _batches(keys):
        for key, tail in zip(batch, inner.get_tails([(k, 1) for k in batch])):
            if tail is not None:
                out.append((key, _size(inner, key, tail[1])))
    return out


def array_stats(inner: Inner, meta: dm.DraftArrayMeta, *, exclude_prefixes: Iterable[str] = ()) -> ArrayStats:
    """Statistics of one array. ``exclude_prefixes``: other arrays' data under this prefix
    (a root array's ``data/root/`` holds every other array's keys too)."""
    keys, stray = data_keys(inner, meta, exclude_prefixes)
    portable, why = _portability(meta)
    problems: list[ShardingStoreError]
    if meta.is_sharded:
        n_chunks, stored, dead, corrupt = _sharded_stats(inner, meta, keys)
        problems = list(corrupt)
        n_objects = len(keys)
    else:
        sizes = _object_sizes(inner, keys)
        n_objects = n_chunks = len(sizes)
        stored, dead = _sum_or_none(s for _, s in sizes), 0
        problems = [p for hook in PROBLEM_HOOKS if (p := hook(inner, meta, sorted(keys))) is not None]
    return ArrayStats(meta, n_objects, n_chunks, stored, dead, tuple(stray), portable, why,
                      tuple(str(p) for p in problems), problems[0] if problems else None)


def first_shard_damage(inner: Inner, meta: dm.DraftArrayMeta, exclude_prefixes: Iterable[str] = ()) -> ShardingStoreError | None:
    """The first damaged shard index of a sharded array (one tail read per shard), or None."""
    if not meta.is_sharded:
        return None
    keys, _ = data_keys(inner, meta, exclude_prefixes)
    problems = _sharded_stats(inner, meta, keys)[3]
    return problems[0] if problems else None


def _nested_prefixes(hierarchy: DraftHierarchy, meta: dm.DraftArrayMeta) -> list[str]:
    own = dm.data_prefix(meta.path)
    return [
        p
        for n in hierarchy.arrays()
        if n.path != meta.path and (p := dm.data_prefix(n.path)).startswith(own)
    ]


def hierarchy_stats(
    store_or_url: Any,
    path: str = "",
    *,
    storage_options: Mapping[str, Any] | None = None,
    hierarchy: DraftHierarchy | None = None,
) -> tuple[DraftHierarchy, list[ArrayStats]]:
    """The hierarchy and the statistics of every array at or below ``path``."""
    h = hierarchy or open_hierarchy(store_or_url, storage_options=storage_options)
    root = h.node(path).path
    out = []
    for node in h.arrays():
        if node.meta is None or not (root == "" or node.path == root or node.path.startswith(root + "/")):
            continue
        out.append(array_stats(h.inner, node.meta, exclude_prefixes=_nested_prefixes(h, node.meta)))
    return h, out

