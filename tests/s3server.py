"""A moto S3 server on 127.0.0.1 (a subprocess on a free port) with request counting.

Requests are counted on the server side with moto's recorder, so they include those
of CLI subprocesses and dask workers. Use the ``s3`` fixture::

    def test_x(s3):
        s3.make_bucket("src"); s3.fs.put(local_dir, "src/store", recursive=True)
        s3.start_counting(); ...; counts = s3.counts()   # {"GET": n, "PUT": n, "COPY": n, ...}
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, port: int, proc: subprocess.Popen, recording: Path) -> None:
        self.port, self.proc, self.recording = port, proc, recording
        self.endpoint = f"http://{HOST}:{port}"
        self.storage_options: dict[str, Any] = {
            "key": "testing",
            "secret": "testing",
            "use_listings_cache": False,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }
        import s3fs

        self.fs = s3fs.S3FileSystem(**self.storage_options)

    def _post(self, path: str) -> bytes:
        req = urllib.request.Request(self.endpoint + path, method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    def make_bucket(self, name: str) -> None:
        self.fs.call_s3("create_bucket", Bucket=name)
        self.fs.invalidate_cache()

    def reset(self) -> None:
        self._post("/moto-api/reset")
        self.fs.invalidate_cache()

    def start_counting(self) -> None:
        self._post("/moto-api/recorder/reset-recording")
        self._post("/moto-api/recorder/start-recording")

    def requests(self) -> list[dict[str, Any]]:
        self._post("/moto-api/recorder/stop-recording")
        with urllib.request.urlopen(self.endpoint + "/moto-api/recorder/download-recording", timeout=10) as r:
            lines = r.read().decode().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def counts(self) -> Counter[str]:
        """Requests by kind: GET, HEAD, PUT, COPY (PUT with a copy source), LIST, DELETE, POST."""
        out: Counter[str] = Counter()
        for r in self.requests():
            headers = {k.lower(): v for k, v in r["headers"].items()}
            method = r["method"]
            if method == "PUT" and "x-amz-copy-source" in headers:
                out["COPY"] += 1
            elif method == "GET" and ("list-type=" in r["url"] or "prefix=" in r["url"] or "delimiter=" in r["url"]):
                out["LIST"] += 1
            else:
                out[method] += 1
        return out


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Any:
    port = _free_port()
    recording = tmp_path_factory.mktemp("moto") / "recording"
    env = dict(os.environ, MOTO_RECORDER_FILEPATH=str(recording), AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://{HOST}:{port}/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto server did not start")
            time.sleep(0.1)
    server = S3Server(port, proc, recording)
    yield server
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def s3(s3_server: S3Server) -> S3Server:
    """A clean server (no buckets, no recording) for each test."""
    s3_server.reset()
    return s3_server


def change_object(fs, key: str, how: str) -> None:
    """Change an object under a virtual reference: ``rewritten`` (same size, other bytes:
    another ETag), ``truncated`` (8 bytes shorter) or ``deleted``."""
    blob = fs.cat_file(key)
    if how == "rewritten":
        fs.pipe_file(key, blob[:4][::-1] + blob[4:])
    elif how == "truncated":
        fs.pipe_file(key, blob[:-8])
    else:
        assert how == "deleted", how
        fs.rm_file(key)
