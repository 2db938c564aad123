"""The pure shard codec: round trips, both index locations, checksums, and damage."""

from __future__ import annotations

import itertools
import math

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding_store.errors import ShardCorruptError, ShardingStoreError, UsageError
from sharding_store.formats.shard_index import (
    MAX_UINT64,
    ShardIndex,
    decode_chunk,
    decode_shard,
    encode_shard,
    index_nbytes,
    live_counts,
    live_entries,
    read_index,
)


@st.composite
def shards(draw):
    cps = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    all_coords = list(itertools.product(*(range(n) for n in cps)))
    chosen = draw(st.lists(st.sampled_from(all_coords), unique=True, max_size=len(all_coords)))
    chunks = {c: draw(st.binary(max_size=40)) for c in chosen}
    return cps, chunks


@pytest.mark.slow  # 200 random shards; the fuzz test and the examples stay in the fast loop
@settings(max_examples=200, deadline=None)
@given(shards(), st.booleans(), st.sampled_from(["start", "end"]))
def test_round_trip(shard, checksum, location):
    cps, chunks = shard
    blob = encode_shard(chunks, cps, checksum=checksum, index_location=location)
    if not chunks:
        assert blob == b""
        return
    assert decode_shard(blob, cps, checksum=checksum, index_location=location) == chunks
    for coords in itertools.product(*(range(n) for n in cps)):
        assert decode_chunk(blob, coords, cps, checksum=checksum, index_location=location) == chunks.get(coords)
    # compact: payload bytes + index, nothing else
    assert len(blob) == sum(map(len, chunks.values())) + index_nbytes(cps, checksum)
    index = read_index(blob, cps, checksum=checksum, index_location=location)
    assert index.is_compact(len(blob), checksum=checksum, index_location=location)
    assert [c for c, _, _ in index.live()] == sorted(chunks)  # C order


def test_draft_layout_matches_spec_bytes():
    """The spec's example: 2x2 chunks, index of (offset, nbytes) LE uint64 pairs at the end."""
    blob = encode_shard({(0, 1): b"abc", (1, 0): b"de"}, (2, 2))
    idx = np.frombuffer(blob[-64:], "<u8").reshape(4, 2)
    assert idx[0].tolist() == [MAX_UINT64, MAX_UINT64]
    assert idx[1].tolist() == [0, 3]
    assert idx[2].tolist() == [3, 2]
    assert idx[3].tolist() == [MAX_UINT64, MAX_UINT64]
    assert blob[:5] == b"abcde"


def test_checksum_is_crc32c_of_index_and_detected():
    blob = encode_shard({(0,): b"x" * 10}, (2,), checksum=True)
    body, crc = blob[10:-4], blob[-4:]
    assert int.from_bytes(crc, "little") == crc32c.crc32c(body)
    damaged = blob[:-5] + bytes([blob[-5] ^ 1]) + blob[-4:]
    with pytest.raises(ShardCorruptError, match="checksum"):
        decode_shard(damaged, (2,), checksum=True, key="k")



