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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from ..codec.chunk_codec import decode as decode_payload
from ..errors import DraftMetadataError, LinkOutsideStoreError, ShardCorruptError, ShardingStoreError
from ..formats import draft_metadata as dm
from ..formats.keys import Coords, format_chunk_suffix, parse_chunk_suffix
from ..formats.shard_index import (
    CHECKSUM_NBYTES,
    ENTRY_NBYTES,
    MAX_INDEX_ENTRIES,
    MAX_UINT64,
    IndexReading,
    ShardIndex,
    index_nbytes,
    index_reading,
)
from ..stores import Inner
from .hierarchy import DraftHierarchy, Node, open_hierarchy

__all__ = [
    "ArrayStats",
    "array_stats",
    "codec_chain",
    "codec_chain_text",
    "covered_bytes",
    "data_keys",
    "decide_reading",
    "hierarchy_stats",
    "LostTransformer",
    "ShardEvidence",
    "check_assumed_layout",
    "check_assumed_layouts",
    "detect_lost_transformer",
    "first_shard_damage",
    "refuse_lost_transformer",
]

BATCH = 512
#: bytes of shard tails held at once by a batch of tail reads (a batch holds one tail at least)
TAIL_BUDGET = 32 << 20
#: bytes read from the end of an unsharded array's first object to look for a draft shard index
LOST_TRANSFORMER_TAIL = 1 << 16
#: payloads decoded per probed object and index length (each must decode to a full chunk)
LOST_TRANSFORMER_PROBES = 4
#: objects whose index tails the shard-layout evidence reads: the first and, per dimension,
#: the one furthest along it
MAX_PROBED_SHARDS = 8
#: index lengths tried, longest first, to confirm the one at the end of the first object
MAX_LENGTHS_TRIED = 8
#: index lengths a shard's leading empty entries leave open (they may be payload bytes)
MAX_LENGTH_RANGE = 16
#: shapes considered per index length
MAX_FACTORIZATIONS = 10_000
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
    #: an undeclared shard index as its shards read (``"plain"``, ``"crc32c-hidden"``, ``"none"``:
    #: no shard); None when the document declares it or the array is unsharded
    index_reading: str | None = None
    #: the chunks per shard of an array that lost its storage transformer (its objects are
    #: shards, ``n_chunks`` counts their chunks), the likeliest shape; None for any other
    lost_chunks_per_shard: Coords | None = None

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
            "index_reading": self.index_reading,
            "lost_transformer_chunks_per_shard": None if self.lost_chunks_per_shard is None
            else list(self.lost_chunks_per_shard),
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
        from ..formats.v3_documents import portability_problems
    except ImportError:  # pragma: no cover - v3_metadata is built by another engineer
        return None, ()
    problems = tuple(portability_problems(meta))
    return not problems, problems


# --------------------------------------------------------------------------- lost transformer: the evidence
#
# zarr-python 2.x's resize()/append() rewrote an array's metadata without its
# ``storage_transformers`` while its objects stayed draft shards. Read as chunks they give
# wrong values, so such an array is refused until the user says which ``chunks_per_shard``
# it had (``--assume-chunks-per-shard``). The index at the end of a shard gives the number
# of chunks per shard, never its shape: every factorisation of that number parses. What
# decides is the rest of the evidence, all of which a wrong shape contradicts sooner or
# later and the right one never does (zarr 2.18 deletes the chunks a shrinking resize cuts
# off, through the transformer, and removes shards left empty):
#
# * shard keys outside the shard grid the shape implies (the listing the command made);
# * live index entries for chunks outside the array (index tails of the probed shards);
# * payloads that do not decode to a full chunk, and a longer index before the one the
#   shape implies (its entries point at payloads that do decode).
#
# Reads, on top of the listing the command makes anyway: the tails of at most
# MAX_PROBED_SHARDS objects -- the first (LOST_TRANSFORMER_TAIL bytes) and, per dimension,
# the one furthest along it (its index) -- in one or two get_tails requests, and at most
# LOST_TRANSFORMER_PROBES payloads per probed object and index length tried, in one
# get_ranges request per length (decoded with the array's codecs, each once). A healthy
# unsharded array costs one tail read of its first object, as before.


