"""Inner chunk payload <-> ndarray: the one place that applies a draft array's codecs.

Arrays, ``verify`` and the migrator's ``--portable`` recompression all go through
these two functions, so "what a chunk means" is defined once. The pipeline is
zarr-python 2.18's ``Array._encode_chunk``/``_decode_chunk`` exactly:

* encode: full-size chunk (edge chunks padded with the fill value, zeros when it is
  ``None``) laid out in ``order`` -> each filter in order -> compressor -> bytes;
* decode: compressor -> filters in reverse -> view as dtype -> reshape in ``order``.

Encoding is deterministic for the deterministic codecs, so a chunk we write is
byte-identical to the one 2.18 writes (gzip embeds a timestamp, so it is not).
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import threading
from collections.abc import Callable
from typing import Any

import numcodecs
import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_bytes, ensure_ndarray_like

from .draft_metadata import DraftArrayMeta
from .errors import ChunkDecodeError, UsageError

__all__ = [
    "decode_chunk_payload",
    "decode_chunk_into",
    "encode_chunk_payload",
    "fast_decoder",
    "fast_encoder",
    "fast_row_encoder",
    "span_decoder",
    "takes_address",
    "fill_chunk",
    "pad_chunk",
    "chunk_nbytes",
]


class _Keep:
    """Sentinel: use the compressor of the metadata (``None`` means "no compressor")."""

    def __repr__(self) -> str:
        return "<the array's compressor>"


KEEP = _Keep()


def chunk_nbytes(meta: DraftArrayMeta) -> int:
    """Bytes of one decoded (full-size) chunk."""
    return math.prod(meta.chunks) * meta.dtype.itemsize


def fill_chunk(meta: DraftArrayMeta, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A chunk holding only the fill value (zeros if it is ``None``, as zarr 2.18 pads)."""
    shape = meta.chunks if shape is None else shape
    if meta.fill_value is None:
        return np.zeros(shape, dtype=meta.dtype, order=meta.order)  # type: ignore[call-overload]
    out = np.empty(shape, dtype=meta.dtype, order=meta.order)  # type: ignore[call-overload]
    out[...] = meta.fill_value
    return out


def pad_chunk(meta: DraftArrayMeta, chunk: Any) -> np.ndarray:
    """``chunk`` as a full-size, ``order``-contiguous array of the array's dtype.

    An edge chunk (smaller than ``meta.chunks``) is padded with the fill value, which is
    what zarr 2.18 stores for the part of an edge chunk outside the array.
    """
    arr = np.asarray(chunk)
    if arr.shape == meta.chunks:
        return np.asarray(arr, dtype=meta.dtype, order=meta.order)  # type: ignore[call-overload]
    if arr.ndim != len(meta.chunks) or any(s > c for s, c in zip(arr.shape, meta.chunks)):
        raise UsageError(
            f"{meta.path or '/'}: chunk of shape {arr.shape} does not fit the chunk shape {meta.chunks}"
        )
    full = fill_chunk(meta)
    full[tuple(slice(0, s) for s in arr.shape)] = arr
    return full


def encode_chunk_payload(meta: DraftArrayMeta, chunk: Any, compressor: Codec | None | _Keep = KEEP) -> bytes:
    """The inner chunk payload zarr-python 2.18 writes for ``chunk`` (filters, then compressor).

    ``compressor`` overrides the array's (``None``: store uncompressed), which is how the
    migrator recompresses to a portable codec without re-implementing the pipeline.
    """
    data: Any = pad_chunk(meta, chunk)
    for f in meta.filters:
        data = f.encode(data)
    codec = meta.compressor if isinstance(compressor, _Keep) else compressor
    if codec is not None:
        data = codec.encode(data)
    return ensure_bytes(data)


