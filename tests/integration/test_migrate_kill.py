"""A migration killed with SIGKILL part-way leaves no array that reads wrong values; ``--resume`` finishes it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from sharding_store.ops.migration import MARKER_KEY
from tests.draft_factory import make_big_array, make_hierarchy, read_v3, tree_hash

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: processes killed mid-run
CLI = [sys.executable, "-m", "sharding_store.cli"]
REPO = str(Path(__file__).resolve().parents[2])


def start_paused(args: list[str], after: int) -> subprocess.Popen:
    """Run the CLI until it has completed ``after`` work units (then it sleeps, waiting to be
    killed): ``python -m tests.run_with_fault --pause-after`` (``sharding_store.testing.pause_after``)."""
    runner = [sys.executable, "-m", "tests.run_with_fault", "--pause-after", str(after), "--"]
    proc = subprocess.Popen([*runner, *args], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        if "test pause after" in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    pytest.fail(f"the migration did not reach the pause point: {proc.wait()}")


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def readable_arrays_are_right(out: Path, values: dict[str, np.ndarray]) -> list[str]:
    """Every array the killed run published reads exactly its values; returns their paths."""
    published = []
    for path, expected in values.items():
        if (out / path / "zarr.json").exists():
            assert np.array_equal(read_v3(out, path), expected), path
            published.append(path)
    return published


@pytest.mark.parametrize("extra", [[], ["--no-index-checksum"]], ids=["checksum", "copy"])
def test_kill_mid_migration_then_resume(tmp_path, extra):
    src, out = tmp_path / "src", tmp_path / "out"
    values = make_hierarchy(src)
    values["big"] = make_big_array(src, shards=24)
    before = tree_hash(src)

    proc = start_paused(["migrate", str(src), str(out), "--jobs", "1", *extra], after=12)
    kill(proc)
    assert not (out / "zarr.json").exists(), "the root document must be written last"
    assert (out / MARKER_KEY).exists()
    published = readable_arrays_are_right(out, values)
    assert "big" not in published  # 24 shards: not all done after 12 units
    assert len(list((out / "big").rglob("c/*/*"))) >= 1  # but some of its shards are

    # a resumed run with other options is refused; with the same ones it finishes
    refused = subprocess.run([*CLI, "migrate", str(src), str(out), "--resume", "--index-location", "start", *extra],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "other options" in refused.stderr
    done = subprocess.run([*CLI, "migrate", str(src), str(out), "--resume", "--json", *extra], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["skipped"]["objects"] >= 12 and report["verified"]["ok"]
    assert subprocess.run([*CLI, "verify", str(src), str(out)], capture_output=True).returncode == 0
    assert readable_arrays_are_right(out, values) == list(values)
    assert zarr.open_group(str(out), mode="r").attrs["title"] == "root"
    assert not list(out.rglob(f"*{'.sharding-store-tmp-'}*")) and not (out / MARKER_KEY).exists()
    assert tree_hash(src) == before
