#!/usr/bin/env python
"""sharding-store benchmarks (issue #6): one command, results in benchmarks/results.{md,json} and plot-*.png.

    .venv/bin/python benchmarks/run.py                 # full run (what `make bench` does)
    .venv/bin/python benchmarks/run.py --quick         # < 60 s smoke run (writes under .data/quick/)
    .venv/bin/python benchmarks/run.py --only migrate --only reshard   # re-run some scenarios
    .venv/bin/python benchmarks/run.py --sizes 32,128 --repeat 3

Every competitor runs in its own subprocess (project venv: benchmarks/_worker.py;
zarr-python 2.18.7: benchmarks/_legacy_worker.py in compat/.venv-legacy) and times only
its own operation, except the command-line scenarios (migrate, reshard, cp -r), which
are timed as whole commands. Competitors of one scenario run interleaved (rotating
order) after one warm-up run each; we report medians and ratios from the same run.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plots

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = Path(sys.executable)
VENV_BIN = PY.parent
LEGACY_PY = Path(os.environ.get("LEGACY_VENV", ROOT / "compat" / ".venv-legacy")) / "bin" / "python"
WORKER = HERE / "_worker.py"
LEGACY_WORKER = HERE / "_legacy_worker.py"
DATA = HERE / ".data"
TIME_BIN = shutil.which("time", path="/usr/bin:/bin")
SCENARIOS = ("write", "read", "chunk", "migrate", "reshard", "gen2023", "scale", "latency", "xarray", "virtual",
             "mapping", "startup")
TASK_TIMEOUT = 1200
#: CPU busy (% of all cores, sampled while this benchmark is idle) before each run
LOADS: list[float] = []
QUIET_PCT = 35.0  # wait while others keep more than ~0.7 of the 2 cores busy ...
QUIET_MAX_WAIT_S = 2.0  # ... but never longer than this before one run
WAITED: list[float] = []


def psutil_busy() -> float:
    import psutil

    return psutil.cpu_percent(interval=None)


def wait_quiet() -> float:
    """Other people's work shares these 2 cores: before a run, wait (bounded) until the
    machine is mostly idle; return the CPU busy % seen last."""
    import psutil

    t0 = time.perf_counter()
    busy = psutil.cpu_percent(interval=0.15)
    while busy > QUIET_PCT and time.perf_counter() - t0 < QUIET_MAX_WAIT_S:
        time.sleep(0.5)
        busy = psutil.cpu_percent(interval=0.15)
    WAITED.append(time.perf_counter() - t0)
    return busy

# -------------------------------------------------------------------------------- matrix

DTYPES = {"u2": ("uint16", 2), "f4": ("float32", 4)}
CODEC_NAMES = {"lz4": "blosc-lz4", "zstd": "zstd"}
INNER = (64, 64)


@dataclass(frozen=True)
class Case:
    size_mib: int
    dtype: str  # "u2" | "f4"
    codec: str  # "lz4" | "zstd"
    cps: int  # chunks per shard (square: cps = k*k)

    @property
    def cps2(self) -> tuple[int, int]:
        k = math.isqrt(self.cps)
        assert k * k == self.cps, self.cps
        return (k, k)

    @property
    def shape(self) -> tuple[int, int]:
        n = self.size_mib * 2**20 // DTYPES[self.dtype][1]
        side = math.isqrt(n)
        if side * side == n:
            return (side, side)
        rows = math.isqrt(2 * n)
        return (rows, n // rows)  # 2:1, still powers of two for power-of-two sizes

    @property
    def label(self) -> str:
        return f"{DTYPES[self.dtype][0]}/{CODEC_NAMES[self.codec]}/{self.cps}"

    @property
    def key(self) -> str:
        return f"{self.size_mib}MiB-{self.dtype}-{self.codec}-cps{self.cps}"

    @property
    def size_label(self) -> str:
        return f"{self.size_mib} MiB"

    @property
    def inner(self) -> tuple[int, int]:
        return INNER

    @property
    def legacy_source(self) -> bool:
        """The draft source of scenarios 2-5 is written by zarr-python 2.18, not by our writer."""
        return False

    @property
    def raw_shard_bytes(self) -> int:
        return self.inner[0] * self.inner[1] * self.cps * DTYPES[self.dtype][1]

    @property
    def raw_chunk_bytes(self) -> int:
        return self.inner[0] * self.inner[1] * DTYPES[self.dtype][1]


@dataclass(frozen=True)
class LegacyGridCase(Case):
    """A store of ``shards`` shards of ``cps`` chunks of ``chunk`` elements, written by
    zarr-python 2.18 (its own layout: in each shard the chunk written last comes first,
    the others in the order of a Python set, not in grid order)."""

    chunk: tuple[int, int] = INNER
    shards: tuple[int, int] = (1, 1)

    @property
    def inner(self) -> tuple[int, int]:
        return self.chunk

    @property
    def legacy_source(self) -> bool:
        return True

    @property
    def shape(self) -> tuple[int, int]:
        k = self.cps2
        return (self.shards[0] * k[0] * self.chunk[0], self.shards[1] * k[1] * self.chunk[1])

    @property
    def label(self) -> str:
        return f"{super().label}, {self.chunk[0]}x{self.chunk[1]} chunks, zarr 2.18"

    @property
    def key(self) -> str:
        return f"{super().key}-{self.chunk[0]}x{self.chunk[1]}-legacy"


def matrix(sizes: list[int]) -> list[Case]:
    """Small size: three configurations, covering both dtypes, both codecs, both cps
    (uint16+blosc-lz4 at 16 and 256, float32+zstd at 256). Large size: two, again
    covering each value once (uint16+blosc-lz4 at 256, float32+zstd at 16)."""
    small, *rest = sorted(sizes)
    cases = [Case(small, "u2", "lz4", 16), Case(small, "u2", "lz4", 256), Case(small, "f4", "zstd", 256)]
    for size in rest:
        cases += [Case(size, "u2", "lz4", 256), Case(size, "f4", "zstd", 16)]
    return cases


#: issue 15 states its read target (≤ the time of zarr-python 3 with the zarrs codec
#: pipeline, on the migrated copy) for this case: uint16, blosc-lz4, 64×64 chunks, 105 MiB
#: (16 chunks per shard); scenario 2 runs it beside the matrix
READ_EXTRA = (Case(105, "u2", "lz4", 16),)
ZARRS_TARGET_KEYS = {c.key for c in READ_EXTRA}


#: the read and migrate targets (issues 3 and 4) are stated for a 128 MiB array/store;
#: smaller cases report their ratios without a target (interpreter start-up and fixed
#: per-run costs weigh more there)
TARGET_MIB = 128
STATED_AT = f"target stated for {TARGET_MIB} MiB and more: ratio shown without it"


#: cases a scenario runs beyond the size matrix (not with --quick; --case selects among them too).
#: reshard: the case issue 15 states its target at (833 MiB on disk, 4096 shards of 4x4 chunks,
#: resharded to 16x16: ``reshard SRC DST --chunks-per-shard 16,16``)
#: issue 26 states its reshard target (≤ 1.2× cp -r) at a store written by zarr-python 2.18:
#: 1024 shards of 8x8 uint16/blosc-lz4 chunks, ~833 MiB on disk (100x104 chunks: 1300 MiB raw)
RESHARD_LEGACY = LegacyGridCase(1300, "u2", "lz4", 64, chunk=(100, 104), shards=(32, 32))
#: issue 26 states its S3 targets (full read <= tensorstore, open + one chunk <= tensorstore) at a
#: store written by zarr-python 2.18: 105 MiB uint16/blosc-lz4, 128 shards of 8x8 chunks
LATENCY_LEGACY = LegacyGridCase(105, "u2", "lz4", 64, chunk=(80, 84), shards=(8, 16))
EXTRA_CASES: dict[str, list[Case]] = {"reshard": [Case(1024, "f4", "zstd", 16), RESHARD_LEGACY],
                                      "latency": [LATENCY_LEGACY],
                                      "migrate": [Case(105, "u2", "lz4", 16), Case(1024, "f4", "zstd", 16)]}
#: issue 15's targets for ``sharding-store migrate`` as a whole command (interpreter start-up,
#: imports and verification included) against ``cp -r`` of the source, by case key: the 105 MiB
#: uint16/blosc-lz4/16 store (67 MiB, 861 shards on disk) and the 833 MiB store of the reshard
#: case (1024 MiB float32/zstd/16, 4096 shards)
WHOLE_COMMAND_TARGETS = {"105MiB-u2-lz4-cps16": 2.0, "1024MiB-f4-zstd-cps16": 1.2}
#: a tree (PYTHONPATH) whose `sharding-store reshard` is timed beside ours in scenario 5, e.g. the
#: tree before a change: RESHARD_BASELINE=/tmp/old-tree benchmarks/run.py --only reshard
RESHARD_BASELINE_ENV = "RESHARD_BASELINE"


#: zarr 2.18 rewrites the whole shard for every inner chunk it writes (and builds it by
#: repeated ``bytes +=``): a write costs ~O(cps) shard rewrites per chunk. Above this
#: many MiB *and* more than 16 chunks per shard, one 2.18 write takes ~10 min: skipped.
LEGACY_WRITE_MAX_MIB_AT_HIGH_CPS = 64


# -------------------------------------------------------------------------------- processes


class TaskError(RuntimeError):
    pass


def _env(legacy: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    # env README: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE slow a current numpy; for a benchmark
    # unset both together, in the benchmark's own processes only.
    if "OPENBLAS_CORETYPE" in env or "OPENBLAS_L2_SIZE" in env:
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    # an installed package has its bytecode cached; a sandbox that forbids writing it
    # would make every timed process of ours compile ~9k lines first (the libraries we
    # compare with were byte-compiled by pip at install time)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if legacy:
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
            env.pop(var, None)
        env.update(ZARR_V3_EXPERIMENTAL_API="1", ZARR_V3_SHARDING="1", PYTHONNOUSERSITE="1",
                   PYTHONWARNINGS="ignore")
    return env


#: every timed process runs at this nice value (root only; otherwise unchanged): other people's
#: test runs on the same 2 cores then disturb the measurement much less. Same for all competitors.
NICE = -10


def _prio() -> None:
    try:
        os.nice(NICE)
    except OSError:  # not root: run at normal priority
        pass


def run_task(spec: dict, legacy: bool = False, timeout: float = TASK_TIMEOUT) -> dict:
    py, script = (LEGACY_PY, LEGACY_WORKER) if legacy else (PY, WORKER)
    if legacy and not py.exists():
        raise TaskError(f"legacy venv missing ({py}); run: bash compat/setup_legacy.sh")
    try:
        proc = subprocess.run([str(py), str(script), json.dumps(spec)], env=_env(legacy), capture_output=True,
                              text=True, timeout=timeout, cwd=str(ROOT), preexec_fn=_prio)
    except subprocess.TimeoutExpired:
        raise TaskError(f"timeout after {timeout:.0f} s") from None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise TaskError(f"exit {proc.returncode}: {tail}")


def run_command(argv: list[str], timeout: float = TASK_TIMEOUT) -> dict:
    """Run a whole command; wall seconds (measured here) and peak RSS (GNU time -v, or
    getrusage of children when /usr/bin/time is missing)."""
    import resource

    with tempfile.NamedTemporaryFile("r", suffix=".time", delete=False) as tf:
        tpath = tf.name
    cmd = ([TIME_BIN, "-f", "%M", "-o", tpath] if TIME_BIN else []) + argv
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
                              preexec_fn=_prio)
    except subprocess.TimeoutExpired:
        raise TaskError(f"timeout after {timeout:.0f} s") from None
    dt = time.perf_counter() - t0
    try:
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise TaskError(f"{Path(argv[0]).name} exit {proc.returncode}: {tail}")
        rss_kb = None
        if TIME_BIN:
            text = Path(tpath).read_text().strip().splitlines()
            rss_kb = int(text[-1]) if text and text[-1].isdigit() else None
        else:  # only a lower bound of this child's peak if an earlier child was bigger
            after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            rss_kb = after if after > before else None
        return {"seconds": dt, "rss_mb": None if rss_kb is None else rss_kb / 1024}
    finally:
        os.unlink(tpath)


def du_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -------------------------------------------------------------------------------- measuring


@dataclass
class Competitor:
    name: str
    fn: Callable[[bool], dict]  # fn(verify) -> {"seconds": ..., ...}
    repeat: int | None = None  # None: the run's --repeat
    warmup: bool = True
    skip: str | None = None  # reason it does not run ("not available: ...")
    budget: float | None = None  # stop repeating once this many timed seconds are spent (None: run default)


#: a warm-up run longer than this counts as the first timed run (warm-up effects -- imports,
#: page cache of the input -- are < 1 % of it, and such runs are what make the budget tight)
LONG_RUN_S = 10.0
#: default per-competitor budget of timed seconds per case (at least one timed run always)
BUDGET_S = 25.0
#: the same for competitors that only give context (no target depends on them)
INFO_BUDGET_S = 12.0
#: for slow anchors of a target (the re-encoder: ~9 s a run at 128 MiB), enough for every round
ANCHOR_BUDGET_S = 75.0


def measure(comps: list[Competitor], repeat: int, warmup: bool, log: Callable[[str], None]) -> dict[str, dict]:
    """Warm-up (verifying) once each, then `repeat` rounds, rotating the order each round."""
    out: dict[str, dict] = {c.name: {"runs": [], "extra": [], "error": c.skip, "verified": None} for c in comps}
    live = [c for c in comps if c.skip is None]

    def one(c: Competitor, verify: bool) -> dict | None:
        # the previous run's writes and deletions are still being written back: flush them
        # first, or whoever follows a heavy writer pays for its writeback (in the rotating
        # order `migrate` always came right after the re-encoder, and ran ~10 % slower there)
        os.sync()
        LOADS.append(wait_quiet() if QUIET_MAX_WAIT_S > 0 else psutil_busy())
        try:
            r = c.fn(verify)
        except TaskError as e:
            out[c.name]["error"] = f"error: {e}"
            log(f"    {c.name}: ERROR {e}")
            return None
        if verify and "verified" in r:
            out[c.name]["verified"] = r["verified"]
            if not r["verified"]:
                out[c.name]["error"] = "error: output differs from the input"
                log(f"    {c.name}: VERIFY FAILED")
        return r

    verified_once: set[str] = set()

    def keep(c: Competitor, r: dict) -> None:
        out[c.name]["runs"].append(r["seconds"])
        out[c.name]["extra"].append({k: v for k, v in r.items() if k not in ("seconds", "verified")})
        log(f"    {c.name}: {r['seconds']:.3f} s" + (f", {r['rss_mb']:.0f} MB" if r.get("rss_mb") else ""))

    if warmup:
        for c in live:
            if c.warmup:
                r = one(c, verify=True)
                verified_once.add(c.name)
                if r is not None and out[c.name]["error"] is None and r["seconds"] > LONG_RUN_S:
                    out[c.name]["warmup_kept"] = True
                    keep(c, r)
    rounds = max([c.repeat or repeat for c in live] or [0])
    for rnd in range(rounds):
        order = live[rnd % len(live):] + live[: rnd % len(live)] if live else []
        for c in order:
            runs = out[c.name]["runs"]
            budget = c.budget if c.budget is not None else BUDGET_S
            if out[c.name]["error"] or len(runs) >= (c.repeat or repeat) or (runs and sum(runs) >= budget):
                continue
            r = one(c, verify=c.name not in verified_once)
            verified_once.add(c.name)
            if r is not None and out[c.name]["error"] is None:
                keep(c, r)
    for _name, m in out.items():
        m["median"] = statistics.median(m["runs"]) if m["runs"] and not m["error"] else None
    return out


# -------------------------------------------------------------------------------- rows


def cpu_note(m: dict[str, dict], names: Sequence[str]) -> str:
    """``; CPU (user+sys, all threads) medians: ...`` of the competitors whose runs report
    ``cpu_s`` (the read workers): wall times on a loaded machine favour the reader with
    more threads, CPU time is what the reader costs."""
    parts = []
    for name in names:
        cpu = [e["cpu_s"] for e in m.get(name, {}).get("extra", []) if e.get("cpu_s") is not None]
        if cpu:
            parts.append(f"{name} {fmt_num(statistics.median(cpu))}")
    return f"; CPU (user+sys, all threads, median): {', '.join(parts)}" if parts else ""


def fmt_num(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "—"
    if unit == "s":
        if v < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if v < 1:
            return f"{v * 1e3:.1f} ms"
        return f"{v:.2f} s"
    if unit == "MB":
        return f"{v:.0f} MB"
    if unit == "B":  # bytes written: binary prefixes
        for div, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if v >= div:
                return f"{v / div:.3g} {name}"
        return f"{v:.0f} B"
    return f"{v:.3g} {unit}"


def make_row(scenario: str, case: Case, ours: str, om: dict, anchor: str, am: dict | None, *,
             target: str = "—", min_speedup: float | None = None, note: str = "", unit: str = "s",
             applies: bool = True) -> dict:
    """speedup = anchor median / ours median (> 1: ours faster; for RSS: limit / peak)."""
    o, a = om.get("median"), None if am is None else am.get("median")
    speed = a / o if (o and a) else None
    if not applies or min_speedup is None:
        met = "n/a"
        target_txt = target if applies else "—"
    else:
        target_txt = target
        met = "—" if speed is None else ("yes" if speed >= min_speedup else "no")
    status = []
    if om.get("error"):
        status.append(f"ours {om['error']}")
    if am is not None and am.get("error"):
        status.append(f"anchor {am['error']}")
    return {
        "scenario": scenario, "size": case.size_label, "case": case.label, "case_key": case.key,
        "ours": ours, "ours_median": o, "ours_runs": om.get("runs", []),
        "anchor": anchor, "anchor_median": a, "anchor_runs": [] if am is None else am.get("runs", []),
        "speedup": speed, "target": target_txt, "min_speedup": min_speedup if applies else None, "met": met,
        "note": "; ".join([s for s in [note, *status] if s]), "unit": unit,
    }


# -------------------------------------------------------------------------------- the run


def _real_paths(spec: dict) -> dict:
    """A write spec with its input and destination paths resolved: the same files reached
    through a worktree whose ``.data`` links to the main checkout's are the same spec (the
    marker of a legacy source records the paths it was written with)."""
    return {k: str(Path(v).resolve()) if k in ("input", "dst") and isinstance(v, str) else v for k, v in spec.items()}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data = DATA / ("quick" if args.quick else "full")
        self.rows: list[dict] = []
        self.chunk_details: list[dict] = []
        self.notes: list[str] = []
        self.t_start = time.perf_counter()
        self.avail: dict[str, Any] = {}

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:7.1f}s] {msg}", flush=True)

    # -- availability (modules are written while the benchmark exists) --------------
    def probe(self) -> None:
        try:
            self.avail = run_task({"task": "probe"}, timeout=120)
        except TaskError as e:
            self.avail = {"available": {}, "error": str(e)}

    def has(self, *names: str) -> str | None:
        """None when all `names` exist, else 'not available: ...'."""
        missing = [n for n in names if self.avail.get("available", {}).get(n) is not True]
        return None if not missing else "not available (" + ", ".join(missing) + ")"

    # -- data --------------------------------------------------------------------------
    def input_path(self, case: Case) -> Path:
        shape = f"-{case.shape[0]}x{case.shape[1]}" if case.legacy_source else ""
        p = DATA / "input" / f"{case.size_mib}MiB-{case.dtype}{shape}.npy"
        if not p.exists():
            self.log(f"generating {p.name} {case.shape}")
            p.parent.mkdir(parents=True, exist_ok=True)
            make_input(p, case)
        return p

    def spec(self, case: Case, task: str, **kw: Any) -> dict:
        return {"task": task, "input": str(self.input_path(case)), "shape": list(case.shape), "dtype": case.dtype,
                "codec": case.codec, "chunks": list(case.inner), "cps": list(case.cps2), **kw}

    def case_dir(self, case: Case) -> Path:
        d = self.data / case.key
        d.mkdir(parents=True, exist_ok=True)
        return d

    def draft_source(self, case: Case) -> tuple[Path | None, str]:
        """The draft store read by scenarios 2-5 (written once per run, outside timing)."""
        src = self.case_dir(case) / "src-draft"
        if getattr(self, "_src_ok", {}).get(case.key):
            return src, self._src_ok[case.key]
        self._src_ok = getattr(self, "_src_ok", {})
        how = None
        if case.legacy_source:
            return self._legacy_source(case, src)
        if self.has("sharding_store.api.arrays.create_draft_array") is None:
            try:
                r = run_task(self.spec(case, "write_ours", dst=str(src), verify=True))
                if r.get("verified"):
                    how = "written by create_draft_array"
            except TaskError as e:
                self.log(f"  create_draft_array failed: {e}")
        if how is None and case.size_mib <= LEGACY_WRITE_MAX_MIB_AT_HIGH_CPS:
            run_task(self.spec(case, "write", dst=str(src), verify=True), legacy=True)
            how = "written by zarr-python 2.18"
        if how is None:
            return None, "no draft source"
        # a draft written by us must read back identically in 2.18 (cross-check, untimed)
        self._src_ok[case.key] = how
        return src, how

    def _legacy_source(self, case: Case, src: Path) -> tuple[Path | None, str]:
        """A source written by zarr-python 2.18 (and read back by it), kept between runs: 2.18
        rewrites a whole shard per chunk, minutes at this size. A marker beside it holds the
        write's spec; a store without the same marker is written again."""
        spec = self.spec(case, "write", dst=str(src), verify=True)
        marker = src.with_name(src.name + ".written-by-2.18.json")
        if not (src.exists() and marker.exists() and _real_paths(json.loads(marker.read_text())) == _real_paths(spec)):
            marker.unlink(missing_ok=True)
            self.log(f"  writing {src} with zarr-python 2.18 (minutes)")
            if not run_task(spec, legacy=True, timeout=3 * 3600).get("verified"):
                return None, "no draft source (the 2.18 write did not read back equal)"
            marker.write_text(json.dumps(spec))
        self._src_ok[case.key] = "written by zarr-python 2.18"
        return src, self._src_ok[case.key]

    def v1_copy(self, case: Case, src: Path) -> tuple[Path, str]:
        """The v1.0 copy read by tensorstore and zarr 3 in scenario 2: our migrate's output
        when it exists (same compressed payloads as the draft), else a zarr 3 write."""
        dst = self.case_dir(case) / "src-v1"
        if getattr(self, "_v1", {}).get(case.key):
            return dst, self._v1[case.key]
        self._v1 = getattr(self, "_v1", {})
        shutil.rmtree(dst, ignore_errors=True)
        how = None
        if self.has("sharding_store.cli.migrate.register") is None:
            try:
                run_command([str(VENV_BIN / "sharding-store"), "migrate", str(src), str(dst)])
                if run_task({**self.spec(case, "verify"), "src": str(dst)}).get("verified"):
                    how = "our migrate output"
            except TaskError as e:
                self.log(f"  migrate for the v1.0 copy failed: {e}")
        if how is None:
            shutil.rmtree(dst, ignore_errors=True)
            run_task(self.spec(case, "write_zarr3", dst=str(dst)))
            how = "written by zarr 3 (migrate not available)"
        self._v1[case.key] = how
        return dst, how

    def reps(self, case: Case) -> int:
        if self.args.quick:
            return 1
        if self.args.repeat:
            return self.args.repeat
        return 5 if case.size_mib <= 64 else 3

    # -- scenarios ----------------------------------------------------------------------
    def s_write(self, case: Case) -> None:
        d = self.case_dir(case)
        ours_skip = self.has("sharding_store.api.arrays.create_draft_array")
        legacy_skip = None
        if case.size_mib > LEGACY_WRITE_MAX_MIB_AT_HIGH_CPS and case.cps > 16:
            legacy_skip = (f"not run: 2.18 rewrites a whole shard per inner chunk; one write at {case.size_label}/"
                           f"cps {case.cps} would take ~{case.size_mib // 32 * 45 / 60:.0f} min (45 s per 32 MiB); "
                           "see the smaller size")
        legacy_rep = 1 if self.args.quick else min(self.reps(case), 3)
        comps = [
            Competitor("ours", lambda v: run_task(self.spec(case, "write_ours", dst=str(d / "w-ours"), verify=v)),
                       skip=ours_skip),
            Competitor("zarr-python 2.18", lambda v: run_task(
                self.spec(case, "write", dst=str(d / "w-legacy"), verify=v), legacy=True),
                repeat=legacy_rep, warmup=False, skip=legacy_skip),
            Competitor("zarr-python 3", lambda v: run_task(self.spec(case, "write_zarr3", dst=str(d / "w-zarr3"),
                                                                     verify=v)), budget=INFO_BUDGET_S),
            Competitor("tensorstore", lambda v: run_task(self.spec(case, "write_ts", dst=str(d / "w-ts"), verify=v))),
        ]
        m = measure(comps, self.reps(case), not self.args.quick, self.log)
        o = m["ours"]
        ln = "2.18 writes: no warm-up, ≤ 3 runs, no further run once 25 s of runs are spent (one run at 256 chunks/shard)"
        self.rows += [
            make_row("1 write", case, "create_draft_array + a[...]=x", o, "zarr-python 2.18", m["zarr-python 2.18"],
                     target="≥ 50× faster", min_speedup=50.0, applies=case.cps >= 256, note=ln),
            make_row("1 write", case, "create_draft_array + a[...]=x", o, "tensorstore (v1.0)", m["tensorstore"],
                     target="≤ 1.5× tensorstore's time", min_speedup=1 / 1.5),
            make_row("1 write", case, "create_draft_array + a[...]=x", o, "zarr-python 3 (v1.0)", m["zarr-python 3"]),
        ]
        for sub in ("w-ours", "w-legacy", "w-zarr3", "w-ts"):
            shutil.rmtree(d / sub, ignore_errors=True)

    def s_read(self, case: Case) -> None:
        src, how = self.draft_source(case)
        if src is None:
            return self._unavailable("2 read", case, "no draft source")
        v1, v1how = self.v1_copy(case, src)
        comps = [
            Competitor("open_draft", lambda v: run_task(self.spec(case, "read_ours", src=str(src), verify=v)),
                       skip=self.has("sharding_store.api.arrays.open_draft")),
            Competitor("open_v3", lambda v: run_task(self.spec(case, "read_v3view", src=str(src), verify=v)),
                       skip=self.has("sharding_store.api.v3view.open_v3"), budget=INFO_BUDGET_S),
            Competitor("zarr-python 2.18", lambda v: run_task(self.spec(case, "read", src=str(src), verify=v),
                                                              legacy=True), budget=INFO_BUDGET_S),
            Competitor("tensorstore", lambda v: run_task(self.spec(case, "read_ts", src=str(v1), verify=v))),
            Competitor("zarr-python 3", lambda v: run_task(self.spec(case, "read_zarr3", src=str(v1), verify=v)),
                       budget=INFO_BUDGET_S),
            # zarr-python 3 with the zarrs codec pipeline (Rust, decodes in parallel): issue 15's anchor
            Competitor("zarrs", lambda v: run_task(self.spec(case, "read_zarrs", src=str(v1), verify=v)),
                       skip=None if self.avail.get("zarrs") is True else "not available (zarrs)"),
        ]
        m = measure(comps, self.reps(case), not self.args.quick, self.log)
        note = f"draft {how}; v1.0 copy: {v1how}" + cpu_note(m, ("open_draft", "open_v3", "tensorstore", "zarrs"))
        for ours in ("open_draft", "open_v3"):
            lbl = f"{ours}(...)[...]"
            self.rows.append(make_row("2 read", case, lbl, m[ours], "tensorstore (v1.0 copy)", m["tensorstore"],
                                      target="no slower than tensorstore", min_speedup=1.0,
                                      applies=ours == "open_draft" and case.size_mib >= TARGET_MIB,
                                      note=note if case.size_mib >= TARGET_MIB else
                                      (note + "; " if note else "") + STATED_AT))
            self.rows.append(make_row("2 read", case, lbl, m[ours], "zarr-python 2.18", m["zarr-python 2.18"]))
            if ours == "open_draft":
                self.rows.append(make_row("2 read", case, lbl, m[ours], "zarr-python 3 (v1.0 copy)",
                                          m["zarr-python 3"]))
                stated = case.key in ZARRS_TARGET_KEYS
                self.rows.append(make_row("2 read", case, lbl, m[ours], "zarr-python 3 + zarrs (v1.0 copy)",
                                          m["zarrs"], target="≤ zarrs' time", min_speedup=1.0, applies=stated,
                                          note="zarr-python 3 with zarrs.ZarrsCodecPipeline (Rust, parallel decode)"
                                          + ("" if stated else "; target stated for the 105 MiB uint16/blosc-lz4/16 "
                                             "case (issue 15): ratio shown without it")))

    def s_chunk(self, case: Case) -> None:
        src, how = self.draft_source(case)
        if src is None:
            return self._unavailable("3 one chunk", case, "no draft source")
        iters = 5 if self.args.quick else 50
        res: dict[str, dict | str] = {}
        for name, legacy, task, skip in (("ours", False, "chunk_ours", self.has("sharding_store.api.arrays.open_draft")),
                                         ("zarr-python 2.18", True, "chunk", None)):
            if skip:
                res[name] = skip
                continue
            try:
                if not self.args.quick:
                    run_task(self.spec(case, task, src=str(src), iterations=5), legacy=legacy)  # warm-up
                res[name] = run_task(self.spec(case, task, src=str(src), iterations=iters), legacy=legacy)
            except TaskError as e:
                res[name] = f"error: {e}"
        index_bytes = 16 * case.cps
        bound = {"cold": (2, index_bytes + int(case.raw_chunk_bytes * 1.01) + 64),
                 "warm": (1, int(case.raw_chunk_bytes * 1.01) + 64)}
        for kind in ("cold", "warm"):
            summ = {}
            for name, r in res.items():
                if isinstance(r, str):
                    summ[name] = {"error": r, "runs": []}
                    continue
                xs = r[kind]
                summ[name] = {
                    "median": statistics.median(x["seconds"] for x in xs), "runs": [x["seconds"] for x in xs],
                    "requests": max(x["requests"] for x in xs), "bytes": max(x["bytes"] for x in xs),
                    "bytes_median": statistics.median(x["bytes"] for x in xs), "n": len(xs),
                    "error": None if r.get("verified") else "error: wrong values",
                }
            max_req, max_bytes = bound[kind]
            o = summ["ours"]
            ok = (o.get("median") is not None and o["requests"] <= max_req and o["bytes"] <= max_bytes)
            row = make_row("3 one chunk", case, f"open_draft, {kind}", o, "zarr-python 2.18", summ["zarr-python 2.18"],
                           target=f"≤ {max_req} request{'s' * (max_req > 1)}, ≤ {max_bytes:,} B read",
                           note=f"{kind}: " + ("fresh array, index not cached" if kind == "cold"
                                                 else "other chunk of the same shard right after"))
            row["met"] = "—" if o.get("median") is None else ("yes" if ok else "no")
            row["min_speedup"] = None
            self.rows.append(row)
            self.chunk_details.append({"case": case.label, "size": case.size_label, "kind": kind, **{
                name: {k: s.get(k) for k in ("median", "requests", "bytes", "bytes_median", "n", "error")}
                for name, s in summ.items()}})

    def s_migrate(self, case: Case) -> None:
        src, how = self.draft_source(case)
        if src is None:
            return self._unavailable("4 migrate", case, "no draft source")
        if case.key in WHOLE_COMMAND_TARGETS and case not in matrix(self.args.sizes):
            return self._migrate_whole_command(case, src)
        d = self.case_dir(case)
        skip = self.has("sharding_store.cli.migrate.register")
        skip_fn = self.has("sharding_store.ops.migration.migrate")
        cli = str(VENV_BIN / "sharding-store")

        def cmd(argv: list[str], dst: Path, verify: bool) -> dict:
            return self.timed_command(case, argv, dst, verify)

        def fn(dst: Path, verify: bool, migrate_verify: bool) -> dict:
            shutil.rmtree(dst, ignore_errors=True)
            r = run_task(self.spec(case, "migrate_fn", src=str(src), dst=str(dst), verify=verify,
                                   migrate_verify=migrate_verify))
            shutil.rmtree(dst, ignore_errors=True)
            return r

        def reencode(verify: bool) -> dict:
            dst = d / "m-reencode"
            spec = self.spec(case, "reencode", src=str(src), dst=str(dst))
            return cmd([str(PY), str(WORKER), json.dumps(spec)], dst, verify)

        comps = [
            Competitor("migrate", lambda v: cmd([cli, "migrate", str(src), str(d / "m-ours")], d / "m-ours", v),
                       skip=skip),
            Competitor("migrate --jobs 1", lambda v: cmd([cli, "migrate", str(src), str(d / "m-ours1"), "--jobs", "1"],
                                                         d / "m-ours1", v), skip=skip, budget=INFO_BUDGET_S),
            Competitor("migrate --no-verify", lambda v: cmd([cli, "migrate", str(src), str(d / "m-nov"), "--no-verify"],
                                                            d / "m-nov", v), skip=skip, budget=INFO_BUDGET_S),
            Competitor("migrate() no verify", lambda v: fn(d / "m-fn0", v, False), skip=skip_fn),
            Competitor("migrate() in-process", lambda v: fn(d / "m-fn", v, True), skip=skip_fn, budget=INFO_BUDGET_S),
            Competitor("cp -r", lambda v: cmd(["cp", "-r", str(src), str(d / "m-cp")], d / "m-cp", False)),
            # the anchor of a target gets as many rounds as ours (not the default budget, which
            # cut it to 3 of 5 at 128 MiB): drift of this machine over a run then moves both medians
            Competitor("re-encode", reencode, skip=self.has("sharding_store.api.arrays.open_draft"), budget=ANCHOR_BUDGET_S),
        ]
        m = measure(comps, self.reps(case), not self.args.quick, self.log)
        jobs = self.avail.get("migrate_jobs_default")
        if not isinstance(jobs, int):
            jobs = self.avail.get("migrate_DEFAULT_JOBS") if isinstance(self.avail.get("migrate_DEFAULT_JOBS"), int) \
                else None
        shard_obj = max((p.stat().st_size for p in (src / "data").rglob("*") if p.is_file()), default=0)
        note = f"whole commands incl. interpreter start-up; source {du_bytes(src) / 2**20:.0f} MiB on disk"
        fn_note = ("the copy alone, as cp -r does it: migrate() timed inside its process (no interpreter start-up "
                   "or module imports; imports the call triggers count), verify=False: no second pass reading both trees")
        stated = case.size_mib >= TARGET_MIB
        self.rows.append(make_row("4 migrate", case, "migrate() in-process, verify off", m["migrate() no verify"],
                                  "cp -r", m["cp -r"], target="≤ 1.2× cp -r", min_speedup=1 / 1.2, applies=stated,
                                  note=fn_note if stated else f"{fn_note}; {STATED_AT}"))
        self.rows.append(make_row("4 migrate", case, "sharding-store migrate", m["migrate"], "cp -r", m["cp -r"],
                                  note=note))
        self.rows.append(make_row("4 migrate", case, "sharding-store migrate", m["migrate"],
                                  "decode + re-encode (zarr 3)", m["re-encode"], target="≥ 10× faster",
                                  min_speedup=10.0, applies=stated, note="both whole commands; ours verifies its "
                                  "output, the re-encoder does not" + ("" if stated else f"; {STATED_AT}")))
        self.rows.append(make_row("4 migrate", case, "sharding-store migrate --jobs 1", m["migrate --jobs 1"],
                                  "cp -r", m["cp -r"]))
        self.rows.append(make_row("4 migrate", case, "sharding-store migrate --no-verify", m["migrate --no-verify"],
                                  "cp -r", m["cp -r"]))
        self.rows.append(make_row("4 migrate", case, "migrate() in-process (default jobs, verify)",
                                  m["migrate() in-process"], "cp -r", m["cp -r"],
                                  note="the function alone, timed inside its process: no start-up or imports"))
        for ours, j in (("migrate", jobs), ("migrate --jobs 1", 1)):
            rss = [e.get("rss_mb") for e in m[ours]["extra"] if e.get("rss_mb")]
            peak = max(rss) if rss else None
            limit = None if j is None else (j * 2 * shard_obj) / 2**20 + 150
            om = {"median": peak, "runs": rss, "error": m[ours]["error"]}
            am = {"median": limit, "runs": []}
            row = make_row("4 migrate RSS", case, f"peak RSS, {ours}", om,
                           f"limit (jobs={j if j is not None else '?'})", am,
                           target="≤ jobs × 2 × shard + 150 MB", min_speedup=1.0, unit="MB",
                           note=f"max over runs (GNU time); largest shard object {shard_obj / 2**20:.2f} MiB"
                                + ("" if jobs is not None or ours != "migrate" else
                                   "; default jobs unknown (probe could not read it)"))
            self.rows.append(row)

    def _migrate_whole_command(self, case: Case, src: Path) -> None:
        """Issue 15's cases: the command a user types, default (verifies) and ``--no-verify``,
        against ``cp -r`` of the same source, interleaved, each after a ``sync`` (no re-encoder: at
        1 GiB it alone would take minutes per round and no target of these cases depends on it)."""
        d = self.case_dir(case)
        skip = self.has("sharding_store.cli.migrate.register")
        cli = str(VENV_BIN / "sharding-store")

        def cmd(argv: list[str], dst: Path, verify: bool) -> dict:
            return self.timed_command(case, argv, dst, verify, sync=True)

        comps = [
            Competitor("migrate", lambda v: cmd([cli, "migrate", str(src), str(d / "w-ours"), "--no-progress"],
                                                d / "w-ours", v), skip=skip),
            Competitor("migrate --no-verify", lambda v: cmd(
                [cli, "migrate", str(src), str(d / "w-nov"), "--no-verify", "--no-progress"], d / "w-nov", v),
                skip=skip),
            Competitor("cp -r", lambda v: cmd(["cp", "-r", str(src), str(d / "w-cp")], d / "w-cp", False)),
        ]
        m = measure(comps, self.reps(case), not self.args.quick, self.log)
        files = sum(1 for p in (src / "data").rglob("*") if p.is_file())
        limit = WHOLE_COMMAND_TARGETS[case.key]
        target = f"≤ {limit:g}× cp -r"
        note = ("whole commands incl. interpreter start-up and imports"
                + (f" (~{self.startup * 1e3:.0f} ms here)" if self.startup else "")
                + f"; source {du_bytes(src) / 2**20:.0f} MiB on disk, {files} shard objects")
        self.rows.append(make_row("4 migrate command", case, "sharding-store migrate (verifies)", m["migrate"],
                                  "cp -r", m["cp -r"], target=target, min_speedup=1 / limit,
                                  note=note + "; the default command: copies, then reads both trees back"))
        self.rows.append(make_row("4 migrate command", case, "sharding-store migrate --no-verify",
                                  m["migrate --no-verify"], "cp -r", m["cp -r"], target=target, min_speedup=1 / limit,
                                  note=note + "; the copy alone, as cp -r does it"))

    def s_reshard(self, case: Case) -> None:
        src, how = self.draft_source(case)
        if src is None:
            return self._unavailable("5 reshard", case, "no draft source")
        d = self.case_dir(case)
        to = 256 if case.cps in (16, 64) else 16
        k = math.isqrt(to)
        cli = str(VENV_BIN / "sharding-store")
        # issue 26's case: n >= 5 whatever the size, with the time it takes on a loaded machine
        repeat, budget = (max(5, self.reps(case)), ANCHOR_BUDGET_S) if case.legacy_source else (None, None)

        def cmd(argv: list[str], dst: Path, verify: bool) -> dict:
            return self.timed_command(case, argv, dst, verify)

        def reshard_argv(dst: Path) -> list[str]:
            return [cli, "reshard", str(src), str(dst), "--chunks-per-shard", f"{k},{k}", "--no-progress"]

        baseline = os.environ.get(RESHARD_BASELINE_ENV)
        comps = [
            Competitor("reshard", lambda v: cmd(reshard_argv(d / "r-ours"), d / "r-ours", v),
                       skip=self.has("sharding_store.cli.reshard.register"), repeat=repeat, budget=budget),
            Competitor("cp -r", lambda v: cmd(["cp", "-r", str(src), str(d / "r-cp")], d / "r-cp", False),
                       repeat=repeat, budget=budget),
        ]
        if case.legacy_source:  # issue 26's second row: the copy migration of the same store, --no-verify
            comps.append(Competitor("migrate --no-verify", lambda v: cmd(
                [cli, "migrate", str(src), str(d / "m-nov"), "--no-verify", "--no-progress"], d / "m-nov", v),
                skip=self.has("sharding_store.cli.migrate.register"), repeat=repeat, budget=budget))
        if baseline:  # the same command from another tree (e.g. before a change), side by side
            comps.append(Competitor("reshard (baseline)", lambda v: cmd(
                ["env", f"PYTHONPATH={baseline}", *reshard_argv(d / "r-base")], d / "r-base", v),
                repeat=repeat, budget=ANCHOR_BUDGET_S))  # as many rounds as ours
        m = measure(comps, self.reps(case), not self.args.quick, self.log)
        files = [p for p in (src / "data").rglob("*") if p.is_file()]
        note = (f"whole commands incl. interpreter start-up; source {du_bytes(src) / 2**20:.0f} MiB on disk, "
                f"{len(files)} shards of {case.cps} chunks ({how}) -> --chunks-per-shard {k},{k}")
        stated = case in EXTRA_CASES["reshard"]
        limit = 1.2 if case.legacy_source else 1.5  # issue 26's target; issue 15's
        self.rows.append(make_row("5 reshard", case, f"sharding-store reshard → cps {to}", m["reshard"], "cp -r",
                                  m["cp -r"], target=f"≤ {limit:g}× cp -r", min_speedup=1 / limit, applies=stated,
                                  note=note if stated else f"{note}; target stated for the "
                                  f"{EXTRA_CASES['reshard'][0].size_label} {EXTRA_CASES['reshard'][0].label} case"))
        if case.legacy_source:
            self.rows.append(make_row("5 reshard", case, "sharding-store migrate --no-verify", m["migrate --no-verify"],
                                      "cp -r", m["cp -r"], target="≤ 1.1× cp -r", min_speedup=1 / 1.1,
                                      note=f"issue 26: the copy migration of the same store; {note.split(' -> ')[0]}"))
        if baseline:
            self.rows.append(make_row("5 reshard", case, f"reshard → cps {to}, baseline tree {baseline}",
                                      m["reshard (baseline)"], "cp -r", m["cp -r"],
                                      note=f"the same command from {baseline} ({RESHARD_BASELINE_ENV}), in the same run"))

    def s_gen2023(self, case: Case) -> None:
        import scn_gen2023

        sizes = [c.size_mib for c in self._cases]
        scn_gen2023.run(self, case, first=case is self._cases[0], largest=case.size_mib == max(sizes),
                        h=sys.modules[__name__])

    def s_latency(self, case: Case) -> None:
        """Scenario 8: reads and migrate on S3 (moto) behind a latency-injecting proxy (scn_latency.py)."""
        import scn_latency

        scn_latency.run_scenario(self, case, sys.modules[__name__])

    def s_scale(self, case: Case) -> None:
        """Scenario 7 (benchmarks/scn_scale.py): once per run, not per case."""
        if getattr(self, "_scale_done", False):
            return
        self._scale_done = True
        import scn_scale

        sizes = [10_000] if self.args.quick else list(scn_scale.SIZES)
        old = self.args.old_tree
        results = []
        for n in sizes:
            r: dict[str, Any] = {"n": n, "new": scn_scale.run_child(n)}
            if old is not None:
                r["old"], r["old_label"] = scn_scale.run_child(n, old), _tree(old)
            self.log(f"  scale {n}: {json.dumps(r)}")
            results.append(r)
        self.rows += scn_scale.rows(results, make_row)

    def s_mapping(self, case: Case) -> None:
        """Scenario 11 (benchmarks/scn_mapping.py, issue 26): a plain mapping's µs per shard; once per run."""
        if getattr(self, "_mapping_done", False):
            return
        self._mapping_done = True
        import scn_mapping

        work = self.data / "mapping"
        work.mkdir(parents=True, exist_ok=True)
        quick = {"sizes": (10_000,), "side": 20} if self.args.quick else {}
        result = scn_mapping.compare(work, self.args.old_tree, self.reps(case), **quick)  # type: ignore[arg-type]
        self.log(f"  mapping: {json.dumps(result)}")
        self.rows += scn_mapping.rows(result, make_row)

    def s_startup(self, case: Case) -> None:
        """Scenario 12 (benchmarks/scn_startup.py, issue 26): info start-up, migrate 128 MiB vs cp -r; once per run."""
        if getattr(self, "_startup_done", False):
            return
        self._startup_done = True
        import scn_startup

        work = self.data / "startup"
        work.mkdir(parents=True, exist_ok=True)
        quick = {"n": 1024, "count": False} if self.args.quick else {}
        result = scn_startup.compare(work, self.args.old_tree, 1 if self.args.quick else max(5, self.reps(case)),
                                     **quick)  # type: ignore[arg-type]
        self.log(f"  startup: {json.dumps(result)}")
        self.rows += scn_startup.rows(result, make_row)

    def timed_command(self, case: Case, argv: list[str], dst: Path, verify: bool, sync: bool = False) -> dict:
        """One whole command writing ``dst`` (removed before and after), timed from outside;
        with ``verify``, ``dst`` is read back and compared with the input first. ``sync``:
        flush dirty pages before the run (at ~1 GiB per run the previous run's writeback
        otherwise lands on whichever command runs next)."""
        shutil.rmtree(dst, ignore_errors=True)
        if sync:
            os.sync()
        r = run_command(argv)
        if verify:
            r["verified"] = run_task({**self.spec(case, "verify"), "src": str(dst)})["verified"]
        shutil.rmtree(dst, ignore_errors=True)
        return r

    def s_xarray(self, case: Case) -> None:
        if case.dtype != "u2" or (case.cps != 256 and not self.args.quick):  # one dataset per size (scn_xarray.py)
            return
        import scn_xarray

        scn_xarray.scenario(self, case, sys.modules[__name__])

    def s_virtual(self, case: Case | None) -> None:
        """Scenario 10 (benchmarks/scn_virtual.py, issue 24): once per run, on its own sources."""
        if getattr(self, "_virtual_done", False):
            return
        self._virtual_done = True
        import scn_virtual

        scn_virtual.run(self, sys.modules[__name__])

    def _unavailable(self, scenario: str, case: Case, why: str) -> None:
        self.rows.append(make_row(scenario, case, "—", {"error": f"not available ({why})"}, "—", None))

    # -- main ---------------------------------------------------------------------------
    def run(self) -> None:
        sizes = [1] if self.args.quick else self.args.sizes
        cases = [Case(1, "u2", "lz4", 16)] if self.args.quick else matrix(sizes)
        if not self.args.quick and "read" in (self.args.only or SCENARIOS):
            cases += [c for c in READ_EXTRA if c not in cases]  # read only: see s_* below
        if self.args.case:
            cases = [c for c in cases if c.key in self.args.case]
        only = self.args.only or list(SCENARIOS)
        self._cases = cases
        self.log(f"cases: {', '.join(c.key for c in cases)}; scenarios: {', '.join(only)}")
        self.startup = None
        if {"migrate", "reshard"} & set(only):
            try:
                # what every migrate/verify/reshard command pays before its work: Python and the
                # imports (numpy, numcodecs, ours); `--version` loads none of them
                argv = [str(PY), "-c", "import sharding_store.ops.migration, sharding_store.ops.verification, "
                                       "sharding_store.ops.resharding"]
                self.startup = statistics.median(run_command(argv)["seconds"] for _ in range(3))
            except TaskError:
                pass
        for scenario in SCENARIOS:
            if scenario not in only:
                continue
            self.probe()  # modules may have appeared since the last scenario
            if scenario == "virtual":  # its own sources, once per run (scn_virtual.py; --case virtual-... picks)
                self.log("virtual (scenario 10, its own sources)")
                self.s_virtual(None)
                continue
            extra = [] if self.args.quick else [c for c in EXTRA_CASES.get(scenario, []) if c not in cases and (
                not self.args.case or c.key in self.args.case)]
            for case in cases + extra:
                if (case in READ_EXTRA and scenario != "read" and case not in matrix(sizes)
                        and case not in EXTRA_CASES.get(scenario, [])):
                    continue
                self.log(f"{scenario} {case.key} (repeat {self.reps(case)})")
                getattr(self, f"s_{scenario}")(case)
        self.elapsed = time.perf_counter() - self.t_start


