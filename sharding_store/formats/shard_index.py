"""The shard binary format: the index and pure encode/decode functions.

One format serves both eras. A draft (2022) shard is ``[payloads...][index]`` with the
index a C-ordered array of little-endian ``(offset, nbytes)`` uint64 pairs and both
fields ``2**64-1`` for an empty chunk. The v1.0 ``sharding_indexed`` codec stores the
same index, optionally followed by a 4-byte CRC32C of it and optionally at the start
of the object instead of the end. ``index_location="end"`` without a checksum is the
draft format exactly.

Validation policy (what we trust in an index we did not write):

* an entry with exactly one sentinel field (a *half sentinel*) is corrupt;
* ``offset + nbytes`` must not overflow uint64 and must lie inside the payload area
  (the object minus its index) when the object size is known;
* two entries may overlap or share bytes: the spec allows any layout, and a reader
  can serve both faithfully, so overlaps are accepted (and un-shared on rewrite).

Violations raise :class:`~sharding_store.errors.ShardCorruptError` naming the key.
"""

from __future__ import annotations

import functools
import math
import operator
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

from ..errors import ShardCorruptError, UsageError

MAX_UINT64 = 2**64 - 1
ENTRY_NBYTES = 16
CHECKSUM_NBYTES = 4
#: refuse to allocate an index beyond this: a hostile ``chunks_per_shard`` must fail fast
MAX_INDEX_ENTRIES = 2**26
#: indices of more entries are checked with numpy by :func:`live_entries`, not as Python lists
LIST_ENTRIES = 1 << 16

IndexLocation = Literal["start", "end"]
Coords = tuple[int, ...]


def _load_crc32c() -> Any:
    """The ``crc32c`` package's checksum function, from its compiled module.

    Loaded directly, not through the package: the package's ``__init__`` asks
    ``importlib.metadata`` for its own version, which imports ``importlib.metadata`` and scans
    the installed distributions (~100 M instructions, an eighth of ``sharding-store info``'s
    start-up). Any other layout of the package (an older one was a single module) is
    imported the usual way, and a missing package raises its ``ModuleNotFoundError``."""
    import importlib.machinery
    import importlib.util
    import sys

    package: Any = sys.modules.get("crc32c")
    if package is None:
        try:
            spec: Any = importlib.util.find_spec("crc32c")
            found: Any = importlib.machinery.PathFinder.find_spec("crc32c._crc32c", list(spec.submodule_search_locations))
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
            return module.crc32c
        except Exception:  # noqa: BLE001 - not the layout known here: the package's own import
            import crc32c as package
    return package.crc32c


class _Crc32c:
    """CRC32C, loaded on the first checksum computed (:func:`_load_crc32c`): reading a
    draft shard, or referring to it, computes none. Tests replace ``_crc32c`` with an object
    whose ``crc32c`` returns what they choose."""

    def crc32c(self, data: Any) -> int:
        function = _load_crc32c()
        self.crc32c = function  # type: ignore[method-assign]  # later calls go straight to it
        return int(function(data))


_crc32c: Any = _Crc32c()


def crc32c(data: Any) -> int:
    """The CRC32C (Castagnoli) of a buffer: the checksum of a v3 shard index."""
    return int(_crc32c.crc32c(data))


def index_nbytes(chunks_per_shard: tuple[int, ...], checksum: bool = False) -> int:
    """Size in bytes of the encoded index for ``chunks_per_shard``."""
    n = n_entries(chunks_per_shard)
    return ENTRY_NBYTES * n + (CHECKSUM_NBYTES if checksum else 0)


def n_entries(chunks_per_shard: tuple[int, ...]) -> int:
    n = math.prod(chunks_per_shard)
    if n < 1 or any(c < 1 for c in chunks_per_shard):
        raise UsageError(f"chunks_per_shard {tuple(chunks_per_shard)}: every entry must be >= 1")
    if n > MAX_INDEX_ENTRIES:
        raise UsageError(
            f"chunks_per_shard {tuple(chunks_per_shard)}: {n} chunks per shard exceeds the limit of {MAX_INDEX_ENTRIES}"
        )
    return n


