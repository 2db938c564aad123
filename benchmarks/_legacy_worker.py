"""One timed task with zarr-python 2.18.7's draft sharding transformer.

Runs in the LEGACY venv (compat/.venv-legacy) with ZARR_V3_EXPERIMENTAL_API=1 and
ZARR_V3_SHARDING=1 (run.py sets both). Usage: ``python _legacy_worker.py '<json>'``;
prints ``RESULT {json}``. Imports nothing from the project. The store is 2.18's own
``DirectoryStoreV3`` (what ``zarr.open_array(path, zarr_version=3)`` uses for a local
path; ``FSStoreV3`` would need fsspec, which the legacy venv does not have).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import warnings

warnings.simplefilter("ignore")

import numcodecs  # noqa: E402
import numpy as np  # noqa: E402
import zarr  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer  # noqa: E402


class CountingDirectoryStoreV3(DirectoryStoreV3):
    """Counts the requests that reach the directory store (and the bytes they return)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reset()

    def reset(self):
        self.requests = 0
        self.bytes_read = 0
        self.calls = {}

    def _count(self, name, n):
        self.calls[name] = self.calls.get(name, 0) + 1
        self.bytes_read += n

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.requests += 1
        self._count("getitem", len(value))
        return value

    def get_partial_values(self, key_ranges):
        key_ranges = list(key_ranges)
        out = super().get_partial_values(key_ranges)  # DirectoryStoreV3: whole gets, counted above
        self._count("get_partial_values", 0)
        return out

    def __contains__(self, key):
        self._count("contains", 0)
        return super().__contains__(key)


def draft_compressor(codec):
    if codec == "lz4":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    if codec == "zstd":
        return numcodecs.Zstd(level=1)
    raise ValueError(codec)


def _same(y, spec):
    x = np.load(spec["input"], mmap_mode="r")
    return bool(y.shape == x.shape and y.dtype == x.dtype and np.array_equal(y, x))


def _open(path, store_cls=DirectoryStoreV3):
    store = store_cls(path)
    return store, zarr.open_array(store, mode="r", zarr_version=3, path="a")


def task_write(spec):
    x = np.load(spec["input"])
    dst = spec["dst"]
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    z = zarr.create(x.shape, chunks=tuple(spec["chunks"]), dtype=x.dtype, store=DirectoryStoreV3(dst), path="a",
                    zarr_version=3, compressor=draft_compressor(spec["codec"]), fill_value=0,
                    storage_transformers=[ShardingStorageTransformer("indexed", chunks_per_shard=tuple(spec["cps"]))])
    z[...] = x
    dt = time.perf_counter() - t0
    out = {"seconds": dt}
    if spec.get("verify"):
        out["verified"] = _same(_open(dst)[1][...], spec)
    return out


def task_read(spec):
    t0 = time.perf_counter()
    _, z = _open(spec["src"])
    y = z[...]
    dt = time.perf_counter() - t0
    out = {"seconds": dt}
    if spec.get("verify"):
        out["verified"] = _same(y, spec)
    return out


def chunk_targets(spec):
    shape, chunks, cps = spec["shape"], spec["chunks"], spec["cps"]
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    sgrid = [-(-g // n) for g, n in zip(grid, cps)]
    shards = [(i, j) for i in range(sgrid[0]) for j in range(sgrid[1])]
    step = max(1, len(shards) // spec["iterations"])
    pairs = []
    for si, sj in shards[::step][: spec["iterations"]]:
        ci = min(si * cps[0] + cps[0] // 2, grid[0] - 1)
        cj = min(sj * cps[1] + cps[1] // 2, grid[1] - 1)
        wj = cj - 1 if cj - 1 >= sj * cps[1] else cj
        pairs.append(((ci, cj), (ci, wj)))
    return pairs


def task_chunk(spec):
    x = np.load(spec["input"], mmap_mode="r")
    ch = spec["chunks"]
    cold, warm, ok = [], [], True
    for c_cold, c_warm in chunk_targets(spec):
        store, z = _open(spec["src"], CountingDirectoryStoreV3)
        for (ci, cj), acc in ((c_cold, cold), (c_warm, warm)):
            sel = (slice(ci * ch[0], (ci + 1) * ch[0]), slice(cj * ch[1], (cj + 1) * ch[1]))
            store.reset()
            t0 = time.perf_counter()
            y = z[sel]
            dt = time.perf_counter() - t0
            acc.append({"seconds": dt, "requests": store.requests, "bytes": store.bytes_read,
                        "calls": dict(store.calls)})
            ok = ok and bool(np.array_equal(y, x[sel]))
    return {"cold": cold, "warm": warm, "verified": ok}


def task_verify(spec):
    return {"verified": _same(_open(spec["src"])[1][...], spec)}


def task_versions(spec):
    return {"zarr": zarr.__version__, "numcodecs": numcodecs.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0]}


def main():
    spec = json.loads(sys.argv[1])
    result = globals()["task_" + spec["task"]](spec)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
