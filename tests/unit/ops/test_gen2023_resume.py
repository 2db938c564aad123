"""``migrate SRC DST --resume`` for a 2023-generation store (copy mode): a migration killed
with SIGKILL part-way is finished, keeping what the killed run copied; the source is never
written; other options, another source, or a destination with nothing to resume are refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sharding_store.cli import main
from sharding_store.ops.migration import MARKER_KEY
from tests.draft_factory import tree_hash
from tests.integration.test_gen2023_inplace_kill import expected, make_store
from tests.unit.ops.test_gen2023_migrate import _array_paths, _read_ts, _read_zarr, _same

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: processes killed mid-run
REPO = str(Path(__file__).resolve().parents[3])
CLI = [sys.executable, "-m", "sharding_store.cli"]


def _kill_at(args: list[str], at: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "tests.run_with_fault", "--kill-at", at, "--", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)


@pytest.mark.parametrize("at", [1, 20, 40])  # of 45 units (92 objects: a unit per shard, or per batch of chunks)
def test_a_killed_copy_migration_is_resumed(tmp_path, at):
    src, dst = make_store(tmp_path / "src"), tmp_path / "dst"
    before = tree_hash(src)
    _kill_at(["migrate", str(src), str(dst), "--jobs", "1"], f"unit:{at}")
    assert (dst / MARKER_KEY).exists() and not (dst / "zarr.json").exists()
    again = subprocess.run([*CLI, "migrate", str(src), str(dst)], capture_output=True, text=True)
    assert again.returncode == 8 and "--resume" in again.stderr  # not empty: refused without --resume
    other = subprocess.run([*CLI, "migrate", str(src), str(dst), "--resume", "--no-index-checksum"],
                           capture_output=True, text=True)
    assert other.returncode == 2 and "index_checksum" in other.stderr, other.stderr
    done = subprocess.run([*CLI, "migrate", str(src), str(dst), "--resume", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # the killed run's worker may have finished a few more objects than the main thread
    # counted (copies are atomic: whole or absent); the rest are copied now
    assert at <= report["skipped"]["objects"] <= 92
    assert report["skipped"]["objects"] + report["objects_written"] + report["objects_copied"] == 92 and report["verified"]["ok"]
    assert not (dst / MARKER_KEY).exists() and tree_hash(src) == before
    for path in _array_paths(src):
        _same(_read_zarr(dst, path), expected(path))
    _same(_read_ts(dst, "june/a"), expected("june/a"))


def test_nothing_to_resume_and_another_source_are_refused(tmp_path, capsys):
    src, dst = make_store(tmp_path / "src"), tmp_path / "dst"
    assert main(["migrate", str(src), str(dst), "--resume"]) == 0  # an empty destination: a fresh start
    capsys.readouterr()
    # a finished destination, same source and options: nothing left to do, everything verified again
    assert main(["migrate", str(src), str(dst), "--resume", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["objects_written"] + again["objects_copied"] == 0 and again["skipped"]["objects"] == 92 and again["verified"]["ok"]
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.md").write_text("mine")
    assert main(["migrate", str(src), str(stranger), "--resume"]) == 2  # not one of ours
    assert "nothing to resume" in capsys.readouterr().err and (stranger / "notes.md").read_text() == "mine"
    other = make_store(tmp_path / "other")
    _kill_at(["migrate", str(src), str(tmp_path / "dst2"), "--jobs", "1"], "unit:5")
    assert main(["migrate", str(other), str(tmp_path / "dst2"), "--resume"]) == 2
    assert "another source" in capsys.readouterr().err
