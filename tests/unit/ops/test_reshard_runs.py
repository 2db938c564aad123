"""Reshard on local disk copies payload *runs*, not chunks (issue 26).

A target shard is built by :meth:`Inner.compose` from, per contributing source shard, the
maximal runs of its chunks that lie back to back in the source file (in whatever order
the source holds them: zarr-python 2.18 writes the chunk it wrote last first, the others
in a set's order), then the index computed to match. Checked here, on sources whose
shards hold their chunks in a random order, some chunks and some shards missing, partial
edge shards included, some with dead bytes and entries sharing another chunk's bytes:

* the target shards reference every source chunk exactly once (each at its coordinates,
  its bytes unchanged, no byte shared or dead) and the array reads equal;
* each target shard is composed of exactly one part per contributing source run (plus
  its index), and each part is one kernel copy (counted at ``_copy_range``).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store import reshard
from sharding_store.api.arrays import create_draft_array
from sharding_store.engine.store import ArrayLayout
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats.keys import chunk_to_shard, local_to_global
from sharding_store.formats.shard_index import ShardIndex, read_index
from sharding_store.ops.jobs import target_range
from sharding_store.stores import LocalInner
from sharding_store.stores import local as local_mod
from sharding_store.testing import CountingInner
from tests.unit.ops.test_reshard import assert_same_values, rs, values

_N = itertools.count()
PATH = "a/b"

Located = dict[tuple[int, ...], tuple[str, int, int]]  # global chunk coords -> (key, offset, nbytes)


def layout_of(root: Path) -> ArrayLayout:
    key = dm.array_meta_key(PATH)
    meta = dm.parse_array_metadata(LocalInner(root).get(key), key, PATH)
    return ArrayLayout.from_meta(meta)


def scramble(root: Path, rng: random.Random, drop: float, *, odd: bool = False) -> None:
    """Rewrite every shard of ``a/b`` as zarr-python 2.18 might hold it: its chunks in a
    random order, back to back, some dropped (``drop``: the chance of each), the index
    matching; a shard left without a chunk is deleted. ``odd``: also what other writers
    leave, dead bytes between some chunks and entries that share another chunk's bytes."""
    layout, inner = layout_of(root), LocalInner(root)
    cps = layout.chunks_per_shard
    assert cps is not None
    for key in list(inner.list_prefix(layout.prefix)):
        blob = inner.get(key)
        assert blob is not None
        chunks = [(c, blob[o : o + n]) for c, o, n in read_index(blob, cps).live() if rng.random() >= drop]
        rng.shuffle(chunks)
        if not chunks:
            inner.delete(key)
            continue
        index, body, last = ShardIndex.empty(cps), bytearray(), (0, 0)
        for i, (coords, payload) in enumerate(chunks):
            if odd and i and rng.random() < 0.2:  # this entry reads the previous chunk's bytes
                index.set(coords, *last)
                continue
            if odd and rng.random() < 0.2:
                body += b"dead"
            last = (len(body), len(payload))
            index.set(coords, *last)
            body += payload
        inner.set(key, bytes(body) + index.to_bytes())


def located_chunks(root: Path, layout: ArrayLayout) -> Located:
    """Where every chunk of ``a/b`` lies, read from the shard files themselves."""
    cps = layout.chunks_per_shard
    assert cps is not None
    out: Located = {}
    for key in LocalInner(root).list_prefix(layout.prefix):
        coords = layout.parse(key)
        assert coords is not None
        for local, off, nb in read_index((root / key).read_bytes(), cps).live():
            out[local_to_global(coords, local, cps)] = (key, off, nb)
    return out