def make_input(path: Path, case: Case) -> None:
    """Deterministic, microscopy-like data: a smooth background plus noise (compresses
    ~1.5-2.5× with blosc-lz4/zstd, like real images; random bytes would not compress and
    constant data would make every codec trivially fast)."""
    import numpy as np

    rows, cols = case.shape
    dtype = np.dtype(DTYPES[case.dtype][0])
    out = np.lib.format.open_memmap(str(path) + ".tmp.npy", mode="w+", dtype=dtype, shape=(rows, cols))
    rng = np.random.default_rng(12345)
    xx = np.arange(cols, dtype=np.float32)
    step = max(1, 2**24 // cols)
    for r0 in range(0, rows, step):
        yy = np.arange(r0, min(rows, r0 + step), dtype=np.float32)[:, None]
        block = 1000 + 500 * np.sin(xx / 300)[None, :] * np.cos(yy / 200) + rng.normal(0, 30, (len(yy), cols)).astype(
            np.float32)
        if dtype.kind == "u":
            out[r0 : r0 + len(yy)] = np.clip(block, 0, 65535).astype(dtype)
        else:
            out[r0 : r0 + len(yy)] = (block / 1000).astype(dtype)
    out.flush()
    del out
    os.replace(str(path) + ".tmp.npy", path)


# -------------------------------------------------------------------------------- report


def machine_info(bench: Bench) -> dict:
    import psutil

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": psutil.virtual_memory().total / 2**30,
            "os": f"{platform.system()} {platform.release()}", "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}}
    try:
        info["versions"] = run_task({"task": "versions"}, timeout=120)
    except TaskError as e:
        info["versions"] = {"error": str(e)}
    try:
        info["legacy"] = run_task({"task": "versions"}, legacy=True, timeout=120)
    except TaskError as e:
        info["legacy"] = {"error": str(e)}
    info["git"] = _tree()
    return info


def _tree(root: Path = ROOT) -> str:
    """The commit measured, and whether the package had uncommitted changes."""
    try:
        tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sharding_store"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return tree + (" + uncommitted changes in sharding_store/" if dirty else "")
    except OSError:
        return "?"


def fmt_speed(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.3g}×" if v < 100 else f"{v:.0f}×"


def row_value(row: dict, which: str) -> str:
    med = row[f"{which}_median"]
    if med is None:
        err = row["note"]
        return "not available" if "not available" in err or "not run" in err else ("error" if "error" in err else "—")
    n = len(row[f"{which}_runs"])
    return fmt_num(med, row["unit"]) + (f" (n={n})" if n and row["unit"] == "s" else "")


#: results.md links the plots drawn from results.json (plots.py), one question each
PLOTS_LINE = ("At a glance (drawn from [results.json](results.json) by `plots.py`): reads against tensorstore and zarrs "
              "[by size](plot-read.png); migrate, reshard and the virtual migration against `cp -r` "
              "[by size](plot-migrate.png); memory and time per shard [against the number of shards](plot-scale.png).")


def write_markdown(path: Path, bench: Bench, rows: list[dict], chunk_details: list[dict], info: dict,
                   cmd: str, runs_meta: dict) -> None:
    v = info.get("versions", {})
    lg = info.get("legacy", {})
    lines = [
        "# sharding-store benchmarks",
        "",
        f"Generated by `{cmd}` on {info['date']} (tree {info.get('git', '?')}). "
        f"Wall time of the run: {runs_meta.get('elapsed_min', 0):.1f} min. How to run and what each scenario "
        "measures: [README.md](README.md)." + (f" Note: {runs_meta['note']}." if runs_meta.get("note") else ""),
        "",
        PLOTS_LINE,
        "",
        "## Machine",
        "",
        f"- CPU: {info['cpu']}, {info['cores']} cores (a shared VM: noisy; see caveats), RAM {info['ram_gib']:.1f} GiB, "
        f"{info['os']}",
        f"- Python {v.get('python')}, numpy {v.get('numpy')}, zarr {v.get('zarr')}, tensorstore {v.get('tensorstore')}, "
        f"numcodecs {v.get('numcodecs')}, sharding-store {v.get('sharding-store')}",
        f"- legacy venv: zarr {lg.get('zarr')}, numcodecs {lg.get('numcodecs')}, numpy {lg.get('numpy')} "
        "(`ZARR_V3_EXPERIMENTAL_API=1 ZARR_V3_SHARDING=1`, `DirectoryStoreV3`)",
        f"- OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment: "
        f"{info['openblas_env'] if any(info['openblas_env'].values()) else 'not set'} "
        "(the benchmark's subprocesses run with both unset; nothing measured here calls BLAS)",
        f"- Other load: before each run the harness waits (≤ {QUIET_MAX_WAIT_S:.0f} s) until the 2 cores are less "
        f"than {QUIET_PCT:.0f}% busy; CPU busy seen just before the runs: median {statistics.median(LOADS or [0]):.0f}%, "
        f"max {max(LOADS or [0]):.0f}%; {sum(1 for b in LOADS if b > QUIET_PCT)} of {len(LOADS)} runs started "
        f"above the threshold after the wait; 1-min load average at the end {os.getloadavg()[0]:.1f}.",
        f"- Every timed process runs at nice {NICE} (as root; same for all competitors) so that other work on the "
        "machine disturbs it less.",
        "- Page cache: warm for every run (dropping it needs root on the host); every competitor gets one "
        "warm-up run first (except zarr-python 2.18 writes), then the competitors run interleaved.",
        "",
        "## Matrix",
        "",
        f"- Sizes: {runs_meta.get('sizes')} (128 MiB: the size the read and migrate targets are stated at); "
        "inner chunks 64×64 (2-d arrays); chunks per shard 16 (4×4) "
        "or 256 (16×16).",
        "- Configurations: small size: uint16/blosc-lz4/16, uint16/blosc-lz4/256, float32/zstd/256; "
        "large size: uint16/blosc-lz4/256, float32/zstd/16 (each dtype, codec and cps value at both sizes, "
        "not the full 2×2×2 cross product); scenario 2 also reads 105 MiB uint16/blosc-lz4/16 (issue 15's case). "
        "blosc-lz4 = `Blosc(lz4, clevel 5, shuffle)` (zarr 2's default), "
        "zstd = `Zstd(level 1)`; the same codec settings for every library.",
        f"- Repeats: median of up to {runs_meta.get('repeats')} runs per competitor (the n in each cell); a competitor "
        f"stops repeating once its timed runs add up to {BUDGET_S:.0f} s ({INFO_BUDGET_S:.0f} s for competitors no "
        f"target depends on, {ANCHOR_BUDGET_S:.0f} s for the re-encoder, which thus runs every round; zarr-python 2.18 "
        f"writes: no warm-up, ≤ 3 runs); "
        f"a warm-up run longer than {LONG_RUN_S:.0f} s counts as its first timed run.",
        "- **speedup** = anchor's median ÷ ours (> 1: ours is faster). For peak RSS it is limit ÷ peak. "
        "A target of \"≤ 1.2× cp -r\" is met when speedup ≥ 1/1.2 = 0.83, \"≤ 1.5× tensorstore\" when ≥ 0.67.",
        "",
        "## Results",
        "",
        "| scenario | size | dtype/codec/cps | ours | ours median | anchor | anchor median | speedup | target | met? |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['size']} | {r['case']} | {r['ours']} | {row_value(r, 'ours')} | "
                     f"{r['anchor']} | {row_value(r, 'anchor')} | {fmt_speed(r['speedup'])} | {r['target']} | "
                     f"{r['met']} |")
    notes = [(i, r) for i, r in enumerate(rows) if r["note"]]
    seen: set[str] = set()
    lines += ["", "Row notes:", ""]
    for _, r in notes:
        text = f"{r['scenario']}, {r['size']}, {r['case']}, {r['ours']} vs {r['anchor']}: {r['note']}"
        if r["note"] not in seen or "error" in r["note"]:
            lines.append(f"- {text}")
            seen.add(r["note"])
    if chunk_details:
        lines += ["", "## Scenario 3 details: one inner chunk", "",
                  "Requests and bytes are counted on the store below the sharding layer (ours: `CountingInner`; "
                  "2.18: a `DirectoryStoreV3` subclass). Max over the shards tried; latency = median.", "",
                  "| size | dtype/codec/cps | kind | ours latency | ours requests | ours bytes | 2.18 latency | "
                  "2.18 requests | 2.18 bytes |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in chunk_details:
            o, lg_ = c.get("ours", {}), c.get("zarr-python 2.18", {})
            lines.append(f"| {c['size']} | {c['case']} | {c['kind']} | {fmt_num(o.get('median'))} | "
                         f"{o.get('requests', '—')} | {o.get('bytes', '—'):,} | {fmt_num(lg_.get('median'))} | "
                         f"{lg_.get('requests', '—')} | {lg_.get('bytes', '—'):,} |"
                         if o.get("median") is not None and lg_.get("median") is not None else
                         f"| {c['size']} | {c['case']} | {c['kind']} | {o.get('error') or fmt_num(o.get('median'))} | "
                         f"{o.get('requests', '—')} | {o.get('bytes', '—')} | "
                         f"{lg_.get('error') or fmt_num(lg_.get('median'))} | {lg_.get('requests', '—')} | "
                         f"{lg_.get('bytes', '—')} |")
    missed = [r for r in rows if r["met"] == "no"]
    lines += ["", "## Targets", ""]
    met = [r for r in rows if r["met"] == "yes"]
    lines.append(f"{len(met)} met, {len(missed)} missed, "
                 f"{sum(1 for r in rows if r['met'] == '—')} not measurable (a side not available or failed).")
    for r in missed:
        lines.append(f"- MISSED: {r['scenario']} {r['size']} {r['case']}: {r['ours']} vs {r['anchor']}: "
                     f"speedup {fmt_speed(r['speedup'])}, target {r['target']}")
    lines += ["", "## Caveats", "",
              "- No fresh page cache: every read is served from memory, after a warm-up run. (Writing "
              "`/proc/sys/vm/drop_caches` does work in this VM as root, but it is system-wide, disturbs whoever "
              "else works on the machine, and the virtual disk is itself cached by the host, so a 'cold' number "
              "would not be a real disk either.) Disk-bound behaviour is not measured.",
              "- 2 vCPUs shared with other tenants: run-to-run noise of ±10-20% is common; ratios are taken "
              "between medians of interleaved runs of the same invocation.",
              "- Scenarios 1-3 time the operation inside the competitor's own process (imports and loading the "
              "input excluded); scenarios 4-5 time whole commands (`sharding-store ...`, `cp -r`, a re-encoding "
              "script), so Python start-up and imports are included for ours and the re-encoder.",
              ]
    if getattr(bench, "startup", None):
        lines.append(f"- Start-up of our commands (Python, then importing the migrate, verify and reshard modules "
                     f"with numpy and numcodecs; median of 3): {fmt_num(bench.startup)}; it is part of every "
                     f"scenario 4-5 time of ours.")
    pn = HERE / "profile_notes.md"
    if pn.exists():
        lines += ["", pn.read_text().strip()]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny smoke run (< 60 s); results go to .data/quick/")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[32, 128],
                   help="array sizes in MiB, comma-separated (default 32,128: 128 MiB is the size the "
                        "issues state their targets at)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per competitor (default 5 small, 3 large)")
    p.add_argument("--only", action="append", choices=SCENARIOS,
                   help="run only this scenario (repeatable); other rows are kept from the last run")
    p.add_argument("--case", action="append", metavar="KEY",
                   help="with --only: re-run only this case (e.g. 128MiB-f4-zstd-cps16; repeatable)")
    p.add_argument("--old-tree", type=Path, default=None,
                   help="scale: also measure this older working tree side by side (e.g. a git worktree)")
    p.add_argument("--out", type=Path, default=None,
                   help="where results.md, results.json and the plots go (default benchmarks/)")
    p.add_argument("--render", action="store_true",
                   help="only rebuild results.md and the plots from the last run's results.json (e.g. after "
                        "editing profile_notes.md)")
    args = p.parse_args(argv)
    if args.quick:  # a smoke run must stay under a minute: no waiting for a quiet machine
        global QUIET_MAX_WAIT_S
        QUIET_MAX_WAIT_S = 0.0
    if args.render:
        return render(args)
    out = args.out or (DATA / "quick" if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    bench.run()
    raw_path = out / "results.json"  # the rows the markdown and the plots are made from
    rows, chunk_details = bench.rows, bench.chunk_details
    meta = {"sizes": ", ".join(f"{s} MiB" for s in ([1] if args.quick else args.sizes)),
            "repeats": "1" if args.quick else (args.repeat or "5 (small) / 3 (large)"),
            "elapsed_min": bench.elapsed / 60}
    if args.only and raw_path.exists():  # keep the other scenarios' rows from the last run
        old = json.loads(raw_path.read_text())
        def rerun(r: dict) -> bool:
            return any(r["scenario"].startswith(n) for n in _scenario_prefixes(args.only)) and (
                not args.case or r.get("case_key") in args.case)

        merged: list[dict] = []
        for r in old["rows"]:  # replace re-run rows in place, keep the rest
            if not rerun(r):
                merged.append(r)
            elif not any(rerun(m) and m.get("case_key") == r.get("case_key") for m in merged):
                merged += [n for n in rows if n.get("case_key") == r.get("case_key") and n["scenario"][:2] == r["scenario"][:2]]
        merged += [n for n in rows if n not in merged]
        rows = merged
        if "chunk" not in args.only:
            chunk_details = old.get("chunk_details", [])
        meta["elapsed_min"] = old.get("meta", {}).get("elapsed_min", 0) + bench.elapsed / 60
        earlier = old.get("meta", {}).get("note")
        meta["note"] = (f"{earlier}; " if earlier else "") + (
            f"scenario(s) {', '.join(args.only)} " + (f"for {', '.join(args.case)} " if args.case else "")
            + f"re-run separately on {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')} (tree {_tree()})")
        meta["loads"] = old.get("meta", {}).get("loads", []) + LOADS
        meta["startup"] = getattr(bench, "startup", None) or old.get("meta", {}).get("startup")
    raw_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = "benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta.setdefault("loads", LOADS)
    meta.setdefault("startup", getattr(bench, "startup", None))
    meta.update(cmd=cmd.strip(), date=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
    meta["load"] = load_summary(LOADS if not args.only else meta["loads"])
    results = {"rows": rows, "chunk_details": chunk_details, "meta": meta}
    raw_path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    info = machine_info(bench)
    LOADS[:] = meta["loads"]
    if meta.get("startup"):
        bench.startup = meta["startup"]
    write_markdown(out / "results.md", bench, rows, chunk_details, info, cmd.strip(), meta)
    plotted = plots.make_plots(results, out)
    print(f"wrote {out / 'results.md'}, {raw_path.name} and {', '.join(p.name for p in plotted)} "
          f"in {bench.elapsed / 60:.1f} min")
    return 0


def render(args: argparse.Namespace) -> int:
    out = args.out or (DATA / "quick" if args.quick else HERE)
    raw = json.loads((out / "results.json").read_text())
    meta = raw["meta"]
    LOADS[:] = meta.get("loads", [])
    bench = argparse.Namespace(startup=meta.get("startup"))
    info = machine_info(bench)  # type: ignore[arg-type]
    info["date"] = meta.get("date", info["date"])
    write_markdown(out / "results.md", bench, raw["rows"], raw["chunk_details"], info,  # type: ignore[arg-type]
                   meta.get("cmd", "benchmarks/run.py"), meta)
    plotted = plots.make_plots(raw, out)
    print(f"rebuilt {out / 'results.md'} and {', '.join(p.name for p in plotted)} from {out / 'results.json'}")
    return 0


def load_summary(loads: list[float]) -> str:
    """What the machine was doing, for the plots' captions."""
    if not loads:
        return ""
    busy = sum(1 for b in loads if b > QUIET_PCT)
    return f"CPU busy before runs: median {statistics.median(loads):.0f}%, {busy} of {len(loads)} runs above {QUIET_PCT:.0f}%"


def _scenario_prefixes(only: list[str]) -> list[str]:
    return [{"write": "1 ", "read": "2 ", "chunk": "3 ", "migrate": "4 ", "reshard": "5 ",
             "gen2023": "6 ", "scale": "7 ", "latency": "8 ", "xarray": "9 ", "virtual": "10 ",
             "mapping": "11 ", "startup": "12 "}[s] for s in only]


if __name__ == "__main__":
    sys.exit(main())
