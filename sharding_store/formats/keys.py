"""Draft-era chunk keys and their mapping to shard keys (pure functions).

A draft chunk key is ``<data prefix>c<i0><sep><i1>...`` with ``<data prefix>`` =
``data/root/<array path>/`` (``data/root/`` for the root array). A 0-d array's only
chunk is ``c0`` as zarr-python 2.x wrote it (``c`` in the spec draft); both are read.
The sharding transformer keeps the key shape and divides the grid position by
``chunks_per_shard``: ``c96/18`` with ``[32, 2]`` lives in shard ``c3/9``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

Coords = tuple[int, ...]


def parse_chunk_suffix(suffix: str, separator: str, ndim: int) -> Coords | None:
    """``"c1/0"`` -> ``(1, 0)``; ``None`` if ``suffix`` is not a chunk key of an ``ndim``-d array."""
    if ndim == 0:
        return () if suffix in ("c", "c0") else None
    match = chunk_key_pattern(separator, ndim).fullmatch(suffix)  # one C call checks every part
    return None if match is None else tuple(map(int, match.groups()))


#: per ``(separator, ndim, prefix)``, :func:`chunk_key_pattern`
_PATTERNS: dict[tuple[str, int, str], re.Pattern[str]] = {}


def chunk_key_pattern(separator: str, ndim: int, prefix: str = "") -> re.Pattern[str]:
    """The pattern of the chunk keys of an ``ndim``-d array (``ndim >= 1``) under ``prefix``:
    ``c``, then ``ndim`` plain ASCII decimal parts without leading zeros (no sign, no
    whitespace: "01" is another key) joined by ``separator``, each part a group; compiled
    once (:func:`parse_chunk_suffix`'s rule, and the one of a layout's whole keys)."""
    got = _PATTERNS.get((separator, ndim, prefix))
    if got is None:
        part = "(0|[1-9][0-9]*)"
        if len(_PATTERNS) >= 1024:  # a cache, not a record (one entry per array's prefix)
            _PATTERNS.clear()
        got = _PATTERNS[separator, ndim, prefix] = re.compile(
            f"{re.escape(prefix)}c{part}{f'{re.escape(separator)}{part}' * (ndim - 1)}")
    return got


def _coords(parts: list[str], ndim: int) -> Coords | None:
    """The coordinates the parts of a key spell, or None: plain decimal digits only (no
    sign, no whitespace, no leading zeros: "01" is another key), ``ndim`` of them."""
    if len(parts) != ndim:
        return None
    coords = []
    for p in parts:
        if not p.isascii() or not p.isdigit() or (len(p) > 1 and p[0] == "0"):
            return None
        coords.append(int(p))
    return tuple(coords)


def format_chunk_suffix(coords: Coords, separator: str, *, zero_d: str = "c0") -> str:
    """Inverse of :func:`parse_chunk_suffix`; a 0-d key is ``zero_d`` (``c0`` as zarr-python 2.x)."""
    if not coords:
        return zero_d
    return "c" + separator.join(str(int(c)) for c in coords)


def chunk_to_shard(coords: Coords, chunks_per_shard: Coords) -> tuple[Coords, Coords]:
    """Split global chunk coordinates into ``(shard coords, coords within the shard)``."""
    shard = tuple(c // n for c, n in zip(coords, chunks_per_shard))
    local = tuple(c % n for c, n in zip(coords, chunks_per_shard))
    return shard, local


def shard_chunks(shard: Coords, chunks_per_shard: Coords, grid_shape: Coords | None = None) -> Iterator[Coords]:
    """Global coordinates of the chunks a shard may hold, in C order, limited to ``grid_shape``."""
    ranges = []
    for d, (s, n) in enumerate(zip(shard, chunks_per_shard)):
        lo, hi = s * n, (s + 1) * n
        if grid_shape is not None:
            hi = min(hi, grid_shape[d])
        ranges.append(range(lo, hi))
    return itertools.product(*ranges)


def local_to_global(shard: Coords, local: Coords, chunks_per_shard: Coords) -> Coords:
    return tuple(s * n + c for s, n, c in zip(shard, chunks_per_shard, local))


def prefix_coords(rest: str, separator: str) -> tuple[Coords, bool] | None:
    """Leading chunk coordinates fixed by a listing prefix inside an array's data prefix.

    ``rest`` is the part of the prefix after the data prefix. Returns the coordinates
    of the complete components (``"c1/2/"`` -> ``(1, 2)``), and whether the prefix ends
    exactly at a component boundary; ``None`` if no chunk key can start with ``rest``.
    Incomplete components (``"c1"`` is a prefix of ``c1/...`` and ``c10/...``) fix nothing.
    """
    if rest == "":
        return (), True
    if not rest.startswith("c"):
        return None
    parts = rest[1:].split(separator)
    complete, tail = parts[:-1], parts[-1]
    coords = []
    for p in complete:
        if not p.isascii() or not p.isdigit():
            return None
        coords.append(int(p))
    if tail and not (tail.isascii() and tail.isdigit()):
        return None
    return tuple(coords), tail == ""


# --------------------------------------------------------------------------- v3 key encodings
#: how a chunk key spells its coordinates after the array's prefix: the 2022 drafts' ``c1/0``
#: (0-d ``c0``, see above), final v3 ``default`` (``c/1/0``, 0-d ``c``) and ``v2`` (``1.0``, 0-d ``0``)
KEY_HEADS = {"draft": "c", "default": "c{sep}", "v2": ""}
ZERO_D_KEYS = {"draft": "c0", "default": "c", "v2": "0"}


def key_head(encoding: str, separator: str) -> str:
    """What every key of an ``ndim >= 1`` array starts with after its prefix."""
    return KEY_HEADS[encoding].format(sep=separator)


def format_key_suffix(coords: Coords, encoding: str, separator: str) -> str:
    """Chunk key suffix of ``coords`` in ``encoding`` (``"draft"``: :func:`format_chunk_suffix`)."""
    if encoding == "draft":
        return format_chunk_suffix(coords, separator)
    if not coords:
        return ZERO_D_KEYS[encoding]
    return key_head(encoding, separator) + separator.join(str(int(c)) for c in coords)


def parse_key_suffix(suffix: str, encoding: str, separator: str, ndim: int) -> Coords | None:
    """Inverse of :func:`format_key_suffix`; ``None`` if ``suffix`` is not such a key."""
    if encoding == "draft":
        return parse_chunk_suffix(suffix, separator, ndim)
    if ndim == 0:
        return () if suffix == ZERO_D_KEYS[encoding] else None
    head = key_head(encoding, separator)
    if not suffix.startswith(head):
        return None
    return _coords(suffix[len(head) :].split(separator), ndim)