def expected_runs(located: Located, new_cps: tuple[int, ...]) -> dict[tuple[int, ...], int]:
    """Target shard -> how many runs its chunks form in their sources: per source, the
    chunks' byte ranges sorted, a new run wherever one does not start where the last ended."""
    by_target: dict[tuple[int, ...], dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for coords, (key, off, nb) in located.items():
        by_target[chunk_to_shard(coords, new_cps)[0]][key].append((off, off + nb))
    runs = {}
    for target, sources in by_target.items():
        n = 0
        for ranges in sources.values():
            ranges.sort()
            n += 1 + sum(1 for (_, end), (start, _) in zip(ranges, ranges[1:]) if start != end)
        runs[target] = n
    return runs


def chunk_bytes(root: Path, layout: ArrayLayout, *, compact: bool = True) -> dict[tuple[int, ...], bytes]:
    """Every chunk of ``a/b`` by global coords; with ``compact`` each shard is checked to
    hold no dead byte and no byte referenced twice (each chunk's bytes are its own)."""
    cps = layout.chunks_per_shard
    assert cps is not None
    out: dict[tuple[int, ...], bytes] = {}
    for key in LocalInner(root).list_prefix(layout.prefix):
        blob = (root / key).read_bytes()
        index = read_index(blob, cps)
        assert not compact or index.is_compact(len(blob)), key
        shard = layout.parse(key)
        assert shard is not None
        for local, off, nb in index.live():
            coords = local_to_global(shard, local, cps)
            assert coords not in out, f"{coords} referenced twice"
            out[coords] = blob[off : off + nb]
    return out


class CopyCounter:
    """Kernel copies (one ``_copy_range`` call each) by source key."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        copy = local_mod._copy_range

        def counted(key, *args, **kwargs):
            self.calls[key] += 1
            return copy(key, *args, **kwargs)

        monkeypatch.setattr(local_mod, "_copy_range", counted)


class OpenCounter:
    """Opens for reading of the files below ``root`` (relative path -> count), counted at
    ``os.open`` itself (every open of the store goes through it: by directory descriptor,
    resolved through ``/proc/self/fd``), so a second open of a source for its copy shows."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        if not os.path.isdir("/proc/self/fd"):
            pytest.skip("needs /proc/self/fd to name a descriptor's directory")
        self.calls: Counter[str] = Counter()
        top, real_open = str(root.resolve()), os.open

        def counted(path, flags, mode=0o777, *, dir_fd=None):
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            if not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECTORY", 0)):
                where = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else "", path)
                if where.startswith(top + "/") and os.path.isfile(where):
                    self.calls[os.path.relpath(where, top)] += 1
            return fd

        monkeypatch.setattr(os, "open", counted)

    def of(self, keys: Iterable[str]) -> dict[str, int]:
        return {k: self.calls[k] for k in keys}


def expected_opens(located: Located, old: tuple[int, ...], new: tuple[int, ...]) -> dict[str, int]:
    """Source shard key -> the reads it takes: one open in an lcm block (each source in one
    task), else one per target task that lists it (every target shard it overlaps)."""
    keys = sorted({key for key, _, _ in located.values()})
    if rs._block_shape(old, new) is not None:
        return dict.fromkeys(keys, 1)
    coords = {key: chunk_to_shard(c, old)[0] for c, (key, _, _) in located.items()}
    return {k: sum(1 for _ in target_range(coords[k], old, new)) for k in keys}


def composed_parts(counted: CountingInner) -> dict[str, int]:
    """Target key (staged or not) -> the number of parts it was composed of."""
    out: dict[str, int] = {}
    for name, detail in counted.log:
        if name == "compose":
            key, n = detail
            assert key.removeprefix(rs.STAGING) not in out, f"{key} composed twice"
            out[key.removeprefix(rs.STAGING)] = n
    return out


