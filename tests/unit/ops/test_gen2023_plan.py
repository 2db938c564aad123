"""Planning a 2023-generation store (``info``, ``migrate``): what one array's damage or size
does to the rest (issue 25 items 12, 15, 16).

* item 12: the shard tails an undeclared (or declared) index is decided from are read in
  batches of bounded bytes, and the first bad shard stops the reading (checked in a child
  whose peak resident set is measured, and by counting the tail reads);
* item 15: a document whose shard would need an index beyond the readers' bound is that
  node's damage (exit 3 naming its document; listed; left out by ``--skip-damaged``);
* item 16: a chunk object that links out of the store is that array's damage, as in 2022.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import crc32c
import numpy as np
import pytest

from sharding_store.api.evidence import decide_reading
from sharding_store.cli import main
from sharding_store.errors import DraftMetadataError, LinkOutsideStoreError, ShardCorruptError
from sharding_store.testing import CountingInner
from tests.draft_factory import tree_hash
from tests.gen2023_writer import write_2023

ROOT = Path(__file__).resolve().parents[3]


def _good(root: Path) -> None:
    write_2023(root, "good", np.arange(16, dtype="u2").reshape(4, 4), chunks=(2, 2), cps=(2, 2))


# --------------------------------------------------------------------------- item 15


def _huge_shard_store(tmp_path: Path) -> Path:
    """A store with a good array and one whose document makes each shard hold 2**27 chunks."""
    root = tmp_path / "src"
    _good(root)
    write_2023(root, "huge", np.arange(4, dtype="u1"), chunks=(1,), cps=(4,))
    doc = json.loads((root / "huge" / "zarr.json").read_text())
    doc["shape"] = [2**27]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [2**27]
    (root / "huge" / "zarr.json").write_text(json.dumps(doc))
    return root


def test_a_shard_of_2_27_chunks_is_that_nodes_damage(tmp_path, capsys):
    src = _huge_shard_store(tmp_path)
    before = tree_hash(src)
    assert main(["info", str(src)]) == 0
    out = capsys.readouterr().out
    assert "/huge\n  damaged (DraftMetadataError): huge/zarr.json" in out and "/good\n  shape 4 x 4  dtype <u2" in out
    assert main(["info", str(src), "--strict"]) == DraftMetadataError.exit_code
    assert "huge/zarr.json" in capsys.readouterr().err
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == DraftMetadataError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "huge/zarr.json" in err and "134217728 chunks per shard" in err
    assert main(["migrate", str(src), str(tmp_path / "dst"), "--skip-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["path"] for s in report["skipped"]["arrays"]] == ["huge"]
    assert report["verified"]["ok"] is True and (tmp_path / "dst" / "good" / "zarr.json").exists()
    assert not (tmp_path / "dst" / "huge").exists()
    assert main(["verify", str(src), str(tmp_path / "dst"), "--skip-damaged"]) == 0
    assert tree_hash(src) == before


# --------------------------------------------------------------------------- item 16


def test_a_chunk_linking_out_of_the_store_is_that_arrays_damage(tmp_path, capsys):
    src = tmp_path / "src"
    _good(src)
    write_2023(src, "linked", np.arange(16, dtype="u2").reshape(4, 4), chunks=(2, 2), cps=(1, 1))
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_bytes((src / "linked" / "c" / "0" / "1").read_bytes())
    (src / "linked" / "c" / "0" / "1").unlink()
    os.symlink(secret, src / "linked" / "c" / "0" / "1")
    assert main(["info", str(src)]) == 0
    out = capsys.readouterr().out
    linked = out[out.index("/linked\n  shape"):].split("\n\n")[0]  # the array's block: its one problem
    assert "\n  problem: linked/c/0/1" in linked and "/good\n  shape 4 x 4  dtype <u2" in out
    assert main(["info", str(src), "--strict"]) == LinkOutsideStoreError.exit_code
    assert "linked/c/0/1" in capsys.readouterr().err
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == LinkOutsideStoreError.exit_code
    assert "--skip-damaged" in capsys.readouterr().err
    assert main(["migrate", str(src), str(tmp_path / "dst2"), "--skip-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(s["path"], s["error"]) for s in report["skipped"]["arrays"]] == [("linked", "LinkOutsideStoreError")]
    assert not (tmp_path / "dst2" / "linked").exists()
    assert main(["verify", str(src), str(tmp_path / "dst2"), "--skip-damaged"]) == 0


def test_a_link_found_while_copying_a_declared_index_is_that_arrays_damage(tmp_path, capsys):
    """A declared index is read when its unit copies the shard (not while planning): the
    link out of the store is then found there, and is still that array's damage only; a
    later ``verify --skip-damaged`` finds the same reason, while an array simply missing
    from DST (its shards sound) is a difference, never taken for a damaged one."""
    src = tmp_path / "src"
    write_2023(src, "good", np.arange(16, dtype="u2").reshape(4, 4), chunks=(2, 2), cps=(2, 2), index="crc")
    write_2023(src, "linked", np.arange(16, dtype="u2").reshape(4, 4), chunks=(2, 2), cps=(1, 1), index="crc")
    secret = tmp_path / "secret"
    secret.write_bytes((src / "linked" / "c" / "0" / "1").read_bytes())
    (src / "linked" / "c" / "0" / "1").unlink()
    os.symlink(secret, src / "linked" / "c" / "0" / "1")
    dst = tmp_path / "dst"
    assert main(["migrate", str(src), str(dst), "--jobs", "1"]) == LinkOutsideStoreError.exit_code
    assert "array 'linked' is damaged" in capsys.readouterr().err
    assert main(["migrate", str(src), str(tmp_path / "dst2"), "--skip-damaged", "--chunks-per-shard", "2"]) == 0
    assert not (tmp_path / "dst2" / "linked").exists() and (tmp_path / "dst2" / "good" / "zarr.json").exists()
    capsys.readouterr()
    assert main(["verify", str(src), str(tmp_path / "dst2"), "--skip-damaged"]) == 0
    assert "1 damaged array skipped" in capsys.readouterr().out
    for p in list((tmp_path / "dst2" / "good").rglob("*"))[::-1]:
        p.unlink() if p.is_file() else p.rmdir()
    (tmp_path / "dst2" / "good").rmdir()
    assert main(["verify", str(src), str(tmp_path / "dst2"), "--skip-damaged"]) == 9
    assert "good/zarr.json: missing" in capsys.readouterr().err


# --------------------------------------------------------------------------- item 12

MIB = 1 << 20
#: chunks per shard: a 32 MiB index (2**21 entries of 16 bytes)
CPS = (2048, 1024)
N_SHARDS = 12


def _big_index_store(root: Path, *, bad_first: bool = False) -> None:
    """An array of ``N_SHARDS`` shards, each nothing but an empty 32 MiB index and zarrita's
    hidden CRC32C (the index codecs undeclared, so every tail is read to decide them)."""
    write_2023(root, "a", np.zeros((2, 6), dtype="u1"), chunks=(1, 1), cps=(2, 1), absent=frozenset(
        np.ndindex(2, 6)))
    doc = json.loads((root / "a" / "zarr.json").read_text())
    doc["shape"] = [CPS[0] * 2, CPS[1] * 6]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = list(CPS)
    (root / "a" / "zarr.json").write_text(json.dumps(doc))
    index = b"\xff" * (16 * CPS[0] * CPS[1])
    blob = index + crc32c.crc32c(index).to_bytes(4, "little")
    for i, j in np.ndindex(2, 6):
        target = root / "a" / "c" / str(i) / str(j)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob if not (bad_first and (i, j) == (0, 0)) else blob[:-1] + b"\x00")


CHILD = r"""
import json, sys
from sharding_store.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as status:
    hwm = [line for line in status if line.startswith("VmHWM:")][0]
