"""Reads of every chunk of a shard take the whole object in one request (``read_whole_shards``)
and decode chunks straight out of it; they must give exactly what chunk-by-chunk reads give."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest

from sharding_store import ShardCorruptError, ShardingStore
from sharding_store.api.arrays import create_draft_array, open_draft
from sharding_store.codec.chunk_codec import _runs, encode_chunk_payload, span_decoder
from sharding_store.errors import ChunkDecodeError
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats.shard_index import MAX_UINT64
from sharding_store.testing import CountingInner
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures

COMPRESSORS = {
    "blosc": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1),
    "zstd": numcodecs.Zstd(level=1),
    "none": None,
    "zlib": numcodecs.Zlib(1),  # no span decoder: the per-chunk general path
}


def _reference(a, shape) -> np.ndarray:
    """The array read chunk by chunk through the partial-shard path (one chunk per read)."""
    out = np.empty(shape, dtype=a.dtype)
    ch = a.chunks
    for i in range(0, shape[0], ch[0]):
        for j in range(0, shape[1], ch[1]):
            out[i : i + ch[0], j : j + ch[1]] = a[i : i + ch[0], j : j + ch[1]]
    return out


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("codec", list(COMPRESSORS))
@pytest.mark.parametrize("where", ["local", "dict"])
def test_whole_reads_match_chunk_reads_with_edges_gaps_and_missing_shards(tmp_path, codec, order, where):
    shape = (45, 38)  # edge chunks and edge shards in both dimensions
    base = str(tmp_path) if where == "local" else {}
    a = create_draft_array(
        base, "x", shape=shape, chunks=(6, 5), dtype="<i4", chunks_per_shard=(2, 3),
        compressor=COMPRESSORS[codec], order=order, fill_value=-7,
    )
    rng = np.random.default_rng(3)
    data = rng.integers(-1000, 1000, shape).astype("<i4")
    a[...] = data
    data[12:24, :] = -7  # a row of fill-valued chunks, erased: a row of absent shards
    data[:, 20:25] = -7  # a column of erased chunks: partly empty shards
    data[:, 30:] = -7  # whole shards without chunks: absent objects
    a.write_empty_chunks = False
    a[...] = data  # two steps: new shards are never created while others are deleted (a known race)
    b = open_draft(base, "x")
    np.testing.assert_array_equal(b[...], data)
    np.testing.assert_array_equal(b[...], _reference(b, shape))
    for key in [np.s_[::2, ::-3], np.s_[3:40, 1:37], np.s_[:, 7]]:
        np.testing.assert_array_equal(b[key], data[key])


def _handmade(tmp_path, codec: str) -> tuple[str, dm.DraftArrayMeta]:
    """An (8, 8) u2 array of (4, 4) chunks in one shard, whose object the test writes by hand."""
    meta = dm.draft_array_document(dm.DraftArraySpec(
        path="h", shape=(8, 8), chunks=(4, 4), dtype="<u2", compressor=COMPRESSORS[codec], fill_value=0,
        order="C", separator="/", filters=None, attributes={}, chunks_per_shard=(2, 2),
    ))
    store = ShardingStore(str(tmp_path))
    store["zarr.json"] = dm.encode_entry_point()
    store[dm.array_meta_key("h")] = dm.encode_array_metadata(meta)
    return str(tmp_path), meta


def _chunk(i: int) -> np.ndarray:
    return (np.arange(16, dtype="<u2").reshape(4, 4) + 100 * i).astype("<u2")


def _write_object(root: str, blob: bytes) -> None:
    import os

    path = os.path.join(root, "data", "root", "h", "c0", "0")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob)


@pytest.mark.parametrize("codec", ["blosc", "zstd", "none", "zlib"])
def test_non_compact_shards_read_like_chunk_reads(tmp_path, codec):
    root, meta = _handmade(tmp_path, codec)
    p = [encode_chunk_payload(meta, _chunk(i)) for i in range(4)]
    # payloads stored in reverse order with gaps, chunk (1,1) sharing chunk (0,0)'s bytes
    body = b"GAP!" + p[2] + b"GAP!" + p[1] + p[0]
    o2 = 4
    o1 = o2 + len(p[2]) + 4
    o0 = o1 + len(p[1])
    _write_object(root, body + np.array([(o0, len(p[0])), (o1, len(p[1])), (o2, len(p[2])), (o0, len(p[0]))], "<u8").tobytes())
    a = open_draft(root, "h")
    whole = a[...]
    expected = np.block([[_chunk(0), _chunk(1)], [_chunk(2), _chunk(0)]])
    np.testing.assert_array_equal(whole, expected)
    np.testing.assert_array_equal(whole, _reference(a, (8, 8)))


@pytest.mark.parametrize("codec", ["blosc", "zstd"])
def test_payloads_the_fast_path_refuses_go_through_the_general_path(tmp_path, codec):
    root, meta = _handmade(tmp_path, codec)
    p = [encode_chunk_payload(meta, _chunk(i)) for i in range(4)]
    if codec == "zstd":
        p[1] = p[1] + bytes(numcodecs.Zstd(level=1).encode(b""))  # and an empty frame: numcodecs reads it
    else:
        p[1] = p[1] + b"\0" * 5  # trailing bytes blosc ignores but our size check refuses
    p[3] = b"garbage that is no codec's payload"
    offs = np.cumsum([0] + [len(x) for x in p])
    _write_object(root, b"".join(p) + np.array([(offs[i], len(p[i])) for i in range(4)], "<u8").tobytes())
    a = open_draft(root, "h")
    with pytest.raises(ChunkDecodeError, match="h/c1/1"):
        a[...]
    np.testing.assert_array_equal(a[0:4, :], np.block([_chunk(0), _chunk(1)]))  # chunk (0,1) as numcodecs reads it


def _set(idx: np.ndarray, where, value) -> np.ndarray:
    idx[where] = value
    return idx


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (lambda blob, idx: blob[:-64] + _set(idx, (1, 1), MAX_UINT64).tobytes(), "one sentinel field"),
        (lambda blob, idx: blob[:-64] + _set(idx, 3, (int(idx[3, 0]), len(blob))).tobytes(), "outside the payload area"),
        (lambda blob, idx: blob[:-64] + _set(idx, 2, (MAX_UINT64 - 3, 10)).tobytes(), "overflows"),
        (lambda blob, idx: blob[:40], "shard index is 40 bytes"),
    ],
)
def test_damaged_whole_shards_raise_like_chunk_reads(tmp_path, damage, fragment):
    a = create_draft_array(str(tmp_path), "h", shape=(8, 8), chunks=(4, 4), dtype="<u2", chunks_per_shard=(2, 2))
    a[...] = np.arange(64, dtype="<u2").reshape(8, 8)
    path = tmp_path / "data" / "root" / "h" / "c0" / "0"
    blob = path.read_bytes()
    path.write_bytes(damage(blob, np.frombuffer(blob[-64:], "<u8").reshape(4, 2).astype("<u8")))
    with pytest.raises(ShardCorruptError, match=fragment) as whole:
        open_draft(str(tmp_path), "h")[...]
    with pytest.raises(ShardCorruptError) as chunk:
        ShardingStore(str(tmp_path))["data/root/h/c0/0"]
    assert str(whole.value) == str(chunk.value)


def test_whole_array_read_costs_one_request_per_shard(tmp_path):
    a = create_draft_array(str(tmp_path), "h", shape=(16, 16), chunks=(4, 4), dtype="<u2", chunks_per_shard=(2, 2))
    a[...] = np.arange(256, dtype="<u2").reshape(16, 16)
    counting = CountingInner(str(tmp_path))
    b = open_draft(counting, "h")
    counting.reset()
    b[...]
    sizes = sum(p.stat().st_size for p in (tmp_path / "data" / "root" / "h").rglob("*") if p.is_file())
    # a local directory: each shard read whole into a reused buffer (read_into), nothing else
    assert counting.reads == counting.calls["read_into"] == 4 and counting.bytes_read == sizes
    counting.reset()
    b[0:4, 0:4]  # the indices were cached by the whole read
    assert counting.ranges == 1


def test_runs_group_consecutive_rows_with_adjacent_bytes():
    assert _runs([0, 1, 2, 4, 5], [0, 10, 25, 30, 40], [10, 15, 5, 10, 3]) == [(0, 3, 0, 30), (4, 2, 30, 13)]
    assert _runs([0, 1], [10, 0], [5, 10]) == [(0, 1, 10, 5), (1, 1, 0, 10)]
    assert _runs([], [], []) == []


@pytest.mark.parametrize("codec", ["blosc", "zstd", "none"])
def test_span_decoder_matches_per_chunk_decoding(codec):
    meta = dm.draft_array_document(dm.DraftArraySpec(
        path="s", shape=(64, 64), chunks=(16, 16), dtype="<f4", compressor=COMPRESSORS[codec], fill_value=0,
        order="C", separator="/", filters=None, attributes={}, chunks_per_shard=(2, 2),
    ))
    decode = span_decoder(meta)
    if decode is None:
        pytest.skip("numcodecs' native symbols are not available here")
    rng = np.random.default_rng(0)
    chunks = [rng.normal(size=(16, 16)).astype("<f4") for _ in range(5)]
    parts = [encode_chunk_payload(meta, c) for c in chunks]
    parts[3] = parts[3][:-1]  # truncated: refused, left to the general path
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    offs = np.cumsum([0] + [len(p) for p in parts])[:-1].tolist()
    out = np.zeros((6, 1024), dtype=np.uint8)
    rows = [0, 1, 2, 3, 5]  # row 4 skipped: a break in the run
    failed = decode(buf, buf.ctypes.data, rows, offs, [len(p) for p in parts], out.ctypes.data)
    assert failed == [3]
    for r, c in zip([0, 1, 2, 5], [chunks[0], chunks[1], chunks[2], chunks[4]]):
        np.testing.assert_array_equal(out[r].view("<f4").reshape(16, 16), c)
    assert not out[4].any()


@pytest.mark.s3
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_whole_array_read_from_s3_is_one_get_per_shard(tmp_path, s3):  # noqa: F811
    pytest.importorskip("s3fs")
    a = create_draft_array(str(tmp_path), "h", shape=(20, 16), chunks=(4, 4), dtype="<u2", chunks_per_shard=(2, 2))
    data = np.arange(320, dtype="<u2").reshape(20, 16)
    a[...] = data
    data[:8, :8] = 0
    a.write_empty_chunks = False
    a[:8, :8] = 0  # shard (0, 0) holds no chunk: absent
    s3.make_bucket("whole")
    s3.fs.put(str(tmp_path) + "/", "whole/store", recursive=True)
    b = open_draft("s3://whole/store", "h", storage_options=s3.storage_options)
    s3.start_counting()
    np.testing.assert_array_equal(b[...], data)
    data_gets = [r for r in s3.requests() if r["method"] == "GET" and "/data/root/" in r["url"]]
    urls = [r["url"].rsplit("/whole/store/", 1)[1] for r in data_gets]
    assert len(urls) == len(set(urls)) == 3 * 2  # one GET per shard (the absent one answers 404)


@pytest.mark.parametrize("size", [0, 5, 1000, 1024, 1025, 5000])
def test_read_into_reads_whole_local_files_into_a_growing_buffer(tmp_path, size):
    from sharding_store.stores import LocalInner

    inner = LocalInner(str(tmp_path))
    blob = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "k").write_bytes(blob)
    buffers = [np.zeros(1024, dtype=np.uint8)]

    def alloc(n: int) -> np.ndarray:
        if n > len(buffers[-1]):
            buffers.append(np.zeros(n, dtype=np.uint8))
        return buffers[-1]

    got = inner.read_into("k", alloc)
    assert bytes(got.data) == blob and len(buffers) == (2 if size > 1024 else 1)
    assert got.size == size and got.version is not None  # the version of the same read
    assert inner.read_into("missing", alloc) is None
