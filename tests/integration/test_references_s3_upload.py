"""A reference file on S3 is streamed, not built in memory (issue 24, "memory flat in the
number of objects"): ``ReferenceFileSink.commit`` goes through ``Inner.set_streamed``, a
multipart upload of parts of ``fsspec_store.S3_UPLOAD_PART`` bytes (set to S3's 5 MiB
minimum here) completed at the end and aborted on an error (moto on 127.0.0.1).

The file is made large without a large source: tens of thousands of one-byte chunks of one
source object under a long key, so each reference is a few hundred bytes.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
import zarr

from sharding_store import open_references
from sharding_store.stores import fsspec_store
from sharding_store.stores.base import ChunkRef
from sharding_store.stores.references import ReferenceFileSink
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]

PART = 5 * 2**20  # S3's (and s3fs's) smallest part
CHUNKS = 48_000
BLOB = "src/" + "long-source-object-name-" * 16 + "blob"  # ~400-byte URL: ~20 MiB of references
DST = "s3://dst/refs/out.json"
ARRAY = {"zarr_format": 3, "node_type": "array", "shape": [CHUNKS], "data_type": "uint8",
         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
         "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
         "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}}
GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}


def _sink(s3, chunks: int) -> tuple[ReferenceFileSink, np.ndarray]:  # noqa: F811
    """A sink at ``DST`` holding ``chunks`` references into one new source object, and its bytes."""
    s3.reset()
    s3.make_bucket("src")
    s3.make_bucket("dst")
    data = np.random.default_rng(24).integers(0, 256, chunks, dtype=np.uint8)
    s3.fs.pipe(BLOB, data.tobytes())
    etag = s3.fs.info(BLOB)["ETag"]
    out = ReferenceFileSink(DST, s3.storage_options, source="s3://src")
    out.set("zarr.json", json.dumps(GROUP).encode())
    out.set("a/zarr.json", json.dumps({**ARRAY, "shape": [chunks]}).encode())
    url = f"s3://{BLOB}"
    out.put_references("a", [(f"a/c/{i}", (i,), ChunkRef(url, i, 1, chunks, etag=etag)) for i in range(chunks)])
    return out, data


@pytest.fixture
def sink(s3, monkeypatch):  # noqa: F811
    """:func:`_sink` of ``CHUNKS`` references, parts of ``PART`` bytes."""
    monkeypatch.setattr(fsspec_store, "S3_UPLOAD_PART", PART)
    return (s3, *_sink(s3, CHUNKS))


def _writes(s3) -> list[tuple[str, int]]:  # noqa: F811
    """``(kind, body bytes)`` of each write request to the bucket ``dst`` the server saw."""
    out = []
    for r in s3.requests():
        if "/dst/" not in r["url"] or r["method"] not in ("PUT", "POST", "DELETE"):
            continue
        headers = {k.lower(): v for k, v in r["headers"].items()}
        url = r["url"]
        kind = ("part" if "partNumber=" in url else "abort" if r["method"] == "DELETE" and "uploadId=" in url
                else "create" if "uploads" in url.rpartition("?")[2] and "uploadId=" not in url
                else "complete" if "uploadId=" in url else r["method"])
        out.append((kind, int(headers.get("content-length") or 0)))
    return out


def _pending(s3) -> list[Any]:  # noqa: F811
    return s3.fs.call_s3("list_multipart_uploads", Bucket="dst").get("Uploads") or []


@pytest.mark.slow
def test_a_large_reference_file_is_uploaded_in_parts_and_read_equal(sink):
    s3, out, data = sink
    s3.start_counting()
    out.commit("streamed")
    writes = _writes(s3)
    size = s3.fs.size(DST)
    assert size > 3 * PART  # enough for several parts
    parts = [n for kind, n in writes if kind == "part"]
    assert len(parts) >= 3 and sum(parts) == size and [k for k, _ in writes if k != "part"] == ["create", "complete"]
    doc = json.loads(s3.fs.cat(DST))
    assert doc == json.loads(out.encode("streamed"))  # the one piece generation, streamed or joined
    assert doc["refs"]["a/c/0"] == [f"s3://{BLOB}", 0, 1] and len(doc["refs"]) == CHUNKS + 2
    array = zarr.open_group(open_references(DST, s3.storage_options), mode="r")["a"]
    for lo, hi in ((0, 40), (CHUNKS // 2, CHUNKS // 2 + 40), (CHUNKS - 40, CHUNKS)):
        np.testing.assert_array_equal(array[lo:hi], data[lo:hi])


def _commit_peak(s3, chunks: int) -> tuple[int, int, int]:  # noqa: F811
    """``(peak traced bytes of the commit, file size, largest request body)`` of a sink of
    ``chunks`` references."""
    out, _ = _sink(s3, chunks)
    s3.start_counting()
    tracemalloc.start()
    try:
        out.commit("streamed")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, s3.fs.size(DST), max(n for kind, n in _writes(s3) if kind in ("part", "PUT"))


@pytest.mark.slow
def test_the_upload_holds_about_one_part_in_memory_whatever_the_file_size(s3, monkeypatch):  # noqa: F811
    monkeypatch.setattr(fsspec_store, "S3_UPLOAD_PART", PART)
    small, small_size, _ = _commit_peak(s3, CHUNKS // 2)
    large, large_size, largest_body = _commit_peak(s3, CHUNKS)
    assert large_size > 3 * PART and large_size - small_size > PART
    assert largest_body < PART + 2**21  # no request carries the whole file: a part (and a piece)
    # flat in the number of references (a file built in memory: + twice the growth at least)
    assert large - small < PART // 2, (small, large, small_size, large_size)
    # a constant few parts: the part buffered, the part sent (and the client's copies of it), a piece
    assert large < 6 * PART, (large, large_size)


@pytest.mark.slow
@pytest.mark.parametrize("before", [None, b'{"version": 1, "refs": {}}'], ids=["new", "existing"])
def test_a_failure_mid_upload_aborts_it_and_leaves_dst_as_it_was(sink, monkeypatch, before):
    s3, out, _ = sink
    if before is not None:
        s3.fs.pipe(DST[len("s3://"):], before)
    pieces = out.pieces

    def failing(message: str = "", stop: int = 2 * PART + PART // 2) -> Any:
        sent = 0
        for piece in pieces(message):
            yield piece
            sent += len(piece)
            if sent >= stop:
                raise RuntimeError("the table could not be read")

    monkeypatch.setattr(out, "pieces", failing)
    for stop in (2 * PART + PART // 2, 1):  # after two parts were sent; before the first
        s3.start_counting()
        with pytest.raises(RuntimeError, match="could not be read"):
            out.parent.set_streamed(out.name, failing(stop=stop)) if stop == 1 else out.commit("fails")
        writes = [kind for kind, _ in _writes(s3)]
        if stop > 1:  # the failure came in the middle of an upload: parts sent, then aborted
            assert writes.count("part") >= 2 and writes[0] == "create" and writes[-1] == "abort", writes
        else:  # nothing sent at all (s3fs's file would PUT what it buffered at close)
            assert writes == [], writes
        assert not _pending(s3)
        s3.fs.invalidate_cache()
        if before is None:
            assert not s3.fs.exists(DST)
        else:
            assert s3.fs.cat(DST) == before