def test_crc32c_loads_the_compiled_module_without_the_package_and_falls_back_to_it(monkeypatch):
    """The checksum comes from crc32c's compiled module, loaded on first use without the
    package's ``__init__`` (in a fresh interpreter ``crc32c`` stays out of ``sys.modules``);
    an unknown layout of the package is imported the usual way, and a missing package is
    its ``ModuleNotFoundError``, as an import at the top of the module gave."""
    import importlib.util
    import subprocess
    import sys

    import sharding_store.formats.shard_index as si

    data = np.random.default_rng(0).bytes(1000)
    assert si.crc32c(data) == crc32c.crc32c(data) and si.crc32c(b"") == 0
    probe = ("import sys\nfrom sharding_store.formats.shard_index import crc32c\n"
             "print(crc32c(b'123456789'), 'crc32c' in sys.modules, 'importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(0xE3069283), "False", "False"]  # the CRC-32C check value
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # not the layout known
    assert si._load_crc32c()(data) == crc32c.crc32c(data)
    monkeypatch.setitem(sys.modules, "crc32c", None)  # not installed
    with pytest.raises(ModuleNotFoundError) as e:
        si._load_crc32c()
    assert e.value.name == "crc32c"


def _index(entries, cps):
    return np.array(entries, dtype="<u8").reshape(*cps, 2).tobytes()


@pytest.mark.parametrize(
    "payload, entries, match",
    [
        (b"abcd", [[0, 4], [MAX_UINT64, 4]], "one sentinel"),
        (b"abcd", [[0, 4], [2, MAX_UINT64]], "one sentinel"),
        (b"abcd", [[0, 5], [MAX_UINT64, MAX_UINT64]], "outside the payload area"),
        (b"abcd", [[3, 2], [MAX_UINT64, MAX_UINT64]], "outside the payload area"),
        (b"abcd", [[MAX_UINT64 - 1, 2], [MAX_UINT64, MAX_UINT64]], "overflows"),
    ],
)
def test_damaged_index_is_refused(payload, entries, match):
    blob = payload + _index(entries, (2,))
    with pytest.raises(ShardCorruptError, match=match) as info:
        decode_shard(blob, (2,), key="data/root/a/c0")
    assert "data/root/a/c0" in str(info.value)
    assert isinstance(info.value, ShardingStoreError)


def test_truncated_object_is_refused():
    blob = encode_shard({(0,): b"abcd"}, (4,))
    with pytest.raises(ShardCorruptError, match="shorter than its 64-byte shard index"):
        decode_shard(blob[-20:], (4,), key="s")
    with pytest.raises(ShardCorruptError, match="expected 64"):
        ShardIndex.from_bytes(blob[-20:], (4,), key="s")


def test_overlapping_entries_are_served_faithfully():
    """Two entries sharing bytes are legal: each reads its own range."""
    blob = b"abcdef" + _index([[0, 4], [2, 4]], (2,))
    assert decode_shard(blob, (2,)) == {(0,): b"abcd", (1,): b"cdef"}


def test_hostile_chunks_per_shard_does_not_allocate():
    with pytest.raises(UsageError, match="exceeds the limit"):
        ShardIndex.empty((10**6, 10**6))
    with pytest.raises(UsageError):
        index_nbytes((0, 3))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(1, 3), min_size=1, max_size=2), st.booleans())
def test_fuzz_only_our_errors(data, cps, checksum):
    """Arbitrary bytes either decode into in-bounds chunks or raise ShardCorruptError."""
    cps = tuple(cps)
    try:
        chunks = decode_shard(data, cps, checksum=checksum)
    except ShardCorruptError:
        return
    limit = len(data) - index_nbytes(cps, checksum)
    assert all(len(v) <= limit for v in chunks.values())
    assert len(chunks) <= math.prod(cps)


SENTINEL = 2**64 - 1
_entry_value = st.one_of(
    st.integers(0, 300), st.just(SENTINEL), st.integers(2**64 - 400, 2**64 - 2), st.integers(0, 2**64 - 1)
)


@pytest.mark.slow  # 400 random indices; the round trip and the fuzz test above stay in the fast loop
@settings(max_examples=400, deadline=None)
@given(
    cps=st.sampled_from([(1,), (4,), (2, 2), (2, 3), (1, 4, 2)]),
    data=st.data(),
    checksum=st.booleans(),
    limit=st.one_of(st.none(), st.integers(0, 400)),
    start=st.integers(0, 20),
    damage=st.sampled_from(["none", "crc", "short"]),
)
def test_live_entries_agrees_with_shard_index(cps, data, checksum, limit, start, damage):
    """The plain-Python index check used by the copy fast paths accepts exactly what
    ShardIndex.from_bytes accepts (same error otherwise), and ``tiles`` is ``is_compact``."""
    from sharding_store.formats.shard_index import ShardIndex, live_entries, tiles

    n = math.prod(cps)
    pairs = []
    for _ in range(n):
        if data.draw(st.booleans()):
            pairs.append((SENTINEL, SENTINEL))
        else:
            pairs.append((data.draw(_entry_value), data.draw(_entry_value)))
    raw = b"".join(o.to_bytes(8, "little") + s.to_bytes(8, "little") for o, s in pairs)
    if checksum:
        raw += crc32c.crc32c(raw).to_bytes(4, "little")
    if damage == "crc" and checksum:
        raw = raw[:-1] + bytes([raw[-1] ^ 1])
    if damage == "short":
        raw = raw[:-1]
    kw = dict(checksum=checksum, key="k", payload_limit=limit, payload_start=start)
    try:
        index = ShardIndex.from_bytes(raw, cps, **kw)
    except ShardCorruptError as e:
        with pytest.raises(ShardCorruptError) as got:
            live_entries(raw, cps, **kw)
        assert str(got.value) == str(e)
        return
    live = live_entries(raw, cps, **kw)
    assert live == [(o, s) for _, o, s in index.live()]
    if limit is not None:  # an object of limit + index bytes, index at the end
        assert tiles(live, 0, limit) == index.is_compact(limit + len(raw), checksum=checksum)


