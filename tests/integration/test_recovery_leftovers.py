"""Recovery removes what an interrupted run left; ``info --strict`` reports it (issue 25 item 17).

Real SIGKILLs in the middle of a local write: the child process (``KILLER``) kills itself
right after the N-th temporary file of a write is created and partly written, before it
is renamed, which is where a kill leaves ``<key>.sharding-store-tmp-...`` behind. Then:

* in-place upgrade: ``--undo`` leaves the tree byte for byte as before (every file hashed,
  temporary names included), ``--resume`` leaves no temporary file; a kill while the journal
  itself was written leaves no journal and a temporary file that ``info --strict`` reports
  (exit 10) and the next upgrade removes;
* in-place reshard: killed during staging, then its resume killed right after the journal
  was deleted: nothing is left under ``__reshard__/``; leftovers no journal accounts for
  are reported by ``info --strict`` (exit 10) and removed by ``reshard --resume``.
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

from sharding_store import create_draft_array
from sharding_store.formats.upgrade_journal import UPGRADE_JOURNAL_KEY
from sharding_store.stores.local import TEMP_MARKER
from tests.draft_factory import tree_hash
from tests.gen2023_writer import write_2023, write_group

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: processes killed mid-write
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-m", "sharding_store.cli"]
N_ARRAYS = 40

KILLER = textwrap.dedent("""
    import os, signal, sys
    import sharding_store.stores.local as local
    mode, n, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    seen = [0]
    if mode == "write":  # SIGKILL inside the n-th local write: its temporary file made, half written
        real_open_new = local.LocalInner._open_new
        def _open_new(self, key):
            d, name, fd, tmp = real_open_new(self, key)
            seen[0] += 1
            if seen[0] == n:
                os.write(fd, b'{"half": ')
                os.kill(os.getpid(), signal.SIGKILL)
            return d, name, fd, tmp
        local.LocalInner._open_new = _open_new
    else:  # "journal-deleted": SIGKILL right after the n-th reshard journal is deleted
        real_delete = local.LocalInner.delete
        def delete(self, key):
            real_delete(self, key)
            if key.startswith("__reshard__/journal/"):
                seen[0] += 1
                if seen[0] == n:
                    os.kill(os.getpid(), signal.SIGKILL)
        local.LocalInner.delete = delete
    from sharding_store.cli import main
    sys.exit(main(args))
