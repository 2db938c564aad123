"""The draft compressors taken by configuration alone (``draft_metadata.KNOWN_COMPRESSORS``,
issue 24 / 26 start-up): a command that only translates documents (``migrate
--virtual=references``) no longer imports numcodecs for them, so every answer must be the
one numcodecs gave.

Parity is checked against the path that builds numcodecs' codec (the table switched off):
for generated compressor configurations (wrong types, out-of-range values, unknown keys,
``id`` inside the configuration) and generated documents, the parsed array, the v3 document
(sharded and not), the inner codec chain, the portability verdict and target, and the
re-encoded draft document are the same, or the same exception class with the same message.
"""

from __future__ import annotations

import json
from typing import Any

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store.formats import draft_metadata as dm
from sharding_store.formats import fill_value as fv
from sharding_store.formats import v3_documents as v3d

KEY = "meta/root/a.array.json"
NAMES = ("zstd", "lz4", "blosc", "gzip", "zlib", "bz2", "lzma")
PARAMS = ("level", "checksum", "acceleration", "cname", "clevel", "shuffle", "blocksize", "typesize", "id", "preset", "x")
#: around every bound of the table and numcodecs' own, plus the wrong types JSON can hold
INTS = st.one_of(
    st.sampled_from([-(2**17) - 1, -(2**17), -1, 0, 1, 2, 3, 5, 9, 10, 22, 23, 100, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**63, 10**30]),
    st.integers(-(2**33), 2**33),
)
VALUES = st.one_of(
    INTS,
    st.booleans(),
    st.sampled_from([1.0, 3.0, 0.5, float("nan"), float("inf"), -0.0]),
    st.sampled_from(["lz4", "lz4hc", "blosclz", "zlib", "zstd", "snappy", "LZ4", "", "zstd "]),
    st.none(),
    st.just([1]),
    st.just({"a": 1}),
)
CONFIGS = st.dictionaries(st.sampled_from(PARAMS), VALUES, max_size=5)
#: plain numeric and time types (the table's domain), with other byte orders and spellings
DATA_TYPES = [
    "bool", "i1", "u1", "<i2", ">i2", "<u2", "<i4", ">u4", "<i8", "<u8", ">u8", "<f2", ">f2", "<f4", ">f4", "<f8", ">f8",
    {"extension": "x", "fallback": None, "type": "<c8"}, {"extension": "x", "fallback": None, "type": ">c16"},
    {"extension": "x", "fallback": None, "type": "<M8[ns]"}, {"extension": "x", "fallback": None, "type": "<m8[s]"},
    {"extension": "x", "fallback": None, "type": "|S3"}, {"extension": "x", "fallback": None, "type": "<U2"},
    {"extension": "x", "fallback": None, "type": [["a", "<i2"], ["b", ">f4"]]},
]


def _numcodecs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the tables off: every compressor is built by numcodecs, every data type and
    fill value parsed by numpy, as before they existed."""
    monkeypatch.setattr(dm, "known_compressor_config", lambda name, config: None)
    monkeypatch.setattr(dm, "plain_type", lambda spelling: None)


def _doc(data_type: Any, name: str | None, config: dict[str, Any], filters: list[dict[str, Any]] | None,
         order: str = "C", fill: Any = None, dims: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "shape": [10, 6], "data_type": data_type, "chunk_grid": {"type": "regular", "chunk_shape": [4, 3], "separator": "/"},
        "chunk_memory_layout": order, "fill_value": fill, "extensions": [],
        "attributes": {"_ARRAY_DIMENSIONS": ["y", "x"]} if dims else {},
        "storage_transformers": [{"type": "indexed", "extension": dm.SHARDING_EXTENSION,
                                  "configuration": {"chunks_per_shard": [2, 2]}}],
    }
    if name is not None:
        doc["compressor"] = {"codec": f"{dm.CODEC_URI_PREFIX}{name}/1.0", "configuration": config}
    if filters is not None:
        doc["attributes"]["filters"] = filters
    return doc


def _answer(step: Any) -> Any:
    """A step's JSON (bytes of floats compared by repr: NaN, -0.0), or its exception."""
    try:
        return ("ok", json.dumps(step(), sort_keys=False, default=repr))
    except Exception as e:  # noqa: BLE001 - the class and the message are what is compared
        return (type(e).__name__, str(e))


