"""reshard / unshard / shard: payloads preserved byte for byte, in-place safety, CLI.

The ground truth of every check is the *chunk view* of a store: for each array, every
chunk key a draft reader sees and the raw payload it gets (``ShardingStore``), which
resharding must not change; values are checked too, through ``open_draft``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import shutil
from pathlib import Path

import fsspec
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store import (
    DestinationExistsError,
    MigrationError,
    ShardingStore,
    StoreNotFoundError,
    UsageError,
    reshard,
    shard,
    unshard,
)
from sharding_store.api.arrays import create_draft_array, open_draft
from sharding_store.api.hierarchy import inner_of, open_hierarchy
from sharding_store.cli import main
from sharding_store.engine.store import ArrayLayout
from sharding_store.formats import draft_metadata as dm
from sharding_store.testing import CountingInner, fault_hook
from tests.fixtures import ZARR_JS, require, stores

# the package exports the function ``reshard``, which shadows the submodule's attribute
rs = importlib.import_module("sharding_store.ops.resharding")

FIXTURES = ZARR_JS
ALL_FIXTURES = stores(FIXTURES, names=True)  # one skipped parameter where ../shared is absent
SHARDED = stores(FIXTURES, "*.sharded.*.zarr", names=True)


class InjectedCrash(Exception):
    """Raised by the fault hook: the process 'dies' here."""


# --------------------------------------------------------------------------- helpers


def chunk_view(store) -> dict[str, dict[str, bytes]]:
    """array path -> {chunk key: raw payload} as a draft reader sees it."""
    inner = inner_of(store)
    sharding = ShardingStore(inner)
    out = {}
    for node in open_hierarchy(inner).arrays():
        layout = ArrayLayout.from_meta(node.meta)
        keys = [k for k in sharding.list_prefix(layout.prefix) if layout.parse(k) is not None]
        out[node.path] = sharding.getitems(keys)
    return out


def values(store) -> dict[str, np.ndarray]:
    return {n.path: open_draft(store, n.path)[...] for n in open_hierarchy(inner_of(store)).arrays()}


def layouts(store) -> dict[str, tuple | None]:
    return {n.path: n.meta.chunks_per_shard for n in open_hierarchy(inner_of(store)).arrays()}


def assert_same_values(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for path in a:
        assert a[path].dtype == b[path].dtype and a[path].shape == b[path].shape, path
        assert np.array_equal(a[path], b[path], equal_nan=a[path].dtype.kind in "fc"), path


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(require(FIXTURES) / name, dst)
    return dst


def make_store(root, shape=(10, 9), chunks=(2, 3), cps=(2, 2), path="a/b", sep="/", overwrite=False):
    """A 2.18-style array holding distinct values."""
    arr = create_draft_array(str(root) if isinstance(root, Path) else root, path, shape=shape, chunks=chunks,
                             dtype="<i4", chunks_per_shard=cps, dimension_separator=sep, overwrite=overwrite)
    arr[...] = np.arange(int(np.prod(shape)), dtype="<i4").reshape(shape)
    return root


def consolidate(root: Path) -> None:
    """Draft consolidated metadata of every metadata document, as zarr 2.18 writes it."""
    docs = {str(p.relative_to(root)): json.loads(p.read_bytes()) for p in root.rglob("*.json") if "__reshard__" not in str(p)}
    docs = {k: v for k, v in docs.items() if k.startswith("meta/") or k == "zarr.json"}
    (root / dm.CONSOLIDATED_KEY).write_bytes(dm._json_dumps({"metadata": docs, "zarr_consolidated_format": 1}))


@pytest.fixture
def crash_after():
    """crash_after(phase, n): the n-th object operation of ``phase`` raises InjectedCrash
    (a fault hook installed through ``sharding_store.testing.fault_hook``)."""
    with contextlib.ExitStack() as armed:

        def arm(phase: str, n: int) -> dict:
            seen = {"calls": 0}

            def hook(p: str) -> None:
                if p == phase:
                    seen["calls"] += 1
                    if seen["calls"] == n:
                        raise InjectedCrash(f"{phase} #{n}")

            armed.close()
            armed.enter_context(fault_hook(hook))
            return seen

        arm.disarm = armed.close  # type: ignore[attr-defined]
        yield arm


# --------------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_fixture_round_trips_preserve_every_payload(name, tmp_path):
    src = copy_fixture(name, tmp_path)
    original_files = tree_digest(src)
    view, vals = chunk_view(src), values(src)

    # a copy: one chunk per shard; the source is only read
    reshard(src, tmp_path / "copy", chunks_per_shard=1, progress=False)
    assert tree_digest(src) == original_files
    assert chunk_view(tmp_path / "copy") == view
    assert_same_values(values(tmp_path / "copy"), vals)
    assert set(layouts(tmp_path / "copy").values()) <= {(1,) * n for n in (1, 2, 3)}

    # in place: unshard, shard again with more chunks per shard, reshard unevenly
    for op in (lambda: unshard(src), lambda: shard(src, chunks_per_shard=3), lambda: reshard(src, chunks_per_shard=2)):
        op()
        assert chunk_view(src) == view
        assert_same_values(values(src), vals)
        assert not (src / "__reshard__").exists()


@pytest.mark.parametrize("name", SHARDED)
def test_unshard_matches_the_unsharded_twin(name, tmp_path):
    """zarr-js twins hold the same data unsharded: unsharding gives their chunk objects."""
    twin = FIXTURES / name.replace(".sharded", "")
    if name == "2d.chunked.compressed.sharded.i2.zarr" or not twin.is_dir():
        pytest.skip("no twin with the same data")
    src = copy_fixture(name, tmp_path)
    unshard(src)
    chunk_shapes = {p: n.meta.chunks for p, n in open_hierarchy(str(src)).nodes.items() if n.kind == "array"}
    if chunk_shapes != {p: n.meta.chunks for p, n in open_hierarchy(str(twin)).nodes.items() if n.kind == "array"}:
        pytest.skip("the twin has another chunk shape")
    data = lambda root: {k: v for k, v in tree_digest(root).items() if k.startswith("data/")}  # noqa: E731
    assert data(src) == data(twin)


def test_consolidated_metadata_follows(tmp_path):
    src = copy_fixture("1d.contiguous.compressed.sharded.i2.group.zarr", tmp_path)
    unshard(src)
    doc = json.loads((src / dm.CONSOLIDATED_KEY).read_bytes())["metadata"]
    for path in ("a", "b"):
        assert "storage_transformers" not in doc[f"meta/root/{path}.array.json"]
        assert doc[f"meta/root/{path}.array.json"] == json.loads((src / f"meta/root/{path}.array.json").read_bytes())


# --------------------------------------------------------------------------- hypothesis


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.lists(st.integers(1, 13), min_size=1, max_size=3),
    data=st.data(),
)
def test_random_layouts_preserve_payloads(shape, data):
    ndim = len(shape)
    chunks = tuple(data.draw(st.integers(1, 4)) for _ in range(ndim))
    cps_st = st.one_of(st.none(), st.tuples(*[st.integers(1, 7)] * ndim))
    old, new = data.draw(cps_st), data.draw(cps_st)
    # a factor of 1 sends most layout pairs down the one-task-per-target-shard path
    factor = data.draw(st.sampled_from([1, rs.MAX_BLOCK_FACTOR]))
    store: dict = {}
    make_store(store, shape=tuple(shape), chunks=chunks, cps=old, path="x", sep=data.draw(st.sampled_from("/.")))
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    missing = data.draw(st.lists(st.tuples(*[st.integers(0, g - 1) for g in grid]), max_size=3))
    ShardingStore(store).erase_values([ArrayLayout.from_meta(open_draft(store, "x").meta).chunk_key(c) for c in missing])
    view, vals = chunk_view(store), values(store)
    copy: dict = {}
    default_factor, rs.MAX_BLOCK_FACTOR = rs.MAX_BLOCK_FACTOR, factor
    try:
        reshard(store, copy, chunks_per_shard=new, jobs=data.draw(st.integers(1, 3)), progress=False)
        reshard(store, chunks_per_shard=new, progress=False)
    finally:
        rs.MAX_BLOCK_FACTOR = default_factor
    for result in (store, copy):
        assert layouts(result) == {"x": new}
        assert chunk_view(result) == view
        assert_same_values(values(result), vals)
    assert not any(k.startswith(rs.STAGING) for k in store)


def test_lcm_fallback_reads_target_ranges():
    """7 -> 8 chunks per shard: lcm blocks are too big, each target shard is a task."""
    assert rs._block_shape((7, 7), (8, 8)) is None
    assert rs._block_shape((2, 4), (4, 2)) == (4, 4)
    store: dict = {}
    make_store(store, shape=(30, 30), chunks=(2, 2), cps=(7, 7), path="x")
    view = chunk_view(store)
    reshard(store, chunks_per_shard=8)
    assert chunk_view(store) == view


# --------------------------------------------------------------------------- idempotence


def test_already_in_layout_writes_nothing(tmp_path):
    make_store(tmp_path, cps=(2, 2))
    counting = CountingInner(str(tmp_path))
    report = reshard(counting, chunks_per_shard=(2, 2))
    assert report.arrays_skipped == ["a/b"] and not report.arrays_changed
    assert counting.writes == 0 and counting.calls["delete"] == 0 and counting.calls["delete_prefix"] == 0
    report = shard(counting, chunks_per_shard=5)  # already sharded: shard() leaves it
    assert report.arrays_skipped == ["a/b"] and counting.writes == 0


def test_unshard_unsharded_is_a_noop(tmp_path):
    src = copy_fixture("2d.chunked.compressed.i2.zarr", tmp_path)
    before = tree_digest(src)
    mtimes = {p: p.stat().st_mtime_ns for p in src.rglob("*")}
    report = unshard(src)
    assert report.arrays_skipped == [""] and report.objects_written == 0
    assert tree_digest(src) == before
    assert {p: p.stat().st_mtime_ns for p in src.rglob("*")} == mtimes


def test_short_chunks_per_shard_spelling_counts_as_same_layout(tmp_path):
    make_store(tmp_path, shape=(4, 4, 4), chunks=(1, 1, 1), cps=(2,))  # stored as [2]: means (2, 1, 1)
    counting = CountingInner(str(tmp_path))
    assert reshard(counting, chunks_per_shard=(2, 1, 1)).arrays_skipped == ["a/b"]
    assert counting.writes == 0


# --------------------------------------------------------------------------- in place: crash + resume


PHASES = [("stage", 1), ("stage", 5), ("hide", 1), ("hide", 2), ("clear", 1), ("clear", 3),
          ("move", 1), ("move", 4), ("commit", 1), ("commit", 2)]


@pytest.mark.parametrize("resume_via", ["rerun", "complete_interrupted", "cli"])
@pytest.mark.parametrize("phase,n", PHASES)
def test_crash_then_resume(tmp_path, crash_after, phase, n, resume_via):
    src = copy_fixture("1d.contiguous.compressed.sharded.i2.group.zarr", tmp_path)
    for path in ("a", "b"):  # big enough arrays for every crash point
        make_store(src, shape=(80,), chunks=(2,), cps=(2,), path=path, overwrite=True)
    consolidate(src)
    rs_meta = (src / dm.CONSOLIDATED_KEY).read_bytes()
    view, vals = chunk_view(src), values(src)
    crash_after(phase, n)
    with pytest.raises(InjectedCrash):
        reshard(src, chunks_per_shard=6, jobs=1)
    crash_after.disarm()

    # what a reader sees now: the old array, nothing, or (after commit) the new one
    journal = json.loads((src / rs.JOURNAL_PREFIX / "meta/root/a.array.json").read_bytes())
    try:
        arr = open_draft(src, "a")
    except StoreNotFoundError:
        assert (phase, n) not in (("stage", 1), ("stage", 5), ("hide", 1))
    else:
        assert (phase, n) not in (("hide", 2), ("clear", 1), ("clear", 3), ("move", 1), ("move", 4))
        assert np.array_equal(arr[...], vals["a"])
        assert arr.meta.chunks_per_shard == ((2,) if phase in ("stage", "hide") else (6,))
    assert journal["phase"] == {"stage": "stage", "hide": "swap", "clear": "swap", "move": "move", "commit": "move"}[phase]
    if phase == "stage":
        assert (src / dm.CONSOLIDATED_KEY).read_bytes() == rs_meta  # nothing touched yet

    if resume_via == "rerun":
        report = reshard(src, chunks_per_shard=6, jobs=1)
        assert report.arrays_resumed == ["a"] and report.arrays_changed == ["b"]
    elif resume_via == "complete_interrupted":
        rs.complete_interrupted(src)
        reshard(src, chunks_per_shard=6)
    else:
        assert main(["reshard", str(src), "--resume", "--no-progress"]) == 0
        assert main(["reshard", str(src), "--chunks-per-shard", "6", "--no-progress"]) == 0
    assert layouts(src) == {"a": (6,), "b": (6,)}
    assert chunk_view(src) == view
    assert_same_values(values(src), vals)
    assert not (src / "__reshard__").exists()
    consolidated = json.loads((src / dm.CONSOLIDATED_KEY).read_bytes())["metadata"]
    assert consolidated["meta/root/a.array.json"]["storage_transformers"][0]["configuration"]["chunks_per_shard"] == [6]


@pytest.mark.parametrize("old,new,total", [((2, 2), None, 400), ((4, 4), (2, 2), 100)])
def test_resumed_staging_keeps_staged_objects(tmp_path, crash_after, old, new, total):
    """Blocks of 4 targets (4 chunks unsharded, or a shard of 4x4 chunks split into four):
    the crash after the 30th object leaves 7 whole blocks, which the resume keeps, also
    where a task takes several blocks (``merge_blocks``): it writes them one after the other."""
    make_store(tmp_path, shape=(40, 40), chunks=(2, 2), cps=old)
    crash_after("stage", 30)
    with pytest.raises(InjectedCrash):
        reshard(tmp_path, chunks_per_shard=new, jobs=1)
    crash_after.disarm()
    report = rs.complete_interrupted(tmp_path, jobs=1)
    assert report.arrays_resumed == ["a/b"]
    assert report.objects_written == total - 28  # whole tasks of 4 objects staged before the crash are kept


def test_stage_journal_is_rolled_back_when_the_array_changed(tmp_path, crash_after):
    make_store(tmp_path, shape=(8,), chunks=(2,), cps=(2,))
    crash_after("stage", 1)
    with pytest.raises(InjectedCrash):
        unshard(tmp_path, jobs=1)
    crash_after.disarm()
    meta_key = tmp_path / "meta/root/a/b.array.json"
    meta_key.write_bytes(meta_key.read_bytes().replace(b'"attributes": {}', b'"attributes": {"x": 1}'))
    report = rs.complete_interrupted(tmp_path)
    assert report.arrays_resumed == [] and not (tmp_path / "__reshard__").exists()
    assert layouts(tmp_path) == {"a/b": (2,)}


def test_refuses_pending_journal_without_resume_or_for_a_copy(tmp_path, crash_after):
    make_store(tmp_path / "s", shape=(8,), chunks=(2,), cps=(2,))
    crash_after("move", 1)
    with pytest.raises(InjectedCrash):
        unshard(tmp_path / "s", jobs=1)
    crash_after.disarm()
    with pytest.raises(MigrationError, match="interrupted in-place reshard of 'a/b' \\(move\\)"):
        unshard(tmp_path / "s", resume=False)
    with pytest.raises(MigrationError, match="--resume"):
        unshard(tmp_path / "s", tmp_path / "d")


def test_damaged_shard_changes_nothing(tmp_path):
    make_store(tmp_path, shape=(8,), chunks=(2,), cps=(2,))
    (tmp_path / "data/root/a/b/c1").write_bytes(b"short")
    before = tree_digest(tmp_path)
    with pytest.raises(MigrationError, match="data/root/a/b/c1.*nothing was changed"):
        unshard(tmp_path)
    assert tree_digest(tmp_path) == before
    assert not (tmp_path / "__reshard__").exists()


# --------------------------------------------------------------------------- copies, selection, URLs


def test_destination_must_not_exist(tmp_path):
    src = copy_fixture("2d.chunked.compressed.sharded.i2.zarr", tmp_path)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    with pytest.raises(DestinationExistsError, match="dst.*--overwrite"):
        unshard(src, dst)
    assert (dst / "keep.txt").exists()
    # a directory that holds no Zarr hierarchy and nothing of ours is never emptied
    with pytest.raises(DestinationExistsError, match="--overwrite empties only a Zarr hierarchy.*'keep.txt'"):
        unshard(src, dst, overwrite=True)
    assert (dst / "keep.txt").read_text() == "x"
    (dst / "keep.txt").unlink()
    unshard(src, dst)
    assert chunk_view(dst) == chunk_view(src)
    assert not (dst / ".sharding-store-migration.json").exists()
    unshard(src, dst, overwrite=True)  # a hierarchy (here our own output) is emptied and rewritten
    assert chunk_view(dst) == chunk_view(src)
    with pytest.raises(UsageError, match="destination is the source"):
        unshard(src, src / "inner", overwrite=True)


def test_overwrite_of_an_interrupted_copy_and_the_cli_refusal(tmp_path, capsys):
    """A reshard's copy killed before its zarr.json stays one that --overwrite recognises
    (the marker); the CLI refuses a foreign directory in one line, exit 8, touching nothing."""
    src = copy_fixture("2d.chunked.compressed.sharded.i2.zarr", tmp_path)
    dst = tmp_path / "dst"

    def boom(phase: str) -> None:
        if phase not in ("lock", "claim"):  # killed once the marker is there: during the copy
            raise KeyboardInterrupt

    with fault_hook(boom), pytest.raises(KeyboardInterrupt):
        unshard(src, dst)
    assert (dst / ".sharding-store-migration.json").exists() and not (dst / "zarr.json").exists()
    unshard(src, dst, overwrite=True)
    assert chunk_view(dst) == chunk_view(src)
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_bytes(b"\xff\xd8")
    assert main(["reshard", str(src), str(other), "--chunks-per-shard", "1,1", "--overwrite"]) == 8
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "photos" in err[0] and "a.jpg" in err[0]
    assert (other / "a.jpg").read_bytes() == b"\xff\xd8" and sorted(p.name for p in other.iterdir()) == ["a.jpg"]


def test_a_marker_appearing_after_the_emptiness_check_is_refused(tmp_path):
    """Two reshards (or a reshard and a migration) into one empty DST: the other run's
    marker appears between this run's emptiness check and its claim; this run refuses
    (exit 8's class, naming the marker) and writes nothing (it used to overwrite the
    marker and copy into the same directory)."""
    src = copy_fixture("2d.chunked.compressed.sharded.i2.zarr", tmp_path)
    dst = tmp_path / "dst"
    theirs = b'{"command": "reshard", "source": "the other run"}'

    def other_run_claims(phase: str) -> None:
        if phase == "claim":
            dst.mkdir(exist_ok=True)
            (dst / ".sharding-store-migration.json").write_bytes(theirs)

    with fault_hook(other_run_claims), pytest.raises(DestinationExistsError, match="another reshard or migration"
                                                                                   ".*sharding-store-migration.json"):
        unshard(src, dst)
    assert [p.name for p in dst.iterdir()] == [".sharding-store-migration.json"]
    assert (dst / ".sharding-store-migration.json").read_bytes() == theirs


@pytest.mark.slow  # two processes
def test_two_reshard_processes_into_one_destination_never_both_write(tmp_path):
    """Two CLI reshards of different sources into one DST, met where each takes DST's lock:
    exactly one succeeds and DST is its copy; the other exits 8, one line naming the holder."""
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[3])
    one = copy_fixture("2d.chunked.compressed.sharded.i2.zarr", tmp_path / "one")
    two = tmp_path / "two"
    make_store(two, shape=(10, 9), chunks=(2, 3), cps=(2, 2), path="a/b")
    dst = tmp_path / "dst"
    procs = {
        src: subprocess.Popen(
            [sys.executable, "-m", "tests.run_with_fault", "--rendezvous", "lock", str(tmp_path / "meet"), "2", "--",
             "reshard", str(src), str(dst), "--chunks-per-shard", "1"],
            cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for src in (one, two)
    }
    results = {src: (p.wait(timeout=300), p.stderr.read()) for src, p in procs.items()}  # type: ignore[union-attr]
    assert sorted(code for code, _ in results.values()) == [0, DestinationExistsError.exit_code], results
    winner = next(src for src, (code, _) in results.items() if code == 0)
    loser_err = next(err for code, err in results.values() if code != 0)
    assert len(loser_err.strip().splitlines()) == 1 and "another migration or reshard" in loser_err, loser_err
    assert "held by a reshard run (pid" in loser_err and "still running" in loser_err, loser_err
    assert chunk_view(dst) == chunk_view(winner)
    assert not (dst / ".sharding-store-migration.json").exists()


def test_array_selection(tmp_path):
    src = copy_fixture("1d.contiguous.compressed.sharded.i2.group.zarr", tmp_path)
    b_files = {k: v for k, v in tree_digest(src).items() if "/b" in k}
    report = unshard(src, arrays=["a"])
    assert report.arrays_changed == ["a"]
    assert layouts(src) == {"a": None, "b": (2,)}
    assert {k: v for k, v in tree_digest(src).items() if "/b" in k} == b_files
    with pytest.raises(UsageError, match="group, not an array"):
        unshard(src, arrays=[""])
    with pytest.raises(StoreNotFoundError, match="nope"):
        unshard(src, arrays=["nope"])


def test_copy_keeps_other_arrays_and_stray_keys_verbatim(tmp_path):
    src = copy_fixture("1d.contiguous.compressed.sharded.i2.group.zarr", tmp_path)
    (src / "notes.txt").write_text("hello")
    reshard(src, tmp_path / "out", chunks_per_shard=1, arrays=["b"])
    out = tree_digest(tmp_path / "out")
    ours = tree_digest(src)
    for key in ("notes.txt", "zarr.json", "meta/root/a.array.json", "data/root/a/c0", "meta/root.group.json"):
        assert out[key] == ours[key]
    assert out["meta/root/b.array.json"] != ours["meta/root/b.array.json"]


def test_memory_url(tmp_path):
    fs = fsspec.filesystem("memory")
    src = copy_fixture("3d.chunked.mixed.compressed.sharded.i2.zarr", tmp_path)
    fs.put(str(src), "/rs-src", recursive=True)
    view, vals = chunk_view(src), values(src)
    try:
        unshard("memory://rs-src")
        assert layouts("memory://rs-src") == {"": None}
        reshard("memory://rs-src", "memory://rs-dst", chunks_per_shard=(3, 3, 1))
        for url in ("memory://rs-src", "memory://rs-dst"):
            assert chunk_view(url) == view
            assert_same_values(values(url), vals)
        assert not fs.exists("/rs-src/__reshard__") or not fs.find("/rs-src/__reshard__")
    finally:
        for p in ("/rs-src", "/rs-dst"):
            if fs.exists(p):
                fs.rm(p, recursive=True)


def test_zero_d_array(tmp_path):
    arr = create_draft_array(str(tmp_path), "z", shape=(), chunks=(), dtype="<f8", chunks_per_shard=(1,))
    arr[...] = 3.5
    view = chunk_view(tmp_path)
    unshard(tmp_path)
    assert chunk_view(tmp_path) == view and (tmp_path / "data/root/z/c0").is_file()
    shard(tmp_path, chunks_per_shard=4)
    assert chunk_view(tmp_path) == view and layouts(tmp_path) == {"z": ()}
    assert open_draft(str(tmp_path), "z")[...] == 3.5


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("cps,message", [("0", "every entry must be >= 1"), ("2,2", "has 2 entries, the array has 1"), ("x", "expected N")])
def test_cli_bad_chunks_per_shard(tmp_path, capsys, cps, message):
    src = copy_fixture("1d.chunked.compressed.i2.zarr", tmp_path)
    before = tree_digest(src)
    assert main(["reshard", str(src), "--chunks-per-shard", cps]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert tree_digest(src) == before


def test_cli_json_report_and_dst(tmp_path, capsys):
    src = copy_fixture("1d.contiguous.compressed.sharded.i2.group.zarr", tmp_path)
    dst = tmp_path / "out"
    assert main(["reshard", str(src), str(dst), "--unshard", "--array", "a", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["arrays_changed"] == ["a"] and report["in_place"] is False
    assert report["objects_written"] == 1 and report["objects_copied"] >= 5
    assert main(["reshard", str(src), str(dst), "--unshard"]) == 8  # DestinationExistsError
    assert "exists" in capsys.readouterr().err
    assert main(["reshard", str(src)]) == 2  # no layout given
    assert main(["reshard", str(src), "--unshard", "--chunks-per-shard", "2"]) == 2