cps_of = st.integers(1, 4)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 11), min_size=1, max_size=3), data=st.data())
def test_targets_hold_each_source_run_in_one_copy(tmp_path, monkeypatch, shape, data):
    ndim = len(shape)
    chunks = tuple(data.draw(st.integers(1, 3), label="chunk") for _ in range(ndim))
    old = tuple(data.draw(cps_of, label="old cps") for _ in range(ndim))
    new = tuple(data.draw(cps_of, label="new cps") for _ in range(ndim))
    drop = data.draw(st.sampled_from([0.0, 0.3]), label="chance a chunk is missing")
    in_place = data.draw(st.booleans(), label="in place")
    odd = data.draw(st.booleans(), label="dead bytes and shared entries in the source")
    monkeypatch.setattr(rs, "MAX_BLOCK_FACTOR", data.draw(st.sampled_from([1, rs.MAX_BLOCK_FACTOR]), label="block"))
    base = tmp_path / f"ex{next(_N)}"
    arr = create_draft_array(str(base / "src"), PATH, shape=tuple(shape), chunks=chunks, dtype="<i4",
                             chunks_per_shard=old, compressor=None)
    arr[...] = np.arange(1, 1 + int(np.prod(shape)), dtype="<i4").reshape(shape)
    scramble(base / "src", data.draw(st.randoms(use_true_random=False), label="order"), drop, odd=odd)
    src_layout = layout_of(base / "src")
    located = located_chunks(base / "src", src_layout)
    before, vals = chunk_bytes(base / "src", src_layout, compact=False), values(base / "src")
    runs = expected_runs(located, new)
    if not in_place:
        shutil.copytree(base / "src", base / "pristine")
    counted = CountingInner(str(base / "src"))
    copies = CopyCounter(monkeypatch)
    opens, wanted = OpenCounter(monkeypatch, base / "src"), expected_opens(located, old, new)
    reshard(counted, None if in_place else base / "dst", chunks_per_shard=new, jobs=2, progress=False)
    monkeypatch.undo()
    out = base / ("src" if in_place else "dst")
    out_layout = layout_of(out)
    assert out_layout.chunks_per_shard == (new if new != old else old)
    if new == old:
        return
    # every source chunk exactly once, unchanged, and the array reads the same
    assert chunk_bytes(out, out_layout) == before
    assert_same_values(values(out), vals)
    # one compose part per source run, plus the index; one kernel copy per part
    composed = composed_parts(counted)
    assert composed == {out_layout.shard_key(t): n + 1 for t, n in runs.items()}
    assert sum(copies.calls.values()) == sum(runs.values())
    # each source shard opened once per task that reads it: its index and its payload runs
    # read through one descriptor (before: twice, once for the index, once for the copies)
    assert opens.of(wanted) == wanted
    if not in_place:  # the source was only read
        assert {p: p.read_bytes() for p in sorted((base / "src").rglob("*")) if p.is_file()} == {
            base / "src" / p.relative_to(base / "pristine"): p.read_bytes()
            for p in sorted((base / "pristine").rglob("*")) if p.is_file()}


def test_lcm_block_takes_one_copy_per_source_shard(tmp_path, monkeypatch):
    """2x2 -> 4x4 chunks per shard (each target holds four whole source shards), the
    sources' chunks in a random order: four kernel copies per target, as ``cp`` would
    make four file copies; before, one per chunk that did not follow its C-order
    predecessor in the file."""
    src = tmp_path / "src"
    arr = create_draft_array(str(src), PATH, shape=(32, 32), chunks=(2, 2), dtype="<i4", chunks_per_shard=(2, 2))
    arr[...] = np.arange(32 * 32, dtype="<i4").reshape(32, 32)
    scramble(src, random.Random(5), 0.0)
    vals = values(src)
    counted = CountingInner(str(src))
    copies = CopyCounter(monkeypatch)
    report = reshard(counted, tmp_path / "dst", chunks_per_shard=(4, 4), jobs=1, progress=False)
    monkeypatch.undo()
    composed = composed_parts(counted)
    assert report.objects_written == len(composed) == 16
    assert set(composed.values()) == {4 + 1}  # four source runs and the index
    assert sum(copies.calls.values()) == 64 and set(copies.calls.values()) == {1}  # one per source shard
    assert_same_values(values(tmp_path / "dst"), vals)


