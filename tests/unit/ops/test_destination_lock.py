"""The destination's lock (``ops/destination.destination_lock``), made deterministic with fault points.

``--overwrite`` used to empty DST and only then claim it: a second run (``--overwrite``,
plain or ``--resume``) arriving while the first was writing removed its marker and its
shards and wrote its own beside them, both reported success, and DST mixed two sources.
Every run that writes into DST now takes DST's lock first (before anything is removed) and
holds it until it ends: here the other run arrives at a fault point of the first one
(``unit``: mid-copy; ``claim``: DST emptied, nothing written yet) and must be refused, exit 8's
class naming the holder, having changed nothing; the first run's DST then verifies.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from sharding_store import DestinationExistsError, create_draft_array, migrate, reshard, verify
from sharding_store.cli import main
from sharding_store.formats.upgrade_journal import Claim
from sharding_store.ops.destination import LOCK_KEY, MARKER_KEY
from sharding_store.testing import fault_hook
from tests.draft_factory import make_two_sources, read_v3, tree_bytes, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two sources of one layout and different values (a mix of them reads wrong values)."""
    root = tmp_path_factory.mktemp("lock")
    return make_two_sources(root)


def check_winner(dst: Path, sources, winner: str) -> None:
    src, values = sources[winner]
    assert verify(src, dst, progress=False).ok
    for path, expected in values.items():
        assert np.array_equal(read_v3(dst, path), expected), path
    assert not (dst / LOCK_KEY).exists() and not (dst / MARKER_KEY).exists()


def arrive_at(phase: str, n: int, other) -> tuple[dict, object]:
    """A fault hook that runs ``other()`` (the second run) once, at the ``n``-th fault point
    of ``phase`` of the first run; what it raised (or returned) goes into the dict."""
    seen = {"count": 0}
    outcome: dict[str, object] = {}

    def hook(p: str) -> None:
        if p != phase or "done" in outcome:
            return
        seen["count"] += 1
        if seen["count"] == n:
            outcome["done"] = True
            outcome["before"] = tree_bytes(other.dst)
            try:
                outcome["result"] = other()
            except Exception as e:  # noqa: BLE001 - recorded for the assertion
                outcome["result"] = e
            outcome["after"] = tree_bytes(other.dst)

    return outcome, hook


class Run:
    """The second run: ``migrate`` of ``src`` into ``dst`` (spelled ``spelling``) with ``options``."""

    def __init__(self, src: Path, dst: Path, spelling: str, **options: object) -> None:
        self.src, self.dst, self.spelling, self.options = src, dst, spelling, options

    def __call__(self) -> object:
        return migrate(self.src, self.spelling, verify=False, progress=False, jobs=1, **self.options)


def a_migration_of(sources, dst: Path, name: str) -> None:
    """DST holding a complete migration of source ``name`` (what --overwrite replaces)."""
    migrate(sources[name][0], dst, verify=False, progress=False)


@pytest.mark.parametrize("first, second", [
    ({"overwrite": True}, {"overwrite": True}),
    ({}, {"overwrite": True}),
    ({"resume": True}, {"overwrite": True}),
    ({"overwrite": True}, {"resume": True}),
], ids=["overwrite-vs-overwrite", "plain-vs-overwrite", "resume-vs-overwrite", "overwrite-vs-resume"])
@pytest.mark.parametrize("spelled", ["path", "file-url"])
def test_a_second_run_mid_copy_is_refused_and_changes_nothing(sources, tmp_path, first, second, spelled):
    dst = tmp_path / "dst"
    if first:  # something for --overwrite to replace, or a finished migration --resume continues (no-op units)
        a_migration_of(sources, dst, "one" if first.get("resume") else "two")
    other_src = sources["one" if second.get("resume") else "two"][0]
    other = Run(other_src, dst, f"file://{dst}" if spelled == "file-url" else str(dst), **second)
    outcome, hook = arrive_at("unit", 3, other)
    with fault_hook(hook):
        migrate(sources["one"][0], dst, verify=False, progress=False, jobs=1, **first)
    assert outcome.get("done"), "the first run never reached its third unit"
    error = outcome["result"]
    assert isinstance(error, DestinationExistsError), error
    assert "another migration or reshard is writing into this destination" in str(error)
    assert f"{LOCK_KEY} is held by a migrate run (pid {os.getpid()} on host {socket.gethostname()}" in str(error)
    assert outcome["before"] == outcome["after"]  # the loser removed and wrote nothing
    check_winner(dst, sources, "one")


