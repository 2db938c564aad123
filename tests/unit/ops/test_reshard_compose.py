"""Reshard without passing payloads through Python: :meth:`Inner.compose`.

On local disk every target object is built by kernel copies of source ranges plus the
computed index (``LocalInner.compose``); elsewhere the generic ``BaseInner.compose`` (and
reshard's read-and-pack path) is used. Checked here: ``compose`` is exactly the
concatenation of its parts on every kind of store (property test against ``bytes``),
the local path reads no payload byte into this process (counted at the ``os`` calls),
links out of the store are refused on both sides, a source that changes after its
index was read raises :class:`ObjectChangedError` instead of producing a wrong object,
and reshard/unshard/shard write what the read-and-pack path writes: the same objects under
the same keys, every document and unsharded chunk byte for byte, every shard holding the
same chunk bytes at the same coordinates with no dead byte, and the same size (compose puts
each source's payload runs back to back, the read-and-pack path writes grid order; see
tests/unit/ops/test_reshard_runs.py for the runs).
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import fsspec
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store import reshard, shard, unshard
from sharding_store.api.arrays import create_draft_array
from sharding_store.api.hierarchy import inner_of, open_hierarchy
from sharding_store.engine.store import ArrayLayout
from sharding_store.errors import LinkOutsideStoreError, ObjectChangedError
from sharding_store.formats.shard_index import index_nbytes, read_index
from sharding_store.stores import FsspecInner, LocalInner, MappingInner
from sharding_store.stores import local as local_mod
from sharding_store.testing import CountingInner
from tests.fixtures import ZARR_JS, require, stores
from tests.unit.ops.test_reshard import assert_same_values, chunk_view, layouts, make_store, rs, values

SHARDED = stores(ZARR_JS, "*.sharded.*.zarr", names=True)
_N = itertools.count()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def shard_layouts(root: Path) -> list[ArrayLayout]:
    """The sharded arrays' layouts, longest data prefix first (a key belongs to the first that parses it)."""
    found = [ArrayLayout.from_meta(n.meta) for n in open_hierarchy(inner_of(str(root))).arrays()]
    return sorted((lay for lay in found if lay.sharded), key=lambda lay: -len(lay.prefix))


def shard_content(blob: bytes, cps: tuple[int, ...]) -> dict[tuple[int, ...], bytes]:
    """A compact shard's chunks by local coordinates (asserts it holds no dead byte)."""
    index = read_index(blob, cps)
    assert index.is_compact(len(blob))
    return {coords: blob[off : off + nb] for coords, off, nb in index.live()}


def assert_same_objects(a: Path, b: Path) -> None:
    """The same keys; shards with the same chunks at the same coordinates, compact, of the
    same size (in any payload order); every other object byte for byte."""
    ta, tb = tree_bytes(a), tree_bytes(b)
    assert ta.keys() == tb.keys()
    lays = shard_layouts(a)
    assert lays == shard_layouts(b)
    for key, blob in ta.items():
        layout = next((lay for lay in lays if lay.parse(key) is not None), None)
        if layout is None or layout.chunks_per_shard is None:
            assert blob == tb[key], key
        else:
            assert len(blob) == len(tb[key]), key
            assert shard_content(blob, layout.chunks_per_shard) == shard_content(tb[key], layout.chunks_per_shard), key


def new_store(kind: str, base: Path):
    n = next(_N)
    if kind == "local":
        return LocalInner(base / f"s{n}")
    if kind == "dict":
        return MappingInner({})
    return FsspecInner(fsspec.filesystem("memory"), f"/compose-test-{os.getpid()}-{n}")


@st.composite
def parts_of(draw, objects: dict[str, bytes]):
    """Parts for ``compose``: literal bytes, or forward ranges of the given objects."""
    out = []
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.booleans()):
            out.append(draw(st.binary(max_size=24)))
            continue
        key = draw(st.sampled_from(sorted(objects)))
        start = draw(st.integers(0, len(objects[key])))
        out.append((key, start, draw(st.integers(start, len(objects[key])))))
    return out


# --------------------------------------------------------------------------- the capability


