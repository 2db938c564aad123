#!/usr/bin/env python
"""Scenario 8, "latency" (issue 15): draft data on object storage with real latency.

A moto S3 server (``python -m moto.server`` of the project venv, a subprocess on 127.0.0.1
that dies with the benchmark: ``PR_SET_PDEATHSIG``) sits behind :class:`LatencyProxy`, a small TCP
proxy on 127.0.0.1 (a thread of the benchmark process) that holds every HTTP request for
``DELAY_S`` before passing it on (the round trip a client in the same region as its bucket
sees), accepts at most ``MAX_CONNECTIONS`` connections at once (more wait), counts requests
by method and bytes each way, and stops by itself once idle for ``IDLE_STOP_S`` or after
``LIFETIME_S``. Every competitor talks to the proxy only (ours: obstore reads, s3fs writes and
listings, see ``sharding_store/stores/_obstore.py``; tensorstore's own
``s3`` kvstore), from its own process.

Rows (same draft store as scenarios 2-5, uploaded to ``s3://src/draft.zr3``; its migrated
v1.0 copy -- our migrate's output -- to ``s3://src/v1.zarr``):

* full-array read: ``open_draft(url, "a")[...]`` vs tensorstore ``zarr3`` on the v1.0 copy;
* one chunk, cold (open + one inner chunk): ours vs tensorstore;
* migrate bucket to bucket (``sharding-store migrate s3://src/draft.zr3 s3://dst/...``, the
  whole command, verification included) vs a server-side copy of the same objects (s3fs
  ``copy``, the ``cp -r`` of an object store).

Each row's note carries the requests and bytes the proxy saw in the last timed run.

Also a worker: ``python benchmarks/scn_latency.py '<json spec>'`` runs one task (as
``_worker.py`` does) and prints ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
#: added to every request (held before it is passed on)
DELAY_S = 0.020
#: connections the proxy serves at once (more wait for one to close)
MAX_CONNECTIONS = 128
#: the proxy stops by itself after this long without a connection, or after LIFETIME_S
IDLE_STOP_S = 900.0
LIFETIME_S = 4 * 3600.0
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
SRC_BUCKET, DST_BUCKET = "src", "dst"
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- the proxy


class LatencyProxy:
    """A latency-injecting HTTP/1.1 TCP proxy on 127.0.0.1 in front of ``target_port``.

    Requests are parsed only as far as needed to find where each ends (``Content-Length`` or
    chunked transfer encoding), so keep-alive connections carry many requests and each one
    is delayed and counted. Runs its own event loop in a daemon thread."""

    def __init__(self, target_port: int, *, delay_s: float = DELAY_S, max_connections: int = MAX_CONNECTIONS,
                 idle_stop_s: float = IDLE_STOP_S, lifetime_s: float = LIFETIME_S) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.max_connections = max_connections
        self.idle_stop_s = idle_stop_s
        self.lifetime_s = lifetime_s
        self.port = 0
        self._lock = threading.Lock()
        self.reset()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="latency-proxy", daemon=True)

    # -- counters
    def reset(self) -> None:
        with self._lock:
            self.methods: Counter[str] = Counter()
            self.bytes_up = 0  # client -> server
            self.bytes_down = 0  # server -> client
            self.connections = 0
            self.peak_open = 0
            #: every request as (method, path without the query, requests held at its arrival, itself included)
            self.log: list[tuple[str, str, int]] = []
            #: most requests held at once (sent by the client, not yet answered: the client's concurrency)
            self.peak_held = 0
        self._open = getattr(self, "_open", 0)
        self._held = getattr(self, "_held", 0)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": sum(self.methods.values()), "methods": dict(self.methods), "bytes_up": self.bytes_up,
                    "bytes_down": self.bytes_down, "connections": self.connections, "peak_open": self.peak_open,
                    "peak_held": self.peak_held}

    # -- life
    def start(self) -> int:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("latency proxy did not start")
        return self.port

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(self.max_connections)
        self._last = time.monotonic()
        server = await asyncio.start_server(self._client, HOST, 0, limit=1 << 20)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        t0 = time.monotonic()
        async with server:
            while not self._stop.is_set():
                try:
                    await asyncio.wait_for(self._stop.wait(), 1.0)
                except TimeoutError:
                    pass
                now = time.monotonic()
                idle = self._open == 0 and now - self._last > self.idle_stop_s
                if idle or now - t0 > self.lifetime_s:
                    break
            server.close()

    async def _client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        async with self._slots:
            with self._lock:
                self._open += 1
                self.connections += 1
                self.peak_open = max(self.peak_open, self._open)
            try:
                sreader, swriter = await asyncio.open_connection(HOST, self.target_port, limit=1 << 20)
            except OSError:
                cwriter.close()
                return
            try:
                up = asyncio.create_task(self._requests(creader, swriter))
                down = asyncio.create_task(self._pipe(sreader, cwriter))
                done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
            finally:
                for w in (swriter, cwriter):
                    w.close()
                with self._lock:
                    self._open -= 1
                self._last = time.monotonic()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 18):
            with self._lock:
                self.bytes_down += len(data)
            writer.write(data)
            await writer.drain()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client -> server: each request held ``delay_s``, then passed on whole."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method = lines[0].split(" ", 1)[0]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            with self._lock:
                self.methods[method] += 1
                self.bytes_up += len(head)
                self._held += 1
                self.peak_held = max(self.peak_held, self._held)
                self.log.append((method, lines[0].split(" ")[1].partition("?")[0] if " " in lines[0] else "", self._held))
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                with self._lock:
                    self._held -= 1
            writer.write(head)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                while True:
                    size_line = await reader.readuntil(b"\r\n")
                    size = int(size_line.split(b";")[0], 16)
                    writer.write(size_line)
                    body = await reader.readexactly(size + 2)
                    writer.write(body)
                    with self._lock:
                        self.bytes_up += len(size_line) + len(body)
                    if size == 0:
                        break
            else:
                remaining = int(headers.get("content-length", "0") or 0)
                while remaining:
                    data = await reader.read(min(remaining, 1 << 18))
                    if not data:
                        return
                    remaining -= len(data)
                    with self._lock:
                        self.bytes_up += len(data)
                    writer.write(data)
                    await writer.drain()
            await writer.drain()


# --------------------------------------------------------------------------- moto


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the moto child: SIGTERM when the benchmark process dies (Linux), and a nice value."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Moto:
    """moto's S3 server on 127.0.0.1 (``python -m moto.server``, a subprocess of the benchmark,
    ended by :meth:`stop` or, should the benchmark die, by the kernel)."""

    def __init__(self, python: Path) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen([str(python), "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self.endpoint = f"http://{HOST}:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def storage_options(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {"key": "testing", "secret": "testing", "use_listings_cache": False,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}, **extra}


# --------------------------------------------------------------------------- worker tasks


def _same(y: Any, spec: dict) -> bool:
    import numpy as np

    x = np.load(spec["input"], mmap_mode="r")
    sel = tuple(slice(a, b) for a, b in spec.get("region", [])) or ...
    want = x[sel]
    return bool(y.shape == want.shape and y.dtype == want.dtype and np.array_equal(y, want))


def _tune(spec: dict) -> None:
    """Experiments: set module constants (``{"sharding_store.api.arrays.BATCH_BYTES": ...}``)."""
    import importlib

    for name, value in (spec.get("tune") or {}).items():
        mod, _, attr = name.rpartition(".")
        setattr(importlib.import_module(mod), attr, value)


def task_read_ours(spec: dict) -> dict:
    import importlib.util

    import s3fs  # noqa: F401 - the library's imports outside the timer, as tensorstore's is
    if importlib.util.find_spec("obstore") is not None:
        import obstore  # noqa: F401 - the S3 read client, imported on first use (~10 ms)

    from sharding_store.api.arrays import open_draft

    _tune(spec)
    sel = tuple(slice(a, b) for a, b in spec.get("region", [])) or ...
    c0, t0 = time.process_time(), time.perf_counter()
    a = open_draft(spec["src"], "a", storage_options=spec["so"])
    t_open = time.perf_counter() - t0
    y = a[sel]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": dt, "open_s": t_open, "cpu_s": cpu, **({"verified": _same(y, spec)} if spec.get("verify") else {})}


def task_read_ts(spec: dict) -> dict:
    import tensorstore as ts

    bucket, _, path = spec["src"].removeprefix("s3://").partition("/")
    sel = tuple(slice(a, b) for a, b in spec.get("region", [])) or ...
    c0, t0 = time.process_time(), time.perf_counter()
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "s3", "bucket": bucket, "path": f"{path}/a/",
                                                   "endpoint": spec["endpoint"], "aws_region": "us-east-1"}},
                  read=True).result()
    t_open = time.perf_counter() - t0
    y = arr[sel].read().result() if sel is not ... else arr.read().result()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": dt, "open_s": t_open, "cpu_s": cpu, **({"verified": _same(y, spec)} if spec.get("verify") else {})}


def task_copy_s3fs(spec: dict) -> dict:
    """The whole store copied server-side with s3fs (the object store's ``cp -r``)."""
    import s3fs

    fs = s3fs.S3FileSystem(**spec["so"])
    src, dst = spec["src"].removeprefix("s3://"), spec["dst"].removeprefix("s3://")
    t0 = time.perf_counter()
    fs.copy(src, dst, recursive=True)
    dt = time.perf_counter() - t0
    return {"seconds": dt}


def task_verify(spec: dict) -> dict:
    """Read a migrated store on S3 (zarr-python 3 through fsspec) and compare with the input."""
    import zarr

    y = zarr.open_array(spec["src"], path="a", mode="r", storage_options=spec["so"])[...]
    return {"verified": _same(y, spec)}


def worker_main() -> None:
    spec = json.loads(sys.argv[1])
    result = globals()["task_" + spec["task"]](spec)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- the scenario


def wanted(case: Any, quick: bool) -> bool:
    """One case per size: uint16/blosc-lz4 at 256 chunks per shard (the quick run's only case),
    and issue 26's store written by zarr-python 2.18 (``run.LATENCY_LEGACY``)."""
    return quick or case.legacy_source or (case.dtype == "u2" and case.codec == "lz4" and case.cps == 256)


def run_scenario(bench: Any, case: Any, run: Any) -> None:
    """Scenario 8 for one case (``run``: the benchmarks/run.py module: measure, Competitor, ...)."""
    if not wanted(case, bench.args.quick):
        return
    import importlib.util

    missing = [m for m in ("s3fs", "moto", "tensorstore") if importlib.util.find_spec(m) is None]
    if missing:
        return bench._unavailable("8 latency", case, ", ".join(missing))
    src, how = bench.draft_source(case)
    if src is None:
        return bench._unavailable("8 latency", case, "no draft source")
    v1, v1how = bench.v1_copy(case, src)
    moto = Moto(run.PY)
    proxy = LatencyProxy(moto.port)
    try:
        port = proxy.start()
        endpoint = f"http://{HOST}:{port}"
        _scenario(bench, case, run, src, v1, moto, proxy, endpoint, f"draft {how}; v1.0 copy: {v1how}")
    finally:
        proxy.stop()
        moto.stop()


def _task(run: Any, spec: dict, proxy: LatencyProxy) -> dict:
    """One worker task in the project venv (credentials in its environment), with the
    requests and bytes the proxy saw during it."""
    env = {**run._env(), **CREDENTIALS}
    proxy.reset()
    try:
        proc = subprocess.run([str(run.PY), str(HERE / "scn_latency.py"), json.dumps(spec)], env=env,
                              capture_output=True, text=True, timeout=run.TASK_TIMEOUT, cwd=str(run.ROOT),
                              preexec_fn=run._prio)
    except subprocess.TimeoutExpired:
        raise run.TaskError(f"timeout after {run.TASK_TIMEOUT:.0f} s") from None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), **proxy.stats()}
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise run.TaskError(f"exit {proc.returncode}: {tail}")


