"""Scenario 7 "scale": does a migration's memory grow with the number of shards?

A synthetic draft-era store of N compact shards (:class:`SyntheticDraft`, a ``Mapping``
that generates every object on demand and lists its keys lazily, in sorted order) is
migrated into a sink (:class:`Sink`: keeps metadata documents, counts and drops chunk
objects) with ``verify=False``, each N in a fresh child process. The child reports its
peak RSS (``VmHWM`` from ``/proc/self/status``, reset at exec; ``ru_maxrss`` would carry
the parent's over) and the client time per shard. Run for the working tree and, when
given (``--old PATH``, e.g. a ``git worktree`` of an earlier commit), for an older tree
side by side, by putting that tree first on ``PYTHONPATH``.

    python benchmarks/scn_scale.py child 10000            # one measurement (JSON on stdout)
    python benchmarks/scn_scale.py compare 10000,100000 --old /work/old-scale
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the shard counts the scenario runs at
SIZES = (10_000, 100_000, 1_000_000)
#: shards per row of the shard grid (keys ``c<i>/<j>``, j < COLS)
COLS = 1000
ARRAY = "a"
CHUNKS = (2, 2)
CPS = (2, 2)
#: target of the issue: peak RSS at 1M shards (MB) and client time per shard (µs)
RSS_TARGET_MB = 120.0
US_TARGET = 50.0


def _lex(n: int) -> Iterator[int]:
    """0..n-1 in the lexicographic order of their decimal spellings (lazily)."""
    if n <= 0:
        return
    yield 0
    stack = [d for d in range(9, 0, -1) if d < n]
    while stack:
        v = stack.pop()
        yield v
        stack.extend(c for c in range(v * 10 + 9, v * 10 - 1, -1) if c < n)


class SyntheticDraft(MutableMapping):  # type: ignore[type-arg]
    """A draft-era store of ``n`` compact shards (2x2 chunks of 2x2 uint8 each, no
    compressor), every object generated when asked for: its own memory does not grow with
    ``n``. Shards lie on a grid of ``ceil(n / COLS)`` rows of ``COLS``; the last row is
    partial. ``list_sized``: sorted ``(key, size)`` pairs, generated lazily."""

    def __init__(self, n: int) -> None:
        from sharding_store import create_draft_array

        self.n = n
        self.rows = -(-n // COLS)
        cols = min(n, COLS)
        meta: dict[str, bytes] = {}
        shape = (self.rows * CPS[0] * CHUNKS[0], cols * CPS[1] * CHUNKS[1])
        arr = create_draft_array(meta, ARRAY, shape=shape, chunks=CHUNKS, chunks_per_shard=CPS, dtype="u1",
                                 compressor=None)
        arr[: CHUNKS[0] * CPS[0], : CHUNKS[1] * CPS[1]] = 7  # one shard, written by our draft writer
        self.prefix = f"data/root/{ARRAY}/"
        (shard_key,) = [k for k in meta if k.startswith(self.prefix)]
        self.shard = bytes(meta.pop(shard_key))
        self.meta = meta

    def _coords(self, key: str) -> tuple[int, int] | None:
        if not key.startswith(self.prefix + "c"):
            return None
        i, sep, j = key[len(self.prefix) + 1 :].partition("/")
        if not (sep and i.isdigit() and j.isdigit()) or (len(i) > 1 and i[0] == "0") or (len(j) > 1 and j[0] == "0"):
            return None
        i_, j_ = int(i), int(j)
        return (i_, j_) if i_ * COLS + j_ < self.n and j_ < COLS else None

    def __getitem__(self, key: str) -> bytes:
        if key in self.meta:
            return self.meta[key]
        if self._coords(key) is None:
            raise KeyError(key)
        return self.shard

    def __setitem__(self, key: str, value: bytes) -> None:
        raise TypeError("read-only")

    def __delitem__(self, key: str) -> None:
        raise TypeError("read-only")

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.list_sized(""))

    def __len__(self) -> int:
        return len(self.meta) + self.n

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int]]:
        """Sorted ``(key, size)`` under ``prefix``, lazily."""
        data = self.prefix
        meta = sorted((k, len(v)) for k, v in self.meta.items() if k.startswith(prefix))
        before = [m for m in meta if m[0] < data]
        after = [m for m in meta if m[0] >= data]
        yield from before
        if data.startswith(prefix) or prefix.startswith(data):
            size = len(self.shard)
            for i in _lex(self.rows):
                head = f"{data}c{i}/"
                if not (head.startswith(prefix) or prefix.startswith(head)):
                    continue
                for j in _lex(COLS if i < self.rows - 1 else self.n - i * COLS):
                    key = f"{head}{j}"
                    if key.startswith(prefix):
                        yield key, size
        yield from after

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (k for k, _ in self.list_sized(prefix))


class Sink(MutableMapping):  # type: ignore[type-arg]
    """A destination that keeps documents (``*.json``) and drops chunk objects, counting them."""

    def __init__(self) -> None:
        self.docs: dict[str, bytes] = {}
        self.dropped = 0
        self.dropped_bytes = 0

    def __getitem__(self, key: str) -> bytes:
        return self.docs[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        if key.endswith(".json"):
            self.docs[key] = bytes(value)
        else:
            self.dropped += 1
            self.dropped_bytes += len(value)

    def __delitem__(self, key: str) -> None:
        del self.docs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.docs))

    def __len__(self) -> int:
        return len(self.docs)


def vmhwm_mb() -> float:
    """This process's peak RSS (MB) from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1000
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(n: int) -> dict[str, Any]:
    """One migration of an ``n``-shard synthetic store into a sink, in this process."""
    import sharding_store
    from sharding_store.ops.migration import migrate

    src, dst = SyntheticDraft(n), Sink()
    before = vmhwm_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    report = migrate(src, dst, verify=False, progress=False)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert dst.dropped == n, (dst.dropped, n)
    assert report.totals.written + report.totals.copied == n
    return {"n": n, "peak_rss_mb": vmhwm_mb(), "rss_before_mb": before, "seconds": seconds, "cpu_seconds": cpu,
            "us_per_shard": seconds / n * 1e6, "cpu_us_per_shard": cpu / n * 1e6,
            "tree": str(Path(sharding_store.__file__).resolve().parent.parent)}


