"""``sharding-store info`` on the one node model (issue 23, issue 27 items 7, 12, 18), run as a
user runs it: a real ``sharding-store`` process per command.

* every generation is laid out alike: the header, the tree, one block per array (shape,
  chunks, codecs, fill value, what is stored, portability), what ``migrate`` changes in a
  document as ``will change:`` lines in that node's block; ``--json`` names the generation
  for a 2022 store too and lists the same arrays for a 2023 one;
* an array's fill value is shown (a NaN-filled, partly written array);
* an array that lost its storage transformer is shown with the chunks its shards hold;
* a location inside a hierarchy is refused (exit 7) saying which hierarchy and which
  ``--path`` reaches it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sharding_store import create_draft_array
from tests import hostile
from tests.gen2023_writer import write_2023

REPO = str(Path(__file__).resolve().parents[3])


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharding_store.cli", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def _store_2022(root: Path) -> Path:
    """A 2022 store: a NaN-filled sharded array with one shard written, the rest left to the fill."""
    a = create_draft_array(str(root), "a", shape=(8,), chunks=(2,), chunks_per_shard=(2,), dtype="<f4",
                           fill_value=math.nan)
    a[:4] = np.arange(4, dtype="<f4")
    return root


def _store_2023(root: Path) -> Path:
    """A 2023 store: an implicit root and one sharded array with an undeclared CRC32C."""
    write_2023(root, "a", np.arange(8, dtype="<f4"), chunks=(2,), cps=(2,))
    return root


STORES = {"2022": _store_2022, "2023": _store_2023}


@pytest.mark.parametrize("generation", sorted(STORES))
def test_every_generation_is_laid_out_alike(tmp_path, generation):
    store = STORES[generation](tmp_path / "store")
    proc = cli("info", str(store))
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.rstrip("\n").split("\n\n")
    assert blocks[0].startswith(f"{store}: draft-era Zarr v3 ({generation}")
    assert blocks[1].splitlines()[1].startswith("  a (8,) <f4 chunks (2,) chunks per shard (2,)")  # the tree
    (array,) = [b for b in blocks if b.startswith("/a\n")]  # one block for the array, none elsewhere
    lines = array.splitlines()
    assert lines[1] == "  shape 8  dtype <f4  order C"
    assert lines[2] == "  inner chunks 2  chunks per shard 2  shard shape 4"
    assert any(line.startswith("  stored ") and "shard" in line for line in lines)
    assert not any("  array  shape" in b for b in blocks)  # the 2023-only layout is gone
    doc = json.loads(cli("info", str(store), "--json").stdout)
    assert doc["generation"] == f"draft-era Zarr v3 ({generation}{' intermediate' if generation == '2023' else ''})"
    assert [a["path"] for a in doc["arrays"]] == ["a"] and doc["arrays"][0]["shape"] == [8]
    (node,) = [n for n in doc["nodes"] if n["kind"] == "array"]
    assert node["path"] == "a" and node["shape"] == [8] and isinstance(node["changes"], list)


def test_a_2023_array_says_what_migrate_changes_in_its_own_block(tmp_path):
    store = _store_2023(tmp_path / "store")
    out = cli("info", str(store)).stdout
    array = [b for b in out.split("\n\n") if b.startswith("/a\n")][0]
    assert "  will change: shard index: every shard index is followed by an undeclared CRC32C" in array
    assert "/\n  will change: no zarr.json (an implicit group)" in out
    doc = json.loads(cli("info", str(store), "--json").stdout)
    (node,) = [n for n in doc["nodes"] if n["path"] == "a"]
    assert node["index_reading"] == "crc32c-hidden" and node["objects"] == 2
    assert doc["arrays"][0]["n_chunks"] == 4 and doc["arrays"][0]["index_reading"] == "crc32c-hidden"


@pytest.mark.parametrize("generation", sorted(STORES))
def test_the_fill_value_is_shown(tmp_path, generation):
    store = STORES[generation](tmp_path / "store")
    if generation == "2023":  # a NaN fill value as the 2023 writers spelled it
        doc_path = store / "a" / "zarr.json"
        doc = json.loads(doc_path.read_text())
        doc["fill_value"] = "NaN"
        doc_path.write_text(json.dumps(doc))
    out = cli("info", str(store)).stdout
    array = [b for b in out.split("\n\n") if b.startswith("/a\n")][0]
    assert '\n  fill value "NaN"\n' in array
    doc = json.loads(cli("info", str(store), "--json").stdout)
    assert doc["arrays"][0]["fill_value"] == "NaN"


def test_an_array_that_lost_its_transformer_shows_the_chunks_its_shards_hold(tmp_path):
    store = hostile.build(hostile.CASE_BY_NAME["lost_transformer"], tmp_path)
    proc = cli("info", str(store))
    assert proc.returncode == 0, proc.stderr
    bad = [b for b in proc.stdout.split("\n\n") if b.startswith("/bad\n")][0]
    assert "\n  stored 4 shards (chunks per shard 2 x 2 by the evidence: the metadata lost its storage " \
           "transformer), 16 inner chunks, " in bad
    assert "--assume-chunks-per-shard bad=2,2" in bad
    (stats,) = [a for a in json.loads(cli("info", str(store), "--json").stdout)["arrays"] if a["path"] == "bad"]
    assert stats["n_chunks"] == 16 and stats["lost_transformer_chunks_per_shard"] == [2, 2]


@pytest.mark.parametrize("below, path", [("meta", ""), ("meta/root", ""), ("data/root/good", "good"),
                                         ("data/root/bad/c0", "bad")])
def test_a_location_inside_a_hierarchy_names_it_and_the_path(tmp_path, below, path):
    store = hostile.build(hostile.CASE_BY_NAME["lost_transformer"], tmp_path)
    proc = cli("info", str(store / below))
    assert proc.returncode == 7 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    suggestion = f"sharding-store info {store}" + (f" --path {path}`" if path else "`")
    assert f"is inside the hierarchy at {store}: run `{suggestion}" in proc.stderr
    if path:
        assert cli("info", str(store), "--path", path).returncode == 0


def test_a_location_in_no_hierarchy_is_refused_as_before(tmp_path):
    (tmp_path / "plain" / "sub").mkdir(parents=True)
    proc = cli("info", str(tmp_path / "plain" / "sub"))
    assert proc.returncode == 7 and "no draft-era hierarchy here" in proc.stderr and "inside" not in proc.stderr


@pytest.mark.parametrize("generation", sorted(STORES))
def test_ls_lists_every_generation_from_the_same_model(tmp_path, generation):
    store = STORES[generation](tmp_path / "store")
    proc = cli("ls", str(store))
    assert proc.returncode == 0, proc.stderr
    assert "/a\tarray\t8\t<f4" in proc.stdout.splitlines()
