"""Issue 12 items 1 and 2 through public entry points (these run on older trees too):
deletes never follow a link out of a store, reads never copy another file in, and a
store's identity does not depend on how its location is spelled."""

from __future__ import annotations

import numpy as np
import pytest

from sharding_store import ShardingStore, ShardingStoreError, create_draft_array, open_draft


def _outside(tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "sub").mkdir(parents=True)
    (outside / "precious").write_bytes(b"precious data")
    (outside / "sub" / "more").write_bytes(b"more")
    return outside


def test_overwriting_an_array_whose_directory_holds_a_link_keeps_what_it_points_to(tmp_path):
    store, outside = tmp_path / "store", _outside(tmp_path)
    a = create_draft_array(str(store), "a", shape=(4,), chunks=(2,), dtype="u1")
    a[...] = np.arange(4, dtype="u1")
    (store / "data" / "root" / "a" / "link").symlink_to(outside)
    create_draft_array(str(store), "a", shape=(4,), chunks=(2,), dtype="u1", overwrite=True)
    assert (outside / "precious").read_bytes() == b"precious data"
    assert (outside / "sub" / "more").read_bytes() == b"more"
    assert not (store / "data" / "root" / "a" / "link").exists()


def test_erasing_a_prefix_through_a_sharding_store_removes_the_link_only(tmp_path):
    store, outside = tmp_path / "store", _outside(tmp_path)
    (store / "data" / "root").mkdir(parents=True)
    (store / "data" / "root" / "x").symlink_to(outside)
    ShardingStore(str(store)).erase_prefix("data/root/")
    assert sorted(p.name for p in outside.iterdir()) == ["precious", "sub"]


def test_a_chunk_linked_out_of_the_store_is_refused_naming_its_key(tmp_path):
    store, outside = tmp_path / "store", _outside(tmp_path)
    a = create_draft_array(str(store), "a", shape=(4,), chunks=(2,), dtype="u1", compressor=None)
    a[...] = np.arange(4, dtype="u1")
    chunk = store / "data" / "root" / "a" / "c1"
    chunk.unlink()
    (outside / "two").write_bytes(b"\x07\x07")
    chunk.symlink_to(outside / "two")
    with pytest.raises(ShardingStoreError, match="data/root/a/c1") as info:
        open_draft(str(store), "a")[...]
    assert "outside the store" in str(info.value)
    with pytest.raises(ShardingStoreError, match="data/root/a/c1"):
        ShardingStore(str(store))["data/root/a/c1"]


def test_a_chunk_directory_linked_out_of_the_store_is_refused(tmp_path):
    store, outside = tmp_path / "store", _outside(tmp_path)
    a = create_draft_array(str(store), "a", shape=(2, 4), chunks=(1, 2), dtype="u1", compressor=None)
    a[...] = 1
    row = store / "data" / "root" / "a" / "c1"
    for f in row.iterdir():
        (outside / "sub" / f.name).write_bytes(f.read_bytes())
        f.unlink()
    row.rmdir()
    row.symlink_to(outside / "sub")
    with pytest.raises(ShardingStoreError, match="data/root/a/c1/0"):
        ShardingStore(str(store))["data/root/a/c1/0"]


def test_links_inside_the_store_still_read(tmp_path):
    store = tmp_path / "store"
    a = create_draft_array(str(store), "a", shape=(4,), chunks=(2,), dtype="u1", compressor=None)
    a[...] = np.arange(4, dtype="u1")
    chunk = store / "data" / "root" / "a" / "c1"
    (store / "data" / "root" / "a" / "spare").write_bytes(chunk.read_bytes())
    chunk.unlink()
    chunk.symlink_to(store / "data" / "root" / "a" / "spare")
    assert open_draft(str(store), "a")[...].tolist() == [0, 1, 2, 3]
