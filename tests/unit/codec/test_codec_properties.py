"""Every fast path of the chunk-codec interface against numcodecs, byte for byte.

numcodecs is the reference: a payload is what ``codec.encode`` writes for the chunk's bytes
in the array's memory order, and a chunk is what ``codec.decode`` gives back. For every
codec and setting the fast paths handle (zstd levels and checksums, blosc cname x shuffle x
item size x clevel x blocksize, uncompressed), every item kind, C and F order and edge
chunks, each path must agree: the per-chunk decoders (into an array row and into an
address), the whole-shard span decoder, ``decode`` with and without a scratch ``out``,
``ChunkCodec.decode_into`` / ``decode_many``, and the encoders (``encode``, the fast
encoder, the row encoders). With native code on and off (``using_native``), so both the
compiled bindings and the numcodecs fallbacks are held to the same bytes. Payloads other
writers produce (zstd frames without a content size, several frames) and damaged ones
must give numcodecs' result or a ``ChunkDecodeError``, never other bytes.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store import ChunkDecodeError
from sharding_store.codec import _native
from sharding_store.codec.chunk_codec import (
    ChunkCodec,
    chunk_nbytes,
    decode,
    decode_many,
    encode,
    fast_decoder,
    fast_encoder,
    fast_row_encoder,
    span_decoder,
    takes_address,
    using_native,
    zstd_frames,
)
from sharding_store.formats import draft_metadata as dm

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "numcodecs"])

DTYPES = ["|u1", "|i1", "<u2", ">i2", "<i4", "<f4", ">f4", "<u8", ">f8", "<c8", "<c16", "|b1", "<M8[ns]", "<m8[s]", "|S3", "<U2", "|V5"]
CHUNKS = [(1,), (7,), (16, 8), (64, 64), (3, 5), (2, 3, 4), (5, 1, 9)]


def make_meta(compressor, chunks, dtype, order="C", fill_value=0):
    return dm.draft_array_document(dm.DraftArraySpec(
        path="a", shape=tuple(c * 2 + 1 for c in chunks), chunks=chunks, dtype=dtype, compressor=compressor,
        fill_value=fill_value if np.dtype(dtype).kind in "biufc" else None, order=order, separator="/",
        filters=None, attributes=None, chunks_per_shard=None,
    ))


def chunk_data(meta, seed: int, kind: str) -> np.ndarray:
    """A full-size chunk in the array's order: noise, runs, a ramp or a constant (so that
    shuffling, matching and run-length coding all matter)."""
    rng = np.random.default_rng(seed)
    nbytes = chunk_nbytes(meta)
    raw = rng.integers(0, 256, nbytes, dtype=np.uint8)
    if kind == "runs":
        raw = np.repeat(raw[: max(1, nbytes // 37)], 37)[:nbytes]
        raw = np.pad(raw, (0, nbytes - raw.size))
    elif kind == "ramp":
        raw = (np.arange(nbytes) // max(1, meta.dtype.itemsize)).astype(np.uint8)
    elif kind == "constant":
        raw[:] = raw[0]
    flat = raw.view(meta.dtype)
    return flat.reshape(meta.chunks, order=meta.order)


def memory_bytes(chunk: np.ndarray, order: str) -> bytes:
    return np.ravel(chunk, order=order).tobytes()  # type: ignore[call-overload]


def reference_payload(comp, chunk: np.ndarray, order: str) -> bytes:
    """numcodecs' payload for a full-size chunk: the codec over its bytes in memory order
    (``order`` contiguous, as zarr 2.18 lays a chunk out)."""
    laid = np.asarray(chunk, order=order)  # type: ignore[call-overload]
    if comp is None:
        return memory_bytes(laid, order)
    return bytes(numcodecs.compat.ensure_bytes(comp.encode(laid)))


def reference_bytes(comp, payload: bytes) -> bytes:
    return payload if comp is None else bytes(numcodecs.compat.ensure_bytes(comp.decode(payload)))


def check_every_decoder(meta, payload: bytes, expected: bytes, *, usual: bool = True) -> None:
    """Every decode path gives ``expected`` (the chunk's bytes in memory order). ``usual``:
    a payload as numcodecs writes it, which the per-chunk fast decoders must accept (others
    may be declined, and then go the reference way)."""
    nbytes = chunk_nbytes(meta)
    assert len(expected) == nbytes
    chunk = decode(meta, payload, key="k")
    assert memory_bytes(chunk, meta.order) == expected and chunk.shape == meta.chunks
    out = np.empty(meta.chunks, dtype=meta.dtype, order=meta.order)
    got = decode(meta, payload, key="k", out=out)
    assert memory_bytes(got, meta.order) == expected
    fast = fast_decoder(meta)
    if fast is not None:
        row = np.zeros(nbytes, np.uint8)
        accepted = fast(memoryview(payload), row)
        assert accepted or not usual
        assert not accepted or row.tobytes() == expected
        if takes_address(fast):
            row[:] = 0
            accepted = fast(payload, row.ctypes.data)
            assert accepted or not usual
            assert not accepted or row.tobytes() == expected
    codec = ChunkCodec(meta)
    row = np.zeros(nbytes, np.uint8)
    codec.decode_into(memoryview(payload), row, key="k")
    assert row.tobytes() == expected
    row[:] = 0
    codec.decode_into(payload, row.ctypes.data, key="k")
    assert row.tobytes() == expected
    check_spans(meta, [payload, payload], [expected, expected])


def check_spans(meta, payloads: list[bytes], expected: list[bytes]) -> None:
    """The payloads laid in one buffer as a shard would hold them (consecutive, then one
    after a gap and out of row order) through the span decoder and ``decode_many``."""
    nbytes = chunk_nbytes(meta)
    n = len(payloads)
    order = list(range(n - 1)) + [n + 1]  # the last payload lands in a row further on
    gap = b"\xa5" * 3
    parts, offsets = [], []
    pos = 0
    for i, p in enumerate(payloads):
        if i == n - 1:
            parts.append(gap)
            pos += len(gap)
        offsets.append(pos)
        parts.append(p)
        pos += len(p)
    buf = np.frombuffer(b"".join(parts), np.uint8).copy()
    sizes = [len(p) for p in payloads]
    spans = span_decoder(meta)
    if spans is not None:
        dst = np.zeros((n + 2, nbytes), np.uint8)
        failed = spans(buf, buf.ctypes.data, order, offsets, sizes, dst.ctypes.data)
        for row, want in zip(order, expected):
            if row not in failed:
                assert dst[row].tobytes() == want
    dst = np.zeros((n + 2, nbytes), np.uint8)
    decode_many(meta, buf, buf.ctypes.data, order, offsets, sizes, dst.ctypes.data, key_of=lambda r: f"c{r}")
    for row, want in zip(order, expected):
        assert dst[row].tobytes() == want


def check_every_encoder(meta, chunk: np.ndarray, expected: bytes) -> None:
    """Every encode path gives numcodecs' payload ``expected`` (or is not offered)."""
    assert encode(meta, chunk) == expected
    laid = np.asarray(chunk, order=meta.order)  # type: ignore[call-overload]
    assert fast_encoder(meta)(laid) == expected
    row = np.frombuffer(memory_bytes(chunk, meta.order), np.uint8).copy()
    encode_row = fast_row_encoder(meta)
    if encode_row is not None:
        assert encode_row(row.ctypes.data) == expected
    assert ChunkCodec(meta).encode_row(row.ctypes.data) == expected
    assert ChunkCodec(meta).encode(laid) == expected


# --------------------------------------------------------------------------- blosc

BLOSC_SETTINGS = dict(
    dtype=st.sampled_from(DTYPES),
    cname=st.sampled_from(["lz4", "lz4hc", "blosclz", "zstd", "zlib"]),
    clevel=st.integers(0, 9),
    shuffle=st.sampled_from([-1, 0, 1, 2]),
    blocksize=st.sampled_from([0, 256, 4096, 65536]),
    chunks=st.sampled_from(CHUNKS),
    order=st.sampled_from(["C", "F"]),
    kind=st.sampled_from(["noise", "runs", "ramp", "constant"]),
    seed=st.integers(0, 2**32 - 1),
)


@NATIVE
@PROPERTY
@given(**BLOSC_SETTINGS)
def test_blosc_paths_decode_and_encode_numcodecs_bytes(native, dtype, cname, clevel, shuffle, blocksize, chunks, order, kind, seed):
    comp = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize)
    with using_native(native):
        meta = make_meta(comp, chunks, dtype, order)
        chunk = chunk_data(meta, seed, kind)
        payload = reference_payload(comp, chunk, order)
        check_every_encoder(meta, chunk, payload)
        check_every_decoder(meta, payload, reference_bytes(comp, payload))
        if native and _native.blosc() is not None and meta.dtype.kind in "biufcmM":
            assert fast_row_encoder(meta) is not None  # the self-check accepted it: the fast path is tested


