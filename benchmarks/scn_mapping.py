"""Scenario 11 "mapping" (issue 26): ``migrate(mapping, sink, verify=False)`` of a plain ``MutableMapping``.

The source is a store written by zarr-python 2.18 (40k compact zstd shards of 2x2 chunks,
``DirectoryStoreV3``, written once in the legacy venv, outside timing), loaded into a plain
``dict`` (no ``list_sized``: the listing has no sizes), and migrated into a sink (documents
kept, shards counted and dropped). Beside it, the same objects behind a mapping that lists
itself sorted with sizes (``list_sized``: the project's synthetic store's path). Each run is
a fresh child process reporting wall and CPU µs per shard and its peak RSS (VmHWM); with
``--old PATH`` the same children run on an older tree, interleaved. The RSS row at 1M
shards migrates a plain mapping that generates its objects (scn_scale's store with its
``list_sized`` hidden), so what is measured is the migration's memory, not the source's.

    python benchmarks/scn_mapping.py compare --old /tmp/old-tree --repeat 5
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LEGACY_PY = ROOT / "compat" / ".venv-legacy" / "bin" / "python"
SIDE = 200  # SIDE x SIDE shards: 40k
US_TARGET = 50.0
RSS_TARGET_MB = 120.0

WRITE_218 = """
import sys, warnings
warnings.simplefilter("ignore")
import numpy as np, numcodecs, zarr
from zarr._storage.v3 import DirectoryStoreV3
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer
dst, side = sys.argv[1], int(sys.argv[2])
z = zarr.create((side * 4, side * 4), chunks=(2, 2), dtype="<u2", store=DirectoryStoreV3(dst), path="a",
                zarr_version=3, compressor=numcodecs.Zstd(level=1), fill_value=0,
                storage_transformers=[ShardingStorageTransformer("indexed", chunks_per_shard=(2, 2))])
z[...] = (np.arange(side * 4 * side * 4, dtype=np.uint32) % 65521).astype("<u2").reshape(side * 4, side * 4)
"""


def source_218(path: Path, side: int = SIDE) -> Path:
    """The zarr-python 2.18 store (written once; a finished one is reused)."""
    done = path / ".complete"
    if done.exists():
        return path
    env = {**os.environ, "ZARR_V3_EXPERIMENTAL_API": "1", "ZARR_V3_SHARDING": "1"}
    subprocess.run([str(LEGACY_PY), "-c", WRITE_218, str(path), str(side)], env=env, check=True)
    done.write_text("")
    return path


def load_dict(root: Path) -> dict[str, bytes]:
    """Every object of a directory store as a plain dict (keys relative to ``root``)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            key = p.relative_to(root).as_posix()
            if not key.startswith("."):
                out[key] = p.read_bytes()
    return out


class SizedMapping(MutableMapping):  # type: ignore[type-arg]
    """A dict's objects behind a mapping that lists itself sorted with sizes (``list_sized``)."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data

    def __getitem__(self, key: str) -> bytes:
        return self.data[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int]]:
        return ((k, len(self.data[k])) for k in sorted(k for k in self.data if k.startswith(prefix)))


class PlainGenerated(MutableMapping):  # type: ignore[type-arg]
    """scn_scale's generated store as a plain mapping: ``__iter__`` and ``__getitem__`` only."""

    def __init__(self, n: int) -> None:
        from scn_scale import SyntheticDraft

        self.inner = SyntheticDraft(n)

    def __getitem__(self, key: str) -> bytes:
        return self.inner[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        raise TypeError("read-only")

    def __delitem__(self, key: str) -> None:
        raise TypeError("read-only")

    def __iter__(self) -> Iterator[str]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def vmhwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1000
    raise RuntimeError("no VmHWM")


def child(mode: str, arg: str) -> dict[str, Any]:
    """One migration in this process: ``plain``/``sized`` of the 2.18 store at ``arg``, or
    ``generated`` of ``arg`` shards."""
    from scn_scale import Sink

    from sharding_store.ops.migration import migrate

    if mode == "generated":
        src: Any = PlainGenerated(int(arg))
    else:
        data = load_dict(Path(arg))
        src = data if mode == "plain" else SizedMapping(data)
    n = sum(1 for k in (src.data if mode == "sized" else src) if "/c" in k) if mode != "generated" else int(arg)
    dst = Sink()
    before = vmhwm_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    migrate(src, dst, verify=False, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert dst.dropped == n, (dst.dropped, n)
    return {"mode": mode, "n": n, "us": wall / n * 1e6, "cpu_us": cpu / n * 1e6, "peak_rss_mb": vmhwm_mb(),
            "rss_before_mb": before}


def run_child(mode: str, arg: str, tree: Path | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree or ROOT), str(HERE)])}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "child", mode, arg], env=env,
                       capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise RuntimeError(f"mapping child {mode} ({tree or ROOT}) failed: {r.stderr.strip()[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(work: Path, old: Path | None, repeat: int, sizes: tuple[int, ...] = (300_000, 1_000_000),
            side: int = SIDE) -> dict:
    """Interleaved runs: plain and sized on this tree (and plain on ``old``), then the RSS runs
    (``side``/``sizes`` smaller for ``run.py --quick``)."""
    src = str(source_218(work / f"m{side * side}-218.zr3", side))
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "sized": [], "plain-old": []}
    for _ in range(repeat):
        runs["plain"].append(run_child("plain", src))
        runs["sized"].append(run_child("sized", src))
        if old is not None:
            runs["plain-old"].append(run_child("plain", src, old))
    rss = {n: run_child("generated", str(n)) for n in sizes}
    return {"runs": runs, "rss": rss, "load": os.getloadavg()}


