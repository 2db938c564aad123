"""The command line's surface (issue 27), in real processes: what goes to stdout (results,
text or one JSON document) and what to stderr (warnings, progress, errors), the words of
the reports and of argparse's errors, and the exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import create_draft_array, create_draft_group

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CLI = [sys.executable, "-m", "sharding_store.cli"]


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sharding-store ARGS`` in a child process, its streams captured apart."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Path:
    """/g/img sharded (2 x 2 chunks per shard, 4 shards), /g/zl unsharded zlib (only zarr-python
    reads zlib: migrate warns about it), one group."""
    root = tmp_path_factory.mktemp("surface") / "draft.zr3"
    create_draft_group(str(root), "g")
    img = create_draft_array(str(root), "g/img", shape=(8, 8), chunks=(2, 2), dtype="<u2", chunks_per_shard=(2, 2))
    img[...] = np.arange(64, dtype="<u2").reshape(8, 8)
    zl = create_draft_array(str(root), "g/zl", shape=(6,), chunks=(3,), dtype="<i4", compressor=numcodecs.Zlib(level=1))
    zl[...] = np.arange(6)
    return root


# --------------------------------------------------------------------------- item 6: streams


@pytest.mark.parametrize("as_json", [False, True])
def test_warnings_go_to_stderr_results_to_stdout(draft, tmp_path, as_json):
    proc = cli("migrate", draft, tmp_path / "out.zarr", *(["--json"] if as_json else []))
    assert proc.returncode == 0, proc.stderr
    assert not [w for w in proc.stdout.splitlines() if w.startswith("warning")]
    (line,) = [w for w in proc.stderr.splitlines() if w.startswith("warning: ")]
    assert "g/zl" in line and "zarr-python" in line
    if as_json:
        doc = json.loads(proc.stdout)  # stdout is the JSON document and nothing else
        assert any("g/zl" in w for w in doc["warnings"])
    else:
        assert proc.stdout.startswith("migrated ")


def test_progress_goes_to_stderr(draft, tmp_path):
    proc = cli("migrate", draft, tmp_path / "out.zarr", "--progress", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "migrate" in proc.stderr
