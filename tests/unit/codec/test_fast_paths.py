"""The vectorised read path and native codec calls agree with the simple definitions."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import numcodecs
import numpy as np
import pytest
from hypothesis import given, settings

from sharding_store import ShardCorruptError
from sharding_store.codec.chunk_codec import decode_chunk_into, encode_chunk_payload, fast_decoder, fast_row_encoder, takes_address
from sharding_store.engine.store import coalesced_spans
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats.shard_index import MAX_UINT64, ShardIndex, parse_indices


def _reference_spans(offsets, ends, gap, seg):
    """Per object, ranges merged in offset order while they start within ``gap`` of the reach."""
    spans, group = [], {}
    for s in sorted(set(seg)):
        members = sorted((i for i in range(len(seg)) if seg[i] == s), key=lambda i: (offsets[i], i))
        lo = reach = None
        for i in members:
            if lo is None or offsets[i] > reach + gap:
                spans.append([s, offsets[i], ends[i]])
                lo, reach = offsets[i], ends[i]
            reach = max(reach, ends[i])
            spans[-1][2] = reach
            group[i] = len(spans) - 1
    return [group[i] for i in range(len(seg))], spans


@pytest.mark.parametrize("seed", range(30))
def test_coalesced_spans_match_a_per_object_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    seg = rng.integers(0, 4, n)
    offsets = rng.integers(0, 200, n)
    ends = offsets + rng.integers(0, 30, n)  # overlapping, nested, empty and adjacent ranges
    gap = int(rng.integers(0, 5))
    group, span_seg, lo, hi = coalesced_spans(offsets.astype(np.uint64), ends.astype(np.uint64), gap, seg)
    ref_group, ref_spans = _reference_spans(offsets.tolist(), ends.tolist(), gap, seg.tolist())
    assert group.tolist() == ref_group
    assert [list(x) for x in zip(span_seg.tolist(), lo.tolist(), hi.tolist())] == ref_spans


def _index_bytes(entries):
    return np.asarray(entries, dtype="<u8").tobytes()


def test_parse_indices_raises_what_from_bytes_raises_for_the_first_bad_shard():
    cps = (2, 2)
    good = _index_bytes([[0, 4], [4, 4], [MAX_UINT64, MAX_UINT64], [8, 2]])
    half = _index_bytes([[0, 4], [MAX_UINT64, 3], [MAX_UINT64, MAX_UINT64], [8, 2]])
    overflow = _index_bytes([[0, 4], [MAX_UINT64 - 1, 5], [MAX_UINT64, MAX_UINT64], [8, 2]])
    table = parse_indices([good, good], cps, keys=["a", "b"], payload_limits=[10, None])
    assert table.shape == (2, 4, 2) and table[0].tolist() == np.frombuffer(good, "<u8").reshape(4, 2).tolist()
    for bad, limit in [(half, None), (overflow, None), (good, 9), (good[:-1], None)]:
        with pytest.raises(ShardCorruptError) as bulk:
            parse_indices([good, bad], cps, keys=["a", "b"], payload_limits=[None, limit])
        with pytest.raises(ShardCorruptError) as single:
            ShardIndex.from_bytes(bad, cps, key="b", payload_limit=limit)
        assert str(bulk.value) == str(single.value)


@pytest.mark.parametrize("seed", range(10))
def test_live_and_is_compact_match_their_definitions(seed):
    rng = np.random.default_rng(seed)
    cps = (3, 2)
    index = ShardIndex.empty(cps)
    pos = 0
    for c in itertools.product(*map(range, cps)):
        if rng.random() < 0.7:
            nb = int(rng.integers(0, 5))
            index.set(c, pos if rng.random() < 0.9 else pos + 1, nb)
            pos += nb
    flat = index.entries.reshape(-1, 2)
    expected = [
        (tuple(int(x) for x in np.unravel_index(i, cps)), int(flat[i, 0]), int(flat[i, 1]))
        for i in range(len(flat))
        if flat[i, 0] != MAX_UINT64
    ]
    assert list(index.live()) == expected
    ranges = sorted((o, o + n) for _, o, n in expected)
    at = 0
    for lo, hi in ranges:
        at = hi if lo == at and at >= 0 else -1
    for size in range(pos + 90, pos + 100):
        assert index.is_compact(size) == (at >= 0 and at + 96 == size)


def _meta(compressor, chunks=(16, 8), dtype="<f4"):
    return dm.draft_array_document(dm.DraftArraySpec(
        path="a", shape=chunks, chunks=chunks, dtype=dtype, compressor=compressor, fill_value=0, order="C",
        separator="/", filters=None, attributes=None, chunks_per_shard=(1, 1),
    ))


@pytest.mark.parametrize("level", [1, 3, 9])
@pytest.mark.parametrize("checksum", [False, True])
def test_zstd_row_encoder_gives_numcodecs_bytes(level, checksum):
    m = _meta(numcodecs.Zstd(level=level, checksum=checksum))
    encode = fast_row_encoder(m)
    rng = np.random.default_rng(level)
    for _ in range(5):
        chunk = (rng.normal(0, 1, m.chunks) * rng.integers(1, 1000)).astype("<f4")
        expected = encode_chunk_payload(m, chunk)
        if encode is not None:  # None: numcodecs' libzstd could not be bound (the slow path is used)
            assert encode(chunk.ctypes.data) == expected


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["|u1", "<u2", "<i4", "<f4", ">f8", "<c8", "|b1", "<M8[ns]"]),
    cname=st.sampled_from(["lz4", "lz4hc", "blosclz", "zstd", "zlib"]),
    clevel=st.integers(0, 9),
    shuffle=st.sampled_from([-1, 0, 1, 2]),
    blocksize=st.sampled_from([0, 256, 4096]),
    chunks=st.sampled_from([(16, 8), (64, 64), (3, 5)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_blosc_row_encoder_gives_numcodecs_bytes(dtype, cname, clevel, shuffle, blocksize, chunks, seed):
    """Every setting numcodecs' Blosc takes (AUTOSHUFFLE resolved by the item size), every
    kind of item, on data from runs to noise: the native call writes numcodecs' exact
    bytes, or the encoder is not offered (None) and numcodecs encodes."""
    m = _meta(numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize), chunks=chunks, dtype=dtype)
    encode = fast_row_encoder(m)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, m.dtype.itemsize * int(np.prod(chunks)), dtype=np.uint8)
    raw[: raw.size // 2] = raw[0]  # a long run, then noise
    chunk = raw.view(m.dtype).reshape(chunks)
    if not _native_blosc():
        pytest.skip("numcodecs' libblosc could not be bound here (numcodecs encodes)")
    assert encode is not None  # the self-check accepted it: the fast path is in use
    assert encode(chunk.ctypes.data) == encode_chunk_payload(m, chunk)


def _native_blosc() -> bool:
    from sharding_store.codec import _native

    return _native.blosc() is not None


@pytest.mark.parametrize("compressor", [numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1), numcodecs.Zstd(level=1), None])
def test_native_decoders_take_addresses_and_refuse_truncated_or_padded_payloads(compressor):
    m = _meta(compressor)
    chunk = np.arange(128, dtype="<f4").reshape(m.chunks)
    payload = encode_chunk_payload(m, chunk)
    fast = fast_decoder(m)
    if not takes_address(fast):
        pytest.skip("numcodecs' native symbols are not available here (the numcodecs path is used)")
    row = np.zeros(512, dtype=np.uint8)
    assert fast(memoryview(payload), row.ctypes.data)
    assert row.view("<f4").tolist() == chunk.ravel().tolist()
    for wrong in (payload[:-1], payload + b"\0", b"", payload[:10]):
        row[:] = 0
        if fast(memoryview(wrong), row.ctypes.data):
            # accepted only if the general path gives the same bytes
            ref = np.zeros(512, dtype=np.uint8)
            decode_chunk_into(m, wrong, ref)
            assert row.tolist() == ref.tolist()
