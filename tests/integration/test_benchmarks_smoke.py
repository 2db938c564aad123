"""The benchmark harness still runs end to end (tiny sizes, one repeat; no timing asserted), and its
plots are drawn from the results file it writes (and can be redrawn from that file alone)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLOTS = ("plot-read.png", "plot-migrate.png", "plot-scale.png")
PNG = b"\x89PNG\r\n\x1a\n"


def _assert_plots(folder: Path) -> None:
    for name in PLOTS:
        data = (folder / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_quick_benchmark_run(tmp_path):
    out = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=640,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for scenario in ("1 write", "2 read", "3 one chunk", "4 migrate", "5 reshard", "7 scale", "8 latency", "9 xarray",
                     "10 virtual", "11 mapping", "12 startup"):
        assert scenario in text, scenario
    assert "error" not in text.lower().split("## profile notes")[0], text[:3000]
    # the rows behind the markdown are kept machine-readable, and every plot is drawn from them
    results = json.loads((tmp_path / "results.json").read_text())
    scenarios = {r["scenario"] for r in results["rows"]}
    assert {"2 read", "4 migrate", "5 reshard", "7 scale time", "7 scale RSS", "10 virtual"} <= scenarios, scenarios
    assert all(r["ours_median"] is not None for r in results["rows"] if r["scenario"] in ("2 read", "7 scale time"))
    # reads report what each reader cost in CPU beside its wall time (a loaded machine's wall
    # times favour the reader with more threads)
    reads = [r for r in results["rows"] if r["scenario"] == "2 read" and r["anchor"].startswith("tensorstore")]
    assert reads and all("CPU (user+sys, all threads, median): open_draft " in r["note"] for r in reads)
    assert all("tensorstore " in r["note"].split("CPU")[1] for r in reads)
    _assert_plots(tmp_path)
    # ... and redrawn from results.json alone, without measuring
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plots.py"), str(tmp_path / "results.json"),
                           "--out", str(again)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_plots(again)


@pytest.mark.slow
def test_committed_plots_come_from_committed_results(tmp_path):
    """benchmarks/results.json holds the rows the committed plots show: redrawing them works and every
    plot the README links exists."""
    results = ROOT / "benchmarks" / "results.json"
    rows = json.loads(results.read_text())["rows"]
    assert any(r["scenario"] == "2 read" and r["ours_median"] for r in rows)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plots.py"), str(results), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_plots(tmp_path)
    readme = (ROOT / "README.md").read_text() + (ROOT / "benchmarks" / "README.md").read_text()
    for name in PLOTS:
        assert name in readme, name
        assert (ROOT / "benchmarks" / name).exists(), name


@pytest.mark.slow  # the scenario's source check in child processes (~2 s)
def test_a_legacy_source_reached_through_a_linked_data_folder_is_not_written_again(tmp_path, monkeypatch):
    """A worktree whose benchmarks/.data links to the main checkout's sees the same zarr-python
    2.18 source (its marker records the paths it was written with): nothing is rewritten. A
    marker of another write still is."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run

    main, link = tmp_path / "main" / ".data", tmp_path / "wt" / ".data"
    case = run.LATENCY_LEGACY
    writes: list[dict] = []
    monkeypatch.setattr(run, "run_task", lambda spec, **kw: writes.append(spec) or {"verified": True})

    def bench(data: Path) -> tuple[run.Bench, Path]:
        monkeypatch.setattr(run, "DATA", data)
        b = run.Bench(argparse.Namespace(quick=False))
        b._src_ok = {}
        return b, b.case_dir(case) / "src-draft"

    b, src = bench(main)
    b.input_path(case).parent.mkdir(parents=True, exist_ok=True)
    b.input_path(case).write_bytes(b"input")  # exists: not generated
    src.mkdir()
    marker = src.with_name(src.name + ".written-by-2.18.json")
    marker.write_text(json.dumps(b.spec(case, "write", dst=str(src), verify=True)))
    link.parent.mkdir()
    link.symlink_to(main, target_is_directory=True)
    b, src = bench(link)
    assert b._legacy_source(case, src)[0] == src and writes == []
    marker.write_text(marker.read_text().replace('"lz4"', '"zstd"'))  # written otherwise: written again
    assert b._legacy_source(case, src)[0] == src and len(writes) == 1