# --------------------------------------------------------------------------- zstd


ZSTD_SETTINGS = dict(
    level=st.sampled_from([-5, -1, 0, 1, 2, 3, 5, 9, 15, 19, 22]),
    checksum=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    chunks=st.sampled_from(CHUNKS),
    order=st.sampled_from(["C", "F"]),
    kind=st.sampled_from(["noise", "runs", "ramp", "constant"]),
    seed=st.integers(0, 2**32 - 1),
)


@NATIVE
@PROPERTY
@given(**ZSTD_SETTINGS)
def test_zstd_paths_decode_and_encode_numcodecs_bytes(native, level, checksum, dtype, chunks, order, kind, seed):
    comp = numcodecs.Zstd(level=level, checksum=checksum)
    with using_native(native):
        meta = make_meta(comp, chunks, dtype, order)
        chunk = chunk_data(meta, seed, kind)
        payload = reference_payload(comp, chunk, order)
        check_every_encoder(meta, chunk, payload)
        check_every_decoder(meta, payload, reference_bytes(comp, payload))
        frames = zstd_frames(payload)
        assert [(f.content_size, f.compressed_size) for f in frames] == [(chunk_nbytes(meta), len(payload))]
        if native and _native.zstd() is not None and 1 <= level <= 22:
            assert fast_row_encoder(meta) is not None


