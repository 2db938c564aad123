"""zarr-python 2.x's ``resize()``/``append()`` defect: the metadata lost
``storage_transformers`` while the objects are still shards.

Found by ``info``, ``migrate``, ``verify`` and ``reshard`` with one tail read per
unsharded array; never migrated as unsharded; ``--assume-chunks-per-shard`` migrates
it to the values written before the defect.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import create_draft_array, migrate, open_draft, reshard, verify
from sharding_store.api.evidence import detect_lost_transformer, hierarchy_stats
from sharding_store.api.hierarchy import open_hierarchy
from sharding_store.errors import DraftMetadataError, ShardCorruptError, UsageError
from sharding_store.formats import draft_metadata as dm
from sharding_store.stores import as_inner
from tests import hostile
from tests.draft_factory import read_v3, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
LOST = hostile.CASE_BY_NAME["lost_transformer"]


def drop_transformer(root: Path, path: str) -> None:
    """What 2.x's resize() wrote: the same document without storage_transformers."""
    key = root / dm.array_meta_key(path)
    doc = json.loads(key.read_bytes())
    del doc["storage_transformers"]
    key.write_text(json.dumps(doc))


def detect(root: Path, path: str):
    h = open_hierarchy(str(root))
    meta = h.node(path).meta
    keys = sorted(k for k in h.inner.list_prefix(dm.data_prefix(path)))
    return detect_lost_transformer(h.inner, meta, keys)


@pytest.fixture
def lost(tmp_path) -> Path:
    return hostile.build(LOST, tmp_path)


def test_detected_with_the_chunks_per_shard_that_fit_the_grid(lost):
    found = detect(lost, "bad")
    assert found is not None and found.n_chunks == 4 and found.candidates == ((2, 2),)
    message = found.message()
    assert "array 'bad' looks sharded with chunks_per_shard (2, 2)" in message
    assert "resize()" in message and "--assume-chunks-per-shard bad=2,2" in message
    assert detect(lost, "good") is None  # sharded metadata: nothing to suspect


def test_ambiguous_shapes_are_all_named(tmp_path):
    a = create_draft_array(str(tmp_path), "a", shape=(16, 16), chunks=(2, 2), dtype="<i4",
                           compressor=numcodecs.GZip(1), chunks_per_shard=(2, 2))
    a[:4, :4] = 7  # one shard: its key alone cannot tell (2, 2) from (4, 1) or (1, 4)
    drop_transformer(tmp_path, "a")
    found = detect(tmp_path, "a")
    assert found is not None and set(found.candidates) == {(1, 4), (2, 2), (4, 1)}
    assert " or " in found.message()


@pytest.mark.parametrize(
    "compressor,data",
    [
        (None, np.zeros((8, 8), "u1")),  # tail of zeros: (0, 0) entries are not a shard index
        (None, np.arange(64, dtype="<u8").reshape(8, 8)),  # small ints that look like offsets
        (numcodecs.Zlib(1), np.zeros((8, 8), "<u2")),
        (numcodecs.Blosc("zstd", 5), np.random.default_rng(1).integers(0, 9, (8, 8)).astype("<u4")),
        (numcodecs.GZip(1), np.random.default_rng(2).random((8, 8))),
    ],
    ids=["zeros", "small-ints", "zlib", "blosc", "gzip"],
)
def test_healthy_unsharded_arrays_are_not_suspected(tmp_path, compressor, data):
    create_draft_array(str(tmp_path), "a", shape=data.shape, chunks=(4, 4), dtype=data.dtype, compressor=compressor)[...] = data
    assert detect(tmp_path, "a") is None
    _, (stats,) = hierarchy_stats(str(tmp_path))
    assert stats.problems == ()


def test_migrate_refuses_skips_or_assumes(lost, tmp_path):
    before = tree_hash(lost)
    with pytest.raises(DraftMetadataError, match=r"--assume-chunks-per-shard bad=2,2.*nothing was written") as e:
        migrate(lost, tmp_path / "refused", progress=False)
    assert e.value.key == "meta/root/bad.array.json" and not (tmp_path / "refused").exists()

    skipped = migrate(lost, tmp_path / "skipped", skip_damaged=True, progress=False)
    assert [(s["path"], s["kind"]) for s in skipped.skipped_arrays] == [("bad", "damaged")]
    assert skipped.verification.ok and not (tmp_path / "skipped" / "bad").exists()

    done = migrate(lost, tmp_path / "out", assume_chunks_per_shard={"bad": (2, 2)}, progress=False)
    assert done.verification.ok and not done.skipped_arrays
    assert np.array_equal(read_v3(tmp_path / "out", "bad"), hostile.values("bad"))  # the values written before
    assert np.array_equal(read_v3(tmp_path / "out", "good"), hostile.values("good"))
    verify(lost, tmp_path / "out", assume_chunks_per_shard={"bad": [2, 2]})
    with pytest.raises(DraftMetadataError, match="looks sharded"):  # without the assumption: named, not "differs"
        verify(lost, tmp_path / "out")
    assert tree_hash(lost) == before


def test_assumption_is_checked(lost, tmp_path):
    for assume, match in [({"nope": 2}, "no array"), ({"good": 2}, "sharded already"), ({"bad": [2, 2, 2]}, "chunks_per_shard")]:
        with pytest.raises(UsageError, match=match):
            migrate(lost, tmp_path / "x", assume_chunks_per_shard=assume, progress=False)
    with pytest.raises(ShardCorruptError, match=r"data/root/bad/c\d/\d: .*array 'bad'"):  # a wrong guess fails on an index
        migrate(lost, tmp_path / "y", assume_chunks_per_shard={"bad": [4, 4]}, progress=False)
    assert not (tmp_path / "y" / "bad" / "zarr.json").exists()