def _command(run: Any, argv: list[str], proxy: LatencyProxy) -> dict:
    env_before = dict(os.environ)
    os.environ.update(CREDENTIALS)
    try:
        proxy.reset()
        r = run.run_command(argv)
        return {**r, **proxy.stats()}
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def _traffic(m: dict) -> str:
    """Requests, bytes and connections of the last timed run; the median time to open where
    the task reports it (the rest is the read)."""
    extras = m.get("extra") or [{}]
    extra = extras[-1]
    if "requests" not in extra:
        return ""
    methods = ", ".join(f"{k} {v}" for k, v in sorted(extra["methods"].items()))
    opens = sorted(e["open_s"] for e in extras if "open_s" in e)
    opened = f", open {opens[len(opens) // 2] * 1e3:.0f} ms of it" if opens else ""
    held = f", ≤ {extra['peak_held']} requests in flight" if "peak_held" in extra else ""
    return (f"{extra['requests']} requests ({methods}), {extra['bytes_down'] / 2**20:.1f} MiB down, "
            f"{extra['bytes_up'] / 2**20:.1f} MiB up, ≤ {extra['peak_open']} connections{held}{opened}")


def _scenario(bench: Any, case: Any, run: Any, src: Path, v1: Path, moto: Moto, proxy: LatencyProxy, endpoint: str,
              origin: str) -> None:
    import s3fs

    direct = storage_options(moto.endpoint)
    fs = s3fs.S3FileSystem(**direct)
    for bucket in (SRC_BUCKET, DST_BUCKET):
        fs.call_s3("create_bucket", Bucket=bucket)
    bench.log(f"  uploading {src.name} and {v1.name} to moto (direct, untimed)")
    fs.put(str(src), f"{SRC_BUCKET}/draft.zr3", recursive=True)
    fs.put(str(v1), f"{SRC_BUCKET}/v1.zarr", recursive=True)
    so = storage_options(endpoint)
    draft_url, v1_url = f"s3://{SRC_BUCKET}/draft.zr3", f"s3://{SRC_BUCKET}/v1.zarr"
    base = {"input": str(bench.input_path(case)), "so": so, "endpoint": endpoint}
    rows, (ch0, ch1) = case.shape[0], case.inner
    row0 = rows // 2 // ch0 * ch0
    chunk = [[row0, row0 + ch0], [ch1, 2 * ch1]]  # one whole inner chunk, away from the edges
    rep = bench.reps(case)
    warm = not bench.args.quick
    lat = f"{DELAY_S * 1e3:.0f} ms added per request"

    def read(task: str, url: str, region: list | None = None) -> Any:
        return lambda v: _task(run, {**base, "task": task, "src": url, "verify": v,
                                     **({"region": region} if region else {})}, proxy)

    m = run.measure([run.Competitor("ours", read("read_ours", draft_url)),
                     run.Competitor("tensorstore", read("read_ts", v1_url))], rep, warm, bench.log)
    bench.rows.append(run.make_row(
        "8 latency", case, "open_draft(s3://…)[...]", m["ours"], "tensorstore s3 (v1.0 copy)", m["tensorstore"],
        target="no slower than tensorstore", min_speedup=1.0,
        note=f"{lat}; full array; ours: {_traffic(m['ours'])}; tensorstore: {_traffic(m['tensorstore'])}; {origin}"
             f"{run.cpu_note(m, ['ours', 'tensorstore'])} (timed part; moto and the proxy share the cores)"))
    m = run.measure([run.Competitor("ours", read("read_ours", draft_url, chunk)),
                     run.Competitor("tensorstore", read("read_ts", v1_url, chunk))], rep, warm, bench.log)
    stated = {"target": "≤ tensorstore", "min_speedup": 1.0} if case.legacy_source else {}  # issue 26's row
    bench.rows.append(run.make_row(
        "8 latency", case, "open + one chunk", m["ours"], "tensorstore s3 (v1.0 copy)", m["tensorstore"], **stated,
        note=f"{lat}; cold (open included); ours: {_traffic(m['ours'])}; tensorstore: {_traffic(m['tensorstore'])}"))
    if case.legacy_source:  # issue 26 states this row without added latency too
        proxy.delay_s = 0.0
        try:
            m = run.measure([run.Competitor("ours", read("read_ours", draft_url, chunk)),
                             run.Competitor("tensorstore", read("read_ts", v1_url, chunk))], rep, warm, bench.log)
        finally:
            proxy.delay_s = DELAY_S
        bench.rows.append(run.make_row(
            "8 latency", case, "open + one chunk, no added latency", m["ours"], "tensorstore s3 (v1.0 copy)",
            m["tensorstore"], **stated, note=f"0 ms added per request (the proxy still counts); cold (open included); "
            f"ours: {_traffic(m['ours'])}; tensorstore: {_traffic(m['tensorstore'])}"))

    cli = str(run.VENV_BIN / "sharding-store")
    dst = f"s3://{DST_BUCKET}/migrated.zarr"

    def migrate(verify: bool) -> dict:
        fs.rm(f"{DST_BUCKET}/migrated.zarr", recursive=True) if fs.exists(f"{DST_BUCKET}/migrated.zarr") else None
        r = _command(run, [cli, "migrate", draft_url, dst, "--storage-options", json.dumps(so)], proxy)
        if verify:
            r["verified"] = _task(run, {**base, "task": "verify", "src": dst}, proxy)["verified"]
        return r

    def copy(verify: bool) -> dict:
        fs.rm(f"{DST_BUCKET}/copy.zr3", recursive=True) if fs.exists(f"{DST_BUCKET}/copy.zr3") else None
        return _task(run, {**base, "task": "copy_s3fs", "src": f"{SRC_BUCKET}/draft.zr3",
                           "dst": f"{DST_BUCKET}/copy.zr3"}, proxy)

    m = run.measure([run.Competitor("migrate", migrate), run.Competitor("copy", copy)], rep, warm, bench.log)
    bench.rows.append(run.make_row(
        "8 latency", case, "sharding-store migrate s3→s3", m["migrate"], "s3fs server-side copy", m["copy"],
        note=f"{lat}; whole command incl. start-up and verification; migrate: {_traffic(m['migrate'])}; "
             f"copy: {_traffic(m['copy'])}"))


if __name__ == "__main__":
    worker_main()