""")


def killed(mode: str, n: int, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLER, mode, str(n), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (mode, n, proc.returncode, proc.stderr)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def temps(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(f"*{TEMP_MARKER}*"))


@pytest.fixture(scope="module")
def store2023(tmp_path_factory):
    root = tmp_path_factory.mktemp("leftovers") / "store"
    write_group(root, "", {"title": "leftovers"})
    for i in range(N_ARRAYS):
        write_2023(root, f"a{i:03d}", np.arange(4, dtype="u2") + i, chunks=(2,), cps=(2,), index="hidden")
    return root


def _copy(store2023: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(store2023, dst)
    return dst


def _all_upgraded(root: Path) -> bool:
    docs = [json.loads(p.read_bytes()) for p in root.rglob("zarr.json")]
    return all(d.get("node_type") == "group" or d["codecs"][0]["configuration"]["codecs"][0]["name"] == "bytes"
               for d in docs)


@pytest.mark.parametrize("n", [2, 17, N_ARRAYS + 1])  # the journal first: the 1st, 16th and last document
def test_killed_during_a_document_write_then_undo_or_resume(store2023, tmp_path, n):
    before = tree_hash(store2023)
    src = _copy(store2023, tmp_path, "undo")
    killed("write", n, "migrate", str(src), "--in-place")
    assert temps(src) and (src / UPGRADE_JOURNAL_KEY).exists()  # the kill left a temporary file
    done = cli("migrate", str(src), "--in-place", "--undo")
    assert done.returncode == 0 and "undone" in done.stdout and "removed 1 temporary" in done.stdout, done.stderr
    assert tree_hash(src) == before  # every file, temporary names included
    again = _copy(store2023, tmp_path, "resume")
    killed("write", n, "migrate", str(again), "--in-place")
    done = cli("migrate", str(again), "--in-place", "--resume")
    assert done.returncode == 0, done.stderr
    assert temps(again) == [] and not (again / UPGRADE_JOURNAL_KEY).exists() and _all_upgraded(again)


def test_an_undo_killed_during_a_write_is_undone_byte_for_byte(store2023, tmp_path):
    before = tree_hash(store2023)
    src = _copy(store2023, tmp_path, "twice")
    killed("write", 25, "migrate", str(src), "--in-place")
    first = temps(src)
    killed("write", 6, "migrate", str(src), "--in-place", "--undo")  # the claim, then 4 documents, then this one
    second = temps(src)  # the undo removed the first run's temporary file before it wrote
    assert len(first) == len(second) == 1 and first != second
    done = cli("migrate", str(src), "--in-place", "--undo")
    assert done.returncode == 0, done.stderr
    assert tree_hash(src) == before


def test_killed_while_the_journal_was_written(store2023, tmp_path):
    src = _copy(store2023, tmp_path, "journal")
    killed("write", 1, "migrate", str(src), "--in-place")
    assert not (src / UPGRADE_JOURNAL_KEY).exists()
    [leftover] = temps(src)
    assert leftover.startswith(UPGRADE_JOURNAL_KEY + TEMP_MARKER)
    report = cli("info", str(src), "--strict")
    assert report.returncode == 10 and leftover in report.stderr, report.stderr
    assert f"leftover: {leftover}" in report.stdout
    assert cli("migrate", str(src), "--in-place", "--undo").returncode == 2  # no journal: nothing to undo
    done = cli("migrate", str(src), "--in-place")
    assert done.returncode == 0, done.stderr
    assert temps(src) == [] and _all_upgraded(src)


# --------------------------------------------------------------------------- in-place reshard


def _draft(root: Path) -> None:
    for i, path in enumerate(("a", "b")):
        create_draft_array(str(root), path, shape=(80,), chunks=(2,), dtype="<i4",
                           chunks_per_shard=(2,))[...] = np.arange(80, dtype="<i4") * (i + 1)


def test_a_reshard_killed_twice_leaves_nothing_under_reshard(tmp_path):
    src = tmp_path / "draft"
    _draft(src)
    killed("write", 8, "reshard", str(src), "--chunks-per-shard", "6", "--jobs", "1", "--no-progress")
    assert any(TEMP_MARKER in p.name for p in (src / "__reshard__").rglob("*"))
    killed("journal-deleted", 1, "reshard", str(src), "--resume", "--no-progress")
    leftovers = [p for p in (src / "__reshard__").rglob("*") if p.is_file()] if (src / "__reshard__").exists() else []
    assert leftovers == []
    assert cli("info", str(src), "--strict").returncode == 0


def test_info_strict_reports_reshard_leftovers_and_resume_removes_them(tmp_path):
    src = tmp_path / "draft"
    _draft(src)
    assert cli("info", str(src), "--strict").returncode == 0
    stale = src / "__reshard__" / "data" / "root" / "a"
    stale.mkdir(parents=True)
    (stale / "c0").write_bytes(b"staged")
    (stale / f"c1{TEMP_MARKER}123-abc-0").write_bytes(b"half")
    report = cli("info", str(src), "--strict")
    assert report.returncode == 10 and "__reshard__/data/root/a/c0" in report.stderr, report.stderr
    assert len(report.stderr.strip().splitlines()) == 1 and "reshard" in report.stderr and "--resume" in report.stderr
    assert cli("info", str(src)).returncode == 0  # reported, not fatal, without --strict
    assert cli("reshard", str(src), "--resume", "--no-progress").returncode == 0
    assert not (src / "__reshard__").exists()
    assert cli("info", str(src), "--strict").returncode == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_killed_at_random_writes_then_undone_byte_for_byte(store2023, tmp_path, seed):
    """Seeded random points: the upgrade killed inside its n-th write, maybe its undo killed
    inside its m-th write too, then an undo: every file as before (temporary names included)."""
    import random

    rng = random.Random(seed)
    before = tree_hash(store2023)
    src = _copy(store2023, tmp_path, "random")
    killed("write", rng.randint(2, N_ARRAYS + 1), "migrate", str(src), "--in-place")
    if rng.random() < 0.5:
        undo = subprocess.run([sys.executable, "-c", KILLER, "write", str(rng.randint(1, 12)), "migrate", str(src),
                               "--in-place", "--undo"], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert undo.returncode in (0, -signal.SIGKILL), undo.stderr  # (0: fewer writes than the kill point)
    if (src / UPGRADE_JOURNAL_KEY).exists():
        done = cli("migrate", str(src), "--in-place", "--undo")
        assert done.returncode == 0, done.stderr
    assert tree_hash(src) == before
