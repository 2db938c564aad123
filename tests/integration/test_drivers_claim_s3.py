"""Two migrations into one S3 destination: the marker is a conditional PUT (``If-None-Match: *``),
so exactly one claims the destination (issue 12 item 4, on moto)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sharding_store import DestinationExistsError, migrate, verify
from tests.draft_factory import make_hierarchy
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]
REPO = str(Path(__file__).resolve().parents[2])
DST = "s3://dst/out"


@pytest.fixture
def buckets(s3, tmp_path):  # noqa: F811
    s3.make_bucket("src")
    s3.make_bucket("dst")
    for name in ("one", "two"):
        make_hierarchy(tmp_path / name)
        s3.fs.put(str(tmp_path / name) + "/", f"src/{name}", recursive=True)
    return s3


def test_two_threads_into_one_bucket_prefix(buckets):
    s3 = buckets
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def run(name: str) -> None:
        barrier.wait()
        try:
            outcome[name] = migrate(f"s3://src/{name}", DST, storage_options=s3.storage_options, verify=False,
                                    progress=False, jobs=1)
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            outcome[name] = e

    threads = [threading.Thread(target=run, args=(name,)) for name in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    failed = {n: e for n, e in outcome.items() if isinstance(e, Exception)}
    assert len(outcome) == 2 and len(failed) == 1, outcome
    assert isinstance(next(iter(failed.values())), DestinationExistsError)
    (winner,) = set(outcome) - set(failed)
    assert verify(f"s3://src/{winner}", DST, storage_options=s3.storage_options).ok


def test_two_processes_meeting_at_the_claim(buckets, tmp_path):
    import json

    s3 = buckets
    opts = json.dumps(s3.storage_options)
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "tests.run_with_fault", "--rendezvous", "lock", str(tmp_path / "meet"), "2", "--",
             "migrate", f"s3://src/{name}", DST, "--storage-options", opts, "--no-verify", "--jobs", "1"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name in ("one", "two")
    }
    results = {name: (p.wait(timeout=300), p.stderr.read()) for name, p in procs.items()}  # type: ignore[union-attr]
    assert sorted(code for code, _ in results.values()) == [0, DestinationExistsError.exit_code], results
    winner = next(name for name, (code, _) in results.items() if code == 0)
    assert "another migration" in next(err for code, err in results.values() if code)
    assert verify(f"s3://src/{winner}", DST, storage_options=s3.storage_options).ok
