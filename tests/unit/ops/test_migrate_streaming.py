"""Migrations whose memory does not grow with the dataset (issue 15, "streaming plan and run").

The stores here hand out every listed key as a *tracked* string: an object that counts
itself while alive. Whatever a driver keeps of a listing (a dict of the destination, a
list of units, a set of expected keys) keeps those objects alive, so the peak count is
the number of listed objects held at once: for a streaming driver it stays near the
window of units in flight however large the store, for one that materialises a listing
it is the whole listing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding_store import create_draft_array
from sharding_store.errors import StoreIOError
from sharding_store.ops import units
from sharding_store.ops.jobs import MAX_BATCH
from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify
from sharding_store.testing import fault_hook

N = 3000  # shards: far more than the window below
JOBS = 2
SPAN = 16  # units planned ahead for interleaving (INTERLEAVE_SPAN, made small here)
#: listed keys that may be alive at once: the window of batches in flight (2 * jobs
#: batches of at most MAX_BATCH units), the interleaving span, and a few in hand
BOUND = 2 * JOBS * MAX_BATCH + SPAN + 8


class Alive:
    """Counts the tracked strings alive at once."""

    def __init__(self) -> None:
        self.now = self.peak = self.made = 0
        self.lock = threading.Lock()

    def key(self, s: str) -> str:
        k = _Tracked(s)
        k.alive = self
        with self.lock:
            self.now += 1
            self.made += 1
            self.peak = max(self.peak, self.now)
        return k


class _Tracked(str):
    alive: Alive

    def __del__(self) -> None:
        with self.alive.lock:
            self.alive.now -= 1


class GeneratedDraft(MutableMapping):  # type: ignore[type-arg]
    """A draft-era store of ``n`` compact shards of a 1-d array (2 chunks of 2 bytes each,
    one shard written by our draft writer and served under every shard key); its
    ``list_sized`` yields tracked keys, sorted, one at a time."""

    def __init__(self, n: int) -> None:
        meta: dict[str, bytes] = {}
        arr = create_draft_array(meta, "a", shape=(4 * n,), chunks=(2,), chunks_per_shard=(2,), dtype="u1",
                                 compressor=None)
        arr[:4] = np.arange(1, 5, dtype="u1")
        self.shard = meta.pop("data/root/a/c0")
        self.meta = meta
        self.n = n
        self.keys = sorted([*meta, *(f"data/root/a/c{i}" for i in range(n))])
        self.alive = Alive()

    def __getitem__(self, key: str) -> bytes:
        if key in self.meta:
            return self.meta[key]
        head, _, i = key.rpartition("/c")
        if head == "data/root/a" and i.isdigit() and str(int(i)) == i and int(i) < self.n:
            return self.shard
        raise KeyError(key)

    def __setitem__(self, key: str, value: bytes) -> None:
        raise TypeError("a source is only read")

    def __delitem__(self, key: str) -> None:
        raise TypeError("a source is only read")

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int]]:
        for k in self.keys:
            if k.startswith(prefix):
                yield self.alive.key(k), len(self[k])

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (k for k, _ in self.list_sized(prefix))


class TrackedDict(dict):  # type: ignore[type-arg]
    """A destination whose ``list_sized`` yields tracked keys, sorted, one at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.alive = Alive()

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int]]:
        for k in sorted(k for k in list(self) if k.startswith(prefix)):
            value = self.get(k)
            if value is not None:
                yield self.alive.key(k), len(value)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (k for k, _ in self.list_sized(prefix))


