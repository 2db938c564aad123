#!/usr/bin/env python
"""The benchmark plots, one question each, drawn from ``benchmarks/results.json`` (issue 27 item 17).

    plot-read.png     are reads ahead of tensorstore and zarrs, by size (local; S3 with latency)?
    plot-migrate.png  how do migrate, reshard and the virtual migration compare with ``cp -r``, by size?
    plot-scale.png    does memory or time per shard grow with the number of shards?

Every bar of ours stands beside its anchors from the same run (medians of interleaved runs;
a black tick marks the time the target allows). ``benchmarks/run.py`` calls
:func:`make_plots` after each run; to redraw without measuring:

    python benchmarks/plots.py                         # benchmarks/results.json -> benchmarks/plot-*.png
    python benchmarks/plots.py RESULTS.json --out DIR
    python benchmarks/plots.py --import-markdown benchmarks/results.md   # rows of results.md's tables
                                                                          # -> results.json (keeps its meta)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLOT_FILES = {"read": "plot-read.png", "migrate": "plot-migrate.png", "scale": "plot-scale.png"}
ANCHOR_COLORS = {"tensorstore": "#7f7f7f", "zarrs": "#bcbd22", "cp -r": "#7f7f7f"}
OURS_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf",
               "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#ff9896", "#c49c94", "#f7b6d2", "#9edae5"]


# ---------------------------------------------------------------------------- reading rows


def size_value(label: str) -> float:
    """Sort key of a size label: '128 MiB' -> 128, '100k objects' -> 1e5, '1M shards' -> 1e6."""
    m = re.match(r"\s*([\d.]+)\s*([kKM](?=\s|$))?", label)
    if not m:
        return float("inf")
    return float(m.group(1)) * {None: 1, "k": 1e3, "K": 1e3, "M": 1e6}[m.group(2)]


def medians(rows: Iterable[dict[str, Any]], scenario: Callable[[str], bool],
            anchor: Callable[[str], bool]) -> list[dict[str, Any]]:
    """Rows of the scenarios chosen whose anchor is chosen and both medians are known."""
    return [r for r in rows if scenario(r["scenario"]) and anchor(r["anchor"])
            and r.get("ours_median") is not None and r.get("anchor_median") is not None]


def groups(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Rows by case ('size, dtype/codec/cps'), smallest size first."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["size"], r["case"]), []).append(r)
    keys = sorted(by, key=lambda k: (size_value(k[0]), k[1]))
    return [(f"{s}\n{_wrap(c)}", by[(s, c)]) for s, c in keys]


def _wrap(text: str, width: int = 22, lines_max: int = 3) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    return "\n".join([*lines, cur][:lines_max])


def fmt_seconds(v: float) -> str:
    if v < 1e-3:
        return f"{v * 1e6:.0f}µs"
    if v < 1:
        return f"{v * 1e3:.0f}ms"
    return f"{v:.2f}s"


# ---------------------------------------------------------------------------- drawing


Bar = tuple[str, float, float | None, str]  # series, value, the value its target allows (or None), text


def _bars(ax: Any, grouped: list[tuple[str, list[Bar]]], colors: dict[str, str], ylabel: str) -> None:
    """Grouped bars: per group a list of :data:`Bar`; log y; a black tick at a bar's target."""
    width = 0.8 / max(1, max((len(b) for _, b in grouped), default=1))
    seen: set[str] = set()
    for gi, (_, bars) in enumerate(grouped):
        x0 = gi - 0.4 + width / 2
        for bi, (series, value, target, text) in enumerate(bars):
            x = x0 + bi * width
            ax.bar(x, value, width * 0.92, color=colors.get(series, "#999999"),
                   label=None if series in seen else series, edgecolor="black" if series in ANCHOR_COLORS else None,
                   linewidth=0.4, hatch="//" if series in ANCHOR_COLORS else None)
            seen.add(series)
            ax.text(x, value * 1.04, text, ha="center", va="bottom", fontsize=6, rotation=90)
            if target is not None:
                ax.plot([x - width / 2, x + width / 2], [target, target], color="black", lw=1.6)
    ax.set_xticks(range(len(grouped)))
    ax.set_xticklabels([g for g, _ in grouped], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    values = [v for _, bars in grouped for _, v, t, _ in bars for v in (v, t) if v is not None]
    if values:  # room above the tallest bar for its rotated label
        ax.set_ylim(min(values) / 1.6, max(values) * 6)
    ax.grid(axis="y", which="both", lw=0.3, alpha=0.5)
    if grouped:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)


def _colors(names: Iterable[str]) -> dict[str, str]:
    out = dict(ANCHOR_COLORS)
    i = 0
    for n in names:
        if n not in out:
            out[n] = OURS_COLORS[i % len(OURS_COLORS)]
            i += 1
    return out


