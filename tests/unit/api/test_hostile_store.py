"""The hostile corpus at the store and hierarchy level, and fuzzing of shards and documents."""

from __future__ import annotations

import json

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store import ShardCorruptError, ShardingStore
from sharding_store.api.hierarchy import open_hierarchy
from sharding_store.errors import DraftMetadataError, ShardingStoreError, StoreNotFoundError
from sharding_store.formats import draft_metadata as dm
from tests import hostile

GEOMETRY_FIELDS = ("shape", "chunk_shape", "chunks_per_shard", "storage_transformers", "meta/root/bad.array.json")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return {c.name: hostile.build(c, root) for c in hostile.CASES}


@pytest.mark.parametrize("case", [c for c in hostile.CASES if c.level == "shard"], ids=lambda c: c.name)
def test_damaged_shards(case, corpus):
    store = ShardingStore(str(corpus[case.name]))
    good = {f"data/root/good/c{i}/{j}" for i in range(4) for j in range(4)}
    assert set(store.getitems(good)) == good  # the healthy array is untouched
    assert "data/root/bad/c3/3" in store  # other shards of the damaged array still read
    if case.error is None:  # overlapping entries: legal, served faithfully
        assert store["data/root/bad/c0/1"] == store["data/root/bad/c0/0"] == store["data/root/bad/c1/0"]
        return
    with pytest.raises(case.error) as info:
        store["data/root/bad/c1/1"]
    assert case.fragment in str(info.value)
    with pytest.raises(case.error):
        list(store.list_prefix("data/root/bad/"))


@pytest.mark.parametrize("case", [c for c in hostile.CASES if c.level == "metadata"], ids=lambda c: c.name)
def test_damaged_metadata(case, corpus):
    with pytest.raises(case.error) as info:
        open_hierarchy(str(corpus[case.name]))
    assert case.fragment in str(info.value) and "meta/root/bad.array.json" in str(info.value)
    tolerant = open_hierarchy(str(corpus[case.name]), strict=False)
    assert set(tolerant.damaged) == {"bad"} and tolerant.node("good").kind == "array"
    store = ShardingStore(str(corpus[case.name]))
    assert "data/root/good/c0/0" in store
    geometry_broken = any(f in case.fragment for f in GEOMETRY_FIELDS)
    if geometry_broken:  # the wrapper cannot map keys without a valid geometry
        with pytest.raises(DraftMetadataError):
            store["data/root/bad/c0/0"]
    else:  # dtype or codec problems do not stop raw chunk access
        assert isinstance(store["data/root/bad/c0/0"], bytes)


def test_no_entry_point(corpus):
    with pytest.raises(StoreNotFoundError, match="zarr.json"):
        open_hierarchy(str(corpus["no_entry_point"]))


def test_stray_keys_pass_through_and_are_not_chunks(corpus):
    store = ShardingStore(str(corpus["stray_key_under_data_prefix"]))
    listed = list(store.list_prefix("data/root/bad/"))
    assert "data/root/bad/.DS_Store" in listed and len(listed) == 17
    assert store["data/root/bad/c0/0"]


def test_hostile_chunks_per_shard_fails_fast_without_allocating(corpus):
    with pytest.raises(DraftMetadataError, match="chunks_per_shard"):
        open_hierarchy(str(corpus["chunks_per_shard_huge"]))


# ------------------------------------------------------------------------ fuzzing
def _valid_doc() -> dict:
    meta = dm.draft_array_document(dm.DraftArraySpec(
        path="a", shape=(6, 5), chunks=(2, 2), dtype="<f4", compressor=numcodecs.Blosc(), fill_value=0,
        order="C", separator="/", filters=None, attributes={}, chunks_per_shard=(2, 1),
    ))
    return json.loads(dm.encode_array_metadata(meta))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@pytest.mark.slow  # 400 hostile documents; the shard-bytes fuzz tests below stay in the fast loop
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=json_values)
def test_fuzz_metadata_only_our_errors(data, value):
    doc = _valid_doc()
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    node = doc
    for p in path[:-1]:
        node = node[p]
    if data.draw(st.booleans()):
        node[path[-1]] = value
    elif isinstance(node, dict):
        del node[path[-1]]
    try:
        meta = dm.parse_array_metadata(json.dumps(doc), "meta/root/a.array.json", "a")
    except DraftMetadataError as e:
        assert "meta/root/a.array.json" in str(e)
        return
    # accepted: it must be a usable, self-consistent array description
    assert len(meta.shape) == len(meta.chunks) and all(c > 0 for c in meta.chunks)
    assert meta.chunks_per_shard is None or len(meta.chunks_per_shard) == len(meta.shape)


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=300), coords=st.tuples(st.integers(0, 3), st.integers(0, 3)))
def test_fuzz_shard_bytes_only_our_errors(blob, coords):
    """Whatever bytes sit in a shard, a chunk read returns a slice of them or raises ShardCorruptError."""
    inner = {"data/root/a/c0/0": blob}
    store = ShardingStore(inner, chunks_per_shard=(4, 4), array_path="a")
    key = f"data/root/a/c{coords[0]}/{coords[1]}"
    try:
        value = store.get(key)
        keys = list(store)
    except ShardCorruptError as e:
        assert "data/root/a/c0/0" in str(e)
        return
    except ShardingStoreError as e:  # pragma: no cover - any other error class is a bug
        pytest.fail(f"unexpected {type(e).__name__}: {e}")
    if value is not None:
        assert value in blob[: max(0, len(blob) - 256)] or value == b""
        assert key in keys


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=200))
def test_fuzz_shard_bytes_v1_checksummed_index(blob):
    from sharding_store.formats.shard_index import decode_shard

    try:
        chunks = decode_shard(blob, (2, 2), checksum=True)
    except ShardCorruptError:
        return
    assert all(isinstance(v, bytes) for v in chunks.values())
    assert np.all([len(v) <= len(blob) for v in chunks.values()])
