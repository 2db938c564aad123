"""Every ``migrate`` option on the 2023-generation fixtures (issue 23): the one copy driver
plans, copies, resumes and verifies a 2023 store as it does a 2022 one, driven by each
array's meta (geometry, codecs, key encoding, shard index layout).

Each real 2023 store of ``../shared/fixtures/draft-2023/`` (copied first: the fixtures are
never written) is migrated with ``--chunks-per-shard``, ``--index-location start``,
``--portable``, ``--dimension-names``, on a dask ``LocalCluster`` (``--scheduler``) and
resumed after a SIGKILL, then every array is read back by zarr-python 3, zarrs and
tensorstore and compared with the fixture's ``expected.npz``; the source tree is hashed
before and after, and ``verify`` passes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from compat.test_three_readers import READERS
from sharding_store.cli import main
from sharding_store.formats.gen2023 import NODE_KEY
from sharding_store.ops.migration import MARKER_KEY, MigrationReport, migrate
from sharding_store.ops.verification import verify
from sharding_store.testing import fault_hook
from tests.draft_factory import tree_hash
from tests.unit.ops.test_gen2023_migrate import COLLECTIONS, _array_paths, _copy, _expected, _same

from ... import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
REPO = str(Path(__file__).resolve().parents[3])

OPTIONS = {
    "chunks-per-shard-2": {"chunks_per_shard": 2},
    "chunks-per-shard-1-no-checksum": {"chunks_per_shard": 1, "index_checksum": False},
    "index-location-start": {"index_location": "start"},
    "start-and-regrouped": {"chunks_per_shard": 3, "index_location": "start"},
    "portable": {"portable": True},
    "dimension-names": {},  # names given below, per array without names
    "no-index-checksum": {"index_checksum": False},
    "no-consolidate": {"consolidate": False},
    "resume": {"chunks_per_shard": 2, "index_location": "start"},  # killed after one unit, resumed
    "executor": {"chunks_per_shard": 2},  # the units run in a pool of processes (as on a dask cluster)
}
#: the parametrisations that cost most per store (a pool of processes, a second run)
HEAVY = {"resume", "executor"}


@dataclass(frozen=True)
class Source:
    """A store to migrate with every option: its arrays, their expected values, and what
    may be refused: ``gap(reader, path)`` names why a reader cannot read an array (an
    expected refusal, else None), ``opaque``: arrays whose shard index is inside an encoded
    object, which a re-chunking (``chunks_per_shard``) must leave out and name (every other
    option copies them as they are)."""

    store: Path
    arrays: tuple[str, ...]
    expected: Callable[[str], np.ndarray]
    gap: Callable[[str, str], str | None] = lambda reader, path: None
    opaque: frozenset[str] = frozenset()


def _stores() -> list:
    if not fixtures.available(fixtures.DRAFT_2023):
        return [pytest.param(None, marks=pytest.mark.skip(reason=fixtures.missing(fixtures.DRAFT_2023)), id="absent")]
    return [pytest.param(store, id=f"{c.name}/{store.name}") for c in COLLECTIONS
            for store in sorted(p for p in c.iterdir() if p.is_dir())]


STORES = _stores()


def _doc(root: Path, path: str) -> dict:
    return json.loads((root / path / NODE_KEY).read_bytes() if path else (root / NODE_KEY).read_bytes())


def _own_names(src: Path, path: str) -> list | None:
    """The dimension names ``src`` gives the array at ``path`` (v3 ``dimension_names``, or the
    2022 drafts' ``_ARRAY_DIMENSIONS`` attribute), None when it gives none."""
    if (src / path / NODE_KEY).is_file():
        return _doc(src, path).get("dimension_names")
    draft = json.loads((src / "meta" / "root" / f"{path}.array.json").read_bytes())
    return (draft.get("attributes") or {}).get("_ARRAY_DIMENSIONS")


def _names(src: Path, source: Source) -> dict[str, list[str]]:
    """Dimension names for every array of ``src`` that has none."""
    return {path: [f"d{i}" for i in range(source.expected(path).ndim)]
            for path in source.arrays if not _own_names(src, path)}


def _check_read_back(source: Source, dst: Path, report: MigrationReport | None = None) -> None:
    """Every array read by the three readers equals its expected values; a reader may refuse
    an array only where ``source.gap`` names why or the report calls it not portable."""
    portable = {a.path: a.portable for a in report.arrays} if report else dict.fromkeys(source.arrays, None)
    for path in source.arrays:
        if path not in portable:
            continue  # left out, checked by the caller
        want = source.expected(path)
        for name, read in READERS.items():
            try:
                got = read(dst, path)
            except Exception as e:  # noqa: BLE001 - a refusal: allowed only where named
                if source.gap(name, path) is None and portable[path] is not False:
                    raise AssertionError(f"{name} refuses {path} of {source.store.name}: {e}") from e
                continue
            try:
                _same(np.asarray(got).astype(want.dtype.newbyteorder("=")), want.astype(want.dtype.newbyteorder("=")))
            except AssertionError as e:
                raise AssertionError(f"{name} reads {path} of {source.store.name} wrong") from e


class Crash(BaseException):
    """The interruption of the ``resume`` parametrisation (not an error a retry catches)."""


def _interrupted(src: Path, dst: Path, kwargs: dict) -> None:
    """A migration stopped after its first completed unit (its destination left claimed)."""
    units = []

    def hook(phase: str) -> None:
        if phase == "unit":
            units.append(phase)
            raise Crash()

    with fault_hook(hook), pytest.raises(Crash):
        migrate(str(src), str(dst), jobs=1, progress=False, **kwargs)
    assert (dst / MARKER_KEY).exists()


def _run(option: str, src: Path, dst: Path, kwargs: dict) -> MigrationReport:
    if option == "resume":
        _interrupted(src, dst, kwargs)
        return migrate(str(src), str(dst), jobs=2, resume=True, progress=False, **kwargs)
    if option == "executor":
        with ProcessPoolExecutor(2) as pool:
            return migrate(str(src), str(dst), executor=pool, progress=False, **kwargs)
    return migrate(str(src), str(dst), jobs=2, progress=False, **kwargs)


def migrate_with_option(source: Source, option: str, tmp_path: Path) -> None:
    """Migrate a copy of ``source.store`` with ``option`` (:data:`OPTIONS`), then check: the
    source unchanged, the report and ``verify`` clean, the documents saying what the option
    asked for, and every array read back right by zarr-python 3, tensorstore and zarrs. The
    one check of the matrix, for every collection of sources."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _copy(source.store, src)
    before = tree_hash(src)
    kwargs = dict(OPTIONS[option])
    if option == "dimension-names":
        kwargs["dimension_names"] = _names(src, source)
    regrouped = "chunks_per_shard" in kwargs
    if regrouped and source.opaque:
        kwargs["skip_damaged"] = True
    report = _run(option, src, dst, kwargs)
    assert report.verification is not None and report.verification.ok
    assert set(report.skipped_paths) == (set(source.opaque) if regrouped else set()), report.skipped_arrays
    assert tree_hash(src) == before, "the migration modified its source"
    assert verify(str(src), str(dst)).ok
    _check_read_back(source, dst, report)
    assert (MARKER_KEY not in {p.name for p in dst.iterdir()})
    assert ("consolidated_metadata" in _doc(dst, "")) == (option != "no-consolidate" and _doc(dst, "")["node_type"] == "group")
    for path in {a.path for a in report.arrays}:
        _check_document(_doc(dst, path), path, option, kwargs)


def _check_document(doc: dict, path: str, option: str, kwargs: dict) -> None:
    """The migrated document of ``path`` says what ``option`` asked for."""
    sharding = doc["codecs"][0]["configuration"] if doc["codecs"][0]["name"] == "sharding_indexed" else None
    if "chunks_per_shard" in kwargs and len(doc["codecs"]) == 1:
        assert sharding is not None, path
        grid, inner = doc["chunk_grid"]["configuration"]["chunk_shape"], sharding["chunk_shape"]
        assert [g // c for g, c in zip(grid, inner)] == [kwargs["chunks_per_shard"]] * len(grid), path
    if "index_location" in kwargs and sharding is not None:
        assert sharding["index_location"] == "start", path
    if option == "dimension-names" and path in kwargs["dimension_names"]:
        assert doc["dimension_names"] == kwargs["dimension_names"][path]


def option_params() -> list:
    """:data:`OPTIONS` as parameters, the heavy ones marked slow."""
    return [pytest.param(o, id=o, marks=[pytest.mark.slow] if o in HEAVY else []) for o in OPTIONS]


def draft_2023_source(store: Path) -> Source:
    collection = store.parent.name
    return Source(store, tuple(_array_paths(store)), lambda path: _expected(collection, store.name, path))


def zarrita_2021_source() -> Source:
    """The 2021 zarrita store (the 2022 drafts' ``meta/root`` layout, read by the 2022 reader)."""
    root = fixtures.ZARRITA_2021
    store = root / "zarrita.zr3"

    def expected(path: str) -> np.ndarray:
        with np.load(root / "expected.npz") as npz:
            return npz[f"zarrita.zr3::{path.replace('/', '__')}"]

    arrays = sorted(p.relative_to(store / "meta" / "root").as_posix().removesuffix(".array.json")
                    for p in (store / "meta" / "root").rglob("*.array.json"))
    return Source(store, tuple(arrays), expected)


@pytest.mark.slow  # every option x every store: ~100 s
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("option", option_params())
def test_every_option_on_every_2023_store(tmp_path, store, option):
    migrate_with_option(draft_2023_source(store), option, tmp_path)


@fixtures.needs(fixtures.ZARRITA_2021)
@pytest.mark.parametrize("option", option_params())
def test_every_option_on_the_2021_zarrita_store(tmp_path, option):
    migrate_with_option(zarrita_2021_source(), option, tmp_path)


@pytest.mark.parametrize("store", STORES[:1])
def test_dimension_names_conflicting_with_the_documents_are_refused(tmp_path, store, capsys):
    src = tmp_path / "src"
    _copy(store, src)
    path = _array_paths(src)[0]
    doc = _doc(src, path)
    doc["dimension_names"] = [f"x{i}" for i in range(len(doc["shape"]))]
    (src / path / NODE_KEY).write_text(json.dumps(doc))
    other = ",".join(f"y{i}" for i in range(len(doc["shape"])))
    assert main(["migrate", str(src), str(tmp_path / "dst"), "--dimension-names", f"{path}={other}"]) == 2
    assert "refusing to rename" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())


# --------------------------------------------------------------------------- an executor


distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40) as c:
        yield c


