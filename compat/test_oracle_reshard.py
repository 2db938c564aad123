"""zarr-python 2.18 reads every resharded corpus store with the values and chunks it read before."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from compat import oracle
from compat.oracle import arrays_equal
from sharding_store import DraftMetadataError

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
            except DraftMetadataError:  # a dtype this package cannot parse (object arrays)
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
