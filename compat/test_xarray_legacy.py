"""Real xarray-written draft data: xarray 2024.7 over zarr-python 2.18.7 wrote it
(``to_zarr(..., zarr_version=3)``, compat/legacy/write_xarray.py) and read it back; our
xarray backend must read the same values, dims, coordinates and attributes, and so must
``xr.open_zarr`` (zarr-python 3) after ``sharding-store migrate``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from compat import oracle

xr = pytest.importorskip("xarray")

from sharding_store.xarray_backend import ShardingStoreBackendEntrypoint  # noqa: E402

pytestmark = [pytest.mark.legacy]


@pytest.fixture(scope="module")
def written(legacy_env, tmp_path_factory) -> Path:
    """The datasets and what xarray 2024.7 read back (manifest.json, <case>.expected/)."""
    out = tmp_path_factory.mktemp("xarray-legacy")
    oracle.run_legacy("write_xarray.py", out)
    return out


def cases(written: Path) -> list[tuple[str, str, Path, Path]]:
    """(case, group, store, expected dir) for every group the writer exported."""
    manifest = json.loads((written / "manifest.json").read_text())
    assert manifest["xarray"] == "2024.7.0" and manifest["zarr"] == "2.18.7", manifest
    return [(name, g, written / c["store"], written / f"{name}.expected")
            for name, c in manifest["cases"].items() for g in c["groups"]]


def expected_of(exp_dir: Path, group: str) -> tuple[dict, dict]:
    stem = group.strip("/").replace("/", "__") or "root"
    with np.load(exp_dir / f"{stem}.npz") as z:
        values = {k: z[k] for k in z.files}
    return values, json.loads((exp_dir / f"{stem}.json").read_text())


def _plain(value):
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def assert_same_dataset(ds, values: dict, doc: dict, where: str) -> None:
    """``ds`` (CF-decoded) holds what xarray 2024.7 read: variables, coordinates, dims,
    dtypes, values (NaN where it had NaN), attributes of every variable and the dataset."""
    assert sorted(ds.coords) == doc["coords"], where
    assert sorted(ds.data_vars) == doc["data_vars"], where
    assert {k: _plain(v) for k, v in ds.attrs.items()} == doc["attrs"], where
    for name, spec in doc["variables"].items():
        var = ds.variables[name]
        at = f"{where}: {name}"
        assert list(var.dims) == spec["dims"], at
        assert var.dtype.str == spec["dtype"], at
        assert {k: _plain(v) for k, v in var.attrs.items()} == spec["attrs"], at
        got = var.values
        if got.dtype.kind == "M":
            got = got.astype("datetime64[ns]").view("int64")
        want = values[name]
        assert got.shape == want.shape, at
        np.testing.assert_array_equal(got, want, err_msg=at)  # NaN == NaN here
        if spec["units"] is not None:  # the CF time units xarray decoded with
            assert var.encoding.get("units") == spec["units"], at


def test_the_writer_made_what_the_test_needs(written):
    """The corpus is what it claims: a sharded variable via the draft transformer, a
    datetime with CF units, NaNs in a float variable, a packed int with _FillValue."""
    (case, _, store, exp), *_ = cases(written)
    doc = json.loads((store / "meta/root/precip.array.json").read_text())
    assert doc["storage_transformers"][0]["configuration"]["chunks_per_shard"] == [2, 2, 3]
    values, spec = expected_of(exp, "")
    assert spec["variables"]["time"]["units"].startswith("hours since")
    assert np.isnan(values["temp"]).any() and np.isnan(values["wind"]).any()
    assert spec["variables"]["wind"]["fill_value"] == -32768


def test_backend_reads_what_xarray_2024_wrote(written):
    for case, group, store, exp in cases(written):
        values, doc = expected_of(exp, group)
        with xr.open_dataset(store, engine=ShardingStoreBackendEntrypoint, group=group or None) as ds:
            assert_same_dataset(ds, values, doc, f"{case}/{group}")


def test_backend_dask_chunks_are_shards_and_values_equal(written):
    (case, group, store, exp), *_ = cases(written)
    values, doc = expected_of(exp, group)
    with xr.open_dataset(store, engine=ShardingStoreBackendEntrypoint, chunks={}) as ds:
        assert ds["precip"].chunks == ((4,) * 3, (10,) * 2, (30,))  # chunks (2, 5, 10) x (2, 2, 3) per shard
        assert ds["temp"].chunks == ((4,) * 3, (10,) * 2, (15,) * 2)  # unsharded: the chunks
        assert ds["precip"].encoding["shards"] == (4, 10, 30) and ds["precip"].encoding["chunks"] == (2, 5, 10)
        assert_same_dataset(ds.compute(), values, doc, f"{case} (dask)")


def test_backend_datatree_matches_every_group(written):
    by_case: dict[str, list] = {}
    for case, group, store, exp in cases(written):
        by_case.setdefault(case, []).append((group, store, exp))
    for case, groups in by_case.items():
        store = groups[0][1]
        tree = xr.open_datatree(store, engine=ShardingStoreBackendEntrypoint)
        assert sorted(node.path for node in tree.subtree) == sorted("/" + g for g, _, _ in groups)
        for group, _, exp in groups:
            values, doc = expected_of(exp, group)
            ds = tree["/" + group].to_dataset() if group else tree.to_dataset()
            # a child node inherits its parent's coordinates in a DataTree: compare its own
            ds = ds.drop_vars([c for c in ds.coords if c not in doc["coords"]])
            assert_same_dataset(ds, values, doc, f"{case} tree /{group}")


@pytest.fixture(scope="module")
def migrated(written, tmp_path_factory) -> dict[str, Path]:
    """Each case migrated by the CLI (copy, verified): case -> destination."""
    from sharding_store.cli import main

    out = {}
    for case, _, store, _ in cases(written):
        dst = tmp_path_factory.mktemp("migrated") / f"{case}.zarr"
        if case not in out:
            assert main(["migrate", str(store), str(dst)]) == 0
            out[case] = dst
    return out


def _open_zarr(dst: Path, group: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # migrate writes consolidated metadata: no warning
        return xr.open_zarr(dst, group=group or None)


def _masked_by_fill_value(spec: dict) -> bool:
    """xarray 2024 stored this variable's CF _FillValue (not NaN) as the zarr fill_value."""
    return spec["fill_value"] not in (None, "NaN")


