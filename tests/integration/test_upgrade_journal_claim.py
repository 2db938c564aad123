"""Recovery runs of an in-place upgrade claim its journal: at most one proceeds (issue 25 item 9).

Real processes: a ``--resume`` and an ``--undo`` of one interrupted upgrade (150 arrays)
released together right before each claims the journal (``tests.run_with_fault
--rendezvous claim``): exactly one exits 0 and its report is true (every document upgraded,
or the store byte for byte as before), the other exits 10 naming the run that holds the
journal, and the journal is never deleted while documents are mixed. Also unsynchronised
runs (bounded attempts), a live holder (a paused process), a holder killed with SIGKILL (its
claim taken over: the pid is dead), and a holder on another host (exit 10 until
``--take-over``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sharding_store.formats.upgrade_journal import UPGRADE_JOURNAL_KEY, UpgradeJournal
from tests.draft_factory import tree_hash
from tests.gen2023_writer import write_2023, write_group

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: racing processes
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-m", "sharding_store.cli"]
FAULT = [sys.executable, "-m", "tests.run_with_fault"]
N_ARRAYS = 150


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A store before the upgrade (its tree hash) and the same store with an upgrade
    killed (SIGKILL) after 60 of its 151 documents."""
    base = tmp_path_factory.mktemp("claim")
    src = base / "before"
    write_group(src, "", {"title": "claim"})
    for i in range(N_ARRAYS):
        write_2023(src, f"a{i:03d}", np.arange(4, dtype="u2") + i, chunks=(2,), cps=(2,), index="hidden")
    before = tree_hash(src)
    killed = base / "killed"
    shutil.copytree(src, killed)
    proc = subprocess.run([*FAULT, "--kill-at", "upgrade:61", "--", "migrate", str(killed), "--in-place"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (killed / UPGRADE_JOURNAL_KEY).exists()
    return {"before": before, "killed": killed}


def _fresh(interrupted, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(interrupted["killed"], dst)
    return dst


def _upgraded(src: Path) -> bool:
    docs = [json.loads(p.read_bytes()) for p in sorted(src.glob("a*/zarr.json"))]
    return len(docs) == N_ARRAYS and all(d["codecs"][0]["name"] == "sharding_indexed" and
                                         d["codecs"][0]["configuration"]["codecs"][0]["name"] == "bytes"
                                         for d in docs)


def _check_outcome(src: Path, before: str, resume: subprocess.CompletedProcess,
                   undo: subprocess.CompletedProcess) -> str:
    """At most one run proceeded, the other was refused naming the holder or the journal's
    change (or found nothing left to do), and the store is what the successful one reported."""
    codes = sorted((resume.returncode, undo.returncode))
    assert codes in ([0, 2], [0, 10]), (resume.stderr, undo.stderr)
    winner, loser = (resume, undo) if resume.returncode == 0 else (undo, resume)
    if loser.returncode == 10:
        # refused naming the holder, or (the winner finished and removed the journal between
        # the loser's conditional write and its re-read) saying the journal changed under it
        named = "held by" in loser.stderr and "pid" in loser.stderr
        assert named or "changed or removed the journal while this one claimed it" in loser.stderr, loser.stderr
        assert "nothing was changed by this run" in loser.stderr, loser.stderr
    else:
        assert "nothing to" in loser.stderr
    assert not (src / UPGRADE_JOURNAL_KEY).exists()
    if winner is undo:
        assert "undone" in undo.stdout and tree_hash(src) == before
        return "undo"
    assert "resumed and completed" in resume.stdout and _upgraded(src)
    return "resume"


def test_resume_and_undo_released_together_only_one_proceeds(interrupted, tmp_path):
    outcomes = set()
    for trial in range(3):
        src = _fresh(interrupted, tmp_path, f"t{trial}")
        meet = tmp_path / f"meet{trial}"
        procs = [subprocess.Popen([*FAULT, "--rendezvous", "claim", str(meet), "2", "--", "migrate", str(src),
                                   "--in-place", flag], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for flag in ("--resume", "--undo")]
        done = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        outcomes.add(_check_outcome(src, interrupted["before"], *done))
        assert sum("held by" in d.stderr for d in done) == 1  # both reached the claim: one lost it
    assert outcomes  # each trial's outcome was checked


def test_resume_and_undo_started_together_bounded_attempts(interrupted, tmp_path):
    for trial in range(4):
        src = _fresh(interrupted, tmp_path, f"u{trial}")
        procs = [subprocess.Popen([*CLI, "migrate", str(src), "--in-place", flag], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for flag in ("--resume", "--undo")]
        done = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        _check_outcome(src, interrupted["before"], *done)


HOLD = textwrap.dedent("""
    import sys
    from sharding_store.cli import main
    from sharding_store.testing import fault_hook, pause_after
    with fault_hook(pause_after(1, "undo")):
        sys.exit(main(["migrate", sys.argv[1], "--in-place", "--undo"]))
""")


def test_a_live_holder_is_named_and_a_killed_one_is_taken_over(interrupted, tmp_path):
    src = _fresh(interrupted, tmp_path, "held")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(src)], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert "test pause" in holder.stderr.readline()
        refused = subprocess.run([*CLI, "migrate", str(src), "--in-place", "--resume"], cwd=REPO,
                                 capture_output=True, text=True)
        assert refused.returncode == 10 and f"pid {holder.pid}" in refused.stderr, refused.stderr
        assert "still running" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        owner = UpgradeJournal.parse((src / UPGRADE_JOURNAL_KEY).read_bytes()).owner
        assert owner is not None and owner.pid == holder.pid and owner.action == "undo"
        info = subprocess.run([*CLI, "info", str(src)], cwd=REPO, capture_output=True, text=True)
        assert f"held by an undo run (pid {holder.pid}" in info.stdout and "still running" in info.stdout
    finally:
        holder.kill()
        holder.wait()
    done = subprocess.run([*CLI, "migrate", str(src), "--in-place", "--resume"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _upgraded(src) and not (src / UPGRADE_JOURNAL_KEY).exists()


def test_a_holder_on_another_host_needs_take_over(interrupted, tmp_path):
    src = _fresh(interrupted, tmp_path, "elsewhere")
    doc = json.loads((src / UPGRADE_JOURNAL_KEY).read_bytes())
    doc["owner"]["host"] = "another-host.example"
    (src / UPGRADE_JOURNAL_KEY).write_text(json.dumps(doc))
    refused = subprocess.run([*CLI, "migrate", str(src), "--in-place", "--undo"], cwd=REPO,
                             capture_output=True, text=True)
    assert refused.returncode == 10 and "another-host.example" in refused.stderr and "--take-over" in refused.stderr
    assert json.loads((src / UPGRADE_JOURNAL_KEY).read_bytes()) == doc  # nothing changed
    done = subprocess.run([*CLI, "migrate", str(src), "--in-place", "--undo", "--take-over"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert tree_hash(src) == interrupted["before"]
