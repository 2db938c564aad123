"""ShardingStore's I/O discipline, proved by counting the inner store's requests and bytes."""

from __future__ import annotations

import itertools
import threading
import traceback

import numpy as np
import pytest

from sharding_store import ShardCorruptError, ShardingStore
from sharding_store.formats.shard_index import MAX_UINT64, encode_shard, index_nbytes, read_index
from sharding_store.testing import CountingInner

P = "data/root/a/"


def key(*coords, sep="/"):
    return P + "c" + sep.join(map(str, coords))


def payload(coords):
    return (f"chunk{coords}".encode()) * (1 + sum(coords) % 3)


@pytest.fixture(params=["dict", "local"])
def inner(request, tmp_path):
    return CountingInner({} if request.param == "dict" else str(tmp_path))


def full_store(inner, cps=(8, 8), grid=(16, 16), **kw):
    store = ShardingStore(inner, chunks_per_shard=cps, array_path="a", **kw)
    store.update({key(*c): payload(c) for c in itertools.product(*map(range, grid))})
    inner.reset()
    return store


def test_cold_single_chunk_read_is_two_ranges(inner):
    store = full_store(inner)
    assert store[key(3, 5)] == payload((3, 5))
    assert inner.calls["get_ranges"] == 2 and inner.ranges == 2
    assert inner.calls["get"] == 0
    assert inner.bytes_read == index_nbytes((8, 8)) + len(payload((3, 5)))


def test_warm_single_chunk_read_is_one_range(inner):
    store = full_store(inner, index_cache_size=16)
    store[key(3, 5)]
    inner.reset()
    assert store[key(3, 6)] == payload((3, 6))
    assert inner.ranges == 1
    assert inner.bytes_read == len(payload((3, 6)))


def test_missing_chunk_and_missing_shard(inner):
    store = ShardingStore(inner, chunks_per_shard=(2, 2), array_path="a")
    store[key(0, 0)] = b"x"
    inner.reset()
    with pytest.raises(KeyError):
        store[key(0, 1)]  # shard exists, chunk does not: the index answers
    assert inner.ranges == 1
    inner.reset()
    with pytest.raises(KeyError):
        store[key(9, 9)]  # no shard: one failed index read
    assert inner.ranges == 1


def test_get_partial_values_64_chunks_one_shard(inner):
    store = full_store(inner)
    keys = [key(*c) for c in itertools.product(range(8, 16), range(0, 8))]  # all of shard (1, 0)
    values = store.get_partial_values([(k, (0, None)) for k in keys])
    assert values == [payload(c) for c in itertools.product(range(8, 16), range(0, 8))]
    # one index read, then one coalesced range covering all 64 adjacent chunks
    assert inner.calls["get_ranges"] == 2 and inner.ranges == 2
    assert inner.bytes_read == index_nbytes((8, 8)) + sum(map(len, values))


def test_get_partial_values_many_shards_reads_each_index_once(inner):
    store = full_store(inner)
    keys = [key(i, j) for i in (1, 9) for j in (2, 3, 10)]  # 4 shards, chunks (x,2),(x,3) adjacent
    store.get_partial_values([(k, (0, None)) for k in keys])
    assert inner.calls["get_ranges"] == 2
    index_reads = inner.log[0][1]
    assert len(index_reads) == 4 and all(start < 0 for _, start, _ in index_reads)
    assert len(inner.log[1][1]) == 4  # (x,2)+(x,3) coalesced per shard: one range per shard


def test_sub_ranges_and_suffixes(inner):
    store = full_store(inner, cps=(2, 2), grid=(2, 2))
    v = payload((1, 1))
    got = store.get_partial_values([(key(1, 1), (2, 3)), (key(1, 1), (-4, None)), (key(1, 1), (-4, 2))])
    assert got == [v[2:5], v[-4:], v[-4:-2]]


def test_update_full_array_writes_each_shard_once_without_reading(inner):
    store = ShardingStore(inner, chunks_per_shard=(4, 4), array_path="a")
    store.update({key(*c): payload(c) for c in itertools.product(range(8), range(8))})
    assert inner.writes == 4
    assert inner.reads == 0 and inner.calls["get_ranges"] == 0


