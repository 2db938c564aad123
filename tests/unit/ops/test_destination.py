"""A migration's destination (issue 25, items 5, 6, 7 and 10), for 2022 and 2023 sources.

* a finished destination keeps a record of its source and options: ``--resume`` with
  another source or other options is refused naming them (exit 2), DST unchanged;
* ``verify`` reports nodes in DST that the source does not have, compares documents with
  strict JSON types (``false`` != ``0`` != ``0.0``, ``-0.0`` != ``0.0``), and accepts
  ``dimension_names`` only as the record says ``--dimension-names`` gave them;
* ``--overwrite`` empties only a Zarr hierarchy or a destination of ours (exit 8 naming
  what is there), and ``--dry-run --overwrite`` lists what it would remove.

Exit codes through the CLI in real processes; details through the API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

from sharding_store import create_draft_array, create_draft_group
from sharding_store.errors import DestinationExistsError, UsageError
from sharding_store.ops.migration import MARKER_KEY, migrate
from sharding_store.ops.verification import verify
from tests.draft_factory import tree_hash
from tests.gen2023_writer import write_2023, write_group

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: CLI runs in subprocesses
CLI = [sys.executable, "-m", "sharding_store.cli"]
RECORD_KEY = ".sharding-store-record.json"  # sharding_store.ops.destination.RECORD_KEY, spelled out: it is a format


def cli(*args: Any) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


def make_2022(root: Path, title: str, arrays: dict[str, np.ndarray]) -> Path:
    """A draft (2022) hierarchy: a root group titled ``title``, sharded arrays (fill value
    0 of their dtype), their groups implicit."""
    create_draft_group(str(root), "", attrs={"title": title})
    for path, data in arrays.items():
        arr = create_draft_array(str(root), path, shape=data.shape, dtype=data.dtype, chunks=(4,) * data.ndim,
                                 chunks_per_shard=(2,) * data.ndim, compressor=numcodecs.GZip(1), fill_value=0)
        arr[...] = data
    return root


def make_2023(root: Path, title: str, arrays: dict[str, np.ndarray]) -> Path:
    """A 2023-generation hierarchy (zarrita's spelling, undeclared index CRC32C)."""
    root.mkdir(parents=True)
    write_group(root, "", {"title": title})
    for path, data in arrays.items():
        write_2023(root, path, data, chunks=(4,) * data.ndim, cps=(2,) * data.ndim)
    return root


U2 = np.arange(80, dtype="<u2").reshape(10, 8)
F4 = np.linspace(-1, 1, 48, dtype="<f4").reshape(8, 6)
MAKERS = {"2022": make_2022, "2023": make_2023}


@pytest.fixture(params=["2022", "2023"])
def two_sources(request, tmp_path):
    """(generation, A, B): two hierarchies of one generation with different nodes and root attributes."""
    make = MAKERS[request.param]
    a = make(tmp_path / "a", "A", {"imgs/raw": U2, "imgs/float": F4})
    b = make(tmp_path / "b", "B", {"other/raw": U2 + 1})
    return request.param, a, b


# --------------------------------------------------------------------------- items 5 and 6: --resume


def test_resume_from_another_source_into_a_finished_destination_is_refused(two_sources, tmp_path):
    generation, a, b = two_sources
    dst = tmp_path / "dst"
    assert cli("migrate", a, dst, "--no-progress").returncode == 0
    record = json.loads((dst / RECORD_KEY).read_text())
    assert record["generation"] == generation and record["src"] == str(a) and not (dst / MARKER_KEY).exists()
    before = tree_hash(dst)
    merged = cli("migrate", b, dst, "--resume", "--no-progress")
    assert merged.returncode == 2, merged.stderr
    assert "another source" in merged.stderr and str(a) in merged.stderr and str(b) in merged.stderr
    assert len(merged.stderr.strip().splitlines()) == 1
    assert tree_hash(dst) == before  # nothing written
    # the same source and options: nothing left to do, verified again
    again = cli("migrate", a, dst, "--resume", "--json", "--no-progress")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["objects_written"] + report["objects_copied"] == 0 and report["verified"]["ok"]


def test_resume_with_other_options_on_a_finished_destination_is_refused(two_sources, tmp_path):
    generation, a, _ = two_sources
    dst = tmp_path / "dst"
    # the 2023 copy takes one layout option: the index checksum
    first = ["--chunks-per-shard", "1"] if generation == "2022" else ["--no-index-checksum"]
    name = "chunks_per_shard" if generation == "2022" else "index_checksum"
    assert cli("migrate", a, dst, *first, "--no-progress").returncode == 0
    before = tree_hash(dst)
    other = cli("migrate", a, dst, "--resume", "--no-progress")
    assert other.returncode == 2, other.stderr
    assert "other options" in other.stderr and name in other.stderr
    assert tree_hash(dst) == before
    assert cli("verify", a, dst, "--no-progress").returncode == 0


def test_resume_into_a_destination_that_is_not_ours_is_refused(tmp_path):
    a = make_2022(tmp_path / "a", "A", {"x": U2})
    dst = tmp_path / "dst"
    (dst / "data").mkdir(parents=True)
    (dst / "data/mine.bin").write_bytes(b"mine")
    with pytest.raises(UsageError, match="nothing to resume"):
        migrate(str(a), str(dst), resume=True, progress=False)
    assert sorted(p.name for p in dst.rglob("*")) == ["data", "mine.bin"]


def test_a_marker_of_another_source_is_refused_before_a_dry_run(tmp_path):
    a, b = make_2022(tmp_path / "a", "A", {"x": U2}), make_2022(tmp_path / "b", "B", {"y": U2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False)
    with pytest.raises(UsageError, match="another source") as e:
        migrate(str(b), str(dst), resume=True, dry_run=True, progress=False)
    assert e.value.key == MARKER_KEY or e.value.key == RECORD_KEY


# --------------------------------------------------------------------------- item 5: verify and extra nodes


def test_verify_reports_nodes_the_source_does_not_have(two_sources, tmp_path):
    generation, a, b = two_sources
    dst, dst_a = tmp_path / "dst", tmp_path / "dst-a"
    migrate(str(b), str(dst), progress=False)
    migrate(str(a), str(dst_a), progress=False)
    assert verify(str(b), str(dst), progress=False).ok
    shutil.copytree(dst_a / "imgs", dst / "imgs")  # A's nodes merged in beside B's
    done = cli("verify", b, dst, "--no-progress")
    assert done.returncode == 9, done.stderr
    report = verify(str(b), str(dst), raise_on_error=False, progress=False)
    extra = {k for k, m in report.check.problems if "a node the source does not have" in m}
    assert extra == {"imgs/zarr.json"}  # the group; what lies below it is its own
    # a node below an array of the source is found by the array's listing
    shutil.rmtree(dst / "imgs")
    (dst / "other/raw/inner").mkdir()
    shutil.copy(dst_a / "imgs/raw/zarr.json", dst / "other/raw/inner/zarr.json")
    report = verify(str(b), str(dst), raise_on_error=False, progress=False)
    assert [k for k, _ in report.check.problems] == ["other/raw/inner/zarr.json"]
    # the record and the marker at the root are no nodes
    (dst / "other/raw/inner/zarr.json").unlink()
    (dst / MARKER_KEY).write_text("{}")
    assert verify(str(b), str(dst), progress=False).ok


# --------------------------------------------------------------------------- item 7: --overwrite


@pytest.mark.parametrize("generation", ["2022", "2023"])
def test_overwrite_refuses_a_directory_without_zarr_data(generation, tmp_path):
    a = MAKERS[generation](tmp_path / "a", "A", {"x": U2})
    dst = tmp_path / "dst"
    (dst / "docs").mkdir(parents=True)
    (dst / "docs/thesis.txt").write_text("years of work")
    (dst / "notes.md").write_text("notes")
    before = tree_hash(dst)
    for extra in ([], ["--dry-run"]):
        done = cli("migrate", a, dst, "--overwrite", *extra, "--no-progress")
        assert done.returncode == 8, done.stderr
        assert "'docs/'" in done.stderr and "'notes.md'" in done.stderr and "neither" in done.stderr
    assert tree_hash(dst) == before


@pytest.mark.parametrize("generation", ["2022", "2023"])
def test_dry_run_lists_what_overwrite_would_remove(generation, tmp_path):
    a = MAKERS[generation](tmp_path / "a", "A", {"x": U2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False)  # a Zarr hierarchy: --overwrite may empty it
    (dst / "notes.md").write_text("12345")
    before = tree_hash(dst)
    n_objects = sum(1 for p in dst.rglob("*") if p.is_file())
    n_bytes = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    text = cli("migrate", a, dst, "--overwrite", "--dry-run", "--no-progress")
    assert text.returncode == 0, text.stderr
    assert f"--overwrite would remove {n_objects} objects" in text.stdout
    assert "'notes.md': 1 object, 5 B" in text.stdout and "'x/'" in text.stdout
    as_json = cli("migrate", a, dst, "--overwrite", "--dry-run", "--json", "--no-progress")
    removal = json.loads(as_json.stdout)["would_remove"]
    assert removal["objects"] == n_objects and removal["bytes"] == n_bytes
    names = {e["name"]: e for e in removal["entries"]}
    assert set(names) == {"notes.md", "x/", "zarr.json", RECORD_KEY}
    assert names["x/"]["objects"] == sum(1 for p in (dst / "x").rglob("*") if p.is_file())
    assert tree_hash(dst) == before  # a dry run deletes nothing
    assert cli("migrate", a, dst, "--overwrite", "--no-progress").returncode == 0
    assert not (dst / "notes.md").exists()


def test_an_interrupted_emptying_is_still_recognised(tmp_path, monkeypatch):
    """What identifies DST (its root document, marker, record) is deleted last: an
    emptying stopped half way leaves a DST that --overwrite still recognises."""
    from sharding_store.stores import LocalInner

    a = make_2022(tmp_path / "a", "A", {"x": U2, "y/z": U2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False)
    deleted: list[str] = []
    real = LocalInner.delete_prefix

    def stop_after_one(self, prefix):
        if deleted:
            raise KeyboardInterrupt
        deleted.append(prefix)
        return real(self, prefix)

    monkeypatch.setattr(LocalInner, "delete_prefix", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        migrate(str(a), str(dst), overwrite=True, progress=False)
    monkeypatch.undo()
    assert deleted == ["x/"] and (dst / "zarr.json").exists() and (dst / RECORD_KEY).exists()
    assert migrate(str(a), str(dst), overwrite=True, progress=False).verification.ok


def test_overwrite_recognises_every_generation_and_our_marker(tmp_path):
    a = make_2022(tmp_path / "a", "A", {"x": U2})
    for name in ("zarr.json", ".zgroup", ".zarray", ".zattrs", MARKER_KEY, RECORD_KEY):
        dst = tmp_path / f"dst-{name}"
        dst.mkdir()
        (dst / name).write_text("{}")
        (dst / "stale.bin").write_bytes(b"x")
        assert migrate(str(a), str(dst), overwrite=True, progress=False).verification.ok
        assert not (dst / "stale.bin").exists()
    dst = tmp_path / "dst-sub"
    (dst / "sub").mkdir(parents=True)
    (dst / "sub/zarr.json").write_text("{}")  # a document below the root: not a hierarchy at DST
    with pytest.raises(DestinationExistsError, match="'sub/'"):
        migrate(str(a), str(dst), overwrite=True, progress=False)


# --------------------------------------------------------------------------- item 10: strict documents


def _edit(path: Path, **fields: Any) -> None:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("generation", ["2022", "2023"])
@pytest.mark.parametrize("array, fill", [("imgs/raw", False), ("imgs/raw", 0.0), ("imgs/float", -0.0),
                                         ("imgs/float", 0)])
def test_verify_compares_json_types_strictly(generation, array, fill, tmp_path):
    a = MAKERS[generation](tmp_path / "a", "A", {"imgs/raw": U2, "imgs/float": F4})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False, consolidate=False)
    doc = json.loads((dst / array / "zarr.json").read_text())
    assert doc["fill_value"] in (0, 0.0) and json.dumps(doc["fill_value"]) != json.dumps(fill)
    _edit(dst / array / "zarr.json", fill_value=fill)
    done = cli("verify", a, dst, "--no-progress")
    assert done.returncode == 9, done.stderr
    assert f"{array}/zarr.json" in done.stderr


@pytest.mark.parametrize("generation", ["2022", "2023"])
def test_verify_refuses_dimension_names_nobody_gave(generation, tmp_path):
    a = MAKERS[generation](tmp_path / "a", "A", {"imgs/raw": U2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False, consolidate=False)  # no second copy of the document to compare
    _edit(dst / "imgs/raw/zarr.json", dimension_names=["y", "x"])
    done = cli("verify", a, dst, "--no-progress")
    assert done.returncode == 9 and "dimension_names" in done.stderr, done.stderr


def test_verify_accepts_the_dimension_names_the_record_says_were_given(tmp_path):
    a = make_2022(tmp_path / "a", "A", {"imgs/raw": U2, "imgs/float": F4})
    dst = tmp_path / "dst"
    done = cli("migrate", a, dst, "--dimension-names", "imgs/raw=y,x", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert json.loads((dst / RECORD_KEY).read_text())["dimension_names"] == {"imgs/raw": ["y", "x"]}
    assert cli("verify", a, dst, "--no-progress").returncode == 0
    _edit(dst / "imgs/raw/zarr.json", dimension_names=["t", "x"])  # not the names given
    assert "dimension_names" in cli("verify", a, dst, "--no-progress").stderr
    _edit(dst / "imgs/raw/zarr.json", dimension_names=["y", "x"])
    _edit(dst / "imgs/float/zarr.json", dimension_names=["y", "x"])  # names given to another array only
    report = verify(str(a), str(dst), raise_on_error=False, progress=False)
    assert [k for k, _ in report.check.problems] == ["imgs/float/zarr.json"]
    # other names on resume are other options
    with pytest.raises(UsageError, match="dimension_names"):
        migrate(str(a), str(dst), resume=True, dimension_names={"imgs/raw": ["t", "x"]}, progress=False)


# --------------------------------------------------------------------------- readers ignore the record


@pytest.mark.parametrize("consolidate", [True, False])
def test_every_v3_reader_opens_a_destination_with_its_record(consolidate, tmp_path):
    import zarr

    a = make_2022(tmp_path / "a", "A", {"imgs/raw": U2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False, consolidate=consolidate)
    assert (dst / RECORD_KEY).exists()
    group = zarr.open_group(str(dst), mode="r")
    assert sorted(name for name, _ in group.members(max_depth=None)) == ["imgs", "imgs/raw"]
    np.testing.assert_array_equal(group["imgs/raw"][...], U2)
    ts = pytest.importorskip("tensorstore")
    got = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(dst / "imgs/raw")}}).result().read().result()
    np.testing.assert_array_equal(got, U2)
    zarrs = pytest.importorskip("zarrs")
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        np.testing.assert_array_equal(zarr.open_array(str(dst / "imgs/raw"), mode="r")[...], U2)
    assert zarrs is not None


def test_resuming_a_finished_2023_destination_claims_it_again(tmp_path):
    """The finished run removed its marker; a resumed run that has work to do creates it
    again, so DST stays claimed while it is written (and a kill leaves it resumable)."""
    from sharding_store.testing import fault_hook

    a = make_2023(tmp_path / "a", "A", {"x": U2, "y": U2 + 2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False)
    for shard in (dst / "x/c").rglob("*"):
        if shard.is_file():
            shard.unlink()  # work for the resumed run

    def stop(phase: str) -> None:
        if phase == "unit":
            raise KeyboardInterrupt

    with fault_hook(stop), pytest.raises(KeyboardInterrupt):
        migrate(str(a), str(dst), resume=True, progress=False, jobs=1)
    assert (dst / MARKER_KEY).exists() and (dst / RECORD_KEY).exists()
    assert migrate(str(a), str(dst), resume=True, progress=False).verification.ok
    assert not (dst / MARKER_KEY).exists()


def test_a_record_whose_source_cannot_be_told_is_refused(tmp_path):
    a = make_2022(tmp_path / "a", "A", {"x": U2})
    dst = tmp_path / "dst"
    migrate(str(a), str(dst), progress=False)
    record = json.loads((dst / RECORD_KEY).read_text())
    (dst / RECORD_KEY).write_text(json.dumps({**record, "source": "somewhere"}))
    with pytest.raises(UsageError, match="cannot be told"):
        migrate(str(a), str(dst), resume=True, progress=False)
    (dst / RECORD_KEY).write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a record this tool wrote"):
        migrate(str(a), str(dst), resume=True, progress=False)
