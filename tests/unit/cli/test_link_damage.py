"""An object that links out of the store damages its own array only (issue 12 items 2 and 10).

`info` lists the array with a problem line (exit 0; `--strict` exits 13), `migrate` refuses
naming the key (exit 13) before writing anything when planning finds it, and
`--skip-damaged` migrates and verifies the other arrays and lists the damaged one — for an
unsharded array (found by the lost-transformer probe while planning) and a sharded one
(found when its unit reads the shard).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sharding_store as ss

SAMPLE = Path(__file__).resolve().parents[3] / "samples" / "zarr-2.18-sharded.zr3"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sharding_store.cli", *map(str, args)], capture_output=True, text=True)


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"not yours" * 100)
    return secret


@pytest.mark.parametrize("key", [
    pytest.param("data/root/images/mean/c0/0", marks=pytest.mark.slow),  # five CLI processes each: one stays fast
    "data/root/images/raw/c0/0/0",
])
def test_an_escaping_link_damages_its_array_only(tmp_path: Path, outside: Path, key: str) -> None:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE, src)
    array = key.split("/c")[0][len("data/root/"):]
    os.unlink(src / key)
    os.symlink(outside, src / key)

    info = cli("info", src)
    assert info.returncode == 0, info.stderr
    assert f"problem: {key}: resolves to" in info.stdout
    strict = cli("info", src, "--strict")
    assert strict.returncode == 13 and strict.stderr.count("\n") == 1 and key in strict.stderr

    dst = tmp_path / "dst"
    refused = cli("migrate", src, dst)
    assert refused.returncode == 13, refused.stderr
    assert key in refused.stderr and "Traceback" not in refused.stderr

    shutil.rmtree(dst, ignore_errors=True)
    done = cli("migrate", src, dst, "--skip-damaged")
    assert done.returncode == 0, done.stderr
    assert f"skipped {array} (damaged, LinkOutsideStoreError)" in done.stdout
    assert not (dst / array / "zarr.json").exists()
    assert outside.read_bytes() == b"not yours" * 100  # never read into DST, never touched
    for path in ("images/labels", "tables/measurements"):
        np.testing.assert_array_equal(
            np.asarray(__import__("zarr").open_array(store=str(dst), path=path, mode="r")[...]),
            ss.open_draft(str(SAMPLE), path)[...],
        )
    again = cli("verify", src, dst, "--skip-damaged")
    assert again.returncode == 0, again.stderr
