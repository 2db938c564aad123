"""Consolidated metadata of a 2023 store is never trusted (issue 25 item 8).

The store: 2023-spelled arrays (``bytes`` codec, undeclared plain shard indices) under an
explicit group, on which zarr-python 3's own ``consolidate_metadata`` was run (it fills in
the default ``index_codecs [bytes, crc32c]``). After ``migrate --in-place
--no-index-checksum`` the root's consolidated block is written again from the upgraded
documents and verified, so zarr-python 3 reading through it gets the stored values; a block
that says ``float16`` for a ``uint16`` array is not believed either. A copy ``migrate`` of
such a store verifies (its expected root document leaves the source's block out). With a
damaged node left as it was, the block is dropped.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

from sharding_store.cli import main
from sharding_store.ops.upgrade import upgrade_in_place
from tests.gen2023_writer import write_2023, write_group

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
A = np.arange(8, dtype="u2") * 1000 + 7
B = np.linspace(0, 1, 6, dtype="f4")


def consolidated_store(root: Path) -> Path:
    write_group(root, "", {"title": "consolidated"})
    write_group(root, "g")
    write_2023(root, "g/a", A, chunks=(2,), cps=(2,), index="plain", spelling="bytes")
    write_2023(root, "b", B, chunks=(3,), spelling="bytes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(root))
    block = json.loads((root / "zarr.json").read_bytes())["consolidated_metadata"]["metadata"]
    assert block["g/a"]["codecs"][0]["configuration"]["index_codecs"][-1] == {"name": "crc32c"}  # zarr's default
    return root


def _read(root: Path, path: str) -> np.ndarray:
    group = zarr.open_group(str(root), mode="r")  # through the consolidated block
    assert group.metadata.consolidated_metadata is not None
    return group[path][...]


def test_an_upgrade_writes_the_consolidated_block_again(tmp_path):
    src = consolidated_store(tmp_path / "s")
    report = upgrade_in_place(str(src), index_checksum=False)
    assert report.verified and any("consolidated_metadata" in c for c in report.changes[""])
    np.testing.assert_array_equal(_read(src, "g/a"), A)
    np.testing.assert_array_equal(_read(src, "b"), B)
    root = json.loads((src / "zarr.json").read_bytes())
    assert root["consolidated_metadata"]["metadata"]["g/a"] == json.loads((src / "g/a/zarr.json").read_bytes())


def test_a_lying_block_is_not_believed(tmp_path):
    src = consolidated_store(tmp_path / "s")
    doc = json.loads((src / "zarr.json").read_bytes())
    doc["consolidated_metadata"]["metadata"]["g/a"]["data_type"] = "float16"
    (src / "zarr.json").write_text(json.dumps(doc))
    assert main(["migrate", str(src), "--in-place", "--no-index-checksum"]) == 0
    got = _read(src, "g/a")
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, A)


def test_a_root_final_but_for_its_block_is_rewritten(tmp_path):
    """Only the block is stale (the root's own document is final v1.0): still rewritten."""
    src = consolidated_store(tmp_path / "s")
    root = json.loads((src / "zarr.json").read_bytes())
    root["consolidated_metadata"]["metadata"]["b"]["shape"] = [600]
    (src / "zarr.json").write_text(json.dumps(root))
    upgrade_in_place(str(src), index_checksum=False)
    assert _read(src, "b").shape == (6,)


def test_a_copy_migration_of_such_a_store_verifies(tmp_path, capsys):
    src = consolidated_store(tmp_path / "s")
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    dst = tmp_path / "dst"
    assert main(["migrate", str(src), str(dst), "--no-index-checksum"]) == 0, capsys.readouterr().err
    assert main(["verify", str(src), str(dst)]) == 0, capsys.readouterr().err
    np.testing.assert_array_equal(_read(dst, "g/a"), A)
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before  # the source untouched


def test_with_a_damaged_node_left_as_it_was_the_block_is_dropped(tmp_path):
    src = consolidated_store(tmp_path / "s")
    (src / "bad").mkdir()
    (src / "bad" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array", "shape": "x"}')
    report = upgrade_in_place(str(src), index_checksum=False, skip_damaged=True)
    assert "bad" in report.skipped and any("consolidated_metadata dropped" in w for w in report.warnings)
    assert "consolidated_metadata" not in json.loads((src / "zarr.json").read_bytes())
    np.testing.assert_array_equal(zarr.open_group(str(src), mode="r", use_consolidated=False)["g/a"][...], A)


def test_an_upgraded_store_is_final_v3(tmp_path):
    """Its rewritten block included, the upgraded store is final v1.0: a second upgrade finds nothing."""
    src = consolidated_store(tmp_path / "s")
    upgrade_in_place(str(src), index_checksum=False)
    again = tmp_path / "again"
    shutil.copytree(src, again)
    assert main(["migrate", str(again), "--in-place"]) == 7
