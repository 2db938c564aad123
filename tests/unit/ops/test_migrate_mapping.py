"""A plain ``MutableMapping`` as a migration's source (issue 26, "any Mapping at 50 µs a shard").

Two properties the speed depends on, checked without timing anything:

* between two in-memory stores the units run inline: no thread pool is made and no
  task is handed to one (a mapping has no I/O for threads to overlap, only a hand-off
  per unit to pay), and the result is what the threaded run writes;
* a compact shard of a mapping whose listing has no sizes passes through as it is
  (one get, its index checked, the CRC32C appended), never through the shard engine;
* a plain mapping's listing is streamed, not copied and sorted: the peak resident set
  of a migration of many shards stays near the interleaving span's (in a child process).
"""

from __future__ import annotations

import concurrent.futures.thread as cf_thread
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from crc32c import crc32c

from sharding_store import create_draft_array
from sharding_store.ops import jobs, units
from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify

ROWS, COLS = 6, 7  # 42 shards of 2x2 chunks of 2x2 u2, zstd


def read_v3(mapping: dict[str, bytes], path: str, root: Path) -> np.ndarray:
    """The array as zarr-python 3 reads it from the migrated mapping, written out to ``root``."""
    for key, value in mapping.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(value)
    return zarr.open_array(str(root), path=path, mode="r")[...]


def draft_dict() -> tuple[dict[str, bytes], np.ndarray]:
    """A plain dict holding a draft-era array of compact zstd shards (no ``list_sized``)."""
    src: dict[str, bytes] = {}
    arr = create_draft_array(src, "a", shape=(ROWS * 4, COLS * 4), chunks=(2, 2), chunks_per_shard=(2, 2),
                             dtype="u2", compressor=numcodecs.Zstd(level=1))
    values = np.arange(ROWS * 4 * COLS * 4, dtype="u2").reshape(ROWS * 4, COLS * 4)
    arr[:] = values
    return src, values


class Pools:
    """Counts thread pools made and tasks submitted to any of them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = self.submitted = 0
        init, submit = cf_thread.ThreadPoolExecutor.__init__, cf_thread.ThreadPoolExecutor.submit

        def counting_init(pool, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.made += 1
            init(pool, *args, **kwargs)

        def counting_submit(pool, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.submitted += 1
            return submit(pool, *args, **kwargs)

        monkeypatch.setattr(cf_thread.ThreadPoolExecutor, "__init__", counting_init)
        monkeypatch.setattr(cf_thread.ThreadPoolExecutor, "submit", counting_submit)


def test_two_mappings_migrate_and_verify_inline_with_no_pool_and_no_task(monkeypatch, tmp_path):
    src, values = draft_dict()
    pools = Pools(monkeypatch)
    inline: dict[str, bytes] = {}
    report = migrate(src, inline, verify=True, progress=False)
    assert report.totals.written == ROWS * COLS and report.verification.ok
    assert (pools.made, pools.submitted) == (0, 0), "units ran on a thread pool"
    np.testing.assert_array_equal(read_v3(inline, "a", tmp_path / "inline"), values)
    # jobs given: the caller's threads, batched; what they write is what the inline run wrote
    threaded: dict[str, bytes] = {}
    pools.made = pools.submitted = 0
    migrate(src, threaded, verify=False, progress=False, jobs=2)
    assert pools.made == 1 and 1 <= pools.submitted < ROWS * COLS
    assert threaded == inline


def test_default_jobs_are_one_between_in_memory_stores_only(tmp_path):
    mapping, other = jobs.StoreRef.of({}).open(), jobs.StoreRef.of({}).open()
    local = jobs.StoreRef.of(str(tmp_path / "d")).open()
    assert jobs.jobs_for(None, mapping, other, None) == 1
    assert jobs.jobs_for(3, mapping, other, None) == 3  # the caller's number stands
    assert jobs.jobs_for(None, mapping, local, None) == jobs.default_jobs(local=False)


def test_run_inline_hands_each_item_its_outcome_and_stops_when_closed():
    ran: list[int] = []

    def work(i: int) -> int:
        ran.append(i)
        if i == 2:
            raise ValueError("two")
        return 10 * i

    results = jobs.run_units(work, ((i,) for i in range(6)), jobs=1)
    got = []
    for (i,), outcome in results:
        try:
            got.append(outcome.result())
        except ValueError as e:
            got.append(str(e))
        if i == 3:
            results.close()
            break
    assert got == [0, 10, "two", 30] and ran == [0, 1, 2, 3]  # nothing ran ahead of the consumer


def _with_dead_bytes(shard: bytes, n_chunks: int) -> bytes:
    """The same shard with 5 dead bytes before its payloads (offsets moved to match)."""
    index = shard[-16 * n_chunks :]
    entries = list(struct.unpack(f"<{2 * n_chunks}Q", index))
    moved = [v + 5 if i % 2 == 0 and v != 2**64 - 1 else v for i, v in enumerate(entries)]
    return b"DEAD!" + shard[: -16 * n_chunks] + struct.pack(f"<{2 * n_chunks}Q", *moved)


def test_compact_shards_of_an_unsized_listing_pass_through_without_the_shard_engine(monkeypatch, tmp_path):
    src, values = draft_dict()
    src["data/root/a/c1/1"] = _with_dead_bytes(src["data/root/a/c1/1"], 4)
    engine_reads: list[str] = []
    general = units.read_source_chunks

    def counted(job, unit, inner):  # type: ignore[no-untyped-def]
        engine_reads.append(unit.sources[0].key)
        return general(job, unit, inner)

    monkeypatch.setattr(units, "read_source_chunks", counted)
    dst: dict[str, bytes] = {}
    report = migrate(src, dst, verify=True, progress=False)
    assert engine_reads == ["data/root/a/c1/1"]  # only the shard with dead bytes is rebuilt
    assert report.totals.written == ROWS * COLS and report.totals.dead_bytes == 5
    for key, shard in src.items():
        if key.startswith("data/root/a/c") and key != "data/root/a/c1/1":
            out = dst["a/c/" + key[len("data/root/a/c") :]]
            assert out == shard + crc32c(shard[-64:]).to_bytes(4, "little")  # verbatim, then the index's CRC32C
    np.testing.assert_array_equal(read_v3(dst, "a", tmp_path / "dst"), values)
    assert verify(src, dst, progress=False).ok


# --------------------------------------------------------------------------- peak memory

ROOT = Path(__file__).resolve().parents[3]
#: a generated plain mapping of N compact shards under a long array path (~200-byte keys)
PLAIN_CHILD = r"""
import json, sys
from collections.abc import MutableMapping
from sharding_store import create_draft_array
from sharding_store.ops.migration import migrate

