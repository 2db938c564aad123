"""Two CLI processes writing into one destination: DST's lock lets one write, the other exits 8.

``--overwrite`` used to empty DST before claiming it, so a second run (``--overwrite``, plain
or ``--resume``) removed the first one's marker and shards while it wrote, both wrote into
DST, and both could report success over a mix of two sources. Here the runs are real
processes: met at their ``lock`` fault point (``python -m tests.run_with_fault
--rendezvous``), or the second started while the first is mid-copy (``--slow``); a run
killed with SIGKILL leaves its lock behind, and the next run takes it over (its holder is
provably dead on this host).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sharding_store import DestinationExistsError, create_draft_array, migrate, verify
from sharding_store.ops.destination import LOCK_KEY, MARKER_KEY
from sharding_store.testing import SLOW_LINE
from tests.draft_factory import make_two_sources, read_v3, tree_bytes, tree_hash

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: racing processes
REPO = str(Path(__file__).resolve().parents[2])
FAULT = [sys.executable, "-m", "tests.run_with_fault"]
EXIT = DestinationExistsError.exit_code


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two sources of one layout and different values (a mix of them reads wrong values)."""
    root = tmp_path_factory.mktemp("lock")
    return make_two_sources(root, shards=8)


def check_winner(dst: Path, sources, winner: str) -> None:
    src, values = sources[winner]
    assert verify(src, dst, progress=False).ok
    for path, expected in values.items():
        assert np.array_equal(read_v3(dst, path), expected), path
    assert not (dst / LOCK_KEY).exists() and not (dst / MARKER_KEY).exists()