def test_payload_runs_unshare_overlapping_chunks():
    """Chunks that share bytes in their source (an index may point two entries at the
    same bytes) get their own copies: a target never shares bytes between chunks."""
    rows = [(0, 0, 10), (0, 0, 10), (0, 10, 5), (0, 12, 3), (1, 0, 0)]  # (source, offset, size), sorted
    src, offsets, sizes = (np.array(col, dtype=dt) for col, dt in zip(zip(*rows), ("i8", "u8", "u8")))
    parts, positions = rs.payload_runs(["s", "t"], src, offsets, sizes)
    assert parts == [("s", 0, 10), ("s", 0, 15), ("s", 12, 15), ("t", 0, 0)]
    assert positions.tolist() == [0, 10, 20, 25, 28]


@pytest.mark.parametrize("old,new,in_place", [
    ((8, 8), (16, 16), False),  # issue 26's case: four whole sources per target
    ((8, 8), (16, 16), True),
    ((4, 4), (2, 2), False),  # one source feeds four targets
    (None, (4, 4), False),  # one object per chunk, sharded
])
def test_each_source_object_is_opened_once(tmp_path, monkeypatch, old, new, in_place):
    """Issue 26's reshard: a source object's index and its payload are read through one
    descriptor (the index from its tail, the payload runs by kernel copies), so each
    source file is opened once, as ``cp`` opens it; the targets hold every source chunk
    once and read equal."""
    src = tmp_path / "src"
    arr = create_draft_array(str(src), PATH, shape=(48, 40), chunks=(2, 2), dtype="<u2", chunks_per_shard=old)
    arr[...] = np.arange(48 * 40, dtype="<u2").reshape(48, 40)
    layout = layout_of(src)
    if old is not None:
        scramble(src, random.Random(26), 0.0)  # zarr-python 2.18's order: no chunk follows its grid predecessor
        before = chunk_bytes(src, layout, compact=False)
    sources = sorted(str(p.relative_to(src)) for p in (src / "data").rglob("*") if p.is_file())
    vals = values(src)
    opens = OpenCounter(monkeypatch, src)
    report = reshard(src, None if in_place else tmp_path / "dst", chunks_per_shard=new, jobs=2, progress=False)
    monkeypatch.undo()
    wanted = dict.fromkeys(sources, 1)
    if old is None:  # the check that an unsharded array's objects are no shards reads its first one
        wanted[f"data/root/{PATH}/c0/0"] += 1
    assert opens.of(sources) == wanted
    out = src if in_place else tmp_path / "dst"
    assert report.objects_written == sum(1 for p in (out / "data").rglob("*") if p.is_file())
    if old is not None:
        assert chunk_bytes(out, layout_of(out)) == before
    assert_same_values(values(out), vals)


def test_sources_beyond_the_held_ones_are_opened_again_and_checked(tmp_path, monkeypatch):
    """A task holds at most ``HELD_SOURCES`` source descriptors between the index reads and
    the copies; the others are opened again for their copies (their version checked on the
    new descriptor): twice, and the targets still hold every chunk once and read equal."""
    src = tmp_path / "src"
    arr = create_draft_array(str(src), PATH, shape=(16, 16), chunks=(2, 2), dtype="<u2", chunks_per_shard=(2, 2))
    arr[...] = np.arange(256, dtype="<u2").reshape(16, 16)
    scramble(src, random.Random(7), 0.0)
    layout, vals = layout_of(src), values(src)
    before = chunk_bytes(src, layout, compact=False)
    sources = sorted(str(p.relative_to(src)) for p in (src / "data").rglob("*") if p.is_file())
    monkeypatch.setattr(local_mod, "HELD_SOURCES", 1)
    monkeypatch.setattr(rs, "COMPOSE_SOURCES", 4)  # one lcm block (4 sources) a task
    opens = OpenCounter(monkeypatch, src)
    reshard(src, tmp_path / "dst", chunks_per_shard=(4, 4), jobs=1, progress=False)
    monkeypatch.undo()
    assert len(sources) == 16 and sorted(opens.of(sources).values()) == [1] * 4 + [2] * 12  # 4 tasks: 1 held, 3 again
    assert chunk_bytes(tmp_path / "dst", layout_of(tmp_path / "dst")) == before
    assert_same_values(values(tmp_path / "dst"), vals)
