"""An in-place upgrade killed anywhere is finished by ``--resume`` or rolled back byte for byte by ``--undo``.

The store: the real zarrita.js store (33 arrays, ``endian`` spellings, declared checksums)
with a real zarrita June 2023 store below it in an implicit group ``june`` (hidden CRC32C
after every shard index): 35 documents to write, one of them created. The reference is the
same store upgraded without interruption (``test_gen2023_inplace.py`` proves such a store
reads equal to ``expected.npz``). Kills: in process at every fault point (hypothesis: where,
then resume or undo, possibly killed again), and real SIGKILLs of a CLI subprocess at
chosen points; on local directories and on S3 (moto).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store.formats.gen2023 import NODE_KEY
from sharding_store.formats.upgrade_journal import UPGRADE_JOURNAL_KEY
from sharding_store.ops.upgrade import FAULT_UNDO, FAULT_UPGRADE, upgrade_in_place
from tests.draft_factory import tree_hash
from tests.unit.ops.test_gen2023_inplace import Crash, crash_at, data_hash, documents
from tests.unit.ops.test_gen2023_migrate import TWO_SHARDS, _array_paths, _expected, _read_zarr, _same

from .. import fixtures
from ..s3server import s3, s3_server  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]  # slow: processes killed mid-run
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-m", "sharding_store.cli"]
N_DOCUMENTS = 35
#: fault points of an uninterrupted upgrade: the journal, each document, the verification
N_POINTS = N_DOCUMENTS + 2


def make_store(root: Path) -> Path:
    """The endian store with the June store below it (an implicit group ``june``)."""
    fixtures.copy_writable(fixtures.require(fixtures.ZARRITAJS_2023_ENDIAN) / "data.zarr", root)
    fixtures.copy_writable(fixtures.require(fixtures.ZARRJS_ZARRITA_2023) / TWO_SHARDS, root / "june")
    return root


def expected(path: str):
    if path.startswith("june/"):
        return _expected(fixtures.ZARRJS_ZARRITA_2023.name, TWO_SHARDS, path[len("june/"):])
    return _expected(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr", path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The store before, and its documents after an uninterrupted upgrade."""
    fixtures.require(fixtures.DRAFT_2023)
    base = tmp_path_factory.mktemp("reference")
    src = make_store(base / "store")
    before = tree_hash(src)
    data = data_hash(src)
    originals = documents(src)
    report = upgrade_in_place(str(src))
    assert report.written == N_DOCUMENTS and report.created == 1 and report.verified
    return {"before": before, "data": data, "docs": documents(src), "originals": originals}


def assert_upgraded(root: Path, reference: dict, *, read: bool = True) -> None:
    assert not (root / UPGRADE_JOURNAL_KEY).exists()
    assert data_hash(root) == reference["data"]
    assert documents(root) == reference["docs"]
    if read:
        for path in _array_paths(root):
            _same(_read_zarr(root, path), expected(path))


def test_the_fault_points_are_counted(tmp_path, reference):
    seen: list[str] = []
    from sharding_store.testing import fault_hook

    with fault_hook(seen.append):
        upgrade_in_place(str(make_store(tmp_path / "s")))
    assert seen == [FAULT_UPGRADE] * N_POINTS


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(1, N_POINTS), action=st.sampled_from(["resume", "undo"]),
       again=st.one_of(st.none(), st.integers(1, N_DOCUMENTS + 1)))
def test_killed_anywhere_then_resumed_or_undone(tmp_path_factory, reference, at, action, again):
    src = make_store(tmp_path_factory.mktemp("kill") / "store")
    with crash_at(at), pytest.raises(Crash):
        upgrade_in_place(str(src))
    assert (src / UPGRADE_JOURNAL_KEY).exists()
    assert data_hash(src) == reference["data"]  # never a data object
    for key, doc in documents(src).items():  # each document: its original or its replacement
        assert doc in (reference["docs"][key], reference["originals"].get(key)), key
    phase = FAULT_UNDO if action == "undo" else FAULT_UPGRADE
    if again is not None:  # the resume or undo killed too (if it gets that far), then run again
        try:
            with crash_at(again, phase):
                upgrade_in_place(str(src), resume=action == "resume", undo=action == "undo")
        except Crash:
            pass
    if (src / UPGRADE_JOURNAL_KEY).exists():
        upgrade_in_place(str(src), resume=action == "resume", undo=action == "undo")
    if action == "undo":
        assert tree_hash(src) == reference["before"]
    else:
        assert_upgraded(src, reference, read=False)
        _same(_read_zarr(src, "june/a"), expected("june/a"))


