"""Benchmark scenario 9 (``--only xarray``): open and load a draft dataset through xarray.

A dataset as xarray of the draft era wrote it (a ``uint16`` image ``(y, x)`` with
``_ARRAY_DIMENSIONS``, sharded, blosc-lz4, plus float64 ``y``/``x`` coordinates; no fill
value, as xarray writes integers without ``_FillValue``) is opened and fully loaded:

* ``xr.open_dataset(draft, engine="sharding_store").load()`` (ours);
* ``open_draft(draft, "image")[...]`` plus its coordinates: the reader the backend is
  built on, so the backend's own cost is the difference (target: at ``open_draft`` speed);
* ``xr.open_zarr(v1 copy).load()`` on ``sharding-store migrate``'s output with
  zarr-python 3's default codec pipeline, and with the zarrs (Rust) pipeline;
* ``xr.open_zarr(open_v3(draft).store)``: what a user had before the backend (context).

All are loaded without dask (``chunks=None``): the same single-process read for each.
Each competitor runs in its own process (``python benchmarks/scn_xarray.py '<spec>'``
prints ``RESULT {json}``), timed from before ``open`` to after ``load``; imports, one
untimed ``open`` without ``load`` first (xarray, pandas and zarr import modules on first
use: ~0.1-0.5 s that every competitor would pay once per process) and the check against
the input are outside the timer.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
INNER = (64, 64)
CPS = (16, 16)


# ------------------------------------------------------------------- worker side (one process per run)


def _zarr3_ds(path: str, pipeline: str | None) -> Any:
    import xarray as xr
    import zarr

    if pipeline == "zarrs":
        import zarrs  # noqa: F401 - registers the pipeline

        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no consolidated metadata
        xr.open_zarr(path, consolidated=False, chunks=None)  # warm-up: first-use imports, not timed
        t0 = time.perf_counter()
        ds = xr.open_zarr(path, consolidated=False, chunks=None).load()
    return ds, time.perf_counter() - t0


def task(spec: dict) -> dict:
    import numpy as np

    which, src = spec["which"], spec["src"]
    if which == "engine":
        import xarray as xr

        from sharding_store.xarray_backend import ShardingStoreBackendEntrypoint

        xr.open_dataset(src, engine=ShardingStoreBackendEntrypoint)  # warm-up: first-use imports, not timed
        t0 = time.perf_counter()
        ds = xr.open_dataset(src, engine=ShardingStoreBackendEntrypoint).load()
        dt = time.perf_counter() - t0
        image = ds["image"].values
    elif which == "open_draft":
        from sharding_store import open_draft

        open_draft(src, "image")  # warm-up: first-use imports, not timed
        t0 = time.perf_counter()
        image = open_draft(src, "image")[...]
        _ = open_draft(src, "y")[...], open_draft(src, "x")[...]
        dt = time.perf_counter() - t0
    elif which in ("zarr3", "zarrs"):
        ds, dt = _zarr3_ds(src, which if which == "zarrs" else None)
        image = ds["image"].values
    elif which == "v3view":
        import xarray as xr

        from sharding_store import open_v3

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            xr.open_zarr(open_v3(src).store, consolidated=False, chunks=None)  # warm-up, not timed
            t0 = time.perf_counter()
            ds = xr.open_zarr(open_v3(src).store, consolidated=False, chunks=None).load()
            dt = time.perf_counter() - t0
        image = ds["image"].values
    else:
        raise ValueError(which)
    ok = None
    if spec.get("verify"):
        x = np.load(spec["input"], mmap_mode="r")
        ok = bool(image.shape == x.shape and image.dtype == x.dtype and np.array_equal(image, x))
    return {"seconds": dt, "verified": ok}


# ------------------------------------------------------------------- runner side (run.py's Bench)


def make_dataset(input_npy: Path, dst: Path) -> None:
    """The draft dataset (untimed): written by ``create_draft_array`` as xarray 2024 over
    zarr 2.18 would have written it (``_ARRAY_DIMENSIONS``; integer data without a fill)."""
    import numcodecs
    import numpy as np

    from sharding_store import create_draft_array, create_draft_group

    x = np.load(input_npy)
    shutil.rmtree(dst, ignore_errors=True)
    create_draft_group(str(dst), "", {"title": "benchmark image"})
    lz4 = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    a = create_draft_array(str(dst), "image", shape=x.shape, chunks=INNER, chunks_per_shard=CPS, dtype=x.dtype,
                           compressor=lz4, fill_value=None, attrs={"_ARRAY_DIMENSIONS": ["y", "x"], "units": "counts"})
    a[...] = x
    for name, n in zip(("y", "x"), x.shape):
        c = create_draft_array(str(dst), name, shape=(n,), chunks=(n,), dtype="<f8", compressor=lz4,
                               fill_value=float("nan"), attrs={"_ARRAY_DIMENSIONS": [name], "units": "um"})
        c[...] = np.arange(n) * 0.65


def run_one(run_task_env: dict, spec: dict, timeout: float, preexec) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__)), json.dumps(spec)], env=run_task_env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(HERE.parent), preexec_fn=preexec)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise RuntimeError(f"exit {proc.returncode}: {tail}")


def scenario(bench: Any, case: Any, rt: Any) -> None:
    """Bench.s_xarray: ``rt`` is run.py itself (its helpers: measure, make_row, ...)."""
    d = bench.case_dir(case)
    draft, v1 = d / "xr-draft", d / "xr-v1"
    inp = bench.input_path(case)
    make_dataset(inp, draft)
    shutil.rmtree(v1, ignore_errors=True)
    rt.run_command([str(rt.VENV_BIN / "sharding-store"), "migrate", str(draft), str(v1)])

    def comp(name: str, which: str, src: Path, **kw: Any) -> Any:
        def fn(verify: bool) -> dict:
            spec = {"which": which, "src": str(src), "input": str(inp), "verify": verify}
            try:
                return run_one(rt._env(), spec, rt.TASK_TIMEOUT, rt._prio)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                raise rt.TaskError(str(e)) from None
        return rt.Competitor(name, fn, **kw)

    comps = [
        comp("engine", "engine", draft),
        comp("open_draft", "open_draft", draft),
        comp("zarr3", "zarr3", v1),
        comp("zarrs", "zarrs", v1, skip=None if importlib.util.find_spec("zarrs") else "not available (zarrs)"),
        comp("v3view", "v3view", draft, budget=rt.INFO_BUDGET_S),
    ]
    m = rt.measure(comps, bench.reps(case), not bench.args.quick, bench.log)
    ours = 'xr.open_dataset(engine="sharding_store").load()'
    applies = case.size_mib >= rt.TARGET_MIB
    note = "" if applies else rt.STATED_AT
    bench.rows += [
        rt.make_row("9 xarray", case, ours, m["engine"], "open_draft(...)[...] (same data)", m["open_draft"],
                    target="≤ 1.1× open_draft's time", min_speedup=1 / 1.1, applies=applies, note=note),
        rt.make_row("9 xarray", case, ours, m["engine"], "xr.open_zarr, zarr-python 3 (v1.0 copy)", m["zarr3"],
                    target="faster", min_speedup=1.0, applies=applies, note=note),
        rt.make_row("9 xarray", case, ours, m["engine"], "xr.open_zarr, zarrs pipeline (v1.0 copy)", m["zarrs"]),
        rt.make_row("9 xarray", case, ours, m["engine"], "xr.open_zarr(open_v3(draft).store)", m["v3view"],
                    note="what users had before the backend"),
    ]


if __name__ == "__main__":
    result = task(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
