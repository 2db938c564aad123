"""An in-place reshard cut off in its swap phase hides its array (issue 12 item 3).

The array's metadata document is gone until ``reshard --resume`` completes the run; the
reshard journal under ``__reshard__/journal/`` is its only trace. Every command that
reads the hierarchy must see it: ``info`` reports it (``--strict`` exits 10), ``ls``
lists it, ``migrate`` and ``verify`` refuse with exit 10 naming the array and
``sharding-store reshard ... --resume`` -- never "verified" with the array missing.

The interruption is real: ``reshard`` runs on a mapping whose ``__delitem__`` loses power
right after the array's metadata document is deleted (the protocol's "hide" step), then
the mapping's objects are written to a directory as the disk would hold them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import numpy as np
import pytest

from sharding_store import create_draft_array, migrate, open_draft, reshard
from sharding_store.cli import main
from sharding_store.errors import MigrationError, StoreNotFoundError
from sharding_store.formats import draft_metadata as dm

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

HIDDEN = "grp/vol"
META_KEY = dm.array_meta_key(HIDDEN)
VALUES = np.arange(12 * 10, dtype="<i4").reshape(12, 10)
OTHER = np.arange(20, dtype="<u2")


class PowerCut(BaseException):
    """The process stops here (a BaseException: nothing on the way may handle it)."""


class CutAfterDelete(MutableMapping):
    """A dict-backed store that stops the process right after ``cut_key`` is deleted."""

    def __init__(self, cut_key: str) -> None:
        self.data: dict[str, bytes] = {}
        self.cut_key = cut_key
        self.armed = False

    def __getitem__(self, key: str) -> bytes:
        return self.data[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(value)

    def __delitem__(self, key: str) -> None:
        del self.data[key]
        if self.armed and key == self.cut_key:
            raise PowerCut(key)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


def write_out(store: CutAfterDelete, root: Path) -> Path:
    for key, value in store.data.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)
    return root


@pytest.fixture
def interrupted(tmp_path) -> Path:
    """A hierarchy whose array 'grp/vol' is mid-reshard (journal phase 'swap', metadata gone)."""
    store = CutAfterDelete(META_KEY)
    create_draft_array(store, HIDDEN, shape=VALUES.shape, chunks=(2, 5), dtype="<i4", chunks_per_shard=(2, 1))[...] = VALUES
    create_draft_array(store, "other", shape=OTHER.shape, chunks=(4,), dtype="<u2")[...] = OTHER
    store.armed = True
    with pytest.raises(PowerCut):
        reshard(store, chunks_per_shard=(3, 2), arrays=[HIDDEN], jobs=1, progress=False)
    root = write_out(store, tmp_path / "src")
    journal = json.loads((root / "__reshard__" / "journal" / META_KEY).read_bytes())
    assert journal["phase"] == "swap" and not (root / META_KEY).exists()
    with pytest.raises(StoreNotFoundError):  # what a reader sees: no such array
        open_draft(str(root), HIDDEN)
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def names_the_way_out(text: str, root: Path) -> bool:
    return f"'{HIDDEN}'" in text and f"sharding-store reshard {root} --resume" in text


def test_info_reports_the_hidden_array_and_strict_fails(interrupted, capsys):
    code, out, _ = run(capsys, "info", str(interrupted))
    assert code == 0 and "/other" in out
    assert f"/{HIDDEN}" in out and "interrupted reshard" in out and names_the_way_out(out, interrupted)

    code, out, err = run(capsys, "info", str(interrupted), "--json")
    doc = json.loads(out)
    (entry,) = doc["interrupted_reshards"]
    assert code == 0 and entry["path"] == HIDDEN and entry["phase"] == "swap" and entry["hidden"] is True

    code, _, err = run(capsys, "info", str(interrupted), "--strict")
    assert code == MigrationError.exit_code == 10
    assert len(err.strip().splitlines()) == 1 and names_the_way_out(err, interrupted)

    code, out, _ = run(capsys, "info", str(interrupted), "--path", "grp", "--strict")
    assert code == 10  # the subtree that holds it fails too

    code, out, _ = run(capsys, "ls", str(interrupted))
    assert code == 0 and f"/{HIDDEN}\tinterrupted-reshard\tswap" in out


def test_migrate_refuses_instead_of_dropping_the_array(interrupted, tmp_path, capsys):
    for extra in ([], ["--skip-damaged"], ["--dry-run"]):
        dst = tmp_path / ("out" + "".join(extra))
        code, out, err = run(capsys, "migrate", str(interrupted), str(dst), *extra)
        assert code == 10, (extra, out, err)
        assert names_the_way_out(err, interrupted) and "verified" not in out
        assert not (dst / "zarr.json").exists()


def test_verify_refuses(interrupted, tmp_path, capsys):
    # a migration of the same hierarchy made before the reshard started
    before = tmp_path / "before"
    store = {}
    create_draft_array(store, HIDDEN, shape=VALUES.shape, chunks=(2, 5), dtype="<i4", chunks_per_shard=(2, 1))[...] = VALUES
    create_draft_array(store, "other", shape=OTHER.shape, chunks=(4,), dtype="<u2")[...] = OTHER
    migrate(store, str(before), progress=False)
    code, out, err = run(capsys, "verify", str(interrupted), str(before))
    assert code == 10 and names_the_way_out(err, interrupted), (out, err)


def test_resume_then_every_command_works(interrupted, tmp_path, capsys):
    assert run(capsys, "reshard", str(interrupted), "--resume", "--no-progress")[0] == 0
    assert run(capsys, "info", str(interrupted), "--strict")[0] == 0
    assert np.array_equal(open_draft(str(interrupted), HIDDEN)[...], VALUES)
    assert open_draft(str(interrupted), HIDDEN).meta.chunks_per_shard == (3, 2)
    code, out, err = run(capsys, "migrate", str(interrupted), str(tmp_path / "out"))
    assert code == 0, err
    assert (tmp_path / "out" / HIDDEN / "zarr.json").exists()
