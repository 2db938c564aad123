"""``open_v3`` reads through the same checks as ``open_draft`` (issue 12 item 5; item 8's
index part): one read path, the shard engine's.

* an unsharded array whose objects are really shards (the lost transformer) is refused;
* a damaged shard index — an entry pointing into the index itself, one overlapping the end
  of the object, a half sentinel — is a ShardCorruptError naming the shard, whether zarr
  reads the shard whole or its index and then chunks;
* a payload that does not decode to one chunk is a ChunkDecodeError naming the chunk
  (zarr's own codecs would raise bare zlib.error / ValueError, or read wrong values);
* an object shorter than the index it claims is refused before an index is allocated.

Written against public behaviour (open_v3, open_draft, ShardingStore, create_draft_array), so
the file runs on 6befc1a too, where each of these read wrong values or raised bare errors.
"""

from __future__ import annotations

import json
import tracemalloc
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import ShardingStore
from sharding_store.api.arrays import create_draft_array, open_draft
from sharding_store.api.v3view import DraftV3Store, open_v3
from sharding_store.errors import ChunkDecodeError, DraftMetadataError, ShardCorruptError
from sharding_store.formats import draft_metadata as dm
from tests import hostile
from tests.draft_factory import PartialMapping

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SHARD = "data/root/h/c0/0"
IDX = 4 * 16  # (2, 2) chunks per shard


def _array(root: Path, compressor=None) -> np.ndarray:
    """An (8, 8) u2 array of (4, 4) chunks in one (2, 2) shard, and its values."""
    data = np.arange(64, dtype="<u2").reshape(8, 8) + 1000
    a = create_draft_array(str(root), "h", shape=(8, 8), chunks=(4, 4), dtype="<u2", chunks_per_shard=(2, 2),
                           compressor=compressor)
    a[...] = data
    return data


def _damage(root: Path, edit) -> None:
    """Rewrite the shard's index entries ((4, 2) uint64) with ``edit(entries, object size)``."""
    path = root / SHARD
    blob = path.read_bytes()
    entries = np.frombuffer(blob[-IDX:], "<u8").reshape(4, 2).copy()
    edit(entries, len(blob))
    path.write_bytes(blob[:-IDX] + entries.astype("<u8").tobytes())


DAMAGE = {
    # chunk (1, 1) lies inside the index: zarr-python 3 served the index bytes as its data
    "points-into-index": (lambda e, size: e.__setitem__(3, (size - IDX, 32)), "outside the payload area"),
    # chunk (1, 1) overlaps the end of the payload area and the index
    "overlaps-the-end": (lambda e, size: e.__setitem__(3, (int(e[3, 0]), size - int(e[3, 0]))), "outside the payload area"),
    "half-sentinel": (lambda e, size: e.__setitem__((3, 1), 2**64 - 1), "one sentinel field"),
}


@pytest.mark.parametrize("selection", ["whole", "one-chunk"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_index_is_refused_through_open_v3_naming_the_shard(tmp_path, damage, selection):
    _array(tmp_path)
    edit, fragment = DAMAGE[damage]
    _damage(tmp_path, edit)
    key = np.s_[...] if selection == "whole" else np.s_[4:8, 4:8]  # one chunk: index, then a range
    with pytest.raises(ShardCorruptError, match=fragment) as through_view:
        open_v3(str(tmp_path), "h")[key]
    assert SHARD in str(through_view.value)
    with pytest.raises(ShardCorruptError, match=fragment):  # what open_draft says, too
        open_draft(str(tmp_path), "h")[key]


def test_an_index_entry_into_the_index_is_refused_when_the_size_is_unknown(tmp_path):
    """A store whose tail reads do not tell the object's size (a zarr-python 2 style mapping
    with get_partial_values): the chunk range is read a little longer and comes back short."""

    Partial = PartialMapping

    inner = Partial()
    store = ShardingStore(inner, chunks_per_shard=(2, 2), array_path="h")
    store.update({f"data/root/h/c{i}/{j}": bytes([i * 2 + j]) * 100 for i in range(2) for j in range(2)})
    blob = inner[SHARD]
    entries = np.frombuffer(blob[-IDX:], "<u8").reshape(4, 2).copy()
    entries[3] = (len(blob) - IDX, 32)  # inside the index
    inner[SHARD] = blob[:-IDX] + entries.astype("<u8").tobytes()
    assert store["data/root/h/c0/0"] == bytes([0]) * 100
    with pytest.raises(ShardCorruptError, match=SHARD):
        store["data/root/h/c1/1"]


@pytest.mark.parametrize("selection", ["whole", "one-chunk"])
@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "unsharded"])
def test_an_undecodable_payload_is_a_chunk_decode_error_through_open_v3(tmp_path, sharded, selection):
    a = create_draft_array(str(tmp_path), "h", shape=(8, 8), chunks=(4, 4), dtype="<u2",
                           chunks_per_shard=(2, 2) if sharded else None, compressor=numcodecs.Zlib(1))
    a[...] = np.arange(64, dtype="<u2").reshape(8, 8)
    garbage = b"this is no zlib stream at all" * 3
    if sharded:  # a valid shard whose chunk (1, 1) holds garbage
        store = ShardingStore(str(tmp_path))
        store["data/root/h/c1/1"] = garbage
    else:
        (tmp_path / "data/root/h/c1/1").write_bytes(garbage)
    key = np.s_[...] if selection == "whole" else np.s_[4:8, 4:8]
    with pytest.raises(ChunkDecodeError, match="data/root/h/c1/1"):
        open_v3(str(tmp_path), "h")[key]
    np.testing.assert_array_equal(open_v3(str(tmp_path), "h")[0:4, 0:4], np.arange(64, dtype="<u2").reshape(8, 8)[:4, :4])


