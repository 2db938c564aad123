"""The per-shard fast paths of a migration (issue 15, "scale") give exactly what the code
they replaced gave: each old function is kept here verbatim and compared on random inputs."""

from __future__ import annotations

import itertools
import struct

import crc32c
import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from sharding_store.engine.shard_engine import ArrayLayout
from sharding_store.errors import ShardCorruptError
from sharding_store.formats.shard_index import (
    CHECKSUM_NBYTES,
    ENTRY_NBYTES,
    MAX_UINT64,
    ShardIndex,
    entry_lists,
    index_nbytes,
    live_entries,
    n_entries,
    tiles,
)
from sharding_store.formats.v3_documents import v3_chunk_key
from sharding_store.ops.jobs import StoreRef, interleave
from sharding_store.ops.units import ArrayJob

pytestmark = pytest.mark.slow  # big indices and long property runs against the previous implementations


def _old_entry_lists(data, chunks_per_shard, *, checksum=False, key="<shard>", payload_limit=None, payload_start=0):
    """``entry_lists`` as of f28f6d1."""
    n = n_entries(chunks_per_shard)
    if len(data) == index_nbytes(chunks_per_shard, checksum):
        body = memoryview(data).cast("B")[: ENTRY_NBYTES * n]
        if not checksum or int.from_bytes(bytes(data[-CHECKSUM_NBYTES:]), "little") == crc32c.crc32c(body):
            values = struct.unpack(f"<{2 * n}Q", body)
            offsets, sizes = list(values[0::2]), list(values[1::2])
            for i, (o, s) in enumerate(zip(offsets, sizes)):
                if s == MAX_UINT64 and payload_start and o == payload_start - 1:
                    o = offsets[i] = MAX_UINT64
                if o == MAX_UINT64 and s == MAX_UINT64:
                    continue
                if o == MAX_UINT64 or s == MAX_UINT64 or o > MAX_UINT64 - s or o < payload_start or (
                    payload_limit is not None and o + s > payload_limit
                ):
                    break
            else:
                return offsets, sizes
    ShardIndex.from_bytes(
        bytes(data), chunks_per_shard, checksum=checksum, key=key, payload_limit=payload_limit,
        payload_start=payload_start,
    )
    raise AssertionError("unreachable")


def _outcome(fn, *args, **kw):
    try:
        return ("ok", fn(*args, **kw))
    except Exception as e:  # noqa: BLE001 - compared, class and message
        return ("raised", type(e), str(e))


#: index field values around every boundary the checks draw
_FIELD = st.one_of(
    st.sampled_from([0, 1, 3, 4, 7, 8, 15, 16, 17, 63, 64, 100, MAX_UINT64, MAX_UINT64 - 1, MAX_UINT64 - 16, 2**63]),
    st.integers(0, 200),
    st.integers(0, MAX_UINT64),
)


@st.composite
def _indices(draw):
    cps = draw(st.sampled_from([(1,), (2,), (4,), (2, 2), (1, 3), (2, 1, 2), ()]))
    n = 1
    for c in cps:
        n *= c
    fields = draw(st.lists(_FIELD, min_size=2 * n, max_size=2 * n))
    body = struct.pack(f"<{2 * n}Q", *fields)
    checksum = draw(st.booleans())
    data = body
    if checksum:
        crc = crc32c.crc32c(body)
        if draw(st.integers(0, 4)) == 0:
            crc ^= 1  # a bad checksum
        data = body + crc.to_bytes(CHECKSUM_NBYTES, "little")
    cut = draw(st.sampled_from([0, 0, 0, 0, 1, -1]))  # now and then a truncated or padded index
    if cut == 1:
        data = data[:-1]
    elif cut == -1:
        data = data + b"\0"
    kind = draw(st.sampled_from(["bytes", "memoryview", "bytearray"]))
    data = {"bytes": bytes, "memoryview": memoryview, "bytearray": bytearray}[kind](data)
    payload_start = draw(st.one_of(st.just(0), st.just(0), st.integers(-2, 130), st.sampled_from([2**64, 16 * n + 4])))
    payload_limit = draw(st.one_of(st.none(), st.integers(-5, 300), st.sampled_from([MAX_UINT64, 2**65])))
    return data, cps, checksum, payload_start, payload_limit


@settings(max_examples=3000, deadline=None)
@given(_indices())
def test_entry_lists_matches_the_previous_implementation(case):
    data, cps, checksum, payload_start, payload_limit = case
    kw = dict(checksum=checksum, key="k", payload_limit=payload_limit, payload_start=payload_start)
    assert _outcome(entry_lists, data, cps, **kw) == _outcome(_old_entry_lists, data, cps, **kw)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_big_indices_are_checked_as_before(data):
    """Indices of 64-256 entries (2023 shards of 8x8 to 16x16 chunks), mostly valid with a
    few boundary values, full or with absent entries: the same lists or the same error as
    the old implementation (full shards take the scans of ``_entries_ok``)."""
    n = data.draw(st.sampled_from([64, 100, 256]))
    cps = {64: (8, 8), 100: (10, 10), 256: (16, 16)}[n]
    limit = data.draw(st.one_of(st.none(), st.integers(-3, 5000), st.just(MAX_UINT64), st.just(2**65)))
    absent = data.draw(st.booleans())
    fields = []
    for _ in range(n):
        if data.draw(st.integers(0, 30)) == 0:
            fields += [data.draw(_FIELD), data.draw(_FIELD)]
        elif absent and data.draw(st.integers(0, 5)) == 0:
            fields += [MAX_UINT64, MAX_UINT64]
        else:
            fields += [data.draw(st.integers(0, 4000)), data.draw(st.integers(0, 1000))]
    body = struct.pack(f"<{2 * n}Q", *fields)
    kw = dict(checksum=False, key="k", payload_limit=limit, payload_start=0)
    assert _outcome(entry_lists, body, cps, **kw) == _outcome(_old_entry_lists, body, cps, **kw)


