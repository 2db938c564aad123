"""ShardingStore against zarr-python 2.18's own ShardingStorageTransformer.

* every chunk key: the exact bytes 2.18's transformer returns;
* listings of each array's data prefix agree (list_prefix, and list_dir's full keys);
* shards rewritten by ShardingStore are read back by 2.18 with identical values.

Run over the corpus 2.18 wrote (compat/legacy/make_corpus.py) and over the 47 real
zarr-js stores in shared/fixtures (copied first: they are read-only input).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from compat import oracle
from sharding_store import ShardingStore
from sharding_store.testing import CountingInner
from tests.fixtures import MISSING, ZARR_JS, available, store_paths

pytestmark = pytest.mark.legacy

FIXTURES = ZARR_JS


def _stores(legacy_corpus, tmp_path_factory) -> dict[str, Path]:
    stores = {f"corpus/{k}": v for k, v in oracle.corpus_stores(legacy_corpus).items()}
    dst = tmp_path_factory.mktemp("zarr-js")
    for p in store_paths(FIXTURES):  # none where ../shared is absent: the corpus alone
        stores[f"zarr-js/{p.name}"] = Path(shutil.copytree(p, dst / p.name))
    return stores


@pytest.fixture(scope="module")
def dumps(legacy_env, legacy_corpus, tmp_path_factory):
    stores = _stores(legacy_corpus, tmp_path_factory)
    by_path = oracle.legacy_dump_many(stores.values())
    return {name: (store, by_path[Path(store).resolve()]) for name, store in stores.items()}


def _readable_arrays(dump):
    return [p for p in dump.arrays if p not in dump.errors and p in dump.chunks]


def test_corpus_and_fixtures_present(dumps):
    assert sum(n.startswith("corpus/") for n in dumps) >= 10
    if not available(FIXTURES):
        pytest.skip(MISSING)
    assert sum(n.startswith("zarr-js/") for n in dumps) == 47


def test_every_chunk_key_returns_the_oracle_bytes(dumps):
    checked = sharded = 0
    for name, (store_dir, dump) in dumps.items():
        store = ShardingStore(str(store_dir))
        for path in _readable_arrays(dump):
            chunks = dump.chunks[path]
            got = store.getitems(chunks)
            assert set(got) == set(chunks), (name, path)
            for key, expected in chunks.items():
                assert got[key] == expected, (name, path, key)
                assert store[key] == expected, (name, path, key)
            checked += len(chunks)
            sharded += dump.sharded(path)
    assert checked > 500 and sharded > 40


def test_listings_agree(dumps):
    for name, (store_dir, dump) in dumps.items():
        store = ShardingStore(str(store_dir))
        for path in _readable_arrays(dump):
            prefix = dump.data_prefix(path)
            if path == "" and any(p for p in dump.arrays if p):
                continue  # a root array with siblings: 2.18 claims their keys (see manifest)
            assert sorted(store.list_prefix(prefix)) == dump.listing[path], (name, path)
            keys, _ = store.list_dir(prefix)
            assert keys == dump.list_dir[path][0], (name, path)


def test_single_chunk_read_costs_two_ranges_on_real_data(dumps):
    for name, (store_dir, dump) in dumps.items():
        for path in _readable_arrays(dump):
            if not dump.sharded(path) or not dump.chunks[path]:
                continue
            inner = CountingInner(str(store_dir))
            store = ShardingStore(inner)
            first, key = sorted(dump.chunks[path])[0], sorted(dump.chunks[path])[-1]
            store[first]  # metadata lookups happen once per array, not per chunk
            inner.reset()
            assert store[key] == dump.chunks[path][key]
            assert inner.ranges == 2 and inner.calls["get"] == 0, (name, key, inner.log)


def test_shards_rewritten_by_sharding_store_are_read_by_legacy(dumps, tmp_path):
    """Rebuild every sharded array's shards through ShardingStore; 2.18 must read the same values."""
    rewritten = 0
    for name, (store_dir, dump) in dumps.items():
        targets = [p for p in _readable_arrays(dump) if dump.sharded(p) and dump.chunks[p]]
        if not targets:
            continue
        copy = Path(shutil.copytree(store_dir, tmp_path / name.replace("/", "_")))
        store = ShardingStore(str(copy))
        for path in targets:
            chunks = dump.chunks[path]
            keys = sorted(chunks)
            store.erase_values(keys[: len(keys) // 2])  # partial rewrites (index + survivors read)
            store.erase_prefix(dump.data_prefix(path))  # whole shards dropped
            assert list(store.list_prefix(dump.data_prefix(path))) == []
            half = len(keys) // 2
            store.update({k: chunks[k] for k in keys[half:]})  # whole/partial shards built
            for k in keys[:half]:
                store[k] = chunks[k]  # one chunk at a time: read-modify-write
            rewritten += 1
        oracle.assert_legacy_reads(copy, {p: dump.arrays[p] for p in _readable_arrays(dump)})
    assert rewritten > 20