def _target(meta: dm.DraftArrayMeta) -> Any:
    target = v3d.portable_target(meta)
    if target is None:
        return None
    return [target.compressor and target.compressor.get_config(), [f.get_config() for f in target.filters],
            v3d.v3_array_document(target)]


STEPS = {
    "v3": v3d.v3_array_document,
    "v3 unsharded": lambda m: v3d.v3_array_document(m, chunks_per_shard=None),
    "v3 resharded": lambda m: v3d.v3_array_document(m, chunks_per_shard=(1, 2)),
    "portable": lambda m: v3d.v3_array_document(m, portable=True),
    "inner": v3d.inner_codecs,
    "problems": v3d.portability_problems,
    "target": _target,
    "draft": lambda m: dm.encode_array_metadata(m).decode(),
    "compressor": lambda m: m.compressor and m.compressor.get_config(),
    "meta": lambda m: repr(m),
    "dtype": lambda m: [m.dtype.str, repr(m.dtype), m.dtype.byteorder],
    "fill": lambda m: [repr(m.fill_value), type(m.fill_value).__name__],
}


def _outcome(doc: dict[str, Any]) -> dict[str, Any]:
    """Each step on a freshly parsed array (a step that builds the codec must not turn the
    next one onto the numcodecs path)."""
    raw = json.dumps(doc).encode()
    parsed = _answer(lambda: repr(dm.parse_array_metadata(raw, KEY)))
    if parsed[0] != "ok":
        return {"parse": parsed}
    return {name: _answer(lambda step=step: step(dm.parse_array_metadata(raw, KEY))) for name, step in STEPS.items()}


def _both(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    new = _outcome(doc)
    with pytest.MonkeyPatch.context() as mp:
        _numcodecs_path(mp)
        old = _outcome(doc)
    return new, old


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), config=CONFIGS)
def test_a_known_configuration_is_what_numcodecs_builds_and_returns(name, config):
    """Whatever the table vouches for, numcodecs builds, hands back the same configuration
    (keys in the same order, values of the same types) and encodes a chunk with."""
    known = dm.known_compressor_config(name, config)
    if known is None:
        return
    codec = numcodecs.get_codec({**config, "id": name})
    got = codec.get_config()
    assert list(got) == list(known) and all(type(got[k]) is type(known[k]) and got[k] == known[k] for k in got)
    for dtype in ("u1", "<i2", ">f4", "<f8", "<c16", "<M8[ns]"):
        chunk = np.arange(12, dtype="u1").view("u1").astype(dtype)
        assert np.array_equal(np.frombuffer(codec.decode(codec.encode(chunk)), dtype=dtype), chunk)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), config=CONFIGS, data_type=st.sampled_from(DATA_TYPES), order=st.sampled_from("CF"))
def test_documents_translate_as_through_numcodecs(name, config, data_type, order):
    new, old = _both(_doc(data_type, name, config, None, order))
    assert new == old


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, data_type=st.sampled_from(DATA_TYPES[:17]),
       filters=st.sampled_from([[], [{"id": "shuffle", "elementsize": 2}], [{"id": "delta", "dtype": "<f8"}]]))