def test_resume_refuses_another_assumption(lost, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    as_inner(str(out)).set(".sharding-store-migration.json", json.dumps(
        {"migration": "sharding-store", "chunks_per_shard": None, "index_checksum": True, "index_location": "end",
         "portable": False, "assume_chunks_per_shard": {"bad": [4, 1]}}).encode())
    with pytest.raises(UsageError, match="assume_chunks_per_shard"):
        migrate(lost, out, resume=True, assume_chunks_per_shard={"bad": (2, 2)}, progress=False)


def test_cli_info_and_migrate_with_the_option(lost, tmp_path, capsys):
    from sharding_store.cli import main

    assert main(["info", str(lost), "--assume-chunks-per-shard", "bad=2,2"]) == 0
    out = capsys.readouterr().out
    assert "chunks per shard 2 x 2" in out and "problem" not in out
    assert main(["migrate", str(lost), str(tmp_path / "out"), "--assume-chunks-per-shard", "bad=2,2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"]["ok"]
    assert main(["verify", str(lost), str(tmp_path / "out"), "--assume-chunks-per-shard", "bad=2,2"]) == 0
    assert main(["info", str(lost), "--assume-chunks-per-shard", "bad"]) == UsageError.exit_code


def test_reshard_leaves_it_alone_or_refuses_it(lost, capsys):
    before = tree_hash(lost / "data" / "root" / "bad")
    report = reshard(lost, chunks_per_shard=4, progress=False)
    assert report.arrays_changed == ["good"] and "bad" in report.arrays_damaged
    with pytest.raises(DraftMetadataError, match="array 'bad'.*reshard cannot repack it"):
        reshard(lost, chunks_per_shard=4, arrays=["bad"], progress=False)
    assert tree_hash(lost / "data" / "root" / "bad") == before


def test_reshard_skips_arrays_with_damaged_metadata(tmp_path):
    src = hostile.build(hostile.CASE_BY_NAME["dtype_unparseable"], tmp_path)
    report = reshard(src, chunks_per_shard=4, progress=False)
    assert report.arrays_changed == ["good"] and "data_type" in report.arrays_damaged["bad"]
    with pytest.raises(DraftMetadataError, match="data_type"):
        reshard(src, chunks_per_shard=4, arrays=["bad"], progress=False)


# --------------------------------------------------------------------------- the zarr 2.18 corpus


def _legacy_corpus() -> dict[str, Path]:
    if os.environ.get("SHARDING_STORE_SKIP_LEGACY", "").lower() not in ("", "0", "false"):
        pytest.skip("SHARDING_STORE_SKIP_LEGACY is set")
    from compat import oracle

    return oracle.corpus_stores()


@pytest.mark.legacy
def test_resized_defect_of_zarr_2_18(tmp_path):
    """What 2.18 wrote, then resize(6): 2.18 itself reads the shard as a chunk; we migrate
    it to the values written before the resize (plus the fill value for the new part)."""
    from compat import oracle

    src = tmp_path / "resized"
    shutil.copytree(_legacy_corpus()["resized_defect"], src)
    (entry,) = [a for a in oracle.corpus_arrays() if a.case == "resized_defect"]
    intended = entry.expected()
    assert intended.tolist() == [1, 2, 3, 4, 0, 0]
    legacy = oracle.legacy_dump(src, chunks=False)
    assert "resized" in legacy.errors or not np.array_equal(legacy.arrays["resized"], intended)

    found = detect(src, "resized")
    assert found is not None and found.candidates == ((2,),)
    with pytest.raises(DraftMetadataError, match="--assume-chunks-per-shard resized=2"):
        migrate(src, tmp_path / "refused", progress=False)
    report = migrate(src, tmp_path / "out", assume_chunks_per_shard={"resized": 2}, progress=False)
    assert report.verification.ok
    assert np.array_equal(read_v3(tmp_path / "out", "resized"), intended)


def test_odd_dtypes_no_longer_block_info_and_migrate(tmp_path):
    """The object-dtype array of the 2.18 corpus has a document we refuse; the rest is usable."""
    from sharding_store.cli import main

    src = tmp_path / "odd"
    shutil.copytree(_legacy_corpus()["odd_dtypes"], src)
    h = open_hierarchy(str(src), strict=False)
    assert set(h.damaged) == {"vlen_utf8"}
    assert main(["info", str(src)]) == 0
    report = migrate(src, tmp_path / "out", skip_damaged=True, progress=False)
    assert "vlen_utf8" in report.skipped_paths and report.verification.ok


def test_a_small_blosc_chunk_whose_bytes_read_as_a_shard_index_is_read_as_plain():
    """A 32-byte blosc chunk (stored) whose last 16 bytes read as a 1-entry index pointing at
    its first 13 bytes: those 13 bytes are no blosc buffer (blosc 1 would read past them and
    return heap bytes), so no payload decodes and the array is no lost transformer. Found by
    hypothesis in test_reshard's random layouts: open_draft refused this valid array."""
    store: dict = {}
    arr = create_draft_array(store, "x", shape=(2, 1, 13), chunks=(2, 2, 1), dtype="<i4",
                             compressor=numcodecs.Blosc("lz4", 5, shuffle=1), dimension_separator="/")
    want = np.arange(26, dtype="<i4").reshape(2, 1, 13)
    arr[...] = want
    tail = np.frombuffer(store["data/root/x/c0/0/0"][-16:], "<u8")
    assert tail.tolist() == [0, 13]  # the case: reads as one live entry inside the object
    assert np.array_equal(open_draft(store, "x")[...], want)