def decode_chunk_payload(
    meta: DraftArrayMeta, payload: Any, *, key: str | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Decode one inner chunk payload into a full-size chunk array (``meta.chunks``, ``meta.order``).

    ``out``: a scratch chunk of that shape, dtype and order to decode into when the
    codecs allow it (blosc, no filters), sparing an allocation and a copy per chunk; the
    result is then ``out`` itself. Any codec failure, or a result of the wrong size,
    raises :class:`ChunkDecodeError` naming the key (when given) and the failing stage.
    """
    where = key or f"chunk of '{meta.path or '/'}'"
    if out is not None and not meta.filters and isinstance(meta.compressor, numcodecs.Blosc):
        return _blosc_into(meta, payload, out, where, key)
    data: Any = payload
    stage = "payload"
    try:
        if meta.compressor is not None:
            stage = f"compressor {meta.compressor.codec_id!r}"
            data = meta.compressor.decode(data)
        for f in reversed(meta.filters):
            stage = f"filter {f.codec_id!r}"
            data = f.decode(data)
        stage = "result"
        arr = ensure_ndarray_like(data)
    except Exception as e:  # numcodecs raises RuntimeError, ValueError, zlib.error, ...
        raise ChunkDecodeError(f"{where}: {stage} failed to decode ({type(e).__name__}: {e})", key=key) from None
    return _as_chunk(meta, arr, where, key)


def _size_error(meta: DraftArrayMeta, nbytes: int, where: str, key: str | None) -> ChunkDecodeError:
    return ChunkDecodeError(
        f"{where}: decoded chunk is {nbytes} bytes, expected {chunk_nbytes(meta)} "
        f"({'x'.join(map(str, meta.chunks)) or 'scalar'} of {meta.dtype.str})",
        key=key,
    )


def _blosc_into(meta: DraftArrayMeta, payload: Any, out: np.ndarray, where: str, key: str | None) -> np.ndarray:
    """Blosc straight into ``out``, after checking the size its header announces
    (blosc 1 header: uncompressed size, uint32 little-endian, at bytes 4-7)."""
    if len(payload) < 16:
        raise ChunkDecodeError(f"{where}: {len(payload)} bytes cannot be a blosc buffer (16-byte header)", key=key)
    nbytes = int.from_bytes(bytes(payload[4:8]), "little")
    try:
        if nbytes == chunk_nbytes(meta):
            meta.compressor.decode(payload, out=out)  # type: ignore[union-attr]
    except Exception as e:
        raise ChunkDecodeError(f"{where}: compressor 'blosc' failed to decode ({type(e).__name__}: {e})", key=key) from None
    if nbytes != chunk_nbytes(meta):
        raise _size_error(meta, nbytes, where, key)
    return out


def _as_chunk(meta: DraftArrayMeta, arr: np.ndarray, where: str, key: str | None) -> np.ndarray:
    """View decoded bytes as the chunk; a size mismatch means the payload is not this array's."""
    if arr.dtype.hasobject:
        raise ChunkDecodeError(f"{where}: decoded to an object array; expected {meta.dtype}", key=key)
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        arr = np.ascontiguousarray(arr)
    flat = arr.reshape(-1, order="A")
    if flat.nbytes != chunk_nbytes(meta):
        raise _size_error(meta, flat.nbytes, where, key)
    if flat.dtype != meta.dtype:
        flat = flat.view(np.uint8).view(meta.dtype)
    return flat.reshape(meta.chunks, order=meta.order)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- batch paths
#
# Arrays decode and encode whole shards at a time, chunk after chunk into (or out of) one
# chunk-major scratch buffer, on a thread pool. These helpers are the per-chunk step of
# that loop: one C call on a buffer, no per-chunk allocation, no per-chunk Python beyond
# that call.
#
# For blosc and zstd the C functions are those of numcodecs' own extension modules
# (their libblosc/libzstd symbols are exported), called through ctypes, which releases
# the GIL: numcodecs' Python-level wrappers cost more than the work on 8-16 KiB chunks
# (blosc: a thread/fork check and two buffer objects per call; zstd: a fresh
# (de)compression context per call, ~20 us). Per-thread zstd contexts are reused. Being
# the same library, the bytes are numcodecs' bytes: zstd encoding is additionally
# checked against ``numcodecs.zstd.compress`` once per (level, checksum) before use.
# Whenever a symbol is missing or a check fails, the numcodecs path is used.

_U32 = struct.Struct("<I")
_BLOSC_HEADER = struct.Struct("<4xIxxxxI")  # nbytes at 4, cbytes at 12
#: a fast decoder: ``decode(payload, out) -> True`` when ``out`` (a C-contiguous uint8 row
#: of ``chunk_nbytes`` bytes, or the integer address of such a row) now holds the chunk's
#: bytes in memory order; False when the caller must take the general path
#: (:func:`decode_chunk_into`), which names the failure
FastDecoder = Callable[[Any, "np.ndarray | int"], bool]


def _zstd_content_size(payload: Any) -> int | None:
    """The frame content size a zstd frame header announces (None: absent or not zstd)."""
    if len(payload) < 6 or bytes(payload[:4]) != b"\x28\xb5\x2f\xfd":
        return None
    fhd = payload[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(payload) < pos + size:
        return None
    value = int.from_bytes(bytes(payload[pos : pos + size]), "little")
    return value + 256 if size == 2 else value


class _Native:
    """ctypes bindings to the libzstd / libblosc inside numcodecs' extension modules."""

    _lock = threading.Lock()
    _zstd: Any = None
    _blosc: Any = None
    # the same functions called *without* releasing the GIL (``ctypes.PyDLL``): for header
    # reads and small chunks, where releasing and re-taking the GIL costs more than the call
    # (~2 us per call here, and with two threads decoding 8 KiB chunks the hand-offs ate
    # all of the second core); see :func:`span_decoder`
    _zstd_held: Any = None
    _blosc_held: Any = None
    _loaded = False

    @classmethod
    def load(cls) -> None:
        with cls._lock:
            if cls._loaded:
                return
            cls._loaded = True
            if os.environ.get("SHARDING_STORE_NO_NATIVE"):
                return
            try:
                cls._zstd = cls._bind_zstd()
            except Exception:  # noqa: BLE001 - no symbols, other build: numcodecs' path
                cls._zstd = None
            try:
                cls._blosc = cls._bind_blosc()
            except Exception:  # noqa: BLE001
                cls._blosc = None
            try:
                cls._zstd_held = cls._bind_zstd(ctypes.PyDLL) if cls._zstd is not None else None
                cls._blosc_held = cls._bind_blosc(ctypes.PyDLL) if cls._blosc is not None else None
            except Exception:  # noqa: BLE001
                cls._zstd_held = cls._blosc_held = None

    @classmethod
    def blosc_for(cls, nbytes: int) -> Any:
        """libblosc as called for chunks of ``nbytes``: keeping the GIL up to
        :data:`HOLD_GIL_BELOW`, releasing it above; None when it could not be bound."""
        if cls._blosc_held is not None and nbytes <= HOLD_GIL_BELOW:
            return cls._blosc_held
        return cls._blosc

    @staticmethod
    def _bind_zstd(dll: Any = ctypes.CDLL) -> Any:
        import numcodecs.zstd as nz

        lib = dll(nz.__file__)
        size_t, vp = ctypes.c_size_t, ctypes.c_void_p
        sigs = {
            "ZSTD_versionNumber": (ctypes.c_uint, []),
            "ZSTD_createDCtx": (vp, []),
            "ZSTD_freeDCtx": (size_t, [vp]),
            # sources as void*: bytes, or the integer address of bytes inside a read buffer
            "ZSTD_decompressDCtx": (size_t, [vp, vp, size_t, vp, size_t]),
            "ZSTD_getFrameContentSize": (ctypes.c_ulonglong, [vp, size_t]),
            "ZSTD_findFrameCompressedSize": (size_t, [vp, size_t]),
            "ZSTD_createCCtx": (vp, []),
            "ZSTD_freeCCtx": (size_t, [vp]),
            "ZSTD_CCtx_setParameter": (size_t, [vp, ctypes.c_int, ctypes.c_int]),
            "ZSTD_compress2": (size_t, [vp, vp, size_t, vp, size_t]),
            "ZSTD_compressBound": (size_t, [size_t]),
            "ZSTD_isError": (ctypes.c_uint, [size_t]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        if lib.ZSTD_versionNumber() != nz.VERSION_NUMBER:
            return None
        return lib

    @staticmethod
    def _bind_blosc(dll: Any = ctypes.CDLL) -> Any:
        import numcodecs.blosc as nb

        lib = dll(nb.__file__)
        fn = lib.blosc_decompress_ctx
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        size_t, vp = ctypes.c_size_t, ctypes.c_void_p
        fn = lib.blosc_compress_ctx  # (clevel, doshuffle, typesize, nbytes, src, dest, destsize, compressor, blocksize, nthreads)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.c_int, size_t, size_t, vp, vp, size_t, ctypes.c_char_p, size_t, ctypes.c_int]
        return lib


class _Ctx:
    """A zstd context owned by one thread, freed with it."""

    __slots__ = ("ptr", "_free")

    def __init__(self, ptr: int, free: Callable[[int], Any]) -> None:
        if not ptr:
            raise MemoryError("zstd: cannot allocate a context")
        self.ptr, self._free = ptr, free

    def __del__(self) -> None:
        try:
            self._free(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process frees it anyway
            pass


_TLS = threading.local()
_ZSTD_C_LEVEL, _ZSTD_C_CHECKSUM = 100, 201  # ZSTD_c_compressionLevel, ZSTD_c_checksumFlag
#: native encoders checked against numcodecs' own bytes, by configuration (see _self_checked)
_SELF_CHECKED: dict[tuple[Any, ...], bool] = {}
_BLOSC_MAX_OVERHEAD = 16


def _zstd_dctx(lib: Any) -> int:
    ctx = getattr(_TLS, "dctx", None)
    if ctx is None:
        ctx = _TLS.dctx = _Ctx(lib.ZSTD_createDCtx(), lib.ZSTD_freeDCtx)
    return ctx.ptr


def _zstd_cctx(lib: Any, level: int, checksum: bool) -> int:
    """This thread's compression context for ``(level, checksum)``, parameters set once
    (``ZSTD_compress2`` resets the session and keeps them)."""
    cctxs = getattr(_TLS, "cctx", None)
    if cctxs is None:
        cctxs = _TLS.cctx = {}
    ctx = cctxs.get((level, checksum))
    if ctx is None:
        ctx = _Ctx(lib.ZSTD_createCCtx(), lib.ZSTD_freeCCtx)
        for param, value in ((_ZSTD_C_LEVEL, level), (_ZSTD_C_CHECKSUM, int(checksum))):
            if lib.ZSTD_isError(lib.ZSTD_CCtx_setParameter(ctx.ptr, param, value)):
                raise ValueError(f"zstd: parameter {param}={value} refused")
        cctxs[(level, checksum)] = ctx
    return ctx.ptr


def _zstd_native_encoder(comp: Any, nbytes: int) -> Callable[[int], bytes] | None:
    """``encode(address) -> payload`` for ``nbytes`` at ``address``, with this thread's
    reused context; None unless it gives exactly ``numcodecs.zstd.compress``'s bytes."""
    _Native.load()
    lib = _Native._zstd
    level = getattr(comp, "level", None)
    checksum = bool(getattr(comp, "checksum", False))
    if lib is None or not isinstance(level, int) or not 1 <= level <= 22 or nbytes < 1:
        return None
    bound = lib.ZSTD_compressBound(nbytes)
    compress2, is_error = lib.ZSTD_compress2, lib.ZSTD_isError

    def encode(address: int) -> bytes:
        dst = getattr(_TLS, "zdst", None)
        if dst is None or len(dst) < bound:
            dst = _TLS.zdst = ctypes.create_string_buffer(bound)
        n = compress2(_zstd_cctx(lib, level, checksum), dst, bound, address, nbytes)
        if is_error(n):
            raise RuntimeError(f"zstd: compression failed (code {n})")
        return ctypes.string_at(dst, n)

    return encode if _self_checked(("zstd", type(comp), level, checksum, nbytes), encode, comp, np.dtype(np.uint8), nbytes) else None


def _blosc_native_encoder(comp: Any, dtype: np.dtype, nbytes: int) -> Callable[[int], bytes] | None:
    """``encode(address) -> payload`` for a chunk of ``nbytes`` of ``dtype`` at ``address``:
    ``blosc_compress_ctx`` as numcodecs calls it off the main thread, with the GIL held for
    small chunks (see :data:`HOLD_GIL_BELOW`); None unless it gives exactly ``comp.encode``'s
    bytes. Two threads encoding 8 KiB chunks through numcodecs spent more on handing the
    GIL back and forth than one thread alone."""
    _Native.load()
    if _Native._blosc is None or dtype.fields is not None or dtype.kind not in "biufcmM" or nbytes < 1:
        return None
    config = comp.get_config()
    cname, clevel, shuffle, blocksize = config["cname"].encode(), config["clevel"], config["shuffle"], config["blocksize"]
    typesize = dtype.itemsize
    if shuffle == -1:  # AUTOSHUFFLE, resolved as numcodecs' compress() does
        shuffle = 2 if typesize == 1 else 1
    compress_ctx = _Native.blosc_for(nbytes).blosc_compress_ctx
    bound = nbytes + _BLOSC_MAX_OVERHEAD

    def encode(address: int) -> bytes:
        dst = getattr(_TLS, "bdst", None)
        if dst is None or len(dst) < bound:
            dst = _TLS.bdst = ctypes.create_string_buffer(bound)
        n = compress_ctx(clevel, shuffle, typesize, nbytes, address, dst, bound, cname, blocksize, 1)
        if n <= 0:
            raise RuntimeError(f"blosc: compression failed (code {n})")
        return ctypes.string_at(dst, n)

    key = ("blosc", cname, clevel, shuffle, blocksize, typesize, nbytes)
    return encode if _self_checked(key, encode, comp, dtype, nbytes) else None


def _self_checked(key: tuple[Any, ...], encode: Callable[[int], bytes], comp: Any, dtype: np.dtype, nbytes: int) -> bool:
    """Whether ``encode`` gives exactly ``comp.encode``'s bytes for a probe chunk of
    ``dtype`` (mixed runs and noise, so that shuffling and matching both matter); checked
    once per configuration."""
    if key not in _SELF_CHECKED:
        probe = (np.arange(max(nbytes, 4096), dtype=np.uint32) * 2654435761 >> 7).astype(np.uint8)
        probe[::7] = 0
        probe = probe[:nbytes]
        try:
            _SELF_CHECKED[key] = encode(probe.ctypes.data) == ensure_bytes(comp.encode(probe.view(dtype)))
        except Exception:  # noqa: BLE001
            _SELF_CHECKED[key] = False
    return _SELF_CHECKED[key]


def _native(decoder: Any) -> FastDecoder:
    """Mark a decoder that also takes the integer address of its output row."""
    decoder.takes_address = True
    return decoder


def takes_address(decoder: FastDecoder | None) -> bool:
    """Whether ``decoder`` accepts the address of its output row instead of an array."""
    return bool(getattr(decoder, "takes_address", False))


def _is_zstd(comp: Any) -> bool:
    return type(comp).__name__ == "Zstd" and getattr(comp, "codec_id", None) == "zstd"


def fast_decoder(meta: DraftArrayMeta) -> FastDecoder | None:
    """A per-chunk decoder into a byte row for the common pipelines (no filters; blosc, zstd
    or no compressor), or None. It checks the size the payload announces before decoding
    and returns False on any mismatch or codec error, so that :func:`decode_chunk_into`
    (the one definition of what a chunk means) reports it."""
    if meta.filters:
        return None
    nbytes = chunk_nbytes(meta)
    comp = meta.compressor
    _Native.load()
    if comp is None:

        def raw(payload: Any, out: Any) -> bool:
            if len(payload) != nbytes:
                return False
            if type(out) is int:
                ctypes.memmove(out, payload if type(payload) is bytes else bytes(payload), nbytes)
            else:
                out[:] = np.frombuffer(payload, dtype=np.uint8)
            return True

        return _native(raw)
    if isinstance(comp, numcodecs.Blosc):
        lib = _Native._blosc
        if lib is not None:
            header = _BLOSC_HEADER.unpack_from
            blosc_ctx = _Native.blosc_for(nbytes).blosc_decompress_ctx

            def blosc_native(payload: Any, out: Any) -> bool:
                src = payload if type(payload) is bytes else bytes(payload)
                # the announced sizes must be this chunk's and this payload's (blosc 1 trusts
                # its header's cbytes: a truncated payload is never handed to it)
                if len(src) < 16 or header(src, 0) != (nbytes, len(src)):
                    return False
                return blosc_ctx(src, out if type(out) is int else out.ctypes.data, nbytes, 1) == nbytes

            return _native(blosc_native)
        from numcodecs.blosc import decompress as blosc_decompress

        unpack = _U32.unpack_from

        def blosc(payload: Any, out: Any) -> bool:
            if len(payload) < 16 or unpack(payload, 4)[0] != nbytes:
                return False
            if type(out) is int:
                return False
            try:
                blosc_decompress(payload, out)
            except Exception:  # noqa: BLE001 - the general path names the error
                return False
            return True

        return blosc
    if _is_zstd(comp):
        zlib = _Native._zstd
        if zlib is not None:
            frame_size = (_Native._zstd_held or zlib).ZSTD_getFrameContentSize  # a header read: keep the GIL
            decompress, dctx = zlib.ZSTD_decompressDCtx, _zstd_dctx

            def zstd_native(payload: Any, out: Any) -> bool:
                src = payload if type(payload) is bytes else bytes(payload)
                # numcodecs sizes its output by the first frame's content size: so do we
                if frame_size(src, len(src)) != nbytes:
                    return False
                addr = out if type(out) is int else out.ctypes.data
                return decompress(dctx(zlib), addr, nbytes, src, len(src)) == nbytes

            return _native(zstd_native)
        from numcodecs.zstd import decompress as zstd_decompress

        def zstd(payload: Any, out: Any) -> bool:
            if type(out) is int or _zstd_content_size(payload) != nbytes:
                return False
            try:
                zstd_decompress(payload, out)
            except Exception:  # noqa: BLE001
                return False
            return True

        return zstd
    return None


#: ``decode(buffer, address, rows, offsets, sizes, dst) -> failed rows``: see :func:`span_decoder`
SpanDecoder = Callable[[Any, int, "list[int]", "list[int]", "list[int]", int], "list[int]"]
#: decoded chunks up to this size are decompressed without releasing the GIL (blosc): the
#: release/re-take costs more than it buys for calls of a few microseconds
HOLD_GIL_BELOW = 64 * 2**10


def _runs(rows: list[int], offsets: list[int], sizes: list[int]) -> list[tuple[int, int, int, int]]:
    """``(first row, rows, first byte, bytes)`` of the runs of consecutive rows whose payloads
    follow each other in the buffer (a compact shard read whole is one run)."""
    runs: list[tuple[int, int, int, int]] = []
    r0 = prev = -2
    o0 = end = 0
    for i, o, n in zip(rows, offsets, sizes):
        if i == prev + 1 and o == end:
            prev, end = i, o + n
            continue
        if r0 >= 0:
            runs.append((r0, prev - r0 + 1, o0, end - o0))
        r0 = prev = i
        o0, end = o, o + n
    if r0 >= 0:
        runs.append((r0, prev - r0 + 1, o0, end - o0))
    return runs


def span_decoder(meta: DraftArrayMeta) -> SpanDecoder | None:
    """Decode many chunks lying in one read buffer (a whole shard object) in one Python call.

    ``decode(buffer, address, rows, offsets, sizes, dst)`` decodes, for each ``i``, the
    payload ``buffer[offsets[i] : offsets[i] + sizes[i]]`` (``address``: the buffer's
    address; ranges already checked to lie inside it) into the row at
    ``dst + rows[i] * chunk_nbytes``, straight from the buffer (no per-chunk ``bytes``
    copy). Returns the rows it did not decode (a size it does not announce as this
    chunk's, or a codec error): :func:`decode_chunk_into` decides those. None when the
    native libraries are unavailable or the pipeline has filters.

    Python threads only decode in parallel when the GIL is released for long enough, so:
    zstd and uncompressed chunks that follow each other in the buffer are decoded with one
    call per run (zstd decodes concatenated frames in one go); blosc has no such call, so
    small blosc chunks are decoded with the GIL held (see :data:`HOLD_GIL_BELOW`).
    """
    if meta.filters:
        return None
    nbytes = chunk_nbytes(meta)
    comp = meta.compressor
    _Native.load()
    if comp is None:
        memmove = ctypes.memmove

        def raw(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
            failed = [i for i, n in zip(rows, sizes) if n != nbytes]
            if failed:
                kept = [(i, o, n) for i, o, n in zip(rows, offsets, sizes) if n == nbytes]
                rows, offsets, sizes = [t[0] for t in kept], [t[1] for t in kept], [t[2] for t in kept]
            for r0, _, o0, length in _runs(rows, offsets, sizes):
                memmove(dst + r0 * nbytes, address + o0, length)
            return failed

        return raw
    if isinstance(comp, numcodecs.Blosc) and _Native._blosc is not None:
        header, blosc_ctx = _BLOSC_HEADER.unpack_from, _Native.blosc_for(nbytes).blosc_decompress_ctx

        def blosc(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
            failed = []
            for i, o, n in zip(rows, offsets, sizes):
                # the header must announce this chunk's size and exactly this payload's length
                # (blosc 1 trusts its cbytes: a truncated payload is never handed to it)
                if n < 16 or header(buf, o) != (nbytes, n) or blosc_ctx(address + o, dst + i * nbytes, nbytes, 1) != nbytes:
                    failed.append(i)
            return failed

        return blosc
    if _is_zstd(comp) and _Native._zstd is not None and _Native._zstd_held is not None:
        lib, held = _Native._zstd, _Native._zstd_held
        frame_size, frame_len, decompress = held.ZSTD_getFrameContentSize, held.ZSTD_findFrameCompressedSize, lib.ZSTD_decompressDCtx

        def zstd(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
            ctx = _zstd_dctx(lib)
            failed, good = [], []
            for i, o, n in zip(rows, offsets, sizes):
                # exactly one frame, announcing this chunk's size (numcodecs sizes its output by
                # the first frame's): then decoding the run's frames in one call puts every
                # chunk's bytes in its own row, and any error falls back to one call per chunk
                if frame_size(address + o, n) == nbytes and frame_len(address + o, n) == n:
                    good.append((i, o, n))
                else:
                    failed.append(i)
            if not good:
                return failed
            g_rows, g_offs, g_sizes = (list(t) for t in zip(*good))
            for r0, k, o0, length in _runs(g_rows, g_offs, g_sizes):
                if decompress(ctx, dst + r0 * nbytes, k * nbytes, address + o0, length) == k * nbytes:
                    continue
                for i, o, n in zip(g_rows, g_offs, g_sizes):
                    if r0 <= i < r0 + k and decompress(ctx, dst + i * nbytes, nbytes, address + o, n) != nbytes:
                        failed.append(i)
            return failed

        return zstd
    return None


def decode_chunk_into(meta: DraftArrayMeta, payload: Any, out: np.ndarray, *, key: str | None = None) -> None:
    """The general path of a batch decode: :func:`decode_chunk_payload`, then its bytes in
    memory order into the uint8 row ``out`` (raises :class:`ChunkDecodeError`)."""
    chunk = decode_chunk_payload(meta, payload, key=key)
    out[:] = np.ravel(chunk, order=meta.order).view(np.uint8)


#: ``encode(chunk) -> payload`` for a full-size chunk already in ``meta.order`` layout
FastEncoder = Callable[[np.ndarray], bytes]


def fast_encoder(meta: DraftArrayMeta) -> FastEncoder:
    """Encode full-size chunks that are contiguous in ``meta.order`` (no padding step):
    the same bytes as :func:`encode_chunk_payload`, with the checks and copies that a
    batch has already done left out."""
    comp = meta.compressor
    if meta.filters:
        return lambda chunk: encode_chunk_payload(meta, chunk)
    if comp is None:
        return lambda chunk: chunk.tobytes(order="A")
    encode = comp.encode  # blosc: its *_ctx function (GIL released) off the main thread
    return lambda chunk: ensure_bytes(encode(chunk))


def fast_row_encoder(meta: DraftArrayMeta) -> Callable[[int], bytes] | None:
    """``encode(address) -> payload`` for a full-size chunk whose bytes (memory order) sit at
    ``address``: zstd through a reused per-thread context, blosc through its context
    function (numcodecs' bytes exactly, both self-checked), or None (use :func:`fast_encoder`)."""
    if meta.filters:
        return None
    if _is_zstd(meta.compressor):
        return _zstd_native_encoder(meta.compressor, chunk_nbytes(meta))
    if type(meta.compressor) is numcodecs.Blosc:
        return _blosc_native_encoder(meta.compressor, meta.dtype, chunk_nbytes(meta))
    return None


# bound at import (~0.3 ms: the libraries are numcodecs' own, loaded already) rather than by
# the first array opened, whose first read is what users time
_Native.load()
