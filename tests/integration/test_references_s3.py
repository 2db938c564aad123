"""A virtual migration of an S3 source (moto on 127.0.0.1) into a reference file (issue 24).

Request counts on the server show that no chunk payload is read: one ranged GET of each
shard's index tail; unsharded chunk objects are referred to with the size and ETag of the listing. The file refers to
``s3://bucket/key`` with the ETag; the guarded reader refuses a source object rewritten,
truncated or deleted since (``If-Match`` on the recorded ETag); plain fsspec reads it.
"""

from __future__ import annotations

import json
import re

import fsspec
import numpy as np
import pytest
import zarr

from sharding_store import MigrateOptions, SourceChangedError, migrate, open_references, verify
from sharding_store.ops.options import StoreOptions
from tests.draft_factory import make_big_array, make_hierarchy
from tests.s3server import change_object, s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]

SRC = "s3://src/store"
SHARDS = 8
INDEX = 4 * 16  # 2x2 chunks per shard, no checksum


@pytest.fixture
def source(s3, tmp_path):  # noqa: F811
    data = make_big_array(tmp_path / "local", shards=SHARDS)
    s3.make_bucket("src")
    s3.fs.put(str(tmp_path / "local") + "/", "src/store", recursive=True)
    return s3, data


def _guarded(s3, out) -> zarr.Group:  # noqa: F811
    return zarr.open_group(open_references(str(out), source_options=s3.storage_options), mode="r")


def _plain(s3, out) -> zarr.Group:  # noqa: F811
    fs = fsspec.filesystem("reference", fo=str(out), remote_protocol="s3",
                           remote_options={**s3.storage_options, "asynchronous": True}, asynchronous=True)
    return zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r")


def test_only_index_tails_are_read_and_both_readers_read_the_values(source, tmp_path):
    s3, data = source
    out = tmp_path / "out.json"
    s3.start_counting()
    report = migrate(SRC, str(out), MigrateOptions(verify=False), stores=StoreOptions(src=s3.storage_options),
                     progress=False)
    requests = s3.requests()
    assert report.totals.referenced == SHARDS and report.destination == "reference file"
    shard_gets = [r for r in requests if r["method"] == "GET" and "/store/data/" in r["url"]]
    ranges = [{k.lower(): v for k, v in r["headers"].items()}.get("range") for r in shard_gets]
    assert len(shard_gets) == SHARDS and ranges == [f"bytes=-{INDEX}"] * SHARDS  # no payload GET
    assert not [r for r in requests if r["method"] in ("PUT", "POST", "DELETE")]  # the source is only read
    doc = json.loads(out.read_bytes())
    ref = doc["refs"]["big/c/0/0"]
    assert ref[0] == "s3://src/store/data/root/big/c0/0" and ref[1] == 0
    assert doc["sharding-store"]["objects"][ref[0]]["etag"].startswith('"')
    np.testing.assert_array_equal(_guarded(s3, out)["big"][...], data)
    np.testing.assert_array_equal(_plain(s3, out)["big"][...], data)
    assert verify(SRC, str(out), stores=StoreOptions(src=s3.storage_options)).ok


def test_unsharded_chunk_objects_are_referred_to_from_the_listing(s3, tmp_path):  # noqa: F811
    values = make_hierarchy(tmp_path / "local")
    s3.make_bucket("src")
    s3.fs.put(str(tmp_path / "local") + "/", "src/store", recursive=True)
    s3.start_counting()
    migrate(SRC, str(tmp_path / "out.json"), MigrateOptions(verify=False), stores=StoreOptions(src=s3.storage_options),
            progress=False)
    requests = s3.requests()
    chunks = [(r["method"], r["url"].rpartition("/")[2]) for r in requests if "/tab/plain/" in r["url"]]
    # sizes and ETags from the listing: no request per chunk object; one GET: the planning's
    # probe of the first object for a lost storage transformer (the copy makes it too)
    assert chunks == [("GET", "c0.0")]
    np.testing.assert_array_equal(_guarded(s3, tmp_path / "out.json")["tab/plain"][...], values["tab/plain"])


@pytest.mark.parametrize("change", ["rewritten", "truncated", "deleted"])
def test_a_changed_source_object_is_refused_by_the_guard(source, tmp_path, change):
    s3, data = source
    out = tmp_path / "out.json"
    migrate(SRC, str(out), stores=StoreOptions(src=s3.storage_options), progress=False)
    key = "src/store/data/root/big/c0/0"
    change_object(s3.fs, key, change)
    words = {"rewritten": "rewritten", "truncated": "rewritten", "deleted": "deleted"}[change]
    with pytest.raises(SourceChangedError, match=f"s3://{key}: {words}"):
        _guarded(s3, out)["big"][...]