def test_update_partial_shard_reads_index_and_survivors_only(inner):
    store = full_store(inner, cps=(4, 4), grid=(4, 4))
    store.update({key(0, 0): b"new", key(2, 2): b"newer"})
    assert inner.writes == 1
    assert inner.calls["get_ranges"] == 2  # index, then all 14 survivors in one coalesced call
    survivors = sum(len(payload(c)) for c in itertools.product(range(4), range(4)) if c not in ((0, 0), (2, 2)))
    assert inner.bytes_read == index_nbytes((4, 4)) + survivors
    assert store[key(0, 0)] == b"new" and store[key(1, 1)] == payload((1, 1))


def test_written_shards_are_compact_in_c_order(inner):
    store = ShardingStore(inner, chunks_per_shard=(2, 2), array_path="a")
    store[key(1, 1)] = b"d"
    store[key(0, 0)] = b"aa"
    store[key(0, 1)] = b"bbb"
    store[key(0, 0)] = b"A"  # overwrite: no dead bytes left behind
    blob = inner.inner.get(key(0, 0))
    index = read_index(blob, (2, 2))
    assert [(c, o, n) for c, o, n in index.live()] == [((0, 0), 0, 1), ((0, 1), 1, 3), ((1, 1), 4, 1)]
    assert blob == b"Abbbd" + blob[5:] and len(blob) == 5 + 64


def test_erasing_last_chunk_deletes_shard(inner):
    store = full_store(inner, cps=(2,), grid=(4,))
    store.erase_values([key(0), key(1)])  # all of shard 0: deleted without reading
    assert inner.calls["delete"] == 1 and inner.reads == 0
    assert not inner.inner.exists(key(0))
    inner.reset()
    del store[key(2)]
    assert inner.writes == 1  # shard 1 rewritten with chunk 3 only
    del store[key(3)]
    assert not inner.inner.exists(key(1))
    assert list(store) == []


def test_erase_values_and_prefix_rewrite_each_shard_once(inner):
    store = full_store(inner, cps=(2, 2), grid=(4, 4))
    store.erase_values([key(0, 0), key(0, 1), key(1, 0), key(2, 2), key(2, 3)])
    assert inner.writes + inner.calls["delete"] == 2  # shard (0,0) rewritten, (1,1) rewritten
    inner.reset()
    store.erase_prefix(P + "c3/")
    assert inner.writes + inner.calls["delete"] == 2  # shards (1,0) and (1,1), once each
    assert sorted(store) == sorted(
        key(*c) for c in itertools.product(range(4), range(4)) if c[0] != 3 and c not in ((0, 0), (0, 1), (1, 0), (2, 2), (2, 3))
    )
    inner.reset()
    store.erase_prefix(P)
    assert list(store) == [] and inner.reads == 0


def test_erasing_absent_chunks_writes_nothing(inner):
    store = full_store(inner, cps=(2, 2), grid=(1, 1))
    store.erase_values([key(1, 1)])
    assert inner.writes == 0 and inner.calls["delete"] == 0


def test_plain_keys_pass_through(inner):
    store = ShardingStore(inner, chunks_per_shard=(2,), array_path="a")
    store["zarr.json"] = b"{}"
    store["data/root/other/c0"] = b"raw"
    assert inner.inner.get("data/root/other/c0") == b"raw"
    assert store["data/root/other/c0"] == b"raw"
    assert sorted(store) == ["data/root/other/c0", "zarr.json"]


def test_separator_dot_and_root_array():
    inner = {}
    store = ShardingStore(inner, chunks_per_shard=(2, 3), array_path="", separator=".")
    store["data/root/c5.7"] = b"v"
    assert list(inner) == ["data/root/c2.2"]
    assert store["data/root/c5.7"] == b"v"
    assert store.list_dir("data/root/") == (["data/root/c5.7"], [])


def test_spec_example_key_rewriting():
    inner = {}
    store = ShardingStore(inner, chunks_per_shard=(32, 2), array_path="foo/baz")
    for c in [(96, 18), (96, 19), (127, 19)]:
        store["data/root/foo/baz/c{}/{}".format(*c)] = b"x"
    assert list(inner) == ["data/root/foo/baz/c3/9"]