def _unwrap_empty_entries(flat: np.ndarray, payload_start: int) -> None:
    """zarrita 0.2.2-0.2.7 wrote an index at the start by adding its size to every offset,
    the empty marker's too: an empty entry reads ``(payload_start - 1, 2**64-1)``. No chunk
    can be ``2**64-1`` bytes long, so exactly that pair is the empty marker (in place)."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    pairs = flat.reshape(-1, 2)
    wrapped = (pairs[:, 1] == MAX_UINT64) & (pairs[:, 0] == np.uint64(payload_start - 1))
    if wrapped.any():
        pairs[wrapped, 0] = MAX_UINT64


@dataclass
class ShardIndex:
    """The ``(offset, nbytes)`` table of one shard, shape ``[*chunks_per_shard, 2]``."""

    entries: np.ndarray  # uint64, shape (*chunks_per_shard, 2)

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return tuple(self.entries.shape[:-1])

    @classmethod
    def empty(cls, chunks_per_shard: tuple[int, ...]) -> ShardIndex:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        n_entries(chunks_per_shard)
        return cls(np.full((*chunks_per_shard, 2), MAX_UINT64, dtype=np.uint64))

    @classmethod
    def from_bytes(
        cls,
        data: bytes | memoryview,
        chunks_per_shard: tuple[int, ...],
        *,
        checksum: bool = False,
        key: str = "<shard>",
        payload_limit: int | None = None,
        payload_start: int = 0,
    ) -> ShardIndex:
        """Parse and validate an encoded index.

        ``payload_start``/``payload_limit`` bound where chunk bytes may lie (the object
        minus its index); pass ``payload_limit=None`` when the object size is unknown
        (a suffix range read) and check lengths when the payloads are read instead.
        """
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        expected = index_nbytes(chunks_per_shard, checksum)
        if len(data) != expected:
            raise ShardCorruptError(
                f"{key}: shard index is {len(data)} bytes, expected {expected} "
                f"({n_entries(chunks_per_shard)} chunks x 16{' + 4 checksum' if checksum else ''}); "
                "the object is truncated or chunks_per_shard is wrong",
                key=key,
            )
        body = memoryview(data)[: ENTRY_NBYTES * n_entries(chunks_per_shard)]
        if checksum:
            stored = int.from_bytes(data[-CHECKSUM_NBYTES:], "little")
            actual = _crc32c.crc32c(body)
            if stored != actual:
                raise ShardCorruptError(
                    f"{key}: shard index checksum mismatch (stored {stored:#010x}, computed {actual:#010x})",
                    key=key,
                )
        entries = np.frombuffer(body, dtype="<u8").astype(np.uint64, copy=True)
        if payload_start:
            _unwrap_empty_entries(entries, payload_start)
        entries = entries.reshape((*chunks_per_shard, 2))
        index = cls(entries)
        index.validate(key=key, payload_limit=payload_limit, payload_start=payload_start)
        return index

    def validate(self, *, key: str, payload_limit: int | None = None, payload_start: int = 0) -> None:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        flat = self.entries.reshape(-1, 2)
        off_empty = flat[:, 0] == MAX_UINT64
        len_empty = flat[:, 1] == MAX_UINT64
        half = off_empty != len_empty
        if half.any():
            i = int(np.flatnonzero(half)[0])
            raise ShardCorruptError(
                f"{key}: shard index entry {self._coords(i)} has one sentinel field "
                f"(offset={int(flat[i, 0])}, nbytes={int(flat[i, 1])})",
                key=key,
            )
        live = ~off_empty
        offsets = flat[live, 0]
        nbytes = flat[live, 1]
        overflow = offsets > (MAX_UINT64 - nbytes)
        if overflow.any():
            i = int(np.flatnonzero(live)[np.flatnonzero(overflow)[0]])
            raise ShardCorruptError(
                f"{key}: shard index entry {self._coords(i)} overflows: offset {int(flat[i, 0])} + nbytes {int(flat[i, 1])} > 2**64-1",
                key=key,
            )
        if offsets.size:
            ends = offsets + nbytes
            bad = offsets < np.uint64(payload_start)
            if payload_limit is not None:
                bad |= ends > np.uint64(payload_limit)
            if bad.any():
                i = int(np.flatnonzero(live)[np.flatnonzero(bad)[0]])
                where = f"[{payload_start}, {payload_limit})" if payload_limit is not None else f"[{payload_start}, ...)"
                raise ShardCorruptError(
                    f"{key}: shard index entry {self._coords(i)} points to bytes "
                    f"[{int(flat[i, 0])}, {int(flat[i, 0]) + int(flat[i, 1])}) outside the payload area {where}",
                    key=key,
                )

    def _coords(self, flat_index: int) -> Coords:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        return tuple(int(c) for c in np.unravel_index(flat_index, self.chunks_per_shard))

    def to_bytes(self, *, checksum: bool = False) -> bytes:
        body = self.entries.astype("<u8", copy=False).tobytes()
        if checksum:
            body += _crc32c.crc32c(body).to_bytes(CHECKSUM_NBYTES, "little")
        return body

    def get(self, coords: Coords) -> tuple[int, int] | None:
        off, nb = self.entries[coords]
        if off == MAX_UINT64:
            return None
        return int(off), int(nb)

    def set(self, coords: Coords, offset: int, nbytes: int) -> None:
        self.entries[coords] = (offset, nbytes)

    def clear(self, coords: Coords) -> None:
        self.entries[coords] = (MAX_UINT64, MAX_UINT64)

    def is_empty(self) -> bool:
        return bool((self.entries[..., 0] == MAX_UINT64).all())

    def live(self) -> Iterator[tuple[Coords, int, int]]:
        """Live entries ``(coords, offset, nbytes)`` in C order of the local grid."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        flat = self.entries.reshape(-1, 2)
        idx = np.flatnonzero(flat[:, 0] != MAX_UINT64)
        if not idx.size:
            return iter(())
        cps = self.chunks_per_shard
        coords: Iterator[Coords] = (
            zip(*(c.tolist() for c in np.unravel_index(idx, cps))) if cps else iter([()] * len(idx))
        )
        return zip(coords, flat[idx, 0].tolist(), flat[idx, 1].tolist())

    def n_live(self) -> int:
        return int((self.entries[..., 0] != MAX_UINT64).sum())

    def live_nbytes(self) -> int:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        mask = self.entries[..., 0] != MAX_UINT64
        return int(self.entries[..., 1][mask].sum(dtype=np.uint64))

    def is_compact(self, object_size: int, *, checksum: bool = False, index_location: IndexLocation = "end") -> bool:
        """True when the object holds no dead bytes: live ranges tile the payload area exactly."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        n = index_nbytes(self.chunks_per_shard, checksum)
        start = n if index_location == "start" else 0
        flat = self.entries.reshape(-1, 2)
        live = flat[flat[:, 0] != MAX_UINT64]
        if len(live):
            ends = live[:, 0] + live[:, 1]
            order = np.lexsort((ends, live[:, 0]))  # as sorting (offset, end) pairs
            lo, hi = live[order, 0], ends[order]
            if int(lo[0]) != start or not np.array_equal(lo[1:], hi[:-1]):
                return False
            pos = int(hi[-1])
        else:
            pos = start
        return pos + (0 if index_location == "start" else n) == object_size


@functools.lru_cache(maxsize=256)
def _entries_struct(chunks_per_shard: tuple[int, ...]) -> tuple[int, struct.Struct]:
    """``(entries, unpacker of their 2·n uint64)`` of an index of this shape, made once per
    shape (:func:`n_entries` raises for a bad shape; an exception is never cached)."""
    n = n_entries(chunks_per_shard)
    return n, struct.Struct(f"<{2 * n}Q")


def _entries_ok(offsets: list[int], sizes: list[int], payload_start: int, payload_limit: int | None) -> bool:
    """Whether every entry passes :meth:`ShardIndex.validate`'s checks (``offsets`` may be
    changed in place: zarrita's wrapped empty entries become plain ones)."""
    if payload_start == 0:  # the draft layout: the same checks, with o >= 0 and no wrapped entry possible
        lim = MAX_UINT64 if payload_limit is None else min(payload_limit, MAX_UINT64)
        if MAX_UINT64 not in offsets:
            # no absent entry (a full shard): the loop's checks as scans in C, a third of
            # its time at 256 entries (a 2023 shard of 16x16 chunks)
            return MAX_UINT64 not in sizes and (not offsets or max(map(operator.add, offsets, sizes)) <= lim)
        for o, s in zip(offsets, sizes):
            if o == MAX_UINT64:
                if s != MAX_UINT64:
                    return False  # half sentinel
            elif s == MAX_UINT64 or o + s > lim:  # half sentinel, overflow, outside the payload area
                return False
        return True
    for i, (o, s) in enumerate(zip(offsets, sizes)):
        if s == MAX_UINT64 and payload_start and o == payload_start - 1:
            o = offsets[i] = MAX_UINT64  # zarrita's wrapped empty entry (_unwrap_empty_entries)
        if o == MAX_UINT64 and s == MAX_UINT64:
            continue
        if o == MAX_UINT64 or s == MAX_UINT64 or o > MAX_UINT64 - s or o < payload_start or (
            payload_limit is not None and o + s > payload_limit
        ):
            return False
    return True