@dataclass(frozen=True)
class LostTransformer:
    """An unsharded-looking array whose objects are draft shards (the 2.x ``resize()`` defect).

    ``n_chunks``: entries of the shard index found at the end of ``key`` (``min_chunks``:
    fewer when its first entries are empty, which the tail cannot tell from payload bytes);
    ``candidates``: the ``chunks_per_shard`` shapes with that many chunks that nothing in
    the evidence contradicts, most likely first (the shard grid each implies fits the
    shard keys found most tightly); several when the evidence cannot tell, e.g. ``(2, 2)``
    or ``(4, 1)`` for an array with one shard; none when every shape is contradicted
    (``ruled_out`` says why, for the first few).
    """

    path: str
    key: str
    n_chunks: int
    candidates: tuple[Coords, ...]
    min_chunks: int | None = None
    ruled_out: tuple[str, ...] = ()

    def message(self) -> str:
        name = self.path or "/"
        lo = self.min_chunks if self.min_chunks is not None else self.n_chunks
        entries = f"{self.n_chunks}-entry" if lo == self.n_chunks else f"{lo}- to {self.n_chunks}-entry"
        found = (
            f"although its metadata has no storage transformer ({self.key} ends in a {entries} shard index; it lost "
            "its storage transformer to the zarr-python 2.x resize()/append() defect)"
        )
        if not self.candidates:
            why = f" ({'; '.join(self.ruled_out[:3])})" if self.ruled_out else ""
            return (
                f"array '{name}' looks sharded {found}, but no chunks_per_shard of that many chunks fits its objects{why}; "
                "it cannot be read or migrated as it is"
            )
        shapes = " or ".join(_shape_text(c) for c in self.candidates[:6])
        if len(self.candidates) > 1:
            shapes += " (most likely first)"
        return (
            f"array '{name}' looks sharded with chunks_per_shard {shapes} {found}; "
            f"rerun with --assume-chunks-per-shard {_option(self.path, self.candidates[0])}"
        )

    def error(self) -> DraftMetadataError:
        return DraftMetadataError(self.message(), key=dm.array_meta_key(self.path))


def _shape_text(cps: Coords) -> str:
    return "(" + ", ".join(map(str, cps)) + ")"


def _option(path: str, cps: Coords) -> str:
    return f"{path}=" + ",".join(map(str, cps))


def _dims_text(values: Sequence[int]) -> str:
    return " x ".join(map(str, values))


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
    so the cost is linear in the index found, not in the object. The lengths found are
    consecutive.
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


Payload = tuple[str, int, int]  # (key, offset, nbytes)


