"""zarrita 0.2.2-0.2.7 wrote an index at the start of a shard by adding the index size to
every offset, the empty marker's too: an empty entry reads ``(start - 1, 2**64-1)``.
Exactly that pair reads as empty; any other half-sentinel entry is still corrupt."""

from __future__ import annotations

import struct

import pytest

from sharding_store import ShardCorruptError
from sharding_store.formats.shard_index import MAX_UINT64, ShardIndex, entry_lists, index_nbytes

CPS = (2, 2)


def _index(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack("<QQ", o, n) for o, n in entries)


@pytest.mark.parametrize("checksum", [False, True])
def test_wrapped_empty_entry_of_a_start_index_is_empty(checksum):
    start = index_nbytes(CPS, checksum)
    body = _index([(start, 10), ((MAX_UINT64 + start) % 2**64, MAX_UINT64), (start + 10, 5), (MAX_UINT64, MAX_UINT64)])
    if checksum:
        from crc32c import crc32c

        body += crc32c(body).to_bytes(4, "little")
    index = ShardIndex.from_bytes(body, CPS, checksum=checksum, payload_start=start, payload_limit=start + 15)
    assert index.get((0, 0)) == (start, 10) and index.get((0, 1)) is None and index.get((1, 0)) == (start + 10, 5)
    offsets, sizes = entry_lists(body, CPS, checksum=checksum, payload_start=start, payload_limit=start + 15)
    assert offsets[1] == MAX_UINT64 and sizes[1] == MAX_UINT64


@pytest.mark.parametrize("shift", [-2, 0, None], ids=["start-2", "start", "zero"])
def test_other_half_sentinels_stay_corrupt(shift):
    start = index_nbytes(CPS)
    offset = 0 if shift is None else start + shift
    body = _index([(offset, MAX_UINT64)] + [(MAX_UINT64, MAX_UINT64)] * 3)
    with pytest.raises(ShardCorruptError, match="sentinel|overflows"):
        ShardIndex.from_bytes(body, CPS, payload_start=start)
    with pytest.raises(ShardCorruptError):
        entry_lists(body, CPS, payload_start=start)


def test_an_index_at_the_end_never_unwraps():
    body = _index([(63, MAX_UINT64)] + [(MAX_UINT64, MAX_UINT64)] * 3)
    with pytest.raises(ShardCorruptError):
        ShardIndex.from_bytes(body, CPS)