@pytest.mark.slow  # a dask cluster
def test_a_dask_cluster_runs_the_units_of_a_2023_store(cluster, tmp_path, capsys):
    store = fixtures.require(fixtures.ZARRITAJS_2023_ENDIAN) / "data.zarr"
    src = tmp_path / "src"
    _copy(store, src)
    before = tree_hash(src)
    assert main(["migrate", str(src), str(tmp_path / "dask"), "--scheduler", cluster.scheduler_address,
                 "--chunks-per-shard", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verified"]["ok"] and report["objects_written"] + report["objects_copied"] == report["objects"]
    assert main(["verify", str(src), str(tmp_path / "dask"), "--scheduler", cluster.scheduler_address]) == 0
    assert main(["migrate", str(src), str(tmp_path / "threads"), "--chunks-per-shard", "2"]) == 0
    dask_tree = {p.relative_to(tmp_path / "dask"): p.read_bytes() for p in (tmp_path / "dask").rglob("*") if p.is_file()}
    thread_tree = {p.relative_to(tmp_path / "threads"): p.read_bytes() for p in (tmp_path / "threads").rglob("*")
                   if p.is_file()}
    assert dask_tree == thread_tree and tree_hash(src) == before
    _check_read_back(draft_2023_source(store), tmp_path / "dask")


# --------------------------------------------------------------------------- resume after a kill


@pytest.mark.slow  # a killed process
def test_a_killed_migration_with_options_is_resumed(tmp_path):
    store = fixtures.require(fixtures.ZARRITAJS_2023_ENDIAN) / "data.zarr"
    src, dst = tmp_path / "src", tmp_path / "dst"
    _copy(store, src)
    before = tree_hash(src)
    options = ["--chunks-per-shard", "2", "--index-location", "start"]
    proc = subprocess.run([sys.executable, "-m", "tests.run_with_fault", "--kill-at", "unit:12", "--",
                           "migrate", str(src), str(dst), "--jobs", "1", *options],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    assert (dst / MARKER_KEY).exists() and not (dst / NODE_KEY).exists()
    other = subprocess.run([sys.executable, "-m", "sharding_store.cli", "migrate", str(src), str(dst), "--resume"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "other options" in other.stderr, other.stderr
    assert main(["migrate", str(src), str(dst), "--resume", *options]) == 0
    assert not (dst / MARKER_KEY).exists() and tree_hash(src) == before
    _check_read_back(draft_2023_source(store), dst)


# --------------------------------------------------------------------------- an array we cannot decode


def _whole_shards_compressed(root: Path) -> np.ndarray:
    """A 2023 array whose shards are each gzip-compressed whole (a codec after
    ``sharding_indexed``: valid v1.0, its index inside an encoded object)."""
    import gzip

    from tests.gen2023_writer import write_2023

    data = np.arange(64, dtype="<u2").reshape(8, 8)
    write_2023(root, "z", data, chunks=(2, 2), cps=(2, 2), index="crc", spelling="bytes")
    doc = json.loads((root / "z" / NODE_KEY).read_text())
    doc["codecs"].append({"name": "gzip", "configuration": {"level": 1}})
    (root / "z" / NODE_KEY).write_text(json.dumps(doc))
    for p in (root / "z" / "c").rglob("*"):
        if p.is_file():
            p.write_bytes(gzip.compress(p.read_bytes(), mtime=0))
    return data


def test_an_array_we_cannot_decode_is_copied_as_it_is(tmp_path, capsys):
    src = tmp_path / "src"
    data = _whole_shards_compressed(src)
    before = tree_hash(src)
    for option in ([], ["--portable"], ["--index-location", "start"], ["--dimension-names", "z=y,x"]):
        dst = tmp_path / f"dst{len(list(tmp_path.iterdir()))}"
        assert main(["migrate", str(src), str(dst), *option]) == 0, option
        for p in (src / "z" / "c").rglob("*"):
            if p.is_file():  # byte for byte, under the same key
                assert (dst / p.relative_to(src)).read_bytes() == p.read_bytes()
        np.testing.assert_array_equal(READERS["zarr-python"](dst, "z"), data)
    capsys.readouterr()
    assert main(["migrate", str(src), str(tmp_path / "regrouped"), "--chunks-per-shard", "2"]) == 10
    err = capsys.readouterr().err
    assert "z/zarr.json" in err and "inside an encoded object" in err
    assert main(["migrate", str(src), str(tmp_path / "skipped"), "--chunks-per-shard", "2", "--skip-damaged",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(s["path"], s["kind"]) for s in report["skipped"]["arrays"]] == [("z", "untranslatable")]
    assert tree_hash(src) == before
