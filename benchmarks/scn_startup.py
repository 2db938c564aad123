"""Scenario 12 "startup" (issue 26): what a command costs before and around its work.

* ``sharding-store info samples/zarr-2.18-sharded.zr3`` (2 MiB, written by zarr-python 2.18)
  against ``python -c pass``, whole processes timed from outside, interleaved, n runs; the
  median and the best run (on a loaded machine the best run is the closest to an idle
  one). Where valgrind is installed, also the instructions each executes (callgrind's
  ``Ir``): a count the load of the machine does not move.
* ``sharding-store migrate SRC DST`` (verifies) of 128 MiB written by zarr-python 2.18
  (u2, blosc-lz4, 256x256 chunks, 4x4 per shard; written once in the legacy venv) against
  ``cp -r SRC``, each after a ``sync``, interleaved.

With ``--old PATH`` (an older tree) the commands also run on it (``PYTHONPATH``), interleaved.

    python benchmarks/scn_startup.py compare --old /tmp/old-tree --repeat 7
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SAMPLE = ROOT / "samples" / "zarr-2.18-sharded.zr3"
LEGACY_PY = ROOT / "compat" / ".venv-legacy" / "bin" / "python"
CLI = Path(sys.executable).parent / "sharding-store"
INFO_TARGET_S = 0.200
MIGRATE_TARGET = 2.0  # × cp -r

WRITE_128 = """
import sys, warnings
warnings.simplefilter("ignore")
import numpy as np, numcodecs, zarr
from zarr._storage.v3 import DirectoryStoreV3
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer
n = int(sys.argv[2])
z = zarr.create((n, n), chunks=(256, 256), dtype="<u2", store=DirectoryStoreV3(sys.argv[1]), path="a", zarr_version=3,
                compressor=numcodecs.Blosc("lz4", 5, shuffle=1), fill_value=0,
                storage_transformers=[ShardingStorageTransformer("indexed", chunks_per_shard=(4, 4))])
rng = np.random.default_rng(1)
xx = np.arange(n, dtype=np.float32)[None, :]
for r in range(0, n, 1024):
    yy = np.arange(r, r + 1024, dtype=np.float32)[:, None]
    block = 1000 + 500 * np.sin(xx / 300) * np.cos(yy / 200) + rng.normal(0, 30, (1024, n))
    z[r:r + 1024] = np.clip(block, 0, 65535).astype("<u2")
"""


def source_128(path: Path, n: int = 8192) -> Path:
    """The 128 MiB store (``n`` x ``n`` u2) written by zarr-python 2.18 (once; a finished one is reused)."""
    done = path.with_name(path.name + ".complete")
    if not done.exists():
        shutil.rmtree(path, ignore_errors=True)
        env = {**os.environ, "ZARR_V3_EXPERIMENTAL_API": "1", "ZARR_V3_SHARDING": "1"}
        subprocess.run([str(LEGACY_PY), "-c", WRITE_128, str(path), str(n)], env=env, check=True)
        done.write_text("")
    return path


def _env(tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def timed(argv: list[str], tree: Path | None = None, sync: bool = False) -> float:
    """Wall seconds of one whole command (run from a neutral directory: the tree given is
    the one imported)."""
    if sync:
        os.sync()
    t0 = time.perf_counter()
    subprocess.run(argv, env=_env(tree), cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def instructions(argv: list[str], tree: Path | None = None) -> int | None:
    """Instructions one run executes (callgrind ``Ir``), None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv], env=_env(tree),
                       cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return None


def compare(work: Path, old: Path | None, repeat: int, n: int = 8192, count: bool = True) -> dict[str, Any]:
    """Both measurements, interleaved (``n``: the migrated array's side; ``count``: callgrind runs)."""
    for tree in (ROOT, old):  # as an installed package has it: bytecode compiled (PYTHONDONTWRITEBYTECODE may be set)
        if tree is not None:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "sharding_store")],
                           stdout=subprocess.DEVNULL, check=False)
    pass_argv = [sys.executable, "-c", "pass"]
    info_argv = [str(CLI), "info", str(SAMPLE)]
    trees: dict[str, Path | None] = {"new": ROOT, **({"old": old} if old is not None else {})}
    info: dict[str, list[float]] = {"pass": [], **{k: [] for k in trees}}
    for _ in range(repeat):
        info["pass"].append(timed(pass_argv))
        for name, tree in trees.items():
            info[name].append(timed(info_argv, tree))
    ir = {"pass": instructions(pass_argv), **{k: instructions(info_argv, t) for k, t in trees.items()}} if count else {}
    src = source_128(work / f"m{n}-218.zr3", n)
    mig: dict[str, list[float]] = {"cp -r": [], **{k: [] for k in trees}}
    dst = work / "dst"
    for _ in range(repeat):
        for name, argv, tree in (("cp -r", ["cp", "-r", str(src), str(dst)], None),
                                 *((k, [str(CLI), "migrate", str(src), str(dst), "--no-progress"], t)
                                   for k, t in trees.items())):
            shutil.rmtree(dst, ignore_errors=True)
            mig[name].append(timed(argv, tree, sync=True))
            shutil.rmtree(dst, ignore_errors=True)
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    mig_ir = {k: _migrate_instructions(src, dst, t) for k, t in trees.items()} if count else {}
    return {"info": info, "instructions": ir, "migrate": mig, "migrate_instructions": mig_ir, "src_bytes": size,
            "load": os.getloadavg()}


