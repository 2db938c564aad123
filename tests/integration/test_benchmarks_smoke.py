"""The benchmark harness still runs end to end (tiny sizes, one repeat; no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quick_benchmark_run(tmp_path):
    out = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for scenario in ("1 write", "2 read", "3 one chunk", "4 migrate", "5 reshard", "7 scale", "8 latency", "9 xarray"):
        assert scenario in text, scenario
    assert "error" not in text.lower().split("## profile notes")[0], text[:3000]
