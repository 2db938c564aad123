"""Random valid 2023-spelled array documents normalise to documents zarr-python 3 parses
(``ArrayV3Metadata.from_dict``), with no pre-final spelling left (normalising again changes
nothing), whichever reading of an undeclared shard index the bytes decide."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store.formats.gen2023 import DATA_TYPE_SIZES, classify_node, normalise_node

DTYPES = sorted(DATA_TYPE_SIZES)


def _fill(dtype: str):
    if dtype == "bool":
        return st.sampled_from([0, 1, True, False])
    if dtype.startswith("complex"):
        return st.just([0.0, 1.5])
    if dtype.startswith("float"):
        return st.sampled_from([0, 1.5, "NaN", "Infinity", "-Infinity"])
    return st.integers(0, 100)


@st.composite
def chain(draw, dtype: str, ndim: int, *, inner_allowed: bool):
    """A 2023-era codec chain: optional transpose (letters or permutation), optional
    array->bytes (endian / bytes / none), compressors."""
    codecs = []
    if ndim > 1 and draw(st.booleans()):
        order = draw(st.sampled_from(["C", "F", "perm"]))
        if order == "perm":
            order = draw(st.permutations(list(range(ndim))))
        codecs.append({"name": "transpose", "configuration": {"order": order}})
    ab = draw(st.sampled_from(["none", "endian", "bytes"]))
    endian = draw(st.sampled_from(["little", "big"]))
    if ab == "endian":
        codecs.append({"name": "endian", "configuration": {"endian": endian}})
    elif ab == "bytes":
        codecs.append({"name": "bytes", **({"configuration": {"endian": endian}} if DATA_TYPE_SIZES[dtype] > 1 else {})})
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["gzip", "blosc", "zstd", "crc32c"]))
        if kind == "gzip":
            codecs.append({"name": "gzip", "configuration": {"level": draw(st.integers(0, 9))}})
        elif kind == "zstd":
            conf = {"level": draw(st.integers(-5, 22))}
            if draw(st.booleans()):
                conf["checksum"] = draw(st.booleans())
            codecs.append({"name": "zstd", "configuration": conf})
        elif kind == "crc32c":
            codecs.append({"name": "crc32c"})
        else:
            conf = {"cname": draw(st.sampled_from(["lz4", "zlib", "zstd", "blosclz"])), "clevel": draw(st.integers(0, 9)),
                    "shuffle": draw(st.sampled_from(["noshuffle", "shuffle", "bitshuffle", 0, 1, 2, None, "byte", "bit"]))}
            if draw(st.booleans()):
                conf["typesize"] = draw(st.integers(1, 16))
            if draw(st.booleans()):
                conf["blocksize"] = 0
            codecs.append({"name": "blosc", "configuration": conf})
    if ab == "none" and inner_allowed and not any(c["name"] == "transpose" for c in codecs) and draw(st.booleans()):
        return None  # the caller shards instead
    return codecs


@st.composite
def documents(draw):
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(0, 20), min_size=ndim, max_size=ndim))
    chunks = draw(st.lists(st.integers(1, 8), min_size=ndim, max_size=ndim))
    doc = {
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": draw(st.sampled_from([
            {"name": "default", "configuration": {"separator": "/"}},
            {"name": "default", "configuration": {"separator": "."}},
            {"name": "v2", "configuration": {"separator": "."}},
        ])),
        "fill_value": draw(_fill(dtype)),
    }
    codecs = draw(chain(dtype, ndim, inner_allowed=True))
    if codecs is None or draw(st.booleans()):
        factors = [draw(st.sampled_from([d for d in range(1, c + 1) if c % d == 0])) for c in chunks]
        conf = {"chunk_shape": [c // f for c, f in zip(chunks, factors)],
                "codecs": draw(chain(dtype, ndim, inner_allowed=False))}
        spelling = draw(st.sampled_from(["none", "endian", "bytes"]))
        if spelling != "none":
            conf["index_codecs"] = [{"name": spelling, "configuration": {"endian": "little"}}]
            if draw(st.booleans()):
                conf["index_codecs"].append({"name": "crc32c"})
        if draw(st.booleans()):
            conf["index_location"] = draw(st.sampled_from(["start", "end"]))
        codecs = [{"name": "sharding_indexed", "configuration": conf}]
    doc["codecs"] = codecs
    if draw(st.booleans()):
        doc["attributes"] = {"k": 1}
    choice = draw(st.sampled_from(["absent", "null", "names"]))
    if choice == "null":
        doc["dimension_names"] = None
    elif choice == "names":
        doc["dimension_names"] = [f"d{i}" for i in range(ndim)]
    return doc


@pytest.mark.slow  # 300 documents through zarr-python 3; the 2023 readers' own tests (test_gen2023_*.py) stay fast
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents())
def test_random_2023_documents_normalise_to_what_zarr_python_3_parses(doc):
    from zarr.core.metadata.v3 import ArrayV3Metadata

    n = normalise_node(json.dumps(doc).encode(), "x/zarr.json")
    finals = [n.document] if n.hidden_checksum is not None else [n.document_for("plain"), n.document_for("crc32c-hidden")]
    for final in finals:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meta = ArrayV3Metadata.from_dict(json.loads(json.dumps(final)))
        assert list(meta.shape) == doc["shape"]
        again = normalise_node(json.dumps(final).encode(), "x/zarr.json")
        assert again.is_final and again.document == final, again.changes
        assert classify_node(json.dumps(final)) == "final"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@pytest.mark.slow  # 300 damaged documents; the random documents above stay in the fast loop
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(), data=st.data())
def test_a_damaged_document_is_refused_naming_the_key_never_a_crash(doc, data):
    """Any part of a valid document replaced by any JSON value: a result, or
    DraftMetadataError naming the key; never another exception."""
    from sharding_store.errors import DraftMetadataError

    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(JSON)
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    raw = json.dumps(doc).encode()
    try:
        normalise_node(raw, "x/zarr.json")
    except DraftMetadataError as e:
        assert e.key == "x/zarr.json" and str(e).startswith("x/zarr.json: ")
    assert classify_node(raw) in ("final", "2023", "unknown")