def run_child(n: int, tree: Path | None = None, timeout: float = 3600) -> dict[str, Any]:
    """:func:`child` in a fresh interpreter, with ``tree`` (default: this one) first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree or ROOT), str(HERE)])}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "child", str(n)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"scale child n={n} ({tree or ROOT}) failed: {r.stderr.strip()[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(sizes: list[int], old: Path | None) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        row: dict[str, Any] = {"n": n, "new": run_child(n)}
        if old is not None:
            row["old"] = run_child(n, old)
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


@dataclass(frozen=True)
class ScaleCase:
    """What a results row says about its case (run.py's ``Case`` fields ``make_row`` reads)."""

    n: int

    @property
    def size_label(self) -> str:
        return f"{self.n // 1_000_000}M shards" if self.n >= 1_000_000 else f"{self.n // 1000}k shards"

    @property
    def label(self) -> str:
        return f"u1/none/cps {CPS[0]}x{CPS[1]}, compact, Mapping → sink"

    @property
    def key(self) -> str:
        return f"scale-{self.n}"


def rows(results: list[dict[str, Any]], make_row: Any) -> list[dict[str, Any]]:
    """Results rows (prefix "7 "): peak RSS against the target and, with an old tree, against
    it; client time per shard likewise."""
    out = []
    for r in results:
        case, new, old = ScaleCase(r["n"]), r["new"], r.get("old")
        cpu = f"CPU {new['cpu_us_per_shard']:.0f} µs/shard"
        old_txt = (f"; old tree {old['peak_rss_mb']:.0f} MB, {old['us_per_shard']:.0f} µs/shard wall, "
                   f"{old['cpu_us_per_shard']:.0f} µs/shard CPU") if old else ""
        out.append(make_row("7 scale RSS", case, "peak RSS (VmHWM), migrate", {"median": new["peak_rss_mb"],
                            "runs": [new["peak_rss_mb"]]}, f"limit {RSS_TARGET_MB:.0f} MB",
                            {"median": RSS_TARGET_MB, "runs": []}, target=f"≤ {RSS_TARGET_MB:.0f} MB, flat in N",
                            min_speedup=1.0, unit="MB",
                            note=f"child process, one run; before migrating {new['rss_before_mb']:.0f} MB{old_txt}"))
        out.append(make_row("7 scale time", case, "µs per shard (wall), migrate", {"median": new["us_per_shard"],
                            "runs": [new["us_per_shard"]]}, f"limit {US_TARGET:.0f} µs",
                            {"median": US_TARGET, "runs": []}, target=f"≤ {US_TARGET:.0f} µs", min_speedup=1.0,
                            unit="µs", note=f"wall time of migrate() / N in the child (verify off); {cpu}"))
        if old:
            out.append(make_row("7 scale RSS", case, "peak RSS, this tree", {"median": new["peak_rss_mb"],
                                "runs": [new["peak_rss_mb"]]}, f"old tree ({r.get('old_label', 'old')})",
                                {"median": old["peak_rss_mb"], "runs": [old["peak_rss_mb"]]}, unit="MB",
                                note="side by side in one run (speedup: old ÷ new)"))
            out.append(make_row("7 scale time", case, "µs per shard (wall), this tree", {"median": new["us_per_shard"],
                                "runs": [new["us_per_shard"]]}, f"old tree ({r.get('old_label', 'old')})",
                                {"median": old["us_per_shard"], "runs": [old["us_per_shard"]]}, unit="µs",
                                note=f"side by side in one run; CPU {new['cpu_us_per_shard']:.0f} vs "
                                     f"{old['cpu_us_per_shard']:.0f} µs/shard"))
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Peak RSS and µs per shard against N (log x), old tree beside the new one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for which, style, color in (("old", "o--", "#1f77b4"), ("new", "s-", "#ff7f0e")):
        pts = [(r["n"], r[which]) for r in results if r.get(which)]
        if not pts:
            continue
        a.plot([n for n, _ in pts], [m["peak_rss_mb"] for _, m in pts], style, color=color, label=which)
        b.plot([n for n, _ in pts], [m["us_per_shard"] for _, m in pts], style, color=color, label=f"{which} (wall)")
        b.plot([n for n, _ in pts], [m["cpu_us_per_shard"] for _, m in pts], style, color=color, alpha=0.4, lw=0.8,
               label=f"{which} (CPU)")
    a.axhline(RSS_TARGET_MB, color="#c62828", lw=0.8, ls=":", label=f"target {RSS_TARGET_MB:.0f} MB")
    b.axhline(US_TARGET, color="#c62828", lw=0.8, ls=":", label=f"target {US_TARGET:.0f} µs")
    for ax, title in ((a, "peak RSS (VmHWM, MB)"), (b, "client time per shard (µs)")):
        ax.set_xscale("log")
        ax.set_xlabel("shards (N)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("7 scale: migrate a synthetic N-shard store into a sink (verify off)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(child(int(argv[1]))))
        return 0
    if argv[:1] == ["compare"]:
        sizes = [int(s) for s in argv[1].split(",")] if len(argv) > 1 else list(SIZES)
        old = Path(argv[argv.index("--old") + 1]) if "--old" in argv else None
        results = compare(sizes, old)
        if "--plot" in argv:
            plot(results, Path(argv[argv.index("--plot") + 1]))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