def _migrate_instructions(src: Path, dst: Path, tree: Path | None) -> int | None:
    """Instructions of one ``migrate`` (verifying) of ``src``: its user-space work, start-up
    included (the kernel's copy is not counted), whatever the load of the machine."""
    shutil.rmtree(dst, ignore_errors=True)
    try:
        return instructions([str(CLI), "migrate", str(src), str(dst), "--no-progress"], tree)
    finally:
        shutil.rmtree(dst, ignore_errors=True)


@dataclass(frozen=True)
class StartupCase:
    """What a results row says about its case (run.py's ``Case`` fields ``make_row`` reads)."""

    size_label: str
    label: str
    key: str


def _m(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values) if values else None, "runs": values}


def rows(result: dict[str, Any], make_row: Any) -> list[dict[str, Any]]:
    """Results rows (prefix "12 startup")."""
    info, ir, mig = result["info"], result["instructions"], result["migrate"]
    case = StartupCase("2 MiB", "samples/zarr-2.18-sharded.zr3 (zarr-python 2.18)", "startup-info")
    best = {k: min(v) for k, v in info.items() if v}
    count = "" if ir.get("new") is None else (
        f"; instructions (callgrind): {ir['new'] / 1e6:.0f} M"
        + (f" vs {ir['old'] / 1e6:.0f} M old tree" if ir.get("old") else "") + f", python -c pass {ir['pass'] / 1e6:.0f} M")
    out = [make_row("12 startup", case, "sharding-store info", _m(info["new"]), f"limit {INFO_TARGET_S * 1e3:.0f} ms",
                    {"median": INFO_TARGET_S, "runs": []}, target=f"≤ {INFO_TARGET_S * 1e3:.0f} ms", min_speedup=1.0,
                    note=f"whole process, best run {best['new'] * 1e3:.0f} ms{count}"),
           make_row("12 startup", case, "sharding-store info", _m(info["new"]), "python -c pass", _m(info["pass"]),
                    note=f"interleaved; best runs {best['new'] * 1e3:.0f} vs {best['pass'] * 1e3:.0f} ms")]
    if info.get("old"):
        out.append(make_row("12 startup", case, "sharding-store info, this tree", _m(info["new"]), "old tree",
                            _m(info["old"]), note=f"interleaved; best runs {best['new'] * 1e3:.0f} vs "
                                                  f"{best['old'] * 1e3:.0f} ms"))
    mcase = StartupCase(f"{result['src_bytes'] / 2**20:.0f} MiB", "u2/blosc-lz4/cps 4x4, written by zarr-python 2.18",
                        "startup-migrate")
    mir = result.get("migrate_instructions") or {}
    mcount = "" if mir.get("new") is None else (
        f"; instructions (callgrind, user space): {mir['new'] / 1e6:.0f} M"
        + (f" vs {mir['old'] / 1e6:.0f} M old tree" if mir.get("old") else ""))
    out.append(make_row("12 startup", mcase, "sharding-store migrate (verifies)", _m(mig["new"]), "cp -r",
                        _m(mig["cp -r"]), target=f"≤ {MIGRATE_TARGET:g}× cp -r", min_speedup=1 / MIGRATE_TARGET,
                        note=f"whole commands, each after sync, interleaved{mcount}"))
    if mig.get("old"):
        out.append(make_row("12 startup", mcase, "sharding-store migrate, this tree", _m(mig["new"]), "old tree",
                            _m(mig["old"]), note="interleaved"))
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["compare"]:
        old = Path(argv[argv.index("--old") + 1]) if "--old" in argv else None
        repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 7
        work = Path(argv[argv.index("--work") + 1]) if "--work" in argv else Path("/tmp/bench-startup")
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(compare(work, old, repeat)))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
