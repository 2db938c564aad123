"""Two migrations into one destination: exactly one claims it (issue 12 item 4).

Both used to pass the emptiness check and write into the same directory, so the
published array could mix one run's ``zarr.json`` with the other's shards. The marker
is now created exclusively before anything else is written (``create_exclusive``:
``link()`` of a complete temporary file locally); the loser refuses with exit 8 and
writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sharding_store import DestinationExistsError, migrate, verify
from tests.draft_factory import make_two_sources, read_v3, tree_hash

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: racing processes
CLI = [sys.executable, "-m", "sharding_store.cli"]
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two sources of the same layout and different values (the mix would read wrong values)."""
    root = tmp_path_factory.mktemp("claim")
    return make_two_sources(root)


def check_winner(out, sources, winner: str) -> None:
    src, values = sources[winner]
    assert verify(src, out, progress=False).ok
    for path, expected in values.items():
        assert np.array_equal(read_v3(out, path), expected), path


def race(sources, out, rendezvous=None) -> dict[str, tuple[int, str]]:
    """Both sources migrated into ``out`` by two CLI processes started together; with
    ``rendezvous`` (a directory) each waits at its ``lock`` fault point until the other is
    there too (``python -m tests.run_with_fault --rendezvous``): both have then checked their
    source and planned, and they race for the destination's lock."""
    procs = {}
    for name, (src, _) in sources.items():
        args = ["migrate", str(src), str(out), "--no-verify", "--jobs", "1"]
        cmd = [*CLI, *args] if rendezvous is None else [
            sys.executable, "-m", "tests.run_with_fault", "--rendezvous", "lock", str(rendezvous), "2", "--", *args]
        procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return {name: (p.wait(timeout=300), p.stderr.read()) for name, p in procs.items()}  # type: ignore[union-attr]


@pytest.mark.parametrize("meet", [False, True], ids=["started-together", "met-at-the-claim"])
def test_two_processes_never_both_succeed(sources, tmp_path, meet):
    before = {name: tree_hash(src) for name, (src, _) in sources.items()}
    for round_ in range(1 if meet else 2):
        out = tmp_path / f"out{round_}"
        results = race(sources, out, tmp_path / f"meet{round_}" if meet else None)
        codes = sorted(code for code, _ in results.values())
        assert codes == [0, DestinationExistsError.exit_code], results
        winner = next(name for name, (code, _) in results.items() if code == 0)
        loser_err = next(err for code, err in results.values() if code != 0)
        assert len(loser_err.strip().splitlines()) == 1, loser_err
        if meet:
            assert "another migration or reshard is writing into this destination" in loser_err
            assert "held by a migrate run (pid" in loser_err and "still running" in loser_err
        check_winner(out, sources, winner)
    assert {name: tree_hash(src) for name, (src, _) in sources.items()} == before


def test_two_threads_started_together_never_both_succeed(sources, tmp_path):
    out = tmp_path / "out"
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def run(name: str) -> None:
        src, _ = sources[name]
        barrier.wait()
        try:
            outcome[name] = migrate(src, out, verify=False, progress=False, jobs=1)
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            outcome[name] = e

    threads = [threading.Thread(target=run, args=(name,)) for name in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    failed = {n: e for n, e in outcome.items() if isinstance(e, Exception)}
    assert len(outcome) == 2 and len(failed) == 1, outcome
    (error,) = failed.values()
    assert isinstance(error, DestinationExistsError), repr(error)
    (winner,) = set(outcome) - set(failed)
    check_winner(out, sources, winner)


class Racing(dict):
    """A destination where another migration claims the store right after this run found
    it empty: its first listing of the root is empty, then the other run's marker exists."""

    marker = ".sharding-store-migration.json"

    def __init__(self) -> None:
        super().__init__()
        self.listed = False

    def list_prefix(self, prefix: str) -> list[str]:
        if prefix == "" and not self.listed:
            self.listed = True
            self[self.marker] = b'{"migration": "sharding-store", "src": "the other run"}'
            return []
        return [k for k in list(self) if k.startswith(prefix)]


def test_a_marker_appearing_after_the_emptiness_check_is_refused(sources):
    """The exact race, made deterministic: the other run's marker appears between this
    run's emptiness check and its claim; this run must write nothing."""
    src, _ = sources["one"]
    dst = Racing()
    with pytest.raises(DestinationExistsError, match="another migration"):
        migrate(src, dst, verify=False, progress=False)
    assert dst.listed and list(dst) == [Racing.marker]
    assert b"the other run" in dst[Racing.marker]
