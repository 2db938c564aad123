"""Write draft-era Zarr v3 datasets with xarray 2024.7 over zarr-python 2.18.7, as users did.

Runs in the legacy virtualenv (compat/setup_legacy.sh; ZARR_V3_EXPERIMENTAL_API=1 and
ZARR_V3_SHARDING=1 set by compat/oracle.py):

    python write_xarray.py OUT_DIR

writes ``OUT_DIR/<case>.zr3`` with ``Dataset.to_zarr(..., zarr_version=3)`` and, for each,
what xarray 2024.7 itself reads back (``xr.open_zarr(..., zarr_version=3)``, CF-decoded)
as ``OUT_DIR/<case>.expected/<group>.npz`` (every variable's values, datetimes as int64
nanoseconds) and ``<group>.json`` (dims, dtypes, coordinate names, attributes of
variables and dataset, encodings that matter), so the other side compares without xarray
of that time. ``OUT_DIR/manifest.json`` lists the cases, groups and library versions.

xarray 2024.7 cannot pass a storage transformer through ``encoding``: the sharded
variable is created by zarr 2.18 (``storage_transformers=[ShardingStorageTransformer]``,
with xarray's ``_ARRAY_DIMENSIONS`` and CF attributes), then xarray writes its values
(``to_zarr(mode="a")`` reads the existing array's encoding back and uses it).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("ZARR_V3_EXPERIMENTAL_API", "1")
os.environ.setdefault("ZARR_V3_SHARDING", "1")
warnings.simplefilter("ignore")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import xarray as xr  # noqa: E402
import zarr  # noqa: E402
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer  # noqa: E402


def _plain(value):
    """An attribute or encoding value as JSON (numpy scalars and arrays as Python values)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def export(ds: xr.Dataset, out: Path, group: str) -> None:
    """What xarray 2024.7 read: values (npz) and structure (json)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = group.strip("/").replace("/", "__") or "root"
    arrays = {}
    variables = {}
    for name, var in ds.variables.items():
        values = var.values
        if values.dtype.kind == "M":
            values = values.astype("datetime64[ns]").view("int64")
        arrays[name] = values
        variables[name] = {
            "dims": list(var.dims),
            "dtype": var.dtype.str,
            "attrs": {k: _plain(v) for k, v in var.attrs.items()},
            "units": _plain(var.encoding.get("units")),
            "fill_value": _plain(var.encoding.get("_FillValue")),
            "is_coord": name in ds.coords,
        }
    np.savez(out / f"{stem}.npz", **arrays)
    doc = {"attrs": {k: _plain(v) for k, v in ds.attrs.items()}, "variables": variables,
           "coords": sorted(ds.coords), "data_vars": sorted(ds.data_vars)}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, sort_keys=True))


def climate(store: Path) -> list[str]:
    """Coordinates (datetime with CF units, float, int, a 2-D non-dimension one), float
    variables with NaN fill and NaNs in them, a packed int16 (scale/offset, _FillValue),
    an int without fill, a sharded variable, attributes; a child group ``forecast``."""
    rng = np.random.default_rng(2024)
    nt, ny, nx = 12, 20, 30
    time = pd.date_range("2023-01-01", periods=nt, freq="6h")
    y = np.linspace(-45.0, 45.0, ny)
    x = np.arange(nx, dtype="int32") * 10
    temp = rng.normal(280.0, 10.0, (nt, ny, nx)).astype("float32")
    temp[rng.random(temp.shape) < 0.05] = np.nan
    precip = rng.gamma(1.0, 2.0, (nt, ny, nx))
    precip[0, :3, :3] = np.nan
    wind = rng.normal(0.0, 5.0, (nt, ny, nx))
    wind[rng.random(wind.shape) < 0.03] = np.nan
    ds = xr.Dataset(
        {
            "temp": (("time", "y", "x"), temp, {"units": "K", "long_name": "air temperature"}),
            "wind": (("time", "y", "x"), wind, {"units": "m s-1"}),
            "station_count": (("time",), np.arange(nt, dtype="int32") + 3, {"long_name": "stations"}),
        },
        coords={
            "time": ("time", time, {"standard_name": "time"}),
            "y": ("y", y, {"units": "degrees_north"}),
            "x": ("x", x, {"units": "km"}),
            "area": (("y", "x"), rng.random((ny, nx)) * 100, {"units": "km2"}),
        },
        attrs={"title": "draft-era xarray test data", "institution": "sharding-store compat", "version": 3,
               "history": ["created", "sharded"], "scale": 0.5},
    )
    ds["time"].encoding.update({"units": "hours since 2023-01-01 00:00:00", "calendar": "standard", "dtype": "int64"})
    ds["temp"].encoding.update({"chunks": (4, 10, 15)})
    ds["wind"].encoding.update({"dtype": "int16", "scale_factor": 0.01, "add_offset": 0.0, "_FillValue": -32768,
                                "chunks": (6, 20, 30)})
    ds.to_zarr(store, zarr_version=3, mode="w")

    # the sharded variable: created by zarr 2.18 with the draft storage transformer, written by xarray
    group = zarr.open_group(str(store), mode="a", zarr_version=3)
    arr = group.create(
        "precip", shape=(nt, ny, nx), chunks=(2, 5, 10), dtype="float64", fill_value=np.nan,
        storage_transformers=[ShardingStorageTransformer("indexed", chunks_per_shard=(2, 2, 3))],
    )
    arr.attrs.update({"_ARRAY_DIMENSIONS": ["time", "y", "x"], "units": "mm", "coordinates": "area"})
    # mode="a" replaces the group's attributes with the written Dataset's: keep them
    xr.Dataset({"precip": (("time", "y", "x"), precip)}, coords={"time": time, "y": y, "x": x}, attrs=ds.attrs).to_zarr(
        store, zarr_version=3, mode="a"
    )
    meta = json.loads((store / "meta/root/precip.array.json").read_text())
    assert meta["storage_transformers"][0]["configuration"]["chunks_per_shard"] == [2, 2, 3], meta
    shards = sorted(p.relative_to(store / "data/root/precip").as_posix()
                    for p in (store / "data/root/precip").rglob("*") if p.is_file())
    assert shards == [f"c{i}/{j}/{k}" for i in range(3) for j in range(2) for k in range(1)], shards

    fc = xr.Dataset(
        {"t2m": (("step", "y"), rng.normal(285.0, 3.0, (5, ny)).astype("float32"), {"units": "K"})},
        coords={"step": ("step", np.arange(5) * 6, {"units": "h"}), "y": ("y", y, {"units": "degrees_north"})},
        attrs={"model": "demo", "members": 5},
    )
    fc["t2m"].values[2, 4] = np.nan
    fc.to_zarr(store, group="forecast", zarr_version=3, mode="a")
    return ["", "forecast"]


CASES = {"climate": climate}


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"xarray": xr.__version__, "zarr": zarr.__version__, "pandas": pd.__version__,
                "numpy": np.__version__, "cases": {}}
    for name, write in CASES.items():
        store = out / f"{name}.zr3"
        groups = write(store)
        for g in groups:
            back = xr.open_zarr(str(store), group=g or None, zarr_version=3, consolidated=False)
            export(back, out / f"{name}.expected", g)
        manifest["cases"][name] = {"store": store.name, "groups": groups}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
