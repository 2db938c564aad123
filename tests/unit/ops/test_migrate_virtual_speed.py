"""What a virtual migration's speed rests on (issue 24: <= 50 µs of client time per object
locally): per batch of units one tail read, one batched write of the references, no
directory walked again per object. Each property counted, not timed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from sharding_store import MigrateOptions, create_draft_array, open_references
from sharding_store.ops.migration import migrate
from sharding_store.stores.local_fd import DIR_FDS_MAX, DirFds

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: shard rows (one source directory each: ``c<i>/``) and columns of :func:`_many_dirs`
ROWS, COLS = DIR_FDS_MAX + 6, 8


def _many_dirs(root) -> np.ndarray:
    """A draft array of ``ROWS`` x ``COLS`` shards: more shard directories than a store
    caches descriptors of, several shards in each."""
    data = np.arange(ROWS * 4 * COLS * 4, dtype="<i4").reshape(ROWS * 4, COLS * 4)
    create_draft_array(str(root), "a", shape=data.shape, chunks=(2, 2), chunks_per_shard=(2, 2),
                       dtype=data.dtype)[...] = data
    return data


def test_each_source_directory_is_walked_once_not_once_per_shard(monkeypatch, tmp_path):
    """A virtual destination creates no file, so its units keep the listing's order
    (interleaving them over the target directories, as a copy does, made every tail read
    walk its directory again from the root: the cache of descriptors held fewer than the
    directories visited in turn). The listing walks each once; the tail reads and the
    references made in the same batch find it cached."""
    data = _many_dirs(tmp_path / "src")
    walks = []
    real = DirFds._walk

    def walk(self, spelled, key, create):
        walks.append(spelled)
        return real(self, spelled, key, create)

    monkeypatch.setattr(DirFds, "_walk", walk)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False),
                     progress=False)
    assert report.totals.referenced == ROWS * COLS
    shard_dirs = [w for w in walks if w.startswith("data/root/a/c")]
    assert len(shard_dirs) == len(set(shard_dirs)) == ROWS, f"{len(shard_dirs)} walks of {ROWS} shard directories"
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["a"][...],
                                  data)
    assert len(json.loads((tmp_path / "out.json").read_bytes())["refs"]) > ROWS * COLS