def test_zero_d_array():
    inner = {}
    store = ShardingStore(inner, chunks_per_shard=(), array_path="s")
    store["data/root/s/c0"] = b"scalar"
    assert list(inner) == ["data/root/s/c0"]
    assert len(inner["data/root/s/c0"]) == 6 + 16
    assert store["data/root/s/c0"] == b"scalar"
    assert list(store) == ["data/root/s/c0"]


# ----------------------------------------------------------------- damaged shards
def damaged(kind: str) -> bytes:
    good = encode_shard({(0,): b"abcd", (1,): b"efgh"}, (2,))
    entries = np.frombuffer(good[-32:], "<u8").reshape(2, 2).copy()
    if kind == "short_index":
        return good[-20:]
    if kind == "past_end":
        entries[1] = (6, 100)
    elif kind == "half_sentinel":
        entries[1, 1] = MAX_UINT64
    elif kind == "overflow":
        entries[1] = (MAX_UINT64 - 2, 8)
    return good[:-32] + entries.astype("<u8").tobytes()


@pytest.mark.parametrize("kind", ["short_index", "past_end", "half_sentinel", "overflow"])
def test_damaged_shard_never_returns_wrong_bytes(inner, kind):
    inner.inner.set(key(0), damaged(kind))
    store = ShardingStore(inner, chunks_per_shard=(2,), array_path="a")
    with pytest.raises(ShardCorruptError) as info:
        store[key(1)]
    assert key(0) in str(info.value)
    with pytest.raises(ShardCorruptError):
        list(store)
    with pytest.raises(ShardCorruptError):
        store[key(1)] = b"new"  # a rewrite must not silently drop what the index claims


# ----------------------------------------------------------------- concurrency
def test_threads_writing_disjoint_chunks_of_same_shards_lose_nothing(inner):
    store = ShardingStore(inner, chunks_per_shard=(4, 4), array_path="a")
    coords = list(itertools.product(range(8), range(8)))
    barrier = threading.Barrier(8)

    def writer(t):
        barrier.wait()
        for c in coords[t::8]:
            store[key(*c)] = payload(c)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert store.getitems(key(*c) for c in coords) == {key(*c): payload(c) for c in coords}


class PartialMapping(dict):
    """A zarr-python-2 style store: ``get_partial_values([(key, (start, length))])``."""

    def __init__(self):
        super().__init__()
        self.partial_calls: list[list] = []
        self.full_gets = 0

    def __getitem__(self, key):
        self.full_gets += 1
        return super().__getitem__(key)

    def get_partial_values(self, key_ranges):
        self.partial_calls.append(list(key_ranges))
        out = []
        for key, (start, length) in key_ranges:
            if not dict.__contains__(self, key):
                out.append(None)
                continue
            data = dict.__getitem__(self, key)
            lo = max(0, len(data) + start) if start < 0 else start
            out.append(data[lo:] if length is None else data[lo : lo + length])
        return out


def test_inner_get_partial_values_is_used_instead_of_full_gets():
    inner = PartialMapping()
    store = ShardingStore(inner, chunks_per_shard=(4,), array_path="a")
    store.update({key(i): payload((i,)) for i in range(4)})
    inner.full_gets = 0
    assert store[key(2)] == payload((2,))
    assert inner.full_gets == 0
    # index suffix, the chunk range, then the index suffix again: a mapping with
    # get_partial_values reports no object version, so the engine re-reads the index and
    # compares it to prove the chunk bytes came from the index it used (issue 12 item 6)
    assert [len(c) for c in inner.partial_calls] == [1, 1, 1]
    assert inner.partial_calls[0][0][1][0] == -index_nbytes((4,))
    assert inner.partial_calls[2][0][1][0] == -index_nbytes((4,))


def test_written_objects_get_ordinary_file_permissions(tmp_path):
    """Atomic writes go through mkstemp (0600); published objects must be readable like open()'s."""
    import os
    import stat

    from sharding_store.stores import FILE_MODE

    store = ShardingStore(str(tmp_path), chunks_per_shard=(2,), array_path="a")
    store[key(0)] = b"x"
    mode = stat.S_IMODE(os.stat(tmp_path / "data/root/a/c0").st_mode)
    assert mode == FILE_MODE and mode & stat.S_IRUSR and mode != 0o600