def entry_lists(
    data: bytes | memoryview | np.ndarray,
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    key: str = "<shard>",
    payload_limit: int | None = None,
    payload_start: int = 0,
) -> tuple[list[int], list[int]]:
    """``(offsets, sizes)`` of every entry of an encoded index, flat in C order
    (``MAX_UINT64``: absent), validated exactly as :meth:`ShardIndex.from_bytes` validates
    (which raises the error when the index is bad).

    Plain Python: readers and copiers of whole shards want these lists anyway, and for the
    small indices of small shards numpy's per-call overhead is most of the cost of a check."""
    try:
        n, unpacker = _entries_struct(chunks_per_shard)
    except TypeError:  # an unhashable shape (a list): not cached
        n = n_entries(chunks_per_shard)
        unpacker = struct.Struct(f"<{2 * n}Q")
    body_n = ENTRY_NBYTES * n
    if len(data) == body_n + (CHECKSUM_NBYTES if checksum else 0):
        body = data if type(data) is bytes and not checksum else memoryview(data).cast("B")[:body_n]  # type: ignore[arg-type]  # numpy's stubs: ndarray is no Buffer
        if not checksum or int.from_bytes(bytes(data[-CHECKSUM_NBYTES:]), "little") == _crc32c.crc32c(body):
            values = unpacker.unpack(body)
            offsets, sizes = list(values[0::2]), list(values[1::2])
            if _entries_ok(offsets, sizes, payload_start, payload_limit):
                return offsets, sizes
    ShardIndex.from_bytes(
        bytes(data), chunks_per_shard, checksum=checksum, key=key, payload_limit=payload_limit,
        payload_start=payload_start,
    )
    raise AssertionError(f"{key}: entry_lists and ShardIndex.validate disagree")  # pragma: no cover