class ShardEvidence:
    """What the objects of an array say about the shard layout they really have.

    ``keys``: the array's object keys, from the listing the command made (keys that are not
    chunk keys of the array are ignored). Tails and payloads are read on demand, within the
    bounds described at the top of this section, and every payload is decoded at most once.
    """

    def __init__(self, inner: Inner, meta: dm.DraftArrayMeta, keys: Iterable[str]) -> None:
        self.inner, self.meta = inner, meta
        prefix = dm.data_prefix(meta.path)
        self.coords: dict[str, Coords] = {}
        for k in keys:
            c = parse_chunk_suffix(k[len(prefix) :], meta.separator, meta.ndim) if k.startswith(prefix) else None
            if c is not None:
                self.coords[k] = c
        self.grid = tuple(math.ceil(s / c) for s, c in zip(meta.shape, meta.chunks))
        ordered = sorted(self.coords, key=self.coords.__getitem__)
        self.first: str | None = ordered[0] if ordered else None
        #: per dimension, the key furthest along it
        self.furthest = [max(ordered, key=lambda k: (self.coords[k][d], self.coords[k])) for d in range(meta.ndim)] if ordered else []
        self.top = tuple(self.coords[k][d] for d, k in enumerate(self.furthest))
        self.probed = list(dict.fromkeys([*ordered[:1], *self.furthest]))[:MAX_PROBED_SHARDS]
        self.tails: dict[str, tuple[bytes, int]] = {}
        self._verdicts: dict[Payload, str | None] = {}
        self._length_evidence: dict[int, list[str]] = {}

    # -- reading ----------------------------------------------------------
    def read_tails(self, first: int, others: int) -> None:
        """Read (once, in one request) ``first`` bytes from the end of the first object and
        ``others`` from the other probed ones, where what was read so far is shorter."""
        want = []
        for k in self.probed:
            n = first if k == self.first else others
            have = self.tails.get(k)
            if n <= 0:
                continue
            if have is None or (len(have[0]) < n and len(have[0]) < have[1]):
                want.append((k, n))
        if not want:
            return
        for (k, _), got in zip(want, self.inner.get_tails(want)):
            if got is None:  # deleted since the listing
                self.tails.pop(k, None)
                continue
            data = bytes(got[0])
            size = _size(self.inner, k, got[1])
            self.tails[k] = (data, len(data) if size is None else size)

    def _judge(self, payloads: Sequence[Payload]) -> None:
        """Fetch and decode, in one request, the payloads not judged yet."""
        todo = [p for p in dict.fromkeys(payloads) if p not in self._verdicts]
        if not todo:
            return
        got = self.inner.get_ranges([(k, o, o + n) for k, o, n in todo])
        for (k, o, n), data in zip(todo, got):
            where = f"{k} bytes {o}..{o + n}"
            if data is None or len(data) != n:
                self._verdicts[(k, o, n)] = f"{where} could not be read"
                continue
            try:
                decode_payload(self.meta, data, key=where)  # bounded by the chunk size
                self._verdicts[(k, o, n)] = None
            except ShardingStoreError as e:
                self._verdicts[(k, o, n)] = f"{e}"

    # -- the index at the end of an object ------------------------------
    def entries(self, key: str, n: int) -> np.ndarray | ShardCorruptError | None:
        """The ``n`` entries at the end of ``key`` as an ``(n, 2)`` array, the error saying
        why they are not a shard index, or None when not read (far enough)."""
        tail = self.tails.get(key)
        if tail is None:
            return None
        data, size = tail
        nbytes = 16 * n
        if nbytes > size:
            return ShardCorruptError(f"{key}: object is {size} bytes, shorter than its {nbytes}-byte shard index", key=key)
        if nbytes > len(data):
            return None
        try:
            index = ShardIndex.from_bytes(data[len(data) - nbytes :], (n,), key=key, payload_limit=size - nbytes)
        except ShardCorruptError as e:
            return e
        return index.entries.reshape(-1, 2)

    def _live(self, key: str, n: int) -> list[Payload]:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        e = self.entries(key, n)
        if e is None or isinstance(e, ShardCorruptError):
            return []
        idx = np.flatnonzero(e[:, 0] != MAX_UINT64)
        return [(key, int(e[i, 0]), int(e[i, 1])) for i in idx]

    def index_lengths(self) -> tuple[int, int] | None:
        """``(n_min, n_max)``: the entry counts the index at the end of the first object may
        have, or None when it does not end in one. ``n_max`` is the longest index whose first
        live payloads decode to full chunks; its leading empty entries may be payload bytes
        that happen to read as empty entries, down to ``n_min`` entries."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        if self.first is None:
            return None
        self.read_tails(LOST_TRANSFORMER_TAIL, 0)
        tail = self.tails.get(self.first)
        if tail is None:
            return None
        for n in reversed(_index_lengths(*tail)[-MAX_LENGTHS_TRIED:]):
            live = self._live(self.first, n)
            probes = live[:LOST_TRANSFORMER_PROBES]
            self._judge(probes)
            if probes and all(self._verdicts[p] is None for p in probes):
                e = self.entries(self.first, n)
                assert isinstance(e, np.ndarray)
                leading = int(np.flatnonzero(e[:, 0] != MAX_UINT64)[0])
                return max(n - leading, n - MAX_LENGTH_RANGE + 1, 1), n
        return None

    # -- what contradicts a shape -----------------------------------------
    def _grid_evidence(self, cps: Coords) -> list[str]:
        shard_grid = tuple(math.ceil(g / c) for g, c in zip(self.grid, cps))
        return [
            f"{self.furthest[d]} lies outside the {_dims_text(shard_grid)} shard grid it implies"
            for d in range(len(cps))
            if self.top[d] >= shard_grid[d]
        ][:1]

    def _entry_evidence(self, cps: Coords) -> list[str]:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        out = []
        n = math.prod(cps)
        shard_grid = tuple(math.ceil(g / c) for g, c in zip(self.grid, cps))
        grid = np.array(self.grid, dtype=np.int64)
        for key in self.probed:
            e = self.entries(key, n)
            coords = self.coords[key]
            if not isinstance(e, np.ndarray) or any(c >= g for c, g in zip(coords, shard_grid)):
                continue
            idx = np.flatnonzero(e[:, 0] != MAX_UINT64)
            if not idx.size:
                continue
            chunks = np.stack(np.unravel_index(idx, cps), axis=1) + np.array(coords, dtype=np.int64) * np.array(cps, dtype=np.int64)
            outside = np.flatnonzero((chunks >= grid).any(axis=1))
            if outside.size:
                chunk = tuple(int(c) for c in chunks[outside[0]])
                out.append(
                    f"{key} has a live index entry for chunk {chunk}, outside the {_dims_text(self.grid)} chunk grid of the array"
                    + (f" ({outside.size} such entries)" if outside.size > 1 else "")
                )
        return out

    def length_evidence(self, n: int) -> list[str]:
        """What contradicts an index of ``n`` entries at the end of every probed object: it
        does not parse, its first live payloads do not decode to full chunks, or live entries
        just before it point at payloads that do (the index is longer)."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        if n in self._length_evidence:
            return self._length_evidence[n]
        out: list[str] = []
        probes: list[Payload] = []
        before: dict[str, list[Payload]] = {}
        for key in self.probed:
            e = self.entries(key, n)
            if isinstance(e, ShardCorruptError):
                out.append(str(e))
                continue
            if e is None:
                continue
            probes += self._live(key, n)[:LOST_TRANSFORMER_PROBES]
            data, size = self.tails[key]
            longer = [m for m in _index_lengths(data, size) if m > n]
            if longer:  # live entries just before the n-entry index, nearest first
                e_long = self.entries(key, longer[-1])
                if isinstance(e_long, np.ndarray):
                    extra = e_long[: len(e_long) - n][::-1]
                    live = [(key, int(o), int(b)) for o, b in extra if o != MAX_UINT64][:LOST_TRANSFORMER_PROBES]
                    if live:
                        before[key] = live
        self._judge(probes + [p for ps in before.values() for p in ps])
        out += [v for p in probes if (v := self._verdicts[p]) is not None][:2]
        for key, ps in before.items():
            if all(self._verdicts[p] is None for p in ps):
                out.append(
                    f"{key} ends in a shard index of more than {n} entries (the live entry before its last {n} points "
                    f"at bytes {ps[0][1]}..{ps[0][1] + ps[0][2]}, which decode to a full chunk)"
                )
        self._length_evidence[n] = out
        return out

    def contradictions(self, cps: Coords, *, every: bool = False) -> list[str]:
        """Evidence against ``chunks_per_shard == cps`` (empty: nothing contradicts it).
        Stops at the first kind found unless ``every``."""
        n = math.prod(cps)
        out: list[str] = []
        for check in (lambda: self._grid_evidence(cps), lambda: self.length_evidence(n), lambda: self._entry_evidence(cps)):
            out += check()
            if out and not every:
                break
        return out

    def slack(self, cps: Coords) -> int:
        """How far the shard grid ``cps`` implies reaches beyond the shard keys found."""
        return sum(math.ceil(g / c) - 1 - t for g, c, t in zip(self.grid, cps, self.top))

    def candidates(self, n_min: int, n_max: int) -> tuple[tuple[Coords, ...], tuple[str, ...]]:
        """``(candidates, ruled_out)``: the shapes of ``n_min..n_max`` chunks nothing
        contradicts, most likely first (smallest slack, then more chunks); and, for the
        first few shapes ruled out, why."""
        fitting: list[Coords] = []
        ruled_out: list[str] = []
        for n in range(n_max, n_min - 1, -1):
            for cps in itertools.islice(_factorizations(n, self.meta.ndim), MAX_FACTORIZATIONS):
                why = self.contradictions(cps)
                if why:
                    if len(ruled_out) < 6:
                        ruled_out.append(f"{_shape_text(cps)}: {why[0]}")
                else:
                    fitting.append(cps)
        fitting.sort(key=lambda c: (self.slack(c), -math.prod(c)))
        return tuple(fitting), tuple(ruled_out)

    def offer(self) -> str:
        """The candidates the evidence allows, as options, for messages."""
        found = self.index_lengths()
        if found is None:
            return "the objects do not end in a shard index with payloads that decode"
        self.read_tails(LOST_TRANSFORMER_TAIL, 16 * found[1])
        cands, _ = self.candidates(*found)
        if not cands:
            return f"no chunks_per_shard of {found[1]} chunks fits the evidence"
        return "chunks_per_shard the evidence allows, most likely first: " + ", ".join(
            f"--assume-chunks-per-shard {_option(self.meta.path, c)}" for c in cands[:6]
        )