def test_an_overwrite_arriving_after_the_emptying_is_refused(sources, tmp_path):
    """The second --overwrite arrives when the first has emptied DST and not yet written its
    marker (its ``claim`` point): before, it found DST empty too and both copied into it."""
    dst = tmp_path / "dst"
    a_migration_of(sources, dst, "two")
    outcome, hook = arrive_at("claim", 1, Run(sources["two"][0], dst, str(dst), overwrite=True))
    with fault_hook(hook):
        migrate(sources["one"][0], dst, verify=False, progress=False, jobs=1, overwrite=True)
    assert isinstance(outcome["result"], DestinationExistsError), outcome["result"]
    assert outcome["before"] == outcome["after"]
    check_winner(dst, sources, "one")


def make_reshard_source(root: Path, path: str, scale: int) -> np.ndarray:
    arr = create_draft_array(str(root), path, shape=(8, 6), chunks=(2, 3), dtype="<i4", chunks_per_shard=(2, 2))
    values = np.arange(48, dtype="<i4").reshape(8, 6) * scale
    arr[...] = values
    return values


def test_two_overwrite_reshards(tmp_path):
    """reshard --overwrite: the second run arrives at the first's ``claim`` (DST emptied);
    before, it emptied and copied too, and DST kept both sources' arrays."""
    one, two, dst = tmp_path / "one", tmp_path / "two", tmp_path / "dst"
    make_reshard_source(one, "a", 1)
    make_reshard_source(two, "b", 5)
    reshard(two, dst, chunks_per_shard=1)
    before_src = {s: tree_hash(s) for s in (one, two)}

    class Second:
        def __init__(self) -> None:
            self.dst = dst

        def __call__(self) -> object:
            return reshard(two, dst, chunks_per_shard=1, overwrite=True)

    outcome, hook = arrive_at("claim", 1, Second())
    with fault_hook(hook):
        reshard(one, dst, chunks_per_shard=1, overwrite=True)
    error = outcome["result"]
    assert isinstance(error, DestinationExistsError) and "held by a reshard run" in str(error), error
    assert outcome["before"] == outcome["after"]
    reshard(one, tmp_path / "alone", chunks_per_shard=1)
    assert tree_bytes(dst) == tree_bytes(tmp_path / "alone")  # the first run's copy, nothing of the second's
    assert {s: tree_hash(s) for s in (one, two)} == before_src


def foreign_lock(dst: Path, **changes: object) -> bytes:
    """A lock left in DST by a run this host cannot see (another host unless changed)."""
    owner = {**Claim.mine("migrate").to_json(), "host": "elsewhere.example", **changes}
    raw = json.dumps({"lock": "sharding-store", "owner": owner}).encode()
    dst.mkdir(parents=True, exist_ok=True)
    (dst / LOCK_KEY).write_bytes(raw)
    return raw


def test_a_lock_of_another_host_is_refused_until_removed(sources, tmp_path, capsys):
    """A holder this host cannot check is never guessed dead: exit 8, one line naming the lock,
    the holder and how to remove it; nothing changed; after removing it the run goes through."""
    dst = tmp_path / "dst"
    a_migration_of(sources, dst, "two")
    raw = foreign_lock(dst)
    before = tree_bytes(dst)
    assert main(["migrate", str(sources["one"][0]), str(dst), "--overwrite", "--no-verify"]) == 8
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{dst / LOCK_KEY}" in line and "host elsewhere.example" in line and "cannot tell" in line
    assert f"remove {dst / LOCK_KEY}" in line
    assert tree_bytes(dst) == before and (dst / LOCK_KEY).read_bytes() == raw
    (dst / LOCK_KEY).unlink()  # the documented recovery
    assert main(["migrate", str(sources["one"][0]), str(dst), "--overwrite", "--no-verify"]) == 0
    check_winner(dst, sources, "one")


@pytest.mark.parametrize("what", [{"pid": 2**22 + 12345, "host": None}, {"boot": "another-boot", "host": None}],
                         ids=["no-such-process", "before-a-reboot"])