def start(hook: list[str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([*FAULT, *hook, "--", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    return proc.wait(timeout=300), proc.stderr.read()  # type: ignore[union-attr]


def kill_at(spec: str, *args: str) -> None:
    """A run SIGKILLed at its fault point ``spec`` (its lock stays behind)."""
    proc = subprocess.run([*FAULT, "--kill-at", spec, "--", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr


def only_one_wins(results: dict[str, tuple[int, str]], action: str = "migrate") -> str:
    """The name of the one run that succeeded; the other exited 8, one line naming the holder."""
    assert sorted(code for code, _ in results.values()) == [0, EXIT], results
    loser_err = next(err for code, err in results.values() if code)
    assert len(loser_err.strip().splitlines()) == 1, loser_err
    assert "another migration or reshard is writing into this destination" in loser_err, loser_err
    assert f"held by a {action} run (pid" in loser_err and "still running" in loser_err, loser_err
    return next(name for name, (code, _) in results.items() if code == 0)


@pytest.mark.parametrize("first", ["--overwrite", "plain", "--resume"])
def test_two_migrations_met_at_the_lock(sources, tmp_path, first):
    """``first`` (of source one) against ``--overwrite`` (of source two), started together and
    met where each takes DST's lock: one writes, the other exits 8 having changed nothing."""
    dst = tmp_path / "dst"
    if first == "--overwrite":
        migrate(sources["two"][0], dst, verify=False, progress=False)
    if first == "--resume":  # an interrupted migration of source one, its lock left by the killed run
        kill_at("unit:3", "migrate", str(sources["one"][0]), str(dst), "--jobs", "1")
        assert (dst / LOCK_KEY).exists() and (dst / MARKER_KEY).exists()
    before = {name: tree_hash(src) for name, (src, _) in sources.items()}
    meet = ["--rendezvous", "lock", str(tmp_path / "meet"), "2"]
    procs = {
        "one": start(meet, "migrate", str(sources["one"][0]), str(dst), "--no-verify", "--jobs", "1",
                     *([] if first == "plain" else [first])),
        "two": start(meet, "migrate", str(sources["two"][0]), f"file://{dst}", "--no-verify", "--jobs", "1",
                     "--overwrite"),
    }
    winner = only_one_wins({name: finish(p) for name, p in procs.items()})
    check_winner(dst, sources, winner)
    assert {name: tree_hash(src) for name, (src, _) in sources.items()} == before


@pytest.mark.parametrize("second", ["--overwrite", "--resume"])
def test_a_second_run_while_the_first_writes(sources, tmp_path, second):
    """The second run starts while the first (``--overwrite``, each unit slowed) is mid-copy:
    it exits 8 at once; the first finishes and DST is its copy (it used to be emptied under
    the first run, or continued by both)."""
    dst = tmp_path / "dst"
    migrate(sources["two"][0], dst, verify=False, progress=False)
    first = start(["--slow", "0.2"], "migrate", str(sources["one"][0]), str(dst), "--no-verify", "--jobs", "2",
                  "--overwrite")
    for line in first.stderr:  # type: ignore[union-attr]  (warnings come first)
        if SLOW_LINE in line:
            break
    else:
        pytest.fail(f"the first run never started a unit: exit {first.wait()}")
    src = sources["one" if second == "--resume" else "two"][0]
    other = subprocess.run([sys.executable, "-m", "sharding_store.cli", "migrate", str(src), str(dst), "--no-verify",
                            second], cwd=REPO, capture_output=True, text=True, timeout=300)
    code, err = finish(first)
    assert code == 0, err
    assert other.returncode == EXIT and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "held by a migrate run" in other.stderr and "still running" in other.stderr
    check_winner(dst, sources, "one")


def reshard_sources(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "one", tmp_path / "two"
    for root, path, scale in ((one, "a", 1), (two, "b", 5)):
        arr = create_draft_array(str(root), path, shape=(16, 12), chunks=(2, 3), dtype="<i4", chunks_per_shard=(2, 2))
        arr[...] = np.arange(192, dtype="<i4").reshape(16, 12) * scale
    return one, two


def test_two_overwrite_reshards_met_at_the_lock(tmp_path):
    one, two = reshard_sources(tmp_path)
    dst = tmp_path / "dst"
    subprocess.run([sys.executable, "-m", "sharding_store.cli", "reshard", str(two), str(dst), "--chunks-per-shard",
                    "1"], cwd=REPO, check=True, capture_output=True, timeout=300)
    meet = ["--rendezvous", "lock", str(tmp_path / "meet"), "2"]
    procs = {src: start(meet, "reshard", str(src), str(dst), "--chunks-per-shard", "1", "--overwrite")
             for src in (one, two)}
    winner = only_one_wins({str(src): finish(p) for src, p in procs.items()}, "reshard")
    alone = tmp_path / "alone"
    subprocess.run([sys.executable, "-m", "sharding_store.cli", "reshard", winner, str(alone), "--chunks-per-shard",
                    "1"], cwd=REPO, check=True, capture_output=True, timeout=300)
    assert tree_bytes(dst) == tree_bytes(alone)


@pytest.mark.parametrize("command", ["migrate", "reshard"])
def test_a_killed_holder_does_not_block_the_next_run(sources, tmp_path, command):
    """SIGKILL at the claim (the lock taken, DST emptied, nothing written): the lock stays,
    naming a process that no longer exists; the next ``--overwrite`` takes it over."""
    dst = tmp_path / "dst"
    migrate(sources["two"][0], dst, verify=False, progress=False)
    args = [command, str(sources["one"][0]), str(dst), "--overwrite",
            *(["--chunks-per-shard", "2"] if command == "reshard" else ["--no-verify"])]
    if command == "reshard":  # a draft source for reshard: source one as it is
        args[1] = str(sources["one"][0])
    kill_at("claim:1", *args)
    holder = json.loads((dst / LOCK_KEY).read_bytes())["owner"]
    assert holder["action"] == command
    done = subprocess.run([sys.executable, "-m", "sharding_store.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not (dst / LOCK_KEY).exists() and not (dst / MARKER_KEY).exists()
    if command == "migrate":
        check_winner(dst, sources, "one")


@pytest.mark.parametrize("dst_name", ["dst", "refs.json"])
def test_info_reports_the_lock_a_killed_run_left(sources, tmp_path, dst_name):
    """A run SIGKILLed mid-copy leaves its lock (beside a reference file not yet written):
    ``info DST`` names it, its holder (pid, host, start), "no longer running" and that the
    next run takes it over; the next run does."""
    import socket

    dst = tmp_path / dst_name
    args = ["migrate", str(sources["one"][0]), str(dst), "--no-verify", "--jobs", "1"]
    kill_at("unit:2", *args)
    lock = dst / LOCK_KEY if dst_name == "dst" else tmp_path / (dst_name + LOCK_KEY)
    holder = json.loads(lock.read_bytes())["owner"]
    info = subprocess.run([sys.executable, "-m", "sharding_store.cli", "info", str(dst)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert f"lock: {lock} held by a migrate run (pid {holder['pid']} on host {socket.gethostname()}, since " \
        in info.stdout, info.stdout
    assert "no longer running" in info.stdout and "takes the lock over" in info.stdout
    done = subprocess.run([sys.executable, "-m", "sharding_store.cli", *args, *(["--resume"] if dst_name == "dst"
                                                                                 else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not lock.exists()