def live_entries(
    data: bytes | memoryview,
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    key: str = "<shard>",
    payload_limit: int | None = None,
    payload_start: int = 0,
) -> list[tuple[int, int]]:
    """The live ``(offset, nbytes)`` entries of an encoded index, in C order, validated as
    :func:`entry_lists` does (same keyword arguments). An index of more than
    :data:`LIST_ENTRIES` entries is checked with numpy (about the index's own size again),
    never as Python lists of every entry (~70 bytes each: 300 MB for a 64 MiB index)."""
    if math.prod(chunks_per_shard) > LIST_ENTRIES:
        index = ShardIndex.from_bytes(data, tuple(chunks_per_shard), checksum=checksum, key=key,
                                      payload_limit=payload_limit, payload_start=payload_start)
        flat = index.entries.reshape(-1, 2)
        return [(o, s) for o, s in flat[flat[:, 0] != MAX_UINT64].tolist()]
    offsets, sizes = entry_lists(data, chunks_per_shard, checksum=checksum, key=key, payload_limit=payload_limit,
                                 payload_start=payload_start)
    return [(o, s) for o, s in zip(offsets, sizes) if o != MAX_UINT64]


def _live_count(entries: tuple[int, ...], limit: int) -> int | None:
    """:func:`live_counts` of one index (``(offset, nbytes)`` pairs, flat), in Python."""
    live = 0
    for k in range(0, len(entries), 2):
        o, s = entries[k], entries[k + 1]
        if o == MAX_UINT64:
            if s != MAX_UINT64:
                return None
        elif s == MAX_UINT64 or o > limit or s > limit - o:
            return None
        else:
            live += 1
    return live


