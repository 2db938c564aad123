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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import draft_metadata as dm
from .chunk_codec import chunk_nbytes
from .errors import ShardCorruptError
from .hierarchy import DraftHierarchy, open_hierarchy
from .inner import Inner
from .keys import parse_chunk_suffix
from .shard_index import ShardIndex, index_nbytes

__all__ = [
    "ArrayStats",
    "PROBLEM_HOOKS",
    "array_stats",
    "codec_chain",
    "codec_chain_text",
    "covered_bytes",
    "data_keys",
    "hierarchy_stats",
    "lost_transformer_hint",
]

BATCH = 512
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


# --------------------------------------------------------------------------- hooks


def lost_transformer_hint(meta: dm.DraftArrayMeta, sizes: ObjectSizes) -> str | None:
    """Cheap check for 2.18's ``resize()``/``append()`` defect (shards under metadata that
    lost its ``storage_transformers``): only decidable for the uncompressed, unfiltered case,
    where every chunk object must be exactly one chunk's bytes."""
    if meta.is_sharded or meta.compressor is not None or meta.filters:
        return None
    expected = chunk_nbytes(meta)
    odd = [k for k, s in sizes if s is not None and s != expected]
    if not odd:
        return None
    return (
        f"{len(odd)} chunk object(s) are not {expected} bytes (e.g. {odd[0]}): they may be shards "
        "whose metadata lost its storage transformer (zarr 2.x resize/append defect)"
    )


#: checks run on every unsharded array's objects; each returns a problem or None.
#: Other modules (hostile-input detection) may append to this list.
PROBLEM_HOOKS: list[Callable[[dm.DraftArrayMeta, ObjectSizes], str | None]] = [lost_transformer_hint]


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


def _sharded_stats(inner: Inner, meta: dm.DraftArrayMeta, keys: list[str]) -> tuple[int, int | None, int | None, list[str]]:
    """``(live chunks, bytes stored, dead bytes, problems)`` from the shards' indices."""
    cps = meta.chunks_per_shard
    assert cps is not None
    n_index = index_nbytes(cps)
    n_chunks = 0
    sizes: list[int | None] = []
    dead: list[int | None] = []
    problems: list[str] = []
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
                problems.append(str(e))
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
    if meta.is_sharded:
        n_chunks, stored, dead, problems = _sharded_stats(inner, meta, keys)
        n_objects = len(keys)
    else:
        sizes = _object_sizes(inner, keys)
        n_objects = n_chunks = len(sizes)
        stored, dead = _sum_or_none(s for _, s in sizes), 0
        problems = [p for hook in PROBLEM_HOOKS if (p := hook(meta, sizes)) is not None]
    return ArrayStats(meta, n_objects, n_chunks, stored, dead, tuple(stray), portable, why, tuple(problems))


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