@pytest.mark.parametrize("kind", ["local", "dict", "memory"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_compose_is_exactly_the_concatenation(kind, tmp_path, data):
    src = new_store(kind, tmp_path)
    into = new_store(kind, tmp_path) if data.draw(st.booleans(), label="another store") else None
    objects = data.draw(st.dictionaries(st.sampled_from(["a", "d/b", "d/e/c"]), st.binary(max_size=300), min_size=1))
    for k, v in objects.items():
        src.set(k, v)
    parts = data.draw(parts_of(objects))
    versions = None
    if data.draw(st.booleans(), label="with versions"):
        versions = {k: t.version for k, t in zip(objects, src.get_tails([(k, 0) for k in objects]))}
    expected = b"".join(p if isinstance(p, bytes) else objects[p[0]][p[1] : p[2]] for p in parts)
    assert src.compose("out/x", parts, into=into, versions=versions) == len(expected)
    assert (src if into is None else into).get("out/x") == expected
    assert {k: src.get(k) for k in objects} == objects  # sources untouched
    if kind == "local":
        assert not any(local_mod.TEMP_MARKER in p.name for p in Path(src.root).rglob("*"))


@pytest.mark.parametrize("kind", ["local", "dict", "memory"])
@pytest.mark.parametrize("counted", [False, True])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_compose_from_tails_builds_what_the_plan_names_from_the_tails_read(kind, counted, tmp_path, data):
    """``compose_from_tails``: the plan gets each source's tail as ``get_tails`` reads it
    (None for a missing source), each object it names is the concatenation of its parts,
    ``done`` is told each object's key and size, in order; the sources stay as they were
    (also through ``CountingInner``, which counts the tails and one ``compose`` per object)."""
    src = new_store(kind, tmp_path)
    into = new_store(kind, tmp_path) if data.draw(st.booleans(), label="another store") else None
    objects = data.draw(st.dictionaries(st.sampled_from(["a", "d/b", "d/e/c"]), st.binary(max_size=300), min_size=1))
    for k, v in objects.items():
        src.set(k, v)
    store = CountingInner(src) if counted else src
    tails = [(k, data.draw(st.integers(0, 400), label=f"tail of {k}")) for k in [*objects, "missing"]]
    plans = [data.draw(parts_of(objects), label="parts") for _ in range(data.draw(st.integers(0, 3), label="objects"))]
    seen, done = [], []

    def plan(got):
        seen.extend(got)
        return ((f"out/{i}", parts) for i, parts in enumerate(plans))

    store.compose_from_tails(tails, plan, into=into, done=lambda key, n: done.append((key, n)))
    assert [None if t is None else t.data for t in seen] == [
        objects[k][max(0, len(objects[k]) - n):] if k in objects else None for k, n in tails]
    assert all(t.size in (None, len(objects[k])) for (k, _), t in zip(tails, seen) if t is not None)  # when known
    expected = [b"".join(p if isinstance(p, bytes) else objects[p[0]][p[1] : p[2]] for p in parts) for parts in plans]
    assert done == [(f"out/{i}", len(e)) for i, e in enumerate(expected)]
    assert [(src if into is None else into).get(f"out/{i}") for i in range(len(plans))] == expected
    assert {k: src.get(k) for k in objects} == objects
    if counted:
        assert store.calls["compose"] == (len(plans) if kind == "local" else 0)
        assert store.ranges >= len(tails)


def test_only_local_pairs_compose_by_kernel_copies(tmp_path):
    local, other = LocalInner(tmp_path / "a"), LocalInner(tmp_path / "b")
    assert local.can_compose_to(other) and local.can_compose_to(CountingInner(other))
    assert not local.can_compose_to(MappingInner({})) and not MappingInner({}).can_compose_to(local)
    memory = new_store("memory", tmp_path)
    assert not memory.can_compose_to(memory)


def test_generic_compose_reads_one_range_per_source_object(tmp_path):
    src = CountingInner(new_store("memory", tmp_path))
    objects = {"s0": bytes(range(200)), "s1": bytes(range(200, 0, -1))}
    for k, v in objects.items():
        src.set(k, v)
    src.reset()
    parts = [("s0", 10, 20), ("s1", 0, 5), ("s0", 20, 40), b"idx", ("s0", 100, 120), ("s1", 150, 200)]
    src.compose("t", parts)
    ranges = [r for name, reqs in src.log if name == "get_ranges" for r in reqs]
    assert sorted(ranges) == [("s0", 10, 120), ("s1", 0, 200)]  # one merged range each, one call
    assert src.calls["get_ranges"] == 1 and src.calls["set"] == 1
    assert src.get("t") == b"".join(p if isinstance(p, bytes) else objects[p[0]][p[1] : p[2]] for p in parts)


# --------------------------------------------------------------------------- no payload through Python


class OsCounter:
    """Bytes that reach this process through ``os`` reads, and bytes the kernel copied."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read = 0
        self.kernel = 0
        for name in ("pread", "read"):
            monkeypatch.setattr(os, name, self._reader(getattr(os, name)))
        for name in ("preadv", "readv"):
            monkeypatch.setattr(os, name, self._vreader(getattr(os, name)))
        for name in ("copy_file_range", "sendfile"):
            if hasattr(os, name):
                monkeypatch.setattr(os, name, self._copier(getattr(os, name)))

    def _reader(self, fn):
        def counted(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.read += len(out)
            return out
        return counted

    def _vreader(self, fn):
        def counted(*args, **kwargs):
            n = fn(*args, **kwargs)
            self.read += n
            return n
        return counted

    def _copier(self, fn):
        def counted(*args, **kwargs):
            n = fn(*args, **kwargs)
            self.kernel += n
            return n
        return counted


def payload_bytes(root: Path, cps) -> tuple[int, int]:
    """(payload bytes, shards) of the sharded array ``a/b`` under ``root``."""
    total = shards = 0
    for p in (root / "data/root/a/b").rglob("*"):
        if p.is_file():
            blob = p.read_bytes()
            total += read_index(blob, cps).live_nbytes() if cps else len(blob)
            shards += 1
    return total, shards


@pytest.mark.parametrize("how", ["copy", "copy-unshard", "in-place", "in-place-shard"])
def test_local_reshard_reads_no_payload_into_python(tmp_path, monkeypatch, how):
    src = tmp_path / "src"
    old = None if how == "in-place-shard" else (2, 2)
    arr = create_draft_array(str(src), "a/b", shape=(128, 96), chunks=(16, 16), dtype="<i4", chunks_per_shard=old,
                             compressor=None)  # 1 KiB chunks, 64-byte indices
    arr[...] = np.random.default_rng(7).integers(0, 2**31, (128, 96), dtype="<i4")
    payload, n_src = payload_bytes(src, old)
    meta = sum(len(b) for k, b in tree_bytes(src).items() if not k.startswith("data/"))
    verbatim = meta - len((src / "meta/root/a/b.array.json").read_bytes())  # copied as they are
    view, vals = chunk_view(src), values(src)
    new = None if how == "copy-unshard" else (3, 2)
    counted_src = CountingInner(str(src))
    dst = None if how.startswith("in-place") else CountingInner(str(tmp_path / "dst"))
    counter = OsCounter(monkeypatch)
    report = reshard(counted_src, dst, chunks_per_shard=new, jobs=2, progress=False)
    monkeypatch.undo()
    result = src if dst is None else tmp_path / "dst"
    assert chunk_view(result) == view
    assert_same_values(values(result), vals)
    # every payload byte was copied by the kernel, none read into this process: only the
    # sources' indices (at most twice: the read, and a recent file's version check) and the
    # metadata documents (a few times) were
    assert counter.kernel == payload + (0 if dst is None else verbatim)  # the new objects' payloads, verbatim copies
    indices = 0 if old is None else n_src * index_nbytes(old)
    assert counter.read <= 2 * indices + 8 * meta
    assert counter.read < payload / 4
    assert counted_src.calls["compose"] == report.objects_written > 0
    assert counted_src.bytes_read <= indices + 8 * meta  # through the store interface too: indices only


# --------------------------------------------------------------------------- the same objects as the read-and-pack path


def python_path(mp: pytest.MonkeyPatch) -> None:
    """Reshard's read-and-pack path on local disk (what it did before compose)."""
    mp.setattr(LocalInner, "can_compose_to", lambda self, dst: False)


@pytest.mark.slow  # ~3.5 s; still in CI
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 12), min_size=1, max_size=3), data=st.data())
def test_compose_writes_the_objects_the_python_path_writes(tmp_path, shape, data):
    ndim = len(shape)
    chunks = tuple(data.draw(st.integers(1, 4)) for _ in range(ndim))
    cps_st = st.one_of(st.none(), st.tuples(*[st.integers(1, 5)] * ndim))
    old, new = data.draw(cps_st, label="old"), data.draw(cps_st, label="new")
    factor = data.draw(st.sampled_from([1, rs.MAX_BLOCK_FACTOR]), label="block factor")
    base = tmp_path / f"ex{next(_N)}"
    src = make_store(base / "src", shape=tuple(shape), chunks=chunks, cps=old, path="x")
    for p in ("a", "b"):
        shutil.copytree(src, base / f"inplace-{p}")
    default, rs.MAX_BLOCK_FACTOR = rs.MAX_BLOCK_FACTOR, factor
    try:
        reshard(src, base / "compose", chunks_per_shard=new, progress=False)
        reshard(base / "inplace-a", chunks_per_shard=new, progress=False)
        with pytest.MonkeyPatch.context() as mp:
            python_path(mp)
            reshard(src, base / "python", chunks_per_shard=new, progress=False)
            reshard(base / "inplace-b", chunks_per_shard=new, progress=False)
    finally:
        rs.MAX_BLOCK_FACTOR = default
    assert_same_objects(base / "compose", base / "python")
    assert_same_objects(base / "inplace-a", base / "inplace-b")
    assert layouts(base / "compose") == {"x": new}


