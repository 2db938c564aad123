"""The batch decoder (``_loops.c`` through ``_native.loops``) against numcodecs, byte for byte.

A whole shard's chunks are decoded in one C call that releases the GIL once. Held to the
reference like every other path: random chunks of every blosc setting and zstd level laid
in one buffer as a shard holds them (gaps, rows out of order), decoded by the loops, by the
per-chunk bindings (loops off) and by numcodecs; foreign or forged payloads among them
(sizes announced larger or smaller than the chunk, truncated, several frames) are handed
back to the reference path, and nothing is written outside the rows asked for.
"""

from __future__ import annotations

import ctypes
import struct

import hypothesis.strategies as st
import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store import ChunkDecodeError
from sharding_store.codec import _native
from sharding_store.codec.chunk_codec import ChunkCodec, chunk_nbytes, span_decoder, using_native

from .test_codec_properties import DTYPES, chunk_data, make_meta, memory_bytes, reference_bytes, reference_payload

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOOPS = pytest.mark.skipif(_native.loops() is None, reason="sharding_store/codec/_loops.c is not built here (setup.py build_ext --inplace)")
KINDS = ["noise", "runs", "ramp", "constant"]
CHUNKS = [(1,), (7,), (16, 8), (64, 64), (3, 5), (2, 3, 4)]
GUARD = 0xA5


def lay_out(payloads: list[bytes], seed: int) -> tuple[np.ndarray, list[int], list[int], list[int], int]:
    """Payloads in one buffer with random gaps, assigned to rows in a random order with
    unused rows between them: ``(buffer, rows, offsets, sizes, number of rows)``."""
    rng = np.random.default_rng(seed)
    n = len(payloads)
    nrows = 2 * n + 1
    rows = sorted(rng.choice(nrows, size=n, replace=False).tolist(), key=lambda _: rng.random())
    parts, offsets, pos = [], [], 0
    for p in payloads:
        gap = bytes([GUARD]) * int(rng.integers(0, 5))
        parts += [gap, p]
        pos += len(gap)
        offsets.append(pos)
        pos += len(p)
    buf = np.frombuffer(b"".join(parts) + b"\0", np.uint8).copy()
    return buf, rows, offsets, [len(p) for p in payloads], nrows


def decode_batch(meta, payloads: list[bytes], seed: int, *, loops: bool):
    """Run the span decoder (loops on or off) over the laid-out payloads: (failed rows,
    decoded bytes per payload, whether every other row kept its guard bytes)."""
    buf, rows, offsets, sizes, nrows = lay_out(payloads, seed)
    with _native.using_loops(loops):
        spans = span_decoder(meta)
        assert spans is not None
        nbytes = chunk_nbytes(meta)
        dst = np.full((nrows, nbytes), GUARD, np.uint8)
        failed = spans(buf, buf.ctypes.data, rows, offsets, sizes, dst.ctypes.data)
    used = set(rows)
    untouched = all((dst[r] == GUARD).all() for r in range(nrows) if r not in used or r in failed)
    return failed, [dst[r].tobytes() for r in rows], rows, untouched


# --------------------------------------------------------------------------- the binding


@LOOPS
def test_the_loops_release_the_gil_and_point_into_numcodecs_libraries():
    """Bound through ``ctypes.CDLL`` (the GIL is released for each call, i.e. once per
    shard), with the decompression functions of the libraries numcodecs decodes with."""
    loops = _native.loops()
    for fn in (loops.blosc_rows, loops.zstd_rows):
        assert not fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert loops.blosc_decompress == ctypes.cast(_native.blosc().held.blosc_decompress_ctx, ctypes.c_void_p).value
    assert loops.zstd_functions[2] == ctypes.cast(_native.zstd().held.ZSTD_decompressDCtx, ctypes.c_void_p).value
    assert _native.report()["loops"] == _native.loops_path() == loops.path


def test_loops_of_another_interface_generation_or_absent_are_not_bound(monkeypatch):
    if _native.loops_path() is None:
        pytest.skip("sharding_store/codec/_loops.c is not built here")
    zstd, blosc = _native.zstd(), _native.blosc()
    assert _native._bind_loops(zstd, blosc) is not None
    monkeypatch.setattr(_native, "LOOPS_ABI", _native.LOOPS_ABI + 1)
    assert _native._bind_loops(zstd, blosc) is None
    monkeypatch.undo()
    monkeypatch.setattr(_native, "_loops_path", lambda: None)
    assert _native._bind_loops(zstd, blosc) is None


@LOOPS
def test_switching_native_code_or_the_loops_off_takes_the_other_paths():
    meta = make_meta(numcodecs.Blosc("lz4", 5, 1), (16, 8), "<u2")
    with_loops = span_decoder(meta)
    with _native.using_loops(False):
        assert _native.loops() is None and _native.blosc() is not None
        without = span_decoder(meta)
        assert ChunkCodec(meta)._spans.__name__ == without.__name__ == "blosc"
    with using_native(False):
        assert _native.loops() is None and span_decoder(meta) is None
    assert with_loops.__name__ == "decode" != without.__name__


# --------------------------------------------------------------------------- byte for byte


