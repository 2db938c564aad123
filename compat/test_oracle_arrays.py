"""open_draft / create_draft_array / chunk_codec against zarr-python 2.18.7, the oracle.

* every array of the legacy corpus and of the zarr-js fixtures reads through
  ``open_draft`` exactly as 2.18 reads it;
* every inner chunk payload 2.18 wrote decodes and re-encodes byte-for-byte (gzip's
  header timestamp aside), so what we write is what 2.18 would have written;
* arrays written by ``create_draft_array`` + ``a[...] = x`` are read by 2.18 as written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from compat import oracle
from compat.oracle import arrays_equal
from sharding_store import DraftMetadataError, create_draft_array, open_draft
from sharding_store.codec.chunk_codec import decode_chunk_payload, encode_chunk_payload
from tests.fixtures import ZARR_JS, require

pytestmark = pytest.mark.legacy

FIXTURES = ZARR_JS

# arrays we refuse on purpose: object dtype needs an object codec (DraftMetadataError)
REFUSED = {("odd_dtypes", "vlen_utf8")}


@pytest.fixture(scope="module")
def corpus(legacy_corpus):
    stores = oracle.corpus_stores(legacy_corpus)
    dumps = oracle.legacy_dump_many(stores.values())
    return {name: (Path(s), dumps[Path(s).resolve()]) for name, s in stores.items()}


@pytest.fixture(scope="module")
def fixtures(legacy_env, tmp_path_factory):
    require(FIXTURES)
    dst = tmp_path_factory.mktemp("zarr-js")  # the shared fixtures stay untouched
    copies = [Path(shutil.copytree(p, dst / p.name)) for p in sorted(FIXTURES.glob("*.zarr"))]
    dumps = oracle.legacy_dump_many(copies)
    return {p.name: (p, dumps[p.resolve()]) for p in copies}


def _masked_gzip(b: bytes) -> bytes:
    return b[:4] + b"\0\0\0\0" + b[8:] if b[:2] == b"\x1f\x8b" else b


def _check_reads(stores) -> int:
    n = 0
    for name, (store, dump) in stores.items():
        for path, expected in dump.arrays.items():
            if dump.errors.get(path):
                continue  # 2.18 could not read it either
            if (name, path) in REFUSED:
                with pytest.raises(DraftMetadataError):
                    open_draft(str(store), path)
                continue
            got = open_draft(str(store), path)[...]
            assert arrays_equal(got, expected), (name, path, got, expected)
            n += 1
    return n


def test_corpus_arrays_read_as_2_18_reads_them(corpus):
    assert _check_reads(corpus) >= 70


def test_fixture_arrays_read_as_2_18_reads_them(fixtures):
    assert _check_reads(fixtures) >= 47


def _check_payloads(stores) -> int:
    n = 0
    for name, (store, dump) in stores.items():
        for path, chunks in dump.chunks.items():
            if dump.errors.get(path) or (name, path) in REFUSED:
                continue
            meta = open_draft(str(store), path).meta
            for key, payload in chunks.items():
                chunk = decode_chunk_payload(meta, payload, key=key)
                assert _masked_gzip(encode_chunk_payload(meta, chunk)) == _masked_gzip(payload), (name, key)
                n += 1
    return n


def test_corpus_payloads_re_encode_byte_for_byte(corpus):
    assert _check_payloads(corpus) > 500


def test_fixture_payloads_re_encode_byte_for_byte(fixtures):
    assert _check_payloads(fixtures) > 47


# --------------------------------------------------------------------------- we write, 2.18 reads

CASES = [
    # path, create kwargs
    ("dt/u1", dict(dtype="u1")),
    ("dt/i2", dict(dtype="<i2", fill_value=-1)),
    ("dt/u4be", dict(dtype=">u4")),
    ("dt/f4nan", dict(dtype="<f4", fill_value=np.nan)),
    ("dt/f8", dict(dtype="<f8", order="F")),
    ("dt/bool", dict(dtype="bool", fill_value=True)),
    ("dt/c16", dict(dtype="<c16")),
    ("dt/S5", dict(dtype="|S5", fill_value=b"ab")),
    ("dt/U3", dict(dtype="<U3", fill_value="z")),
    ("dt/M8", dict(dtype="<M8[ns]")),
    ("cmp/none", dict(compressor=None)),
    ("cmp/zlib", dict(compressor=numcodecs.Zlib(level=1))),
    ("cmp/gzip", dict(compressor=numcodecs.GZip(level=5))),
    ("cmp/zstd", dict(compressor=numcodecs.Zstd(level=3))),
    ("cmp/lz4", dict(compressor=numcodecs.LZ4())),
    ("cmp/bz2", dict(compressor=numcodecs.BZ2())),
    ("cmp/lzma", dict(compressor=numcodecs.LZMA())),
    ("cmp/blosc_bit", dict(compressor=numcodecs.Blosc(cname="zstd", clevel=1, shuffle=numcodecs.Blosc.BITSHUFFLE))),
    ("flt/delta", dict(dtype="<i4", filters=[numcodecs.Delta(dtype="<i4")])),
    ("cps/unsharded", dict(chunks_per_shard=None)),
    ("cps/short", dict(chunks_per_shard=(3,))),
    ("cps/int", dict(chunks_per_shard=2)),
    ("cps/big", dict(chunks_per_shard=(4, 4), order="F")),
    ("sep/dot", dict(dimension_separator=".")),
    ("sep/dot_unsharded", dict(dimension_separator=".", chunks_per_shard=None)),
]


def _values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype.kind in "SU":
        return rng.integers(97, 123, size=shape).astype("u1").view("S1").astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "M":
        return rng.integers(0, 10**12, size=shape).astype(dtype)
    return rng.integers(0, 1000, size=shape).astype(dtype)


def test_2_18_reads_what_we_write(tmp_path):
    store = tmp_path / "ours.zarr"
    rng = np.random.default_rng(42)
    expected = {}
    for path, kw in CASES:
        params = dict(shape=(13, 10), chunks=(4, 3), dtype="<i2", chunks_per_shard=(2, 2))
        params.update(kw)
        a = create_draft_array(str(store), path, **params)
        x = _values(a.dtype, a.shape, rng)
        a[...] = x
        a[10:, 8:] = x[:3, :2]  # a read-modify-write of partially covered chunks
        x[10:, 8:] = x[:3, :2]
        a[0:4, 3:6] = a.fill_value  # a fill-only chunk: 2.18 stores it (write_empty_chunks)
        x[0:4, 3:6] = a.fill_value
        expected[path] = x
    sparse = create_draft_array(str(store), "sparse", shape=(20, 20), chunks=(5, 5), dtype="<f8", chunks_per_shard=(2, 2),
                                fill_value=np.nan)
    sparse[3, 17] = 1.5  # one chunk of one shard; everything else is missing
    expected["sparse"] = np.full((20, 20), np.nan)
    expected["sparse"][3, 17] = 1.5
    zero_d = create_draft_array(str(store), "zero_d", shape=(), chunks=(), dtype="<i8", chunks_per_shard=1)
    zero_d[...] = 42
    expected["zero_d"] = np.array(42, dtype="<i8")
    report = oracle.legacy_read_check(store, expected)
    bad = {p: r for p, r in report["arrays"].items() if not r["ok"]}
    assert report["ok"], bad
    for path, x in expected.items():  # and we agree with ourselves after a reopen
        assert arrays_equal(open_draft(str(store), path)[...], x), path


def test_2_18_reads_our_root_array(tmp_path):
    store = tmp_path / "root.zarr"
    a = create_draft_array(str(store), "", shape=(9, 9), chunks=(2, 2), dtype="<u2", chunks_per_shard=(3, 3), order="F")
    x = np.arange(81, dtype="<u2").reshape(9, 9)
    a[...] = x
    oracle.assert_legacy_reads(store, {"": x})
