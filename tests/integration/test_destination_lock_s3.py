"""DST's lock on S3 (moto): created with a conditional PUT (``If-None-Match: *``), released with
a conditional DELETE; two ``--overwrite`` migrations met at the lock: one writes, the other
exits 8; a lock of another host is never guessed dead (removing it is the recovery); one left
by a run killed on this host is taken over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sharding_store import DestinationExistsError, migrate, verify
from sharding_store.formats.upgrade_journal import Claim
from sharding_store.ops.destination import LOCK_KEY, MARKER_KEY
from tests.draft_factory import make_big_array, make_hierarchy
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
REPO = str(Path(__file__).resolve().parents[2])
DST = "s3://dst/out"
LOCK = f"dst/out/{LOCK_KEY}"


@pytest.fixture
def buckets(s3, tmp_path):  # noqa: F811
    s3.make_bucket("src")
    s3.make_bucket("dst")
    for name in ("one", "two"):
        make_hierarchy(tmp_path / name)
        make_big_array(tmp_path / name, shards=6)
        s3.fs.put(str(tmp_path / name) + "/", f"src/{name}", recursive=True)
    return s3


def cli(s3, *args: str, fault: list[str] | None = None) -> subprocess.Popen:
    opts = ["--storage-options", json.dumps(s3.storage_options)]
    head = [sys.executable, "-m", "tests.run_with_fault", *fault, "--"] if fault else \
        [sys.executable, "-m", "sharding_store.cli"]
    return subprocess.Popen([*head, *args, *opts], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    return proc.wait(timeout=300), proc.stderr.read()  # type: ignore[union-attr]


def test_two_overwrites_met_at_the_lock(buckets, tmp_path):
    s3 = buckets
    migrate("s3://src/two", DST, storage_options=s3.storage_options, verify=False, progress=False)
    meet = ["--rendezvous", "lock", str(tmp_path / "meet"), "2"]
    procs = {name: cli(s3, "migrate", f"s3://src/{name}", DST, "--overwrite", "--no-verify", "--jobs", "1",
                       fault=meet) for name in ("one", "two")}
    results = {name: finish(p) for name, p in procs.items()}
    assert sorted(code for code, _ in results.values()) == [0, DestinationExistsError.exit_code], results
    loser_err = next(err for code, err in results.values() if code)
    assert len(loser_err.strip().splitlines()) == 1 and f"{DST}/{LOCK_KEY} is held by a migrate run" in loser_err
    winner = next(name for name, (code, _) in results.items() if code == 0)
    assert verify(f"s3://src/{winner}", DST, storage_options=s3.storage_options).ok
    s3.fs.invalidate_cache()
    assert not s3.fs.exists(LOCK) and not s3.fs.exists(f"dst/out/{MARKER_KEY}")


def test_a_lock_of_another_host_is_refused_until_removed(buckets):
    s3 = buckets
    migrate("s3://src/two", DST, storage_options=s3.storage_options, verify=False, progress=False)
    owner = {**Claim.mine("migrate").to_json(), "host": "elsewhere.example"}
    s3.fs.pipe(LOCK, json.dumps({"lock": "sharding-store", "owner": owner}).encode())
    before = {k: s3.fs.info(k)["ETag"] for k in s3.fs.find("dst/out")}
    code, err = finish(cli(s3, "migrate", "s3://src/one", DST, "--overwrite", "--no-verify"))
    assert code == DestinationExistsError.exit_code and len(err.strip().splitlines()) == 1, err
    assert "host elsewhere.example" in err and f"remove {DST}/{LOCK_KEY}" in err
    s3.fs.invalidate_cache()
    assert {k: s3.fs.info(k)["ETag"] for k in s3.fs.find("dst/out")} == before  # nothing changed
    info = subprocess.run([sys.executable, "-m", "sharding_store.cli", "info", DST, "--storage-options",
                           json.dumps(s3.storage_options)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert info.returncode == 0 and f"lock: {DST}/{LOCK_KEY} held by a migrate run" in info.stdout, info
    assert f"if it is dead remove {DST}/{LOCK_KEY}" in info.stdout and "cannot tell" in info.stdout
    s3.fs.rm(LOCK)  # the documented recovery, once that run is known to be gone
    code, err = finish(cli(s3, "migrate", "s3://src/one", DST, "--overwrite"))
    assert code == 0, err
    assert verify("s3://src/one", DST, storage_options=s3.storage_options).ok


def test_a_run_killed_on_this_host_is_taken_over_by_resume(buckets):
    s3 = buckets
    killed = cli(s3, "migrate", "s3://src/one", DST, "--jobs", "1", fault=["--kill-at", "unit:3"])
    assert killed.wait(timeout=300) == -9
    s3.fs.invalidate_cache()
    assert s3.fs.exists(LOCK) and s3.fs.exists(f"dst/out/{MARKER_KEY}")
    info = subprocess.run([sys.executable, "-m", "sharding_store.cli", "info", DST, "--storage-options",
                           json.dumps(s3.storage_options)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert info.returncode == 0 and "no longer running" in info.stdout and "takes the lock over" in info.stdout, info
    code, err = finish(cli(s3, "migrate", "s3://src/one", DST, "--resume"))
    assert code == 0, err
    s3.fs.invalidate_cache()
    assert not s3.fs.exists(LOCK)
    assert verify("s3://src/one", DST, storage_options=s3.storage_options).ok
