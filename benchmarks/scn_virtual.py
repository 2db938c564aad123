"""Scenario 10 "virtual" (issue 24): a migration that moves no chunk byte, against one that does.

Two sources on local disk, kept between runs under ``benchmarks/.data/virtual/``:

- **1 GiB**: a 1024 MiB float32 array, zstd level 1, 64x64 chunks, 4x4 chunks per shard
  (4096 shards, ~835 MiB on disk), written by zarr-python 2.18.7's own sharding transformer
  (the legacy venv; not the project's writer);
- **100k objects**: the scale scenario's store (``scn_scale.SyntheticDraft``: one compact
  shard of our draft writer, repeated) written to files, 100,000 shard objects.

Competitors, whole commands as a user types them, interleaved, ``sync`` before each run:
``cp -r SRC DST``; ``sharding-store migrate SRC DST`` (the copy; verifies) and with
``--no-verify``; ``sharding-store migrate SRC DST.json --virtual=references`` (a reference
file) and ``sharding-store migrate SRC DST --virtual=icechunk`` (an Icechunk repository), each
also with ``--no-verify``. After every run the bytes under DST are counted (the sum of file
sizes: what was written; allocated blocks in the note). The first run of each virtual
competitor is checked: ``sharding-store verify SRC DST`` must pass and, for the reference
file, zarr-python 3 reads it through plain fsspec (``reference://``) equal to the input.

A virtual migration the installed CLI does not offer yet gives "not available (...)" rows.

    python benchmarks/scn_virtual.py materialize 100000 PATH   # write the 100k-object store
    python benchmarks/scn_virtual.py check-refs DST.json INPUT.npy a
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: objects of the second source (quick runs: OBJECTS_QUICK)
OBJECTS = 100_000
OBJECTS_QUICK = 300
#: issue 24's targets: DST holds < 1 % of SRC's bytes; virtual 1 GiB in < 10 % of cp -r's time
BYTES_RATIO = 100.0
TIME_RATIO = 10.0
#: timed rounds per competitor after the warm-up (n >= 5, interleaved)
REPEAT = 5
KINDS = {"references": "reference file", "icechunk": "Icechunk"}


@dataclass(frozen=True)
class Source:
    """One source store and what its result rows say about it (the fields ``make_row`` reads)."""

    path: Path
    size_label: str
    label: str
    key: str
    objects: int
    input: Path | None = None  # the array the store holds (.npy), for the fsspec read-back
    time_target: bool = False  # issue 24 states the time target for the 1 GiB store
    lean: bool = False  # only cp -r and the --no-verify/in-process runs (100k objects: a verifying run
    #                     reads every object again; at ~1 ms a file on a loaded machine the set would take an hour)


def cli() -> str:
    return str(Path(sys.executable).parent / "sharding-store")


def features() -> dict[str, str | None]:
    """None per virtual kind this tree offers, else why not (the scenario runs while the feature is
    being built: a missing one gives "not available" rows, never a number)."""
    out: dict[str, str | None] = {}
    for kind, mod in (("references", "sharding_store.stores.references"),
                      ("icechunk", "sharding_store.stores.icechunk_store")):
        probe = subprocess.run([sys.executable, "-c", f"import {mod}, icechunk; from sharding_store.ops.options import "
                                f"MigrateOptions; MigrateOptions(virtual=True, target={kind!r})"],
                               capture_output=True, text=True, cwd=str(ROOT))
        tail = (probe.stderr.strip().splitlines() or [""])[-1]
        out[kind] = None if probe.returncode == 0 else f"not available (virtual {kind}: {tail[:140]})"
    return out


def has_flag() -> bool:
    """Whether ``sharding-store migrate`` spells ``--virtual`` yet (else: a reference file by DST's
    ``.json`` name, an Icechunk repository through the API, ``migrate(..., MigrateOptions(virtual=True,
    target="icechunk"))``, in a fresh process like the command)."""
    r = subprocess.run([cli(), "migrate", "--help"], capture_output=True, text=True, cwd=str(ROOT))
    return "--virtual" in r.stdout


def virtual_argv(src: str, dst: Path, kind: str, verify: bool, flag: bool) -> list[str]:
    """The command a user types for a virtual migration of ``kind`` (see :func:`has_flag`)."""
    tail = ["--no-progress"] + ([] if verify else ["--no-verify"])
    if flag:
        return [cli(), "migrate", src, str(dst), f"--virtual={kind}", *tail]
    if kind == "references":
        return [cli(), "migrate", src, str(dst), *tail]
    return [sys.executable, str(Path(__file__).resolve()), "api-migrate", src, str(dst), kind, str(int(verify))]


def api_migrate(src: str, dst: str, kind: str, verify: bool) -> None:
    """``migrate`` of the library with a virtual target (what the CLI flag calls)."""
    from sharding_store.ops.migration import migrate
    from sharding_store.ops.options import MigrateOptions, RunOptions

    migrate(src, dst, MigrateOptions(virtual=True, target=kind, verify=verify),  # type: ignore[arg-type]
            run=RunOptions(progress=False))


# ---------------------------------------------------------------------------- sources


def legacy_source(bench: Any, h: Any) -> Source:
    """The 1 GiB store written by zarr-python 2.18 (quick: 1 MiB); written once, then kept."""
    case = h.Case(1, "u2", "lz4", 16) if bench.args.quick else h.Case(1024, "f4", "zstd", 16)
    path = h.DATA / "virtual" / case.key / "src-zarr-2.18"
    done = path.parent / "written-by-zarr-2.18.json"
    spec = bench.spec(case, "write", dst=str(path), verify=True)
    if not (done.exists() and path.exists()):
        bench.log(f"  writing {path} with zarr-python 2.18 (once; kept for later runs)")
        shutil.rmtree(path, ignore_errors=True)
        r = h.run_task(spec, legacy=True, timeout=3 * h.TASK_TIMEOUT)
        if not r.get("verified"):
            raise h.TaskError("zarr-python 2.18's store does not read back equal to its input")
        done.write_text(json.dumps({"seconds": r["seconds"], "case": case.key}))
    return Source(path, case.size_label, f"{case.label}, written by zarr-python 2.18", f"virtual-{case.key}",
                  objects=_count_files(path / "data"), input=Path(spec["input"]), time_target=True)


def objects_source(bench: Any, h: Any) -> Source:
    """The scale scenario's synthetic store of compact shards, written to files once."""
    n = OBJECTS_QUICK if bench.args.quick else OBJECTS
    path = h.DATA / "virtual" / f"objects-{n}" / "src"
    done = path.parent / "written.json"
    if not (done.exists() and path.exists()):
        bench.log(f"  writing {n} shard objects to {path} (once; kept for later runs)")
        shutil.rmtree(path, ignore_errors=True)
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "materialize", str(n), str(path)],
                           capture_output=True, text=True, cwd=str(ROOT), timeout=h.TASK_TIMEOUT,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])})
        if r.returncode:
            raise h.TaskError(f"materialize failed: {r.stderr.strip()[-300:]}")
        done.write_text(r.stdout)
    label = f"{n // 1000}k objects" if n >= 1000 else f"{n} objects"
    return Source(path, label, "u1/none/cps 2x2 compact shards (the scale scenario's store, on disk)",
                  f"virtual-objects-{n}", objects=n, lean=not bench.args.quick)


