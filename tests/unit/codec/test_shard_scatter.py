"""Whole shards decoded and copied into the output in one C call (``ss_shard_scatter``,
through ``ChunkCodec.scatter``) against numpy slicing of the data written and against the
reference path (loops off: per-chunk bindings and numcodecs), byte for byte.

Random arrays (1-3 dimensions, edge chunks and edge shards, C and F order, every item kind
the fast paths take, blosc of every setting, zstd, uncompressed, absent chunks and absent
shards) read with random basic selections; damaged shard objects (bytes flipped, index
entries forged, objects truncated) must read exactly as the reference path reads them:
the same array or the same error naming the same key. The C function itself is held to
its contract: it refuses a bad index, a payload it does not take and a geometry outside
the chunk or the output, and never writes outside the output it is given.
"""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store.api.arrays import _ScatterGeometry, create_draft_array, normalize_selection, open_draft
from sharding_store.codec import _native
from sharding_store.codec.chunk_codec import chunk_nbytes, encode_chunk_payload, using_native
from sharding_store.formats.shard_index import MAX_UINT64

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOOPS = pytest.mark.skipif(_native.loops() is None, reason="sharding_store/codec/_loops.c is not built here (setup.py build_ext --inplace)")
DTYPES = ["|u1", "<u2", ">i2", "<i4", "<f4", ">f8", "<c8", "|b1", "<M8[ns]", "|S3", "<U2", "|V5"]


def _compressors() -> st.SearchStrategy:
    blosc = st.builds(
        lambda cname, clevel, shuffle, blocksize: numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize),
        st.sampled_from(["lz4", "blosclz", "zstd", "zlib"]),
        st.integers(0, 9),
        st.sampled_from([-1, 0, 1, 2]),
        st.sampled_from([0, 256, 4096]),
    )
    zstd = st.builds(lambda level, checksum: numcodecs.Zstd(level=level, checksum=checksum), st.sampled_from([-1, 1, 3, 9]), st.booleans())
    return st.one_of(blosc, zstd, st.none())