def test_a_dead_holder_on_this_host_is_taken_over(sources, tmp_path, what):
    dst = tmp_path / "dst"
    a_migration_of(sources, dst, "two")
    foreign_lock(dst, **{**what, "host": socket.gethostname()})
    migrate(sources["one"][0], dst, overwrite=True, progress=False)
    check_winner(dst, sources, "one")


def test_a_lock_that_is_not_ours_to_read_is_refused(sources, tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / LOCK_KEY).write_bytes(b"not json")
    with pytest.raises(DestinationExistsError, match="is not one this run can read.*remove"):
        migrate(sources["one"][0], dst, progress=False)
    assert sorted(p.name for p in dst.iterdir()) == [LOCK_KEY]


def test_a_refused_run_and_a_dry_run_leave_no_lock(sources, tmp_path):
    """The lock goes with the run that took it, also when it stops with an error; a dry run
    writes nothing, no lock either."""
    dst = tmp_path / "dst"
    a_migration_of(sources, dst, "two")
    before = tree_bytes(dst)
    with pytest.raises(DestinationExistsError, match="use --overwrite"):
        migrate(sources["one"][0], dst, progress=False)
    migrate(sources["one"][0], dst, overwrite=True, dry_run=True, progress=False)
    assert tree_bytes(dst) == before


@pytest.mark.parametrize("kind", ["icechunk", "icechunk-virtual", "references"])
def test_other_destinations_hold_the_lock_too(sources, tmp_path, kind):
    """An Icechunk repository (materialised or virtual) and a reference file: what a session
    writes no other run sees before its commit, so their lock lives outside it (the
    repository's location; beside the reference file). A second --overwrite arriving mid-run
    is refused and changes nothing; before, it committed its own source and the first run
    either replaced it or failed at its commit."""
    pytest.importorskip("icechunk") if kind.startswith("icechunk") else None
    out = tmp_path / "out"
    out.mkdir()
    dst = out / ("refs.json" if kind == "references" else "repo")
    options = {"target": "icechunk", "virtual": kind.endswith("virtual")} if kind != "references" else {}
    outcome, hook = arrive_at("unit", 3, Run(sources["two"][0], out, str(dst), overwrite=True, **options))
    with fault_hook(hook):
        migrate(sources["one"][0], str(dst), progress=False, jobs=1, **options)  # verified as typed
    error = outcome["result"]
    assert isinstance(error, DestinationExistsError) and "held by a migrate run" in str(error), error
    assert outcome["before"] == outcome["after"]
    assert verify(sources["one"][0], str(dst), progress=False).ok
    assert not [p for p in out.rglob("*") if p.name.endswith(LOCK_KEY)]


def test_where_the_lock_of_an_icechunk_repository_lives(tmp_path):
    """Beside the repository, one place for every spelling of it; at a bucket's root (nothing
    is beside it) inside the root, where a copy into that root locks too."""
    from sharding_store.ops.destination import lock_site
    from sharding_store.ops.options import StoreOptions

    places = set()
    for spelled in (str(tmp_path / "repo"), f"file://{tmp_path}/repo", f"{tmp_path}/x/../repo/"):
        site = lock_site(spelled, None, "icechunk", StoreOptions())  # type: ignore[arg-type]
        assert site is not None
        places.add((site[0].location(), site[1]))
    assert len(places) == 1 and next(iter(places))[1] == "repo" + LOCK_KEY
    for root in ("s3://bucket", "s3://bucket/"):
        site, key = lock_site(root, None, "icechunk", StoreOptions())  # type: ignore[arg-type]
        assert (site.location().path.rstrip("/"), key) == ("bucket", LOCK_KEY)


# --------------------------------------------------------------------------- `info DST` reports the lock


def _info(capsys, *args: str) -> tuple[int, str]:
    code = main(["info", *args])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("kind", ["copy", "references", "icechunk-virtual"])
