"""Setup and destination errors of the drivers say what is wrong, with the right exit code
(issue 12 items 3, 11 and 12; issue 13 item 5).

* ``migrate SRC a_regular_file``: exit 8, one line, no "--resume" (which would loop);
* a full disk or a permission error: exit 12 naming the cause, not retried, no "--resume";
* ``verify SRC DST`` with DST missing, empty, draft-era or Zarr v2: exit 7 saying so;
* ``verify --json`` with differences: the report (``ok: false``, the differences up to
  ``--max-differences``) on stdout, exit 9;
* a source with an unfinished in-place reshard: migrate and verify refuse (exit 10)
  naming the array and ``reshard --resume``, instead of dropping the hidden array;
* the package never kills or parks itself because of an environment variable.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sharding_store import MigrationError, StoreNotFoundError, create_draft_array, migrate, reshard
from sharding_store.cli import main
from tests.draft_factory import make_hierarchy, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLI = [sys.executable, "-m", "sharding_store.cli"]


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    make_hierarchy(root)
    return root


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------- destinations that cannot be


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_migrate_into_a_regular_file_exits_8_without_resume_advice(src, tmp_path, capsys, extra, where):
    (tmp_path / "file").write_text("not a directory")
    code = main(["migrate", str(src), str(tmp_path / where), *extra])
    line = one_line(capsys.readouterr().err)
    assert code == 8, line
    assert "--resume" not in line and "not a directory" in line and "file is in the way" in line
    assert (tmp_path / "file").read_text() == "not a directory"


class FailingDisk(dict):
    """A destination whose chunk writes fail as a full disk (or a refused permission) does."""

    def __init__(self, error: int) -> None:
        super().__init__()
        self.error = error
        self.attempts: dict[str, int] = {}

    def __setitem__(self, key: str, value: bytes) -> None:
        if "/c" in key:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            raise OSError(self.error, os.strerror(self.error), key)
        super().__setitem__(key, value)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT])
def test_a_full_disk_is_not_retried_and_gets_no_resume_advice(src, code):
    dst = FailingDisk(code)
    with pytest.raises(OSError) as e:
        migrate(src, dst, retry_delay=0.001, progress=False, jobs=1)
    message = str(e.value)
    assert getattr(e.value, "exit_code", 12) == 12  # the CLI's I/O exit code
    assert os.strerror(code) in message and "--resume" not in message
    assert dst.attempts and max(dst.attempts.values()) == 1  # a retry cannot help: not one was made
    assert "zarr.json" not in dst


def test_a_transient_failure_still_advises_resume(src):
    class Resetting(dict):
        def __setitem__(self, key, value):
            if "/c" in key:
                raise ConnectionResetError("reset by peer")
            super().__setitem__(key, value)

    with pytest.raises(MigrationError, match="--resume"):
        migrate(src, Resetting(), retry_delay=0.001, progress=False)


# --------------------------------------------------------------------------- verify: what DST is


def test_verify_a_missing_empty_draft_or_v2_destination_exits_7(src, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / ".zgroup").write_text('{"zarr_format": 2}')
    import shutil

    shutil.copytree(src, tmp_path / "draft")
    cases = {"missing": "missing or empty", "empty": "missing or empty", "draft": "draft-era", "v2": "Zarr v2"}
    for name, said in cases.items():
        assert main(["verify", str(src), str(tmp_path / name)]) == StoreNotFoundError.exit_code, name
        line = one_line(capsys.readouterr().err)
        assert said in line and "difference" not in line, line
    assert not (tmp_path / "missing").exists()


def test_verify_json_prints_the_report_with_the_differences(src, tmp_path, capsys):
    out = tmp_path / "out"
    migrate(src, out, verify=False, progress=False)
    (out / "imgs/raw/c/1/1").unlink()
    (out / "lone/deep/dots/c.1.1").unlink()
    (out / "tab/plain/c.9.0").write_bytes(b"junk")
    assert main(["verify", str(src), str(out), "--json", "--max-differences", "2"]) == 9
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["ok"] is False and report["differences"] == 3
    assert len(report["first"]) == 2 and all(d["key"] and d["problem"] for d in report["first"])
    assert main(["verify", str(src), str(out), "--json"]) == 9
    report = json.loads(capsys.readouterr().out)
    assert {d["key"] for d in report["first"]} == {"imgs/raw/c/1/1", "lone/deep/dots/c.1.1", "tab/plain/c.9.0"}


# --------------------------------------------------------------------------- a hidden array


class Crash(Exception):
    pass


def crash_during_swap(store) -> None:
    """An in-place reshard interrupted in its swap phase: array 'a' is hidden."""

    def hook(phase: str) -> None:
        if phase == "clear":
            raise Crash(phase)

    try:
        from sharding_store.testing import fault_hook
    except ImportError:  # the old code's hook (6befc1a)
        rs = importlib.import_module("sharding_store.ops.resharding")
        rs._FAULT_HOOK = hook
        try:
            with pytest.raises(Crash):
                reshard(store, chunks_per_shard=4, jobs=1, progress=False)
        finally:
            rs._FAULT_HOOK = None
        return
    with fault_hook(hook), pytest.raises(Crash):
        reshard(store, chunks_per_shard=4, jobs=1, progress=False)


def test_migrate_and_verify_refuse_a_source_with_an_interrupted_reshard(tmp_path, capsys):
    store = tmp_path / "src"
    for path in ("a", "b"):
        create_draft_array(str(store), path, shape=(16,), chunks=(2,), dtype="<i4",
                           chunks_per_shard=(2,))[...] = np.arange(16, dtype="<i4")
    out = tmp_path / "out"
    migrate(store, out, progress=False)  # before: both arrays
    crash_during_swap(store)
    before = tree_hash(store)
    for args in (["migrate", str(store), str(tmp_path / "out2")], ["migrate", str(store), str(tmp_path / "dry"), "--dry-run"],
                 ["migrate", str(store), str(out), "--resume"], ["verify", str(store), str(out)]):
        assert main(args) == MigrationError.exit_code, args
        line = one_line(capsys.readouterr().err)
        assert "interrupted in-place reshard" in line and "'a'" in line and "reshard" in line and "--resume" in line
    assert not (tmp_path / "out2").exists() and tree_hash(store) == before


# --------------------------------------------------------------------------- no test hooks in the product


def test_the_old_test_environment_variables_do_nothing(src, tmp_path):
    env = dict(os.environ, SHARDING_STORE_TEST_KILL_AT="1", SHARDING_STORE_TEST_PAUSE_AFTER="1")
    for _i, args in enumerate((["migrate", str(src), str(tmp_path / "out"), "--jobs", "1"],
                              ["reshard", str(src), str(tmp_path / "re"), "--unshard", "--no-progress"])):
        try:
            done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{args[0]} parked itself")
        assert done.returncode == 0, (args, done.returncode, done.stderr)
    package = os.path.dirname(importlib.import_module("sharding_store").__file__)
    for directory, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(directory, name)).read()
                assert "SHARDING_STORE_TEST_" not in text, name