def test_documents_with_filters_translate_as_through_numcodecs(config, data_type, filters):
    """Filters take the numcodecs path for the compressor too; the answers still agree."""
    new, old = _both(_doc(data_type, "blosc", config, filters))
    assert new == old


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("zstd", {"level": 1, "checksum": False}),  # zarr-python 2.18's Zstd()
        ("blosc", {"blocksize": 0, "clevel": 5, "cname": "zstd", "shuffle": 2}),
        ("blosc", {"cname": "lz4", "clevel": 5, "shuffle": -1, "blocksize": 0}),
        ("lz4", {"acceleration": 1}),
        ("gzip", {"level": 6}),
        ("zlib", {"level": 1}),
        ("zstd", {}),
    ],
)
def test_common_documents_are_taken_without_numcodecs_and_agree(name, config):
    """The documents zarr-python 2.18 writes are in the table (so they translate without
    numcodecs) and give numcodecs' answers."""
    assert dm.known_compressor_config(name, config) is not None
    meta = dm.parse_array_metadata(json.dumps(_doc("<f4", name, config, None)).encode(), KEY)
    assert dm.known_compressor(meta) == numcodecs.get_codec({**config, "id": name}).get_config()
    v3d.v3_array_document(meta)
    assert dm.known_compressor(meta) is not None  # translated without building the codec
    new, old = _both(_doc("<f4", name, config, None))
    assert new == old and new["v3"][0] == "ok"


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("zstd", {"level": 1.0}),
        ("zstd", {"level": True}),
        ("zstd", {"level": 23}),
        ("zstd", {"checksum": 1}),
        ("zstd", {"level": 1, "foo": 2}),
        ("blosc", {"cname": "snappy"}),
        ("blosc", {"shuffle": 3}),
        ("blosc", {"typesize": 4}),
        ("gzip", {"level": -1}),
        ("lz4", {"acceleration": 0}),
        ("bz2", {"level": 1}),
    ],
)
def test_other_configurations_take_the_numcodecs_path(name, config):
    """Outside the table (odd types, values numcodecs may refuse or treat its own way,
    unknown keys, other codecs) the codec is built as before, with the same answers."""
    assert dm.known_compressor_config(name, config) is None
    new, old = _both(_doc("<f4", name, config, None))
    assert new == old


#: JSON fill values around every edge the pure decoding must agree with numpy on
FILLS = st.one_of(
    st.none(), st.booleans(), INTS,
    st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e-40, 1e-310, 65504.0, 65520.0, 65519.99, 3.4028235e38, 3.4028236e38,
                     3.5e38, 1.7976931348623157e308, 2.0**63, 2.0**64, -(2.0**63), 1e300, 0.1, 1 / 3]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(lambda f: f * (1 + 2**-24)),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "0x7fc00000", "0x3c00", "0x0", "AAAAAA==", "", "1"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.just(10**400),
    st.lists(st.one_of(st.floats(), st.sampled_from(["NaN", "Infinity", "0x0", 1, 10**400, True])), max_size=3),
)
ALL_TYPES = DATA_TYPES + ["|b1", "|u1", "|i1", "<b1", "b1", "?", "=f4", "f4", "float32", "<f16", {"type": "<f4"}, {"x": 1},
                          {"extension": "x", "type": "bool"}, "<i16", ">c8", "|f4", None, 3, ["<f4"]]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_type=st.sampled_from(ALL_TYPES), fill=FILLS, name=st.sampled_from([None, "zstd", "blosc"]),
       dims=st.booleans())
def test_data_types_and_fill_values_translate_as_through_numpy(data_type, fill, name, dims):
    """Data types (odd spellings, byte orders, '|' forms, extension objects) and fill values
    (NaN, infinities, -0.0, float32/float16 rounding and overflow, huge integers, strings,
    base64, bit patterns, bools, lists): the same documents, values and refusals as numpy's."""
    new, old = _both(_doc(data_type, name, {}, None, fill=fill, dims=dims))
    assert new == old


@settings(max_examples=800, deadline=None)
@given(spelling=st.sampled_from(sorted(fv.PLAIN_TYPES)), fill=FILLS)
def test_plain_fill_is_numpys_value(spelling, fill):
    """Whatever :func:`plain_fill` takes, numpy decodes to the same value (bits of floats
    compared), and :func:`plain_fill_json` spells it as :func:`encode_fill_value` does."""
    t = fv.PLAIN_TYPES[spelling]
    dtype = np.dtype(spelling)
    assert (t.kind, t.itemsize, t.big) == (dtype.kind, dtype.itemsize, dtype.byteorder == ">")
    value = fv.plain_fill(fill, t)
    if value is fv.NOT_PLAIN:
        return
    ref = fv.decode_fill_value(fill, dtype)
    if ref is None:
        assert value is None
    else:
        mine = np.array(value if t.kind != "c" else complex(*value), dtype=dtype.newbyteorder("="))
        assert mine.tobytes() == np.array(ref, dtype=dtype.newbyteorder("=")).tobytes()
    want = fv.encode_fill_value(dtype.type(0) if ref is None else ref, dtype)
    assert json.dumps(fv.plain_fill_json(value, t)) == json.dumps(want)
