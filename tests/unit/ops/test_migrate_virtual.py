"""Virtual migration (issue 24): options, what DST is, how it is opened and finished.

The driver branch and the reference file: further below and in
``tests/unit/stores/test_references.py``.
"""

from __future__ import annotations

import json
import os
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import fsspec
import numpy as np
import pytest
import zarr

from sharding_store import (
    DestinationExistsError,
    MigrateOptions,
    MigrationError,
    ShardCorruptError,
    ShardingStoreError,
    SourceChangedError,
    UsageError,
    create_draft_array,
    open_references,
    verify,
)
from sharding_store.formats import draft_metadata as dm
from sharding_store.ops.migration import ICECHUNK_HINT, migrate, open_destination, resolve_target
from sharding_store.ops.options import RunOptions, StoreOptions
from sharding_store.stores import as_inner
from sharding_store.testing import CountingInner
from tests.draft_factory import add_dead_bytes, make_big_array, make_hierarchy, tree_bytes, tree_hash
from tests.unit.ops.test_gen2023_migrate import _same
from tests.unit.ops.test_gen2023_migrate_options import STORES, draft_2023_source, zarrita_2021_source
from tests.unit.ops.test_journal_interrupted import interrupted  # noqa: F401 - a fixture

from ... import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def source(tmp_path):
    make_hierarchy(tmp_path / "src")
    return tmp_path / "src"


# --------------------------------------------------------------------------- options


def test_a_reference_file_is_always_virtual():
    assert MigrateOptions(target="references").virtual is True
    assert MigrateOptions(target="icechunk").virtual is False


@pytest.mark.parametrize("kwargs, words", [
    (dict(target="tar"), "MigrateOptions.target: one of zarr, icechunk, references"),
    (dict(virtual=True, target="zarr"), "a Zarr store holds bytes, not references"),
    (dict(virtual=True, portable=True), "--portable with --virtual: re-encoding chunks writes new bytes"),
    (dict(virtual="yes"), "MigrateOptions.virtual: True or False"),
])
def test_options_a_virtual_migration_cannot_honour_are_refused(kwargs, words):
    with pytest.raises(UsageError, match=words):
        MigrateOptions(**kwargs)


# --------------------------------------------------------------------------- what DST is


def test_the_target_is_decided_from_dst(tmp_path):
    repo = tmp_path / "repo"
    (repo / "refs" / "branch.main").mkdir(parents=True)
    (repo / "refs" / "branch.main" / "ref.json").write_text("{}")
    assert resolve_target(str(tmp_path / "out.json"), None, False) == "references"
    assert resolve_target(tmp_path / "out.json", None, True) == "references"
    assert resolve_target(str(repo), None, False) == "icechunk"
    assert resolve_target(f"file://{repo}", None, False) == "icechunk"
    assert resolve_target(str(tmp_path / "plain"), None, False) == "zarr"
    assert resolve_target(str(tmp_path / "plain"), None, True) == "icechunk"
    assert resolve_target("s3://bucket/out", None, False) == "zarr"
    assert resolve_target({}, None, False) == "zarr"
    assert resolve_target(str(tmp_path / "out.json"), "icechunk", True) == "icechunk"
    (tmp_path / "dir.json").mkdir()
    assert resolve_target(str(tmp_path / "dir.json"), None, False) == "zarr"  # a directory is no reference file


def test_an_icechunk_destination_without_the_module_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sharding_store.stores.icechunk_store", None)
    with pytest.raises(UsageError, match="no Icechunk support") as e:
        open_destination(str(tmp_path / "repo"), "icechunk", True, StoreOptions())
    assert ICECHUNK_HINT in str(e.value)


