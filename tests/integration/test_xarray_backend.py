"""The xarray backend (``engine="sharding_store"``) against the project's own reader.

Values are compared with ``open_draft`` (the model); laziness with counted reads; dimension
names, fill-value masking, groups and datatrees, dask chunks, pickling to a real dask
``LocalCluster``, fsspec URLs on a local moto S3 server, and ``guess_can_open``."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numcodecs
import numpy as np
import pytest

xr = pytest.importorskip("xarray")

from sharding_store import create_draft_array, create_draft_group, migrate, open_draft  # noqa: E402
from sharding_store.errors import DraftMetadataError, UsageError  # noqa: E402
from sharding_store.formats import draft_metadata as dm  # noqa: E402
from sharding_store.testing import CountingInner  # noqa: E402
from sharding_store.xarray_backend import ShardingStoreBackendEntrypoint as Engine  # noqa: E402
from tests.s3server import s3, s3_server  # noqa: E402, F401 - fixtures

ZLIB = numcodecs.Zlib(1)


def xarray_style(root: Path) -> dict[str, np.ndarray]:
    """A store as xarray 2024 over zarr 2.18 wrote it: ``_ARRAY_DIMENSIONS``, ``_FillValue``
    in the zarr fill value (NaN, and -1 for a packed int), ints without fill, a sharded
    variable, CF time units, a child group."""
    rng = np.random.default_rng(7)
    temp = rng.normal(280, 5, (6, 8, 10)).astype("f4")
    temp[0, 0, :3] = np.nan
    packed = rng.integers(0, 1000, (6, 8), dtype="i2")
    packed[1, 2] = -1
    values = {"temp": temp, "packed": packed, "time": np.arange(6, dtype="i8") * 24,
              "y": np.linspace(0, 1, 8), "x": np.arange(10, dtype="i4"), "sub/z": np.arange(5, dtype="f8")}
    create_draft_group(str(root), "", {"title": "t", "n": [1, 2]})
    specs = {
        "temp": dict(chunks=(2, 4, 5), chunks_per_shard=(3, 2, 1), fill_value=float("nan"),
                     attrs={"_ARRAY_DIMENSIONS": ["time", "y", "x"], "units": "K"}),
        "packed": dict(chunks=(3, 8), fill_value=-1, attrs={"_ARRAY_DIMENSIONS": ["time", "y"], "scale_factor": 0.5}),
        "time": dict(chunks=(6,), fill_value=None,
                     attrs={"_ARRAY_DIMENSIONS": ["time"], "units": "hours since 2020-01-01", "calendar": "standard"}),
        "y": dict(chunks=(8,), fill_value=float("nan"), attrs={"_ARRAY_DIMENSIONS": ["y"]}),
        "x": dict(chunks=(10,), fill_value=None, attrs={"_ARRAY_DIMENSIONS": ["x"]}),
        "sub/z": dict(chunks=(5,), fill_value=float("nan"), attrs={"_ARRAY_DIMENSIONS": ["z"], "long_name": "zed"}),
    }
    for path, spec in specs.items():
        a = create_draft_array(str(root), path, shape=values[path].shape, dtype=values[path].dtype, compressor=ZLIB,
                               **spec)
        a[...] = values[path]
    return values


@pytest.fixture
def store(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "ds.zr3"
    return root, xarray_style(root)


def test_values_dims_attrs_and_cf_decoding(store):
    root, values = store
    ds = xr.open_dataset(root, engine=Engine)
    assert set(ds.data_vars) == {"temp", "packed"} and set(ds.coords) == {"time", "y", "x"}
    assert ds.attrs == {"title": "t", "n": [1, 2]}
    np.testing.assert_array_equal(ds["temp"].values, values["temp"])
    assert ds["temp"].dims == ("time", "y", "x") and ds["temp"].attrs == {"units": "K"}
    # the packed int: -1 is its _FillValue (masked), then scaled
    want = np.where(values["packed"] == -1, np.nan, values["packed"] * 0.5)
    np.testing.assert_array_equal(ds["packed"].values, want)
    assert ds["time"].values[1] == np.datetime64("2020-01-02T00:00")
    assert ds["x"].dtype == np.dtype("i4")  # no fill value: not masked, not turned into floats
    np.testing.assert_array_equal(ds["x"].values, values["x"])
    # raw: no CF decoding at all
    raw = xr.open_dataset(root, engine=Engine, decode_cf=False)
    np.testing.assert_array_equal(raw["packed"].values, values["packed"])
    np.testing.assert_array_equal(raw["time"].values, values["time"])


def test_each_cf_switch_reaches_the_decoder_and_unknown_keywords_are_refused(store):
    """The CF switches travel as one bundle (issue 23: at most 8 parameters): each one
    xarray passes still reaches its decoder, in ``open_dataset`` and the datatree, and a
    keyword neither xarray nor the backend knows is a TypeError naming it."""
    root, values = store
    unmasked = xr.open_dataset(root, engine=Engine, mask_and_scale=False)
    np.testing.assert_array_equal(unmasked["packed"].values, values["packed"])  # neither masked nor scaled
    assert unmasked["time"].values[1] == np.datetime64("2020-01-02T00:00")  # times still decoded
    hours = xr.open_dataset(root, engine=Engine, decode_times=False)
    np.testing.assert_array_equal(hours["time"].values, values["time"])
    tree = xr.open_datatree(root, engine=Engine, mask_and_scale=False, decode_times=False)
    np.testing.assert_array_equal(tree["packed"].values, values["packed"])
    np.testing.assert_array_equal(tree["time"].values, values["time"])
    for call in (Engine().open_dataset, Engine().open_groups_as_dict):
        with pytest.raises(TypeError, match="unexpected keyword argument 'mask_and_scael'"):
            call(str(root), mask_and_scael=False)
    assert "mask_and_scale" in Engine.open_dataset_parameters  # xarray filters its decoders by this list


def test_groups_datatree_and_drop_variables(store):
    root, values = store
    sub = xr.open_dataset(root, engine=Engine, group="sub")
    assert list(sub.variables) == ["z"] and sub["z"].attrs == {"long_name": "zed"}
    np.testing.assert_array_equal(sub["z"].values, values["sub/z"])
    tree = xr.open_datatree(root, engine=Engine)
    assert sorted(n.path for n in tree.subtree) == ["/", "/sub"]
    np.testing.assert_array_equal(tree["sub/z"].values, values["sub/z"])
    np.testing.assert_array_equal(tree["temp"].values, values["temp"])
    assert list(xr.open_datatree(root, engine=Engine, group="sub").to_dataset().variables) == ["z"]
    assert "packed" not in xr.open_dataset(root, engine=Engine, drop_variables=["packed"])
    with pytest.raises(UsageError, match=r"'/temp' is an array, not a group"):
        xr.open_dataset(root, engine=Engine, group="temp")


def test_lazy_open_reads_no_chunk_and_a_selection_reads_one_shard(store):
    root, values = store
    counting = CountingInner(str(root))
    ds = xr.open_dataset(counting, engine=Engine)
    data_reads = [d for name, d in counting.log if "data/root/temp" in repr(d)]
    assert data_reads == []  # sharded: nothing of its data read at open (no lost-transformer probe either)
    counting.reset()
    got = ds["temp"][0:2, 0:4, 0:5].values  # one inner chunk of shard (0, 0, 0)
    np.testing.assert_array_equal(got, values["temp"][0:2, 0:4, 0:5])
    touched = {k for name, d in counting.log for k in _keys(d) if k.startswith("data/root/temp")}
    assert touched == {"data/root/temp/c0/0/0"}, counting.log


def _keys(detail) -> list[str]:
    if isinstance(detail, str):
        return [detail]
    if isinstance(detail, (list, tuple)):
        return [k for d in detail for k in _keys(d)]
    return []


def test_dask_chunks_default_to_the_shard_shape(store):
    root, values = store
    ds = xr.open_dataset(root, engine=Engine, chunks={})
    assert ds["temp"].chunks == ((6,), (8,), (5, 5))  # shard (6, 8, 5) = chunks (2, 4, 5) x (3, 2, 1)
    assert ds["packed"].chunks == ((3, 3), (8,))  # unsharded: its chunks
    assert ds["temp"].encoding["shards"] == (6, 8, 5) and ds["temp"].encoding["chunks"] == (2, 4, 5)
    np.testing.assert_array_equal(ds["temp"].values, values["temp"])


def test_dimension_names_hint_and_errors(tmp_path):
    root = tmp_path / "raw.zr3"
    img = np.arange(4 * 6, dtype="u2").reshape(4, 6)
    create_draft_array(str(root), "images/raw", shape=img.shape, chunks=(2, 3), chunks_per_shard=(2, 1),
                       dtype="u2", compressor=ZLIB)[...] = img
    with pytest.raises(UsageError, match=r"array '/images/raw' has no dimension names.*dimension_names=\{'raw': "
                                         r"\['dim_0', 'dim_1'\]\}") as e:
        xr.open_dataset(root, engine=Engine, group="images")
    assert e.value.key == "images/raw"
    for hint in ({"raw": ["y", "x"]}, {"images/raw": ["y", "x"]}, {"/images/raw": ["y", "x"]}):
        ds = xr.open_dataset(root, engine=Engine, group="images", dimension_names=hint)
        assert ds["raw"].dims == ("y", "x") and ds["raw"].dtype == np.dtype("u2")  # fill 0 of zarr: no mask
        np.testing.assert_array_equal(ds["raw"].values, img)
    masked = xr.open_dataset(root, engine=Engine, group="images", dimension_names={"raw": ["y", "x"]},
                             use_zarr_fill_value_as_mask=True)
    assert np.isnan(masked["raw"].values[0, 0]) and masked["raw"].values[0, 1] == 1
    with pytest.raises(UsageError, match=r"'/images/raw'.*\['y'\], expected 2 non-empty names"):
        xr.open_dataset(root, engine=Engine, group="images", dimension_names={"raw": ["y"]})
    with pytest.raises(UsageError, match=r"dimension_names: no array 'nope' below '/images'"):
        xr.open_dataset(root, engine=Engine, group="images", dimension_names={"raw": ["y", "x"], "nope": ["a"]})
    with pytest.raises(UsageError, match="expected a list of names"):
        xr.open_dataset(root, engine=Engine, group="images", dimension_names={"raw": "yx"})


def test_an_array_that_lost_its_transformer_is_refused_not_read_wrong(tmp_path):
    root = tmp_path / "lost.zr3"
    a = create_draft_array(str(root), "v", shape=(4, 4), chunks=(2, 2), chunks_per_shard=(2, 2), dtype="u2",
                           compressor=ZLIB, attrs={"_ARRAY_DIMENSIONS": ["y", "x"]})
    a[...] = np.arange(16, dtype="u2").reshape(4, 4)
    key = root / dm.array_meta_key("v")
    doc = json.loads(key.read_bytes())
    del doc["storage_transformers"]  # zarr-python 2.x's resize()
    key.write_text(json.dumps(doc))
    with pytest.raises(DraftMetadataError, match="looks sharded"):
        xr.open_dataset(root, engine=Engine)


@pytest.mark.slow  # a dask cluster
def test_pickles_by_reference_and_loads_on_a_dask_cluster(store):
    root, values = store
    distributed = pytest.importorskip("distributed")
    ds = xr.open_dataset(root, engine=Engine, chunks={})
    back = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(back["temp"].values, values["temp"])
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster, distributed.Client(cluster):
        got = ds["temp"].mean("time").compute().values
    np.testing.assert_allclose(got, np.nanmean(values["temp"], axis=0), rtol=1e-6)  # the worker read the store


def test_store_objects_cannot_be_pickled_with_a_clear_message(store):
    root, _ = store
    ds = xr.open_dataset(CountingInner(str(root)), engine=Engine)
    with pytest.raises(TypeError, match="open the dataset by path or URL"):
        pickle.dumps(ds["temp"].variable._data.array)


@pytest.mark.s3
def test_fsspec_url_with_storage_options(s3, tmp_path):  # noqa: F811 - the fixture
    root = tmp_path / "ds.zr3"
    values = xarray_style(root)
    s3.make_bucket("xrdata")
    s3.fs.put(str(root), "xrdata/ds.zr3", recursive=True)
    ds = xr.open_dataset("s3://xrdata/ds.zr3", engine=Engine, storage_options=s3.storage_options, chunks={})
    np.testing.assert_array_equal(ds["temp"].values, values["temp"])
    assert ds["temp"].chunks == ((6,), (8,), (5, 5))
    back = pickle.loads(pickle.dumps(ds))  # workers reopen the URL with the same options
    np.testing.assert_array_equal(back["temp"].values, values["temp"])


def test_guess_can_open(store, tmp_path):
    root, _ = store
    engine = Engine()
    assert engine.guess_can_open(str(root)) and engine.guess_can_open(root) and engine.guess_can_open(f"file://{root}")
    v3 = tmp_path / "final.zarr"
    migrate(str(root), str(v3), progress=False)
    assert not engine.guess_can_open(str(v3))  # final v3: the zarr engine's
    assert xr.open_dataset(root)["temp"].dims == ("time", "y", "x")  # picked without engine=
    v2 = tmp_path / "v2.zarr"
    v2.mkdir()
    (v2 / ".zgroup").write_text('{"zarr_format": 2}')
    assert not engine.guess_can_open(str(v2))
    assert not engine.guess_can_open(str(tmp_path / "missing"))
    assert not engine.guess_can_open("s3://bucket/x.zr3") and not engine.guess_can_open(b"bytes")
    fifo = tmp_path / "fifo.zr3"
    fifo.mkdir()
    os.mkfifo(fifo / "zarr.json")  # never blocks
    assert not engine.guess_can_open(str(fifo))
    linked = tmp_path / "linked.zr3"
    linked.mkdir()
    (linked / "zarr.json").symlink_to(root / "zarr.json")  # a link out of the store is not read
    assert not engine.guess_can_open(str(linked))


def test_open_draft_and_backend_agree_on_every_variable(store):
    root, _ = store
    ds = xr.open_dataset(root, engine=Engine, decode_cf=False)
    for name in ("temp", "packed", "time", "y", "x"):
        np.testing.assert_array_equal(ds[name].values, open_draft(str(root), name)[...])


def test_dimension_names_of_per_node_documents_come_first():
    """2023 / final v3 arrays carry ``dimension_names`` (a property, or the document's field);
    they win over an ``_ARRAY_DIMENSIONS`` attribute, a hint wins over both, and a document
    with an unnamed dimension (``null``) needs a hint."""
    from types import SimpleNamespace

    from sharding_store.xarray_backend import _Hints, dimensions_of

    def arr(**kw):
        base = dict(path="g/v", ndim=2, attrs={"_ARRAY_DIMENSIONS": ["a", "b"]}, meta=SimpleNamespace(raw={}))
        return SimpleNamespace(**{**base, **kw})

    none = _Hints(None, "")
    assert dimensions_of(arr(), none) == ("a", "b")
    assert dimensions_of(arr(dimension_names=("y", "x")), none) == ("y", "x")
    doc = SimpleNamespace(raw={"zarr_format": 3, "dimension_names": ["t", "x"]})
    assert dimensions_of(arr(meta=doc), none) == ("t", "x")
    assert dimensions_of(arr(dimension_names=("y", "x")), _Hints({"v": ["p", "q"]}, "g")) == ("p", "q")
    with pytest.raises(UsageError, match=r"'/g/v'.*\['y', None\].*dimension_names=\{'g/v'"):
        dimensions_of(arr(dimension_names=("y", None)), none)


def test_every_unnamed_array_is_named_in_one_error(tmp_path):
    """Issue 27 item 11: a group with several arrays lacking dimension names fails once, naming
    all of them and the whole ``dimension_names={...}`` to pass, which then opens it; for a
    tree, the unnamed arrays of every group at once."""
    root = tmp_path / "unnamed.zr3"
    create_draft_group(str(root), "images")
    for path, shape in (("images/raw", (4, 6)), ("images/mask", (4, 6)), ("images/sub/t", (4,))):
        create_draft_array(str(root), path, shape=shape, chunks=(2,) * len(shape), dtype="u2")[...] = 1
    with pytest.raises(UsageError) as e:
        xr.open_dataset(root, engine=Engine, group="images")
    message = str(e.value)
    assert "2 arrays have no dimension names" in message and "'/images/mask', '/images/raw'" in message
    hint = message.split("name them with dimension_names=", 1)[1]
    assert eval(hint) == {"mask": ["dim_0", "dim_1"], "raw": ["dim_0", "dim_1"]}  # noqa: S307 - our own message
    ds = xr.open_dataset(root, engine=Engine, group="images", dimension_names=eval(hint))  # noqa: S307
    assert set(ds.data_vars) == {"raw", "mask"} and ds["raw"].dims == ("dim_0", "dim_1")
    assert set(xr.open_dataset(root, engine=Engine, group="images", drop_variables=["mask"],
                               dimension_names={"raw": ["y", "x"]}).data_vars) == {"raw"}
    with pytest.raises(UsageError) as tree_error:
        xr.open_datatree(root, engine=Engine)
    tree_hint = eval(str(tree_error.value).split("name them with dimension_names=", 1)[1])  # noqa: S307
    assert set(tree_hint) == {"images/mask", "images/raw", "images/sub/t"}
    tree = xr.open_datatree(root, engine=Engine, dimension_names=tree_hint)
    assert tree["images/sub"]["t"].dims == ("dim_0",)
