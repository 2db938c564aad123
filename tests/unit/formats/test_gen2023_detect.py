"""Recognising the generation of a store (``hierarchy.detect_generation``, ``walk_v3_nodes``):
2022 draft, 2023 intermediate (a 2023-spelled node anywhere, or an implicit root/group),
final v3, Zarr v2, nothing; a hierarchy mixing generations names the first node of the other
one; the walk never lists below an array.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from sharding_store.api.hierarchy import (
    Generation,
    detect_generation,
    draft_entry_point,
    require_final_v3,
    walk_v3_nodes,
)
from sharding_store.errors import DraftMetadataError, StoreNotFoundError
from sharding_store.formats import draft_metadata as dm
from sharding_store.stores import as_inner

from ... import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


def array(codecs=None, **over) -> bytes:
    doc = {
        "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "int16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "attributes": {},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}] if codecs is None else codecs,
    }
    doc.update(over)
    return json.dumps(doc).encode()


FINAL = array()
A2023 = array([{"name": "endian", "configuration": {"endian": "little"}}], dimension_names=None)


def gen(store: dict) -> tuple[Generation, str | None]:
    return detect_generation(as_inner(dict(store)))


def test_each_generation():
    assert gen({"zarr.json": dm.encode_entry_point(), "meta/root.group.json": b"{}"}) == (Generation.DRAFT_2022, "zarr.json")
    assert gen({"zarr.json": GROUP, "x/zarr.json": FINAL, "x/c/0": b"\0" * 4}) == (Generation.FINAL_V3, "zarr.json")
    assert gen({"zarr.json": FINAL, "c/0": b"\0" * 4}) == (Generation.FINAL_V3, "zarr.json")
    assert gen({"zarr.json": GROUP, "x/zarr.json": FINAL, "y/zarr.json": A2023}) == (Generation.DRAFT_2023, "y/zarr.json")
    assert gen({"zarr.json": A2023}) == (Generation.DRAFT_2023, "zarr.json")  # the root itself an array
    assert gen({".zgroup": b'{"zarr_format": 2}', "x/.zarray": b"{}"}) == (Generation.ZARR_V2, ".zgroup")
    assert gen({}) == (Generation.NONE, None)
    assert gen({"notes.txt": b"hello", "d/e/f.bin": b"1"}) == (Generation.NONE, None)
    assert gen({"zarr.json": b'{"zarr_format": 4}'}) == (Generation.UNKNOWN, "zarr.json")


def test_implicit_root_and_implicit_groups_are_2023():
    assert gen({"a/zarr.json": FINAL}) == (Generation.DRAFT_2023, "a/zarr.json")
    assert gen({"a/zarr.json": A2023, "a/c/0": b"xx"}) == (Generation.DRAFT_2023, "a/zarr.json")
    walk = walk_v3_nodes(as_inner({"zarr.json": GROUP, "g/h/zarr.json": FINAL, "stray/readme": b""}))
    assert walk.implicit == ["g"] and [n.path for n in walk.nodes] == ["", "g/h"]
    assert walk.generation is Generation.DRAFT_2023 and walk.first_2023() == "g/h/zarr.json"


def test_a_damaged_node_is_its_own_node_only():
    walk = walk_v3_nodes(as_inner({"zarr.json": GROUP, "a/zarr.json": b"{not json", "b/zarr.json": FINAL}))
    assert [(n.path, n.spelling) for n in walk.nodes] == [("", "final"), ("a", "unknown"), ("b", "final")]
    assert walk.generation is Generation.FINAL_V3


@pytest.mark.parametrize("extra, named", [
    ({"b/.zarray": b"{}"}, "b/.zarray"),
    ({"b/.zgroup": b"{}", "b/c/zarr.json": FINAL}, "b/.zgroup"),
    ({"b/zarr.json": FINAL, "b/.zarray": b"{}"}, "b/.zarray"),
    ({"b/zarr.json": dm.encode_entry_point()}, "b/zarr.json"),
    ({"meta/root/x.array.json": b"{}"}, "meta/root"),
    ({"b/.zarray": b"{}", "c/.zarray": b"{}"}, "b/.zarray"),  # the first in walk order
])
def test_mixed_generations_name_the_first_node_of_the_other(extra, named):
    for root in ({"zarr.json": GROUP, "a/zarr.json": A2023}, {"zarr.json": GROUP, "a/zarr.json": FINAL}, {"a/zarr.json": A2023}):
        with pytest.raises(DraftMetadataError) as e:
            gen({**root, **extra})
        assert e.value.key == named and str(e.value).startswith(f"{named}: the hierarchy mixes generations")


class Listing:
    """An inner that records what was listed."""

    def __init__(self, inner):
        self.inner, self.listed = inner, []

    def list_dir(self, prefix):
        self.listed.append(prefix)
        return self.inner.list_dir(prefix)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_walk_never_lists_below_an_array():
    inner = Listing(as_inner({"zarr.json": GROUP, "a/zarr.json": A2023, "a/c/0": b"x", "a/c/1/.zarray": b"{}",
                              "g/zarr.json": GROUP, "g/b/zarr.json": FINAL, "g/b/c/0": b"y"}))
    gen_, key = detect_generation(inner)
    assert (gen_, key) == (Generation.DRAFT_2023, "a/zarr.json")
    assert inner.listed == ["", "a/", "g/", "g/b/"]


def test_entry_point_and_destination_checks_say_2023():
    inner = as_inner({"zarr.json": GROUP, "a/zarr.json": A2023})
    with pytest.raises(StoreNotFoundError, match="2023 intermediate generation") as e:
        draft_entry_point(inner, GROUP, "src")
    assert e.value.exit_code == 7
    with pytest.raises(StoreNotFoundError, match=r"not a Zarr v3 hierarchy: a draft-era \(2023 intermediate\)"):
        require_final_v3(inner, "dst")


def test_zarr_python_3_stores_are_final(tmp_path):
    g = zarr.open_group(str(tmp_path / "z.zarr"), mode="w", zarr_format=3)
    g.create_array("x", shape=(4,), dtype="i4", chunks=(2,))[...] = np.arange(4)
    g.create_array("s/y", shape=(4, 4), dtype="f4", chunks=(2, 2), shards=(4, 4), dimension_names=["a", "b"])
    g.create_array("b", shape=(3,), dtype="bool", compressors=zarr.codecs.BloscCodec(cname="lz4", shuffle="bitshuffle"))
    zarr.consolidate_metadata(str(tmp_path / "z.zarr"))
    assert detect_generation(as_inner(str(tmp_path / "z.zarr"))) == (Generation.FINAL_V3, "zarr.json")


@fixtures.needs(fixtures.DRAFT_2023)
def test_the_real_2023_stores_are_recognised():
    for store in fixtures.store_paths(fixtures.ZARRJS_ZARRITA_2023):
        assert detect_generation(as_inner(str(store))) == (Generation.DRAFT_2023, "a/zarr.json"), store
    g, key = detect_generation(as_inner(str(fixtures.ZARRITAJS_2023_ENDIAN / "data.zarr")))
    assert g is Generation.DRAFT_2023 and key == "1d.chunked.compressed.sharded.i2/zarr.json"


def test_a_v3_group_called_meta_root_is_no_2022_tree():
    store = {"zarr.json": GROUP, "meta/root/zarr.json": GROUP, "meta/root/x/zarr.json": FINAL, "meta/root/x/c/0": b"1"}
    assert gen(store) == (Generation.DRAFT_2023, "meta/root/zarr.json")  # "meta" is an implicit group
