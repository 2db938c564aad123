"""The undeclared shard-index checksum of zarrita (2023-05-09 to 2023-07-15), decided from the
bytes (``shard_index.index_reading``): a hidden-checksum shard can never be read as plain,
nor a plain one as hidden, and an object that fits neither reading (or both, differently)
is ShardCorruptError naming the key.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding_store.errors import ShardCorruptError
from sharding_store.formats.shard_index import (
    ShardIndex,
    decode_shard,
    encode_shard,
    index_reading,
    read_index,
)

KEY = "a/c/0/0"


def shard(chunks: dict, cps: tuple[int, ...], *, hidden: bool) -> bytes:
    """A shard as zarrita wrote it: [chunks][index] or [chunks][index][crc32c], no declaration."""
    return encode_shard(chunks, cps, checksum=hidden)


def tail(obj: bytes, n: int) -> bytes:
    return obj[-(16 * n + 4):]


CHUNKS = {(0, 0): b"abcdefgh", (0, 1): b"ij", (1, 1): b"klmnopqrstuvwx"}


@pytest.mark.parametrize("hidden", [False, True])
def test_each_reading_is_recognised(hidden):
    obj = shard(CHUNKS, (2, 2), hidden=hidden)
    assert index_reading(tail(obj, 4), (2, 2), len(obj), key=KEY) == ("crc32c-hidden" if hidden else "plain")
    assert index_reading(obj, 4, key=KEY) == ("crc32c-hidden" if hidden else "plain")  # whole object, n as int


def test_a_hidden_checksum_shard_read_as_plain_is_detected():
    """The wrong reading (the metadata taken literally: no checksum) does not validate: the
    index shifted by 4 bytes points outside the object."""
    obj = shard(CHUNKS, (2, 2), hidden=True)
    with pytest.raises(ShardCorruptError, match=KEY):
        read_index(obj, (2, 2), checksum=False, key=KEY)
    reading = index_reading(tail(obj, 4), (2, 2), len(obj), key=KEY)
    assert decode_shard(obj, (2, 2), checksum=reading == "crc32c-hidden", key=KEY) == CHUNKS


def test_a_plain_shard_read_as_hidden_is_detected():
    obj = shard(CHUNKS, (2, 2), hidden=False)
    with pytest.raises(ShardCorruptError, match="checksum mismatch"):
        read_index(obj, (2, 2), checksum=True, key=KEY)
    assert index_reading(obj, (2, 2), key=KEY) == "plain"


@settings(max_examples=200, deadline=None)
@given(
    cps=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
    data=st.data(),
    hidden=st.booleans(),
)
def test_random_shards_are_read_as_written(cps, data, hidden):
    n = 1
    for c in cps:
        n *= c
    coords = [tuple(int(i) for i in idx) for idx in np.ndindex(*cps)]
    present = data.draw(st.lists(st.sampled_from(coords), min_size=1, unique=True))
    chunks = {c: data.draw(st.binary(min_size=1, max_size=40)) for c in present}
    obj = shard(chunks, cps, hidden=hidden)
    reading = index_reading(tail(obj, n), cps, len(obj), key=KEY)
    assert reading == ("crc32c-hidden" if hidden else "plain")
    assert decode_shard(obj, cps, checksum=hidden, key=KEY) == chunks


def test_neither_reading_is_corrupt_and_says_why():
    obj = shard(CHUNKS, (2, 2), hidden=False)
    broken = obj[:-1] + bytes([obj[-1] ^ 0x40])  # last nbytes now huge: plain fails; no crc either
    with pytest.raises(ShardCorruptError) as e:
        index_reading(broken, (2, 2), key=KEY)
    assert e.value.key == KEY and "fits neither reading" in str(e.value)
    assert "plain entries" in str(e.value) and "CRC32C" in str(e.value)


def test_a_truncated_object_is_corrupt():
    obj = shard(CHUNKS, (2, 2), hidden=True)
    with pytest.raises(ShardCorruptError, match="fits neither"):
        index_reading(obj[-30:], (2, 2), key=KEY)


class _ForcedCrc:
    """CRC32C forced to one value, so that both readings can hold at once (real data would need
    objects of 2**32 bytes, or a 1 in 2**32 coincidence)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def crc32c(self, data) -> int:  # noqa: ARG002
        return self.value


def test_both_readings_valid_and_different_is_refused(monkeypatch):
    import sharding_store.formats.shard_index as si

    monkeypatch.setattr(si, "_crc32c", _ForcedCrc(0))
    # [64 payload bytes][entry (8, 0)][crc 0]: the hidden reading is (8, 0); the plain one,
    # shifted by 4 bytes, is (0, 0): both valid, different chunk bytes
    obj = b"\x00" * 64 + struct.pack("<QQ", 8, 0) + b"\x00" * 4
    assert ShardIndex.from_bytes(obj[-16:], (1,), key=KEY, payload_limit=len(obj) - 16).get((0,)) == (0, 0)
    assert ShardIndex.from_bytes(obj[-20:], (1,), checksum=True, key=KEY, payload_limit=len(obj) - 20).get((0,)) == (8, 0)
    with pytest.raises(ShardCorruptError, match="refusing to guess") as e:
        index_reading(obj, 1, key=KEY)
    assert e.value.key == KEY


def test_both_readings_equal_is_the_checksummed_one(monkeypatch):
    import sharding_store.formats.shard_index as si

    monkeypatch.setattr(si, "_crc32c", _ForcedCrc(0xFFFFFFFF))
    obj = b"\x01" * 10 + b"\xff" * 20  # an empty index both ways: the same (no) chunks
    assert index_reading(obj, 1, key=KEY) == "crc32c-hidden"


def test_usage_errors():
    from sharding_store.errors import UsageError

    with pytest.raises(UsageError):
        index_reading(b"\x00" * 10, 4, 1000, key=KEY)  # not the whole tail
    with pytest.raises(UsageError):
        index_reading(b"\x00" * 10, 0, key=KEY)