def live_counts(
    indices: Sequence[bytes], chunks_per_shard: tuple[int, ...], limits: Sequence[int], *, checksum: bool = False
) -> list[int | None]:
    """For each encoded index of a batch of shards with their index at the end (payload
    from byte 0 to ``limits[i]``), its number of live entries when it passes the checks of
    :func:`entry_lists` (the same ones: every live entry inside the payload area, no half
    sentinel, the checksum), else None: the caller then checks that one alone, which raises
    the error naming it. One numpy pass over the batch instead of Python lists per index
    (a virtual migration validates an index per shard and needs only the count); without
    numpy loaded (a command that needs it for nothing else), :func:`_live_count` per index."""
    n = n_entries(chunks_per_shard)
    body = ENTRY_NBYTES * n
    whole = body + (CHECKSUM_NBYTES if checksum else 0)
    out: list[int | None] = [None] * len(indices)
    rows = [i for i, data in enumerate(indices) if len(data) == whole and limits[i] >= 0 and (
        not checksum or int.from_bytes(data[body:], "little") == _crc32c.crc32c(data[:body]))]
    if not rows or n > LIST_ENTRIES:
        return out
    if "numpy" not in sys.modules:  # ~110 ms of import against ~4 µs an index of 16 entries
        unpack = struct.Struct(f"<{2 * n}Q").unpack_from
        for i in rows:
            out[i] = _live_count(unpack(indices[i]), min(limits[i], MAX_UINT64))
        return out
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)

    entries = np.frombuffer(b"".join([indices[i][:body] for i in rows]), "<u8").reshape(len(rows), n, 2)
    offsets, sizes = entries[..., 0], entries[..., 1]
    limit = np.minimum(np.array([limits[i] for i in rows], dtype=np.uint64), np.uint64(MAX_UINT64))[:, None]
    absent = offsets == np.uint64(MAX_UINT64)
    inside = (sizes != np.uint64(MAX_UINT64)) & (offsets <= limit) & (sizes <= limit - np.minimum(offsets, limit))
    good = np.where(absent, sizes == np.uint64(MAX_UINT64), inside).all(axis=1)
    live = (n - absent.sum(axis=1)).tolist()  # Python ints at once (no numpy scalar a shard)
    for i, ok, count in zip(rows, good.tolist(), live):
        if ok:
            out[i] = count
    return out