def test_a_lost_transformer_array_is_refused_through_open_v3(tmp_path):
    root = hostile.build(hostile.CASE_BY_NAME["lost_transformer"], tmp_path)
    with pytest.raises(DraftMetadataError, match="looks sharded"):
        open_v3(str(root), "bad")
    with pytest.raises(DraftMetadataError, match="looks sharded"):  # through a group, too
        open_v3(str(root))["bad"]
    with pytest.raises(DraftMetadataError, match="looks sharded"):
        open_draft(str(root), "bad")
    np.testing.assert_array_equal(open_v3(str(root), "good")[...], hostile.values("good"))


def test_a_shard_rewritten_between_the_index_and_the_chunk_read_gives_the_chunk(tmp_path):
    """zarr reads a shard's index, then a chunk range from it; the object may be replaced in
    between. The view serves the chunk the index named, from the shard as it is now."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    data = _array(tmp_path, compressor=None)
    view = DraftV3Store(str(tmp_path))
    proto = default_buffer_prototype()
    open_v3(view, "h")
    raw = sync(view.get("h/c/0/0", proto, byte_range=SuffixByteRequest(IDX))).to_bytes()
    entries = np.frombuffer(raw, "<u8").reshape(4, 2)
    start, nbytes = int(entries[3, 0]), int(entries[3, 1])  # what zarr would ask for chunk (1, 1)
    # another writer rewrites chunk (0, 0) bigger: chunk (1, 1)'s bytes move
    ShardingStore(str(tmp_path))["data/root/h/c0/0"] = b"\0" * 77
    got = sync(view.get("h/c/0/0", proto, byte_range=RangeByteRequest(start, start + nbytes))).to_bytes()
    assert np.array_equal(np.frombuffer(got, "<u2").reshape(4, 4), data[4:8, 4:8])


def test_an_object_shorter_than_its_claimed_index_is_refused_without_allocating_it(tmp_path):
    """Metadata claiming 2**24 chunks per shard (a 256 MiB index) over a 1 KiB shard object."""
    _array(tmp_path)
    key = tmp_path / dm.array_meta_key("h")
    doc = json.loads(key.read_bytes())
    doc["shape"] = [2**24 * 4, 8]
    for t in doc["storage_transformers"]:
        t["configuration"]["chunks_per_shard"] = [2**24, 1]
    key.write_text(json.dumps(doc))
    a = open_draft(str(tmp_path), "h")
    tracemalloc.start()
    try:
        with warnings.catch_warnings(), pytest.raises(ShardCorruptError, match=SHARD):
            a[0:4, 0:4]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert (a[0:4, 4:8] == 0).all()  # shard c0/1 does not exist: the fill value, no index made
        absent_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"{peak / 2**20:.0f} MiB allocated for a refused 1 KiB object"
    assert absent_peak < 32 * 2**20, f"{absent_peak / 2**20:.0f} MiB allocated for an absent shard"
