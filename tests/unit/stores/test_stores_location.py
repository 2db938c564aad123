"""Store identity (issue 12 item 1): one canonical Location per place, however it is spelled,
and one function deciding "same store / inside / contains"."""

from __future__ import annotations

import pytest

from sharding_store.stores import Location, as_inner, relation
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures


@pytest.fixture
def src(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "to_src").symlink_to(tmp_path / "src")
    (tmp_path / "to_sub").symlink_to(tmp_path / "src" / "sub")
    return tmp_path / "src"


SAME = ["{src}", "src", "./src", "src/", "{src}/", "file://{src}", "file://{src}/", "local://{src}", "~/src",
        "{src}/../src", "other/../src", "{tmp}/to_src", "to_src/", "file://{tmp}/to_src"]
INSIDE = ["{src}/new", "file://{src}/new", "src/sub", "{tmp}/to_sub", "to_src/new/deeper", "~/src/x", "src/sub/../y"]
UNRELATED = ["{tmp}/other", "{tmp}/srcx", "{tmp}/sr", "{tmp}", "/"]


def _open(spelling: str, tmp_path) -> object:
    return as_inner(spelling.format(src=tmp_path / "src", tmp=tmp_path))


@pytest.mark.parametrize("spelling", SAME)
def test_every_spelling_of_a_directory_is_the_same_store(src, tmp_path, spelling):
    assert relation(_open(spelling, tmp_path), as_inner(str(src))) == "same"
    assert _open(spelling, tmp_path).location() == Location("file", "", str(src.resolve()))


@pytest.mark.parametrize("spelling", INSIDE)
def test_a_destination_inside_the_source_is_inside_it(src, tmp_path, spelling):
    dst = _open(spelling, tmp_path)
    assert relation(dst, as_inner(str(src))) == "inside"
    assert relation(as_inner(str(src)), dst) == "contains"


@pytest.mark.parametrize("spelling", UNRELATED)
def test_siblings_and_name_prefixes_are_unrelated(src, tmp_path, spelling):
    expected = "contains" if spelling in ("{tmp}", "/") else None
    assert relation(_open(spelling, tmp_path), as_inner(str(src))) == expected


def test_an_fsspec_local_mapper_and_a_zarr_local_store_are_the_same_directory(src):
    import fsspec
    import zarr

    same = [fsspec.get_mapper(f"file://{src}"), zarr.storage.LocalStore(str(src)), f"{src}/"]
    for store in same:
        assert relation(as_inner(store), as_inner(str(src))) == "same", store


def test_in_memory_stores_are_the_same_only_when_they_are_one_object():
    a, b = {}, {}
    assert relation(as_inner(a), as_inner(a)) == "same"
    assert relation(as_inner(a), as_inner(b)) is None
    assert relation(as_inner("memory://x/y"), as_inner("memory://x/y/")) == "same"
    assert relation(as_inner("memory://x/y/z"), as_inner("memory://x/y")) == "inside"
    assert relation(as_inner("memory://x/yz"), as_inner("memory://x/y")) is None


def test_location_relation_is_component_wise():
    a = Location("s3", "http://h:1", "bucket/a")
    assert a.relation(Location("s3", "http://h:1", "bucket/a")) == "same"
    assert a.relation(Location("s3", "http://h:1", "bucket")) == "inside"
    assert a.relation(Location("s3", "http://h:1", "bucket/ab")) is None
    assert a.relation(Location("s3", "http://h:2", "bucket/a")) is None  # another endpoint
    assert a.relation(Location("gcs", "http://h:1", "bucket/a")) is None


@pytest.mark.s3
def test_two_urls_of_one_bucket_are_the_same_store(s3):  # noqa: F811
    pytest.importorskip("s3fs")
    s3.make_bucket("bkt")
    opts = s3.storage_options
    host, port = s3.endpoint.rsplit(":", 1)
    other_spelling = dict(opts, client_kwargs=dict(opts["client_kwargs"], endpoint_url=f"{host.upper()}:{port}/"))
    base = as_inner("s3://bkt/data", storage_options=opts)
    assert relation(as_inner("s3a://bkt/data/", storage_options=opts), base) == "same"
    assert relation(as_inner("s3://bkt//data", storage_options=other_spelling), base) == "same"
    assert relation(as_inner("s3://bkt/data/new", storage_options=opts), base) == "inside"
    assert relation(as_inner("s3://bkt", storage_options=opts), base) == "contains"
    assert relation(as_inner("s3://bkt/database", storage_options=opts), base) is None
    assert relation(as_inner("s3://other/data", storage_options=opts), base) is None
    elsewhere = dict(opts, client_kwargs=dict(opts["client_kwargs"], endpoint_url="http://127.0.0.1:1"))
    assert relation(as_inner("s3://bkt/data", storage_options=elsewhere), base) is None  # another server