def detect_lost_transformer(inner: Inner, meta: dm.DraftArrayMeta, keys: Sequence[str]) -> LostTransformer | None:
    """Is this unsharded array really sharded? ``keys``: its objects (from a listing).

    One tail read of its first object, plus a few payload ranges when a shard index is
    found there (a chunk object is one encoded chunk; a draft shard ends in an index whose
    live entries point inside the object at payloads that each decode to a full chunk;
    decoding the whole object is no test, zlib ignores trailing bytes). Only then are the
    other probed objects' indices read, to rank the candidate shapes and drop those the
    evidence rules out.
    """
    if meta.is_sharded or not keys or meta.ndim == 0:
        return None
    ev = ShardEvidence(inner, meta, keys)
    found = ev.index_lengths()
    if found is None or ev.first is None:
        return None
    n_min, n_max = found
    ev.read_tails(LOST_TRANSFORMER_TAIL, 16 * n_max)
    candidates, ruled_out = ev.candidates(n_min, n_max)
    return LostTransformer(meta.path, ev.first, n_max, candidates, n_min, ruled_out)


def refuse_lost_transformer(inner: Inner, meta: dm.DraftArrayMeta) -> None:
    """``open_draft``'s check: raise :class:`DraftMetadataError` when an unsharded array's
    first chunk object is really a draft shard. One tail read of that object (plus a few
    payload ranges when it ends in a shard index); only then is the array listed, so that
    the message offers the same ranked candidates as ``info`` and ``migrate``."""
    if meta.is_sharded or meta.ndim == 0:
        return
    first = dm.data_prefix(meta.path) + format_chunk_suffix((0,) * meta.ndim, meta.separator)
    if detect_lost_transformer(inner, meta, [first]) is None:
        return
    keys, _ = data_keys(inner, meta)
    found = detect_lost_transformer(inner, meta, keys) or detect_lost_transformer(inner, meta, [first])
    assert found is not None
    raise found.error()