def test_info_reports_a_live_lock_of_a_running_migration(sources, tmp_path, capsys, kind):
    """``info DST`` while a migration writes it (here: at its third unit): the lock, its holder
    (this process), "still running" and migrate's advice, in text and JSON; a reference file
    not written yet is reported as a destination holding only the lock, not as no hierarchy."""
    if kind.startswith("icechunk"):
        pytest.importorskip("icechunk")
    dst = tmp_path / {"copy": "dst", "references": "refs.json", "icechunk-virtual": "repo"}[kind]
    options = {"target": "icechunk", "virtual": True} if kind.startswith("icechunk") else {}
    seen: dict[str, object] = {}

    def hook(phase: str) -> None:
        if phase == "unit" and "text" not in seen:
            seen["text"] = _info(capsys, str(dst))
            seen["json"] = _info(capsys, str(dst), "--json")

    with fault_hook(hook):
        migrate(sources["one"][0], str(dst), progress=False, jobs=1, verify=False, **options)
    code, text = seen["text"]  # type: ignore[misc]
    where = dst / LOCK_KEY if kind == "copy" else dst.parent / (dst.name + LOCK_KEY)
    assert code == 0 and f"lock: {where} held by a migrate run (pid {os.getpid()} on host {socket.gethostname()}" in text
    assert ": still running; wait for it to end" in text, text
    code, out = seen["json"]  # type: ignore[misc]
    lock = json.loads(out)["lock"]
    assert code == 0 and lock["object"] == str(where) and lock["pid"] == os.getpid() and lock["running"] is True
    assert lock["advice"] == "wait for it to end" and lock["action"] == "migrate"
    code, text = _info(capsys, str(dst))  # the run ended: its lock is gone, and so is the line
    assert code == 0 and "lock:" not in text


def test_info_reports_a_lock_of_another_host_in_migrates_words(sources, tmp_path, capsys):
    """A holder this host cannot check: "cannot tell" and the object to remove once that run
    is gone, the words ``migrate`` refuses with (exit 8)."""
    dst = tmp_path / "dst"
    a_migration_of(sources, dst, "two")
    foreign_lock(dst)
    assert main(["migrate", str(sources["one"][0]), str(dst), "--overwrite", "--no-verify"]) == 8
    (refusal,) = capsys.readouterr().err.strip().splitlines()
    code, text = _info(capsys, str(dst))
    (line,) = [x.strip() for x in text.splitlines() if x.strip().startswith("lock:")]
    advice = line.rpartition("; ")[2]
    assert code == 0 and "host elsewhere.example" in line and "this host cannot tell whether it still runs" in line
    assert advice == f"wait for it to end, or if it is dead remove {dst / LOCK_KEY} (only when no run of " \
        "sharding-store writes there)" and refusal.endswith(advice)
    assert json.loads(_info(capsys, str(dst), "--json")[1])["lock"]["running"] is None


@pytest.mark.parametrize("where", ["copy", "references"])
def test_info_reports_a_lock_left_by_a_dead_run(sources, tmp_path, capsys, where):
    """A lock naming a process of this host that no longer exists: "no longer running" and
    that the next run takes it over (nothing to remove); a DST holding only that lock (a run
    killed before it wrote) is reported as such, exit 0, not "no draft hierarchy" (exit 7)."""
    dead = {"host": socket.gethostname(), "pid": 2**22 + 12345}
    if where == "copy":
        dst, lock = tmp_path / "dst", tmp_path / "dst" / LOCK_KEY
        foreign_lock(dst, **dead)
    else:
        dst, lock = tmp_path / "refs.json", tmp_path / ("refs.json" + LOCK_KEY)
        foreign_lock(tmp_path, **dead)
        (tmp_path / LOCK_KEY).rename(lock)
    code, text = _info(capsys, str(dst))
    assert code == 0 and "nothing else there yet" in text, text
    assert f"lock: {lock} held by a migrate run (pid {dead['pid']}" in text
    assert "no longer running" in text and "the next migrate or reshard into this destination takes the lock over" in text
    assert json.loads(_info(capsys, str(dst), "--json")[1])["lock"]["running"] is False
    migrate(sources["one"][0], str(dst), progress=False, verify=False)  # taken over, as info said
    assert not lock.exists()


def test_info_reports_an_unreadable_lock(tmp_path, capsys):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / LOCK_KEY).write_bytes(b"not json")
    code, text = _info(capsys, str(tmp_path / "dst"))
    assert code == 0 and f"lock: {tmp_path / 'dst' / LOCK_KEY} is not one this run can read; wait for it" in text
