"""The adapters to other libraries' private APIs (issue 23): each private name they use
still exists in the installed library with the parameters the adapter passes, so that an
upgrade that changes one fails here, naming it, rather than somewhere in a read."""

from __future__ import annotations

import importlib
import inspect

import pytest

from sharding_store import _zarr_adapter
from sharding_store.stores import _fsspec_adapter, _s3fs_adapter


def _parameters(fn: object) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(_s3fs_adapter.PRIVATE_API))
def test_s3fs_private_api_is_as_the_adapter_expects(name):
    s3fs = pytest.importorskip("s3fs")
    fn = getattr(s3fs.S3FileSystem, name, None)
    assert fn is not None, f"s3fs {s3fs.__version__} has no S3FileSystem.{name}: update stores/_s3fs_adapter.py"
    assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), f"S3FileSystem.{name} is no longer async"
    assert _parameters(fn) == _s3fs_adapter.PRIVATE_API[name], f"S3FileSystem.{name}{inspect.signature(fn)}"


def test_fsspec_private_api_is_as_the_adapter_expects():
    import fsspec

    fn = fsspec.AbstractFileSystem._strip_protocol
    assert _parameters(fn) == _fsspec_adapter.PRIVATE_API["_strip_protocol"], inspect.signature(fn)
    fs = fsspec.filesystem("memory")
    assert _fsspec_adapter.can_strip_protocol(fs)
    assert _fsspec_adapter.strip_protocol(fs, "memory://bucket/a/") == "/bucket/a"


@pytest.mark.parametrize("module", sorted(_zarr_adapter.PRIVATE_MODULES))
def test_zarr_private_modules_have_the_names_the_adapter_takes(module):
    mod = importlib.import_module(module)
    missing = [n for n in _zarr_adapter.PRIVATE_MODULES[module] if not hasattr(mod, n)]
    assert not missing, f"{module} has no {missing}: update sharding_store/_zarr_adapter.py"


def test_zarr_store_private_members_are_as_the_adapter_expects(tmp_path):
    from zarr.abc.store import Store
    from zarr.storage import LocalStore

    assert inspect.iscoroutinefunction(Store._open) and _parameters(Store._open) == ("self",)
    store = LocalStore(str(tmp_path))
    assert store.__dict__.get("_is_open") is False  # the flag unopened_state resets
    _zarr_adapter.sync(_zarr_adapter.open_base_store(store))
    assert store._is_open is True
    clone = object.__new__(LocalStore)
    clone.__dict__.update(_zarr_adapter.unopened_state(dict(store.__dict__)))
    assert clone._is_open is False


def test_zarr_adapter_functions_work_on_this_zarr():
    import numpy as np

    zdtype = _zarr_adapter.dtype_from_numpy(np.dtype("<u2"))
    assert _zarr_adapter.has_endianness(zdtype) and not _zarr_adapter.has_endianness(_zarr_adapter.dtype_from_numpy(np.dtype("u1")))
    spec = _zarr_adapter.array_spec((4,), zdtype)
    assert spec.shape == (4,)
    meta = _zarr_adapter.array_v3_metadata().from_dict({
        "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 7, "codecs": [{"name": "bytes"}]})
    assert int(meta.fill_value) == 7
