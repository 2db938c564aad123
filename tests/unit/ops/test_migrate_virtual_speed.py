"""What a virtual migration's speed rests on (issue 24: <= 50 µs of client time per object
locally): per batch of units one tail read, one batched write of the references, no
directory walked again per object. Each property counted, not timed."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

from sharding_store import MigrateOptions, create_draft_array, open_references
from sharding_store.ops.migration import migrate
from sharding_store.stores.local_fd import DIR_FDS_MAX, DirFds

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: shard rows (one source directory each: ``c<i>/``) and columns of :func:`_many_dirs`
ROWS, COLS = DIR_FDS_MAX + 6, 8


def _many_dirs(root) -> np.ndarray:
    """A draft array of ``ROWS`` x ``COLS`` shards: more shard directories than a store
    caches descriptors of, several shards in each."""
    data = np.arange(ROWS * 4 * COLS * 4, dtype="<i4").reshape(ROWS * 4, COLS * 4)
    create_draft_array(str(root), "a", shape=data.shape, chunks=(2, 2), chunks_per_shard=(2, 2),
                       dtype=data.dtype)[...] = data
    return data


def test_each_source_directory_is_walked_once_not_once_per_shard(monkeypatch, tmp_path):
    """A virtual destination creates no file, so its units keep the listing's order
    (interleaving them over the target directories, as a copy does, made every tail read
    walk its directory again from the root: the cache of descriptors held fewer than the
    directories visited in turn). The listing walks each once; the tail reads and the
    references made in the same batch find it cached."""
    data = _many_dirs(tmp_path / "src")
    walks = []
    real = DirFds._walk

    def walk(self, spelled, key, create):
        walks.append(spelled)
        return real(self, spelled, key, create)

    monkeypatch.setattr(DirFds, "_walk", walk)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False),
                     progress=False)
    assert report.totals.referenced == ROWS * COLS
    shard_dirs = [w for w in walks if w.startswith("data/root/a/c")]
    assert len(shard_dirs) == len(set(shard_dirs)) == ROWS, f"{len(shard_dirs)} walks of {ROWS} shard directories"
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["a"][...],
                                  data)
    assert len(json.loads((tmp_path / "out.json").read_bytes())["refs"]) > ROWS * COLS


class _CountingDb:
    """A SQLite connection that counts the statements the sink runs (``execute`` and
    ``executemany`` calls: Python's cost per call, whatever the rows)."""

    def __init__(self, db, calls: list[str]) -> None:
        self._db, self._calls = db, calls

    def execute(self, sql, *args):
        self._calls.append(sql)
        return self._db.execute(sql, *args)

    def executemany(self, sql, rows):
        self._calls.append(sql)
        return self._db.executemany(sql, rows)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_reference_file_takes_a_batch_of_references_in_a_few_statements(monkeypatch, tmp_path):
    """References go into the sink's table a batch at a time (three statements a batch of
    shards, or a unit of chunk objects), not two statements per reference; read back equal.
    (A sink holds its first ``IN_MEMORY`` references in memory: none here, so every one goes
    into the table.)"""
    from sharding_store.ops.jobs import INLINE_BATCH
    from sharding_store.stores import references

    monkeypatch.setattr(references, "IN_MEMORY", 0)

    shards = 2 * INLINE_BATCH + 3
    data = np.arange(shards * 4 * 4, dtype="<i4").reshape(shards * 4, 4)
    create_draft_array(str(tmp_path / "src"), "a", shape=data.shape, chunks=(2, 2), chunks_per_shard=(2, 2),
                       dtype=data.dtype)[...] = data
    flat = np.arange(40 * 4, dtype="<u2").reshape(40, 4)  # unsharded: 40 chunk objects
    create_draft_array(str(tmp_path / "src"), "flat", shape=flat.shape, chunks=(1, 4), dtype=flat.dtype)[...] = flat
    calls: list[str] = []
    real = references._Table.__init__

    def init(self, where):
        real(self, where)
        self.db = _CountingDb(self.db, calls)

    monkeypatch.setattr(references._Table, "__init__", init)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False),
                     progress=False)
    assert report.totals.referenced == shards + 40
    inserts = [sql for sql in calls if sql.startswith("INSERT")]
    assert len(inserts) <= 2 * 4, f"{len(inserts)} INSERT statements for {shards + 40} references"
    group = zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")
    np.testing.assert_array_equal(group["a"][...], data)
    np.testing.assert_array_equal(group["flat"][...], flat)