@pytest.mark.parametrize("name", SHARDED)
@pytest.mark.parametrize("op", ["cps3", "unshard", "reshard-then-shard"])
def test_fixtures_same_objects_as_the_python_path(name, tmp_path, monkeypatch, op):
    src = require(ZARR_JS) / name

    def run(dst: Path) -> None:
        if op == "cps3":
            reshard(src, dst, chunks_per_shard=3, progress=False)
        elif op == "unshard":
            unshard(src, dst, progress=False)
        else:
            unshard(src, dst, progress=False)
            shard(dst, chunks_per_shard=2, progress=False)

    run(tmp_path / "compose")
    python_path(monkeypatch)
    run(tmp_path / "python")
    assert_same_objects(tmp_path / "compose", tmp_path / "python")


# --------------------------------------------------------------------------- links


@pytest.fixture
def linked(tmp_path):
    """A store with a key that is a link to a file outside, one whose directory is a link
    to a directory outside, and a link that stays inside."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_bytes(b"secret bytes")
    (root / "d" / "k").write_bytes(b"0123456789")
    os.symlink(outside / "secret", root / "d" / "leak")
    os.symlink(outside / "dir", root / "out")
    os.symlink(root / "d" / "k", root / "d" / "alias")
    return LocalInner(root), outside


def test_compose_refuses_a_source_linked_out_of_the_store(linked, tmp_path):
    inner, _ = linked
    dst = LocalInner(tmp_path / "dst")
    with pytest.raises(LinkOutsideStoreError, match="d/leak"):
        inner.compose("t", [("d/k", 0, 2), ("d/leak", 0, 6)], into=dst)
    assert not (tmp_path / "dst").exists() or not list((tmp_path / "dst").rglob("*"))
    inner.compose("t", [("d/alias", 2, 5), b"!"], into=dst)  # a link inside the store is fine
    assert dst.get("t") == b"234!"


def test_compose_refuses_a_destination_linked_out_of_the_store(linked):
    inner, outside = linked
    with pytest.raises(LinkOutsideStoreError, match="out/x"):
        inner.compose("out/x", [("d/k", 0, 4)])
    assert list((outside / "dir").iterdir()) == []


# --------------------------------------------------------------------------- changed sources


def test_compose_refuses_a_source_replaced_after_its_version_was_read(tmp_path):
    inner = LocalInner(tmp_path / "s")
    inner.set("a", b"x" * 100)
    versions = {"a": inner.get_tails([("a", 16)])[0].version}
    inner.set("a", b"y" * 100)  # a new object of the same size
    with pytest.raises(ObjectChangedError, match="a"):
        inner.compose("t", [("a", 0, 50)], versions=versions)
    assert not inner.exists("t") and sorted(p.name for p in (tmp_path / "s").iterdir()) == ["a"]


def test_compose_refuses_a_source_rewritten_in_place_while_copying(tmp_path, monkeypatch):
    inner = LocalInner(tmp_path / "s")
    inner.set("a", b"x" * 100)
    versions = {"a": inner.get_tails([("a", 16)])[0].version}
    copy = local_mod._copy_range

    def meddle(*args, **kwargs):
        copy(*args, **kwargs)
        with open(tmp_path / "s" / "a", "r+b") as f:  # same inode, new bytes and mtime
            f.write(b"z" * 100)
            os.utime(f.fileno(), ns=(1, 1))

    monkeypatch.setattr(local_mod, "_copy_range", meddle)
    with pytest.raises(ObjectChangedError, match="changed while being copied"):
        inner.compose("t", [("a", 0, 50), b"index"], versions=versions)
    assert not inner.exists("t")


def test_compose_refuses_a_range_past_the_end_of_its_source(tmp_path):
    for inner in (LocalInner(tmp_path / "s"), MappingInner({})):
        inner.set("a", b"x" * 10)
        with pytest.raises(ObjectChangedError, match="a"):
            inner.compose("t", [("a", 5, 11)])
        with pytest.raises(ObjectChangedError, match="gone"):
            inner.compose("t", [("missing", 0, 1)])
        assert not inner.exists("t")


def change_first_source(monkeypatch: pytest.MonkeyPatch, src: Path, how: str) -> list[str]:
    """After the first task read its sources' indices (:func:`rs.locate` runs on them), its
    first source is rewritten in place (the same inode, its bytes written again, another
    mtime) or replaced by a new file of garbage of the same size; returns [its key]."""
    locate, changed = rs.locate, []

    def locate_then_change(layout, sources, tails):
        out = locate(layout, sources, tails)
        if not changed:
            path = src / sources[0].key
            data = path.read_bytes()
            if how == "in place":
                with open(path, "r+b") as f:
                    f.write(data)
                    os.utime(f.fileno(), ns=(1, 1))
            else:
                path.unlink()
                path.write_bytes(bytes(len(data)))
            changed.append(sources[0].key)
        return out

    monkeypatch.setattr(rs, "locate", locate_then_change)
    return changed


@pytest.mark.parametrize("in_place", [False, True])
def test_reshard_refuses_a_source_shard_changed_after_its_index_was_read(tmp_path, monkeypatch, in_place):
    src = make_store(tmp_path / "src", shape=(16, 16), chunks=(2, 2), cps=(2, 2))
    view, vals = chunk_view(src), values(src)
    changed = change_first_source(monkeypatch, src, "in place")
    dst = None if in_place else tmp_path / "dst"
    with pytest.raises(ObjectChangedError) as e:
        reshard(src, dst, chunks_per_shard=(4, 4), jobs=1, progress=False)
    assert e.value.key == changed[0]
    monkeypatch.undo()
    if in_place:  # the journal's next run completes it
        assert layouts(src) == {"a/b": (2, 2)}
        reshard(src, chunks_per_shard=(4, 4), progress=False)
        result = src
    else:
        result = tmp_path / "dst2"
        reshard(src, result, chunks_per_shard=(4, 4), progress=False)
    assert chunk_view(result) == view
    assert_same_values(values(result), vals)


def test_reshard_copies_the_source_version_whose_index_it_read(tmp_path, monkeypatch):
    """A source replaced by another file after its index was read: the payload is copied
    from the descriptor the index was read from (one open per source), so the target holds
    the chunks that index describes, never bytes of the new file at the old offsets."""
    src = make_store(tmp_path / "src", shape=(16, 16), chunks=(2, 2), cps=(2, 2))
    view, vals = chunk_view(src), values(src)
    changed = change_first_source(monkeypatch, src, "replaced")
    reshard(src, tmp_path / "dst", chunks_per_shard=(4, 4), jobs=1, progress=False)
    monkeypatch.undo()
    assert set((src / changed[0]).read_bytes()) == {0}  # replaced indeed
    assert chunk_view(tmp_path / "dst") == view
    assert_same_values(values(tmp_path / "dst"), vals)


# --------------------------------------------------------------------------- object stores


@pytest.mark.parametrize("old,new,factor", [((2, 2), (4, 4), None), ((4, 4), (2, 2), None), ((3, 3), (4, 4), 1)])
def test_object_store_reads_each_source_shard_in_one_range_per_task(tmp_path, monkeypatch, old, new, factor):
    """No kernel copies between object stores: a task reads each of its source shards with
    one request (whole, in an lcm block) or one coalesced range (per target shard), all of
    the task's in one call."""
    src = new_store("memory", tmp_path)
    make_store(src.fs.get_mapper(src.root), shape=(24, 24), chunks=(2, 2), cps=old)
    counting = CountingInner(src)
    if factor is not None:
        monkeypatch.setattr(rs, "MAX_BLOCK_FACTOR", factor)
    view = chunk_view(src.fs.get_mapper(src.root))
    dst: dict = {}
    reshard(counting, dst, chunks_per_shard=new, jobs=1, progress=False)
    assert chunk_view(dst) == view
    data_calls = [reqs for name, reqs in counting.log if name == "get_ranges" and reqs[0][0].startswith("data/")]
    payload_calls = [reqs for reqs in data_calls if reqs[0][1] >= 0]  # not index tails
    assert payload_calls
    for reqs in payload_calls:
        keys = [k for k, _, _ in reqs]
        assert len(keys) == len(set(keys))  # one range per source shard in each call
    whole = [k for reqs in payload_calls for k, start, end in reqs if start == 0 and end is None]
    if factor is None:  # lcm blocks: every source shard read once, whole, and nothing else
        assert sorted(whole) == sorted(set(whole)) == sorted(k for k in src.list_prefix("data/"))
        assert len(data_calls) == len(payload_calls)


