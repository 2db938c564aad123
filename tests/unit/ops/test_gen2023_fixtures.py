"""The normalisation against the real 2023 stores (``../shared/fixtures/draft-2023/``):
every array's ``zarr.json`` rewritten with ``meta2023.normalise_node`` (and, where the
document does not declare its index codecs, the reading ``shard_index.index_reading``
decides from the shard bytes), then read by zarr-python 3 and by tensorstore and compared
with ``expected.npz``. This proves the format layer right before readers are built on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sharding_store.errors import ShardCorruptError
from sharding_store.formats.gen2023 import NODE_KEY, normalise_node
from sharding_store.formats.shard_index import CHECKSUM_NBYTES, ENTRY_NBYTES, index_reading, read_index

from ... import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _arrays() -> list:
    """(collection, store, array path) of every array of the 2023 fixtures."""
    if not fixtures.available(fixtures.DRAFT_2023):
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason=fixtures.missing(fixtures.DRAFT_2023)),
                             id="fixtures-absent")]
    out = []
    for collection in sorted(p for p in fixtures.DRAFT_2023.iterdir() if p.is_dir()):
        for store in sorted(p for p in collection.iterdir() if p.is_dir()):
            for doc in sorted(store.rglob(NODE_KEY)):
                raw = json.loads(doc.read_bytes())
                if raw.get("node_type") == "array":
                    path = doc.parent.relative_to(store).as_posix()
                    out.append(pytest.param(collection, store, path, id=f"{collection.name}/{store.name}::{path}"))
    return out


ARRAYS = _arrays()


_copy = fixtures.copy_writable


def _shards(array_dir: Path) -> list[Path]:
    return sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name != NODE_KEY)


def _decide(array_dir: Path, doc: dict) -> str:
    """The one reading of every shard of the array (they must agree)."""
    sharding = doc["codecs"][0]["configuration"]
    grid = doc["chunk_grid"]["configuration"]["chunk_shape"]
    cps = tuple(g // c for g, c in zip(grid, sharding["chunk_shape"]))
    n = math.prod(cps)
    readings = {}
    for obj in _shards(array_dir):
        data = obj.read_bytes()
        tail = data[-(ENTRY_NBYTES * n + CHECKSUM_NBYTES):]
        reading = index_reading(tail, cps, len(data), key=obj.relative_to(array_dir).as_posix())
        readings[obj] = reading
        if reading == "crc32c-hidden":
            # the reading the document literally asks for is detected as wrong, never used
            with pytest.raises(ShardCorruptError):
                read_index(data, cps, checksum=False, key=obj.name)
    assert readings, f"{array_dir}: no shard objects"
    (reading,) = set(readings.values())
    return reading


def _normalise_copy(collection: Path, store: Path, path: str, tmp_path: Path) -> tuple[Path, dict]:
    copy = tmp_path / store.name
    _copy(store, copy)
    decisions: dict[str, str] = {}
    for doc_path in sorted(copy.rglob(NODE_KEY)):
        n = normalise_node(doc_path.read_bytes(), doc_path.relative_to(copy).as_posix())
        doc = n.document
        if n.hidden_checksum is None:
            reading = _decide(doc_path.parent, doc)
            decisions[doc_path.parent.relative_to(copy).as_posix()] = reading
            doc = n.document_for(reading)
        doc_path.write_text(json.dumps(doc))
    return copy, decisions


def _expected(collection: Path, store: Path, path: str) -> np.ndarray:
    with np.load(collection / "expected.npz") as npz:
        return npz[f"{store.name}::{path.replace('/', '__')}"]


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert (got.dtype.kind, got.dtype.itemsize) == (want.dtype.kind, want.dtype.itemsize)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("collection, store, path", ARRAYS)
def test_zarr_python_3_reads_the_normalised_copy(collection, store, path, tmp_path):
    import zarr
    from zarr.storage import LocalStore

    copy, decisions = _normalise_copy(collection, store, path, tmp_path)
    a = zarr.open_array(store=LocalStore(str(copy)), path=path, mode="r")
    _same(a[...], _expected(collection, store, path))
    if collection == fixtures.ZARRJS_ZARRITA_2023 and ".shards." in store.name:
        assert decisions == {path: "crc32c-hidden"}  # zarrita, June 2023: every shard


@pytest.mark.parametrize("collection, store, path", ARRAYS)
def test_tensorstore_reads_the_normalised_copy(collection, store, path, tmp_path):
    ts = pytest.importorskip("tensorstore")
    copy, _ = _normalise_copy(collection, store, path, tmp_path)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(copy / path) + "/"}}
    a = ts.open(spec, read=True).result()
    _same(a.read().result(), _expected(collection, store, path))


@fixtures.needs(fixtures.DRAFT_2023)
def test_every_fixture_array_is_covered():
    with np.load(fixtures.ZARRJS_ZARRITA_2023 / "expected.npz") as a, np.load(fixtures.ZARRITAJS_2023_ENDIAN / "expected.npz") as b:
        assert len(ARRAYS) == len(a.files) + len(b.files) == 63