@LOOPS
@PROPERTY
@given(
    dtype=st.sampled_from(DTYPES),
    cname=st.sampled_from(["lz4", "lz4hc", "blosclz", "zstd", "zlib"]),
    clevel=st.integers(0, 9),
    shuffle=st.sampled_from([-1, 0, 1, 2]),
    blocksize=st.sampled_from([0, 256, 4096, 65536]),
    chunks=st.sampled_from(CHUNKS),
    order=st.sampled_from(["C", "F"]),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=20),
    seed=st.integers(0, 2**32 - 1),
)
def test_blosc_batches_decode_to_numcodecs_bytes(dtype, cname, clevel, shuffle, blocksize, chunks, order, kinds, seed):
    comp = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize)
    meta = make_meta(comp, chunks, dtype, order)
    payloads = [reference_payload(comp, chunk_data(meta, seed + i, k), order) for i, k in enumerate(kinds)]
    expected = [reference_bytes(comp, p) for p in payloads]
    for loops in (True, False):
        failed, got, _, untouched = decode_batch(meta, payloads, seed, loops=loops)
        assert failed == [] and got == expected and untouched


@LOOPS
@PROPERTY
@given(
    level=st.sampled_from([-5, -1, 0, 1, 2, 3, 5, 9, 15, 19, 22]),
    checksum=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    chunks=st.sampled_from(CHUNKS),
    order=st.sampled_from(["C", "F"]),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=20),
    seed=st.integers(0, 2**32 - 1),
)
def test_zstd_batches_decode_to_numcodecs_bytes(level, checksum, dtype, chunks, order, kinds, seed):
    comp = numcodecs.Zstd(level=level, checksum=checksum)
    meta = make_meta(comp, chunks, dtype, order)
    payloads = [reference_payload(comp, chunk_data(meta, seed + i, k), order) for i, k in enumerate(kinds)]
    expected = [reference_bytes(comp, p) for p in payloads]
    for loops in (True, False):
        failed, got, _, untouched = decode_batch(meta, payloads, seed, loops=loops)
        assert failed == [] and got == expected and untouched


# --------------------------------------------------------------------------- foreign and forged payloads


def forge(comp, meta, payload: bytes, how: str) -> bytes:
    """A payload the loops must not decode into a row: sizes announced other than the
    chunk's or the payload's, a truncated one, or (zstd) a chunk split into two frames."""
    nbytes = chunk_nbytes(meta)
    if how == "truncated":
        return payload[: max(0, len(payload) - 3)]
    if how == "appended":
        return payload + b"\x00\x01\x02"
    if isinstance(comp, numcodecs.Blosc):
        if how == "claims_more":  # header: nbytes doubled (a bomb's claim)
            return payload[:4] + struct.pack("<I", 2 * nbytes) + payload[8:]
        if how == "claims_less":
            return payload[:4] + struct.pack("<I", max(0, nbytes - 1)) + payload[8:]
        return payload[:12] + struct.pack("<I", len(payload) + 64) + payload[16:]  # cbytes past the end
    data = reference_bytes(comp, payload)
    if how == "claims_more":  # a frame of twice the chunk
        return bytes(comp.encode(data + data))
    if how == "claims_less":
        return bytes(comp.encode(data[:-1])) if len(data) > 1 else b""
    half = len(data) // 2
    return bytes(comp.encode(data[:half])) + bytes(comp.encode(data[half:]))  # two frames: the reference's business


@LOOPS
@PROPERTY
@given(
    comp=st.sampled_from([numcodecs.Blosc("lz4", 5, 1), numcodecs.Blosc("zstd", 3, 2, blocksize=256), numcodecs.Blosc("blosclz", 0, 0),
                          numcodecs.Zstd(level=1), numcodecs.Zstd(level=3, checksum=True)]),
    chunks=st.sampled_from([(16, 8), (64, 64), (7,)]),
    hows=st.lists(st.sampled_from(["ok", "truncated", "appended", "claims_more", "claims_less", "other"]), min_size=1, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_forged_payloads_are_left_to_the_reference_and_nothing_is_written_outside_the_rows(comp, chunks, hows, seed):
    meta = make_meta(comp, chunks, "<u2")
    good = [reference_payload(comp, chunk_data(meta, seed + i, "runs"), "C") for i in range(len(hows))]
    payloads = [p if how == "ok" else forge(comp, meta, p, how) for p, how in zip(good, hows)]
    failed, got, rows, untouched = decode_batch(meta, payloads, seed, loops=True)
    assert untouched  # rows not asked for, and rows given back, still hold the guard bytes
    for how, row, p, g in zip(hows, rows, good, got):
        if how == "ok":
            assert row not in failed and g == reference_bytes(comp, p)
        elif how != "other" or isinstance(comp, numcodecs.Blosc):
            assert row in failed, how
    # and through the interface: the reference decides each payload given back
    buf, rows, offsets, sizes, nrows = lay_out(payloads, seed)
    dst = np.zeros((nrows, chunk_nbytes(meta)), np.uint8)
    codec = ChunkCodec(meta)
    try:
        codec.decode_many(buf, buf.ctypes.data, rows, offsets, sizes, dst.ctypes.data, key_of=lambda r: f"c{r}")
    except ChunkDecodeError as e:
        bad = {f"c{r}" for r, how in zip(rows, hows) if how != "ok"}
        assert e.key in bad
    else:
        for row, p in zip(rows, payloads):
            assert dst[row].tobytes() == memory_bytes(codec.decode(p), "C")
