"""Interruptions at seeded random points: SIGKILL of ``migrate`` and in-place ``reshard``
subprocesses, then ``--resume``; and a destination store that fails a fraction of calls.

The CLI runs under ``python -m tests.run_with_fault --kill-at PHASE:N`` (the hook
``sharding_store.testing.kill_at``; the package itself never kills itself): the
process SIGKILLs itself at the N-th fault point of a phase (migrate: ``unit`` after
each completed work unit, ``meta`` after each metadata write; reshard: ``stage``,
``hide``, ``clear``, ``move``, ``commit`` after each object operation), while other
worker threads may be mid-write. Deterministic per seed up to thread scheduling.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sharding_store import create_draft_array, migrate, verify
from sharding_store.errors import MigrationError
from sharding_store.ops.migration import MARKER_KEY
from sharding_store.stores import as_inner
from tests.draft_factory import make_big_array, make_hierarchy, tree_hash
from tests.integration.test_migrate_kill import readable_arrays_are_right
from tests.unit.engine.test_store_faults import FlakyInner
from tests.unit.ops.test_reshard import assert_same_values, chunk_view, layouts, values

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: processes killed mid-run
CLI = [sys.executable, "-m", "sharding_store.cli"]
REPO = str(Path(__file__).resolve().parents[2])
SEEDS = [0, 1, 2, 3]


def run_killed(args: list[str], kill_at: str) -> None:
    """Run the CLI with the kill hook armed; it must die by SIGKILL."""
    runner = [sys.executable, "-m", "tests.run_with_fault", "--kill-at", kill_at, "--"]
    proc = subprocess.run([*runner, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, proc.stderr)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def migrate_source(tmp_path_factory):
    src = tmp_path_factory.mktemp("kill-src") / "src"
    vals = make_hierarchy(src)
    vals["big"] = make_big_array(src, shards=12)
    return src, vals


@pytest.mark.parametrize("seed", SEEDS)
def test_migrate_killed_at_a_random_point_resumes(seed, migrate_source, tmp_path):
    src, vals = migrate_source
    before = tree_hash(src)
    rng = random.Random(seed)
    # 38 work units (12 + 26 target objects), 5 array and 5 group documents
    kill_at = rng.choice([f"unit:{rng.randint(1, 38)}", f"meta:{rng.randint(1, 10)}", str(rng.randint(1, 45))])
    out = tmp_path / "out"
    run_killed(["migrate", str(src), str(out), "--jobs", "2"], kill_at)
    assert (out / MARKER_KEY).exists() and not (out / "zarr.json").exists()
    readable_arrays_are_right(out, vals)  # whatever was published reads right
    done = cli("migrate", str(src), str(out), "--resume", "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert cli("verify", str(src), str(out)).returncode == 0
    assert readable_arrays_are_right(out, vals) == list(vals)
    assert not (out / MARKER_KEY).exists() and tree_hash(src) == before


#: (phase, its fault points in this run): 2 arrays of 20 objects -> 7 shards each
RESHARD_POINTS = [("stage", 14), ("hide", 4), ("clear", 26), ("move", 14), ("commit", 3)]


@pytest.mark.parametrize("seed", SEEDS)
def test_reshard_killed_at_a_random_point_resumes(seed, tmp_path):
    src = tmp_path / "src"
    for i, path in enumerate(("a", "b")):
        create_draft_array(str(src), path, shape=(80,), chunks=(2,), dtype="<i4",
                           chunks_per_shard=(2,))[...] = np.arange(80, dtype="<i4") * (i + 1)
    view, vals = chunk_view(src), values(src)
    rng = random.Random(seed)
    phase, most = rng.choice(RESHARD_POINTS)
    run_killed(["reshard", str(src), "--chunks-per-shard", "6", "--jobs", "2", "--no-progress"],
               f"{phase}:{rng.randint(1, most)}")
    assert cli("reshard", str(src), "--resume", "--no-progress").returncode == 0
    assert cli("reshard", str(src), "--chunks-per-shard", "6", "--no-progress").returncode == 0
    assert layouts(src) == {"a": (6,), "b": (6,)}
    assert chunk_view(src) == view  # every raw payload, byte for byte
    assert_same_values(values(src), vals)
    assert not (src / "__reshard__").exists()


# --------------------------------------------------------------------------- a failing destination


@pytest.mark.parametrize("seed", [0, 1])
def test_migrate_into_a_failing_store_gives_up_then_resumes(seed, migrate_source, tmp_path):
    """A destination failing 15% of get/set/delete (OSError, TimeoutError): retries, and
    when they run out a resumable destination; resumed runs complete and verify."""
    src, vals = migrate_source
    before = tree_hash(src)
    backing: dict[str, bytes] = {}
    flaky = FlakyInner(backing, rate=0.15, seed=seed)
    with pytest.raises(MigrationError, match="--resume"):  # no retries: it gives up on the first failure
        migrate(src, flaky, retries=1, verify=False, progress=False)
    assert "zarr.json" not in backing  # the root document is written last
    for _ in range(20):  # with retries (backoff), resumed runs get through
        try:
            report = migrate(src, flaky, resume=True, retries=4, retry_delay=0.001, verify=False, progress=False)
            break
        except MigrationError as e:
            assert "--resume" in str(e)
    else:
        pytest.fail("the migration never completed")
    assert flaky.failures > 0 and report.totals.objects > 0
    assert verify(src, backing, progress=False).ok
    assert MARKER_KEY not in backing and tree_hash(src) == before
    assert as_inner(backing).get("zarr.json") is not None