@st.composite
def arrays(draw):
    """(shape, chunks, chunks per shard, dtype, order, compressor, fill value, data)."""
    ndim = draw(st.integers(1, 3))
    chunks = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    cps = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    shape = tuple(draw(st.integers(1, c * k * 2 + 3)) for c, k in zip(chunks, cps))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if draw(st.booleans()):  # runs: compressible, and many chunks equal to the fill value
        raw = np.repeat(raw[: max(1, raw.size // 23)], 23)[: raw.size]
        raw = np.pad(raw, (0, int(np.prod(shape)) * dtype.itemsize - raw.size))
    if dtype.kind == "b":
        raw &= 1  # numpy's bytes of a bool
    data = raw.view(dtype).reshape(shape)
    fill = None
    if dtype.kind in "biuf":
        fill = data.flat[0].item() if data.size and draw(st.booleans()) else 0
    return shape, chunks, cps, dtype, draw(st.sampled_from(["C", "F"])), draw(_compressors()), fill, data


@st.composite
def selections(draw, shape):
    key = []
    for n in shape:
        kind = draw(st.sampled_from(["all", "slice", "int"]))
        if kind == "all":
            key.append(slice(None))
        elif kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        else:
            a, b = draw(st.integers(-n - 2, n + 2)), draw(st.integers(-n - 2, n + 2))
            key.append(slice(a, b, draw(st.sampled_from([1, 1, 2, 3, -1, -2]))))
    return tuple(key)


def _write(base, spec, erase: bool):
    shape, chunks, cps, dtype, order, comp, fill, data = spec
    a = create_draft_array(
        base, "x", shape=shape, chunks=chunks, dtype=dtype, chunks_per_shard=cps, compressor=comp, order=order,
        fill_value=fill, write_empty_chunks=not erase,
    )
    a[...] = data
    return a


def _read(base, key, *, loops: bool = True, native: bool = True, scatter: bool = True):
    """``(result, None)`` or ``(None, (error type, message))`` of a read of ``x[key]``;
    ``scatter=False``: the loops on, the whole-shard scatter alone off (the path before it)."""
    with using_native(native), _native.using_loops(loops):
        try:
            a = open_draft(base, "x")
            if not scatter:
                a.codec.scatter = None
            return a[key], None
        except Exception as e:  # noqa: BLE001 - compared between paths
            return None, (type(e), str(e))


def _same(x, y) -> bool:
    """Same shape, item type (a void type reads back as a one-field record: the metadata's
    spelling) and bytes."""
    same_type = x.dtype == y.dtype or (x.dtype.kind == y.dtype.kind == "V" and x.dtype.itemsize == y.dtype.itemsize)
    return x.shape == y.shape and same_type and x.tobytes() == y.tobytes()


@pytest.mark.slow  # 60 random arrays; the damaged-shard and output-bounds properties stay in the fast loop
@LOOPS
@PROPERTY
@given(spec=arrays(), erase=st.booleans(), local=st.booleans(), data=st.data())
def test_scattered_reads_equal_numpy_and_the_reference_path(spec, erase, local, data):
    with tempfile.TemporaryDirectory() as tmp:
        base = tmp if local else {}
        a = _write(base, spec, erase)
        if spec[5] is None or isinstance(spec[5], (numcodecs.Blosc, numcodecs.Zstd)):
            assert open_draft(base, "x").codec.scatter is not None
        expected = spec[-1]
        for key in [(...,), data.draw(selections(spec[0])), data.draw(selections(spec[0]))]:
            got, err = _read(base, key)
            assert err is None, err
            want = np.asarray(expected[key])
            got = np.asarray(got)
            if erase and want.dtype.kind in "f":  # an erased chunk of -0.0 reads back as the fill value 0.0
                assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True), key
            else:
                assert _same(got, want), key
            ref, ref_err = _read(base, key, loops=False)
            assert ref_err is None and _same(np.asarray(ref), np.asarray(got))
        del a


def _damage(blob: bytes, how: str, rng: np.random.Generator, n_entries: int) -> bytes:
    b = bytearray(blob)
    if how == "flip":
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif how == "truncate":
        del b[int(rng.integers(0, len(b))) :]
    elif how == "entry":
        e = int(rng.integers(0, n_entries))
        at = len(b) - 16 * n_entries + 16 * e
        if at >= 0:
            size = len(b) - 16 * n_entries
            o, s = np.frombuffer(bytes(b[at : at + 16]), "<u8").tolist()
            choices = [
                (MAX_UINT64, s), (o, MAX_UINT64), (MAX_UINT64 - 3, 10), (o, s + 1), (max(0, o - 1), s),
                (o, max(0, s - 1)), (size, 1), (0, size + 1), (0, 0), (o, 0), (0, size),
            ]
            pick = choices[int(rng.integers(0, len(choices)))]
            b[at : at + 16] = np.array([min(v, MAX_UINT64) for v in pick], "<u8").tobytes()
    elif how == "append":
        b[:0] = bytes(int(rng.integers(1, 9)))  # payloads shifted: every entry points elsewhere
    return bytes(b)


@LOOPS
@PROPERTY
@given(spec=arrays(), how=st.sampled_from(["flip", "truncate", "entry", "append"]), seed=st.integers(0, 2**32 - 1))
def test_damaged_shards_read_exactly_as_the_reference_path_reads_them(spec, how, seed):
    store: dict = {}
    _write(store, spec, erase=bool(seed & 1))
    shards = sorted(k for k in store if k.startswith("data/root/x/"))
    if not shards:
        return
    rng = np.random.default_rng(seed)
    key = shards[int(rng.integers(0, len(shards)))]
    n_entries = int(np.prod(spec[2]))
    store[key] = _damage(store[key], how, rng, n_entries)
    got, err = _read(store, ...)
    before, before_err = _read(store, ..., scatter=False)
    ref, ref_err = _read(store, ..., loops=False)
    numcodecs_only, nc_err = _read(store, ..., native=False)
    assert err == before_err, (err, before_err)  # word for word what the read without the scatter raises
    # the per-chunk bindings and numcodecs alone: the same outcome (when several chunks of
    # the shard are damaged they may name another one first, and numcodecs words a codec's
    # failure its own way)
    for other in (ref_err, nc_err):
        assert (err is None) == (other is None) and (err is None or err[0] == other[0]), (err, other)
    if err is None:
        assert _same(got, before) and _same(got, ref) and _same(got, numcodecs_only)
    else:
        assert "data/root/x/c" in err[1], err  # the shard's key, or the draft key of its chunk


# --------------------------------------------------------------------------- the C call itself


def _one_shard(tmp, comp=numcodecs.Blosc("lz4", 5, 1), order="C"):
    a = create_draft_array(tmp, "x", shape=(8, 6), chunks=(4, 3), dtype="<u2", chunks_per_shard=(2, 2), compressor=comp, order=order)
    data = (np.arange(48, dtype="<u2") * 7).reshape(8, 6)
    a[...] = data
    a = open_draft(tmp, "x")
    sels, _ = normalize_selection(..., a.shape)
    combo = next(iter(a._shard_plans(sels)))
    blob = np.frombuffer(tmp["data/root/x/c0/0"], np.uint8).copy()
    return a, data, combo, blob


@LOOPS
@pytest.mark.parametrize("order", ["C", "F"])
def test_the_scatter_writes_its_shard_and_nothing_else(order):
    a, data, combo, blob = _one_shard({}, order=order)
    pad = 64
    guard = np.full(data.nbytes + 2 * pad, 0xA5, np.uint8)
    out = guard[pad:-pad].view("<u2").reshape(data.shape)
    geom = _ScatterGeometry(a, out).of(combo)
    status = a.codec.scatter(blob.ctypes.data, len(blob), geom, a._fill_row().ctypes.data, out.ctypes.data, out.nbytes)
    assert status == 0
    assert _same(out, data)
    assert (guard[:pad] == 0xA5).all() and (guard[-pad:] == 0xA5).all()


@LOOPS
def test_the_scatter_refuses_what_the_reference_path_must_decide():
    a, data, combo, blob = _one_shard({})
    fill = a._fill_row().ctypes.data
    guard = np.full(data.nbytes + 128, 0xA5, np.uint8)
    out = guard[64:-64].view("<u2").reshape(data.shape)
    geom = _ScatterGeometry(a, out).of(combo)

    def call(b: np.ndarray, g: bytes = geom, nbytes: int = out.nbytes) -> int:
        return a.codec.scatter(b.ctypes.data, len(b), g, fill, out.ctypes.data, nbytes)

    idx = blob[-64:].view("<u8").reshape(4, 2)
    bad = blob.copy()
    bad[-64:].view("<u8").reshape(4, 2)[1, 0] = MAX_UINT64  # a half sentinel
    assert call(bad) == -1
    bad = blob.copy()
    bad[-64:].view("<u8").reshape(4, 2)[2, 1] = len(blob)  # past the payload area
    assert call(bad) == -1
    assert call(blob[:40].copy()) == -1  # shorter than its index
    bad = blob.copy()
    bad[int(idx[3, 0]) + 4] ^= 0xFF  # chunk 3's blosc header announces another size
    assert call(bad) == 1 + 3
    assert call(blob, nbytes=out.nbytes - 1) == -2  # the last chunk's block would end past the output
    header = bytearray(geom)
    header[8 * 4 : 8 * 5] = (3).to_bytes(8, "little")  # chunks_per_shard that do not give n_entries
    assert call(blob, bytes(header)) == -2
    assert call(blob, geom[:-8]) == -2 and call(blob, geom + bytes(8)) == -2  # tables of another length
    assert (guard[:64] == 0xA5).all() and (guard[-64:] == 0xA5).all()


@LOOPS
def test_a_whole_read_caches_the_indices_it_checked_natively(tmp_path):
    a = create_draft_array(str(tmp_path), "x", shape=(9, 10), chunks=(2, 3), dtype="<i4", chunks_per_shard=(2, 2))
    a[...] = np.arange(90, dtype="<i4").reshape(9, 10)
    native = open_draft(str(tmp_path), "x")
    native[...]
    with _native.using_loops(False):
        reference = open_draft(str(tmp_path), "x")
        reference[...]
    keys = sorted(native.engine.cache._entries)
    assert keys == sorted(reference.engine.cache._entries) and len(keys) == 6
    for key in keys:
        x, y = native.engine.cache.get(key), reference.engine.cache.get(key)
        assert x.size == y.size and x.version == y.version
        assert np.array_equal(x.index.entries, y.index.entries) and x.index.entries.dtype == y.index.entries.dtype


def test_payload_sizes_match_the_chunk():
    """Guard for the geometry header: a chunk's bytes are what the codec layer says."""
    a, _, _, _ = _one_shard({}, comp=None)
    assert a._cnb == chunk_nbytes(a.meta) == len(encode_chunk_payload(a.meta, np.zeros((4, 3), "<u2")))


@LOOPS
@PROPERTY
@given(spec=arrays(), data=st.data())
def test_populating_the_output_stays_inside_it_and_changes_no_value(spec, data):
    """Big outputs are faulted in a run at a time (``MADV_POPULATE_WRITE`` over the run's
    span): with the threshold at 0 every read does it; each span lies inside the output and
    the values are numpy's."""
    import sharding_store.api.arrays as array_module

    store: dict = {}
    _write(store, spec, erase=False)
    calls: list[tuple[int, int, int]] = []
    real = _native.madvise

    def spy(address: int, nbytes: int, advice: int) -> bool:
        calls.append((address, nbytes, advice))
        return real(address, nbytes, advice)

    outputs: list[np.ndarray] = []
    real_output = array_module._output

    def output(shape, dtype):
        outputs.append(real_output(shape, dtype))
        return outputs[-1]

    key = data.draw(selections(spec[0]))
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(array_module, "POPULATE_MIN", 0)
        mp.setattr(array_module, "_output", output)
        mp.setattr(_native, "madvise", spy)
        got = open_draft(store, "x")[key]
    finally:
        mp.undo()
    assert _same(np.asarray(got), np.asarray(spec[-1][key]))
    (out,) = outputs
    lo, hi = out.ctypes.data, out.ctypes.data + out.nbytes
    populated = [(a, n) for a, n, advice in calls if advice == _native.MADV_POPULATE_WRITE]
    if all(s.count == n for s, n in zip(normalize_selection(key, spec[0])[0], spec[0])):
        assert populated  # every chunk of every shard selected: whole-shard runs
    for address, nbytes in populated:
        assert lo <= address and address + nbytes <= hi
