"""Draft-era stores for the migration tests, written with the project's own draft writer."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numcodecs
import numpy as np
import zarr

from sharding_store import create_draft_array, create_draft_group
from sharding_store.formats.shard_index import ShardIndex, index_nbytes, read_index
from sharding_store.stores import as_inner
from tests.fixtures import ZARR_JS, require

FIXTURES = ZARR_JS


def fixture_names() -> list[str]:
    return sorted(p.name for p in require(FIXTURES).iterdir() if p.name.endswith(".zarr"))


def tree_hash(root: str | os.PathLike) -> str:
    """One hash over every file name and content under ``root``."""
    h = hashlib.sha256()
    for directory, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def tree_bytes(root: str | os.PathLike) -> dict[str, bytes]:
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = Path(path).read_bytes()
    return out


def make_hierarchy(root: str | os.PathLike) -> dict[str, np.ndarray]:
    """A small hierarchy covering the migration cases; returns the values of each array.

    ``imgs/raw``: sharded 2-d gzip (portable), ragged; ``imgs/zl``: sharded zlib (not
    portable); ``tab/plain``: unsharded zlib, separator "."; ``lone/deep/dots``:
    sharded, separator ".", under implicit groups; ``scalar``: 0-d sharded.
    """
    root = str(root)
    rng = np.random.default_rng(7)
    values = {
        "imgs/raw": rng.integers(0, 1000, (37, 29)).astype("<u2"),
        "imgs/zl": np.arange(24 * 20, dtype="<f4").reshape(24, 20),
        "tab/plain": rng.normal(size=(30, 7)),
        "lone/deep/dots": np.arange(60, dtype="<i4").reshape(6, 10),
        "scalar": np.array(3.5),
    }
    create_draft_group(root, "", attrs={"title": "root"})
    create_draft_group(root, "imgs", attrs={"kind": "images"})
    specs = {
        "imgs/raw": dict(chunks=(4, 5), chunks_per_shard=(2, 2), compressor=numcodecs.GZip(1)),
        "imgs/zl": dict(chunks=(4, 4), chunks_per_shard=(3, 2), compressor=numcodecs.Zlib(1)),
        "tab/plain": dict(chunks=(8, 7), compressor=numcodecs.Zlib(1), dimension_separator="."),
        "lone/deep/dots": dict(chunks=(2, 3), chunks_per_shard=(2, 2), compressor=None, dimension_separator="."),
        "scalar": dict(chunks=(), chunks_per_shard=(), compressor=None),
    }
    for path, spec in specs.items():
        data = values[path]
        arr = create_draft_array(root, path, shape=data.shape, dtype=data.dtype, attrs={"name": path}, **spec)
        arr[...] = data
    return values


def make_big_array(root: str | os.PathLike, *, shards: int = 24, path: str = "big") -> np.ndarray:
    """One sharded array with ``shards`` shards of 4 chunks each (for kill/resume tests)."""
    data = np.arange(shards * 2 * 8 * 8, dtype="<i4").reshape(shards * 2 * 4, 2 * 8)
    create_draft_array(root, path, shape=data.shape, chunks=(4, 8), chunks_per_shard=(2, 2),
                       dtype=data.dtype, compressor=numcodecs.GZip(1))[...] = data
    return data


def make_two_sources(root: Path, *, shards: int = 6) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Two draft sources ``one`` and ``two`` under ``root`` with the same layout and different
    values (a destination mixing them reads wrong values): name -> (path, values by array)."""
    out = {}
    for name, scale in (("one", 1), ("two", 3)):
        src = root / name
        values = make_hierarchy(src)
        values["big"] = make_big_array(src, shards=shards)
        arr = create_draft_array(str(src), "mark", shape=(4,), chunks=(2,), dtype="<i4", chunks_per_shard=(2,))
        arr[...] = np.full(4, scale, dtype="<i4")
        values["mark"] = np.full(4, scale, dtype="<i4")
        out[name] = (src, values)
    return out


def add_dead_bytes(root: str | os.PathLike, shard_key: str, cps: tuple[int, ...], drop: tuple[int, ...]) -> int:
    """Delete one chunk as zarr-python 2.18 does: rewrite only the index (its bytes stay).

    Returns the number of dead bytes left in the object.
    """
    inner = as_inner(str(root))
    blob = inner.get(shard_key)
    assert blob is not None
    index = read_index(blob, cps, key=shard_key)
    entry = index.get(drop)
    assert entry is not None
    entries = index.entries.copy()
    entries[drop] = (2**64 - 1, 2**64 - 1)
    n = index_nbytes(cps)
    inner.set(shard_key, blob[:-n] + ShardIndex(entries).to_bytes())
    return entry[1]


def read_v3(root: str | os.PathLike, path: str) -> np.ndarray:
    return zarr.open_array(str(root), path=path, mode="r")[...]


class PartialMapping(dict):
    """A zarr-python 2 style store (``get_partial_values``): its tails tell no version, so the
    engine compares a second read of the index instead."""

    def get_partial_values(self, key_ranges):
        out = []
        for key, (start, length) in key_ranges:
            data = dict.get(self, key)
            if data is None:
                out.append(None)
                continue
            lo = max(0, len(data) + start) if start < 0 else start
            out.append(data[lo:] if length is None else data[lo : lo + length])
        return out
