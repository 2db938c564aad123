"""chunk_codec: the one inner-payload <-> ndarray pipeline (zarr 2.18's encode/decode)."""

from __future__ import annotations

import zlib

import numcodecs
import numpy as np
import pytest

from sharding_store import ChunkDecodeError, ShardingStore
from sharding_store.codec.chunk_codec import decode_chunk_payload, encode_chunk_payload, fill_chunk, pad_chunk
from sharding_store.errors import UsageError
from sharding_store.formats import draft_metadata as dm
from tests.fixtures import ZARR_JS, stores

FIXTURES = ZARR_JS


def meta(**kw):
    args = dict(
        path="a",
        shape=(10, 7),
        chunks=(4, 3),
        dtype="<i4",
        compressor=None,
        fill_value=0,
        order="C",
        separator="/",
        filters=None,
        attributes=None,
        chunks_per_shard=None,
    )
    args.update(kw)
    return dm.draft_array_document(dm.DraftArraySpec(**args))


COMPRESSORS = [
    None,
    numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
    numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
    numcodecs.Zlib(level=1),
    numcodecs.GZip(level=5),
    numcodecs.BZ2(level=9),
    numcodecs.LZMA(),
    numcodecs.Zstd(level=1),
    numcodecs.LZ4(),
]


@pytest.mark.parametrize("compressor", COMPRESSORS, ids=lambda c: repr(c))
@pytest.mark.parametrize("dtype", ["u1", "<i2", ">u4", "<f8", "bool", "<c16", "<M8[ns]", "|S3", "<U2"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_round_trip(compressor, dtype, order):
    m = meta(dtype=dtype, compressor=compressor, order=order)
    rng = np.random.default_rng(0)
    chunk = rng.integers(0, 100, size=m.chunks).astype(dtype)
    payload = encode_chunk_payload(m, chunk)
    assert isinstance(payload, bytes)
    out = decode_chunk_payload(m, payload)
    assert out.dtype == m.dtype and out.shape == m.chunks
    np.testing.assert_array_equal(out, chunk)
    assert out.flags.f_contiguous if order == "F" else out.flags.c_contiguous


@pytest.mark.parametrize("order", ["C", "F"])
def test_uncompressed_payload_is_the_chunk_bytes_in_order(order):
    m = meta(order=order, dtype=">u2")
    chunk = np.arange(12, dtype=">u2").reshape(4, 3)
    assert encode_chunk_payload(m, chunk) == chunk.tobytes(order=order)


def test_edge_chunk_is_padded_with_the_fill_value():
    m = meta(fill_value=-7)
    payload = encode_chunk_payload(m, np.ones((2, 1), dtype="<i4"))
    out = decode_chunk_payload(m, payload)
    assert out.shape == (4, 3)
    assert (out[:2, :1] == 1).all()
    assert (out[2:, :] == -7).all() and (out[:, 1:] == -7).all()


def test_fill_none_pads_with_zeros():
    m = meta(dtype="<f4", fill_value=None)
    out = decode_chunk_payload(m, encode_chunk_payload(m, np.full((1, 1), 5, dtype="<f4")))
    assert out[0, 0] == 5 and (out.ravel()[1:] == 0).all()


def test_oversized_chunk_is_refused():
    with pytest.raises(UsageError, match=r"\(5, 3\).*\(4, 3\)"):
        pad_chunk(meta(), np.zeros((5, 3), dtype="<i4"))


def test_filters_run_before_the_compressor_and_in_reverse_on_decode():
    filters = [numcodecs.Delta(dtype="<i4"), numcodecs.FixedScaleOffset(offset=0, scale=1, dtype="<i4", astype="<i4")]
    m = meta(filters=filters, compressor=numcodecs.Zlib(level=1))
    chunk = np.arange(12, dtype="<i4").reshape(4, 3) * 3
    data = chunk
    for f in filters:
        data = f.encode(data)
    assert encode_chunk_payload(m, chunk) == zlib.compress(np.asarray(data).tobytes(), 1)
    np.testing.assert_array_equal(decode_chunk_payload(m, encode_chunk_payload(m, chunk)), chunk)


def test_compressor_override():
    m = meta(compressor=numcodecs.Zlib(level=1))
    chunk = np.arange(12, dtype="<i4").reshape(4, 3)
    assert encode_chunk_payload(m, chunk, compressor=None) == chunk.tobytes()
    zstd = encode_chunk_payload(m, chunk, compressor=numcodecs.Zstd(level=1))
    assert numcodecs.Zstd().decode(zstd) == chunk.tobytes()


def test_wrong_size_names_key_and_sizes():
    m = meta()
    with pytest.raises(ChunkDecodeError, match=r"data/root/a/c0/0: decoded chunk is 8 bytes, expected 48 \(4x3 of <i4\)"):
        decode_chunk_payload(m, b"\0" * 8, key="data/root/a/c0/0")


def test_codec_failure_names_the_codec():
    m = meta(compressor=numcodecs.Zlib(level=1))
    with pytest.raises(ChunkDecodeError, match=r"c1/2: compressor 'zlib' failed to decode") as e:
        decode_chunk_payload(m, b"not zlib at all", key="c1/2")
    assert e.value.key == "c1/2"


def test_fill_chunk_layout():
    m = meta(order="F", fill_value=3)
    f = fill_chunk(m)
    assert f.flags.f_contiguous and (f == 3).all() and f.shape == (4, 3)


def _fixture_pairs():
    return stores(FIXTURES)  # one skipped parameter where ../shared is absent


def _masked_gzip(b: bytes) -> bytes:
    return b[:4] + b"\0\0\0\0" + b[8:] if b[:2] == b"\x1f\x8b" else b


@pytest.mark.parametrize("store", _fixture_pairs(), ids=lambda p: p.name)
def test_fixture_payloads_re_encode_byte_for_byte(store):
    """Every inner chunk zarr-python 2.x wrote decodes, and re-encodes to the same bytes
    (gzip's header timestamp aside)."""
    from sharding_store.api.hierarchy import open_hierarchy

    h = open_hierarchy(str(store))
    wrapper = ShardingStore(str(store))
    n = 0
    for node in h.arrays():
        m = node.meta
        prefix = dm.data_prefix(m.path)
        for key in wrapper.list_prefix(prefix):
            payload = wrapper[key]
            chunk = decode_chunk_payload(m, payload, key=key)
            assert _masked_gzip(encode_chunk_payload(m, chunk)) == _masked_gzip(payload), key
            n += 1
    assert n > 0


@pytest.mark.parametrize("compressor", [None, numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1), numcodecs.Zstd(level=1)])
def test_fast_decoder_matches_the_pipeline_and_refuses_wrong_sizes(compressor):
    from sharding_store.codec.chunk_codec import decode_chunk_into, fast_decoder

    m = meta(chunks=(4, 3), compressor=compressor)
    chunk = np.arange(12, dtype="<i4").reshape(4, 3)
    row = np.empty(48, dtype=np.uint8)
    fast = fast_decoder(m)
    assert fast is not None and fast(memoryview(encode_chunk_payload(m, chunk)), row)
    np.testing.assert_array_equal(row.view("<i4").reshape(4, 3), chunk)
    small = meta(chunks=(2, 3), compressor=compressor)
    wrong = encode_chunk_payload(small, np.ones((2, 3), dtype="<i4"))  # a payload of another size
    assert not fast(wrong, row)  # never a silent partial decode: the general path reports it
    with pytest.raises(ChunkDecodeError, match=r"c0/0: .*(decoded chunk is 24 bytes|failed to decode)"):
        decode_chunk_into(m, wrong, row, key="c0/0")


def test_local_inner_spells_root_like_fsspec(tmp_path, monkeypatch):
    import fsspec

    from sharding_store.stores import FsspecInner, LocalInner, as_inner

    monkeypatch.chdir(tmp_path)
    for p in [str(tmp_path), str(tmp_path) + "/", "rel/dir", "./rel", ".", "a//b"]:
        fs, root = fsspec.core.url_to_fs(p)
        local = as_inner(p)
        assert isinstance(local, LocalInner)
        assert local.root == FsspecInner(fs, root).root, p
