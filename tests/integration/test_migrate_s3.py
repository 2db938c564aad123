"""Migration between two S3 buckets (moto on 127.0.0.1 through s3fs), with request counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify
from tests.draft_factory import make_big_array, make_hierarchy
from tests.integration.test_migrate_kill import kill, start_paused
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]

SRC, DST = "s3://src/store", "s3://dst/out"
N_SHARDS = 30  # target objects of make_hierarchy (26 shards + 4 unsharded chunks)


@pytest.fixture
def buckets(s3, tmp_path):  # noqa: F811
    local = tmp_path / "src"
    values = make_hierarchy(local)
    s3.make_bucket("src")
    s3.make_bucket("dst")
    s3.fs.put(str(local) + "/", "src/store", recursive=True)
    return s3, values


def src_etags(s3) -> dict[str, str]:  # noqa: F811
    s3.fs.invalidate_cache()
    return {p: i["ETag"] for p, i in s3.fs.find("src/store", detail=True).items()}


def read_s3(s3, path: str) -> np.ndarray:  # noqa: F811
    store = zarr.storage.FsspecStore.from_url(DST, storage_options=s3.storage_options, read_only=True)
    return zarr.open_array(store, path=path, mode="r")[...]


def test_default_migration_is_one_get_and_one_put_per_shard(buckets):
    s3, values = buckets
    before = src_etags(s3)
    s3.start_counting()
    report = migrate(SRC, DST, storage_options=s3.storage_options, verify=False, progress=False)
    counts = s3.counts()
    assert report.shards == N_SHARDS and report.totals.written == 26 and report.totals.copied == 4
    # 26 shards: one ranged GET + one PUT each; 4 unsharded chunks: one CopyObject each;
    # the rest is metadata (5 array + 5 group documents, the lock, the marker, the record)
    assert counts["COPY"] == 4
    assert counts["PUT"] == 26 + 10 + 3
    # each shard whole (a ranged GET), 8 metadata documents, and the tail of the unsharded
    # array's first chunk object (the lost-transformer check: shards under unsharded metadata),
    # and the lock read for its ETag (its release is a DELETE conditional on it: If-Match)
    assert counts["GET"] == 26 + 8 + 1 + 1
    assert counts["LIST"] <= 10 and counts["HEAD"] <= 10
    s3.start_counting()
    checked = verify(SRC, DST, storage_options=s3.storage_options)
    assert checked.ok and s3.counts()["GET"] <= 2 * N_SHARDS + 20 + 1  # + DST's record (its dimension names)
    for path, expected in values.items():
        assert np.array_equal(read_s3(s3, path), expected), path
    assert src_etags(s3) == before


def test_no_index_checksum_uses_server_side_copies(buckets):
    s3, values = buckets
    s3.start_counting()
    report = migrate(SRC, DST, storage_options=s3.storage_options, index_checksum=False, verify=False, progress=False)
    counts = s3.counts()
    assert report.totals.copied == N_SHARDS and report.totals.written == 0
    assert counts["COPY"] == N_SHARDS  # every shard copied by the server; its bytes never came here
    assert counts["PUT"] == 10 + 3  # only metadata, the lock, the marker and the record were uploaded
    # each shard's index (a ranged GET), 8 metadata documents, the lost-transformer check's tail, the lock
    assert counts["GET"] == 26 + 8 + 1 + 1
    assert report.totals.bytes_read == 0
    verify(SRC, DST, storage_options=s3.storage_options)
    assert np.array_equal(read_s3(s3, "imgs/raw"), values["imgs/raw"])


def test_interrupted_s3_migration_resumes(buckets, tmp_path):
    s3, values = buckets
    local = tmp_path / "big"
    values = {"big": make_big_array(local, shards=16)}
    s3.fs.put(str(local) + "/", "src/big", recursive=True)
    opts = json.dumps(s3.storage_options)
    proc = start_paused(["migrate", "s3://src/big", "s3://dst/big", "--storage-options", opts, "--jobs", "1"], after=6)
    kill(proc)
    s3.fs.invalidate_cache()
    assert not s3.fs.exists("dst/big/zarr.json") and not s3.fs.exists("dst/big/big/zarr.json")
    s3.start_counting()
    done = subprocess.run(
        [sys.executable, "-m", "sharding_store.cli", "migrate", "s3://src/big", "s3://dst/big", "--resume", "--json",
         "--storage-options", opts],
        capture_output=True, text=True, env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["skipped"]["objects"] >= 6 and report["objects_written"] + report["objects_copied"] == 16 - report["skipped"]["objects"]
    assert report["verified"]["ok"]
    store = zarr.storage.FsspecStore.from_url("s3://dst/big", storage_options=s3.storage_options, read_only=True)
    assert np.array_equal(zarr.open_array(store, path="big", mode="r")[...], values["big"])