def tiles(live: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    """True when the ranges of ``live`` cover ``[start, end)`` exactly, without gaps or
    overlaps (an object with no dead bytes; see :meth:`ShardIndex.is_compact`).

    The ranges in their given order first (a shard written in C order chains as it is):
    a chain from ``start`` of sizes >= 0 has non-decreasing ``(offset, end)`` pairs, so it
    *is* their sorted order, and the sorted check would walk the same pairs. Otherwise
    that check decides."""
    pos = start
    for o, s in live:
        if o != pos or s < 0:
            break
        pos = o + s
    else:
        return pos == end
    pos = start
    for o, e in sorted([(o, o + s) for o, s in live]):
        if o != pos:
            return False
        pos = e
    return pos == end


def parse_indices(
    raws: Sequence[bytes | memoryview],
    chunks_per_shard: tuple[int, ...],
    *,
    keys: Sequence[str],
    payload_limits: Sequence[int | None] | None = None,
) -> np.ndarray:
    """Parse and validate many encoded draft indices (no checksum, payloads from byte 0) at once.

    Returns one ``(len(raws), n_entries, 2)`` uint64 table. The checks are
    :meth:`ShardIndex.validate`'s, done for every shard with a handful of array operations
    instead of a dozen numpy calls per shard; the first shard (in the given order) that
    fails is parsed again by :meth:`ShardIndex.from_bytes`, which raises its exact error.
    """
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    n = n_entries(chunks_per_shard)
    limits = [None] * len(raws) if payload_limits is None else list(payload_limits)
    expected = ENTRY_NBYTES * n
    for raw, key, limit in zip(raws, keys, limits):
        if len(raw) != expected:
            ShardIndex.from_bytes(raw, chunks_per_shard, key=key, payload_limit=limit)  # raises
    if not raws:
        return np.empty((0, n, 2), dtype=np.uint64)
    table = np.frombuffer(b"".join(raws), dtype="<u8").astype(np.uint64).reshape(len(raws), n, 2)
    bad = bad_rows(table, [MAX_UINT64 if x is None else x for x in limits])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ShardIndex.from_bytes(raws[i], chunks_per_shard, key=keys[i], payload_limit=limits[i])  # raises
        raise AssertionError(f"{keys[i]}: bulk index validation disagrees with ShardIndex.validate")  # pragma: no cover
    return table


def bad_rows(table: np.ndarray, payload_limits: Sequence[int], payload_start: int = 0) -> np.ndarray:
    """Per shard of an ``(n_shards, n_entries, 2)`` table: whether :meth:`ShardIndex.validate`
    would refuse it (half sentinels, ``offset + nbytes`` overflowing, or outside
    ``[payload_start, limit)``)."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    off, nb = table[..., 0], table[..., 1]
    off_empty = off == MAX_UINT64
    live = ~off_empty
    wrong = off_empty != (nb == MAX_UINT64)
    wrong |= live & (off > MAX_UINT64 - nb)  # overflow (dead entries have nb == MAX: 0 < off)
    limit = np.asarray(payload_limits, dtype=np.uint64)[:, None]
    with np.errstate(over="ignore"):
        ends = off + nb  # wraps only where the overflow check above already refused
    wrong |= live & ((off < np.uint64(payload_start)) | (ends > limit))
    rows: np.ndarray[Any, Any] = wrong.any(axis=1)
    return rows


def payload_bounds(
    object_size: int, chunks_per_shard: tuple[int, ...], *, checksum: bool = False, index_location: IndexLocation = "end"
) -> tuple[int, int]:
    """``(start, limit)`` of the bytes in an object of ``object_size`` that chunks may occupy."""
    n = index_nbytes(chunks_per_shard, checksum)
    return (n, object_size) if index_location == "start" else (0, object_size - n)


def read_index(
    data: bytes | memoryview,
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    index_location: IndexLocation = "end",
    key: str = "<shard>",
) -> ShardIndex:
    """Parse the index of a whole shard object held in memory."""
    n = index_nbytes(chunks_per_shard, checksum)
    if len(data) < n:
        raise ShardCorruptError(
            f"{key}: object is {len(data)} bytes, shorter than its {n}-byte shard index", key=key
        )
    raw = data[:n] if index_location == "start" else data[len(data) - n :]
    start, limit = payload_bounds(len(data), chunks_per_shard, checksum=checksum, index_location=index_location)
    return ShardIndex.from_bytes(
        raw, chunks_per_shard, checksum=checksum, key=key, payload_limit=limit, payload_start=start
    )


def encode_shard(
    chunks: Mapping[Coords, bytes | memoryview],
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    index_location: IndexLocation = "end",
) -> bytes:
    """Build a compact shard: live chunks in C order, no dead bytes, then (or before) the index.

    Returns ``b""`` when ``chunks`` is empty: callers delete the object instead of
    writing an all-empty shard.
    """
    return encode_shard_and_index(chunks, chunks_per_shard, checksum=checksum, index_location=index_location)[0]


def encode_shard_and_index(
    chunks: Mapping[Coords, bytes | memoryview],
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    index_location: IndexLocation = "end",
) -> tuple[bytes, ShardIndex]:
    """:func:`encode_shard`, also returning the index it wrote (writers cache it, no re-parse)."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    chunks_per_shard = tuple(chunks_per_shard)
    index = ShardIndex.empty(chunks_per_shard)
    if not chunks:
        return b"", index
    order = sorted(chunks)
    for coords in order:
        if len(coords) != len(chunks_per_shard) or any(not 0 <= c < n for c, n in zip(coords, chunks_per_shard)):
            raise UsageError(f"chunk coordinates {coords} are outside a shard of {chunks_per_shard} chunks")
    parts = [chunks[c] for c in order]
    sizes = np.fromiter((len(p) for p in parts), dtype=np.uint64, count=len(parts))
    start = index_nbytes(chunks_per_shard, checksum) if index_location == "start" else 0
    offsets = np.cumsum(sizes) - sizes + np.uint64(start)
    flat: Any
    if chunks_per_shard:
        flat = np.ravel_multi_index(tuple(np.array(order, dtype=np.int64).reshape(len(order), -1).T), chunks_per_shard)
    else:
        flat = np.zeros(1, np.int64)
    table = index.entries.reshape(-1, 2)
    table[flat, 0] = offsets
    table[flat, 1] = sizes
    idx = index.to_bytes(checksum=checksum)
    blob = b"".join([idx, *parts]) if index_location == "start" else b"".join([*parts, idx])
    return blob, index


def decode_shard(
    data: bytes | memoryview,
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    index_location: IndexLocation = "end",
    key: str = "<shard>",
) -> dict[Coords, bytes]:
    """All live chunks of a shard object, keyed by local coordinates."""
    index = read_index(data, chunks_per_shard, checksum=checksum, index_location=index_location, key=key)
    view = memoryview(data)
    return {coords: bytes(view[off : off + nb]) for coords, off, nb in index.live()}


def decode_chunk(
    data: bytes | memoryview,
    coords: Coords,
    chunks_per_shard: tuple[int, ...],
    *,
    checksum: bool = False,
    index_location: IndexLocation = "end",
    key: str = "<shard>",
) -> bytes | None:
    """One chunk's payload from a whole shard object, or ``None`` if it is empty."""
    index = read_index(data, chunks_per_shard, checksum=checksum, index_location=index_location, key=key)
    entry = index.get(tuple(coords))
    if entry is None:
        return None
    off, nb = entry
    return bytes(memoryview(data)[off : off + nb])


IndexReading = Literal["plain", "crc32c-hidden"]


def index_reading(
    tail: bytes | memoryview,
    chunks_per_shard: tuple[int, ...] | int,
    object_size: int | None = None,
    *,
    key: str = "<shard>",
) -> IndexReading:
    """Which reading of a shard object's end holds, for a document that does not declare its
    index codecs (the 2023 generation: zarrita wrote an undeclared CRC32C after every index
    from 2023-05-09 to 2023-07-15).

    ``tail``: the last ``16·n + 4`` bytes of the object (the whole object when it is
    shorter); ``chunks_per_shard``: the shard's chunk grid (or ``n``, its number of
    chunks); ``object_size``: the object's size (default ``len(tail)``: the tail is the
    whole object). The readings:

    * ``"plain"``: the last ``16·n`` bytes are a valid index for the object (every entry
      inside ``[0, object_size - 16·n)``, see :meth:`ShardIndex.validate`);
    * ``"crc32c-hidden"``: the last 4 bytes are the CRC32C (little endian) of the ``16·n``
      before them, and those are a valid index for the object minus ``16·n + 4`` bytes.

    Never guesses: :class:`ShardCorruptError` naming ``key`` when neither holds, or when
    both hold and their live ``(offset, nbytes)`` entries differ (when they are equal the
    chunks are the same either way and the checksum, which verified, is declared).
    """
    if isinstance(chunks_per_shard, int):
        n = chunks_per_shard
        if not 1 <= n <= MAX_INDEX_ENTRIES:
            raise UsageError(f"a shard of {n} chunks: expected 1 to {MAX_INDEX_ENTRIES}")
        cps: tuple[int, ...] = (n,)
    else:
        cps = tuple(chunks_per_shard)
        n = n_entries(cps)
    size = len(tail) if object_size is None else object_size
    body_n = ENTRY_NBYTES * n
    if len(tail) > size:
        raise UsageError(f"{key}: the tail ({len(tail)} bytes) is longer than the object ({size} bytes)")
    if len(tail) < min(size, body_n + CHECKSUM_NBYTES):
        raise UsageError(
            f"{key}: need the last {body_n + CHECKSUM_NBYTES} bytes of the object (or all {size}), got {len(tail)}"
        )
    readings, why = _undeclared_readings(memoryview(tail).cast("B"), cps, size, key)
    if len(readings) == 2:
        if readings["plain"] == readings["crc32c-hidden"]:
            return "crc32c-hidden"
        raise ShardCorruptError(
            f"{key}: the shard index reads validly both without and with a trailing CRC32C, and the two "
            "readings point to different chunk bytes: refusing to guess (the document declares no index_codecs)",
            key=key,
        )
    if readings:
        return next(iter(readings))
    raise ShardCorruptError(
        f"{key}: the shard index fits neither reading of an undeclared index: as {n} plain entries, "
        f"{why['plain']}; as {n} entries followed by a CRC32C, {why['crc32c-hidden']}",
        key=key,
    )


def _undeclared_readings(
    view: memoryview, cps: tuple[int, ...], size: int, key: str
) -> tuple[dict[IndexReading, list[tuple[int, int]]], dict[str, str]]:
    """The live entries of each reading of :func:`index_reading` that holds for the tail
    ``view`` of an object of ``size`` bytes, and why each other one does not."""
    body_n = ENTRY_NBYTES * n_entries(cps)
    readings: dict[IndexReading, list[tuple[int, int]]] = {}
    why: dict[str, str] = {}
    if size >= body_n:
        try:
            readings["plain"] = live_entries(view[len(view) - body_n :], cps, key=key, payload_limit=size - body_n)
        except ShardCorruptError as e:
            why["plain"] = str(e).removeprefix(f"{key}: ")
    else:
        why["plain"] = f"the object ({size} bytes) is shorter than a {body_n}-byte index"
    if size >= body_n + CHECKSUM_NBYTES:
        raw = view[len(view) - body_n - CHECKSUM_NBYTES :]
        stored = int.from_bytes(raw[body_n:], "little")
        actual = _crc32c.crc32c(raw[:body_n])
        if stored != actual:
            why["crc32c-hidden"] = f"the last 4 bytes ({stored:#010x}) are not the CRC32C of the index before them ({actual:#010x})"
        else:
            try:
                readings["crc32c-hidden"] = live_entries(
                    raw, cps, checksum=True, key=key, payload_limit=size - body_n - CHECKSUM_NBYTES
                )
            except ShardCorruptError as e:
                why["crc32c-hidden"] = str(e).removeprefix(f"{key}: ")
    else:
        why["crc32c-hidden"] = f"the object ({size} bytes) is shorter than a {body_n}-byte index and its checksum"
    return readings, why