def test_a_failed_batch_of_references_is_put_one_by_one(monkeypatch, tmp_path):
    """A batch the destination refuses as a whole is no failed unit: each reference is put
    alone, and the run completes with every one of them."""
    from sharding_store.errors import StoreIOError
    from sharding_store.stores.references import ReferenceFileSink

    data = _many_dirs(tmp_path / "src")

    def refuse(self, array, refs):
        raise StoreIOError("the batch", key=refs[0][0])

    monkeypatch.setattr(ReferenceFileSink, "put_references", refuse)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False),
                     progress=False, retries=1)
    assert report.totals.referenced == ROWS * COLS
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["a"][...],
                                  data)


def test_icechunk_takes_a_batch_of_references_with_one_call(monkeypatch, tmp_path):
    """Icechunk gets a batch of shards' (or a unit of chunk objects') references with one
    ``set_virtual_refs``, never one ``set_virtual_ref`` per key; the repository reads equal."""
    ic = pytest.importorskip("icechunk")
    from icechunk.store import IcechunkStore

    from sharding_store.ops.jobs import INLINE_BATCH

    shards = 2 * INLINE_BATCH + 3
    data = np.arange(shards * 4 * 4, dtype="<i4").reshape(shards * 4, 4)
    create_draft_array(str(tmp_path / "src"), "a", shape=data.shape, chunks=(2, 2), chunks_per_shard=(2, 2),
                       dtype=data.dtype)[...] = data
    flat = np.arange(40 * 4, dtype="<u2").reshape(40, 4)
    create_draft_array(str(tmp_path / "src"), "flat", shape=flat.shape, chunks=(1, 4), dtype=flat.dtype)[...] = flat
    calls: dict[str, list[int]] = {"set_virtual_ref": [], "set_virtual_refs": []}
    one, many = IcechunkStore.set_virtual_ref, IcechunkStore.set_virtual_refs

    def set_virtual_ref(self, key, *args, **kwargs):
        calls["set_virtual_ref"].append(1)
        return one(self, key, *args, **kwargs)

    def set_virtual_refs(self, array_path, chunks, **kwargs):
        calls["set_virtual_refs"].append(len(chunks))
        return many(self, array_path, chunks, **kwargs)

    monkeypatch.setattr(IcechunkStore, "set_virtual_ref", set_virtual_ref)
    monkeypatch.setattr(IcechunkStore, "set_virtual_refs", set_virtual_refs)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "repo"), MigrateOptions(target="icechunk", virtual=True,
                                                                                     verify=False), progress=False)
    assert report.totals.referenced == shards + 40
    assert calls["set_virtual_ref"] == [], f"{len(calls['set_virtual_ref'])} references set one at a time"
    assert sum(calls["set_virtual_refs"]) == shards + 40 and len(calls["set_virtual_refs"]) <= 4
    grants = {f"file://{os.path.realpath(tmp_path / 'src')}/": None}
    repo = ic.Repository.open(ic.local_filesystem_storage(str(tmp_path / "repo")), authorize_virtual_chunk_access=grants)
    group = zarr.open_group(repo.readonly_session("main").store, mode="r")
    np.testing.assert_array_equal(group["a"][...], data)
    np.testing.assert_array_equal(group["flat"][...], flat)


