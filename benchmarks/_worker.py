"""One timed benchmark task, run in its own process in the PROJECT venv.

Usage: ``python benchmarks/_worker.py '<json spec>'``. Prints one line
``RESULT {json}`` on stdout. Times only the operation itself (imports, loading the
input .npy and verification are outside the timed region). Called by run.py; never
imported by it (so that every competitor pays the same process set-up, outside the
timer).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time

import numpy as np


def _load(spec: dict) -> np.ndarray:
    return np.load(spec["input"])  # fully in memory before any timer starts


def _rm(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _cpu() -> float:
    """CPU seconds of this process so far, user + system, all its threads: on a loaded
    machine a reader's wall time depends on how many threads it runs (each gets a share of
    the cores), its CPU time much less (scenario 2 reports both)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _same(y: np.ndarray, spec: dict) -> bool:
    x = np.load(spec["input"], mmap_mode="r")
    return bool(y.shape == x.shape and y.dtype == x.dtype and np.array_equal(y, x))


# ---------------------------------------------------------------- codecs per library


def draft_compressor(codec: str):
    import numcodecs

    if codec == "lz4":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    if codec == "zstd":
        return numcodecs.Zstd(level=1)
    raise ValueError(codec)


def zarr3_compressors(codec: str, itemsize: int):
    from zarr.codecs import BloscCodec, ZstdCodec

    if codec == "lz4":
        return [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=itemsize, blocksize=0)]
    if codec == "zstd":
        return [ZstdCodec(level=1, checksum=False)]
    raise ValueError(codec)


def ts_compressor(codec: str, itemsize: int) -> dict:
    if codec == "lz4":
        return {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle",
                                                    "typesize": itemsize, "blocksize": 0}}
    if codec == "zstd":
        return {"name": "zstd", "configuration": {"level": 1, "checksum": False}}
    raise ValueError(codec)


def _shard_shape(spec: dict) -> list[int]:
    return [c * n for c, n in zip(spec["chunks"], spec["cps"])]


def write_zarr3_array(dst: str, x: np.ndarray, spec: dict) -> None:
    import zarr

    a = zarr.create_array(
        store=dst, name="a", shape=x.shape, dtype=x.dtype, chunks=tuple(spec["chunks"]),
        shards=tuple(_shard_shape(spec)), compressors=zarr3_compressors(spec["codec"], x.dtype.itemsize),
        filters=None, fill_value=0, zarr_format=3, overwrite=True,
    )
    a[...] = x


def _read_any(path: str) -> np.ndarray:
    """Read array 'a' of a store in whatever format it is (draft or v1.0)."""
    try:
        from sharding_store.api.arrays import open_draft

        return open_draft(path, "a")[...]
    except Exception:  # noqa: BLE001 - not a draft store: try v1.0
        import zarr

        return zarr.open_array(path, path="a", mode="r")[...]


# ---------------------------------------------------------------- tasks


def task_write_ours(spec: dict) -> dict:
    from sharding_store.api.arrays import create_draft_array

    x = _load(spec)
    dst = spec["dst"]
    _rm(dst)
    t0 = time.perf_counter()
    a = create_draft_array(dst, "a", shape=x.shape, chunks=tuple(spec["chunks"]), dtype=x.dtype,
                           chunks_per_shard=tuple(spec["cps"]), compressor=draft_compressor(spec["codec"]))
    a[...] = x
    dt = time.perf_counter() - t0
    out = {"seconds": dt}
    if spec.get("verify"):
        out["verified"] = _same(_read_any(dst), spec)
    return out


def task_write_zarr3(spec: dict) -> dict:
    x = _load(spec)
    dst = spec["dst"]
    _rm(dst)
    t0 = time.perf_counter()
    write_zarr3_array(dst, x, spec)
    dt = time.perf_counter() - t0
    out = {"seconds": dt}
    if spec.get("verify"):
        out["verified"] = _same(_read_any(dst), spec)
    return out