def check_assumed_layout(inner: Inner, meta: dm.DraftArrayMeta, keys: Sequence[str] | None = None) -> None:
    """Refuse an ``--assume-chunks-per-shard`` guess (``meta.chunks_per_shard``) that the
    array's objects contradict: a wrong guess with the right number of chunks parses and
    would read wrong values.

    ``keys``: the array's object keys when the caller listed them already (else one
    listing). Reads the tails of at most ``MAX_PROBED_SHARDS`` objects (one request) and at
    most ``LOST_TRANSFORMER_PROBES`` payloads per probed object and index length. Raises
    :class:`DraftMetadataError` (exit 3) naming the array, the guess, the evidence and the
    candidates the evidence allows; :class:`ShardCorruptError` naming the object when the
    index the guess implies does not even fit in it (as reading it would).
    """
    cps = meta.chunks_per_shard
    if cps is None or meta.ndim == 0:
        return
    if keys is None:
        keys = data_keys(inner, meta)[0]
    ev = ShardEvidence(inner, meta, keys)
    if ev.first is None:
        return  # no object: nothing to read, nothing to contradict
    n = math.prod(cps)
    ev.read_tails(max(16 * n, LOST_TRANSFORMER_TAIL), 16 * n)
    evidence = ev.contradictions(cps, every=True)
    if not evidence:
        return
    option = f"--assume-chunks-per-shard {_option(meta.path, cps)}"
    unparsed = [e for k in ev.probed if isinstance(e := ev.entries(k, n), ShardCorruptError)]
    if unparsed:  # named first, as the error reading that shard would be
        evidence.remove(str(unparsed[0]))
    shown = "; ".join(evidence[:4]) + (f" (and {len(evidence) - 4} more)" if len(evidence) > 4 else "")
    against = f"is contradicted by its objects: {shown}" if evidence else "does not fit its objects"
    text = f"array '{meta.path or '/'}': {option} {against}; {ev.offer()}"
    if unparsed:  # the index the guess implies is not even there (the shard reader's error class)
        e = unparsed[0]
        reason = str(e).removeprefix(f"{e.key}: ")
        raise ShardCorruptError(f"{e.key}: does not end in the {n}-entry shard index the guess implies ({reason}); {text}", key=e.key)
    raise DraftMetadataError(text, key=dm.array_meta_key(meta.path))