# --------------------------------------------------------------------------- live_counts: a batch at once

_M = 2**64 - 1


@st.composite
def _entry(draw, limit: int) -> tuple[int, int]:
    """One index entry for a payload area of ``limit`` bytes: mostly inside, else absent,
    past the area, a half sentinel or an offset + size past 2**64."""
    kind = draw(st.sampled_from(["inside"] * 6 + ["absent", "past", "half", "overflow"]))
    if kind == "inside":
        offset = draw(st.integers(0, max(0, limit)))
        return offset, draw(st.integers(0, max(0, limit - offset)))
    if kind == "absent":
        return _M, _M
    if kind == "past":
        offset = draw(st.integers(0, limit + 2))
        return offset, draw(st.integers(max(0, limit - offset + 1), limit + 3))
    if kind == "half":
        return draw(st.sampled_from([(_M, draw(st.integers(0, 5))), (draw(st.integers(0, 5)), _M)]))
    return draw(st.sampled_from([(_M - 3, 7), (5, _M - 2)]))


@st.composite
def _index_batch(draw):
    """A batch of encoded 2x2 indices (some damaged), each with its payload limit."""
    checksum = draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(1, 6))):
        limit = draw(st.integers(-1, 300))
        body = np.array(draw(st.lists(_entry(limit), min_size=4, max_size=4)), dtype="<u8").tobytes()
        data = body + (crc32c.crc32c(body).to_bytes(4, "little") if checksum else b"")
        damage = draw(st.sampled_from(["none"] * 6 + ["short", "crc"]))
        if damage == "short":
            data = data[:-1]
        elif damage == "crc" and checksum:
            data = data[:-4] + bytes([data[-4] ^ 1]) + data[-3:]
        out.append((data, limit))
    return checksum, out


@pytest.mark.slow  # ~3 s (300 examples); still in CI
@settings(max_examples=300, deadline=None)
@given(_index_batch())
def test_live_counts_agree_with_entry_lists_index_by_index(batch):
    """The batch check passes exactly the indices :func:`entry_lists` passes, with their live
    entries counted; any other gives None (checked alone, it raises)."""
    checksum, items = batch
    got = live_counts([d for d, _ in items], (2, 2), [limit for _, limit in items], checksum=checksum)
    for (data, limit), count in zip(items, got):
        try:
            want = len(live_entries(data, (2, 2), checksum=checksum, payload_limit=limit)) if limit >= 0 else None
        except ShardingStoreError:
            want = None
        assert count == want, (data, limit)


# --------------------------------------------------------------------------- live_counts without numpy


_MAX = 2**64 - 1
_ENTRY = st.one_of(
    st.tuples(st.just(_MAX), st.just(_MAX)),  # absent
    st.tuples(st.just(_MAX), st.integers(0, _MAX - 1)),  # half sentinel
    st.tuples(st.integers(0, 300), st.just(_MAX)),
    st.tuples(st.integers(0, 300), st.integers(0, 300)),
    st.tuples(st.integers(0, _MAX), st.integers(0, _MAX)),
)


@settings(max_examples=300, deadline=None)
@given(shards=st.lists(st.tuples(st.lists(_ENTRY, min_size=4, max_size=4), st.integers(-2, 400),
                                 st.sampled_from([0, 8, -1])), min_size=1, max_size=6),
       checksum=st.booleans())
def test_live_counts_without_numpy_are_numpys(shards, checksum):
    """The Python check :func:`live_counts` runs while numpy is not loaded (a virtual
    migration's command) gives numpy's answer for every index: absent and half-sentinel
    entries, entries past the payload limit, the largest object size, wrong lengths, bad checksums."""
    import struct  # noqa: PLC0415
    import sys  # noqa: PLC0415

    indices, limits = [], []
    for entries, limit, extra in shards:
        body = struct.pack("<8Q", *[v for e in entries for v in e])
        data = body + (crc32c.crc32c(body).to_bytes(4, "little") if checksum else b"")
        indices.append(data[: len(data) + extra] if extra < 0 else data + bytes(extra))
        limits.append(2**63 - 1 if limit == 400 else limit)
    with_numpy = live_counts(indices, (2, 2), limits, checksum=checksum)
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, "numpy")
        assert live_counts(indices, (2, 2), limits, checksum=checksum) == with_numpy
    assert any(c is not None for c in live_counts([bytes(64)], (2, 2), [0]))  # the control: a sound index