def _read_groups(rows: list[dict[str, Any]], scenario: str, anchors: dict[str, str]) -> list[tuple[str, list[Bar]]]:
    """Per case: ours (open_draft), then each anchor present (name -> short series name)."""
    sel = medians(rows, lambda s: s == scenario, lambda a: a in anchors)
    sel = [r for r in sel if r["ours"].startswith("open_draft")]
    out = []
    for label, rs in groups(sel):
        ours = rs[0]["ours_median"]
        bars: list[Bar] = [("sharding-store open_draft", ours, None, fmt_seconds(ours))]
        for r in sorted(rs, key=lambda r: list(anchors).index(r["anchor"])):
            a = r["anchor_median"]
            bars.append((anchors[r["anchor"]], a, None, f"{fmt_seconds(a)} ({a / ours:.2g}× ours)"))
        out.append((label, bars))
    return out


def plot_read(rows: list[dict[str, Any]], path: Path, subtitle: str) -> None:
    """(a) Whole-array reads: ours beside tensorstore and zarrs, each case of each size."""
    plt = _pyplot()
    local = _read_groups(rows, "2 read", {"tensorstore (v1.0 copy)": "tensorstore",
                                          "zarr-python 3 + zarrs (v1.0 copy)": "zarrs"})
    s3 = _read_groups(rows, "8 latency", {"tensorstore s3 (v1.0 copy)": "tensorstore"})
    panels = [(p, t) for p, t in ((local, "local files, page cache warm"),
                                  (s3, "S3 (moto) behind a proxy adding 20 ms per request")) if p]
    fig, axes = plt.subplots(max(1, len(panels)), 1, squeeze=False,
                             figsize=(max(11, 2 + 1.5 * max([len(p) for p, _ in panels] or [1])),
                                      1.2 + 3.9 * max(1, len(panels))))
    colors = _colors(["sharding-store open_draft"])
    for ax, (grouped, title) in zip(axes[:, 0], panels):
        _bars(ax, grouped, colors, "time to read the whole array (s, log)")
        ax.set_title(title, fontsize=9)
    if not panels:
        _empty(axes[0][0])
    fig.suptitle("Are reads ahead of the anchors? open_draft on the draft store vs tensorstore and zarr-python 3 + "
                 "zarrs on its migrated v1.0 copy\n(lower is faster; " + subtitle + ")", fontsize=9)
    _save(fig, path)


#: how a row's "ours" reads in the write-side plot (rows not listed keep their own label; None: left out)
WRITE_SERIES: dict[str, str | None] = {
    "sharding-store migrate": "migrate (verifies)", "sharding-store migrate (verifies)": "migrate (verifies)",
    "sharding-store migrate --no-verify": "migrate --no-verify",
    "migrate() in-process, verify off": "migrate() in-process, no verify",
    "sharding-store migrate --jobs 1": None, "migrate() in-process (default jobs, verify)": None,
    "sharding-store migrate (copy, verifies)": "migrate (verifies)",
    "sharding-store migrate (copy) --no-verify": "migrate --no-verify",
}


def _series(ours: str) -> str | None:
    if ours in WRITE_SERIES:
        return WRITE_SERIES[ours]
    if ours.startswith("sharding-store reshard"):
        return "reshard"
    if ours.startswith("reshard → cps") and "baseline" in ours:
        return "reshard, baseline tree"
    return ours.removeprefix("sharding-store ")


def _write_groups(rows: list[dict[str, Any]], prefix: str) -> list[tuple[str, list[Bar]]]:
    """Per case: cp -r, then each of ours (once per series) with the time its target allows."""
    sel = medians(rows, lambda s: s.startswith(prefix) and "RSS" not in s and "bytes" not in s,
                  lambda a: a == "cp -r")
    out = []
    for label, rs in groups(sel):
        cp = rs[0]["anchor_median"]
        bars: list[Bar] = [("cp -r", cp, None, fmt_seconds(cp))]
        done: set[str] = set()
        for r in rs:
            name = _series(r["ours"])
            if name is None or name in done:
                continue
            done.add(name)
            target = r["anchor_median"] / r["min_speedup"] if r.get("min_speedup") else None
            o = r["ours_median"]
            bars.append((name, o, target, f"{fmt_seconds(o)} ({o / cp:.2g}× cp)"))
        out.append((label, bars))
    return out


def _bytes_note(rows: list[dict[str, Any]]) -> str:
    """'DST/SRC bytes' of each virtual kind, per source, for the virtual panel's caption."""
    parts = []
    for r in rows:
        if r["scenario"] == "10 virtual bytes" and r.get("ours_median") is not None and r.get("anchor_median"):
            parts.append(f"{r['size']}, {r['ours'].removeprefix('bytes written, ')}: "
                         f"{100 * r['ours_median'] / r['anchor_median']:.3g}%")
    return ("bytes written ÷ source bytes: " + "; ".join(parts)) if parts else ""