@pytest.mark.parametrize("damage", ["none", "past the end", "half sentinel", "truncated"])
def test_a_batch_of_indices_is_checked_at_once_and_a_bad_one_alone(monkeypatch, tmp_path, damage):
    """Sound shard indices are checked a batch at a time (no per-shard list of entries); a
    damaged one among them is checked alone and refused, naming its shard, as before."""
    from sharding_store.errors import ShardCorruptError
    from sharding_store.ops import units

    data = _many_dirs(tmp_path / "src")
    bad = tmp_path / "src/data/root/a/c3/5"
    blob = bytearray(bad.read_bytes())
    if damage == "past the end":
        blob[-16:-8] = (len(blob) - 64).to_bytes(8, "little")  # the last chunk runs into the index
    elif damage == "half sentinel":
        blob[-16:-8] = (2**64 - 1).to_bytes(8, "little")
    elif damage == "truncated":
        blob = blob[-40:]  # shorter than its index
    bad.write_bytes(bytes(blob))
    alone = []
    real = units.live_entries

    def live_entries(data, cps, **kwargs):
        alone.append(kwargs["key"])
        return real(data, cps, **kwargs)

    monkeypatch.setattr(units, "live_entries", live_entries)
    if damage == "none":
        report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False),
                         progress=False)
        assert report.totals.referenced == ROWS * COLS and report.totals.chunks == ROWS * COLS * 4
        assert alone == []
        group = zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")
        np.testing.assert_array_equal(group["a"][...], data)
        return
    with pytest.raises(ShardCorruptError, match="data/root/a/c3/5"):
        migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False), progress=False)
    assert alone in ([], ["data/root/a/c3/5"])  # truncated: refused before its entries are read


def _system_calls(monkeypatch) -> dict[str, int]:
    """Calls of the ``os`` functions a local store makes per object, counted (``scandir``:
    one per directory listed), and those our loops' tail reader makes for it (per file
    handed to ``_native.read_tails``: one ``open``, ``fstat``, ``pread``, and an ``lstat``
    when given the directory's resolved path; a directory listed by ``_native.list_dir``:
    one ``scandir``)."""
    import collections

    from sharding_store.codec import _native

    counts: dict[str, int] = collections.Counter()
    for name in ("open", "fstat", "lstat", "stat", "pread", "scandir"):
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, counted)
    real_tails = _native.read_tails

    def read_tails(reader, dir_fd, names, count, tail_nbytes, real_dir):  # noqa: ANN001, ANN202
        for name in ("open", "fstat", "pread") + (("lstat",) if real_dir is not None else ()):
            counts[name] += count
        return real_tails(reader, dir_fd, names, count, tail_nbytes, real_dir)

    monkeypatch.setattr(_native, "read_tails", read_tails)
    real_list = _native.list_dir

    def list_dir(reader, dir_fd, sizes):  # noqa: ANN001, ANN202 - a directory listed in one C call
        counts["scandir"] += 1
        return real_list(reader, dir_fd, sizes)

    monkeypatch.setattr(_native, "list_dir", list_dir)
    return counts


def test_a_virtual_migration_opens_and_stats_each_shard_once_and_lists_it_once(monkeypatch, tmp_path):
    """Per shard a virtual migration makes one ``open``, ``fstat`` and ``pread`` (its index
    tail, through the held directory descriptor) and one ``lstat`` (its URL checked to lead
    to the file read); its size comes with its directory entry (no ``stat`` per shard). The
    reference check after it takes the migration's listing (no directory listed again,
    nothing opened) and looks at each object now: one more ``lstat`` a shard. Files older
    than the recent-write window, as a store being migrated is."""
    import time

    data = _many_dirs(tmp_path / "src")
    old = time.time_ns() - 3600 * 10**9
    for where, _, files in os.walk(tmp_path / "src"):
        for name in files:
            os.utime(os.path.join(where, name), ns=(old, old))
    n = ROWS * COLS
    counts = _system_calls(monkeypatch)
    migrate(str(tmp_path / "src"), str(tmp_path / "quiet.json"), MigrateOptions(verify=False), progress=False)
    quiet = dict(counts)
    counts.clear()
    from sharding_store.ops import migration

    real_check, in_check = migration._verify_after, {}

    def counted_check(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        before = dict(counts)
        try:
            return real_check(*args, **kwargs)
        finally:
            in_check.update({k: v - before.get(k, 0) for k, v in counts.items()})

    monkeypatch.setattr(migration, "_verify_after", counted_check)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    checked = dict(counts)
    monkeypatch.undo()
    assert report.verification.ok and report.totals.referenced == n
    assert quiet["stat"] < ROWS, quiet  # the listing's sizes: from the directory entries
    for name in ("open", "fstat", "pread"):
        assert n <= quiet[name] <= n + 3 * ROWS, (name, quiet)
    assert n <= quiet["lstat"] <= n + 2 * ROWS, quiet
    assert checked["scandir"] - quiet["scandir"] <= 5, (quiet, checked)  # not one per shard directory
    assert checked["open"] - quiet["open"] <= 10 and checked["stat"] - quiet["stat"] <= 10, (quiet, checked)
    # the check alone: one lstat a shard, plus one a directory (resolved below its resolved
    # parent) and, once, the components of the store's path that realpath looks at
    depth = len((tmp_path / "src" / "data" / "root" / "a" / "c0").parts)
    assert n <= in_check["lstat"] <= n + ROWS + 2 * depth, in_check
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["a"][...],
                                  data)