def _churn(inner, name: str, rounds: int) -> None:
    """Write, read back and delete one key, whose directories every delete prunes."""
    key = f"a/b/c/d/{name}"
    for i in range(rounds):
        inner.set(key, b"x" * (i % 7))
        assert inner.get(key) == b"x" * (i % 7)
        inner.delete(key)


def test_local_writes_survive_concurrent_deletes_pruning_their_directories(tmp_path):
    """A delete prunes directories it leaves empty; a write into the same directories at
    that moment (its ``makedirs`` or its temporary file) must retry, never fail."""
    from sharding_store.stores import LocalInner

    inner = LocalInner(str(tmp_path))
    errors: list[str] = []

    def churn(name: str) -> None:
        try:
            _churn(inner, name, 300)
        except BaseException:  # noqa: BLE001 - reported below, with where it was raised
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=churn, args=(n,)) for n in ("k1", "k2", "k3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert list(inner.list_prefix("")) == [] and not (tmp_path / "a").exists()


def test_a_prune_in_this_process_waits_for_a_writer_that_made_the_directory(tmp_path, monkeypatch):
    """Deterministic form of the race above: a delete's prune runs right after the
    writer's ``makedirs``, before its ``open``. In one process it must wait (the writer
    then succeeds on its first retry), not empty the directory away on every try."""
    import os

    from sharding_store.stores import LocalInner

    inner = LocalInner(str(tmp_path))
    real_mkdir = os.mkdir
    pruners: list[threading.Thread] = []

    def mkdir_then_prune(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if os.fspath(path) not in (str(tmp_path / "a" / "b"), "b"):  # the last directory (by path or in a/'s fd)
            return
        pruner = threading.Thread(target=inner.delete, args=("a/b/gone",))  # prunes a/b, then a
        pruner.start()
        pruner.join(timeout=0.2)  # with the directory lock it is still waiting here
        pruners.append(pruner)

    monkeypatch.setattr(os, "mkdir", mkdir_then_prune)
    inner.set("a/b/k", b"value")
    for pruner in pruners:
        pruner.join()
    assert len(pruners) == 1  # made once, never taken away from under the writer
    assert inner.get("a/b/k") == b"value" and list(inner.list_prefix("")) == ["a/b/k"]


def _churn_process(root: str, name: str, rounds: int) -> None:
    from sharding_store.stores import LocalInner

    _churn(LocalInner(root), name, rounds)


@pytest.mark.slow  # racing processes
def test_local_writes_survive_other_processes_pruning_their_directories(tmp_path):
    """Across processes the lock cannot help: the writer backs off and re-makes the
    directory. Three processes churning one directory, 1000 rounds each, never fail."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_churn_process, args=(str(tmp_path), n, 1000)) for n in ("k1", "k2", "k3")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert not (tmp_path / "a").exists()


def test_single_array_keywords_are_one_checked_bundle(tmp_path):
    """``chunks_per_shard``/``array_path``/``separator`` travel as one typed bundle (issue
    23: at most 8 parameters): each still takes effect, a misspelt one is a TypeError
    naming it before the store is opened, a bad separator is our UsageError."""
    from sharding_store.errors import UsageError

    store = ShardingStore(str(tmp_path), chunks_per_shard=(2,), array_path="a/b", separator=".")
    store["data/root/a/b/c3"] = b"x"  # chunk 3 of shard 1 ("." separator: one flat key per shard)
    assert sorted(p.name for p in (tmp_path / "data/root/a/b").iterdir()) == ["c1"]
    assert store["data/root/a/b/c3"] == b"x"
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_per_shard'"):
        ShardingStore(str(tmp_path / "never"), chunk_per_shard=2)
    assert not (tmp_path / "never").exists()
    with pytest.raises(UsageError, match="separator '-'"):
        ShardingStore(str(tmp_path), chunks_per_shard=2, separator="-")