def plot_migrate(rows: list[dict[str, Any]], path: Path, subtitle: str) -> None:
    """(b) Whole commands against cp -r of the same source: migrate, reshard, virtual migration."""
    plt = _pyplot()
    panels = [(g, t) for g, t in ((_write_groups(rows, "4 migrate"), "migrate (a copy of every object)"),
                                  (_write_groups(rows, "5 reshard"), "reshard (new shard shape, new DST)"),
                                  (_write_groups(rows, "10 virtual"), "migrate --virtual (references only)")) if g]
    fig, axes = plt.subplots(max(1, len(panels)), 1, figsize=(max(11, 3 + 2.0 * max([len(g) for g, _ in panels] or [1])),
                                                              1.2 + 3.9 * max(1, len(panels))), squeeze=False)
    names = [s for g, _ in panels for _, bars in g for s, _, _, _ in bars]
    colors = _colors(names)
    for ax, (grouped, title) in zip(axes[:, 0], panels):
        _bars(ax, grouped, colors, "time (s, log)")
        ax.set_title(title, fontsize=9)
        if title.startswith("migrate --virtual"):
            note = _bytes_note(rows)
            if note:
                ax.set_xlabel(_wrap(note, 110, lines_max=6), fontsize=7)
    if not panels:
        _empty(axes[0][0])
    fig.suptitle("How do the write-side commands compare with cp -r of the same source? (lower is faster; "
                 "black tick: the time the target allows)\nwhole commands from outside, except "
                 "migrate() in-process (the function alone); " + subtitle, fontsize=9)
    _save(fig, path)


def _scale_points(rows: list[dict[str, Any]], scenarios: tuple[str, ...]) -> tuple[
        dict[str, list[tuple[float, float]]], dict[str, float]]:
    """Series of (N, value) of ours and of older trees; limits (anchors named 'limit ...'). Rows of
    scenario 11 (a plain mapping as the source) are their own series."""
    series: dict[str, list[tuple[float, float]]] = {}
    limits: dict[str, float] = {}
    for r in rows:
        if r["scenario"] not in scenarios or r.get("ours_median") is None:
            continue
        if r["scenario"].startswith("11"):
            r = {**r, "ours": f"plain mapping: {r['ours']}", "anchor": r["anchor"].replace("old tree", "plain mapping, old tree")}
        n = size_value(r["size"])
        if r["anchor"].startswith("limit") and r.get("anchor_median") is not None:
            limits[r["anchor"]] = r["anchor_median"]
        elif r["anchor"].startswith("old tree") and r.get("anchor_median") is not None:
            series.setdefault(r["anchor"], []).append((n, r["anchor_median"]))
            continue
        if "this tree" in r["ours"]:
            continue
        series.setdefault(r["ours"], []).append((n, r["ours_median"]))
    return {k: sorted(set(v)) for k, v in series.items()}, limits