def task_write_ts(spec: dict) -> dict:
    import tensorstore as ts

    x = _load(spec)
    dst = spec["dst"]
    _rm(dst)
    itemsize = x.dtype.itemsize
    meta = {
        "shape": list(x.shape),
        "data_type": {"u2": "uint16", "f4": "float32"}[spec["dtype"]],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": _shard_shape(spec)}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(spec["chunks"]),
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       ts_compressor(spec["codec"], itemsize)],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}],
    }
    t0 = time.perf_counter()
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": dst + "/a/"}, "metadata": meta},
                  create=True, delete_existing=True).result()
    arr.write(x).result()
    dt = time.perf_counter() - t0
    out = {"seconds": dt}
    if spec.get("verify"):
        out["verified"] = _same(_read_any(dst), spec)
    return out


def task_read_ours(spec: dict) -> dict:
    from sharding_store.api.arrays import open_draft

    t0, c0 = time.perf_counter(), _cpu()
    y = open_draft(spec["src"], "a")[...]
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "cpu_s": _cpu() - c0}
    if spec.get("verify"):
        out["verified"] = _same(y, spec)
    return out


def task_read_v3view(spec: dict) -> dict:
    from sharding_store.api.v3view import open_v3

    t0, c0 = time.perf_counter(), _cpu()
    y = open_v3(spec["src"], "a")[...]
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "cpu_s": _cpu() - c0}
    if spec.get("verify"):
        out["verified"] = _same(y, spec)
    return out


def task_read_ts(spec: dict) -> dict:
    import tensorstore as ts

    t0, c0 = time.perf_counter(), _cpu()
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": spec["src"] + "/a/"}},
                  read=True).result()
    y = arr.read().result()
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "cpu_s": _cpu() - c0}
    if spec.get("verify"):
        out["verified"] = _same(y, spec)
    return out


def task_read_zarr3(spec: dict) -> dict:
    import zarr

    t0, c0 = time.perf_counter(), _cpu()
    y = zarr.open_array(spec["src"], path="a", mode="r")[...]
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "cpu_s": _cpu() - c0}
    if spec.get("verify"):
        out["verified"] = _same(y, spec)
    return out


def task_read_zarrs(spec: dict) -> dict:
    """zarr-python 3 with the zarrs codec pipeline (Rust: decodes a shard's chunks in
    parallel) on the same v1.0 copy: the third independent reader of scenario 2."""
    import zarr
    import zarrs  # noqa: F401 - registers zarrs.ZarrsCodecPipeline

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    t0, c0 = time.perf_counter(), _cpu()
    y = zarr.open_array(spec["src"], path="a", mode="r")[...]
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "cpu_s": _cpu() - c0}
    if spec.get("verify"):
        out["verified"] = _same(y, spec)
    return out


