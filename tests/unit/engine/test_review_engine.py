"""Review of the shard engine and its drivers: each test failed before its fix."""

from __future__ import annotations

import pytest

from sharding_store import ShardingStore


@pytest.mark.parametrize("where", ["local", "dict"])
def test_cached_absent_shard_is_not_served_after_another_writer_creates_it(tmp_path, where):
    """An index cache entry saying "no such shard" carries no version: a reader with the
    cache must not keep answering "absent" (the fill value) after another store (another
    process) wrote the shard."""
    base = str(tmp_path) if where == "local" else {}
    reader = ShardingStore(base, chunks_per_shard=(4,), array_path="a", index_cache_size=16)
    writer = ShardingStore(base, chunks_per_shard=(4,), array_path="a")
    key = "data/root/a/c1"
    assert reader.get(key) is None  # the shard is absent: a cache entry for it now
    writer[key] = b"written"
    assert reader.get(key) == b"written"
    assert key in reader


def test_read_shard_with_a_listed_size_never_parses_a_prefix_of_a_grown_object():
    """``read_shard(key, size)`` (migrate's same-grid read, ``size`` from the listing) must
    not take the first ``size`` bytes of an object that grew since it was listed: the tail
    of that prefix is payload, not an index (here zeros: four empty chunks, "valid")."""
    from sharding_store.api.hierarchy import inner_of
    from sharding_store.engine.shard_engine import ArrayLayout, ShardEngine
    from sharding_store.errors import ObjectChangedError

    base: dict = {}
    writer = ShardingStore(base, chunks_per_shard=(4,), array_path="a")
    writer["data/root/a/c0"] = b"\0" * 64
    key = "data/root/a/c0"  # the shard key of shard 0 is the key of its chunk 0
    listed = len(base[key])
    writer["data/root/a/c1"] = b"\0" * 64  # the shard grows after the listing
    layout = ArrayLayout(path="a", prefix="data/root/a/", ndim=1, separator="/", chunks_per_shard=(4,))
    engine = ShardEngine(inner_of(base), layout)
    try:
        got = engine.read_shard(key, listed)
    except ObjectChangedError:
        return
    assert got is not None
    assert {c: bytes(v) for c, v in got.chunks.items()} == {(0,): b"\0" * 64, (1,): b"\0" * 64}


@pytest.mark.parametrize("where", ["local", "dict"])
def test_cached_index_does_not_hide_a_chunk_another_writer_added(tmp_path, where):
    """A cached index that says "chunk 1 is absent" was never checked against the shard's
    version (no range is read for an absent chunk): after another writer added chunk 1 to
    the shard, a warm reader must not keep answering "absent" (the fill value)."""
    base = str(tmp_path) if where == "local" else {}
    reader = ShardingStore(base, chunks_per_shard=(4,), array_path="a", index_cache_size=16)
    writer = ShardingStore(base, chunks_per_shard=(4,), array_path="a")
    writer["data/root/a/c0"] = b"zero"
    assert reader.get("data/root/a/c0") == b"zero"  # the shard's index is cached now
    assert reader.get("data/root/a/c1") is None
    writer["data/root/a/c1"] = b"one"
    assert "data/root/a/c1" in reader
    assert reader.get("data/root/a/c1") == b"one"
    assert reader.getitems(["data/root/a/c1"]) == {"data/root/a/c1": b"one"}


def test_cached_index_does_not_hide_a_chunk_from_array_reads(tmp_path):
    from sharding_store.api.arrays import create_draft_array, open_draft

    w = create_draft_array(str(tmp_path), "a", shape=(8,), chunks=(2,), dtype="u1", chunks_per_shard=(4,), fill_value=0)
    w[0:2] = 1
    r = open_draft(ShardingStore(str(tmp_path), index_cache_size=16), "a")
    assert r[...].tolist() == [1, 1] + [0] * 6
    w[2:4] = 2  # another writer adds chunk 1 to the shard the reader has cached
    assert r[2:4].tolist() == [2, 2]
    assert r[...].tolist() == [1, 1, 2, 2] + [0] * 4


