"""ShardingStore in hierarchy mode: it finds each array's transformer in its draft metadata."""

from __future__ import annotations

import json

import fsspec
import numcodecs
import pytest
import zarr.storage

from sharding_store import ChunkKeyError, DraftMetadataError, ShardingStore
from sharding_store.api.hierarchy import open_hierarchy
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats.shard_index import read_index

SPELLINGS = {
    "zarr-python-2": lambda cps: {"extension": dm.SHARDING_EXTENSION, "type": "indexed", "configuration": {"chunks_per_shard": cps}},
    "seed-002": lambda cps: {"name": "sharding", "configuration": {"chunks_per_shard": cps}},
    "feb-2022": lambda cps: {
        "storage_transformer": dm.SHARDING_EXTENSION,
        "configuration": {"format": "indexed", "chunks_per_shard": cps},
    },
    "late-2022": lambda cps: {
        "extension": "https://purl.org/zarr/spec/extensions/storage_transformers/sharding/1.0",
        "type": "indexed",
        "configuration": {"chunks_per_shard": cps},
    },
    "feb-2023": lambda cps: {"extension": "sharding", "type": "indexed", "configuration": {"chunks_per_shard": cps}},
}


def array_doc(path="a/b", *, shape=(8, 8), chunks=(2, 2), cps=(2, 2), separator="/", transformer=None) -> bytes:
    meta = dm.draft_array_document(dm.DraftArraySpec(
        path=path, shape=shape, chunks=chunks, dtype="<u2", compressor=numcodecs.Zlib(1), fill_value=0,
        order="C", separator=separator, filters=None, attributes={}, chunks_per_shard=cps,
    ))
    if transformer is not None:
        doc = json.loads(dm.encode_array_metadata(meta))
        doc["storage_transformers"] = [transformer]
        return json.dumps(doc).encode()
    return dm.encode_array_metadata(meta)


def new_store(inner=None, **meta_kw):
    inner = {} if inner is None else inner
    store = ShardingStore(inner)
    store["zarr.json"] = dm.encode_entry_point()
    store[dm.array_meta_key(meta_kw.get("path", "a/b"))] = array_doc(**meta_kw)
    return store


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_transformer_spelling(spelling):
    inner = {}
    store = new_store(inner, transformer=SPELLINGS[spelling]([2, 2]))
    store["data/root/a/b/c3/1"] = b"x"
    assert "data/root/a/b/c1/0" in inner and "data/root/a/b/c3/1" not in inner
    assert store["data/root/a/b/c3/1"] == b"x"


def test_metadata_written_through_wrapper_is_picked_up_immediately():
    inner = {}
    store = ShardingStore(inner)
    store["zarr.json"] = dm.encode_entry_point()
    store["data/root/a/b/c3/1"] = b"before"  # no metadata yet: a plain key
    assert inner["data/root/a/b/c3/1"] == b"before"
    del store["data/root/a/b/c3/1"]
    store[dm.array_meta_key("a/b")] = array_doc()
    store["data/root/a/b/c3/1"] = b"after"  # now sharded
    assert "data/root/a/b/c1/0" in inner
    store[dm.array_meta_key("a/b")] = array_doc(cps=None)  # transformer removed: plain again
    store["data/root/a/b/c0/0"] = b"plain"
    assert inner["data/root/a/b/c0/0"] == b"plain"


@pytest.mark.parametrize(
    "cps, shape, written, expected_shard",
    [
        (2, (8, 8, 8), "c3/3/3", "c1/3/3"),  # an int pads with 1s like zarr-python 2.18
        ([2], (8, 8, 8), "c3/3/3", "c1/3/3"),  # shorter than ndim
        ([2, 4], (8, 8, 8), "c3/5/3", "c1/1/3"),
    ],
)
def test_chunks_per_shard_int_and_short(cps, shape, written, expected_shard):
    inner = {}
    store = new_store(inner, shape=shape, chunks=(1, 1, 1), cps=None, transformer=SPELLINGS["zarr-python-2"](cps))
    store["data/root/a/b/" + written] = b"v"
    assert [k for k in inner if k.startswith("data/")] == ["data/root/a/b/" + expected_shard]


def test_unsharded_array_and_other_keys_pass_through():
    inner = {}
    store = new_store(inner, cps=None)
    store["data/root/a/b/c1/1"] = b"raw"
    store["meta/root/x.group.json"] = b"{}"
    assert inner["data/root/a/b/c1/1"] == b"raw"
    assert sorted(store) == sorted(inner)


def test_edge_shards_are_complete_when_all_chunks_in_the_grid_are_given():
    inner = {}
    store = new_store(inner, shape=(5,), chunks=(2,), cps=(2,))  # chunks 0..2; shard 1 holds chunk 2 only
    from sharding_store.testing import CountingInner

    counting = CountingInner(inner)
    store = ShardingStore(counting)
    store.update({"data/root/a/b/c2": b"edge"})
    assert counting.calls["get_ranges"] == 0  # built without reading: the grid ends at chunk 2
    assert read_index(inner["data/root/a/b/c1"], (2,)).get((0,)) == (0, 4)


