"""The address helpers of ``sharding_store.codec._native`` (issue 23: raw addresses are taken there
only): each gives what ``arr.ctypes.data`` arithmetic gave, for every kind of array the
package hands it (writable, read-only, views, Fortran order, empty)."""

from __future__ import annotations

import numpy as np
import pytest

from sharding_store.codec import _native


def _arrays() -> list[np.ndarray]:
    base = np.arange(4096, dtype=np.uint8)
    return [
        base,
        base[7:],                                   # a view at an offset
        base[::2],                                  # not contiguous
        np.frombuffer(bytes(100), dtype=np.uint8),  # read-only (a shard read into bytes)
        np.asfortranarray(np.zeros((3, 5))),        # Fortran order
        base[:0],                                   # empty
        np.zeros((4, 4), dtype=np.float32).T,
    ]


@pytest.mark.parametrize("arr", _arrays(), ids=["plain", "offset", "strided", "readonly", "fortran", "empty", "transposed"])
def test_data_address_is_the_first_byte(arr):
    assert _native.data_address(arr) == arr.ctypes.data


def test_align_skip_lands_on_the_boundary():
    raw = np.empty(10_000, dtype=np.uint8)
    for start in range(0, 70, 13):
        view = raw[start:]
        skip = _native.align_skip(view, 64)
        assert 0 <= skip < 64 and (view.ctypes.data + skip) % 64 == 0


@pytest.mark.parametrize("native", [True, False])
def test_same_bytes_compares_the_first_n(native):
    a, b = np.zeros(1000, dtype=np.uint8), np.zeros(1000, dtype=np.uint8)
    b[500] = 1
    with _native.using(native):
        assert _native.same_bytes(a, b, 500)
        assert not _native.same_bytes(a, b, 501)
        assert _native.same_bytes(a, b, 0)


def test_madvise_array_advises_the_asked_bytes(monkeypatch):
    calls = []
    monkeypatch.setattr(_native, "madvise", lambda address, nbytes, advice: calls.append((address, nbytes, advice)) or True)
    out = np.empty(1 << 16, dtype=np.uint8)
    assert _native.madvise_array(out, 7)
    assert _native.madvise_array(out, 8, 4096, 8192)
    assert _native.madvise_array(out, 9, 60_000, 1 << 20)  # clipped at the array's end
    base = out.ctypes.data
    assert calls == [(base, 1 << 16, 7), (base + 4096, 4096, 8), (base + 60_000, (1 << 16) - 60_000, 9)]


def test_batch_table_holds_rows_offsets_sizes_back_to_back():
    table, address, failed, failed_address = _native.batch_table([3, 1], [10, 20], [5, 6])
    assert list(table) == [3, 1, 10, 20, 5, 6] and address == table.buffer_info()[0]
    assert bytes(failed) == b"\0\0" and failed_address == failed.buffer_info()[0]


def test_rename_exchange_swaps_two_files_or_says_why_not(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    got = _native.rename_exchange(bytes(a), bytes(b))
    if got is None:
        pytest.skip("no renameat2 in this C library")
    if got != 0:  # a filesystem without RENAME_EXCHANGE: refused, nothing changed
        import errno

        assert got in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
        assert a.read_bytes() == b"A" and b.read_bytes() == b"B"
        return
    assert a.read_bytes() == b"B" and b.read_bytes() == b"A"
    import errno

    assert _native.rename_exchange(bytes(a), bytes(tmp_path / "missing")) == errno.ENOENT