print("RESULT " + json.dumps({"code": code, "maxrss_mb": int(hwm.split()[1]) / 1024}), flush=True)
"""


def _child(tmp_path: Path, *args: str) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the child died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow  # a large store and the peak resident set
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc for the peak resident set")
def test_planning_holds_a_bounded_number_of_shard_tails(tmp_path):
    """12 shards of 32 MiB indices: holding every tail at once is 384 MiB beyond the
    interpreter; the bounded batches hold one or two."""
    src = tmp_path / "src"
    _big_index_store(src)
    baseline = _child(tmp_path, "info", str(tmp_path / "missing"))
    got = _child(tmp_path, "info", str(src))
    assert got["code"] == 0, got
    assert got["maxrss_mb"] - baseline["maxrss_mb"] < 200, (baseline, got)


def test_the_first_bad_shard_stops_the_reading(tmp_path):
    src = tmp_path / "src"
    _big_index_store(src, bad_first=True)
    inner = CountingInner(str(src))
    objects = sorted(inner.inner.list_sized("a/c/"))
    with pytest.raises(ShardCorruptError) as e:
        decide_reading(inner, "a", objects, CPS[0] * CPS[1])
    assert e.value.key == "a/c/0/0"
    assert inner.ranges < N_SHARDS and inner.bytes_read < 4 * 32 * MIB


@pytest.mark.slow  # a large store and the peak resident set
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc for the peak resident set")
def test_migrate_planning_holds_a_bounded_number_of_shard_tails(tmp_path):
    """The copy driver decides the undeclared index as ``info`` does: in byte-bounded
    batches (a dry run plans every array, deciding its index, and writes nothing)."""
    src = tmp_path / "src"
    _big_index_store(src)
    baseline = _child(tmp_path, "info", str(tmp_path / "missing"))
    got = _child(tmp_path, "migrate", str(src), str(tmp_path / "dst"), "--dry-run")
    assert got["code"] == 0, got
    assert got["maxrss_mb"] - baseline["maxrss_mb"] < 200, (baseline, got)
    assert not (tmp_path / "dst").exists()