def test_root_array_and_dot_separator():
    inner = {}
    store = new_store(inner, path="", separator=".", shape=(4, 4), chunks=(1, 1), cps=(2, 2))
    store["data/root/c3.2"] = b"v"
    assert [k for k in inner if k.startswith("data/")] == ["data/root/c1.1"]
    assert list(store.list_prefix("data/")) == ["data/root/c3.2"]


def test_array_path_containing_c_segments():
    inner = {}
    store = new_store(inner, path="c1/c", shape=(4,), chunks=(1,), cps=(2,))
    store["data/root/c1/c/c3"] = b"v"
    assert [k for k in inner if k.startswith("data/")] == ["data/root/c1/c/c1"]
    assert list(store.list_prefix("data/root/c1/")) == ["data/root/c1/c/c3"]


def test_stray_key_write_under_sharded_array_is_refused():
    store = new_store()
    with pytest.raises(ChunkKeyError, match="not a chunk key of the sharded array at 'a/b'"):
        store["data/root/a/b/c1"] = b"2-d array, 1-d key"
    with pytest.raises(ChunkKeyError):
        store["data/root/a/b/.DS_Store"] = b"junk"


def test_invalid_metadata_names_key():
    inner = {"zarr.json": dm.encode_entry_point(), "meta/root/a.array.json": b"{not json"}
    with pytest.raises(DraftMetadataError, match="meta/root/a.array.json"):
        ShardingStore(inner)["data/root/a/c0"]


def test_unsupported_dtype_still_gives_raw_chunk_access():
    """The wrapper only needs the geometry: object arrays' shards are still readable."""
    doc = json.loads(array_doc(path="o", shape=(4,), chunks=(2,), cps=(2,)))
    doc["data_type"] = {"extension": "TODO", "fallback": None, "type": "|O"}
    inner = {"zarr.json": dm.encode_entry_point(), "meta/root/o.array.json": json.dumps(doc).encode()}
    store = ShardingStore(inner)
    store["data/root/o/c1"] = b"payload"
    assert store["data/root/o/c1"] == b"payload" and "data/root/o/c0" in inner


@pytest.mark.parametrize("kind", ["dict", "fsmap", "path", "file-url", "memory-url", "zarr-local", "zarr-memory"])
def test_inner_store_kinds(kind, tmp_path):
    if kind == "dict":
        inner = {}
    elif kind == "fsmap":
        inner = fsspec.get_mapper(f"memory://fsmap-{id(tmp_path)}")
    elif kind == "path":
        inner = str(tmp_path)
    elif kind == "file-url":
        inner = f"file://{tmp_path}"
    elif kind == "memory-url":
        inner = f"memory://url-{id(tmp_path)}"
    elif kind == "zarr-local":
        inner = zarr.storage.LocalStore(str(tmp_path))
    else:
        inner = zarr.storage.MemoryStore()
    store = new_store(inner)
    values = {f"data/root/a/b/c{i}/{j}": bytes([i, j]) * (i + 1) for i in range(4) for j in range(4)}
    store.update(values)
    store["data/root/a/b/c1/1"] = b"changed"
    values["data/root/a/b/c1/1"] = b"changed"
    assert store.getitems(values) == values
    assert sorted(store.list_prefix("data/")) == sorted(values)
    assert store.get_partial_values([("data/root/a/b/c3/3", (-2, None))]) == [values["data/root/a/b/c3/3"][-2:]]
    raw_keys = sorted(k for k in store.inner.list_prefix("data/"))
    assert raw_keys == [f"data/root/a/b/c{i}/{j}" for i in range(2) for j in range(2)]
    store.erase_prefix("data/root/a/b/c0/")
    assert sorted(store.list_prefix("data/")) == sorted(k for k in values if not k.startswith("data/root/a/b/c0/"))


def test_hierarchy_walk_implicit_groups_and_consolidated():
    inner = {
        "zarr.json": dm.encode_entry_point(),
        "meta/root/x/y/arr.array.json": array_doc(path="x/y/arr"),
        "meta/root/g.group.json": dm.encode_group_metadata({"k": 1}),
        "meta/root/consolidated.group.json": dm.encode_group_metadata({}),
        "meta/root/consolidated/.zmetadata": b"{}",
    }
    h = open_hierarchy(inner)
    assert {p: (n.kind, n.explicit) for p, n in h.nodes.items()} == {
        "": ("group", False),
        "g": ("group", True),
        "x": ("group", False),
        "x/y": ("group", False),
        "x/y/arr": ("array", True),
    }
    assert h.node("g").attributes == {"k": 1}
    assert [n.path for n in h.children("x")] == ["x/y"]
