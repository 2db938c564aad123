"""The benchmark's latency-injecting proxy (benchmarks/scn_latency.py, scenario 8) against the
moto server: it passes S3 requests through unchanged (bodies of any size, keep-alive), counts
each one as moto's own recorder does, holds each for its delay, bounds its connections and
stops by itself. No timing target is asserted, only the delay's lower bound."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scn_latency  # noqa: E402

from tests.s3server import s3, s3_server  # noqa: E402, F401 - fixtures

pytest.importorskip("s3fs")


def _fs(port: int):  # noqa: ANN202
    import s3fs

    return s3fs.S3FileSystem(**scn_latency.storage_options(f"http://127.0.0.1:{port}"), skip_instance_cache=True)


def test_requests_pass_through_counted_and_delayed(s3) -> None:  # noqa: ANN001
    s3.make_bucket("bkt")
    proxy = scn_latency.LatencyProxy(s3.port, delay_s=0.05)
    port = proxy.start()
    try:
        fs = _fs(port)
        big = bytes(range(256)) * (3 * 2**20 // 256)  # 3 MiB: several reads of the body
        fs.pipe_file("bkt/big", big)
        proxy.reset()
        s3.start_counting()
        t0 = time.perf_counter()
        assert fs.cat_file("bkt/big") == big
        assert fs.cat_file("bkt/big", start=10, end=20) == big[10:20]
        fs.pipe_file("bkt/small", b"x" * 100)
        assert fs.cat_file("bkt/small") == b"x" * 100
        elapsed = time.perf_counter() - t0
        stats = proxy.stats()
        recorded = [r for r in s3.requests() if "/moto-api" not in r["url"]]
        assert stats["requests"] == len(recorded) >= 4
        assert stats["methods"].get("PUT", 0) >= 1 and stats["methods"].get("GET", 0) >= 3
        assert elapsed >= stats["requests"] * 0.05  # one after the other: each held 50 ms
        assert stats["bytes_down"] >= len(big) + 10 + 100
        assert 100 <= stats["bytes_up"] < len(big)
    finally:
        proxy.stop()


def test_connections_are_bounded_and_the_proxy_stops_by_itself(s3) -> None:  # noqa: ANN001
    s3.make_bucket("bkt")
    s3.fs.pipe({f"bkt/k{i}": bytes([i]) * 1000 for i in range(12)})
    proxy = scn_latency.LatencyProxy(s3.port, delay_s=0.01, max_connections=2, idle_stop_s=5.0)
    port = proxy.start()
    fs = _fs(port)
    s3.start_counting()
    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(lambda i: fs.cat_file(f"bkt/k{i}"), range(12)))  # noqa: F821 - ``del fs`` below
    assert values == [bytes([i]) * 1000 for i in range(12)]
    recorded = [r for r in s3.requests() if "/moto-api" not in r["url"]]
    assert proxy.stats()["peak_open"] <= 2, proxy.stats()
    assert proxy.stats()["requests"] == len(recorded), (proxy.stats(), [(r["method"], r["url"]) for r in recorded])
    del fs  # its pooled connections close; then the proxy idles out
    import gc

    gc.collect()
    deadline = time.monotonic() + 60
    while proxy._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not proxy._thread.is_alive()
