"""zarr-python 2.18 reads every resharded corpus store with the values and chunks it read before."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from compat import oracle
from compat.oracle import arrays_equal
from sharding_store import DraftMetadataError, StoreNotFoundError

pytestmark = pytest.mark.legacy

rs = importlib.import_module("sharding_store.ops.resharding")

# (name, operation): each applied to a fresh copy of every corpus store
OPERATIONS = {
    "unshard": lambda src, dst: rs.unshard(src, progress=False),
    "cps2": lambda src, dst: rs.reshard(src, chunks_per_shard=2, progress=False),
    "cps3-copy": lambda src, dst: rs.reshard(src, dst, chunks_per_shard=3, progress=False),
    "shard4": lambda src, dst: rs.shard(src, chunks_per_shard=4, progress=False),
}


#: arrays this package cannot parse (object dtype): reshard leaves them alone, as damaged
LEFT_ALONE = {("odd_dtypes", "vlen_utf8")}


@pytest.fixture(scope="module")
def resharded(legacy_corpus, tmp_path_factory):
    """{(case, op): (original store, resharded store)} for every corpus store."""
    root = tmp_path_factory.mktemp("resharded")
    out = {}
    for case, store in oracle.corpus_stores(legacy_corpus).items():
        for op, run in OPERATIONS.items():
            src = root / f"{case}.{op}"
            shutil.copytree(store, src)
            dst = root / f"{case}.{op}.out"
            try:
                run(src, dst)
            except (DraftMetadataError, StoreNotFoundError):  # a dtype this package cannot parse (object arrays)
                assert _digest(src) == _digest(Path(store)), f"{case}: refused, but changed"
                continue
            out[(case, op)] = (Path(store), dst if dst.exists() else src)
    assert len(out) >= 0.9 * len(OPERATIONS) * len(oracle.corpus_stores(legacy_corpus))
    return out


def _digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_legacy_reads_resharded_stores_identically(resharded):
    dumps = oracle.legacy_dump_many({p for pair in resharded.values() for p in pair})
    for (case, op), (before, after) in resharded.items():
        old, new = dumps[before.resolve()], dumps[after.resolve()]
        where = f"{case} after {op}"
        assert new.arrays.keys() == old.arrays.keys(), where
        assert new.errors.keys() == old.errors.keys(), where
        for path, values in old.arrays.items():
            assert arrays_equal(new.arrays[path], values), f"{where}: array '{path}'"
            assert new.chunks[path] == old.chunks[path], f"{where}: chunk payloads of '{path}'"
            assert new.listing[path] == old.listing[path], f"{where}: listing of '{path}'"


def test_layouts_changed_as_asked(resharded):
    dumps = oracle.legacy_dump_many({after for _, after in resharded.values()}, chunks=False)
    for (case, op), (_, after) in resharded.items():
        for path, info in dumps[after.resolve()].info.items():
            if info.get("error") or "resized" in case or (case, path) in LEFT_ALONE:
                continue
            cps = info["effective_chunks_per_shard"]
            ndim = len(info["shape"])
            if op == "unshard":
                assert not info["sharded"], (case, path)
            elif op in ("cps2", "cps3-copy"):
                n = 2 if op == "cps2" else 3
                assert list(cps)[:ndim] == [n] * ndim, (case, path, cps)
            else:
                assert info["sharded"], (case, path)


def _composed(counted) -> dict[str, int]:
    """Target key -> the number of parts :meth:`Inner.compose` built it from."""
    return {detail[0]: detail[1] for name, detail in counted.log if name == "compose"}


def test_each_legacy_shard_run_is_one_kernel_copy(legacy_corpus, tmp_path):
    """zarr-python 2.18 holds a shard's chunks back to back, not in grid order (the chunk
    written last first, the others in a set's order; a chunk deleted leaves its bytes
    dead). Doubling chunks_per_shard puts whole source shards into each target: each
    target must be composed of one part (one kernel copy) per run of chunks lying back to
    back in a contributing source shard, plus its index: one per source shard, but for
    shards with dead bytes."""
    from sharding_store.api.hierarchy import open_hierarchy
    from sharding_store.engine.store import ArrayLayout
    from sharding_store.formats.keys import local_to_global
    from sharding_store.formats.shard_index import read_index
    from sharding_store.ops.jobs import other_prefixes
    from sharding_store.ops.options import ReshardOptions
    from sharding_store.testing import CountingInner
    from tests.unit.ops.test_reshard_runs import expected_runs

    checked = whole = 0
    for i, arr in enumerate(a for a in oracle.corpus_arrays(legacy_corpus) if a.sharded):
        h = open_hierarchy(str(arr.store), strict=False)
        try:
            node, others = h.node(arr.path), other_prefixes(h, arr.path)
        except (DraftMetadataError, StoreNotFoundError):  # a dtype this package cannot parse (object arrays)
            continue
        if node.meta is None or not node.meta.ndim or node.meta.chunks_per_shard is None:
            continue
        old = ArrayLayout.from_meta(node.meta)
        cps = node.meta.chunks_per_shard
        located, sources = {}, {}
        for key in h.inner.list_prefix(old.prefix):
            coords = old.parse(key)
            if coords is not None and not key.startswith(others or ("\0",)):
                sources.setdefault(tuple(c // 2 for c in coords), set()).add(key)
                for local, off, nb in read_index((arr.store / key).read_bytes(), cps).live():
                    located[local_to_global(coords, local, cps)] = (key, off, nb)
        new = tuple(2 * c for c in cps)
        runs = expected_runs(located, new)
        counted = CountingInner(str(arr.store))
        try:
            rs.reshard(counted, tmp_path / f"{i}", ReshardOptions(new, arrays=(arr.path,)), progress=False)
        except DraftMetadataError:  # a dtype this package cannot parse: left alone (above)
            continue
        composed = {d[0]: d[1] for name, d in counted.log if name == "compose"}
        assert composed == {old.shard_key(t): n + 1 for t, n in runs.items()}, arr.id
        checked += 1
        whole += all(n == len(sources[t]) for t, n in runs.items())
        shutil.rmtree(tmp_path / f"{i}")
    assert checked >= 40 and whole >= 0.8 * checked  # most 2.18 shards are one run each
