"""What an S3 read of a sharded draft array asks of the server (issue 26, S3 rows), counted at
the benchmark's latency proxy (benchmarks/scn_latency.py) in front of moto: the properties the
read's speed depends on, not its timings.

* a whole-array read: one GET per shard (the index is the object's own tail) and the three
  documents of the open; no HEAD, no listing; many shards in flight at once;
* open + one chunk: the entry point and the node documents in one round trip (all in flight
  together), then the shard's index tail and the chunk's range: five GETs, three round trips.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sharding_store.api import arrays
from sharding_store.api.arrays import create_draft_array, open_draft
from tests.s3server import S3Server, s3, s3_server  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scn_latency  # noqa: E402

pytest.importorskip("s3fs")
pytest.importorskip("obstore")
pytestmark = [pytest.mark.s3, pytest.mark.slow]

CHUNKS, CPS = (16, 12), (8, 8)
SHARDS = (8, 8)  # 64 shards of 8x8 chunks, as issue 26's store (8x8 chunks per shard)
SHAPE = (SHARDS[0] * CPS[0] * CHUNKS[0], SHARDS[1] * CPS[1] * CHUNKS[1])
META = ("/bkt/s.zr/zarr.json", "/bkt/s.zr/meta/root/a.array.json", "/bkt/s.zr/meta/root/a.group.json")


@pytest.fixture
def stored(s3: S3Server, tmp_path: Path) -> np.ndarray:  # noqa: F811
    """A 64-shard draft array on moto at s3://bkt/s.zr (array ``a``); its values."""
    rng = np.random.default_rng(26)
    x = (rng.integers(0, 50, SHAPE) + np.arange(SHAPE[1]) // 7).astype("u2")
    a = create_draft_array(str(tmp_path / "s.zr"), "a", shape=SHAPE, chunks=CHUNKS, dtype="u2", chunks_per_shard=CPS)
    a[...] = x
    s3.make_bucket("bkt")
    s3.fs.put(str(tmp_path / "s.zr") + "/", "bkt/s.zr", recursive=True)
    return x


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[scn_latency.LatencyProxy]:  # noqa: F811
    p = scn_latency.LatencyProxy(s3.port, delay_s=0.05)
    p.start()
    yield p
    p.stop()


def _options(proxy: scn_latency.LatencyProxy) -> dict:
    return scn_latency.storage_options(f"http://127.0.0.1:{proxy.port}")


def _shard_path(i: int, j: int) -> str:
    return f"/bkt/s.zr/data/root/a/c{i}/{j}"


def test_whole_array_read_is_one_get_per_shard_many_in_flight(stored, proxy) -> None:  # noqa: ANN001
    proxy.reset()
    a = open_draft("s3://bkt/s.zr", "a", storage_options=_options(proxy))
    assert np.array_equal(a[...], stored)
    stats = proxy.stats()
    per_object = Counter((m, p) for m, p, _ in proxy.log)
    shards = [_shard_path(i, j) for i in range(SHARDS[0]) for j in range(SHARDS[1])]
    assert stats["methods"] == {"GET": len(shards) + len(META)}, stats
    assert {p for _, p in per_object} == set(shards) | set(META)
    assert all(per_object["GET", p] == 1 for p in shards), per_object
    # requests are held 50 ms each: only a client with many in flight has them held together,
    # and no more than the I/O threads that read (and then decode) one shard each
    assert 16 <= stats["peak_held"] <= arrays.READ_WINDOW, stats


def test_open_and_one_chunk_three_round_trips(stored, proxy) -> None:  # noqa: ANN001
    proxy.delay_s = 0.5  # long enough that requests sent together are seen held together
    proxy.reset()
    a = open_draft("s3://bkt/s.zr", "a", storage_options=_options(proxy))
    r, c = 3 * CHUNKS[0], 5 * CHUNKS[1]  # one whole chunk of shard (0, 0)
    assert np.array_equal(a[r : r + CHUNKS[0], c : c + CHUNKS[1]], stored[r : r + CHUNKS[0], c : c + CHUNKS[1]])
    log = proxy.log
    assert [m for m, _, _ in log] == ["GET"] * 5, log
    assert {p for _, p, _ in log[:3]} == set(META)
    assert [h for _, _, h in log[:3]] == [1, 2, 3], log  # the three documents in flight together
    assert [(p, h) for _, p, h in log[3:]] == [(_shard_path(0, 0), 1)] * 2, log  # tail, then the chunk's range


def test_open_and_one_chunk_of_each_shard_two_gets_per_shard(stored, proxy) -> None:  # noqa: ANN001
    """A selection of one chunk in every shard: each shard's tail and that chunk's range, no more."""
    proxy.reset()
    a = open_draft("s3://bkt/s.zr", "a", storage_options=_options(proxy))
    step0, step1 = CPS[0] * CHUNKS[0], CPS[1] * CHUNKS[1]
    got = a[::step0, ::step1]
    assert np.array_equal(got, stored[::step0, ::step1])
    per_object = Counter(p for _, p, _ in proxy.log)
    shards = [_shard_path(i, j) for i in range(SHARDS[0]) for j in range(SHARDS[1])]
    assert proxy.stats()["methods"] == {"GET": 2 * len(shards) + len(META)}
    assert all(per_object[p] == 2 for p in shards), per_object
    assert proxy.stats()["peak_held"] >= 16, proxy.stats()


def test_a_chunk_of_a_shard_read_whole_before_is_one_get(stored, proxy) -> None:  # noqa: ANN001
    """A whole shard's read keeps its index with the object's ETag (the read of the index and
    of the payloads was one GET), so a later read of one of its chunks needs no tail: one
    ranged GET, conditional on that ETag."""
    a = open_draft("s3://bkt/s.zr", "a", storage_options=_options(proxy))
    assert np.array_equal(a[...], stored)
    proxy.reset()
    r, c = 2 * CHUNKS[0], 3 * CHUNKS[1]  # one chunk of shard (0, 0)
    assert np.array_equal(a[r : r + CHUNKS[0], c : c + CHUNKS[1]], stored[r : r + CHUNKS[0], c : c + CHUNKS[1]])
    assert [(m, p) for m, p, _ in proxy.log] == [("GET", _shard_path(0, 0))], proxy.log
