"""`--resume` continues only the migration of the same source (issue 12: never wrong data).

The marker of an interrupted migration records the canonical location of its source; a
resume from another source is refused naming both, even with verification off (which
would otherwise publish a destination mixing two sources' shards). Another spelling of
the same source resumes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sharding_store import UsageError, create_draft_array, migrate
from sharding_store.testing import fault_hook


class Crash(BaseException):
    pass


def _source(path: Path, values: np.ndarray) -> Path:
    create_draft_array(str(path), "a", shape=values.shape, chunks=(2,), dtype="<i4", chunks_per_shard=(2,))[...] = values
    return path


def _interrupted(src: Path, dst: Path) -> None:
    seen = []

    def hook(phase: str) -> None:
        seen.append(phase)
        if phase == "unit" and seen.count("unit") == 2:
            raise Crash()

    with fault_hook(hook), pytest.raises(Crash):
        migrate(str(src), str(dst), jobs=1, progress=False)
    assert (dst / ".sharding-store-migration.json").exists() or any(dst.iterdir())


def test_resume_from_another_source_is_refused(tmp_path: Path) -> None:
    one = _source(tmp_path / "one", np.arange(32, dtype="<i4"))
    two = _source(tmp_path / "two", np.arange(32, dtype="<i4")[::-1].copy())
    dst = tmp_path / "dst"
    _interrupted(one, dst)
    with pytest.raises(UsageError, match="another source"):
        migrate(str(two), str(dst), resume=True, verify=False, progress=False)
    # the same source under another spelling resumes and completes
    link = tmp_path / "one-link"
    link.symlink_to(one)
    report = migrate(f"file://{link}/", str(dst), resume=True, progress=False)
    assert report.verification is not None and report.verification.ok
    import zarr

    np.testing.assert_array_equal(zarr.open_array(store=str(dst), path="a", mode="r")[...], np.arange(32, dtype="<i4"))