N, COLS = int(sys.argv[1]), 1000
PATH = "/".join(["a_long_group_name_that_every_key_of_the_array_repeats" * 2] * 2) + "/array"


class Plain(MutableMapping):
    # N shards behind __iter__ and __getitem__ only, every key made when listed
    def __init__(self):
        self.meta = {}
        arr = create_draft_array(self.meta, PATH, shape=(-(-N // COLS) * 4, COLS * 4), chunks=(2, 2),
                                 chunks_per_shard=(2, 2), dtype="u1", compressor=None)
        arr[:4, :4] = 7
        self.prefix = f"data/root/{PATH}/c"
        self.shard = self.meta.pop(self.prefix + "0/0")

    def __getitem__(self, key):
        if key in self.meta:
            return self.meta[key]
        i, _, j = key[len(self.prefix):].partition("/")
        if key.startswith(self.prefix) and i.isdigit() and j.isdigit() and int(i) * COLS + int(j) < N:
            return self.shard
        raise KeyError(key)

    def __setitem__(self, key, value):
        raise TypeError("read-only")

    __delitem__ = __setitem__

    def __iter__(self):
        yield from self.meta
        yield from (f"{self.prefix}{n // COLS}/{n % COLS}" for n in range(N))

    def __len__(self):
        return len(self.meta) + N


class Sink(dict):
    # keeps the documents, counts and drops the shards
    dropped = 0

    def __setitem__(self, key, value):
        if key.endswith(".json") or key.startswith(".") or "/c/" not in key:
            super().__setitem__(key, value)
        else:
            self.dropped += 1


def hwm():
    with open("/proc/self/status") as status:
        return int([line for line in status if line.startswith("VmHWM:")][0].split()[1]) / 1024


src, dst = Plain(), Sink()
before = hwm()
report = migrate(src, dst, verify=False, progress=False)
print("RESULT " + json.dumps({"grew_mb": hwm() - before, "shards": dst.dropped, "written": report.totals.written}))
"""
PLAIN_SHARDS = 150_000


@pytest.mark.slow  # 150k shards in a child (~4 s of CPU)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc for the peak resident set")
def test_a_plain_mapping_of_many_shards_migrates_in_bounded_memory(tmp_path):
    """Listed, copied and sorted, the 150k keys (~200 bytes each) would be ~50 MB on top of
    the interpreter (the tree before streaming grew 51 MB); streamed, what is held is the
    interleaving span of units (~16k of them), ~18 MB."""
    script = tmp_path / "child.py"
    script.write_text(PLAIN_CHILD)
    proc = subprocess.run([sys.executable, str(script), str(PLAIN_SHARDS)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the child died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["shards"] == got["written"] == PLAIN_SHARDS, got
    assert got["grew_mb"] < 32, got