@pytest.mark.parametrize("refuse", ["copy_file_range", "copy_file_range+sendfile", "zero"])
def test_compose_falls_back_when_the_kernel_refuses(tmp_path, monkeypatch, refuse):
    import errno

    src, dst = LocalInner(tmp_path / "a"), LocalInner(tmp_path / "b")
    data = bytes(range(256)) * 40
    src.set("k", data)
    calls = {"copy_file_range": 0, "sendfile": 0}

    def refused(name):
        def fn(*args, **kwargs):
            calls[name] += 1
            if refuse == "zero":
                return 0  # what some filesystems answer instead of an error
            raise OSError(errno.EXDEV if name == "copy_file_range" else errno.EINVAL, "refused")
        return fn

    monkeypatch.setattr(os, "copy_file_range", refused("copy_file_range"), raising=False)
    if refuse != "copy_file_range":
        monkeypatch.setattr(os, "sendfile", refused("sendfile"), raising=False)
    parts = [("k", 100, 5000), b"--", ("k", 0, 10), ("k", 9000, 10240)]
    assert src.compose("t", parts, into=dst) == 4900 + 2 + 10 + 1240
    assert dst.get("t") == data[100:5000] + b"--" + data[:10] + data[9000:]
    assert calls["copy_file_range"] == 1  # refused once, then the next way for every range


def test_a_source_opened_again_is_checked_against_the_index_read(tmp_path, monkeypatch):
    """A source whose descriptor was not held (beyond ``HELD_SOURCES``) is opened again for
    its copies: replaced after its index was read, it is refused, not copied at the old
    offsets."""
    src = make_store(tmp_path / "src", shape=(16, 16), chunks=(2, 2), cps=(2, 2))
    monkeypatch.setattr(local_mod, "HELD_SOURCES", 0)
    changed = change_first_source(monkeypatch, src, "replaced")
    with pytest.raises(ObjectChangedError) as e:
        reshard(src, tmp_path / "dst", chunks_per_shard=(4, 4), jobs=1, progress=False)
    assert e.value.key == changed[0]
