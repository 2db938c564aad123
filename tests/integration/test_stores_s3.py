"""S3 against the local moto server, through both read clients (obstore, s3fs): ETag versions
with If-Match range reads, conditional PUTs, version-checked server-side copies, request
counts, setup errors. ``tests/integration/test_stores_s3_clients.py``: the two clients compared."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from sharding_store.errors import ObjectChangedError, StoreIOError, UsageError
from sharding_store.stores import FsspecInner, ObstoreInner, Tail, as_inner
from sharding_store.testing import CountingInner
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3]


CLIENTS = ["obstore", "s3fs"]


@pytest.fixture(params=CLIENTS)
def client(request, monkeypatch):
    """Which client reads s3:// URLs in this test (writes and listings are s3fs's in both)."""
    if request.param == "obstore":
        pytest.importorskip("obstore")
    monkeypatch.setattr("sharding_store.stores._obstore.CLIENT", "auto" if request.param == "obstore" else "s3fs")
    return request.param


@pytest.fixture
def bucket(s3, client):  # noqa: F811
    s3.make_bucket("bkt")
    inner = as_inner("s3://bkt/store", storage_options=s3.storage_options)
    assert isinstance(inner, ObstoreInner) == (client == "obstore")
    return s3, inner


def _blob(i: int, n: int = 4096) -> bytes:
    return struct.pack("<Q", i) * (n // 8)


def test_a_tail_is_one_get_with_the_size_and_the_etag(bucket):
    s3, inner = bucket
    inner.set("a", b"0123456789")
    s3.start_counting()
    tails = inner.get_tails([("a", 4), ("missing", 4), ("a", 100)])
    assert s3.counts() == {"GET": 3}
    assert tails[0] == Tail(b"6789", 10, tails[0].version) and tails[1] is None and tails[2].data == b"0123456789"
    assert tails[0].version.startswith('"') and tails[0].version == tails[2].version


def test_ranges_with_the_etag_are_one_conditional_get_each(bucket):
    s3, inner = bucket
    inner.set("a", b"0123456789")
    inner.set("empty", b"")
    v, e = (t.version for t in inner.get_tails([("a", 4), ("empty", 4)]))
    s3.start_counting()
    got = inner.get_ranges([("a", 0, 3), ("a", 8, None), ("a", -3, None), ("a", 20, 30), ("empty", 0, 4)], [v, v, v, v, e])
    assert got == [b"012", b"89", b"789", b"", b""]
    requests = s3.requests()
    gets = [r for r in requests if r["method"] == "GET"]
    assert len(gets) == 5 and all({k.lower() for k in r["headers"]} >= {"if-match", "range"} for r in gets[:3])
    inner.set("a", b"abcdefghij")
    with pytest.raises(ObjectChangedError, match="a: the object changed") as info:
        inner.get_ranges([("a", 0, 3)], [v])
    assert info.value.key == "a" and info.value.exit_code == 12
    inner.delete("a")
    with pytest.raises(ObjectChangedError):
        inner.get_ranges([("a", 0, 3)], [v])
    assert inner.get_ranges([("a", 0, 3)]) == [None]


def test_s3_ranges_with_a_version_never_mix_two_versions(bucket):
    _, inner = bucket
    inner.set("k", _blob(0))
    stop = threading.Event()
    writer = as_inner("s3://bkt/store", storage_options=bucket[0].storage_options)

    def rewrite() -> None:
        i = 1
        while not stop.is_set():
            writer.set("k", _blob(i))
            i += 1

    thread = threading.Thread(target=rewrite)
    thread.start()
    counts = {"same": 0, "changed": 0, "mixed": 0}
    deadline = time.monotonic() + 4
    try:
        while time.monotonic() < deadline:
            tail = inner.get_tails([("k", 8)])[0]
            expected = struct.unpack("<Q", tail.data)[0]
            try:
                got = inner.get_ranges([("k", 0, 8), ("k", 2048, 2056)], [tail.version] * 2)
            except ObjectChangedError:
                counts["changed"] += 1
                continue
            counts["same" if {struct.unpack("<Q", g)[0] for g in got} == {expected} else "mixed"] += 1
    finally:
        stop.set()
        thread.join()
    assert counts["mixed"] == 0 and counts["changed"] > 0 and counts["same"] > 0, counts


def test_create_exclusive_is_a_conditional_put(bucket):
    s3, inner = bucket
    s3.start_counting()
    assert inner.create_exclusive("marker", b"first") is True
    assert inner.create_exclusive("marker", b"second") is False
    assert s3.counts() == {"PUT": 2}
    assert inner.get("marker") == b"first"


def test_server_side_copy_checks_the_version_and_works_through_wrappers(bucket):
    s3, inner = bucket
    inner.set("a", b"0123456789")
    src, dst = CountingInner(inner), CountingInner(inner)
    assert src.can_copy_to(dst) and not src.can_copy_to(dst, append=True)
    version = src.get_tails([("a", 4)])[0].version
    s3.start_counting()
    assert src.copy_to("a", dst, "b", size=10, version=version)
    assert s3.counts() == {"COPY": 1} and inner.get("b") == b"0123456789"
    assert src.copy_to("a", dst, "c", append=b"x") is False  # S3 cannot append
    inner.set("a", b"abcdefghij")
    with pytest.raises(ObjectChangedError):
        src.copy_to("a", dst, "d", size=10, version=version)
    assert not inner.exists("d")
    local = as_inner(str(s3.recording.parent))
    assert not src.can_copy_to(local) and src.copy_to("a", local, "a") is False


def test_move_and_list_sized(bucket):
    _, inner = bucket
    inner.set("stage/x/1", b"1")
    inner.set("stage/x/2", b"22")
    inner.move("stage/x/1", "final/1")
    assert list(inner.list_sized("")) == [("final/1", 1), ("stage/x/2", 2)]
    assert isinstance(inner, FsspecInner) and inner.location().kind == "s3"


def test_an_unreachable_endpoint_is_an_io_error_naming_the_url():
    inner = as_inner("s3://bkt/x", storage_options={
        "key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}})
    assert not isinstance(inner, ObstoreInner)  # config_kwargs: s3fs's to express
    with pytest.raises(StoreIOError, match="s3://bkt/x: cannot reach the store") as info:
        inner.get("zarr.json")
    assert info.value.exit_code == 12 and info.value.transient


def test_an_unreachable_endpoint_through_obstore_is_an_io_error_naming_the_url(monkeypatch):
    pytest.importorskip("obstore")
    monkeypatch.setattr("sharding_store.stores._obstore.CLIENT", "auto")
    inner = as_inner("s3://bkt/x", storage_options={
        "key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}})
    assert isinstance(inner, ObstoreInner)
    for read in (lambda: inner.get("zarr.json"), lambda: inner.get_ranges([("a", 0, 4), ("b", 0, 4)]),
                 lambda: inner.get_tails([("a", 4)]), lambda: inner.size("a")):
        with pytest.raises(StoreIOError, match="s3://bkt/x: cannot reach the store") as info:
            read()
        assert info.value.exit_code == 12 and info.value.transient


def test_storage_options_s3fs_rejects_are_a_usage_error_at_open(client):
    with pytest.raises(UsageError, match="s3://bkt/x: storage options not accepted") as info:
        as_inner("s3://bkt/x", storage_options={"nosuch": 1})
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match="s3://bkt/x"):
        as_inner("s3://bkt/x", storage_options={"client_kwargs": {"endpoint_url": "not a url"}})


def test_read_into_is_one_get_with_the_etag(bucket):
    s3, inner = bucket
    inner.set("a", b"0123456789")
    version = inner.get_tails([("a", 2)])[0].version
    s3.start_counting()
    got = inner.read_into("a", bytearray)
    assert s3.counts() == {"GET": 1}
    assert bytes(got.data) == b"0123456789" and got.size == 10 and got.version == version
    assert inner.read_into("missing", bytearray) is None


def test_list_sized_reads_one_page_at_a_time(bucket):
    s3, inner = bucket
    inner.fs.pipe({f"bkt/store/k/{i:04d}": b"x" * (i % 7) for i in range(1500)})
    inner.set("a", b"1")
    inner.set("z", b"1")
    s3.start_counting()
    listing = inner.list_sized("k/")
    first = next(listing)
    assert first == ("k/0000", 0) and s3.counts() == {"LIST": 1}  # one request: the first page only
    s3.start_counting()
    rest = list(listing)
    assert s3.counts() == {"LIST": 1}  # the second page
    assert [first, *rest] == [(f"k/{i:04d}", i % 7) for i in range(1500)]


def test_a_range_of_no_bytes_is_empty_not_the_whole_object(bucket):
    """s3fs's cat_ranges answers [0, 0) with the whole object (found by the two-client
    comparison in test_stores_s3_clients.py)."""
    s3, inner = bucket
    inner.set("a", b"0123456789")
    got = inner.get_ranges([("a", 0, 0), ("a", 3, 3), ("a", 5, 2), ("missing", 0, 0), ("a", 2, 4)])
    assert got == [b"", b"", b"", None, b"23"]