def materialize(n: int, path: Path) -> dict[str, Any]:
    """Write ``scn_scale.SyntheticDraft(n)`` (documents and ``n`` shard objects) under ``path``."""
    import scn_scale

    src = scn_scale.SyntheticDraft(n)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    made: set[Path] = set()
    written = 0
    for key, _size in src.list_sized(""):
        target = tmp / key
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        data = src[key]
        target.write_bytes(data)
        written += len(data)
    os.replace(tmp, path)
    return {"objects": n, "bytes": written, "shard_bytes": len(src.shard)}


def _count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def tree_bytes(path: Path) -> tuple[int, int]:
    """(sum of file sizes, allocated bytes) under ``path`` (a file: its own)."""
    if path.is_file():
        st = path.stat()
        return st.st_size, st.st_blocks * 512
    size = alloc = 0
    for top, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(top, f))
            size += st.st_size
            alloc += st.st_blocks * 512
    return size, alloc


# ---------------------------------------------------------------------------- runs


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def _check(src: Source, dst: Path, kind: str | None, h: Any, read_back: bool = False) -> bool:
    """After a first (verifying) run: ``sharding-store verify SRC DST`` for a virtual DST, and
    (``read_back``: once per source, it reads every byte through zarr-python 3's pure-Python
    pipeline) zarr-python 3 through plain fsspec equal to the input for a reference file."""
    if kind is None:
        return True
    h.run_command([cli(), "verify", str(src.path), str(dst)])
    if kind == "references" and src.input is not None and read_back:
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "check-refs", str(dst), str(src.input), "a"],
                           capture_output=True, text=True, cwd=str(ROOT), timeout=h.TASK_TIMEOUT)
        if r.returncode:
            raise h.TaskError(f"reading the reference file with zarr-python 3 failed: {r.stderr.strip()[-300:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])["equal"]
    return True


def timed(src: Source, argv: list[str], dst: Path, kind: str | None, verify: bool, h: Any) -> dict[str, Any]:
    """One whole command writing ``dst``, after a ``sync``; bytes under ``dst`` counted after it."""
    _remove(dst)
    os.sync()
    r = h.run_command(argv)
    r["dst_bytes"], r["dst_alloc"] = tree_bytes(dst)
    if verify:
        r["verified"] = _check(src, dst, kind, h, read_back="--no-verify" not in argv)
    _remove(dst)
    return r


def timed_inproc(src: Source, dst: Path, kind: str, verify: bool, h: Any) -> dict[str, Any]:
    """``migrate()`` alone, virtual, verify off, timed inside a fresh process (no interpreter
    start-up or imports: the job ``cp -r`` does, as scenario 4's ``migrate()`` rows time it)."""
    _remove(dst)
    os.sync()
    argv = [sys.executable, str(Path(__file__).resolve()), "inproc", str(src.path), str(dst), kind]
    r = subprocess.run(argv, env=h._env(), capture_output=True, text=True, timeout=h.TASK_TIMEOUT, cwd=str(ROOT),
                       preexec_fn=h._prio)
    if r.returncode:
        raise h.TaskError(f"in-process virtual migration failed: {(r.stderr.strip().splitlines() or [''])[-1]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    out["dst_bytes"], out["dst_alloc"] = tree_bytes(dst)
    if verify:
        out["verified"] = _check(src, dst, kind, h)
    _remove(dst)
    return out


def inproc(src: str, dst: str, kind: str) -> dict[str, Any]:
    """Import first, then time the library call (what :func:`timed_inproc` runs in its child).

    The library loads some modules on first use (numcodecs when a draft document is parsed,
    sqlite3 for a reference file, icechunk and zarr for a repository), so "imports first"
    means one virtual migration of the bundled 2 MiB sample into a scratch destination of
    the same kind before the timer: every module the timed call needs is loaded, nothing
    of SRC is read or cached by it."""
    import shutil
    import tempfile
    import time

    from sharding_store.ops.migration import migrate
    from sharding_store.ops.options import MigrateOptions, RunOptions

    options = MigrateOptions(virtual=True, target=kind, verify=False)  # type: ignore[arg-type]
    scratch = tempfile.mkdtemp(prefix="scn-virtual-warm-")
    try:
        warm = Path(scratch) / ("w.json" if kind == "references" else "w")
        migrate(str(ROOT / "samples" / "zarr-2.18-sharded.zr3"), str(warm), options, run=RunOptions(progress=False))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    t0 = time.perf_counter()
    migrate(src, dst, options, run=RunOptions(progress=False))
    return {"seconds": time.perf_counter() - t0}


def competitors(src: Source, work: Path, avail: dict[str, str | None], repeat: int, h: Any) -> list[Any]:
    """cp -r, the copy migration (verifying, and not) and each virtual kind (default, --no-verify)."""
    s = str(src.path)

    def comp(name: str, argv: list[str], dst: Path, kind: str | None = None, skip: str | None = None) -> Any:
        return h.Competitor(name, lambda v: timed(src, argv, dst, kind, v, h), skip=skip, repeat=repeat,
                            budget=budget(name))

    def budget(name: str) -> float:
        """Timed seconds a competitor may spend: all rounds, except on the lean source, where the
        copy runs once and cp -r for ~4 minutes (a file costs them ~1-3 ms on a loaded machine)."""
        if not src.lean or name.startswith("virtual"):
            return h.ANCHOR_BUDGET_S * 4
        return 1.0 if name.startswith("migrate") else 240.0

    lean = "not run for this source (the lean set: --no-verify and in-process only)" if src.lean else None
    out = [comp("cp -r", ["cp", "-r", s, str(work / "cp")], work / "cp"),
           comp("migrate (copy)", [cli(), "migrate", s, str(work / "copy"), "--no-progress"], work / "copy",
                skip=lean),
           comp("migrate (copy) --no-verify", [cli(), "migrate", s, str(work / "copy-nov"), "--no-progress",
                                               "--no-verify"], work / "copy-nov")]
    flag = has_flag()
    for kind in KINDS:
        for suffix, verify in (("", True), (" --no-verify", False)):
            dst = work / (f"refs{suffix.strip()}.json" if kind == "references" else f"icechunk{suffix.strip()}")
            out.append(comp(f"virtual {kind}{suffix}", virtual_argv(s, dst, kind, verify, flag), dst, kind,
                            avail[kind] or (lean if verify else None)))
        dst = work / ("refs-fn.json" if kind == "references" else "icechunk-fn")
        # lean source: the in-process output is not verified again (the same code path as the
        # --no-verify command's, whose output is)
        out.append(h.Competitor(f"virtual {kind} in-process",
                                lambda v, d=dst, k=kind: timed_inproc(src, d, k, v and not src.lean, h),
                                skip=avail[kind], repeat=repeat, budget=h.ANCHOR_BUDGET_S * 4))
    return out


def _bytes_measure(m: dict[str, Any], *which: str) -> dict[str, Any]:
    """The bytes the first of ``which`` that ran wrote (max over its runs) as a results measure."""
    ran = [w for w in which if w in m and m[w]["extra"]] or [which[0]]
    got = [e["dst_bytes"] for e in m[ran[0]]["extra"] if "dst_bytes" in e]
    return {"median": max(got) if got else None, "runs": got, "error": m[ran[0]]["error"]}


def label(kind: str, flag: bool) -> str:
    """How a row names the virtual migration of ``kind`` (the way it was invoked)."""
    if flag:
        return f"migrate --virtual={kind}"
    return "migrate SRC DST.json" if kind == "references" else "migrate() API, virtual=True, target=icechunk"


def rows(src: Source, m: dict[str, Any], flag: bool, h: Any) -> list[dict[str, Any]]:
    """Time rows (against cp -r and the copy migration) and bytes rows (against the source's)."""
    size, alloc = tree_bytes(src.path)
    srcm = {"median": float(size), "runs": []}
    note = (f"whole commands incl. interpreter start-up, sync before each; source {size / 2**20:.1f} MiB in "
            f"{src.objects} objects ({alloc / 2**20:.0f} MiB allocated)")
    out = [h.make_row("10 virtual", src, "sharding-store migrate (copy, verifies)", m["migrate (copy)"], "cp -r",
                      m["cp -r"], note=note),
           h.make_row("10 virtual", src, "sharding-store migrate (copy) --no-verify", m["migrate (copy) --no-verify"],
                      "cp -r", m["cp -r"], note=note)]
    stated = src.time_target
    for kind, what in KINDS.items():
        for suffix in ("", " --no-verify"):
            ours = f"{label(kind, flag)}{suffix}"
            mm = m[f"virtual {kind}{suffix}"]
            out.append(h.make_row("10 virtual", src, ours, mm, "cp -r", m["cp -r"], target="< 10% of cp -r's time",
                                  min_speedup=TIME_RATIO, applies=stated, note=note if stated else
                                  f"{note}; time target stated for the 1 GiB store"))
            if not suffix:  # as typed, against the copy as typed
                out.append(h.make_row("10 virtual", src, ours, mm, "sharding-store migrate (copy, verifies)",
                                      m["migrate (copy)"]))
        out.append(h.make_row("10 virtual", src, f"migrate() in-process, virtual {kind}, verify off",
                              m[f"virtual {kind} in-process"], "cp -r", m["cp -r"], target="< 10% of cp -r's time",
                              min_speedup=TIME_RATIO, applies=stated, note="the function alone, timed inside its "
                              "process: no interpreter start-up or imports (modules loaded on first use warmed by a "
                              "migration of the bundled 2 MiB sample first; as scenario 4's migrate() rows)"))
        names = (f"virtual {kind}", f"virtual {kind} --no-verify", f"virtual {kind} in-process")
        bm = _bytes_measure(m, *names)
        alloc_dst = [e["dst_alloc"] for n in names if n in m for e in m[n]["extra"] if "dst_alloc" in e]
        out.append(h.make_row("10 virtual bytes", src, f"bytes written, {what}", bm, "source bytes", srcm,
                              target="< 1% of the source's bytes", min_speedup=BYTES_RATIO, unit="B",
                              note=f"sum of file sizes under DST vs SRC (speedup: SRC ÷ DST); allocated "
                                   f"{max(alloc_dst, default=0) / 2**20:.2f} MiB vs {alloc / 2**20:.0f} MiB; "
                                   f"{src.objects} objects"))
    out.append(h.make_row("10 virtual bytes", src, "bytes written, copy migration",
                          _bytes_measure(m, "migrate (copy)", "migrate (copy) --no-verify"),
                          "source bytes", srcm, unit="B", note="for comparison: the copy writes every byte"))
    return out


def run(bench: Any, h: Any) -> None:
    """Scenario 10, once per run: both sources, every competitor interleaved, rows to ``bench.rows``."""
    avail = features()
    for kind, why in avail.items():
        if why:
            bench.log(f"  virtual {kind}: {why}")
    chosen = [k for k in (bench.args.case or []) if k.startswith("virtual-")]  # --case virtual-...: those only
    legacy_case = h.Case(1, "u2", "lz4", 16) if bench.args.quick else h.Case(1024, "f4", "zstd", 16)
    keys = {legacy_source: f"virtual-{legacy_case.key}",
            objects_source: f"virtual-objects-{OBJECTS_QUICK if bench.args.quick else OBJECTS}"}
    for make in (legacy_source, objects_source):
        if chosen and keys[make] not in chosen:
            continue
        try:
            src = make(bench, h)
        except h.TaskError as e:
            bench.log(f"  source failed: {e}")
            bench.rows.append(h.make_row("10 virtual", h.Case(1, "u2", "lz4", 16), "—",
                                         {"error": f"not available (source: {e})"}, "—", None))
            continue
        work = h.DATA / "virtual" / src.key.removeprefix("virtual-") / "out"
        work.mkdir(parents=True, exist_ok=True)
        bench.log(f"virtual {src.key}: {src.objects} objects")
        repeat = 1 if bench.args.quick else max(REPEAT, bench.args.repeat or 0)
        m = h.measure(competitors(src, work, avail, repeat, h), repeat, not bench.args.quick, bench.log)
        bench.rows += rows(src, m, has_flag(), h)


def check_refs(ref: Path, npy: Path, array: str) -> dict[str, Any]:
    """zarr-python 3 reads ``array`` of the reference file through plain fsspec: equal to ``npy``?"""
    import fsspec
    import numpy as np
    import zarr

    fs = fsspec.filesystem("reference", fo=str(ref), asynchronous=True)
    store = zarr.storage.FsspecStore(fs, read_only=True, path="")
    y = zarr.open_array(store, path=array, mode="r")[...]
    x = np.load(npy, mmap_mode="r")
    return {"equal": bool(y.shape == x.shape and y.dtype == x.dtype and np.array_equal(y, x))}


def main(argv: list[str]) -> int:
    if argv[:1] == ["materialize"]:
        print(json.dumps(materialize(int(argv[1]), Path(argv[2]))))
        return 0
    if argv[:1] == ["api-migrate"]:
        api_migrate(argv[1], argv[2], argv[3], argv[4] == "1")
        return 0
    if argv[:1] == ["inproc"]:
        print(json.dumps(inproc(argv[1], argv[2], argv[3])))
        return 0
    if argv[:1] == ["check-refs"]:
        print(json.dumps(check_refs(Path(argv[1]), Path(argv[2]), argv[3])))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