def test_a_same_size_rewrite_keeps_no_identity_but_its_etag_and_verify_refuses_it(source, tmp_path, capsys):
    """On S3 what is recorded is the ETag (no inode, no mtime): an object rewritten with
    the same size gets another ETag, and ``verify`` (every chunk read through the guard)
    stops with exit 14 naming the URL."""
    from sharding_store.cli import main

    s3, _ = source
    out = tmp_path / "out.json"
    migrate(SRC, str(out), MigrateOptions(verify=False), stores=StoreOptions(src=s3.storage_options), progress=False)
    key = "src/store/data/root/big/c0/0"
    recorded = json.loads(out.read_bytes())["sharding-store"]["objects"][f"s3://{key}"]
    assert sorted(recorded) == ["etag", "size"] and recorded["size"] == s3.fs.size(key)
    change_object(s3.fs, key, "rewritten")
    assert s3.fs.size(key) == recorded["size"]
    options = json.dumps(s3.storage_options)
    assert main(["verify", SRC, str(out), "--storage-options", options, "--no-progress"]) == 14
    assert f"s3://{key}: rewritten (ETag no longer {recorded['etag']}" in capsys.readouterr().err


def test_a_reference_file_on_s3_is_written_at_the_commit_and_read_back(source, tmp_path):
    s3, data = source
    s3.make_bucket("dst")
    dst = "s3://dst/refs/out.json"
    report = migrate(SRC, dst, stores=StoreOptions(src=s3.storage_options, dst=s3.storage_options), progress=False)
    assert report.verification.ok and report.destination == "reference file"
    assert s3.fs.ls("dst/refs") == ["dst/refs/out.json"]
    store = open_references(dst, s3.storage_options)
    np.testing.assert_array_equal(zarr.open_group(store, mode="r")["big"][...], data)


@pytest.mark.parametrize("copy", ["other/store", "src/store2"], ids=["other-bucket", "sibling-prefix"])
def test_verify_never_reads_a_reference_into_another_bucket_or_prefix(source, tmp_path, copy):
    """A reference moved to an identical copy of its object in another bucket, or under a
    sibling prefix (``s3://src/store2/`` starts like ``s3://src/store``), its ETag recorded:
    ``verify`` refuses it before any request for it (exit 13), never calls it identical."""
    from sharding_store.errors import LinkOutsideStoreError

    s3, _ = source
    out = tmp_path / "out.json"
    migrate(SRC, str(out), MigrateOptions(verify=False), stores=StoreOptions(src=s3.storage_options), progress=False)
    if copy.startswith("other/"):
        s3.make_bucket("other")
    s3.fs.copy("src/store/data/root/big/c0/0", f"{copy}/data/root/big/c0/0")
    url = f"s3://{copy}/data/root/big/c0/0"
    doc = json.loads(out.read_bytes())
    doc["refs"]["big/c/0/0"][0] = url
    doc["sharding-store"]["objects"][url] = {"size": s3.fs.size(url), "etag": s3.fs.info(url)["ETag"]}
    out.write_text(json.dumps(doc))
    np.testing.assert_array_equal(_guarded(s3, out)["big"][...], source[1])  # a reader still reads it: not verify
    s3.start_counting()
    with pytest.raises(LinkOutsideStoreError, match=f"{url}: a reference leading outside the source s3://src/store/"):
        verify(SRC, str(out), stores=StoreOptions(src=s3.storage_options))
    assert not [r for r in s3.requests() if f"/{copy}/" in r["url"]]


@pytest.mark.parametrize("prefix", ["a//b", "a/./b"])
@pytest.mark.parametrize("dst", ["out.json", "repo"])
def test_a_source_prefix_with_an_empty_or_dot_segment_is_refused_before_anything_is_written(s3, tmp_path, prefix,  # noqa: F811
                                                                                           dst):
    """S3 keys may hold ``//`` or ``/./`` (literal characters), but a source's location spells
    its prefix without them: references to ``s3://src/a//b/...`` then lie under no URL the
    check, ``verify`` or an Icechunk container derive from ``s3://src/a//b`` (every virtual
    migration failed its verification, exit 9). Refused first (exit 2), DST not created; a
    copy of it migrates."""
    from sharding_store import UsageError

    if dst == "repo":
        pytest.importorskip("icechunk")
    make_big_array(tmp_path / "local", shards=2)
    s3.make_bucket("src")
    for path in (tmp_path / "local").rglob("*"):
        if path.is_file():
            s3.fs.call_s3("put_object", Bucket="src", Key=f"{prefix}/{path.relative_to(tmp_path / 'local')}",
                          Body=path.read_bytes())
    with pytest.raises(UsageError, match=re.escape(f"s3://src/{prefix}") + ".*empty or '.' segment"):
        migrate(f"s3://src/{prefix}", str(tmp_path / dst), MigrateOptions(virtual=True),
                stores=StoreOptions(src=s3.storage_options), progress=False)
    assert not (tmp_path / dst).exists()
    migrate(f"s3://src/{prefix}", str(tmp_path / "copy"), stores=StoreOptions(src=s3.storage_options), progress=False)