@dataclass(frozen=True)
class MappingCase:
    """What a results row says about its case (run.py's ``Case`` fields ``make_row`` reads)."""

    n: int
    what: str

    @property
    def size_label(self) -> str:
        return f"{self.n // 1_000_000}M shards" if self.n >= 1_000_000 else f"{self.n // 1000}k shards"

    @property
    def label(self) -> str:
        return self.what

    @property
    def key(self) -> str:
        return f"mapping-{self.n}"


def _m(runs: list[dict[str, Any]], field: str) -> dict[str, Any]:
    values = [r[field] for r in runs]
    return {"median": statistics.median(values) if values else None, "runs": values}


def rows(result: dict, make_row: Any) -> list[dict[str, Any]]:
    """Results rows (prefix "11 mapping")."""
    runs, out = result["runs"], []
    n = runs["plain"][0]["n"]
    case = MappingCase(n, "u2/zstd/cps 2x2, compact, written by zarr-python 2.18; dict → sink")
    cpu = f"CPU {statistics.median(r['cpu_us'] for r in runs['plain']):.0f} µs/shard"
    out.append(make_row("11 mapping", case, "migrate(dict) µs/shard (wall)", _m(runs["plain"], "us"),
                        f"limit {US_TARGET:.0f} µs", {"median": US_TARGET, "runs": []}, target=f"≤ {US_TARGET:.0f} µs",
                        min_speedup=1.0, unit="µs", note=f"child process per run, verify off; {cpu}"))
    out.append(make_row("11 mapping", case, "migrate(dict) µs/shard (wall)", _m(runs["plain"], "us"),
                        "the same objects with list_sized", _m(runs["sized"], "us"), unit="µs",
                        note="interleaved; the project's synthetic store's path (sizes listed)"))
    if runs["plain-old"]:
        out.append(make_row("11 mapping", case, "migrate(dict) µs/shard, this tree", _m(runs["plain"], "us"),
                            "old tree", _m(runs["plain-old"], "us"), unit="µs",
                            note=f"interleaved; CPU {statistics.median(r['cpu_us'] for r in runs['plain-old']):.0f} "
                                 "µs/shard on the old tree"))
    for n_rss, r in result["rss"].items():
        rc = MappingCase(int(n_rss), "u1/none/cps 2x2, generated plain mapping (no list_sized) → sink")
        out.append(make_row("11 mapping RSS", rc, "peak RSS (VmHWM), migrate", {"median": r["peak_rss_mb"],
                            "runs": [r["peak_rss_mb"]]}, f"limit {RSS_TARGET_MB:.0f} MB",
                            {"median": RSS_TARGET_MB, "runs": []}, target=f"≤ {RSS_TARGET_MB:.0f} MB",
                            min_speedup=1.0, unit="MB", note=f"one run; before migrating {r['rss_before_mb']:.0f} MB; "
                                                             f"{r['us']:.0f} µs/shard wall"))
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(child(argv[1], argv[2])))
        return 0
    if argv[:1] == ["compare"]:
        old = Path(argv[argv.index("--old") + 1]) if "--old" in argv else None
        repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 5
        work = Path(argv[argv.index("--work") + 1]) if "--work" in argv else Path("/tmp/bench-mapping")
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(compare(work, old, repeat)))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