def test_an_icechunk_destination_without_icechunk_names_the_extra(monkeypatch, tmp_path):
    def open_icechunk(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'icechunk'", name="icechunk")

    fake = types.ModuleType("sharding_store.stores.icechunk_store")
    fake.open_icechunk = open_icechunk
    monkeypatch.setitem(sys.modules, "sharding_store.stores.icechunk_store", fake)
    with pytest.raises(UsageError, match="needs the icechunk package: pip install 'sharding-store\\[icechunk\\]'"):
        open_destination(str(tmp_path / "repo"), "icechunk", False, StoreOptions())


def test_an_icechunk_destination_is_opened_through_the_store_module(monkeypatch, tmp_path):
    seen = {}
    opened = CountingInner({})

    def open_icechunk(dst, storage_options, *, virtual, source, source_options, create):
        seen.update(dst=dst, storage_options=storage_options, virtual=virtual, source=source,
                    source_options=source_options, create=create)
        return opened

    fake = types.ModuleType("sharding_store.stores.icechunk_store")
    fake.open_icechunk = open_icechunk
    monkeypatch.setitem(sys.modules, "sharding_store.stores.icechunk_store", fake)
    src = as_inner(str(tmp_path))
    got = open_destination(tmp_path / "repo", "icechunk", True, StoreOptions(src={"s": 1}, dst={"anon": True}), src)
    assert got is opened
    assert seen == dict(dst=str(tmp_path / "repo"), storage_options={"anon": True}, virtual=True,
                        source=src.location(), source_options={"s": 1}, create=True)
    open_destination(tmp_path / "repo", "icechunk", False, StoreOptions(), src, read_only=True)
    assert seen["create"] is False  # verify creates no repository
    open_destination(tmp_path / "repo", "icechunk", False, StoreOptions(), src, dry_run=True)
    assert seen["create"] is False  # nor does a dry run


def test_a_materialised_icechunk_migration_is_committed_once_as_such(monkeypatch, source, tmp_path):
    dst = CountingInner({})
    fake = types.ModuleType("sharding_store.stores.icechunk_store")
    fake.open_icechunk = lambda *a, **k: dst
    monkeypatch.setitem(sys.modules, "sharding_store.stores.icechunk_store", fake)
    report = migrate(source, tmp_path / "repo", MigrateOptions(target="icechunk", verify=False), progress=False)
    assert report.destination == "Icechunk materialised" and report.to_dict()["destination_kind"] == report.destination
    assert "(destination: Icechunk materialised)" in report.summary().splitlines()[0]
    assert dst.calls["commit"] == 1 and dst.log[-1][0] == "commit"
    assert dst.log[-1][1].startswith("sharding-store ") and str(source) in dst.log[-1][1]
    sets = [key for name, key in dst.log if name == "set"]
    for path in ("imgs/raw", "imgs/zl", "tab/plain", "lone/deep/dots"):  # Icechunk takes an array's chunks after it
        assert sets.index(f"{path}/zarr.json") < min(i for i, k in enumerate(sets) if k.startswith(f"{path}/c"))


# --------------------------------------------------------------------------- the commit hook


def test_a_copy_migration_commits_once_after_its_last_write(source):
    dst = CountingInner({})
    report = migrate(source, dst, progress=False)
    assert report.destination == "copy" and report.to_dict()["destination_kind"] == "copy"
    names = [name for name, _ in dst.log]
    assert names.count("commit") == 1
    assert names.index("commit") > max(i for i, n in enumerate(names) if n in ("set", "delete"))


def test_an_interrupted_migration_is_not_committed(source):
    from sharding_store.testing import fault_hook

    class Cut(BaseException):
        pass

    def hook(phase: str) -> None:
        if phase == "meta":
            raise Cut

    dst = CountingInner({})
    with fault_hook(hook), pytest.raises(Cut):
        migrate(source, dst, progress=False)
    assert dst.calls["commit"] == 0


# --------------------------------------------------------------------------- sources and runs refused


def test_a_source_without_urls_is_refused_before_anything_is_written(source, tmp_path):
    src = dict(tree_bytes(source))
    with pytest.raises(UsageError, match="--virtual needs a source another process can read by URL"):
        migrate(src, tmp_path / "out.json", progress=False)
    assert not (tmp_path / "out.json").exists()


@pytest.fixture
def undecodable(tmp_path):
    """A source whose path is no UTF-8 text (a byte 0xff in a directory's name, as Linux allows)."""
    make_big_array(tmp_path / "src", shards=2)
    os.rename(tmp_path / "src", os.fsdecode(os.fsencode(tmp_path) + b"/sr\xffc"))
    return os.fsdecode(os.fsencode(tmp_path) + b"/sr\xffc")


def test_a_reference_file_of_a_source_path_that_is_no_utf8_text_is_refused_first(undecodable, tmp_path, capsys):
    """A reference file is JSON text naming objects by URL: a source path that is no UTF-8
    text has no such URL; refused before anything is written (exit 2, one line), not an
    encoding error at the commit (exit 10, "run again with --resume", which fails again)."""
    from sharding_store.cli import main

    with pytest.raises(UsageError, match="no UTF-8 text"):
        migrate(undecodable, tmp_path / "out.json", progress=False)
    assert main(["migrate", undecodable, str(tmp_path / "out.json"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no UTF-8 text" in err[0], err
    assert not (tmp_path / "out.json").exists()


def test_a_materialised_icechunk_migration_of_a_source_path_that_is_no_utf8_text(undecodable, tmp_path):
    """Its bytes are copied, its commit message names the source escaped (Icechunk takes text)."""
    pytest.importorskip("icechunk")
    import icechunk as ic

    report = migrate(undecodable, tmp_path / "repo", MigrateOptions(target="icechunk"), progress=False)
    assert report.destination == "Icechunk materialised"
    repo = ic.Repository.open(ic.local_filesystem_storage(str(tmp_path / "repo")))
    message = next(iter(repo.ancestry(branch="main"))).message
    assert "sr\\udcffc" in message and message.isprintable(), message
    np.testing.assert_array_equal(zarr.open_group(repo.readonly_session("main").store, mode="r")["big"][...],
                                  make_big_array(tmp_path / "again", shards=2))


def test_an_executor_is_refused_with_virtual(source, tmp_path):
    with ThreadPoolExecutor(1) as pool, pytest.raises(UsageError, match="references are collected in this process"):
        migrate(source, tmp_path / "out.json", MigrateOptions(virtual=True), run=RunOptions(executor=pool))


# --------------------------------------------------------------------------- the driver: every generation, read back


def _plain(path) -> zarr.Group:
    fs = fsspec.filesystem("reference", fo=str(path), asynchronous=True)
    return zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r")


def _read(group: zarr.Group, path: str) -> np.ndarray:
    return (group if path == "" else group[path])[...]


def _both_readers(out, path: str) -> list[np.ndarray]:
    """The array at ``path`` read by zarr-python 3 through plain fsspec and through the guard."""
    if path == "":
        fs = fsspec.filesystem("reference", fo=str(out), asynchronous=True)
        plain = zarr.open_array(zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r")[...]
        return [plain, zarr.open_array(open_references(str(out)), mode="r")[...]]
    return [_read(_plain(out), path), _read(zarr.open_group(open_references(str(out)), mode="r"), path)]


@pytest.mark.parametrize("store", STORES)
def test_every_2023_array_read_back_from_a_reference_file(tmp_path, store):
    source = draft_2023_source(store)
    before = tree_hash(store)
    report = migrate(str(store), str(tmp_path / "out.json"), progress=False)
    assert report.verification.ok and report.destination == "reference file"
    assert report.totals.bytes_now == 0 and report.totals.written == 0
    for path in source.arrays:
        for got in _both_readers(tmp_path / "out.json", path):
            _same(got, source.expected(path))
    assert tree_hash(store) == before


@fixtures.needs(fixtures.ZARRITA_2021)
def test_every_2021_array_read_back_from_a_reference_file(tmp_path):
    source = zarrita_2021_source()
    report = migrate(str(source.store), str(tmp_path / "out.json"), progress=False)
    assert report.verification.ok
    for path in source.arrays:
        for got in _both_readers(tmp_path / "out.json", path):
            _same(got, source.expected(path))


def test_every_2022_array_read_back_from_a_reference_file(tmp_path):
    """Sharded, unsharded (one reference per chunk object), separator ".", 0-d, ragged."""
    values = make_hierarchy(tmp_path / "src")
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    assert report.verification.ok and report.totals.referenced == report.shards
    for path, want in values.items():
        for got in _both_readers(tmp_path / "out.json", path):
            np.testing.assert_array_equal(got, want)
    refs = json.loads((tmp_path / "out.json").read_bytes())["refs"]
    assert refs["tab/plain/c.0.0"][0] == f"file://{os.path.realpath(tmp_path / 'src/data/root/tab/plain/c0.0')}"


def test_a_shard_with_dead_bytes_is_referred_to_whole(tmp_path):
    data = make_big_array(tmp_path / "src", shards=2)
    dead = add_dead_bytes(tmp_path / "src", "data/root/big/c0/0", (2, 2), (1, 1))
    data[4:8, 8:16] = 0  # the dropped chunk reads as the fill value
    migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    ref = json.loads((tmp_path / "out.json").read_bytes())["refs"]["big/c/0/0"]
    assert ref[1:] == [0, (tmp_path / "src/data/root/big/c0/0").stat().st_size] and dead > 0
    for got in _both_readers(tmp_path / "out.json", "big"):
        np.testing.assert_array_equal(got, data)


def test_a_shard_without_a_live_chunk_gets_no_reference(tmp_path):
    arr = create_draft_array(str(tmp_path / "src"), "a", shape=(4, 4), chunks=(2, 2), chunks_per_shard=(1, 2),
                             dtype="<i4", fill_value=7)
    arr[0:2, :] = 1
    src = as_inner(str(tmp_path / "src"))
    assert list(src.list_prefix("data/root/a/")) == ["data/root/a/c0/0"]
    src.set("data/root/a/c1/0", b"\xff" * 16 * 2)  # a shard whose index has no live chunk
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    refs = json.loads((tmp_path / "out.json").read_bytes())["refs"]
    assert [k for k in refs if k.startswith("a/c/")] == ["a/c/0/0"] and report.totals.empty == 1
    for got in _both_readers(tmp_path / "out.json", "a"):
        np.testing.assert_array_equal(got, np.array([[1] * 4] * 2 + [[7] * 4] * 2))


def test_only_index_tails_are_read_from_the_source(tmp_path):
    make_big_array(tmp_path / "src", shards=8)
    src = CountingInner(str(tmp_path / "src"))
    migrate(src, str(tmp_path / "out.json"), MigrateOptions(verify=False), progress=False)
    tails = [detail for name, detail in src.log if name == "get_ranges"]
    assert src.calls["reference_to"] >= 8 and src.calls["copy_to"] == 0 and src.calls["read_into"] == 0
    index = 4 * 16  # 2x2 chunks per shard, no checksum
    shard_reads = [r for d in tails for r in d if "/c" in r[0]]  # one batched tail read holds them all
    assert len(shard_reads) == 8 and all(r[1] == -index and r[2] is None for r in shard_reads)
    assert len({r[0] for r in shard_reads}) == 8


def test_a_reference_run_is_inline_with_one_tail_read_per_batch(monkeypatch, tmp_path):
    """A reference unit is a tail read and a little work: units run in this thread, a batch
    at a time (no thread pool, no task or future per shard, whatever ``jobs``), each
    batch's index tails read with one ``get_tails``; what they write is what they wrote."""
    from sharding_store.ops.jobs import INLINE_BATCH
    from tests.unit.ops.test_migrate_mapping import Pools

    shards = 2 * INLINE_BATCH + 3
    data = make_big_array(tmp_path / "src", shards=shards)
    src = CountingInner(str(tmp_path / "src"))
    pools = Pools(monkeypatch)
    report = migrate(src, str(tmp_path / "out.json"), MigrateOptions(verify=False), progress=False, jobs=4)
    assert (pools.made, pools.submitted) == (0, 0), "reference units ran on a thread pool"
    assert report.totals.referenced == shards
    tail_reads = [d for name, d in src.log if name == "get_ranges" and any("/c" in k for k, *_ in d)]
    assert sorted(len(d) for d in tail_reads) == [3, INLINE_BATCH, INLINE_BATCH]
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["big"][...],
                                  data)


def test_a_batch_whose_tail_read_fails_runs_its_units_alone(monkeypatch, tmp_path):
    """A failed batched tail read is no failed unit: each unit of the batch reads alone
    (retried as always), and a unit that fails fails alone."""
    from sharding_store.errors import StoreIOError

    make_big_array(tmp_path / "src", shards=6)
    src = CountingInner(str(tmp_path / "src"))
    real = src.get_tails

    def get_tails(requests):
        if len(requests) > 1:
            raise StoreIOError("the batch", key=requests[0][0])
        return real(requests)

    monkeypatch.setattr(src, "get_tails", get_tails)
    report = migrate(src, str(tmp_path / "out.json"), MigrateOptions(verify=True), progress=False)
    assert report.totals.referenced == 6 and report.verification.ok


@pytest.mark.slow
def test_the_reference_file_holds_under_one_percent_of_the_source(tmp_path):
    """Realistic shards (16 of 1 MiB: 64 chunks of 16 KiB each)."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 2**31, (1024, 4096), dtype="<i4")
    create_draft_array(str(tmp_path / "src"), "v", shape=data.shape, chunks=(64, 64), chunks_per_shard=(4, 16),
                       dtype="<i4", compressor=None)[...] = data
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    source_bytes = sum(p.stat().st_size for p in (tmp_path / "src").rglob("*") if p.is_file())
    assert report.shards == 16 and source_bytes > 16 * 2**20
    assert (tmp_path / "out.json").stat().st_size < source_bytes / 100
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["v"][...], data)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kwargs, words", [
    (dict(chunks_per_shard=4), r"--chunks-per-shard with --virtual: regrouping chunks writes new shards.*"
                               r"\(imgs/raw: 2x2 chunks per shard in the source\)"),
    (dict(index_location="start"), r"--index-location start with --virtual: moving the shard index writes new shards"),
])
def test_options_that_need_new_bytes_are_refused_before_anything_is_written(source, tmp_path, kwargs, words):
    with pytest.raises(UsageError, match=words) as e:
        migrate(str(source), str(tmp_path / "out.json"), MigrateOptions(**kwargs), progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "out.json").exists()


def test_the_source_layout_asked_for_explicitly_is_no_refusal(tmp_path):
    data = make_big_array(tmp_path / "src", shards=2)
    migrate(str(tmp_path / "src"), str(tmp_path / "out.json"),
            MigrateOptions(chunks_per_shard=(2, 2), index_location="end", virtual=True), progress=False)
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["big"][...],
                                  data)


# --------------------------------------------------------------------------- damaged sources, as the copy refuses them


def _damaged_index(root) -> str:
    key = "data/root/big/c1/0"
    path = root / key
    blob = bytearray(path.read_bytes())
    blob[-16:-8] = (2**40).to_bytes(8, "little")  # a chunk far past the end of the object
    path.write_bytes(bytes(blob))
    return key


@pytest.mark.parametrize("dst_name", ["copy", "out.json"])
def test_a_damaged_shard_is_refused_as_the_copy_refuses_it(tmp_path, dst_name):
    make_big_array(tmp_path / "src", shards=4)
    other = create_draft_array(str(tmp_path / "src"), "ok", shape=(4,), chunks=(2,), dtype="<u2")
    other[...] = np.arange(4)
    _damaged_index(tmp_path / "src")
    with pytest.raises(ShardCorruptError, match="big") as e:
        migrate(str(tmp_path / "src"), str(tmp_path / dst_name), progress=False)
    assert e.value.exit_code == 4
    report = migrate(str(tmp_path / "src"), str(tmp_path / f"skip-{dst_name}"), skip_damaged=True, progress=False)
    assert [(s["path"], s["error"]) for s in report.skipped_arrays] == [("big", "ShardCorruptError")]
    if dst_name.endswith(".json"):
        refs = json.loads((tmp_path / f"skip-{dst_name}").read_bytes())["refs"]
        assert not any(k.startswith("big/") for k in refs) and "ok/zarr.json" in refs


def test_a_lost_transformer_is_refused_as_the_copy_refuses_it(tmp_path):
    make_big_array(tmp_path / "src", shards=2)
    key = tmp_path / "src" / dm.array_meta_key("big")
    doc = json.loads(key.read_bytes())
    del doc["storage_transformers"]
    key.write_text(json.dumps(doc))
    errors = []
    for dst in ("copy", "out.json"):
        with pytest.raises(ShardingStoreError) as e:
            migrate(str(tmp_path / "src"), str(tmp_path / dst), progress=False)
        errors.append((type(e.value), e.value.exit_code))
    assert errors[0] == errors[1] and not (tmp_path / "out.json").exists()


def test_an_interrupted_reshard_is_refused_as_the_copy_refuses_it(interrupted, tmp_path):
    with pytest.raises(MigrationError, match="interrupted in-place reshard of array .grp/vol."):
        migrate(str(interrupted), str(tmp_path / "out.json"), progress=False)
    assert not (tmp_path / "out.json").exists()


# --------------------------------------------------------------------------- existing files, resume


def test_an_existing_reference_file_is_replaced_only_with_overwrite(source, tmp_path):
    out = tmp_path / "out.json"
    migrate(str(source), str(out), progress=False)
    first = out.read_bytes()
    with pytest.raises(DestinationExistsError, match="--overwrite"):
        migrate(str(source), str(out), progress=False)
    assert out.read_bytes() == first
    report = migrate(str(source), str(out), MigrateOptions(overwrite=True), progress=False)
    assert report.verification.ok and json.loads(out.read_bytes())["refs"].keys() == json.loads(first)["refs"].keys()


def test_an_interrupted_virtual_migration_leaves_nothing_and_resume_starts_over(source, tmp_path):
    from sharding_store.testing import fault_hook

    class Cut(BaseException):
        pass

    def hook(phase: str) -> None:
        if phase == "unit":
            raise Cut

    out = tmp_path / "out.json"
    with fault_hook(hook), pytest.raises(Cut):
        migrate(str(source), str(out), progress=False)
    assert not out.exists()  # nothing is visible before the commit
    report = migrate(str(source), str(out), MigrateOptions(resume=True), progress=False)
    assert report.verification.ok and out.exists()


def test_verify_reads_a_reference_file_and_finds_a_changed_source(source, tmp_path):
    out = tmp_path / "out.json"
    migrate(str(source), str(out), progress=False)
    assert verify(str(source), str(out)).ok
    shard = source / "data/root/imgs/raw/c0/0"
    shard.write_bytes(shard.read_bytes())  # the same bytes, written again: the source still reads right
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(SourceChangedError, match=f"file://{shard}: modified since"):
        verify(str(source), str(out))


# --------------------------------------------------------------------------- the CLI


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from sharding_store.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_migrates_into_a_reference_file_and_says_so(source, tmp_path, capsys):
    code, out, _ = _cli(capsys, "migrate", str(source), str(tmp_path / "out.json"), "--no-progress")
    assert code == 0 and "(destination: reference file)" in out and "referenced: 30 objects" in out
    code, out, _ = _cli(capsys, "migrate", str(source), str(tmp_path / "again"), "--virtual=references", "--json",
                        "--no-progress")
    assert code == 0 and json.loads(out)["destination_kind"] == "reference file"  # named without .json: asked for
    assert json.loads((tmp_path / "again").read_bytes())["version"] == 1


@pytest.mark.parametrize("argv, words", [
    (["--virtual", "--chunks-per-shard", "4"], "--chunks-per-shard with --virtual: regrouping chunks writes new shards"),
    (["--portable"], "--portable with --virtual: re-encoding chunks writes new bytes"),
    (["--index-location", "start"], "--index-location start with --virtual: moving the shard index"),
    (["--icechunk", "--virtual=references"], "--icechunk with --virtual=references: one destination kind"),
    (["--virtual=tar"], "'tar': expected icechunk or references"),
    (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler with a virtual migration: references are collected"),
])
def test_cli_refusals_are_one_line_exit_2(source, tmp_path, capsys, argv, words):
    code, out, err = _cli(capsys, "migrate", str(source), str(tmp_path / "out.json"), *argv, "--no-progress")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "out.json").exists()


def test_cli_in_place_takes_no_virtual(source, capsys):
    code, _, err = _cli(capsys, "migrate", str(source), "--in-place", "--virtual")
    assert code == 2 and "--in-place: not with --virtual" in err


def test_cli_verify_of_a_changed_source_exits_14_naming_the_object(source, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert _cli(capsys, "migrate", str(source), str(out), "--no-progress")[0] == 0
    shard = source / "data/root/imgs/zl/c0/0"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    code, _, err = _cli(capsys, "verify", str(source), str(out), "--no-progress")
    assert code == 14 and f"file://{shard}: modified since" in err and len(err.strip().splitlines()) == 1


def test_cli_info_says_what_a_destination_is(source, tmp_path, capsys):
    out = tmp_path / "out.json"
    assert _cli(capsys, "migrate", str(source), str(out), "--no-progress")[0] == 0
    code, text, _ = _cli(capsys, "info", str(out))
    assert code == 0 and text.splitlines() == [
        f"{out}: reference file (Zarr v3, migrated by sharding-store)",
        f"  5 arrays, 5 groups: 30 references to objects of {source}"]
    code, text, _ = _cli(capsys, "info", str(out), "--json")
    assert json.loads(text) == {"schema": "sharding-store/1", "command": "info", "ok": True,
                                "destination": str(out), "destination_kind": "reference file", "virtual": True,
                                "source": str(source), "arrays": 5, "groups": 5, "objects": 30, "lock": None}


@pytest.mark.parametrize("spelling", ["path", "file-url"])
def test_cli_info_says_what_a_copy_is(source, tmp_path, capsys, spelling):
    """A copy migration's destination is named a copy (it was refused as 'already Zarr v3',
    exit 7); a final v3 store we did not write still is."""
    out = tmp_path / "copy"
    assert _cli(capsys, "migrate", str(source), str(out), "--no-progress")[0] == 0
    name = str(out) if spelling == "path" else f"file://{out}"
    code, text, _ = _cli(capsys, "info", name, "--json")
    doc = json.loads(text)
    assert code == 0 and doc["destination_kind"] == "copy" and doc["virtual"] is False
    assert doc["source"] == str(source) and doc["objects"] == sum(
        1 for p in out.rglob("*") if p.is_file() and p.name != "zarr.json" and not p.name.startswith(".sharding-store"))
    code, text, _ = _cli(capsys, "info", name)
    assert code == 0 and text.splitlines()[0] == f"{name}: copy (Zarr v3, migrated by sharding-store)"
    (out / ".sharding-store-record.json").unlink()
    code, _, err = _cli(capsys, "info", name)
    assert code == 7 and "already Zarr v3" in err


def test_cli_info_prints_a_destination_or_store_name_with_a_line_break_escaped(tmp_path, capsys):
    """The first line names DST (or the draft store) escaped: a line break in its name
    cannot forge a line of ``info``'s output."""
    source = tmp_path / "a\nforged: copy" / "src"
    make_hierarchy(source)
    out = source.parent / "out.json"
    assert _cli(capsys, "migrate", str(source), str(out), "--no-progress")[0] == 0
    for name, kind in ((out, "reference file (Zarr v3"), (source, "draft-era Zarr v3")):
        code, text, _ = _cli(capsys, "info", str(name))
        assert code == 0 and text.splitlines()[0].startswith(json.dumps(str(name)) + ": " + kind), text
        assert not any(line.startswith("forged") for line in text.splitlines()), text


@pytest.mark.parametrize("record", [b"garbage", b"[1]", b'{"src": 5}', b'{"src": "x\\nforged line\\u001b[2J"}'],
                         ids=["not-json", "a-list", "src-not-a-string", "src-with-a-line-break"])
def test_cli_info_of_a_copy_with_a_damaged_record_or_document(source, tmp_path, capsys, record):
    """A record or a ``zarr.json`` that is not a JSON object (or a source that is no string,
    or one that would forge a line) is no internal error (exit 70, before) and is never
    printed raw: the copy's source is unrecorded, or escaped; a damaged document counts as
    neither an array nor a group."""
    out = tmp_path / "copy"
    assert _cli(capsys, "migrate", str(source), str(out), "--no-progress")[0] == 0
    (out / ".sharding-store-record.json").write_bytes(record)
    (out / "zarr.json").write_bytes(b"nonsense")
    code, text, err = _cli(capsys, "info", str(out))
    assert code == 0 and err == "" and len(text.splitlines()) == 2, (text, err)
    assert text.splitlines()[0] == f"{out}: copy (Zarr v3, migrated by sharding-store)"
    forged = record.startswith(b'{"src": "x')
    assert text.splitlines()[1].endswith('"x\\nforged line\\u001b[2J"' if forged else "an unrecorded source"), text
    code, text, _ = _cli(capsys, "info", str(out), "--json")
    doc = json.loads(text)
    assert code == 0 and doc["source"] == ("x\nforged line\u001b[2J" if forged else None)
    assert doc["groups"] == 4 and doc["destination_kind"] == "copy"  # the root's zarr.json damaged: 5 - 1


@pytest.mark.parametrize("virtual", [True, False])
def test_cli_info_says_what_an_icechunk_repository_is(tmp_path, capsys, virtual):
    pytest.importorskip("icechunk")
    make_big_array(tmp_path / "src", shards=3)
    repo = tmp_path / "repo"
    argv = ["--virtual=icechunk"] if virtual else ["--icechunk"]
    assert _cli(capsys, "migrate", str(tmp_path / "src"), str(repo), *argv, "--no-progress")[0] == 0
    code, text, _ = _cli(capsys, "info", str(repo), "--json")
    assert code == 0 and json.loads(text) == {
        "schema": "sharding-store/1", "command": "info", "ok": True,
        "destination": str(repo), "destination_kind": "Icechunk virtual" if virtual else "Icechunk materialised",
        "virtual": virtual, "source": str(tmp_path / "src"), "arrays": 1, "groups": 1, "objects": 3, "lock": None}


# --------------------------------------------------------------------------- a shard whose index is at its start


@pytest.mark.parametrize("checksum", [False, True])
def test_a_shard_with_its_index_at_the_start_is_referred_to_after_reading_only_that(tmp_path, checksum):
    """The source layout keeps its index where it is: a start index is read from the head
    (the tail read only learns size and version), checked, and the whole object referred to."""
    from dataclasses import replace

    from sharding_store.api.hierarchy import open_hierarchy
    from sharding_store.formats.shard_index import encode_shard
    from sharding_store.ops.jobs import Source, StoreRef
    from sharding_store.ops.units import Options, Unit, _refer_shard, plan_array
    from sharding_store.stores.references import ReferenceFileSink

    make_big_array(tmp_path / "src", shards=1)
    src = CountingInner(str(tmp_path / "src"))
    node = next(iter(open_hierarchy(str(tmp_path / "src")).arrays()))
    plan, _ = plan_array(node, StoreRef.of(src), StoreRef(None), Options(index_checksum=False))
    job = replace(plan.job, index_location="start", checksum=checksum,
                  src_layout=replace(plan.job.src_layout, index_location="start", index_checksum=checksum))
    blob = encode_shard({(0, 0): b"abcd", (1, 1): b"efghij"}, (2, 2), checksum=checksum, index_location="start")
    src.inner.set("data/root/big/c7/0", blob)
    sink = ReferenceFileSink(str(tmp_path / "out.json"))
    src.reset()
    result = _refer_shard(job, Unit((Source((7, 0), "data/root/big/c7/0", len(blob)),), (7, 0)), src, sink)
    assert result.referenced == 1 and result.chunks == 2
    ref = sink.reference("big/c/7/0")
    assert (ref.offset, ref.length, ref.object_size) == (0, len(blob), len(blob))
    assert src.bytes_read == job.src_index_nbytes  # the index only
    src.inner.set("data/root/big/c8/0", blob[:-3])  # its last chunk now reaches past the end
    with pytest.raises(ShardCorruptError):
        _refer_shard(job, Unit((Source((8, 0), "data/root/big/c8/0", len(blob) - 3),), (8, 0)), src, sink)
