"""The 2023 generation on object storage (moto on 127.0.0.1): open_draft from an s3:// URL,
a bucket-to-bucket copy migration (verified, objects byte for byte, hidden checksum
declared) and the destination read by zarr-python 3, with requests counted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sharding_store import open_draft
from sharding_store.ops.migration import migrate

from .. import fixtures
from ..s3server import s3, s3_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.s3
STORE = "1d.contiguous.compressed.i2.shards.zarr"  # sharded, with zarrita's undeclared CRC32C


def _expected(path: str) -> np.ndarray:
    with np.load(fixtures.ZARRJS_ZARRITA_2023 / "expected.npz") as npz:
        return npz[f"{STORE}::{path.replace('/', '__')}"]


@pytest.fixture
def bucket(s3):  # noqa: F811
    src = fixtures.require(fixtures.ZARRJS_ZARRITA_2023) / STORE
    s3.make_bucket("gen2023")
    s3.make_bucket("out")
    s3.fs.put(str(src) + "/", "gen2023/store", recursive=True)
    return s3


def _arrays(s3, prefix: str) -> list[str]:  # noqa: F811
    out = []
    for key in s3.fs.find(prefix):
        if key.endswith("/zarr.json") and json.loads(s3.fs.cat_file(key)).get("node_type") == "array":
            rel = key[len(prefix) + 1 : -len("/zarr.json")]
            out.append(rel)
    return sorted(out)


def test_open_draft_reads_a_2023_store_from_s3(bucket):
    paths = _arrays(bucket, "gen2023/store")
    assert paths
    for path in paths:
        got = open_draft("s3://gen2023/store", path, storage_options=bucket.storage_options)[...]
        np.testing.assert_array_equal(got, _expected(path))


def test_bucket_to_bucket_copy_migration(bucket):
    import zarr

    before = {k: bucket.fs.cat_file(k) for k in bucket.fs.find("gen2023/store")}
    n_objects = sum(1 for k in before if not k.endswith("zarr.json"))
    bucket.start_counting()
    report = migrate("s3://gen2023/store", "s3://out/final", storage_options=bucket.storage_options, progress=False,
                     verify=False)
    counts = bucket.counts()
    # each object: one copy (server-side) or one GET + one PUT, plus a tail read to decide the index;
    # never a second pass over the data
    assert counts["COPY"] + counts["PUT"] <= n_objects + 10 and counts["GET"] <= 2 * n_objects + 10, counts
    from sharding_store.ops.verification import verify

    assert verify("s3://gen2023/store", "s3://out/final", storage_options=bucket.storage_options, progress=False).ok
    assert report.totals.written + report.totals.copied == n_objects
    bucket.fs.invalidate_cache()
    assert {k: bucket.fs.cat_file(k) for k in bucket.fs.find("gen2023/store")} == before  # source untouched
    for path in _arrays(bucket, "out/final"):
        doc = json.loads(bucket.fs.cat_file(f"out/final/{path}/zarr.json"))
        assert doc["codecs"][0]["configuration"]["index_codecs"][-1] == {"name": "crc32c"}  # declared
        for key in bucket.fs.find(f"gen2023/store/{path}/c"):
            assert bucket.fs.cat_file(key) == bucket.fs.cat_file(key.replace("gen2023/store", "out/final"))
        store = zarr.storage.FsspecStore.from_url("s3://out/final", storage_options=bucket.storage_options,
                                                  read_only=True)
        np.testing.assert_array_equal(zarr.open_array(store, path=path, mode="r")[...], _expected(path))
