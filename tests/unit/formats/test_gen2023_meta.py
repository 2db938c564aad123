"""The 2023 intermediate generation's node documents, normalised to final v1.0 (meta2023).

One test per spelling of DRAFT-FORMAT.md / issue 14, damaged documents (never guessed), and
final documents left alone. Pure: no store, no zarr.
"""

from __future__ import annotations

import copy
import json

import pytest

from sharding_store.errors import DraftMetadataError
from sharding_store.formats.gen2023 import classify_node, normalise_node

BLOSC_2023 = {"name": "blosc", "configuration": {"cname": "zlib", "clevel": 5, "shuffle": "noshuffle", "blocksize": 0}}
GZIP = {"name": "gzip", "configuration": {"level": 5}}
BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}


def array_doc(**over):
    doc = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4, 6],
        "data_type": "int16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [BYTES_LE],
        "attributes": {},
    }
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not DROP}


DROP = object()


def final_of(doc):
    n = normalise_node(json.dumps(doc).encode(), "x/zarr.json")
    return n


def test_a_final_document_is_left_alone():
    doc = array_doc(codecs=[BYTES_LE, GZIP], dimension_names=["y", None], storage_transformers=[])
    n = final_of(doc)
    assert n.is_final and n.changes == () and n.hidden_checksum is False
    assert n.document == doc
    assert classify_node(json.dumps(doc)) == "final"


def test_final_group_and_zarr_python_extras():
    doc = {"zarr_format": 3, "node_type": "group", "attributes": {"a": 1},
           "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}}}
    n = final_of(doc)
    assert n.is_final and n.document == doc


@pytest.mark.parametrize("codecs", [[], [BLOSC_2023], [GZIP], [{"name": "crc32c"}]])
def test_no_array_to_bytes_codec_gets_bytes_little(codecs):
    n = final_of(array_doc(codecs=codecs))
    assert n.document["codecs"] == [BYTES_LE, *codecs]
    assert any("'bytes' (little endian) inserted" in c for c in n.changes)
    assert classify_node(json.dumps(array_doc(codecs=codecs))) == "2023"


def test_bytes_is_inserted_after_transpose_and_without_endian_for_one_byte_types():
    n = final_of(array_doc(data_type="uint8", codecs=[{"name": "transpose", "configuration": {"order": "F"}}, GZIP]))
    assert n.document["codecs"] == [
        {"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes"}, GZIP,
    ]


@pytest.mark.parametrize("endian", ["little", "big"])
def test_endian_codec_becomes_bytes(endian):
    n = final_of(array_doc(data_type="float32", codecs=[{"name": "endian", "configuration": {"endian": endian}}, GZIP]))
    assert n.document["codecs"][0] == {"name": "bytes", "configuration": {"endian": endian}}
    assert "'endian' codec -> 'bytes'" in n.changes[0]


def test_endian_codec_for_bool_drops_the_endianness():
    n = final_of(array_doc(data_type="bool", fill_value=False, codecs=[{"name": "endian", "configuration": {"endian": "little"}}]))
    assert n.document["codecs"] == [{"name": "bytes"}]


@pytest.mark.parametrize("order, perm", [("C", [0, 1, 2]), ("F", [2, 1, 0])])
def test_transpose_order_letters_become_permutations(order, perm):
    doc = array_doc(shape=[2, 3, 4], chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2, 3, 4]}},
                    codecs=[{"name": "transpose", "configuration": {"order": order}}, BYTES_LE])
    n = final_of(doc)
    assert n.document["codecs"][0] == {"name": "transpose", "configuration": {"order": perm}}


@pytest.mark.parametrize("shuffle, name", [(0, "noshuffle"), (1, "shuffle"), (2, "bitshuffle"),
                                           (None, "noshuffle"), ("byte", "shuffle"), ("bit", "bitshuffle")])