def plot_scale(rows: list[dict[str, Any]], path: Path, subtitle: str) -> None:
    """(c) Peak memory and client time per shard against the number of shards (log x), limits drawn."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, scenarios, ylabel in ((axes[0], ("7 scale RSS", "11 mapping RSS"), "peak RSS of the process (MB)"),
                                  (axes[1], ("7 scale time", "11 mapping"), "client time per shard (µs, wall)")):
        series, limits = _scale_points(rows, scenarios)
        for name, pts in sorted(series.items()):
            style = "o--" if "old tree" in name else "s-"
            color = OURS_COLORS[(1 if name.startswith("plain mapping") else 0) + (2 if "old tree" in name else 0)]
            ax.plot([n for n, _ in pts], [v for _, v in pts], style, color=color, label=name)
            for n, v in pts:
                ax.annotate(f"{v:.0f}", (n, v), textcoords="offset points", xytext=(0, 5), fontsize=6, ha="center")
        for name, v in limits.items():
            ax.axhline(v, color="#c62828", lw=1.0, ls=":", label=name)
        ax.set_xscale("log")
        top = max([v for pts in series.values() for _, v in pts] + list(limits.values()) + [1.0])
        ax.set_ylim(0, top * 1.15)
        ax.set_xlabel("shards in the store (N, log)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(lw=0.3, alpha=0.5)
        if series or limits:
            ax.legend(fontsize=7, loc="best")
        else:
            _empty(ax)
    fig.suptitle("Does a migration's memory or time per shard grow with the number of shards? (flat and under the "
                 "dotted limit: yes it scales)\nmigrate() of N compact shards into a sink, verify off; " + subtitle,
                 fontsize=9)
    _save(fig, path)


def _empty(ax: Any) -> None:
    ax.text(0.5, 0.5, "no rows measured", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def make_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """Draw every plot of ``results`` (run.py's results.json) into ``out``; the paths written."""
    meta = results.get("meta", {})
    subtitle = (f"medians; rows of several runs, each ratio from one run (n, trees and load in results.md); last "
                f"{meta.get('date', '?')}")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, fn in (("read", plot_read), ("migrate", plot_migrate), ("scale", plot_scale)):
        p = out / PLOT_FILES[key]
        fn(results["rows"], p, subtitle)
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------- markdown import

HEADER = "| scenario | size | dtype/codec/cps | ours | ours median | anchor | anchor median | speedup | target | met? |"


def parse_value(cell: str, unit: str) -> tuple[float | None, int | None]:
    """'325.2 ms (n=3)' -> (0.3252, 3) in seconds; '47 MB' -> 47 (unit MB); '1.2 MiB' -> bytes."""
    m = re.match(r"\s*([\d.,]+)\s*(µs|ms|s|MB|B|KiB|MiB|GiB)?\s*(?:\(n=(\d+)\))?", cell)
    if not m:
        return None, None
    v = float(m.group(1).replace(",", ""))
    scale = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    if unit == "s":
        v *= scale.get(m.group(2) or "s", 1.0)
    elif unit == "B":
        v *= scale.get(m.group(2) or "B", 1.0) if m.group(2) != "B" else 1.0
    return v, int(m.group(3)) if m.group(3) else None


def _unit(scenario: str) -> str:
    if "RSS" in scenario:
        return "MB"
    if scenario in ("7 scale time", "11 mapping"):
        return "µs"
    if "bytes" in scenario:
        return "B"
    return "s"


def rows_from_markdown(text: str) -> list[dict[str, Any]]:
    """Every row of every results table in ``text`` (results.md), tagged with its section."""
    rows, section, in_table = [], "", False
    for line in text.splitlines():
        if line.startswith("#"):
            section, in_table = line.lstrip("# ").strip(), False
        elif line.strip() == HEADER:
            in_table = True
        elif in_table and line.startswith("| ---"):
            continue
        elif in_table and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 10 and not cells[0].startswith("run "):  # not another table's first column
                rows.append(_row_from_cells(cells, section))
        else:
            in_table = False
    return rows


def case_key(size: str, case: str) -> str:
    """run.py's key of a case from its labels ('128 MiB', 'uint16/blosc-lz4/16' -> '128MiB-u2-lz4-cps16';
    '10k shards' -> 'scale-10000'), so that a later ``run.py --only`` run replaces the imported row."""
    dtypes, codecs = {"uint16": "u2", "float32": "f4"}, {"blosc-lz4": "lz4", "zstd": "zstd"}
    m = re.fullmatch(r"(\d+) MiB", size)
    parts = case.split("/")
    if m and len(parts) == 3 and parts[0] in dtypes and parts[1] in codecs and parts[2].isdigit():
        return f"{m.group(1)}MiB-{dtypes[parts[0]]}-{codecs[parts[1]]}-cps{parts[2]}"
    if size.endswith(" shards"):
        return f"scale-{size_value(size):.0f}"
    return f"{size}|{case}"


def _row_from_cells(cells: list[str], section: str) -> dict[str, Any]:
    scenario, size, case, ours, om, anchor, am, speed, target, met = cells
    unit = _unit(scenario)
    o, on = parse_value(om, unit)
    a, an = parse_value(am, unit)
    sp = re.match(r"([\d.]+)×", speed)
    ms, mf = re.search(r"(?:≤|<)\s*([\d.]+)×", target), re.search(r"≥\s*([\d.]+)×", target)
    plain = {"no slower than tensorstore": 1.0, "≤ zarrs' time": 1.0, "faster": 1.0}
    min_speedup = (1 / float(ms.group(1))) if ms else float(mf.group(1)) if mf else plain.get(target)
    return {"scenario": scenario, "size": size, "case": case, "case_key": case_key(size, case), "ours": ours,
            "ours_median": o, "ours_runs": [], "ours_n": on, "anchor": anchor, "anchor_median": a, "anchor_runs": [],
            "anchor_n": an, "speedup": float(sp.group(1)) if sp else None, "target": target,
            "min_speedup": min_speedup if met in ("yes", "no") else None, "met": met, "note": "", "unit": unit,
            "section": section}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?", type=Path, default=HERE / "results.json")
    p.add_argument("--out", type=Path, default=None, help="where the plots go (default: next to RESULTS)")
    p.add_argument("--import-markdown", type=Path, default=None, metavar="MD",
                   help="replace RESULTS' rows by the rows of MD's results tables, then plot")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text()) if args.results.exists() else {"rows": [], "meta": {}}
    if args.import_markdown:
        results["rows"] = rows_from_markdown(args.import_markdown.read_text())
        args.results.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    for path in make_plots(results, args.out or args.results.parent):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