# --------------------------------------------------------------------------- real SIGKILLs


def killed_cli(args: list[str], at: str) -> None:
    """Run the CLI in a subprocess that SIGKILLs itself at fault point ``at`` (PHASE:N)."""
    proc = subprocess.run([sys.executable, "-m", "tests.run_with_fault", "--kill-at", at, "--", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)


@pytest.mark.parametrize("at", [1, 2, 18, N_POINTS - 1, N_POINTS])
def test_sigkill_then_resume(tmp_path, reference, at):
    src = make_store(tmp_path / "store")
    killed_cli(["migrate", str(src), "--in-place"], f"{FAULT_UPGRADE}:{at}")
    assert (src / UPGRADE_JOURNAL_KEY).exists()
    refused = subprocess.run([*CLI, "migrate", str(src), "--in-place"], capture_output=True, text=True)
    assert refused.returncode == 10 and "--resume" in refused.stderr and "--undo" in refused.stderr
    done = subprocess.run([*CLI, "migrate", str(src), "--in-place", "--resume", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified"] and report["written"] + report["already_done"] == N_DOCUMENTS
    assert_upgraded(src, reference)


@pytest.mark.parametrize("at, undo_at", [(1, None), (20, None), (N_POINTS, None), (20, 3)])
def test_sigkill_then_undo_restores_every_byte(tmp_path, reference, at, undo_at):
    src = make_store(tmp_path / "store")
    killed_cli(["migrate", str(src), "--in-place"], f"{FAULT_UPGRADE}:{at}")
    if undo_at is not None:
        killed_cli(["migrate", str(src), "--in-place", "--undo"], f"{FAULT_UNDO}:{undo_at}")
    done = subprocess.run([*CLI, "migrate", str(src), "--in-place", "--undo"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert tree_hash(src) == reference["before"]


# --------------------------------------------------------------------------- S3 (moto)


@pytest.fixture
def s3_store(request, tmp_path, reference):
    s3 = request.getfixturevalue("s3")
    s3.make_bucket("upgrade")
    src = make_store(tmp_path / "local")
    s3.fs.put(str(src) + "/", "upgrade/store", recursive=True)
    return s3


def _s3_objects(s3, prefix: str = "upgrade/store") -> dict[str, bytes]:
    s3.fs.invalidate_cache()
    return {k[len(prefix) + 1:]: s3.fs.cat_file(k) for k in sorted(s3.fs.find(prefix))}


def _download(s3, dst: Path) -> Path:
    for key, value in _s3_objects(s3).items():
        (dst / key).parent.mkdir(parents=True, exist_ok=True)
        (dst / key).write_bytes(value)
    return dst


@pytest.mark.s3
def test_an_s3_upgrade(s3_store, tmp_path, reference):
    s3 = s3_store
    before = _s3_objects(s3)
    report = upgrade_in_place("s3://upgrade/store", storage_options=s3.storage_options)
    assert report.written == N_DOCUMENTS and report.verified
    after = _s3_objects(s3)
    assert {k: v for k, v in after.items() if not k.endswith(NODE_KEY)} == \
        {k: v for k, v in before.items() if not k.endswith(NODE_KEY)}
    assert_upgraded(_download(s3, tmp_path / "got"), reference)


@pytest.mark.s3
def test_an_s3_upgrade_killed_then_resumed_and_one_undone(s3_store, tmp_path, reference):
    s3 = s3_store
    before = _s3_objects(s3)
    opts = json.dumps(s3.storage_options)
    killed_cli(["migrate", "s3://upgrade/store", "--in-place", "--storage-options", opts], f"{FAULT_UPGRADE}:12")
    assert UPGRADE_JOURNAL_KEY in _s3_objects(s3)
    undo = subprocess.run([*CLI, "migrate", "s3://upgrade/store", "--in-place", "--undo", "--storage-options", opts],
                          capture_output=True, text=True)
    assert undo.returncode == 0, undo.stderr
    assert _s3_objects(s3) == before  # every object byte for byte, the journal gone
    killed_cli(["migrate", "s3://upgrade/store", "--in-place", "--storage-options", opts], f"{FAULT_UPGRADE}:30")
    done = subprocess.run([*CLI, "migrate", "s3://upgrade/store", "--in-place", "--resume", "--storage-options", opts],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert_upgraded(_download(s3, tmp_path / "got"), reference)