def test_migrated_copy_reads_the_same_through_open_zarr(written, migrated):
    """After ``sharding-store migrate``, zarr-python 3 under ``xr.open_zarr`` reads what
    xarray 2024.7 read from the draft store: dims, coordinates, attributes, datetimes,
    NaN fill; for a packed variable whose _FillValue is a number, every value that is
    not that fill (see the next test for the fill itself)."""
    for case, group, _, exp in cases(written):
        values, doc = expected_of(exp, group)
        packed = {n for n, spec in doc["variables"].items() if _masked_by_fill_value(spec)}
        with _open_zarr(migrated[case], group) as ds:
            for name in packed:
                got, want = ds[name].values, values[name]
                keep = ~np.isnan(want)
                np.testing.assert_array_equal(got[keep], want[keep], err_msg=f"{case}/{group}: {name}")
            assert_same_dataset(ds.drop_vars(packed), {k: v for k, v in values.items() if k not in packed},
                                {**doc, "variables": {k: v for k, v in doc["variables"].items() if k not in packed},
                                 "data_vars": sorted(set(doc["data_vars"]) - packed)},
                                f"{case}/{group} migrated")


def test_migrated_copy_masks_a_numeric_fill_value_as_xarray_2024_did(written, migrated):
    for case, group, _, exp in cases(written):
        values, doc = expected_of(exp, group)
        with _open_zarr(migrated[case], group) as ds:
            for name, spec in doc["variables"].items():
                if _masked_by_fill_value(spec):
                    np.testing.assert_array_equal(ds[name].values, values[name], err_msg=f"{case}/{group}: {name}")