def test_blosc_shuffle_spellings(shuffle, name):
    blosc = {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": shuffle, "typesize": 2, "blocksize": 0}}
    n = final_of(array_doc(codecs=[BYTES_LE, blosc]))
    assert n.document["codecs"][1]["configuration"]["shuffle"] == name


@pytest.mark.parametrize("data_type, size", [("int16", 2), ("float64", 8), ("uint8", 1), ("complex128", 16)])
def test_blosc_typesize_from_the_data_type(data_type, size):
    blosc = {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle"}}
    fill = [0, 0] if data_type.startswith("complex") else 0
    n = final_of(array_doc(data_type=data_type, fill_value=fill, codecs=[blosc]))
    assert n.document["codecs"][-1]["configuration"] == {
        "cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": size, "blocksize": 0}


def test_blosc_noshuffle_without_typesize_is_final():
    blosc = {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "noshuffle", "blocksize": 0}}
    assert final_of(array_doc(codecs=[BYTES_LE, blosc])).is_final


def test_sharding_without_index_codecs_is_undecided():
    sharding = {"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 3], "codecs": [BLOSC_2023]}}
    n = final_of(array_doc(codecs=[sharding]))
    assert n.hidden_checksum is None
    conf = n.document["codecs"][0]["configuration"]
    assert conf["codecs"] == [BYTES_LE, BLOSC_2023]
    assert conf["index_codecs"] == [BYTES_LE] and conf["index_location"] == "end"
    hidden = n.document_for("crc32c-hidden")["codecs"][0]["configuration"]
    assert hidden["index_codecs"] == [BYTES_LE, {"name": "crc32c"}]
    assert n.document_for("plain") == n.document
    assert n.document["codecs"][0]["configuration"]["index_codecs"] == [BYTES_LE]  # not mutated


def test_sharding_with_endian_index_codecs_and_no_index_location():
    endian = {"name": "endian", "configuration": {"endian": "little"}}
    sharding = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1], "codecs": [endian, GZIP], "index_codecs": [endian, {"name": "crc32c"}]}}
    n = final_of(array_doc(codecs=[sharding]))
    assert n.hidden_checksum is False
    assert n.document["codecs"] == [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1], "codecs": [BYTES_LE, GZIP],
        "index_codecs": [BYTES_LE, {"name": "crc32c"}], "index_location": "end"}}]
    with pytest.raises(ValueError):
        n.document_for("plain")


def test_nested_codecs_are_normalised_recursively():
    inner = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1], "codecs": [{"name": "transpose", "configuration": {"order": "F"}}, GZIP],
        "index_codecs": [{"name": "endian", "configuration": {"endian": "little"}}]}}
    outer = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 3], "codecs": [inner], "index_codecs": [BYTES_LE], "index_location": "start"}}
    n = final_of(array_doc(codecs=[outer]))
    got = n.document["codecs"][0]["configuration"]["codecs"][0]["configuration"]
    assert got["codecs"] == [{"name": "transpose", "configuration": {"order": [1, 0]}}, BYTES_LE, GZIP]
    assert got["index_codecs"] == [BYTES_LE] and got["index_location"] == "end"


def test_undeclared_index_in_a_nested_sharding_codec_is_refused():
    inner = {"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1], "codecs": []}}
    outer = {"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 3], "codecs": [inner],
                                                           "index_codecs": [BYTES_LE], "index_location": "end"}}
    with pytest.raises(DraftMetadataError, match=r"x/zarr.json: field 'codecs\[0\].configuration.codecs\[0\].configuration.index_codecs'"):
        final_of(array_doc(codecs=[outer]))


def test_dimension_names_null_and_missing_attributes():
    n = final_of(array_doc(dimension_names=None, attributes=DROP))
    assert "dimension_names" not in n.document and n.document["attributes"] == {}
    assert len(n.changes) == 2
    g = final_of({"zarr_format": 3, "node_type": "group"})
    assert g.document == {"zarr_format": 3, "node_type": "group", "attributes": {}} and not g.is_final


@pytest.mark.parametrize("cke", [
    {"name": "default", "configuration": {"separator": "/"}},
    {"name": "default", "configuration": {"separator": "."}},
    {"name": "default"},
    {"name": "v2", "configuration": {"separator": "."}},
    {"name": "v2", "configuration": {"separator": "/"}},
])
def test_chunk_key_encodings_are_kept(cke):
    n = final_of(array_doc(chunk_key_encoding=cke))
    assert n.is_final and n.document["chunk_key_encoding"] == cke


def test_big_endian_data_and_chunks_larger_than_the_array():
    doc = array_doc(shape=[3, 5], data_type="float32", chunk_grid={"name": "regular", "configuration": {"chunk_shape": [64, 64]}},
                    codecs=[{"name": "endian", "configuration": {"endian": "big"}}])
    n = final_of(doc)
    assert n.document["codecs"] == [{"name": "bytes", "configuration": {"endian": "big"}}]
    assert n.document["chunk_grid"]["configuration"]["chunk_shape"] == [64, 64]


def test_bool_fill_value_zero_and_zstd_checksum():
    n = final_of(array_doc(data_type="bool", fill_value=0, codecs=[{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 3}}]))
    assert n.document["fill_value"] is False
    assert n.document["codecs"][1] == {"name": "zstd", "configuration": {"level": 3, "checksum": False}}


def test_the_input_document_is_not_mutated():
    doc = array_doc(codecs=[], dimension_names=None)
    before = copy.deepcopy(doc)
    final_of(doc)
    assert doc == before


def test_normalising_twice_changes_nothing():
    doc = array_doc(codecs=[{"name": "transpose", "configuration": {"order": "F"}}, BLOSC_2023], dimension_names=None)
    once = final_of(doc).document
    assert final_of(once).is_final and final_of(once).document == once