def strip_content_size(frame: bytes) -> bytes:
    """The same zstd frame without its content size (as streaming writers produce it): a
    window descriptor large enough for the content instead."""
    fhd = frame[4]
    fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 4, fhd & 3
    assert dict_flag == 0
    pos = 5 if single else 6
    fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
    content = int.from_bytes(frame[pos : pos + fcs_len], "little") + (256 if fcs_len == 2 else 0)
    wd = ((max(10, (max(content, 1) - 1).bit_length()) - 10) << 3) if single else frame[5]
    return frame[:4] + bytes([checksum, wd]) + frame[pos + fcs_len :]


@NATIVE
@PROPERTY
@given(**ZSTD_SETTINGS, frames=st.integers(1, 3))
def test_zstd_frames_of_other_writers_decode_like_numcodecs(native, level, checksum, dtype, chunks, order, kind, seed, frames):
    """Frames without a content size, and a chunk split into several frames: every path gives
    numcodecs' bytes, and the header walk bounds the output from above."""
    comp = numcodecs.Zstd(level=level, checksum=checksum)
    with using_native(native):
        meta = make_meta(comp, chunks, dtype, order)
        chunk = chunk_data(meta, seed, kind)
        data = memory_bytes(chunk, order)
        cuts = sorted({0, len(data)} | {len(data) * k // frames for k in range(1, frames)})
        pieces = [comp.encode(data[a:b]) for a, b in zip(cuts, cuts[1:])]
        payload = b"".join(strip_content_size(bytes(p)) if i % 2 == seed % 2 else bytes(p) for i, p in enumerate(pieces))
        expected = reference_bytes(comp, payload)
        assert expected == data
        check_every_decoder(meta, payload, expected, usual=False)
        assert sum(f.max_output for f in zstd_frames(payload)) >= len(data)
        assert sum(f.compressed_size for f in zstd_frames(payload)) == len(payload)


# --------------------------------------------------------------------------- uncompressed


@NATIVE
@PROPERTY
@given(dtype=st.sampled_from(DTYPES), chunks=st.sampled_from(CHUNKS), order=st.sampled_from(["C", "F"]), seed=st.integers(0, 2**32 - 1))
def test_uncompressed_paths_copy_the_bytes(native, dtype, chunks, order, seed):
    with using_native(native):
        meta = make_meta(None, chunks, dtype, order)
        chunk = chunk_data(meta, seed, "noise")
        payload = memory_bytes(chunk, order)
        check_every_encoder(meta, chunk, payload)
        check_every_decoder(meta, payload, payload)


# --------------------------------------------------------------------------- edge chunks


EVERY_CODEC = [
    None, numcodecs.Zstd(level=3), numcodecs.Zstd(level=1, checksum=True), numcodecs.Blosc("lz4", 5, 1),
    numcodecs.Blosc("zstd", 3, 2, blocksize=256), numcodecs.Zlib(1), numcodecs.GZip(5), numcodecs.BZ2(1),
    numcodecs.LZMA(), numcodecs.LZ4(),
]


@NATIVE
@PROPERTY
@given(
    comp=st.sampled_from(EVERY_CODEC),
    dtype=st.sampled_from(["|u1", "<i2", ">f4", "<f8", "<c8", "|b1"]),
    chunks=st.sampled_from([(16, 8), (3, 5), (2, 3, 4), (7,)]),
    order=st.sampled_from(["C", "F"]),
    fill=st.sampled_from([0, 1, 7]),
    data=st.data(),
)
def test_edge_chunks_are_padded_with_the_fill_value_and_round_trip(native, comp, dtype, chunks, order, fill, data):
    """An edge chunk (smaller than the chunk shape) is stored full-size, padded with the fill
    value: the payload is numcodecs' payload of that padded chunk, and it decodes back."""
    with using_native(native):
        meta = make_meta(comp, chunks, dtype, order, fill_value=fill)
        shape = tuple(data.draw(st.integers(1, c)) for c in chunks)
        seed = data.draw(st.integers(0, 2**32 - 1))
        edge = np.random.default_rng(seed).integers(0, 100, shape).astype(dtype)
        padded = np.full(chunks, fill, dtype=dtype, order=order)  # type: ignore[call-overload]
        padded[tuple(slice(0, s) for s in shape)] = edge
        payload = encode(meta, edge)
        if type(comp) is not numcodecs.GZip:  # gzip embeds a timestamp
            assert payload == reference_payload(comp, padded, order)
            check_every_encoder(meta, padded, payload)
        check_every_decoder(meta, payload, memory_bytes(padded, order))


# --------------------------------------------------------------------------- damaged payloads


def _damage(payload: bytes, how: str, at: int, value: int) -> bytes:
    if not payload:
        return payload
    at %= len(payload)
    if how == "truncate":
        return payload[:at]
    if how == "flip":
        return payload[:at] + bytes([payload[at] ^ (value or 1)]) + payload[at + 1 :]
    if how == "append":
        return payload + bytes([value]) * (1 + at % 7)
    return payload[:at] + payload[at + 1 :]  # drop one byte


@NATIVE
@settings(max_examples=150, deadline=None)
@given(
    comp=st.sampled_from(EVERY_CODEC),
    how=st.sampled_from(["truncate", "flip", "append", "drop"]),
    at=st.integers(0, 2**16),
    value=st.integers(0, 255),
    seed=st.integers(0, 2**16),
)
def test_a_damaged_payload_gives_numcodecs_result_or_a_chunk_decode_error(native, comp, how, at, value, seed):
    """Never other bytes: what decodes through any path is what numcodecs decodes (when
    numcodecs gives a full chunk), anything else raises ChunkDecodeError."""
    with using_native(native):
        meta = make_meta(comp, (16, 8), "<f4")
        payload = _damage(reference_payload(comp, chunk_data(meta, seed, "runs"), "C"), how, at, value)
        nbytes = chunk_nbytes(meta)
        reference = None
        # numcodecs' blosc trusts the header's compressed size (it would read past the end):
        # only payloads whose header matches their length are handed to it as a reference
        blosc_ok = not isinstance(comp, numcodecs.Blosc) or (
            len(payload) >= 16 and int.from_bytes(payload[12:16], "little") <= len(payload))
        if blosc_ok:
            try:
                got = reference_bytes(comp, payload)
                reference = got if len(got) == nbytes else None
            except Exception:  # noqa: BLE001 - numcodecs refuses it
                reference = None
        paths = {
            "decode": lambda: memory_bytes(decode(meta, payload, key="k"), "C"),
            "decode_into": lambda: _into(meta, payload),
            "decode_many": lambda: _many(meta, payload),
        }
        for name, path in paths.items():
            try:
                got = path()
            except ChunkDecodeError as e:
                assert e.key == "k", name
                continue
            assert blosc_ok, name  # a truncated blosc payload must never decode
            assert got == reference, name


def _into(meta, payload):
    row = np.zeros(chunk_nbytes(meta), np.uint8)
    ChunkCodec(meta).decode_into(payload, row, key="k")
    return row.tobytes()


def _many(meta, payload):
    buf = np.frombuffer(payload + b"\0", np.uint8).copy()  # never empty: a buffer has an address
    dst = np.zeros((1, chunk_nbytes(meta)), np.uint8)
    decode_many(meta, buf, buf.ctypes.data, [0], [0], [len(payload)], dst.ctypes.data, key_of=lambda r: "k")
    return dst[0].tobytes()


# --------------------------------------------------------------------------- the switch


def test_set_native_switches_every_binding_and_restores():
    from sharding_store.codec.chunk_codec import set_native

    meta = make_meta(numcodecs.Zstd(level=1), (16, 8), "<f4")
    with using_native(False):
        assert _native.zstd() is None and _native.blosc() is None and _native.memcmp() is None
        assert _native.loops() is None
        assert fast_row_encoder(meta) is None and span_decoder(meta) is None
        assert not takes_address(fast_decoder(meta))
    assert _native.enabled()
    previous = set_native(False)
    try:
        assert previous is True and not _native.enabled()
    finally:
        set_native(previous)
    report = _native.report()
    assert set(report) == {"zstd", "blosc", "loops", "memcmp", "madvise"}


def test_bindings_refuse_a_library_of_another_version(monkeypatch):
    """A library whose version is not numcodecs' own, or not of the API generation the
    signatures were written for, is not bound (the numcodecs path is used)."""
    import numcodecs.blosc as nb
    import numcodecs.zstd as nz

    if _native.zstd() is None or _native.blosc() is None:
        pytest.skip("numcodecs' libraries are not bound here")
    monkeypatch.setattr(nz, "VERSION_NUMBER", nz.VERSION_NUMBER + 1)
    assert _native._bind_zstd() is None
    monkeypatch.setattr(nb, "VERSION_STRING", "2.0.0")
    assert _native._bind_blosc() is None
    monkeypatch.setattr(_native, "BLOSC_VERSIONS", ((1, 6), (1, 7)))
    monkeypatch.setattr(nb, "VERSION_STRING", _native.blosc().version)
    assert _native._bind_blosc() is None