def test_entry_lists_accepts_a_list_shape_and_refuses_a_bad_one_as_before():
    raw = struct.pack("<8Q", 0, 4, 4, 4, 8, 4, 12, 4)
    assert entry_lists(raw, [2, 2], payload_limit=16) == _old_entry_lists(raw, [2, 2], payload_limit=16)
    for bad in [(0, 2), (2**14, 2**13)]:
        assert _outcome(entry_lists, raw, bad) == _outcome(_old_entry_lists, raw, bad)
    try:
        entry_lists(raw[:-1], (2, 2), key="k")
    except ShardCorruptError as e:
        assert "k: shard index is 63 bytes" in str(e)
    else:  # pragma: no cover
        raise AssertionError("a truncated index passed")


def _job(prefix: str, separator: str, ndim: int) -> ArrayJob:
    layout = ArrayLayout(path=prefix.rstrip("/"), prefix="data/root/" + prefix, ndim=ndim, separator=separator,
                         chunks_per_shard=(2,) * ndim)
    return ArrayJob(path=prefix.rstrip("/"), src=StoreRef(None), dst=StoreRef(None), src_layout=layout,
                    dst_prefix=prefix, dst_cps=(2,) * ndim)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["", "a/", "x/y.z/"]), st.sampled_from(["/", "."]), st.integers(0, 4), st.data())
def test_interleaving_by_dst_dir_is_interleaving_by_the_key_s_directory(prefix, separator, ndim, data):
    job = _job(prefix, separator, ndim)
    coords = data.draw(st.lists(st.tuples(*[st.integers(0, 12)] * ndim), max_size=60))
    units = list(enumerate(coords))  # (position, target): equal targets stay told apart
    old = interleave(units, lambda u: (job.dst_prefix + v3_chunk_key(u[1], separator)).rpartition("/")[0])
    assert interleave(units, lambda u: job.dst_dir(u[1])) == old


def test_dst_dir_groups_exactly_as_the_keys_directories():
    for separator, ndim in itertools.product("/.", range(4)):
        job = _job("g/a/", separator, ndim)
        targets = list(itertools.product(range(3), repeat=ndim))
        for t, u in itertools.product(targets, repeat=2):
            same_dir = job.dst_key(t).rpartition("/")[0] == job.dst_key(u).rpartition("/")[0]
            assert (job.dst_dir(t) == job.dst_dir(u)) == same_dir


def _old_tiles(live, start, end):
    """``tiles`` as of f28f6d1."""
    pos = start
    for o, s in sorted((o, o + s) for o, s in live):
        if o != pos:
            return False
        pos = s
    return pos == end


@st.composite
def _ranges(draw):
    """Ranges that often tile [start, end) in C order, shuffled, with gaps, overlaps, empty or negative sizes."""
    start = draw(st.integers(-3, 20))
    sizes = draw(st.lists(st.integers(0, 6) if draw(st.booleans()) else st.integers(-4, 6), max_size=8))
    live, pos = [], start
    for s in sizes:
        live.append((pos, s))
        pos += s
    how = draw(st.sampled_from(["chain", "shuffle", "nudge", "random"]))
    if how == "shuffle":
        live = draw(st.permutations(live))
    elif how == "nudge" and live:
        i = draw(st.integers(0, len(live) - 1))
        live[i] = (live[i][0] + draw(st.integers(-2, 2)), live[i][1] + draw(st.integers(-2, 2)))
    elif how == "random":
        live = draw(st.lists(st.tuples(st.integers(-3, 30), st.integers(-4, 8)), max_size=8))
    end = pos + draw(st.sampled_from([0, 0, 0, 1, -1]))
    return live, start, end


@settings(max_examples=3000, deadline=None)
@given(_ranges())
def test_tiles_matches_the_previous_implementation(case):
    live, start, end = case
    assert tiles(live, start, end) == _old_tiles(live, start, end)


def test_live_entries_keeps_entry_lists_keywords():
    raw = struct.pack("<8Q", 0, 4, MAX_UINT64, MAX_UINT64, 4, 4, 8, 4)
    assert live_entries(raw, (2, 2), key="k", payload_limit=12) == [(0, 4), (4, 4), (8, 4)]
    assert _outcome(live_entries, raw, (2, 2), key="k", payload_limit=11)[1] is ShardCorruptError