def test_view_does_not_serve_a_cached_index_that_hides_a_chunk(tmp_path):
    from sharding_store.api.arrays import create_draft_array
    from sharding_store.api.v3view import DraftV3Store, open_v3

    w = create_draft_array(str(tmp_path), "a", shape=(8,), chunks=(2,), dtype="u1", chunks_per_shard=(4,), fill_value=0)
    w[0:2] = 1
    view = DraftV3Store(str(tmp_path))
    a = open_v3(view, "a")
    assert a[0:4].tolist() == [1, 1, 0, 0]
    w[2:4] = 2
    assert open_v3(view, "a")[0:4].tolist() == [1, 1, 2, 2]


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"metadata": [1]}', b'{"metadata": 5}', b"[" * 100000])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "to-dst"])
def test_reshard_with_damaged_consolidated_metadata(tmp_path, content, in_place):
    """A consolidated metadata document that does not parse lists nothing (the in-place
    protocol already treats it so when it records the journal): reshard repacks the array
    and leaves that document alone, instead of dying with a bare JSONDecodeError after the
    journal said "swap" (exit 70, and the store then refused by migrate until a --resume
    that fails the same way)."""
    import os

    import numpy as np

    from sharding_store.api.arrays import create_draft_array, open_draft
    from sharding_store.api.hierarchy import inner_of
    from sharding_store.formats import draft_metadata as dm
    from sharding_store.formats.reshard_journal import interrupted_reshards
    from sharding_store.ops.resharding import reshard

    src = tmp_path / "src"
    w = create_draft_array(str(src), "a", shape=(8,), chunks=(2,), dtype="u1", chunks_per_shard=(2,), fill_value=0)
    w[...] = np.arange(8, dtype="u1")
    cons = src / dm.CONSOLIDATED_KEY
    os.makedirs(cons.parent, exist_ok=True)
    cons.write_bytes(content)
    out = src if in_place else tmp_path / "dst"
    reshard(str(src), None if in_place else str(out), chunks_per_shard=4, progress=False)
    assert interrupted_reshards(inner_of(str(out))) == []
    assert open_draft(str(out), "a").meta.chunks_per_shard == (4,)
    assert open_draft(str(out), "a")[...].tolist() == list(range(8))
    assert (out / dm.CONSOLIDATED_KEY).read_bytes() == content


@pytest.mark.parametrize(
    "damage",
    [
        lambda doc: doc["codecs"][0].__setitem__("configuration", [1]),
        lambda doc: doc["codecs"][0]["configuration"].__setitem__("index_codecs", ["crc32c"]),
        lambda doc: doc.__setitem__("codecs", [[1]]),
    ],
    ids=["configuration-list", "index-codec-string", "codec-list"],
)
def test_verify_reports_a_damaged_destination_document_as_a_difference(tmp_path, damage):
    """A destination ``zarr.json`` whose sharding configuration has the wrong JSON types is a
    difference naming the key, not an AttributeError escaping verify (exit 70)."""
    import json

    import numpy as np

    from sharding_store.api.arrays import create_draft_array
    from sharding_store.ops.migration import migrate
    from sharding_store.ops.verification import verify

    src, dst = tmp_path / "src", tmp_path / "dst"
    create_draft_array(str(src), "a", shape=(8,), chunks=(2,), dtype="u1", chunks_per_shard=(2,))[...] = np.arange(8)
    migrate(str(src), str(dst), progress=False)
    doc = json.loads((dst / "a/zarr.json").read_bytes())
    damage(doc)
    (dst / "a/zarr.json").write_text(json.dumps(doc))
    report = verify(str(src), str(dst), raise_on_error=False, progress=False)
    assert not report.ok
    assert report.check.problems[0][0] == "a/zarr.json"


@pytest.mark.parametrize("raw", [b"{torn", b"[1]", b"\xff\xfe"])
def test_resume_with_an_unreadable_marker_is_refused_with_our_error(tmp_path, raw):
    """``--resume`` into a destination whose migration marker is not a JSON object is refused
    with an error of ours naming the marker (not a JSONDecodeError/AttributeError: exit 70)."""
    import numpy as np

    from sharding_store.api.arrays import create_draft_array
    from sharding_store.errors import ShardingStoreError
    from sharding_store.ops.migration import migrate
    from sharding_store.ops.units import MARKER_KEY

    src, dst = tmp_path / "src", tmp_path / "dst"
    create_draft_array(str(src), "a", shape=(8,), chunks=(2,), dtype="u1", chunks_per_shard=(2,))[...] = np.arange(8)
    dst.mkdir()
    (dst / MARKER_KEY).write_bytes(raw)
    with pytest.raises(ShardingStoreError, match=MARKER_KEY.replace(".", r"\.")):
        migrate(str(src), str(dst), resume=True, progress=False)
    assert (dst / MARKER_KEY).read_bytes() == raw
