"""``open_draft`` reads the 2023 intermediate generation (issue 14).

Against the real stores of ``../shared/fixtures/draft-2023`` (whole arrays and slices equal
to ``expected.npz``), and against a tiny independent writer of 2023-spelled stores
(:func:`write_2023`: numpy, numcodecs and ``crc32c`` only, none of our code) in a property
test over key encodings, byte orders, memory orders, codec chains and shard index
spellings. Plus: the hidden checksum cannot be ignored (forcing the plain reading on a
CRC32C store fails, never returns values), what cannot be mapped is refused naming the
node and the field, mixed and damaged hierarchies, and the read-only rule.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store import open_draft
from sharding_store.api.arrays import DraftArray, DraftGroup
from sharding_store.errors import ChunkDecodeError, DraftMetadataError, ShardCorruptError, StoreNotFoundError, UsageError
from sharding_store.formats.v3_layout import layout_from_v3
from sharding_store.stores import as_inner
from sharding_store.testing import CountingInner

from ... import fixtures
from ...draft_factory import PartialMapping
from ...gen2023_writer import B2B, chunk_key, write_2023, write_group

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

def _same(got: Any, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape
    assert (got.dtype.kind, got.dtype.itemsize) == (want.dtype.kind, want.dtype.itemsize)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- the real stores


def _fixture_arrays() -> list:
    if not fixtures.available(fixtures.DRAFT_2023):
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason=fixtures.missing(fixtures.DRAFT_2023)))]
    out = []
    for collection in sorted(p for p in fixtures.DRAFT_2023.iterdir() if p.is_dir()):
        with np.load(collection / "expected.npz") as npz:
            for name in sorted(npz.files):
                store, path = name.split("::")
                out.append(pytest.param(collection, store, path.replace("__", "/"), id=f"{collection.name}/{name}"))
    return out


def _slices(shape: tuple[int, ...]) -> list[tuple]:
    out: list[tuple] = [tuple(slice(1, None, 2) for _ in shape), tuple(slice(None, None, -1) for _ in shape),
                        tuple(0 for _ in shape), tuple(slice(s // 3, s - s // 4) for s in shape)]
    if shape:
        out.append((slice(-2, None), ...))
    return out


@pytest.mark.parametrize("collection, store, path", _fixture_arrays())
def test_every_fixture_array_reads_equal_to_expected(collection, store, path):
    with np.load(collection / "expected.npz") as npz:
        want = npz[f"{store}::{path.replace('/', '__')}"]
    a = open_draft(str(collection / store), path)
    assert isinstance(a, DraftArray)
    _same(a[...], want)
    for sel in _slices(want.shape):
        _same(a[sel], want[sel])


@fixtures.needs(fixtures.DRAFT_2023)
def test_the_june_2023_shards_are_read_through_their_hidden_checksum():
    """zarrita's undeclared CRC32C: the bytes decided it, and forcing the literal reading
    (no checksum, as the document says) is detected as corrupt instead of read."""
    store = fixtures.ZARRJS_ZARRITA_2023 / "2d.chunked.compressed.i2.shards.zarr"
    a = open_draft(str(store), "a")
    assert a.meta.index_checksum is None  # undeclared
    a[...]
    assert set(a.engine._decided) == {"crc32c-hidden"}
    forced = DraftArray(as_inner(str(store)), dataclasses.replace(a.meta, index_checksum=False))
    with pytest.raises(ShardCorruptError, match=r"a/c/[01]/[01]"):
        forced[...]
    with pytest.raises(ShardCorruptError):
        forced[0, 0]  # chunk by chunk too (index, then ranges)


@fixtures.needs(fixtures.DRAFT_2023)
def test_fixture_groups_open_and_list_their_children():
    g = open_draft(str(fixtures.ZARRJS_ZARRITA_2023 / "1d.chunked.compressed.i2.zarr"))
    assert isinstance(g, DraftGroup) and not g.explicit  # no zarr.json at the root
    assert list(g) == ["a"] and "a" in g and len(g) == 1
    assert [name for name, _ in g.arrays()] == ["a"]
    g = open_draft(str(fixtures.ZARRITAJS_2023_ENDIAN / "data.zarr"))
    assert g.explicit and len(g) == 33
    names = list(g)
    assert "1d.contiguous.f4.be" in names
    with np.load(fixtures.ZARRITAJS_2023_ENDIAN / "expected.npz") as npz:
        for name, arr in g.arrays():
            _same(arr[...], npz[f"data.zarr::{name}"])
    assert "1d.contiguous.f4.be (" in g.tree()


# --------------------------------------------------------------------------- written stores


@pytest.mark.parametrize("index", ["hidden", "plain", "crc", "start"])
@pytest.mark.parametrize("encoding, sep", [("default", "/"), ("default", "."), ("v2", "."), ("v2", "/")])
def test_each_index_spelling_and_key_encoding_reads_back(tmp_path, index, encoding, sep):
    data = np.arange(7 * 5, dtype="<i4").reshape(7, 5)
    write_2023(tmp_path, "x/y", data, chunks=(2, 2), cps=(2, 3), encoding=encoding, sep=sep, index=index,
               b2b=("zstd",), absent=frozenset({(1, 1)}), fill=-3)
    want = data.copy()
    want[2:4, 2:4] = -3
    a = open_draft(str(tmp_path), "x/y")
    _same(a[...], want)
    _same(a[1:6:2, ::-1], want[1:6:2, ::-1])
    shard = tmp_path / "x/y" / chunk_key((0, 0), encoding, sep)
    assert shard.is_file()  # the keys are the writer's, not ours
    assert open_draft(str(tmp_path), "x").explicit is False  # implicit groups
    assert list(open_draft(str(tmp_path), "x")) == ["y"]


def test_a_crc_mismatch_of_a_declared_checksum_names_the_shard(tmp_path):
    write_2023(tmp_path, "a", np.arange(16, dtype="<u2"), chunks=(2,), cps=(4,), index="crc")
    shard = tmp_path / "a/c/1"
    blob = bytearray(shard.read_bytes())
    blob[-1] ^= 0xFF
    shard.write_bytes(bytes(blob))
    a = open_draft(str(tmp_path), "a")
    _same(a[:8], np.arange(8, dtype="<u2"))  # the other shard is fine
    with pytest.raises(ShardCorruptError, match=r"a/c/1: shard index checksum mismatch"):
        a[...]
    with pytest.raises(ShardCorruptError, match=r"a/c/1"):
        a[9]


def test_forcing_either_wrong_reading_is_detected_never_read(tmp_path):
    """By construction: an undeclared index is decided per shard from its bytes; reading a
    CRC32C store as plain, or a plain store as checked, raises instead of returning values."""
    data = np.arange(64, dtype="<f8").reshape(8, 8)
    for index, wrong in (("hidden", False), ("plain", True)):
        root = tmp_path / index
        write_2023(root, "a", data, chunks=(2, 2), cps=(2, 2), index=index, b2b=("gzip",))
        meta = open_draft(str(root), "a").meta
        assert meta.index_checksum is None
        forced = DraftArray(as_inner(str(root)), dataclasses.replace(meta, index_checksum=wrong))
        with pytest.raises(ShardCorruptError):
            forced[...]
        with pytest.raises(ShardCorruptError):
            forced[3, 3]
        _same(open_draft(str(root), "a")[...], data)


def test_shards_that_disagree_on_the_hidden_checksum_are_refused(tmp_path):
    data = np.arange(32, dtype="<i2")
    write_2023(tmp_path, "a", data, chunks=(4,), cps=(2,), index="mixed")
    with pytest.raises(ShardCorruptError, match=r"shards disagree.*a/c/[0-3].*a/c/[0-3]"):
        open_draft(str(tmp_path), "a")[...]
    a = open_draft(str(tmp_path), "a")
    _same(a[:8], data[:8])  # one shard alone is read by its own (verified) reading
    with pytest.raises(ShardCorruptError, match="disagree"):
        a[8:16]


@pytest.mark.parametrize("encoding, key", [("default", "c"), ("v2", "0")])
@pytest.mark.parametrize("sharded", [False, True])
def test_a_0d_array(tmp_path, encoding, key, sharded):
    data = np.array(2.5 - 1j, dtype="<c8")
    write_2023(tmp_path, "", data, chunks=(), cps=() if sharded else None, encoding=encoding)
    assert (tmp_path / key).is_file()
    a = open_draft(str(tmp_path))
    assert isinstance(a, DraftArray) and a.shape == ()
    assert a[()] == data[()]
    _same(a[...], data)


def test_bool_complex_big_endian_f_order_fill_and_chunks_larger_than_the_array(tmp_path):
    rng = np.random.default_rng(0)
    cases = {
        "b": (rng.random((3, 4)) > 0.5, dict(chunks=(8, 8), fill=True)),
        "c": ((rng.random((5, 3)) + 1j * rng.random((5, 3))).astype("c16"), dict(chunks=(2, 2), endian="big", order="F")),
        "f": (rng.random((4, 6, 3)).astype("f4"), dict(chunks=(3, 4, 2), cps=(1, 2, 2), endian="big", order="F",
                                                      b2b=("blosc", "crc32c"), spelling="bytes")),
        "n": (np.full((5,), np.nan, dtype="f8"), dict(chunks=(2,), fill=np.nan, absent=frozenset({(1,)}))),
        "u": (rng.integers(0, 255, (9,)).astype("u1"), dict(chunks=(4,), spelling="none", b2b=("gzip",))),
    }
    for name, (data, kw) in cases.items():
        write_2023(tmp_path, name, data, **kw)
    write_group(tmp_path, "", {"title": "t"})
    g = open_draft(str(tmp_path))
    assert dict(g.attrs) == {"title": "t"} and sorted(g) == sorted(cases)
    for name, (data, _kw) in cases.items():
        a = g[name]
        _same(a[...], data)
        if data.ndim > 1:
            _same(a[1:, ::2], data[1:, ::2])
    assert g["c"].dtype == np.dtype(">c16") and g["c"].order == "F"


@pytest.mark.parametrize("index", ["hidden", "plain", "crc", "start"])
def test_requests_per_read_as_for_the_2022_layout(tmp_path, index):
    """A cold chunk read: one index read, one range read; a warm one: the range only; a
    whole shard: one request (its index from its own bytes). An index at the start is read
    by a range request, which tells no version: it is read again after the chunk ranges
    (as for any store without versions), one more request."""
    cold, warm = (3, 2) if index == "start" else (2, 1)
    data = np.arange(16 * 16, dtype="<i4").reshape(16, 16)
    write_2023(tmp_path, "a", data, chunks=(4, 4), cps=(2, 2), index=index, b2b=("zstd",))
    counting = CountingInner(str(tmp_path))
    a = open_draft(counting, "a")
    counting.reset()
    _same(a[5, 6], data[5, 6])
    assert counting.ranges == cold and counting.calls["get"] == 0, counting.log
    counting.reset()
    _same(a[6, 5], data[6, 5])
    assert counting.ranges == warm, counting.log
    counting.reset()
    _same(a[8:16, 0:8], data[8:16, 0:8])
    assert counting.ranges + counting.calls["read_into"] + counting.calls["get"] == 1, counting.log


# --------------------------------------------------------------------------- refusals


def _final_array(tmp_path: Path, codecs: list, **extra: Any) -> Path:
    doc = {"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "int32",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
           "chunk_key_encoding": {"name": "default"}, "fill_value": 0, "codecs": codecs, "attributes": {}, **extra}
    write_group(tmp_path, "", {})
    (tmp_path / "a").mkdir()
    (tmp_path / "a/zarr.json").write_text(json.dumps(doc))
    # one 2023-spelled node makes it a 2023 hierarchy (a final one is refused as "already v3")
    write_2023(tmp_path, "old", np.arange(3, dtype="<i2"), chunks=(3,))
    return tmp_path


BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
INDEX = [BYTES, {"name": "crc32c"}]
UNMAPPABLE = {
    "nested sharding": ([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "index_codecs": INDEX,
                         "index_location": "end", "codecs": [{"name": "sharding_indexed", "configuration": {
                             "chunk_shape": [1], "codecs": [BYTES], "index_codecs": INDEX, "index_location": "end"}}]}}],
                        r"codecs\[0\]\.configuration\.codecs\[0\]: nested sharding_indexed"),
    "an unknown codec": ([BYTES, {"name": "numcodecs.zlib", "configuration": {"level": 1}}],
                         r"codecs\[1\]: codec 'numcodecs.zlib'"),
    "other index codecs": ([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "codecs": [BYTES],
                             "index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}],
                             "index_location": "end"}}],
                           r"codecs\[0\]\.configuration\.index_codecs"),
    "a codec after sharding": ([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "codecs": [BYTES],
                                 "index_codecs": INDEX, "index_location": "end"}}, {"name": "gzip", "configuration": {"level": 1}}],
                               r"codecs\[1\]: codec 'gzip' after sharding_indexed"),
}


@pytest.mark.parametrize("case", sorted(UNMAPPABLE))
def test_what_cannot_be_mapped_is_refused_naming_the_node_and_field(tmp_path, case):
    codecs, field = UNMAPPABLE[case]
    root = _final_array(tmp_path, codecs)
    g = open_draft(str(root))
    assert "a" in g  # listed
    with pytest.raises(DraftMetadataError, match=r"^a/zarr\.json: " + field + r".*open_v3"):
        g["a"]
    with pytest.raises(DraftMetadataError, match="open_v3"):
        open_draft(str(root), "a")
    _same(g["old"][...], np.arange(3, dtype="<i2"))  # the rest of the hierarchy still reads


def test_a_transpose_that_is_neither_c_nor_f_is_refused():
    doc = {"zarr_format": 3, "node_type": "array", "shape": [2, 3, 4], "data_type": "uint8",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3, 4]}},
           "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
           "codecs": [{"name": "transpose", "configuration": {"order": [1, 0, 2]}}, {"name": "bytes"}]}
    with pytest.raises(DraftMetadataError, match=r"k/zarr.json: codecs\[0\]\.configuration\.order: .*identity.*open_v3"):
        layout_from_v3(doc, "k", key="k/zarr.json")
    doc["codecs"] = [{"name": "transpose", "configuration": {"order": [1, 0, 2]}}] * 2 + [{"name": "bytes"}]
    assert layout_from_v3(doc, "k", key="k/zarr.json").order == "C"  # composed: the identity


def test_writing_a_2023_array_is_refused_clearly(tmp_path):
    write_2023(tmp_path, "a", np.arange(4, dtype="<i2"), chunks=(2,))
    for mode in ("r+", "a"):
        with pytest.raises(UsageError, match=r"2023 intermediate.*mode='r'"):
            open_draft(str(tmp_path), "a", mode=mode)
    a = open_draft(str(tmp_path), "a")
    with pytest.raises(Exception, match="read-only"):
        a[0] = 1


def test_mixed_and_damaged_hierarchies(tmp_path):
    write_2023(tmp_path, "a", np.arange(4, dtype="<i2"), chunks=(2,))
    (tmp_path / "b").mkdir()
    (tmp_path / "b/zarr.json").write_text('{"zarr_format": 3, "node_type": "array", "shape": "four"}')
    g = open_draft(str(tmp_path))
    assert list(g) == ["a"]  # the damaged node damages itself only
    with pytest.raises(DraftMetadataError, match=r"b/zarr\.json"):
        g["b"]
    with pytest.raises(DraftMetadataError, match=r"b/zarr\.json"):
        open_draft(str(tmp_path), "b")
    with pytest.raises(StoreNotFoundError):
        open_draft(str(tmp_path), "c")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2/.zarray").write_text("{}")
    with pytest.raises(DraftMetadataError, match=r"v2/\.zarray: the hierarchy mixes generations"):
        open_draft(str(tmp_path), "a")


def test_a_final_v3_store_is_still_refused_as_already_v3(tmp_path):
    write_group(tmp_path, "", {})
    with pytest.raises(StoreNotFoundError, match="already Zarr v3"):
        open_draft(str(tmp_path))


# --------------------------------------------------------------------------- property test

DTYPES = ["|b1", "|u1", "<i2", "<u4", "<i8", "<f2", "<f4", "<f8", "<c8", "<c16"]


@st.composite
def stores(draw: Any) -> tuple[dict, np.ndarray, dict]:
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0 if ndim else 1, 7), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    sharded = draw(st.booleans())
    cps = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))) if sharded else None
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    encoding, sep = draw(st.sampled_from([("default", "/"), ("default", "."), ("v2", "."), ("v2", "/")]))
    endian = draw(st.sampled_from(["little", "big"]))
    spelling = draw(st.sampled_from(["endian", "bytes"] + (["none"] if endian == "little" else [])))
    order = draw(st.sampled_from(["C", "F"])) if spelling != "none" else "C"
    b2b = tuple(draw(st.lists(st.sampled_from(sorted(B2B)), max_size=2)))
    index = draw(st.sampled_from(["hidden", "plain", "crc", "start"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        data = (raw % 2).astype(bool).reshape(shape)
    elif dtype.kind == "f":
        data = np.asarray((rng.standard_normal(shape) * 100).astype(dtype))
    elif dtype.kind == "c":
        data = np.asarray((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype))
    else:
        data = raw.view(dtype).reshape(shape)
    grid = tuple(-(-s // c) for s, c in zip(shape, chunks))
    every = list(np.ndindex(*grid))
    absent = frozenset(c for c in every if rng.random() < 0.25)
    fill = {"b": True, "f": 7.5, "c": 1 - 2j}.get(dtype.kind, 3)
    want = data.copy()
    for c in absent:
        want[tuple(slice(i * n, (i + 1) * n) for i, n in zip(c, chunks))] = fill
    store: dict[str, bytes] = PartialMapping() if draw(st.booleans()) else {}  # tails without sizes, or with
    write_2023(store, "g/arr", data, chunks=chunks, cps=cps, encoding=encoding, sep=sep, endian=endian, order=order,
               b2b=b2b, index=index, fill=fill, spelling=spelling, absent=absent)
    sels = []
    for _ in range(3):
        sel = []
        for s in shape:
            start = draw(st.integers(-s, s))
            stop = draw(st.integers(-s, s))
            step = draw(st.sampled_from([1, 2, 3, -1, -2]))
            sel.append(slice(start, stop, step))
        sels.append(tuple(sel))
    if ndim:
        sels.append(tuple(draw(st.integers(0, s - 1)) if s else slice(None) for s in shape))
    return store, want, {"sels": sels, "endian": endian, "order": order, "index": index}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stores())
def test_random_2023_stores_read_back_equal(case):
    store, want, info = case
    a = open_draft(store, "g/arr")
    assert a.shape == want.shape
    if want.ndim >= 2:  # for fewer axes F (reversed axes) is the identity
        assert a.order == info["order"]
    if want.dtype.itemsize > 1:
        assert a.dtype.byteorder == (">" if info["endian"] == "big" else "<")
    _same(a[...], want)
    for sel in info["sels"]:
        _same(a[sel], want[sel])
    g = open_draft(store, "g")
    assert isinstance(g, DraftGroup) and list(g) == ["arr"]
    assert re.search(r"arr \(", g.tree())


@pytest.mark.parametrize(
    "data_type, endian, fill, want",
    [
        ("float32", "little", "0x3fc00000", np.float32(1.5)),
        ("float32", "big", "0x3fc00000", np.float32(1.5)),
        ("float16", "little", "0x7c00", np.float16(np.inf)),
        ("float64", "little", "-Infinity", -np.inf),
        ("complex64", "big", ["NaN", "0x40000000"], complex(np.nan, 2.0)),
        ("int16", "big", -7, -7),
        ("bool", None, True, True),
    ],
)
def test_fill_values_in_every_final_spelling(data_type, endian, fill, want):
    bytes_codec: dict = {"name": "bytes", "configuration": {"endian": endian}} if endian else {"name": "bytes"}
    doc = {"zarr_format": 3, "node_type": "array", "shape": [3], "data_type": data_type,
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "v2"}, "fill_value": fill, "codecs": [bytes_codec]}
    meta = layout_from_v3(doc, "p", key="p/zarr.json")
    assert meta.dtype.byteorder in ("|", ">" if endian == "big" else "<")
    np.testing.assert_array_equal(np.asarray(meta.fill_value, dtype=meta.dtype), np.asarray(want, dtype=meta.dtype))
    assert meta.key_encoding == "v2" and meta.separator == "."


def test_a_chunk_that_does_not_decode_is_named_by_its_shard_and_place(tmp_path):
    data = np.arange(64, dtype="<i2").reshape(8, 8)
    write_2023(tmp_path, "a", data, chunks=(2, 2), cps=(2, 2), index="crc", b2b=("gzip",))
    blob = bytearray((tmp_path / "a/c/1/0").read_bytes())
    blob[12] ^= 0xFF  # inside the first payload (the last chunk written first, see write_2023)
    (tmp_path / "a/c/1/0").write_bytes(bytes(blob))
    a = open_draft(str(tmp_path), "a")
    _same(a[:4], data[:4])
    for sel in ((slice(None), slice(None)), (slice(6, 8), slice(0, 4)), (7, 3)):  # chunk (3, 1)
        with pytest.raises(ChunkDecodeError, match=r"a/c/1/0 \(chunk \[1, 1\] of the shard\)"):
            a[sel]