def test_unknown_codecs_pass_through_a_final_chain_but_not_an_undecidable_one():
    delta = {"name": "numcodecs.delta", "configuration": {"dtype": "<i2"}}
    assert final_of(array_doc(codecs=[delta, BYTES_LE])).is_final
    with pytest.raises(DraftMetadataError, match=r"field 'codecs': no known array->bytes codec and an unknown codec codecs\[0\]"):
        final_of(array_doc(codecs=[delta, GZIP]))


# ---------------------------------------------------------------------------------------- damage

DAMAGED = [
    (dict(codecs=[{"name": "endian", "configuration": {"endian": "middle"}}]), "codecs[0].configuration"),
    (dict(codecs=[{"name": "transpose", "configuration": {"order": "X"}}, BYTES_LE]), "codecs[0].configuration.order"),
    (dict(codecs=[{"name": "transpose", "configuration": {"order": [0, 0]}}, BYTES_LE]), "codecs[0].configuration.order"),
    (dict(codecs=[BYTES_LE, {"name": "blosc", "configuration": {"cname": "zlib", "clevel": 5, "shuffle": "sideways"}}]),
     "codecs[1].configuration.shuffle"),
    (dict(codecs=[BYTES_LE, {"name": "blosc", "configuration": {"cname": "nope", "clevel": 5, "shuffle": 0}}]),
     "codecs[1].configuration.cname"),
    (dict(codecs=[{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 3], "codecs": [],
                                                                  "index_location": "middle"}}]),
     "codecs[0].configuration.index_location"),
    (dict(codecs=[{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 4], "codecs": []}}]),
     "codecs[0].configuration.chunk_shape"),
    (dict(codecs=[{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 3], "codecs": [],
                                                                  "index_codecs": [GZIP]}}]),
     "codecs[0].configuration.index_codecs[0]"),
    (dict(codecs=[GZIP, BYTES_LE]), "codecs"),
    (dict(codecs=[BYTES_LE, BYTES_LE]), "codecs"),
    (dict(codecs=[{"name": "bytes"}]), "codecs[0].configuration"),
    (dict(codecs="bytes"), "codecs"),
    (dict(dimension_names=["a"]), "dimension_names"),
    (dict(attributes=[]), "attributes"),
    (dict(fill_value=None), "fill_value"),
    (dict(fill_value=70000), "fill_value"),
    (dict(shape=[4, -1]), "shape"),
    (dict(chunk_grid={"name": "rectangular", "configuration": {"chunk_shape": [2, 3]}}), "chunk_grid"),
    (dict(chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2]}}), "chunk_grid.configuration.chunk_shape"),
    (dict(chunk_key_encoding={"name": "default", "configuration": {"separator": "-"}}), "chunk_key_encoding.configuration.separator"),
    (dict(storage_transformers=[{"name": "sharding"}]), "storage_transformers"),
    (dict(chunk_memory_layout="C"), "chunk_memory_layout"),
    (dict(shape=DROP), "shape"),
]


@pytest.mark.parametrize("over, fld", DAMAGED, ids=[f for _, f in DAMAGED])
def test_damaged_documents_name_key_and_field(over, fld):
    with pytest.raises(DraftMetadataError) as e:
        final_of(array_doc(**over))
    assert str(e.value).startswith(f"x/zarr.json: field '{fld}': ")
    assert e.value.key == "x/zarr.json"


def test_classification_sees_2023_spellings_in_a_damaged_document():
    doc = array_doc(codecs=[], fill_value=None)
    assert classify_node(json.dumps(doc)) == "2023"
    assert classify_node(json.dumps(array_doc(fill_value=None))) == "final"  # damaged, but nothing of 2023
    assert classify_node(b"not json") == "unknown"
    assert classify_node(json.dumps({"zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0"})) == "draft-2022"
    assert classify_node(json.dumps({"zarr_format": 2})) == "unknown"


@pytest.mark.parametrize("raw, fld", [
    (b"{", None), (json.dumps({"zarr_format": 2, "node_type": "array"}).encode(), "zarr_format"),
    (json.dumps({"zarr_format": 3, "node_type": "folder"}).encode(), "node_type"),
])
def test_not_a_node_document(raw, fld):
    with pytest.raises(DraftMetadataError, match="x/zarr.json: " + (f"field '{fld}'" if fld else "invalid JSON")):
        normalise_node(raw, "x/zarr.json")


def test_short_hand_codec_names_are_kept():
    doc = array_doc(data_type="uint8", codecs=["bytes", "crc32c"])
    n = final_of(doc)
    assert n.is_final and n.document["codecs"] == ["bytes", "crc32c"]
    n = final_of(array_doc(codecs=["crc32c"]))
    assert n.document["codecs"] == [BYTES_LE, "crc32c"]