def test_a_virtual_migration_does_per_shard_only_what_each_needs(monkeypatch, tmp_path):
    """What a shard costs in Python, counted: its key parsed by one regular expression
    (``ArrayLayout.parse``, no call of the part-by-part parser); units with the same counts
    share one ``UnitResult`` (the driver only adds them up); each source directory's URL
    quoted once for the reference file (its objects' names apart), not once per reference
    and object. The file read back equal, its JSON as ``json`` writes it."""
    from sharding_store.engine import shard_engine
    from sharding_store.ops import units
    from sharding_store.stores import references

    data = _many_dirs(tmp_path / "src")
    n = ROWS * COLS
    parsed, results, quoted = [0], [0], []
    real_parse, real_quote = shard_engine.parse_chunk_suffix, references._json_string

    def parse(*args):  # noqa: ANN002, ANN202
        parsed[0] += 1
        return real_parse(*args)

    class Counted(units.UnitResult):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            results[0] += 1
            super().__init__(*args, **kwargs)

    def quote(text):  # noqa: ANN001, ANN202
        quoted.append(text)
        return real_quote(text)

    monkeypatch.setattr(shard_engine, "parse_chunk_suffix", parse)
    monkeypatch.setattr(units, "UnitResult", Counted)
    monkeypatch.setattr(references, "_json_string", quote)
    report = migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), MigrateOptions(verify=False), progress=False)
    monkeypatch.undo()
    assert report.totals.referenced == n and report.totals.chunks == n * 4
    assert parsed[0] == 0, parsed
    from sharding_store.ops.jobs import INLINE_BATCH

    assert results[0] <= -(-n // INLINE_BATCH) < n, results  # one a batch (its shards alike)
    urls = [t for t in quoted if t.startswith("file://")]
    assert len(urls) == 2 * ROWS and all(t.endswith("/") for t in urls), urls[:3]  # refs, then objects
    raw = (tmp_path / "out.json").read_bytes()
    doc = json.loads(raw)
    assert raw == json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    np.testing.assert_array_equal(zarr.open_group(open_references(str(tmp_path / "out.json")), mode="r")["a"][...],
                                  data)


def test_a_virtual_migration_holds_the_garbage_collector_off_and_leaves_no_cycle_a_shard(monkeypatch, tmp_path):
    """The units run with the cyclic collector off (every collection would only traverse
    the run's live objects again) and it is on again after, or stays off when the caller
    had turned it off; nothing a shard needs it: the objects in cycles a migration leaves
    are far fewer than its shards (counted with the collector off throughout)."""
    import gc

    from sharding_store.ops import migration, units

    seen = []
    real = units.refer_units
    monkeypatch.setattr(migration, "refer_units", lambda batch: seen.append(gc.isenabled()) or real(batch))
    _many_dirs(tmp_path / "src")
    migrate(str(tmp_path / "src"), str(tmp_path / "a.json"), MigrateOptions(verify=False), progress=False)
    assert seen and not any(seen) and gc.isenabled()
    monkeypatch.undo()
    gc.collect()
    gc.disable()
    try:
        migrate(str(tmp_path / "src"), str(tmp_path / "b.json"), MigrateOptions(verify=False), progress=False)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        in_cycles = sum(type(x) is not tuple for x in gc.garbage)  # tuples: the sink's rows, held by it
        gc.garbage.clear()
        gc.set_debug(0)
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert in_cycles < ROWS * COLS / 2, in_cycles  # ~100: the JSON encoders' closures, the stores; not one a shard