class PlainDraft(MutableMapping):  # type: ignore[type-arg]
    """:class:`GeneratedDraft`'s objects behind a plain mapping (``__iter__`` and
    ``__getitem__`` only: no ``list_sized``, no ``list_prefix``), its keys generated as
    tracked strings in numeric order, not sorted ("c10" before "c2"). Beside them: two
    stray keys, the greater listed first, and a 0-d array ``z`` whose one chunk is spelled
    twice, "c0" (value 5) listed before "c" (value 9). Counts every ``__getitem__``."""

    def __init__(self, n: int) -> None:
        self.draft = GeneratedDraft(n)
        self.objects = dict(self.draft.meta)
        for key, value in ((ZERO_D, 5), ("data/root/z/c", 9)):
            z: dict[str, bytes] = {}
            create_draft_array(z, "z", shape=(), chunks=(), chunks_per_shard=(), dtype="u1", compressor=None)[...] = value
            self.objects.update({k: v for k, v in z.items() if k != "data/root/z/c0"}, **{key: z["data/root/z/c0"]})
        self.objects.update({"data/root/a/zz-stray": b"x", "data/root/a/b-stray": b"x"})
        self.alive = Alive()
        self.reads: dict[str, int] = {}

    def __getitem__(self, key: str) -> bytes:
        name = str(key)  # a plain copy: counting must not keep a tracked key alive
        self.reads[name] = self.reads.get(name, 0) + 1
        return self.objects[key] if key in self.objects else self.draft[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        raise TypeError("a source is only read")

    def __delitem__(self, key: str) -> None:
        raise TypeError("a source is only read")

    def __iter__(self) -> Iterator[str]:
        yield from self.objects
        yield from (self.alive.key(f"data/root/a/c{i}") for i in range(self.draft.n))

    def __len__(self) -> int:
        return len(self.objects) + self.draft.n


ZERO_D = "data/root/z/c0"


@pytest.fixture
def small_span(monkeypatch):
    monkeypatch.setattr(units, "INTERLEAVE_SPAN", SPAN, raising=False)


def shard_keys(dst: dict) -> list[str]:
    return [k for k in dst if k.startswith("a/c/")]


def test_migrate_holds_a_bounded_window_of_units(small_span):
    src, dst = GeneratedDraft(N), TrackedDict()
    report = migrate(src, dst, verify=False, jobs=JOBS, progress=False)
    assert src.alive.made >= N  # every shard was listed through the tracked listing ...
    assert src.alive.peak <= BOUND, f"{src.alive.peak} listed source keys alive at once (window {BOUND})"
    assert report.shards == N and report.totals.written == N and len(shard_keys(dst)) == N
    assert dst["a/c/2999"] == src.shard + dst["a/c/2999"][len(src.shard) :] and len(dst["a/c/2999"]) == len(src.shard) + 4
    assert "zarr.json" in dst and "a/zarr.json" in dst


def test_an_inline_migration_holds_only_the_interleaving_span(small_span):
    """Two in-memory stores, jobs not given: the units run inline (no window of batches),
    so what is held of the listing is the interleaving span (two, as the next is read) and
    the unit in hand."""
    src, dst = GeneratedDraft(N), TrackedDict()
    report = migrate(src, dst, verify=False, progress=False)
    assert src.alive.made >= N
    assert src.alive.peak <= 2 * SPAN + 8, f"{src.alive.peak} listed source keys alive at once (span {SPAN})"
    assert report.shards == N and report.totals.written == N and len(shard_keys(dst)) == N


@pytest.mark.parametrize("jobs", [JOBS, None], ids=["threads", "inline"])
def test_a_plain_mapping_is_listed_as_a_stream_and_each_shard_read_once(small_span, jobs):
    """No ``list_sized``: the listing is the mapping's own iteration, streamed (never
    copied whole or sorted: issue 26's 1M-shard RSS), and still each shard becomes one
    target shard, read once; what is reported and written does not depend on the listing's
    order (the least stray key named; of a 0-d chunk's two spellings "c0" wins, as sorted)."""
    src, dst = PlainDraft(N), TrackedDict()
    report = migrate(src, dst, verify=False, jobs=jobs, progress=False)
    assert src.alive.made >= N  # every listing of the mapping walks all its keys (it has no prefix listing)
    assert src.alive.peak <= BOUND, f"{src.alive.peak} listed source keys alive at once (window {BOUND})"
    shard_reads = {k: n for k, n in src.reads.items() if k.startswith("data/root/a/c")}
    assert len(shard_reads) == N and set(shard_reads.values()) == {1}, "a shard read twice or not at all"
    assert report.totals.written == N + 1 and len(shard_keys(dst)) == N  # and z's one chunk
    assert dst["a/c/2999"][: len(src.draft.shard)] == src.draft.shard
    assert dst["z/c"][:-4] == src.objects[ZERO_D]  # the "c0" spelling's bytes, CRC32C appended
    assert report.warnings == ["a: 2 stray keys under its data prefix not migrated, e.g. data/root/a/b-stray"]
    assert verify(src, dst, progress=False).ok


def test_verify_streams_both_listings_and_still_finds_differences(small_span):
    src, dst = GeneratedDraft(N), TrackedDict()
    migrate(src, dst, verify=False, jobs=JOBS, progress=False)
    src.alive, dst.alive = Alive(), Alive()
    report = verify(src, dst, jobs=JOBS, progress=False)
    assert report.ok and report.check.objects == N
    assert src.alive.made >= N and dst.alive.made >= N
    assert src.alive.peak <= BOUND, f"{src.alive.peak} listed source keys alive at once"
    assert dst.alive.peak <= BOUND, f"{dst.alive.peak} listed destination keys alive at once"
    # the merge of the two listings still sees what is missing and what is extra
    del dst["a/c/1234"]
    dst["a/c/99999"] = dst["a/c/0"]
    dst["a/c/7/1"] = dst["a/c/0"]  # not a key of this 1-d array's grid: not data, not reported
    report = verify(src, dst, jobs=JOBS, progress=False, raise_on_error=False)
    assert [k for k, _ in report.check.problems] == ["a/c/1234", "a/c/99999"]
    assert "missing" in report.check.problems[0][1] and "unexpected" in report.check.problems[1][1]


@pytest.mark.parametrize("jobs", [JOBS, None], ids=["threads", "inline"])
def test_resume_merges_the_destination_listing_as_a_stream(small_span, jobs):
    """Also inline (two in-memory stores, jobs not given): the crash leaves what threads leave."""
    src, dst = GeneratedDraft(N), TrackedDict()
    done = [0]

    def crash(phase: str) -> None:
        if phase == "unit":
            done[0] += 1
            if done[0] == 1000:
                raise KeyboardInterrupt("simulated crash after 1000 units")

    with fault_hook(crash), pytest.raises(KeyboardInterrupt):
        migrate(src, dst, verify=False, jobs=jobs, progress=False)
    assert "a/zarr.json" not in dst and 1000 <= len(shard_keys(dst)) < N
    dst["a/c/0"] = dst["a/c/0"][:-3]  # a torn shard is rewritten, not skipped
    dst.alive = Alive()
    report = migrate(src, dst, resume=True, verify=False, jobs=jobs, progress=False)
    assert dst.alive.made >= 1000  # the listing of what was there went through the merge ...
    assert dst.alive.peak <= 4, f"{dst.alive.peak} listed destination keys alive at once"  # ... never held
    assert report.totals.skipped >= 999 and report.totals.skipped + report.totals.written == N
    assert verify(src, dst, progress=False).ok


def test_present_merges_a_sorted_listing():
    from sharding_store.ops.units import PRESENT, Present

    others: list[str] = []
    probed: list[str] = []
    p = Present(iter([("a/c/0", 5), ("a/c/1", None), ("a/c/3", 7), ("a/zarr.json", 9)]), other=others.append,
                probe=lambda k: probed.append(k) or 1)
    assert p.size("a/c/0") == 5 and p.size("a/c/1") == PRESENT and p.size("a/c/2") is None
    assert p.size("a/c/0") == 1 and probed == ["a/c/0"]  # asked out of order: the store is asked
    assert p.size("a/c/4") is None and others == ["a/c/3"]
    p.close()
    assert others == ["a/c/3", "a/zarr.json"]
    with pytest.raises(StoreIOError, match="not in sorted order"):
        q = Present(iter([("a/c/1", 1), ("a/c/0", 1)]))
        q.size("a/c/5")


@settings(max_examples=200, deadline=None)
@given(old=st.sets(st.text("ab/c0", max_size=4)), staged=st.sets(st.text("ab/c0", max_size=4)))
def test_reshard_swap_merges_sorted_listings_like_a_set_difference(old, staged):
    from sharding_store.ops.resharding import _not_staged

    old_keys, staged_keys = iter(sorted(old)), iter(sorted(staged))
    assert list(_not_staged(old_keys, staged_keys)) == sorted(old - staged)


def test_unit_results_add_every_field():
    """``UnitResult.add`` spells its fields out (speed): adding must cover each of them."""
    from dataclasses import fields

    from sharding_store.ops.units import UnitResult

    names = [f.name for f in fields(UnitResult)]
    a = UnitResult(**{n: i + 1 for i, n in enumerate(names)})
    b = UnitResult(**{n: 100 * (i + 1) for i, n in enumerate(names)})
    a.add(b)
    assert [getattr(a, n) for n in names] == [101 * (i + 1) for i in range(len(names))]