def check_assumed_layouts(h: DraftHierarchy, assume: Mapping[str, Any] | None) -> None:
    """:func:`check_assumed_layout` for every array of ``assume`` (path -> chunks_per_shard,
    as given to ``DraftHierarchy.assume_sharded``, which must have run). No I/O when empty;
    else per assumed array one listing of its data prefix plus the reads described there."""
    for raw_path in assume or {}:
        node = h.node(raw_path)
        if node.meta is not None:
            keys, _ = data_keys(h.inner, node.meta, _nested_prefixes(h, node.meta))
            check_assumed_layout(h.inner, node.meta, keys)


def _lost_transformer_problem(inner: Inner, meta: dm.DraftArrayMeta, keys: Sequence[str]) -> ShardingStoreError | None:
    found = detect_lost_transformer(inner, meta, keys)
    return None if found is None else found.error()


# --------------------------------------------------------------------------- scanning


def _batches(items: Sequence[Any], n: int = BATCH, nbytes: int = 0) -> Iterator[Sequence[Any]]:
    """``items`` in batches of at most ``n``, and of at most :data:`TAIL_BUDGET` bytes when
    each item costs ``nbytes`` (a tail read): at least one item per batch."""
    n = max(1, min(n, TAIL_BUDGET // nbytes)) if nbytes > 0 else n
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
    objects: list[Any] = []
    stray: list[Any] = []
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
    for batch in _batches(keys, nbytes=n_index):
        for key, tail in zip(batch, inner.get_tails([(k, n_index) for k in batch])):
            if tail is None:  # deleted while we looked
                continue
            raw, known = tail.data, tail.size
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


def array_stats(
    inner: Inner, meta: dm.DraftArrayMeta, *, exclude_prefixes: Iterable[str] = (), assumed: bool = False
) -> ArrayStats:
    """Statistics of one array. ``exclude_prefixes``: other arrays' data under this prefix
    (a root array's ``data/root/`` holds every other array's keys too). ``assumed``: its
    ``chunks_per_shard`` is a guess (``--assume-chunks-per-shard``), checked against the
    evidence first (:func:`check_assumed_layout`, on the same listing). An array whose
    document declares its keys and shard index (a v3 one) is read as it declares
    (:func:`_declared_stats`)."""
    if getattr(meta, "declares_codecs", False):
        return _declared_stats(inner, meta)
    keys, stray = data_keys(inner, meta, exclude_prefixes)
    if assumed:
        check_assumed_layout(inner, meta, keys)
    portable, why = _portability(meta)
    problems: list[ShardingStoreError]
    lost_cps = None
    try:
        if meta.is_sharded:
            n_chunks, stored, dead, corrupt = _sharded_stats(inner, meta, keys)
            problems = list(corrupt)
            n_objects = len(keys)
        else:
            sizes = _object_sizes(inner, keys)
            n_objects = n_chunks = len(sizes)
            stored, dead = _sum_or_none(s for _, s in sizes), 0
            lost = detect_lost_transformer(inner, meta, sorted(keys))
            problems = [] if lost is None else [lost.error()]
            if lost is not None and lost.candidates:  # its objects are shards: count their chunks
                lost_cps = lost.candidates[0]
                n_chunks, _, dead, _ = _sharded_stats(inner, meta.with_chunks_per_shard(lost_cps), keys)
    except LinkOutsideStoreError as e:  # one of its objects links out of the store: its problem only
        return ArrayStats(meta, len(keys), 0, None, None, tuple(stray), portable, why, (str(e),), e)
    return ArrayStats(meta, n_objects, n_chunks, stored, dead, tuple(stray), portable, why,
                      tuple(str(p) for p in problems), problems[0] if problems else None,
                      lost_chunks_per_shard=lost_cps)


def _declared_stats(inner: Inner, meta: dm.DraftArrayMeta) -> ArrayStats:
    """:func:`array_stats` of an array whose document declares its chunk keys and shard index
    (key encoding, index location, CRC32C; an undeclared index is read from each shard's tail,
    which must all agree): one listing of its directory, one index read per shard."""
    from ..engine.shard_engine import ArrayLayout

    layout = ArrayLayout.from_meta(meta)
    node_key = getattr(meta, "node_key", "")
    objects: list[tuple[str, int | None]] = []
    stray: list[str] = []
    portable, why = _portability(meta)
    try:
        for key, size in sorted(inner.list_sized(layout.prefix)):
            if layout.parse(key) is not None:
                objects.append((key, _size(inner, key, size)))
            elif key != node_key:
                stray.append(key)
        if not meta.is_sharded:
            stored = _sum_or_none(size for _, size in objects)
            return ArrayStats(meta, len(objects), len(objects), stored, 0, tuple(stray), portable, why)
        n_chunks, dead, problems, reading = _declared_shards(inner, layout, objects)
    except LinkOutsideStoreError as e:  # one of its objects links out of the store: its problem only
        return ArrayStats(meta, len(objects), 0, None, None, tuple(stray), portable, why, (str(e),), e)
    return ArrayStats(meta, len(objects), n_chunks, _sum_or_none(size for _, size in objects), dead, tuple(stray),
                      portable, why, tuple(str(p) for p in problems), problems[0] if problems else None,
                      index_reading=reading)


def _declared_shards(inner: Inner, layout: Any, objects: list[tuple[str, int | None]]
                     ) -> tuple[int, int | None, list[ShardingStoreError], str | None]:
    """``(live chunks, dead bytes, problems, index reading)`` of the shards ``objects`` of a
    declared ``layout``: each index read once (in byte-bounded batches); an undeclared one
    read from the tail as :func:`~sharding_store.formats.shard_index.index_reading` decides."""
    cps = layout.chunks_per_shard
    n = math.prod(cps)
    undeclared = layout.index_checksum is None
    readings: dict[str, str] = {}
    problems: list[ShardingStoreError] = []
    n_chunks, dead = 0, list[int | None]()
    for key, raw, size in _declared_indices(inner, layout, objects):
        try:
            checksum = bool(layout.index_checksum)
            if undeclared:
                checksum = index_reading(raw, n, size, key=key) == "crc32c-hidden"
                readings.setdefault("crc32c-hidden" if checksum else "plain", key)
            nbytes = index_nbytes(cps, checksum)
            if size < nbytes or len(raw) < nbytes:
                raise ShardCorruptError(f"{key}: object is {size} bytes, shorter than its {nbytes}-byte shard index",
                                        key=key)
            start, limit = (nbytes, size) if layout.index_location == "start" else (0, size - nbytes)
            raw = raw[:nbytes] if layout.index_location == "start" else raw[len(raw) - nbytes:]
            index = ShardIndex.from_bytes(raw, cps, checksum=checksum, key=key, payload_limit=limit, payload_start=start)
        except ShardCorruptError as e:
            problems.append(e)
            dead.append(None)
            continue
        n_chunks += index.n_live()
        dead.append(max(0, size - nbytes - covered_bytes(index)))
    if len(readings) > 1:
        plain, hidden = readings["plain"], readings["crc32c-hidden"]
        problems.insert(0, ShardCorruptError(
            f"{plain}: array '{layout.path or '/'}' declares no index_codecs and its shards disagree: {plain} has a "
            f"plain index, {hidden} an index followed by its CRC32C", key=plain))
    reading = (next(iter(readings)) if readings else "none") if undeclared else None
    return n_chunks, _sum_or_none(dead), problems, reading


def _declared_indices(inner: Inner, layout: Any, objects: list[tuple[str, int | None]]
                      ) -> Iterator[tuple[str, bytes, int]]:
    """``(key, index bytes, size)`` of each shard: its head or tail as long as its declared
    index (with the CRC32C an undeclared one may have), read in byte-bounded batches."""
    checksum = layout.index_checksum is not False
    nbytes = index_nbytes(layout.chunks_per_shard, checksum)
    for batch in _batches(objects, nbytes=nbytes):
        sized = [(key, size or 0) for key, size in batch]
        ranges = [(key, 0, min(nbytes, size)) if layout.index_location == "start" else
                  (key, max(0, size - nbytes), size) for key, size in sized]
        for (key, size), raw in zip(sized, inner.get_ranges(ranges)):
            if raw is None:  # deleted while we looked
                continue
            yield key, bytes(raw), size


def first_shard_damage(inner: Inner, meta: dm.DraftArrayMeta, exclude_prefixes: Iterable[str] = ()) -> ShardingStoreError | None:
    """The first damaged shard index of a sharded array (one tail read per shard), or None.
    A layout other than the draft one (a v3 array's: a CRC32C after the index, the index
    at the start, other key encodings) is read as its meta says, one index at a time."""
    if not meta.is_sharded:
        return None
    from ..engine.shard_engine import ArrayLayout, read_shard_index

    layout = ArrayLayout.from_meta(meta)
    if not layout.plain_index or layout.encoding != "draft":
        excluded = tuple(exclude_prefixes)
        assert layout.chunks_per_shard is not None
        for key, size in inner.list_sized(layout.prefix):
            if layout.parse(key) is None or (excluded and key.startswith(excluded)):
                continue
            try:
                read_shard_index(inner, key, size if size is not None else (inner.size(key) or 0),
                                 layout.chunks_per_shard, checksum=bool(layout.index_checksum),
                                 index_location=layout.index_location)
            except ShardCorruptError as e:
                return e
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
    assumed: Iterable[str] = (),
    on_array: Callable[[ArrayStats], object] | None = None,
) -> tuple[DraftHierarchy, list[ArrayStats]]:
    """The hierarchy and the statistics of every array at or below ``path``. ``assumed``:
    paths whose ``chunks_per_shard`` the hierarchy was told to assume (checked, see
    :func:`array_stats`). ``on_array(stats)`` after each array (``info``'s progress bar)."""
    h = hierarchy or open_hierarchy(store_or_url, storage_options=storage_options)
    guessed = {dm.normalize_path(p) for p in assumed}
    out = []
    for node in stats_nodes(h, path):
        assert node.meta is not None
        out.append(array_stats(h.inner, node.meta, exclude_prefixes=_nested_prefixes(h, node.meta), assumed=node.path in guessed))
        if on_array is not None:
            on_array(out[-1])
    return h, out


def stats_nodes(h: DraftHierarchy, path: str = "") -> list[Node]:
    """The arrays at or below ``path`` whose statistics :func:`hierarchy_stats` reads."""
    root = h.node(path).path
    return [n for n in h.arrays()
            if n.meta is not None and (root == "" or n.path == root or n.path.startswith(root + "/"))]


# --------------------------------------------------------------------------- undeclared shard indices


def _tails(src: Inner, keys: Iterable[tuple[str, int | None]], n: int, skip_absent: bool = False,
           ) -> Iterator[tuple[str, bytes, int]]:
    """The tail of each shard, read in batches of bounded bytes (a caller that stops at the
    first bad one never reads the rest)."""
    want = ENTRY_NBYTES * n + CHECKSUM_NBYTES
    per_batch = max(1, min(BATCH, TAIL_BUDGET // want))
    it = iter(keys)
    while batch := list(itertools.islice(it, per_batch)):
        for (key, size), tail in zip(batch, src.get_tails([(k, want) for k, _ in batch])):
            if tail is None:
                if skip_absent:
                    continue
                raise ShardCorruptError(f"{key}: vanished while it was read", key=key)
            yield key, tail.data, tail.size if tail.size is not None else (size if size is not None else len(tail.data))


def decide_reading(src: Inner, path: str, objects: Iterable[tuple[str, int | None]], n: int, *,
                   skip_absent: bool = False) -> IndexReading | str:
    """The one reading (:func:`~sharding_store.formats.shard_index.index_reading`) of the undeclared
    index of every shard ``(key, size or None)`` in ``objects`` (``n`` chunks each), read with
    one tail request each; they must agree, else :class:`ShardCorruptError` naming two of them
    (never a guess). ``"none"`` when there is no shard (``objects`` empty, or with
    ``skip_absent`` all absent; without it an absent object is ShardCorruptError). Used by
    ``migrate`` (every shard of an array of the 2023 generation) and by the ``open_v3`` view
    (one shard; the others are checked when they are served)."""
    first: dict[str, str] = {}
    for key, data, size in _tails(src, objects, n, skip_absent):
        reading = index_reading(data, n, size, key=key)
        first.setdefault(reading, key)
        if len(first) == 2:
            plain, hidden = first["plain"], first["crc32c-hidden"]
            raise ShardCorruptError(
                f"{plain}: array '{path or '/'}' declares no index_codecs and its shards disagree: {plain} has a "
                f"plain index, {hidden} an index followed by its CRC32C; refusing to guess",
                key=plain,
            )
    return next(iter(first)) if first else "none"
