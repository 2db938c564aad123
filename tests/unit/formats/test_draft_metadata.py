"""Tests of the draft metadata model (sharding_store.formats.draft_metadata)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store.errors import DraftMetadataError
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats.draft_metadata import (
    CONSOLIDATED_KEY,
    DRAFT_PROTOCOL,
    SHARDING_EXTENSION,
    DraftArrayMeta,
    DraftArraySpec,
    EntryPoint,
    array_meta_key,
    data_prefix,
    draft_array_document,
    encode_array_metadata,
    encode_entry_point,
    encode_group_metadata,
    find_sharding_transformer,
    group_meta_key,
    normalize_path,
    parse_array_metadata,
    parse_chunks_per_shard,
    parse_consolidated,
    parse_entry_point,
    parse_group_metadata,
    path_from_meta_key,
)
from tests.fixtures import ZARR_JS, needs_zarr_js, stores

FIXTURES = ZARR_JS
FIXTURE_STORES = stores(FIXTURES)  # one skipped parameter where ../shared is absent
KEY = "meta/root/a.array.json"


def _meta_files(store: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(store)), p.read_bytes())
        for p in (store / "meta").rglob("*")
        if p.is_file()
    )


def base_doc(**changes) -> dict:
    """A valid zarr 2.18 sharded array document, with top-level fields replaced."""
    doc = {
        "attributes": {},
        "chunk_grid": {"chunk_shape": [2, 3], "separator": "/", "type": "regular"},
        "chunk_memory_layout": "C",
        "compressor": {"codec": "https://purl.org/zarr/spec/codec/zlib/1.0", "configuration": {"level": 1}},
        "data_type": "<i2",
        "extensions": [],
        "fill_value": 0,
        "shape": [5, 6],
        "storage_transformers": [
            {"configuration": {"chunks_per_shard": [2, 2]}, "extension": SHARDING_EXTENSION, "type": "indexed"}
        ],
    }
    doc.update(changes)
    return doc


# --------------------------------------------------------------------------- fixtures


@needs_zarr_js
def test_fixture_count():
    assert len(FIXTURE_STORES) == 47


@pytest.mark.parametrize("store", FIXTURE_STORES, ids=lambda p: p.name)
def test_fixture_documents_round_trip_byte_identical(store: Path):
    raw_ep = (store / "zarr.json").read_bytes()
    ep = parse_entry_point(raw_ep)
    assert ep.metadata_key_suffix == ".json"
    assert encode_entry_point(ep) == raw_ep == encode_entry_point()
    kinds = set()
    for key, raw in _meta_files(store):
        if key == CONSOLIDATED_KEY:
            consolidated = parse_consolidated(raw, key)
            assert "zarr.json" in consolidated
            for k, doc in consolidated.items():
                node = path_from_meta_key(k)
                if node and node[1] == "array":
                    assert encode_array_metadata(parse_array_metadata(doc, k)) == (store / k).read_bytes()
            continue
        node = path_from_meta_key(key)
        assert node is not None, key
        path, kind = node
        kinds.add(kind)
        if kind == "array":
            meta = parse_array_metadata(raw, key)
            assert meta.path == path
            assert array_meta_key(path) == key
            assert encode_array_metadata(meta) == raw
            assert meta.is_sharded == (".sharded." in store.name)
        else:
            attrs = parse_group_metadata(raw, key)
            assert group_meta_key(path) == key
            assert encode_group_metadata(attrs) == raw
    assert "array" in kinds


@needs_zarr_js
def test_fixture_fields():
    m = parse_array_metadata((FIXTURES / "3d.chunked.mixed.compressed.sharded.i2.zarr/meta/root.array.json").read_bytes(),
                             "meta/root.array.json")
    assert m.path == "" and m.shape == (3, 3, 3) and m.chunks == (3, 3, 1)
    assert m.chunks_per_shard == (3, 3, 1) and m.shard_shape == (9, 9, 1)
    assert m.chunk_grid_shape == (1, 1, 3) and m.shard_grid_shape == (1, 1, 3)
    assert m.n_chunks_per_shard == 9 and m.ndim == 3
    assert m.dtype == np.dtype("<i2") and m.fill_value == 0 and isinstance(m.fill_value, np.int16)
    assert m.compressor == numcodecs.Zlib(level=1) and m.filters == () and m.order == "C"
    u = parse_array_metadata((FIXTURES / "1d.contiguous.compressed.U13.zarr/meta/root.array.json").read_bytes(),
                             "meta/root.array.json")
    assert u.dtype == np.dtype("<U13") and u.fill_value == "" and u.chunks_per_shard is None
    assert u.shard_shape == u.chunks and u.chunks_per_shard_or_ones == (1,)
    s = parse_array_metadata((FIXTURES / "1d.contiguous.uncompressed.S7.zarr/meta/root.array.json").read_bytes(),
                             "meta/root.array.json")
    assert s.dtype == np.dtype("|S7") and s.fill_value == b"" and s.compressor is None


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    "path, array_key, group_key, prefix",
    [
        ("", "meta/root.array.json", "meta/root.group.json", "data/root/"),
        ("/", "meta/root.array.json", "meta/root.group.json", "data/root/"),
        ("a/b", "meta/root/a/b.array.json", "meta/root/a/b.group.json", "data/root/a/b/"),
        ("/a/b/", "meta/root/a/b.array.json", "meta/root/a/b.group.json", "data/root/a/b/"),
        ("x.y-z_0", "meta/root/x.y-z_0.array.json", "meta/root/x.y-z_0.group.json", "data/root/x.y-z_0/"),
    ],
)
def test_keys(path, array_key, group_key, prefix):
    assert array_meta_key(path) == array_key
    assert group_meta_key(path) == group_key
    assert data_prefix(path) == prefix
    norm = normalize_path(path)
    assert path_from_meta_key(array_key) == (norm, "array")
    assert path_from_meta_key(group_key) == (norm, "group")


def test_key_suffix_honoured():
    assert array_meta_key("a", ".meta") == "meta/root/a.array.meta"
    assert path_from_meta_key("meta/root/a.array.meta", ".meta") == ("a", "array")
    assert path_from_meta_key("meta/root/a.array.json", ".meta") is None


@pytest.mark.parametrize(
    "key",
    [CONSOLIDATED_KEY, "zarr.json", "data/root/c0", "meta/root/a.json", "meta/rootx.array.json",
     "meta/root/.array.json", "other/root/a.array.json", "meta/root/a/.zattrs"],
)
def test_non_node_keys(key):
    assert path_from_meta_key(key) is None


@pytest.mark.parametrize("path", ["a//b", "a/../b", "..", "a/./b", "a b", "a\\b", "ä", "a:b", "a*"])
def test_normalize_path_rejects(path):
    with pytest.raises(DraftMetadataError, match="node path"):
        normalize_path(path)
    with pytest.raises(DraftMetadataError):
        array_meta_key(path)


def test_node_key_with_hostile_path_raises():
    with pytest.raises(DraftMetadataError, match="malformed node path"):
        path_from_meta_key("meta/root/a/../b.array.json")


# --------------------------------------------------------------------------- entry point


def test_entry_point_default_bytes():
    assert encode_entry_point() == (
        b'{\n    "extensions": [],\n    "metadata_encoding": "https://purl.org/zarr/spec/protocol/core/3.0",\n'
        b'    "metadata_key_suffix": ".json",\n    "zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0"\n}'
    )
    ep = parse_entry_point({"zarr_format": DRAFT_PROTOCOL, "metadata_key_suffix": ".xjson"})
    assert ep.metadata_key_suffix == ".xjson"
    assert json.loads(encode_entry_point(ep))["metadata_key_suffix"] == ".xjson"
    assert EntryPoint().metadata_key_suffix == ".json"


@pytest.mark.parametrize(
    "raw, field",
    [
        (b'{"zarr_format": 3, "node_type": "group"}', "zarr_format"),
        (b"[]", None),
        (b"{", None),
        (b"\xff\xfe", None),
        ({"zarr_format": DRAFT_PROTOCOL, "metadata_key_suffix": 3}, "metadata_key_suffix"),
        ({"zarr_format": DRAFT_PROTOCOL, "metadata_encoding": "x"}, "metadata_encoding"),
    ],
)
def test_entry_point_rejects(raw, field):
    with pytest.raises(DraftMetadataError) as e:
        parse_entry_point(raw)
    assert "zarr.json" in str(e.value) and e.value.key == "zarr.json"
    if field:
        assert f"field '{field}'" in str(e.value)


# --------------------------------------------------------------------------- accepted spellings


@pytest.mark.parametrize(
    "data_type, expected",
    [
        ("bool", "|b1"), ("i1", "|i1"), ("u1", "|u1"), ("<i2", "<i2"), (">u4", ">u4"), ("<f2", "<f2"),
        ("<f8", "<f8"), ("uint16", "<u2"), ("float32", "<f4"), ("int64", "<i8"),
        ({"extension": "x", "fallback": None, "type": "<c16"}, "<c16"),
        ({"extension": "x", "fallback": None, "type": ">c8"}, ">c8"),
        ({"extension": "x", "fallback": None, "type": "<M8[ns]"}, "<M8[ns]"),
        ({"extension": "x", "fallback": None, "type": ">m8[s]"}, ">m8[s]"),
        ({"extension": "x", "fallback": None, "type": "|S7"}, "|S7"),
        ({"extension": "x", "fallback": None, "type": "<U13"}, "<U13"),
        ({"extension": "x", "fallback": None, "type": [["a", "<i4"], ["b", ">f8"]]}, "|V12"),
        ({"extension": "x", "fallback": None, "type": [["a", "<i4", [2]], ["b", [["c", "u1"]]]]}, "|V9"),
    ],
)
def test_dtype_spellings(data_type, expected):
    fill = {"S": "", "U": "", "V": None, "c": [0, 0]}.get(np.dtype(expected).kind, 0)
    m = parse_array_metadata(base_doc(data_type=data_type, fill_value=fill), KEY)
    assert m.dtype.str == expected
    assert m.dtype == parse_array_metadata(encode_array_metadata(m), KEY).dtype


@pytest.mark.parametrize(
    "dtype, fill, check",
    [
        ("<f4", "NaN", lambda v: np.isnan(v)),
        ("<f8", "Infinity", lambda v: v == np.inf),
        ("<f2", "-Infinity", lambda v: v == -np.inf),
        ("<f8", 1.5, lambda v: v == 1.5),
        ("<f4", 3, lambda v: v == 3.0),
        ("bool", True, lambda v: v is np.True_),
        ("bool", 0, lambda v: v is np.False_),
        ("<i8", -(2**63), lambda v: v == -(2**63)),
        ("<u8", 2**64 - 1, lambda v: v == 2**64 - 1),
        ("u1", 255.0, lambda v: v == 255),
        ({"type": "<c16"}, [1.5, "NaN"], lambda v: v.real == 1.5 and np.isnan(v.imag)),
        ({"type": "<c8"}, ["Infinity", -2], lambda v: v == complex(np.inf, -2)),
        ({"type": "|S7"}, "YWJj", lambda v: v == b"abc"),
        ({"type": "|S7"}, "", lambda v: v == b""),
        ({"type": "<U3"}, "xyz", lambda v: v == "xyz"),
        ({"type": "<M8[ns]"}, 5, lambda v: v == np.datetime64(5, "ns")),
        ({"type": "<M8[s]"}, -(2**63), lambda v: np.isnat(v)),
        ({"type": "<m8[ms]"}, -7, lambda v: v == np.timedelta64(-7, "ms")),
        ({"type": [["a", "<i4"], ["b", "u1"]]}, "AQAAAAI=", lambda v: v["a"] == 1 and v["b"] == 2),
        ("<i4", None, lambda v: v is None),
    ],
)
def test_fill_values(dtype, fill, check):
    m = parse_array_metadata(base_doc(data_type=dtype, fill_value=fill), KEY)
    assert check(m.fill_value)
    if fill is not None:
        assert isinstance(m.fill_value, np.generic)
    again = parse_array_metadata(encode_array_metadata(m), KEY)
    assert encode_array_metadata(again) == encode_array_metadata(m)


def test_compressors_all_uris():
    configs = {
        "gzip": {"level": 5}, "zlib": {"level": 9}, "bz2": {"level": 3}, "lz4": {"acceleration": 2},
        "lzma": {"format": 1, "check": -1, "preset": 6, "filters": None}, "zstd": {"level": 4},
        "blosc": {"cname": "zstd", "clevel": 5, "shuffle": -1, "blocksize": 0},
    }
    for name, cfg in configs.items():
        comp = {"codec": f"https://purl.org/zarr/spec/codec/{name}/1.0", "configuration": cfg}
        m = parse_array_metadata(base_doc(compressor=comp), KEY)
        assert m.compressor.codec_id == name
        for k, v in cfg.items():
            assert m.compressor.get_config()[k] == v
        assert json.loads(encode_array_metadata(m))["compressor"]["codec"] == comp["codec"]
    assert parse_array_metadata(base_doc(compressor=None), KEY).compressor is None
    doc = base_doc()
    del doc["compressor"]
    m = parse_array_metadata(doc, KEY)
    assert m.compressor is None and "compressor" not in json.loads(encode_array_metadata(m))


def test_acquire_style_document():
    doc = {
        "attributes": {}, "chunk_grid": {"chunk_shape": [64, 1, 128, 128], "separator": "/", "type": "regular"},
        "chunk_memory_layout": "C", "compressor": None, "data_type": "uint16", "extensions": [],
        "fill_value": 0, "shape": [100, 1, 512, 512],
        "storage_transformers": [{"configuration": {"chunks_per_shard": [1, 1, 4, 4]},
                                  "extension": SHARDING_EXTENSION, "type": "indexed"}],
    }
    m = parse_array_metadata(json.dumps(doc), "meta/root/0.array.json")
    assert m.path == "0" and m.dtype == np.dtype("<u2") and m.chunks_per_shard == (1, 1, 4, 4)
    assert m.shard_shape == (64, 1, 512, 512) and m.shard_grid_shape == (2, 1, 1, 1)
    out = json.loads(encode_array_metadata(m))
    assert out["data_type"] == "<u2" and "compressor" not in out


def test_filters_order_separator():
    filters = [{"id": "delta", "dtype": "<i4", "astype": "<i2"}]
    doc = base_doc(attributes={"filters": filters, "x": 1}, chunk_memory_layout="F", dimension_separator=".")
    doc["chunk_grid"]["separator"] = "/"  # top-level dimension_separator wins
    m = parse_array_metadata(doc, KEY)
    assert m.filters == (numcodecs.Delta(dtype="<i4", astype="<i2"),)
    assert m.attributes == {"x": 1} and m.order == "F" and m.separator == "."
    out = json.loads(encode_array_metadata(m))
    assert out["attributes"]["filters"] == filters
    doc2 = base_doc()
    doc2["chunk_grid"]["separator"] = "."
    assert parse_array_metadata(doc2, KEY).separator == "."
    del doc2["chunk_grid"]["separator"]
    assert parse_array_metadata(doc2, KEY).separator == "/"


@pytest.mark.parametrize(
    "transformer",
    [
        {"extension": SHARDING_EXTENSION, "type": "indexed", "configuration": {"chunks_per_shard": [2, 3]}},
        {"name": "sharding", "configuration": {"chunks_per_shard": [2, 3]}},
        {"storage_transformer": SHARDING_EXTENSION, "configuration": {"format": "indexed", "chunks_per_shard": [2, 3]}},
        {"extension": "https://purl.org/zarr/spec/extensions/storage_transformers/sharding/1.0",
         "type": "indexed", "configuration": {"chunks_per_shard": [2, 3]}},
        {"extension": "sharding", "type": "indexed", "configuration": {"chunks_per_shard": [2, 3]}},
    ],
    ids=["zarr-python", "seed002", "feb2022", "late2022", "feb2023"],
)
def test_transformer_spellings(transformer):
    assert find_sharding_transformer([transformer], KEY, 2) == (2, 3)
    m = parse_array_metadata(base_doc(storage_transformers=[transformer]), KEY)
    assert m.chunks_per_shard == (2, 3)
    # re-encoded in zarr-python's spelling
    assert json.loads(encode_array_metadata(m))["storage_transformers"] == [
        {"configuration": {"chunks_per_shard": [2, 3]}, "extension": SHARDING_EXTENSION, "type": "indexed"}
    ]


@pytest.mark.parametrize(
    "value, ndim, expected",
    [
        ([2, 3], 2, (2, 3)),
        ([2], 3, (2, 1, 1)),  # shorter: pad with 1s on the right
        (4, 1, (4,)),
        (4, 3, (4, 1, 1)),  # an int is (n,) padded, exactly as zarr-python 2.18 reads it
        ([1], 0, ()),  # 0-d: zarr-python writes [1]
        ([], 2, (1, 1)),
        ([3, 1, 1], 1, (3,)),
    ],
)
def test_parse_chunks_per_shard(value, ndim, expected):
    assert parse_chunks_per_shard(value, ndim, KEY) == expected


def test_zero_d_sharded():
    doc = base_doc(shape=[], chunk_grid={"chunk_shape": [], "separator": "/", "type": "regular"})
    doc["storage_transformers"][0]["configuration"]["chunks_per_shard"] = [1]
    m = parse_array_metadata(doc, KEY)
    assert m.chunks_per_shard == () and m.shard_shape == () and m.n_chunks_per_shard == 1
    assert json.loads(encode_array_metadata(m))["storage_transformers"][0]["configuration"] == {
        "chunks_per_shard": [1]
    }


def test_with_chunks_per_shard():
    m = parse_array_metadata(base_doc(), KEY)
    r = m.with_chunks_per_shard((1, 2))
    assert r.chunks_per_shard == (1, 2) and r.shard_shape == (2, 6)
    assert r.raw["storage_transformers"][0]["configuration"]["chunks_per_shard"] == [1, 2]
    assert parse_array_metadata(r.raw, KEY).chunks_per_shard == (1, 2)
    assert m.chunks_per_shard == (2, 2)  # unchanged
    u = m.with_chunks_per_shard(None)
    assert u.chunks_per_shard is None and "storage_transformers" not in u.raw
    assert "storage_transformers" not in json.loads(encode_array_metadata(u))
    with pytest.raises(DraftMetadataError, match="non-positive"):
        m.with_chunks_per_shard((0, 1))


def test_group_and_consolidated():
    assert parse_group_metadata(b'{"attributes": {"a": 1}}', "meta/root.group.json") == {"a": 1}
    assert parse_group_metadata({}, "meta/root.group.json") == {}
    assert encode_group_metadata({}) == b'{\n    "attributes": {}\n}'
    with pytest.raises(DraftMetadataError, match="field 'attributes'"):
        parse_group_metadata(b'{"attributes": []}', "meta/root/g.group.json")
    with pytest.raises(DraftMetadataError, match="zarr_consolidated_format"):
        parse_consolidated(b'{"metadata": {}}', CONSOLIDATED_KEY)
    with pytest.raises(DraftMetadataError, match="metadata"):
        parse_consolidated(b'{"metadata": [], "zarr_consolidated_format": 1}', CONSOLIDATED_KEY)


def test_parse_does_not_alias_input():
    doc = base_doc(attributes={"nested": {"x": [1]}})
    m = parse_array_metadata(doc, KEY)
    doc["attributes"]["nested"]["x"].append(2)
    assert m.attributes == {"nested": {"x": [1]}} and m.raw["attributes"]["nested"]["x"] == [1]


# --------------------------------------------------------------------------- rejections


def _mutated(path: str, value) -> dict:
    doc = base_doc()
    target = doc
    *parents, last = path.split(".")
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return doc


_DELETE = object()

REJECTIONS = [
    # (mutation path, new value, field named in the message, words in the message)
    ("shape", [-3, 6], "shape", "negative extent -3"),
    ("shape", [5, 6.5], "shape", "not an integer"),
    ("shape", [5, True], "shape", "not an integer"),
    ("shape", "5", "shape", "wrong type"),
    ("shape", [2**64, 1], "shape", "exceeds"),
    ("shape", _DELETE, "shape", "missing"),
    ("chunk_grid.chunk_shape", [0, 3], "chunk_grid.chunk_shape", "non-positive extent 0"),
    ("chunk_grid.chunk_shape", [-2, 3], "chunk_grid.chunk_shape", "non-positive extent -2"),
    ("chunk_grid.chunk_shape", [2], "chunk_grid.chunk_shape", "1 dimensions, but shape has 2"),
    ("chunk_grid.chunk_shape", _DELETE, "chunk_grid.chunk_shape", "missing"),
    ("chunk_grid.chunk_shape", [2**20, 2**13], "chunk_grid.chunk_shape", "limit 2**32"),
    ("chunk_grid.type", "rectilinear", "chunk_grid.type", "only 'regular'"),
    ("chunk_grid.separator", "-", "chunk_grid.separator", "'/' or '.'"),
    ("chunk_grid", [], "chunk_grid", "wrong type"),
    ("dimension_separator", "|", "dimension_separator", "'/' or '.'"),
    ("chunk_memory_layout", "K", "chunk_memory_layout", "'C' or 'F'"),
    ("chunk_memory_layout", _DELETE, "chunk_memory_layout", "missing"),
    ("data_type", "|O", "data_type", "object data type (|O) is not supported"),
    ("data_type", {"extension": "x", "fallback": None, "type": "|O"}, "data_type", "not supported"),
    ("data_type", {"extension": "x", "type": [["a", "|O"]]}, "data_type", "not supported"),
    ("data_type", "nonsense", "data_type", "cannot parse"),
    ("data_type", {"extension": "x"}, "data_type", "no 'type'"),
    ("data_type", "<M8", "data_type", "without a unit"),
    ("data_type", "|S0", "data_type", "zero-length"),
    ("data_type", "(2,)<i4", "data_type", "sub-array"),
    ("data_type", _DELETE, "data_type", "missing"),
    ("fill_value", 2**15, "fill_value", "out of range"),
    ("fill_value", -1.5, "fill_value", "expected an integer"),
    ("fill_value", "NaN", "fill_value", "expected an integer"),
    ("fill_value", [1, 2], "fill_value", "expected an integer"),
    ("fill_value", _DELETE, "fill_value", "missing"),
    ("compressor", {"codec": "https://purl.org/zarr/spec/codec/snappy/1.0", "configuration": {}},
     "compressor", "unknown codec"),
    ("compressor", {"codec": "gzip", "configuration": {}}, "compressor", "unknown codec"),
    ("compressor", {"codec": "https://purl.org/zarr/spec/codec/gzip/1.0", "configuration": {"lvl": 1}},
     "compressor", "invalid codec configuration"),
    ("compressor", {"codec": "https://purl.org/zarr/spec/codec/blosc/1.0",
                    "configuration": {"cname": "nope", "clevel": 1, "shuffle": 1}}, "compressor", "cname"),
    ("compressor", {"codec": "https://purl.org/zarr/spec/codec/blosc/1.0",
                    "configuration": {"cname": "lz4", "clevel": 1, "shuffle": 7}}, "compressor", "shuffle"),
    ("compressor", "zlib", "compressor", "expected"),
    ("attributes", [], "attributes", "expected an object"),
    ("attributes", {"filters": [{"id": "no-such-codec"}]}, "attributes.filters[0]", "invalid codec"),
    ("attributes", {"filters": [{"level": 1}]}, "attributes.filters[0]", "'id'"),
    ("attributes", {"filters": "delta"}, "attributes.filters", "expected a list"),
    ("storage_transformers", [{"extension": "https://example.com/other", "type": "x"}],
     "storage_transformers", "unknown storage transformer"),
    ("storage_transformers", {"a": 1}, "storage_transformers", "expected a list"),
    ("storage_transformers.0.type", "hashed", "storage_transformers", "unsupported sharding format"),
    ("storage_transformers.0.configuration", {}, "storage_transformers.configuration", "chunks_per_shard"),
    ("storage_transformers.0.configuration.chunks_per_shard", [0, 2], "chunks_per_shard", "non-positive entry 0"),
    ("storage_transformers.0.configuration.chunks_per_shard", [-1, 2], "chunks_per_shard", "non-positive entry -1"),
    ("storage_transformers.0.configuration.chunks_per_shard", [2, 2, 2], "chunks_per_shard", "more than ndim=2"),
    ("storage_transformers.0.configuration.chunks_per_shard", [2, "2"], "chunks_per_shard", "not an integer"),
    ("storage_transformers.0.configuration.chunks_per_shard", "2", "chunks_per_shard", "expected an integer"),
    ("storage_transformers.0.configuration.chunks_per_shard", [2**17, 2**17], "chunks_per_shard",
     "inner chunks per shard (limit 2**32)"),
    ("storage_transformers.0.configuration.chunks_per_shard", [2**13, 2**14], "chunks_per_shard",
     "byte shard index (limit 1073741824 bytes)"),
    ("extensions", {}, "extensions", "expected a list"),
    ("extensions", [{"extension": "x", "must_understand": True}], "extensions", "unsupported extension"),
]


@pytest.mark.parametrize("path, value, field, words", REJECTIONS, ids=[f"{r[0]}-{r[3]}" for r in REJECTIONS])
def test_rejections_name_key_and_field(path, value, field, words):
    with pytest.raises(DraftMetadataError) as e:
        parse_array_metadata(_mutated(path, value), KEY)
    msg = str(e.value)
    assert msg.startswith(f"{KEY}: field '"), msg
    assert field in msg and words in msg, msg
    assert e.value.key == KEY and e.value.exit_code == 3


@pytest.mark.parametrize(
    "dtype, fill, words",
    [
        ("<f4", "nan", "expected a number"),
        ("<f4", 1e300, "overflows"),
        ("bool", "true", "expected true/false"),
        ("bool", 2, "expected true/false"),
        ({"type": "<c16"}, 1.0, "expected [real, imaginary]"),
        ({"type": "<c16"}, [1.0], "expected [real, imaginary]"),
        ({"type": "|S2"}, "YWJj", "do not fit"),
        ({"type": "<U2"}, "abc", "does not fit"),
        ({"type": "<U2"}, 0, "expected a string"),
        ({"type": [["a", "<i4"]]}, "AQ==", "1 bytes"),
        ({"type": [["a", "<i4"]]}, "!!", "invalid base64"),
        ({"type": "<M8[s]"}, 1.5, "expected an integer"),
        ("u1", -1, "out of range"),
    ],
)
def test_fill_value_must_fit_dtype(dtype, fill, words):
    with pytest.raises(DraftMetadataError) as e:
        parse_array_metadata(base_doc(data_type=dtype, fill_value=fill), KEY)
    assert f"{KEY}: field 'fill_value'" in str(e.value) and words in str(e.value)


@pytest.mark.parametrize(
    "raw, words",
    [(b"", "invalid JSON"), (b"{", "invalid JSON"), (b"[1]", "not a JSON object"), (b'"x"', "not a JSON object"),
     (b"\xff", "not UTF-8"), (b"[" * 100000, "invalid JSON"), (42, "expected JSON")],
)
def test_bad_documents(raw, words):
    with pytest.raises(DraftMetadataError) as e:
        parse_array_metadata(raw, KEY)
    assert str(e.value).startswith(KEY) and words in str(e.value)


def test_path_from_key_and_explicit_path():
    assert parse_array_metadata(base_doc(), "meta/root/x/y.array.json").path == "x/y"
    assert parse_array_metadata(base_doc(), "weird-key", path="/p/q/").path == "p/q"
    with pytest.raises(DraftMetadataError, match="not an array metadata key"):
        parse_array_metadata(base_doc(), "meta/root/x.group.json")


def test_draft_array_document_matches_zarr_defaults():
    m = draft_array_document(DraftArraySpec(
        path="a/b", shape=(5, 6), chunks=(2, 3), dtype="<i2", compressor=numcodecs.Zlib(1), fill_value=0,
        order="C", separator="/", filters=None, attributes={"k": "v"}, chunks_per_shard=(2, 2),
    ))
    assert m == parse_array_metadata(encode_array_metadata(m), "meta/root/a/b.array.json")
    assert json.loads(encode_array_metadata(m)) == base_doc(attributes={"k": "v"})
    assert encode_array_metadata(m) == json.dumps(m.raw, indent=4, sort_keys=True).encode()
    # zarr 2.18 drops the compressor of a 0-d array and writes chunks_per_shard [1]
    z = draft_array_document(DraftArraySpec(
        path="", shape=(), chunks=(), dtype="<f8", compressor=numcodecs.Zlib(1), fill_value=float("nan"),
        order="C", separator="/", filters=(), attributes={}, chunks_per_shard=(),
    ))
    assert z.compressor is None and z.chunks_per_shard == () and np.isnan(z.fill_value)
    assert z.raw["storage_transformers"][0]["configuration"]["chunks_per_shard"] == [1]
    assert z.raw["fill_value"] == "NaN"
    u = draft_array_document(DraftArraySpec(
        path="s", shape=3, chunks=2, dtype="<U4", compressor=None, fill_value=0, order="F", separator=".",
        filters=None, attributes=None, chunks_per_shard=None,
    ))
    assert u.fill_value == "" and u.raw["dimension_separator"] == "." and u.raw["chunk_grid"]["separator"] == "."
    with pytest.raises(DraftMetadataError, match="field 'fill_value'"):
        draft_array_document(DraftArraySpec(path="x", shape=(3,), chunks=(2,), dtype="u1", compressor=None, fill_value=300,
                             order="C", separator="/", filters=None, attributes=None, chunks_per_shard=None))


# --------------------------------------------------------------------------- hypothesis round trip

_DTYPES = ["bool", "i1", "u1", "<i2", ">i2", "<u4", ">i8", "<f2", "<f4", ">f8", "<c8", ">c16",
           "<M8[ns]", ">m8[s]", "|S5", "<U3", ">U2", "[('a','<i4'),('b','u1')]"]


@st.composite
def draft_arrays(draw) -> DraftArrayMeta:
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 50), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.lists(st.integers(1, 20), min_size=ndim, max_size=ndim)))
    spec = draw(st.sampled_from(_DTYPES))
    dtype = np.dtype(eval(spec)) if spec.startswith("[") else np.dtype(spec)
    kind = dtype.kind
    if kind == "f":
        fill = draw(st.one_of(st.none(), st.sampled_from([np.nan, np.inf, -np.inf]),
                              st.floats(-1e4, 1e4, width=16 if dtype.itemsize == 2 else 32)))
    elif kind == "c":
        fill = draw(st.one_of(st.none(), st.just(complex(np.nan, 1)),
                              st.complex_numbers(max_magnitude=1e4, allow_nan=False, width=64)))
    elif kind == "b":
        fill = draw(st.booleans())
    elif kind in "iu":
        info = np.iinfo(dtype)
        fill = draw(st.integers(int(info.min), int(info.max)))
    elif kind in "mM":
        fill = np.array(draw(st.integers(-(2**62), 2**62)), dtype="i8").astype(dtype)[()]
    elif kind == "S":
        fill = draw(st.binary(max_size=5).map(lambda b: b.rstrip(b"\0")))
    elif kind == "U":
        fill = draw(st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=dtype.itemsize // 4))
    else:
        fill = np.frombuffer(draw(st.binary(min_size=5, max_size=5)), dtype=dtype)[0]
    compressor = draw(st.sampled_from([None, numcodecs.Zlib(3), numcodecs.GZip(5), numcodecs.BZ2(2),
                                       numcodecs.Blosc("zstd", 3, -1), numcodecs.Zstd(2), numcodecs.LZ4(),
                                       numcodecs.LZMA()]))
    cps = draw(st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim).map(tuple)))
    attrs = draw(st.dictionaries(st.text(max_size=5).filter(lambda s: s != "filters"),
                                 st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=3))
    path = draw(st.from_regex(r"([a-z0-9_.-]{1,5}/){0,2}[a-z0-9_-]{1,5}", fullmatch=True).filter(
        lambda p: all(s not in (".", "..") for s in p.split("/"))) | st.just(""))
    return draft_array_document(DraftArraySpec(
        path=path, shape=shape, chunks=chunks, dtype=dtype, compressor=compressor, fill_value=fill,
        order=draw(st.sampled_from("CF")), separator=draw(st.sampled_from("/.")), filters=None,
        attributes=attrs, chunks_per_shard=cps,
    ))


def _same_fill(a, b) -> bool:
    if a is None or b is None:
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes() or bool(np.all((a == b) | (a != a) & (b != b)))


@pytest.mark.slow  # 300 random arrays written and read back
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draft_arrays())
def test_round_trip(meta: DraftArrayMeta):
    encoded = encode_array_metadata(meta)
    key = array_meta_key(meta.path)
    again = parse_array_metadata(encoded, key)
    assert encode_array_metadata(again) == encoded
    for f in ("path", "shape", "chunks", "dtype", "order", "separator", "compressor", "filters",
              "chunks_per_shard", "attributes"):
        assert getattr(again, f) == getattr(meta, f), f
    assert _same_fill(again.fill_value, meta.fill_value)
    assert json.loads(encoded) == again.raw
    assert again.shard_shape == tuple(c * n for c, n in zip(meta.chunks, meta.chunks_per_shard_or_ones))
    assert math.prod(meta.chunks_per_shard_or_ones) == meta.n_chunks_per_shard


@pytest.mark.parametrize(("raw", "want"), [
    (b'{"a": 1}', {"a": 1}), ('{"a": [1]}', {"a": [1]}),
    (b"[1, 2]", None), (b'"text"', None), (b"not json", None), (b"\xff\xfe", None),
    ("[" * 100_000 + "]" * 100_000, None),  # past the recursion limit: None, not RecursionError
])
def test_json_object_is_the_object_or_none(raw, want):
    assert dm.json_object(raw) == want
