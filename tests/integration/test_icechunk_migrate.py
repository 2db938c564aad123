"""``migrate SRC DST`` into an Icechunk repository (issue 24), read back by zarr-python 3.

Every array of the 2023 fixtures (``../shared/fixtures/draft-2023/``), of the 2021 zarrita
store and of the 2022 hierarchy ``tests/draft_factory.py`` writes (separators ``/`` and ``.``,
unsharded, 0-d) is migrated materialised into a local repository and read from the branch
tip by zarr-python 3 against the oracles the copy-migration tests use; the source is hashed
before and after; the snapshot's message and metadata say what it is.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

ic = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")

from sharding_store import MigrateOptions  # noqa: E402
from sharding_store.cli import main  # noqa: E402
from sharding_store.ops.destination import MARKER_KEY, RECORD_KEY  # noqa: E402
from sharding_store.ops.migration import migrate  # noqa: E402
from sharding_store.ops.verification import verify  # noqa: E402
from sharding_store.stores.icechunk_store import open_icechunk  # noqa: E402
from tests.draft_factory import make_hierarchy, tree_hash  # noqa: E402

from .. import fixtures  # noqa: E402
from ..unit.ops.test_gen2023_migrate_options import draft_2023_source, zarrita_2021_source  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def tip(repo: Path, authorise: str | None = None) -> object:
    """The branch tip's store, as the README's reader lines open it."""
    grants = {authorise: None} if authorise else None
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)), authorize_virtual_chunk_access=grants)
    return repository.readonly_session("main").store


def read(store: object, path: str) -> np.ndarray:
    if path == "":
        return zarr.open_array(store, mode="r")[...]
    return zarr.open_group(store, mode="r")[path][...]


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert (got.dtype.kind, got.dtype.itemsize) == (want.dtype.kind, want.dtype.itemsize)
    np.testing.assert_array_equal(got, want)


def _sources() -> list:
    """(name, copy-to-tmp function returning (src, {path: expected})) per source store."""
    out = [pytest.param("draft-2022", id="draft-2022")]
    if fixtures.available(fixtures.ZARRITA_2021):
        out.append(pytest.param("zarrita-2021", id="zarrita-2021"))
    else:
        out.append(pytest.param("zarrita-2021", marks=pytest.mark.skip(reason=fixtures.missing(fixtures.ZARRITA_2021))))
    if fixtures.available(fixtures.DRAFT_2023):
        for collection in (fixtures.ZARRJS_ZARRITA_2023, fixtures.ZARRITAJS_2023_ENDIAN):
            for store in sorted(p for p in collection.iterdir() if p.is_dir()):
                out.append(pytest.param(f"2023:{collection.name}/{store.name}", id=f"{collection.name}/{store.name}"))
    else:
        out.append(pytest.param("2023", marks=pytest.mark.skip(reason=fixtures.missing(fixtures.DRAFT_2023))))
    return out


def prepare(name: str, base: Path) -> tuple[Path, dict[str, Callable[[], np.ndarray]]]:
    """A writable copy of the source ``name`` under ``base`` and the oracle of each array."""
    src = base / "src"
    if name == "draft-2022":
        values = make_hierarchy(src)
        return src, {p: (lambda v=v: v) for p, v in values.items()}
    if name == "zarrita-2021":
        source = zarrita_2021_source()
    else:
        collection, store = name.removeprefix("2023:").split("/")
        source = draft_2023_source(fixtures.DRAFT_2023 / collection / store)
    fixtures.copy_writable(source.store, src)
    return src, {p: (lambda p=p: source.expected(p)) for p in source.arrays}


@pytest.mark.parametrize("virtual", [False, True], ids=["materialised", "virtual"])
@pytest.mark.parametrize("name", _sources())
def test_every_array_migrated_reads_equal(tmp_path, name, virtual):
    """Migrated (verified), then read by zarr-python 3 from the branch tip; ``verify SRC DST``
    again on its own, through the repository; the source untouched."""
    src, arrays = prepare(name, tmp_path)
    before = tree_hash(src)
    repo = tmp_path / "repo"
    report = migrate(str(src), str(repo), MigrateOptions(target="icechunk", virtual=virtual), progress=False)
    assert report.destination == ("Icechunk virtual" if virtual else "Icechunk materialised")
    assert report.verification is not None and report.verification.ok
    assert tree_hash(src) == before, "the migration modified its source"
    store = tip(repo, f"file://{os.path.realpath(src)}/" if virtual else None)
    for path, expected in arrays.items():
        same(read(store, path), expected())
    assert verify(str(src), str(repo)).ok
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)))
    snapshot = repository.lookup_snapshot(repository.lookup_branch("main"))
    assert str(src) in snapshot.message and snapshot.message.startswith("sharding-store ")
    record = json.loads(snapshot.metadata["sharding-store"]["objects"][RECORD_KEY])
    assert record["target"] == "icechunk" and record["virtual"] is virtual and record["src"] == str(src)
    assert MARKER_KEY not in snapshot.metadata["sharding-store"]["objects"]
    if virtual:  # a virtual repository holds no chunk bytes of its own
        assert not [f for f in (repo / "chunks").rglob("*") if f.is_file()] if (repo / "chunks").exists() else True


def test_the_cli_migrates_into_a_repository_and_a_second_run_needs_overwrite(tmp_path, capsys):
    src = tmp_path / "src"
    values = make_hierarchy(src)
    repo = tmp_path / "repo"
    open_icechunk(str(repo))  # an empty repository: DST is told to be one from what it holds
    assert main(["migrate", str(src), str(repo)]) == 0
    assert "Icechunk materialised" in capsys.readouterr().out
    first = ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main")
    assert main(["migrate", str(src), str(repo)]) == 8  # an existing repository: the target is told from DST
    assert "--overwrite" in capsys.readouterr().err
    assert main(["migrate", str(src), str(repo), "--overwrite"]) == 0
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)))
    assert [s.id for s in repository.ancestry(branch="main")][1] == first  # one more snapshot, the old one kept
    store = tip(repo)
    for path, value in values.items():
        same(read(store, path), value)


def test_a_dry_run_creates_no_repository(tmp_path):
    src = tmp_path / "src"
    make_hierarchy(src)
    report = migrate(str(src), str(tmp_path / "repo"), MigrateOptions(target="icechunk", dry_run=True), progress=False)
    assert report.dry_run and report.arrays
    assert not (tmp_path / "repo").exists()


def test_a_damaged_array_skipped_leaves_no_document(tmp_path):
    src = tmp_path / "src"
    make_hierarchy(src)
    shard = next(p for p in sorted((src / "data" / "root" / "imgs" / "zl").rglob("*")) if p.is_file())
    shard.write_bytes(shard.read_bytes()[:-5])  # its index cut: a damaged shard
    report = migrate(str(src), str(tmp_path / "repo"), MigrateOptions(target="icechunk", skip_damaged=True),
                     progress=False)
    assert [s["path"] for s in report.skipped_arrays] == ["imgs/zl"]
    dst = open_icechunk(str(tmp_path / "repo"))
    assert not [k for k in dst.list_prefix("imgs/zl")]
    assert "zl" not in zarr.open_group(tip(tmp_path / "repo"), mode="r")["imgs"]


def _first_shard(src: Path) -> Path:
    """A source object of ``imgs/raw`` (sharded, several chunks)."""
    return next(p for p in sorted((src / "data" / "root" / "imgs" / "raw").rglob("*")) if p.is_file())


def _rewrite(obj: Path) -> None:
    data = obj.read_bytes()
    obj.write_bytes(data[:8] + bytes(len(data) - 8))


@pytest.mark.parametrize("change", [_rewrite, lambda obj: obj.write_bytes(obj.read_bytes()[:-3]),
                                    lambda obj: obj.unlink()], ids=["rewritten", "truncated", "deleted"])
def test_a_source_shard_changed_after_a_virtual_migration_makes_reads_raise(tmp_path, change):
    src = tmp_path / "src"
    values = make_hierarchy(src)
    repo = tmp_path / "repo"
    migrate(str(src), str(repo), MigrateOptions(virtual=True), progress=False)
    prefix = f"file://{os.path.realpath(src)}/"
    same(read(tip(repo, prefix), "imgs/raw"), values["imgs/raw"])
    change(_first_shard(src))
    with pytest.raises(ic.IcechunkError):
        read(tip(repo, prefix), "imgs/raw")
    same(read(tip(repo, prefix), "imgs/zl"), values["imgs/zl"])  # the other arrays still read
    code = main(["verify", str(src), str(repo)])
    assert code == 14 if change is _rewrite else code != 0  # rewritten: SourceChangedError; else the source's damage


def test_materialize_copies_every_virtual_chunk_in_one_commit(tmp_path, capsys):
    src = tmp_path / "src"
    values = make_hierarchy(src)
    repo = tmp_path / "repo"
    assert main(["migrate", str(src), str(repo), "--virtual=icechunk"]) == 0
    virtual = ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main")
    capsys.readouterr()
    assert main(["materialize", str(repo), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["chunks"] == 30 and done["bytes"] > 0
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)))
    assert [s.id for s in repository.ancestry(branch="main")][1] == virtual  # one commit on top
    record = json.loads(repository.lookup_snapshot(done["snapshot"]).metadata["sharding-store"]["objects"][RECORD_KEY])
    assert record["virtual"] is False
    shutil.rmtree(src)  # the source gone: the repository reads on its own (no container authorised)
    store = tip(repo)
    for path, value in values.items():
        same(read(store, path), value)
    assert main(["materialize", str(repo)]) == 0  # nothing virtual left: nothing committed
    assert "nothing to materialize" in capsys.readouterr().out
    assert ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main") == done["snapshot"]


def test_materialize_refuses_a_changed_source_and_commits_nothing(tmp_path, capsys):
    src = tmp_path / "src"
    make_hierarchy(src)
    repo = tmp_path / "repo"
    assert main(["migrate", str(src), str(repo), "--virtual=icechunk"]) == 0
    before = ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main")
    _rewrite(_first_shard(src))
    capsys.readouterr()
    assert main(["materialize", str(repo)]) == 14
    err = capsys.readouterr().err
    assert "imgs/raw/c/" in err and "changed" in err and len(err.strip().splitlines()) == 1
    assert ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main") == before
    assert main(["materialize", str(tmp_path / "nothing")]) == 7
    assert not (tmp_path / "nothing").exists()


@pytest.mark.slow
def test_materialize_refuses_a_source_file_replaced_by_a_fifo_without_waiting(tmp_path):
    """A FIFO put in a source shard's place: ``materialize`` refuses it (exit 14, naming its
    URL) before reading anything, and commits nothing; Icechunk's read of it would wait for
    ever, deaf to SIGTERM (a child process, killed after 60 s where it does)."""
    import subprocess
    import sys

    src = tmp_path / "src"
    make_hierarchy(src)
    repo = tmp_path / "repo"
    assert main(["migrate", str(src), str(repo), "--virtual=icechunk", "--no-progress"]) == 0
    before = ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main")
    shard = _first_shard(src)
    shard.unlink()
    os.mkfifo(shard)
    done = subprocess.run([sys.executable, "-m", "sharding_store", "materialize", str(repo)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    err = [line for line in done.stderr.splitlines() if line.startswith("sharding-store")]
    assert done.returncode == 14 and len(err) == 1 and f"file://{shard}: no longer a regular file" in err[0], err
    assert ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main") == before


@pytest.mark.parametrize("virtual", [False, True], ids=["materialised", "virtual"])
def test_an_xarray_dataset_reads_through_the_readme_lines(tmp_path, virtual):
    """A dataset xarray 2024 wrote as draft data, migrated into a repository, opened with the
    reader lines of docs/destinations.md: ``xr.open_zarr`` gives what the draft store gave."""
    xr = pytest.importorskip("xarray")
    from tests.integration.test_xarray_backend import xarray_style

    src = tmp_path / "ds.zr3"
    xarray_style(src)
    repo = tmp_path / "new.icechunk"
    assert main(["migrate", str(src), str(repo), "--virtual=icechunk" if virtual else "--icechunk"]) == 0
    grants = {f"file://{os.path.realpath(src)}/": None} if virtual else None
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)), authorize_virtual_chunk_access=grants)
    ds = xr.open_zarr(repository.readonly_session("main").store, consolidated=False)
    sub = xr.open_zarr(repository.readonly_session("main").store, group="sub", consolidated=False)
    xr.testing.assert_identical(ds.load(), xr.open_dataset(src, engine="sharding_store").load())
    xr.testing.assert_identical(sub.load(), xr.open_dataset(src, engine="sharding_store", group="sub").load())


def test_materialize_of_a_repository_whose_path_is_no_utf8_text(tmp_path, capsys):
    """A repository at a path with a byte 0xff (Linux allows it): its commit message and the
    summary name it escaped; it commits (exit 0), never an encoding error (exit 70)."""
    src = tmp_path / "src"
    values = make_hierarchy(src)
    repo = os.fsdecode(os.fsencode(tmp_path) + b"/re\xffpo")
    assert main(["migrate", str(src), repo, "--virtual=icechunk", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["materialize", repo]) == 0
    out = capsys.readouterr().out
    assert "re\\udcffpo" in out and "\udcff" not in out
    repository = ic.Repository.open(ic.local_filesystem_storage(repo))
    assert "re\\udcffpo" in next(iter(repository.ancestry(branch="main"))).message
    for path, value in values.items():
        same(read(tip(repo), path), value)
