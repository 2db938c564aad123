"""Virtual migration (issue 24): options, what DST is, how it is opened and finished.

The driver branch and the reference file: further below and in
``tests/unit/stores/test_references.py``.
"""

from __future__ import annotations

import sys
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from sharding_store import MigrateOptions, UsageError
from sharding_store.ops.migration import ICECHUNK_HINT, migrate, open_destination, resolve_target
from sharding_store.ops.options import RunOptions, StoreOptions
from sharding_store.testing import CountingInner
from tests.draft_factory import make_hierarchy, tree_bytes

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

    def open_icechunk(dst, storage_options, *, virtual, message):
        seen.update(dst=dst, storage_options=storage_options, virtual=virtual, message=message)
        return opened

    fake = types.ModuleType("sharding_store.stores.icechunk_store")
    fake.open_icechunk = open_icechunk
    monkeypatch.setitem(sys.modules, "sharding_store.stores.icechunk_store", fake)
    got = open_destination(tmp_path / "repo", "icechunk", True, StoreOptions(dst={"anon": True}), "msg")
    assert got is opened
    assert seen == dict(dst=str(tmp_path / "repo"), storage_options={"anon": True}, virtual=True, message="msg")


def test_a_materialised_icechunk_migration_is_committed_once_as_such(monkeypatch, source, tmp_path):
    dst = CountingInner({})
    fake = types.ModuleType("sharding_store.stores.icechunk_store")
    fake.open_icechunk = lambda *a, **k: dst
    monkeypatch.setitem(sys.modules, "sharding_store.stores.icechunk_store", fake)
    report = migrate(source, tmp_path / "repo", MigrateOptions(target="icechunk", verify=False), progress=False)
    assert report.destination == "Icechunk materialised" and report.to_dict()["destination"] == report.destination
    assert "(destination: Icechunk materialised)" in report.summary().splitlines()[0]
    assert dst.calls["commit"] == 1 and dst.log[-1][0] == "commit"
    assert dst.log[-1][1].startswith("sharding-store ") and str(source) in dst.log[-1][1]


# --------------------------------------------------------------------------- the commit hook


def test_a_copy_migration_commits_once_after_its_last_write(source):
    dst = CountingInner({})
    report = migrate(source, dst, progress=False)
    assert report.destination == "copy" and report.to_dict()["destination"] == "copy"
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


def test_an_executor_is_refused_with_virtual(source, tmp_path):
    with ThreadPoolExecutor(1) as pool, pytest.raises(UsageError, match="references are collected in this process"):
        migrate(source, tmp_path / "out.json", MigrateOptions(virtual=True), run=RunOptions(executor=pool))
