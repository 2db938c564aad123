"""Memory a read fills: page-aligned I/O buffers (``buffers.io_buffer``) and the pages of a
big output faulted in ahead of the copies (``array._Pages``), huge pages kept while they
come fast and given up after the first slow block.

Both are performance measures; what must hold is that they change no value, touch nothing
outside their buffers, populate each block of an output once, and switch to small pages
exactly when a block is slow.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sharding_store.api.arrays as array_module
from sharding_store.api.arrays import _Pages, open_draft
from sharding_store.codec import _native
from sharding_store.codec.buffers import PAGE, io_buffer

PROPERTY = settings(max_examples=200, deadline=None)


@PROPERTY
@given(nbytes=st.integers(1, 3 * PAGE + 17))
def test_io_buffers_start_on_a_page_and_hold_what_is_written(nbytes):
    buf = io_buffer(nbytes)
    assert buf.dtype == np.uint8 and buf.shape == (nbytes,)
    assert buf.ctypes.data % PAGE == 0
    buf[:] = np.arange(nbytes, dtype=np.uint8)
    assert bytes(buf) == bytes(np.arange(nbytes, dtype=np.uint8))


@PROPERTY
@given(size=st.integers(1, 3000), block=st.sampled_from([1, 7, 64, 1000]),
       requests=st.lists(st.tuples(st.integers(-50, 3000), st.integers(0, 3000)), max_size=12))
def test_each_byte_of_an_output_is_populated_once_and_every_requested_byte_is(size, block, requests):
    """Model: the set of populated bytes. Each populate call faults in whole blocks inside
    the output, never a byte already done, and every byte of its request (clipped to the
    output) is done afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        _populate_against_the_model(mp, size, block, requests)


def _populate_against_the_model(mp, size, block, requests):
    mp.setattr(array_module, "PROBE_BYTES", block)
    out = np.empty(size, dtype=np.uint8)
    calls: list[tuple[int, int, int]] = []
    mp.setattr(_native, "madvise", lambda address, nbytes, advice: calls.append((address, nbytes, advice)) or True)
    pages = _Pages(out)
    done: set[int] = set()
    base = out.ctypes.data
    for lo, length in requests:
        calls.clear()
        pages.populate(lo, lo + length)
        for address, nbytes, advice in calls:
            if advice != _native.MADV_POPULATE_WRITE:
                continue
            a = address - base
            assert 0 <= a and a + nbytes <= size and nbytes > 0 and a % block == 0
            span = set(range(a, a + nbytes))
            assert not span & done
            done |= span
        assert set(range(max(0, lo), min(lo + length, size))) <= done


def _spy(monkeypatch, slow_steps: set[int]):
    """Record madvise calls (nothing is advised); the populate steps numbered in
    ``slow_steps`` take 1 s of the clock, the others none."""
    calls: list[tuple[int, int, int]] = []
    clock = {"now": 0, "step": 0}

    def madvise(address: int, nbytes: int, advice: int) -> bool:
        calls.append((address, nbytes, advice))
        if advice == _native.MADV_POPULATE_WRITE:
            if clock["step"] in slow_steps:
                clock["now"] += 10**9
            clock["step"] += 1
        return True

    monkeypatch.setattr(_native, "madvise", madvise)
    monkeypatch.setattr(array_module.time, "perf_counter_ns", lambda: clock["now"])
    return calls


def test_huge_pages_are_populated_in_timed_steps_and_given_up_after_a_slow_one(monkeypatch):
    out = np.empty(10 * array_module.PROBE_BYTES + 5, dtype=np.uint8)
    calls = _spy(monkeypatch, slow_steps={2})
    pages = _Pages(out)
    step = array_module.PROBE_BYTES
    pages.populate(0, 5 * step)
    base = out.ctypes.data
    populate = _native.MADV_POPULATE_WRITE
    assert calls == [
        (base, step, populate),
        (base + step, step, populate),
        (base + 2 * step, step, populate),  # slow: the rest of the output gets small pages
        (base + 3 * step, out.nbytes - 3 * step, _native.MADV_NOHUGEPAGE),
        (base + 3 * step, step, populate),  # small pages, still a block at a time
        (base + 4 * step, step, populate),
    ]
    assert not pages.huge
    calls.clear()
    pages.populate(4 * step + 1, 7 * step)  # block 4 is done: only the blocks after it
    assert calls == [(base + 5 * step, step, populate), (base + 6 * step, step, populate)]


def test_fast_huge_pages_are_kept(monkeypatch):
    out = np.empty(3 * array_module.PROBE_BYTES, dtype=np.uint8)
    calls = _spy(monkeypatch, slow_steps=set())
    pages = _Pages(out)
    pages.populate(-10, out.nbytes + 10)  # clipped to the output
    assert pages.huge
    assert [advice for _, _, advice in calls] == [_native.MADV_POPULATE_WRITE] * 3
    assert sum(n for _, n, _ in calls) == out.nbytes
    assert min(a for a, _, _ in calls) == out.ctypes.data


@pytest.mark.parametrize("slow", [set(), {0}, {1}])
def test_a_big_whole_read_gives_numpys_values_whichever_pages_it_gets(monkeypatch, tmp_path, slow):
    """A whole-array read of a big output through the real populate calls, with the clock
    saying huge pages are fast, slow at once, or slow from the second step: same values."""
    from sharding_store.api.arrays import create_draft_array

    monkeypatch.setattr(array_module, "PROBE_BYTES", 1 << 16)
    monkeypatch.setattr(array_module, "POPULATE_MIN", 1 << 16)
    rng = np.random.default_rng(7)
    data = rng.integers(0, 500, (400, 300), dtype="<u2")
    a = create_draft_array(str(tmp_path), "x", shape=data.shape, chunks=(16, 16), dtype="<u2",
                           chunks_per_shard=(4, 4), compressor=None)
    a[...] = data
    real = _native.madvise
    advised: list[int] = []
    clock = {"now": 0, "step": 0}

    def madvise(address: int, nbytes: int, advice: int) -> bool:
        advised.append(advice)
        if advice == _native.MADV_POPULATE_WRITE:
            clock["now"] += 10**9 if clock["step"] in slow else 0
            clock["step"] += 1
        return real(address, nbytes, advice)

    monkeypatch.setattr(_native, "madvise", madvise)
    monkeypatch.setattr(array_module.time, "perf_counter_ns", lambda: clock["now"])
    got = open_draft(str(tmp_path), "x")[...]
    assert np.array_equal(got, data)
    assert _native.MADV_POPULATE_WRITE in advised
    assert (_native.MADV_NOHUGEPAGE in advised) == bool(slow)