def chunk_targets(spec: dict) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(cold chunk, warm chunk) pairs: the middle chunk of a shard, then its neighbour in
    the same shard; one pair per shard, up to spec['iterations'] shards, spread out."""
    shape, chunks, cps = spec["shape"], spec["chunks"], spec["cps"]
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    sgrid = [-(-g // n) for g, n in zip(grid, cps)]
    shards = [(i, j) for i in range(sgrid[0]) for j in range(sgrid[1])]
    step = max(1, len(shards) // spec["iterations"])
    pairs = []
    for si, sj in shards[::step][: spec["iterations"]]:
        ci = min(si * cps[0] + cps[0] // 2, grid[0] - 1)
        cj = min(sj * cps[1] + cps[1] // 2, grid[1] - 1)
        wj = cj - 1 if cj - 1 >= sj * cps[1] else cj  # neighbour in the same shard (cps 1: itself)
        pairs.append(((ci, cj), (ci, wj)))
    return pairs


def task_chunk_ours(spec: dict) -> dict:
    from sharding_store.api.arrays import open_draft
    from sharding_store.stores import as_inner
    from sharding_store.testing import CountingInner

    x = np.load(spec["input"], mmap_mode="r")
    ch = spec["chunks"]
    inner = CountingInner(as_inner(spec["src"]))
    cold, warm, ok = [], [], True
    for c_cold, c_warm in chunk_targets(spec):
        a = open_draft(inner, "a")  # fresh array: nothing cached
        for _kind, (ci, cj), acc in (("cold", c_cold, cold), ("warm", c_warm, warm)):
            sel = (slice(ci * ch[0], (ci + 1) * ch[0]), slice(cj * ch[1], (cj + 1) * ch[1]))
            inner.reset()
            t0 = time.perf_counter()
            y = a[sel]
            dt = time.perf_counter() - t0
            acc.append({"seconds": dt, "requests": inner.reads, "bytes": inner.bytes_read,
                        "calls": dict(inner.calls)})
            ok = ok and bool(np.array_equal(y, x[sel]))
    return {"cold": cold, "warm": warm, "verified": ok}


def task_reencode(spec: dict) -> dict:
    """Decode the draft array with open_draft, re-encode it as v1.0 sharded with zarr 3."""
    from sharding_store.api.arrays import open_draft

    t0 = time.perf_counter()
    x = open_draft(spec["src"], "a")[...]
    write_zarr3_array(spec["dst"], x, spec)
    return {"seconds": time.perf_counter() - t0}


def task_migrate_fn(spec: dict) -> dict:
    """sharding_store.ops.migration.migrate() alone, default jobs, verify as asked, timed in-process."""
    from sharding_store.ops.migration import migrate

    _rm(spec["dst"])
    t0 = time.perf_counter()
    migrate(spec["src"], spec["dst"], progress=False, verify=spec.get("migrate_verify", True))
    dt = time.perf_counter() - t0
    out = {"seconds": dt}
    if spec.get("verify"):
        out["verified"] = _same(_read_any(spec["dst"]), spec)
    return out


def task_verify(spec: dict) -> dict:
    return {"verified": _same(_read_any(spec["src"]), spec)}


def task_probe(spec: dict) -> dict:
    """What the project venv can offer right now (modules appear while we run)."""
    import importlib
    import inspect

    found = {}
    for mod, names in (("sharding_store.api.arrays", ["open_draft", "create_draft_array"]),
                       ("sharding_store.api.v3view", ["open_v3"]),
                       ("sharding_store.ops.migration", ["migrate"]),
                       ("sharding_store.ops.resharding", ["reshard"]),
                       ("sharding_store.cli.migrate", ["register"]),
                       ("sharding_store.cli.reshard", ["register"])):
        try:
            m = importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - missing or half-written module
            for n in names:
                found[f"{mod}.{n}"] = f"missing: {type(e).__name__}: {e}"
            continue
        for n in names:
            found[f"{mod}.{n}"] = True if hasattr(m, n) else "missing attribute"
    jobs = None
    try:
        from sharding_store.ops.migration import migrate

        p = inspect.signature(migrate).parameters.get("jobs")
        jobs = None if p is None else p.default
    except Exception:  # noqa: BLE001
        pass
    try:
        mm = importlib.import_module("sharding_store.ops.migration")

        jobs_default = getattr(mm, "DEFAULT_JOBS", None)
        if jobs_default is None and hasattr(mm, "default_jobs"):
            try:
                jobs_default = mm.default_jobs(local=True)  # the benchmark migrates between local paths
            except TypeError:
                jobs_default = mm.default_jobs()
    except Exception:  # noqa: BLE001
        jobs_default = None
    import importlib.util

    return {"available": found, "migrate_jobs_default": jobs, "migrate_DEFAULT_JOBS": jobs_default,
            "cpu_count": os.cpu_count(), "zarrs": importlib.util.find_spec("zarrs") is not None}


def task_versions(spec: dict) -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("numpy", "zarr", "tensorstore", "zarrs", "numcodecs", "matplotlib", "psutil", "sharding-store"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    try:
        import threadpoolctl

        out["blas"] = [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                       for i in threadpoolctl.threadpool_info()]
    except ImportError:
        out["blas"] = "threadpoolctl not installed"
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    fn = globals()["task_" + spec["task"]]
    result = fn(spec)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
