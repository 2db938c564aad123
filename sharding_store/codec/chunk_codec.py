"""Inner chunk payload <-> ndarray: the one place that applies a draft array's codecs.

Arrays, the shard engine, ``verify``, ``evidence`` and the migrator's ``--portable``
recompression all go through this module, so "what a chunk means" is defined once. The
interface:

* :func:`decode` (also spelled :func:`decode_chunk_payload`): one payload -> a full-size
  chunk array. This is the **reference**: numcodecs' codecs, in zarr-python 2.18's
  ``Array._decode_chunk`` order (compressor -> filters in reverse -> view as dtype ->
  reshape in ``order``), every stage bounded (below).
* :func:`decode_into`: one payload -> the chunk's bytes (memory order) in a uint8 row or at
  an address; :func:`decode_many`: many payloads lying in one read buffer (a whole shard)
  -> their rows, in one Python call. Both take a native fast path where there is one and
  fall back to the reference for anything it does not accept, so they raise exactly
  what :func:`decode` raises.
* :func:`encode` (also :func:`encode_chunk_payload`): a chunk -> the payload zarr-python
  2.18 writes (edge chunks padded with the fill value, then filters, then compressor).
  Deterministic codecs give byte-identical payloads (gzip embeds a timestamp).
* :class:`ChunkCodec`: the same operations for one array, each path chosen once (what
  arrays and the shard engine hold on to).

**Bounded decompression.** A payload is untrusted input: a few KiB can claim, or inflate
to, gigabytes. Every stage is bounded by the chunk's size before anything is allocated:
zstd frame headers (content size, or an upper bound from the block headers when a frame
has none), blosc's header (uncompressed size, and its compressed size against the
payload's length), numcodecs' LZ4 size prefix; zlib, gzip, bz2 and lzma run through
incremental decompressors with a ``max_length`` and are refused when more output
remains; any other codec is refused when its output overshoots. With filters the
compressor's output is bounded by :data:`FILTER_GROWTH` times the chunk. A refused
payload raises :class:`ChunkDecodeError` naming the key, like any payload that does not
decode to exactly one chunk.

**Fast paths.** Compiled code is reached only through :mod:`._native` (numcodecs' own
libzstd and libblosc, so the bytes are numcodecs' bytes). A fast decoder checks the sizes
a payload announces before decoding (the same bounds) and declines anything unusual; a
fast encoder is used only after it gave numcodecs' exact bytes for a probe chunk of its
configuration. :func:`set_native` switches them off, which is how the property tests
compare each fast path with the reference.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import math
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .. import _numcodecs_adapter
from ..errors import ChunkDecodeError, UsageError
from ..formats.draft_metadata import DraftArrayMeta
from . import _native
from ._native import HOLD_GIL_BELOW

if TYPE_CHECKING:
    from numcodecs.abc import Codec

__all__ = [
    "BloscHeader",
    "ChunkCodec",
    "FILTER_GROWTH",
    "HOLD_GIL_BELOW",
    "KEEP",
    "chunk_nbytes",
    "codec_for",
    "decode",
    "decode_chunk_into",
    "decode_chunk_payload",
    "decode_into",
    "decode_many",
    "encode",
    "encode_chunk_payload",
    "fast_decoder",
    "fast_encoder",
    "fast_row_encoder",
    "fill_chunk",
    "pad_chunk",
    "set_native",
    "shard_scatterer",
    "span_decoder",
    "takes_address",
    "using_native",
    "zstd_frames",
    "ZstdFrame",
]

# numcodecs is imported where a codec is used, not with this module (``import numcodecs``
# costs ~80 ms here: every codec module and an entry-point scan): importing the package's
# modules loads it only once a codec object is built


def ensure_bytes(buf: Any) -> bytes:
    """``numcodecs.compat.ensure_bytes`` (imported on first use)."""
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    from numcodecs.compat import ensure_bytes as ensure

    return ensure(buf)


def ensure_ndarray_like(buf: Any) -> Any:
    """``numcodecs.compat.ensure_ndarray_like`` (imported on first use)."""
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    from numcodecs.compat import ensure_ndarray_like as ensure

    return ensure(buf)


def _blosc_class() -> type:
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    import numcodecs

    return numcodecs.Blosc


def _is_blosc(comp: Any) -> bool:
    """``isinstance(comp, numcodecs.Blosc)``, without importing numcodecs for a codec that
    cannot be one (no compressor; numcodecs is loaded once any codec object exists)."""
    return comp is not None and isinstance(comp, _blosc_class())


class _Keep:
    """Sentinel: use the compressor of the metadata (``None`` means "no compressor")."""

    def __repr__(self) -> str:
        return "<the array's compressor>"


KEEP = _Keep()

#: with filters, what the compressor decodes to (the filters' encoding of a chunk) may be
#: larger than the chunk: up to this many times (a filter can widen 1-byte items to 16-byte
#: ones), plus :data:`FILTER_SLACK`. Beyond that a payload is refused.
FILTER_GROWTH = 16
FILTER_SLACK = 64 * 2**10


def set_native(enabled: bool) -> bool:
    """Use compiled fast paths (True, the default) or only the numcodecs reference path;
    returns the previous setting. Applies to decoders and encoders built afterwards (an
    array opened before keeps its paths). For tests and for ruling the fast paths out."""
    return _native.set_enabled(enabled)


@contextmanager
def using_native(enabled: bool) -> Iterator[None]:
    """``with using_native(False): ...``: :func:`set_native` for the block, then restored."""
    with _native.using(enabled):
        yield


# --------------------------------------------------------------------------- chunks


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


# --------------------------------------------------------------------------- encode (reference)


def encode(meta: DraftArrayMeta, chunk: Any, compressor: Codec | None | _Keep = KEEP) -> bytes:
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


encode_chunk_payload = encode


# --------------------------------------------------------------------------- decode (reference)


def decode(meta: DraftArrayMeta, payload: Any, *, key: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Decode one inner chunk payload into a full-size chunk array (``meta.chunks``, ``meta.order``).

    ``out``: a scratch chunk of that shape, dtype and order to decode into when the
    codecs allow it (no filters: blosc, zstd, none), sparing an allocation and a copy per
    chunk; the result is then ``out`` itself. Every stage is bounded by the chunk's size
    (see the module docstring). Any codec failure, a payload announcing or producing more
    than the chunk can hold, or a result of the wrong size, raises
    :class:`ChunkDecodeError` naming the key (when given) and the failing stage.
    """
    where = key or f"chunk of '{meta.path or '/'}'"
    if out is not None and not meta.filters:
        fast = codec_for(meta)._fast
        if fast is not None and out.flags.c_contiguous | out.flags.f_contiguous:
            if fast(payload, _native.data_address(out) if takes_address(fast) else out.reshape(-1, order="A").view(np.uint8)):
                return out
        if _is_blosc(meta.compressor):
            return _blosc_into(meta, payload, out, where, key)
    nbytes = chunk_nbytes(meta)
    limit = nbytes if not meta.filters else nbytes * FILTER_GROWTH + FILTER_SLACK
    data: Any = payload
    stage = "payload"
    try:
        if meta.compressor is not None:
            stage = f"compressor {meta.compressor.codec_id!r}"
            data = _bounded_decode(meta.compressor, data, limit, stage, where, key)
        for f in reversed(meta.filters):
            stage = f"filter {f.codec_id!r}"
            data = _bounded_decode(f, data, limit, stage, where, key)
        stage = "result"
        arr = ensure_ndarray_like(data)
    except ChunkDecodeError:
        raise
    except Exception as e:  # numcodecs raises RuntimeError, ValueError, zlib.error, ...
        raise ChunkDecodeError(f"{where}: {stage} failed to decode ({type(e).__name__}: {e})", key=key) from None
    return _as_chunk(meta, arr, where, key)


decode_chunk_payload = decode


def _size_error(meta: DraftArrayMeta, nbytes: int, where: str, key: str | None) -> ChunkDecodeError:
    return ChunkDecodeError(
        f"{where}: decoded chunk is {nbytes} bytes, expected {chunk_nbytes(meta)} "
        f"({'x'.join(map(str, meta.chunks)) or 'scalar'} of {meta.dtype.str})",
        key=key,
    )


def _too_big(stage: str, announced: int | None, limit: int, where: str, key: str | None) -> ChunkDecodeError:
    what = f"announces {announced} bytes" if announced is not None else "decodes to more bytes"
    return ChunkDecodeError(
        f"{where}: {stage} {what}, more than the {limit} this chunk can hold: refused before decoding it all",
        key=key,
    )


def _blosc_into(meta: DraftArrayMeta, payload: Any, out: np.ndarray, where: str, key: str | None) -> np.ndarray:
    """Blosc straight into ``out``, after checking the sizes its header announces."""
    header = _blosc_header(payload, where, key)
    try:
        if header.nbytes == chunk_nbytes(meta):
            meta.compressor.decode(payload, out=out)  # type: ignore[union-attr]
    except Exception as e:
        raise ChunkDecodeError(f"{where}: compressor 'blosc' failed to decode ({type(e).__name__}: {e})", key=key) from None
    if header.nbytes != chunk_nbytes(meta):
        if header.nbytes > chunk_nbytes(meta):
            raise _too_big("compressor 'blosc'", header.nbytes, chunk_nbytes(meta), where, key)
        raise _size_error(meta, header.nbytes, where, key)
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


# --------------------------------------------------------------------------- bounded stages


class BloscHeader(NamedTuple):
    """The 16-byte header of a blosc 1 buffer (all sizes little-endian uint32)."""

    version: int
    flags: int
    typesize: int
    nbytes: int  # uncompressed size
    blocksize: int
    cbytes: int  # compressed size, header included: blosc 1 reads this many bytes, trusting it


_BLOSC_HEADER = struct.Struct("<BxBBIII")
_BLOSC_MEMCPYED = 0x2


def _blosc_header(payload: Any, where: str, key: str | None) -> BloscHeader:
    """The header of a blosc payload, checked against the payload's length: blosc 1 trusts
    its ``cbytes`` (a payload shorter than it says would be read past its end)."""
    n = len(payload)
    if n < 16:
        raise ChunkDecodeError(f"{where}: {n} bytes cannot be a blosc buffer (16-byte header)", key=key)
    h = BloscHeader(*_BLOSC_HEADER.unpack_from(payload, 0))
    if h.cbytes > n or h.cbytes < 16 or (h.flags & _BLOSC_MEMCPYED and h.cbytes < h.nbytes + 16):
        raise ChunkDecodeError(
            f"{where}: blosc header announces {h.cbytes} compressed bytes for {h.nbytes} "
            f"({'stored' if h.flags & _BLOSC_MEMCPYED else 'compressed'}), the payload has {n}: truncated or forged",
            key=key,
        )
    return h


class ZstdFrame(NamedTuple):
    """One frame of a zstd payload, as its headers describe it (nothing decoded)."""

    content_size: int | None  # as the frame header announces it (None: not announced)
    compressed_size: int  # bytes of the frame, header and checksum included
    max_output: int  # bytes it can decode to: the content size, else the block headers' bound


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_BLOCK_MAX = 128 * 2**10


def _zstd_content_size(payload: Any) -> int | None:
    """The content size the first zstd frame header announces (None: absent or not zstd)."""
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


def zstd_frames(payload: Any, limit: int | None = None) -> list[ZstdFrame]:
    """The frames of a zstd payload, from their headers alone (RFC 8878): each frame's
    announced content size and, from its block headers, an upper bound of its output (raw
    and RLE blocks give their size, a compressed block at most the block maximum). Stops
    early once the outputs add up to more than ``limit``. Raises ValueError for bytes
    that are not zstd frames."""
    data = bytes(payload)
    n, pos, total = len(data), 0, 0
    frames: list[ZstdFrame] = []
    while pos < n:
        if n - pos < 8:
            raise ValueError(f"truncated zstd frame at byte {pos}")
        magic = int.from_bytes(data[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: a size, then that many bytes
            size = 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
            if pos + size > n:
                raise ValueError(f"truncated skippable frame at byte {pos}")
            frames.append(ZstdFrame(0, size, 0))
            pos += size
            continue
        if magic != _ZSTD_MAGIC:
            raise ValueError(f"no zstd frame at byte {pos}")
        fhd = data[pos + 4]
        fcs_flag, single, reserved, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 3) & 1, (fhd >> 2) & 1, fhd & 3
        if reserved:
            raise ValueError(f"zstd frame at byte {pos}: reserved header bit set")
        p = pos + 5
        window = 0
        if not single:
            wd = data[p]
            base = 1 << (10 + (wd >> 3))
            window = base + (base >> 3) * (wd & 7)
            p += 1
        p += (0, 1, 2, 4)[dict_flag]
        fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
        content: int | None = None
        if fcs_len:
            if p + fcs_len > n:
                raise ValueError(f"truncated zstd frame header at byte {pos}")
            content = int.from_bytes(data[p : p + fcs_len], "little") + (256 if fcs_len == 2 else 0)
            p += fcs_len
        if single:
            window = content or 0
        block_max = min(window, _ZSTD_BLOCK_MAX)
        bound = 0
        while True:
            if p + 3 > n:
                raise ValueError(f"truncated zstd block header at byte {p}")
            bh = int.from_bytes(data[p : p + 3], "little")
            p += 3
            kind, size = (bh >> 1) & 3, bh >> 3
            if kind == 0:  # raw
                bound, p = bound + size, p + size
            elif kind == 1:  # RLE: one byte, repeated size times
                bound, p = bound + size, p + 1
            elif kind == 2:  # compressed: at most one block's worth
                bound, p = bound + block_max, p + size
            else:
                raise ValueError(f"zstd block at byte {p - 3}: reserved block type")
            if p > n:
                raise ValueError(f"truncated zstd block at byte {p}")
            if limit is not None and total + min(bound, content if content is not None else bound) > limit:
                break  # already more than allowed: the caller refuses, no need to read on
            if bh & 1:
                break
        p += 4 * checksum
        frames.append(ZstdFrame(content, p - pos, bound if content is None else content))
        total += frames[-1].max_output
        pos = p
        if limit is not None and total > limit:
            break
    return frames


def _capped_read(reader: Any, limit: int) -> bytes:
    """At most ``limit`` bytes from a decompressing file object, and none left over."""
    data = reader.read(limit + 1)
    if len(data) > limit:
        raise _Overshoot(None)
    return data


class _Overshoot(Exception):
    """A stage's output would exceed its bound (``announced``: what its header claims)."""

    def __init__(self, announced: int | None) -> None:
        super().__init__(announced)
        self.announced = announced


def _zlib(codec: Any, data: Any, limit: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(data, limit)
    if d.unconsumed_tail and d.decompress(d.unconsumed_tail, 1):
        raise _Overshoot(None)
    if not d.eof:  # zlib.decompress's message for the same payload
        raise zlib.error("Error -5 while decompressing data: incomplete or truncated stream")
    return out


def _gzip(codec: Any, data: Any, limit: int) -> bytes:
    with gzip.GzipFile(fileobj=io.BytesIO(ensure_bytes(data)), mode="rb") as f:
        return _capped_read(f, limit)


def _bz2(codec: Any, data: Any, limit: int) -> bytes:
    with bz2.BZ2File(io.BytesIO(ensure_bytes(data))) as f:
        return _capped_read(f, limit)


def _lzma(codec: Any, data: Any, limit: int) -> bytes:
    with lzma.LZMAFile(io.BytesIO(ensure_bytes(data)), format=codec.format, filters=codec.filters) as f:
        return _capped_read(f, limit)


#: without libzstd, a zstd payload whose frames do not all announce their size is decoded
#: by numcodecs only when its block headers bound the output to the chunk plus this much (a
#: compressed block's output is known only to be at most 128 KiB)
ZSTD_SLACK = 2 * _ZSTD_BLOCK_MAX
_ZSTD_DST_TOO_SMALL = 70  # ZSTD_error_dstSize_tooSmall


def _zstd(codec: Any, data: Any, limit: int) -> Any:
    """Zstd bounded. The usual payload (numcodecs writes it) is one frame announcing its
    size: its header says it all, and numcodecs decodes it (libzstd refuses a frame whose
    output differs from what it announces). Other writers' payloads (frames without a
    size, several frames) are decoded by numcodecs' libzstd into a buffer of the bound,
    which fails rather than overflow; without the binding, the frames' headers must bound
    the output first (see :func:`zstd_frames`)."""
    first = _zstd_content_size(data)
    if first is not None and first > limit:
        raise _Overshoot(first)
    lib = _native.zstd()
    if lib is None:
        try:
            bound = sum(f.max_output for f in zstd_frames(data, limit + ZSTD_SLACK))
        except ValueError:
            bound = 0  # not zstd frames: numcodecs names the error
        if bound > limit + ZSTD_SLACK:
            raise _Overshoot(None)
        return codec.decode(data)
    src = _native.address_of(data)
    n = len(data)
    if first is not None and lib.held.ZSTD_findFrameCompressedSize(src.arg, n) == n:
        return codec.decode(data)
    out = np.empty(max(limit, 1), dtype=np.uint8)
    got = lib.released.ZSTD_decompressDCtx(_native.zstd_dctx(lib), _native.data_address(out), out.nbytes, src.arg, n)
    if lib.released.ZSTD_isError(got):
        if lib.released.ZSTD_getErrorCode(got) == _ZSTD_DST_TOO_SMALL:
            raise _Overshoot(None)
        raise RuntimeError(f"Zstd decompression error: {lib.released.ZSTD_getErrorName(got).decode()}")
    return out[:got]


def _blosc(codec: Any, data: Any, limit: int) -> Any:
    """blosc 1 trusts its header: a payload shorter than the 16-byte header or than the
    ``cbytes`` it announces would be read past its end (heap bytes returned as a chunk)."""
    n = len(data)
    if n < 16:
        raise ValueError(f"{n} bytes cannot be a blosc buffer (16-byte header)")
    h = BloscHeader(*_BLOSC_HEADER.unpack_from(data, 0))
    if h.nbytes > limit:
        raise _Overshoot(h.nbytes)
    if h.cbytes > n or h.cbytes < 16 or (h.flags & _BLOSC_MEMCPYED and h.cbytes < h.nbytes + 16):
        raise ValueError(f"blosc header announces {h.cbytes} compressed bytes for {h.nbytes}, the payload has {n}")
    return codec.decode(data)


def _lz4(codec: Any, data: Any, limit: int) -> Any:
    if len(data) >= 4:  # numcodecs' LZ4 payloads start with the decoded size (uint32 LE)
        size = int.from_bytes(bytes(data[:4]), "little")
        if size > limit:
            raise _Overshoot(size)
    return codec.decode(data)


#: bounded decoders of the codecs whose output can be bounded before (or while) decoding,
#: by codec class (filled on first use: see :func:`_bounded_decoders`)
_BOUNDED: dict[type, Callable[[Any, Any, int], Any]] = {}


def _bounded_decoders() -> dict[type, Callable[[Any, Any, int], Any]]:
    if not _BOUNDED:
        _numcodecs_adapter.load()  # numcodecs without its entry-point scan
        import numcodecs

        table = {
            numcodecs.Zlib: _zlib,
            numcodecs.GZip: _gzip,
            numcodecs.BZ2: _bz2,
            numcodecs.LZMA: _lzma,
            numcodecs.Zstd: _zstd,
            numcodecs.Blosc: _blosc,
        }
        if getattr(numcodecs, "LZ4", None) is not None:
            table[numcodecs.LZ4] = _lz4
        _BOUNDED.update(table)
    return _BOUNDED


def _bounded_decode(codec: Codec, data: Any, limit: int, stage: str, where: str, key: str | None) -> Any:
    """``codec.decode(data)``, refusing an output of more than ``limit`` bytes: before
    allocating it where the codec's headers tell, by stopping there for stream
    decompressors, after decoding for any other codec."""
    bounded = _bounded_decoders().get(type(codec))
    if bounded is None and _is_zstd(codec):
        bounded = _zstd
    try:
        if bounded is not None:
            return bounded(codec, data, limit)
        out = codec.decode(data)
    except _Overshoot as e:
        raise _too_big(stage, e.announced, limit, where, key) from None
    nbytes = getattr(out, "nbytes", None)
    if nbytes is None:
        nbytes = len(out) if isinstance(out, (bytes, bytearray)) else memoryview(out).nbytes
    if nbytes > limit:
        raise _too_big(stage, None, limit, where, key)
    return out


# --------------------------------------------------------------------------- fast paths
#
# Arrays decode and encode whole shards at a time, chunk after chunk into (or out of) one
# chunk-major scratch buffer, on a thread pool. The helpers below are the per-chunk step
# of that loop: one C call on a buffer, no per-chunk allocation, no per-chunk Python
# beyond that call, because numcodecs' Python wrappers cost more than the work on chunks
# of a few KiB (blosc: a thread/fork check and two buffer objects per call; zstd: a fresh
# context per call). The measurements are in benchmarks/profile_notes.md.

_U32 = struct.Struct("<I")
_BLOSC_SIZES = struct.Struct("<4xIxxxxI")  # (nbytes, cbytes): what a fast decoder checks
#: a fast decoder: ``decode(payload, out) -> True`` when ``out`` (a C-contiguous uint8 row
#: of ``chunk_nbytes`` bytes, or the integer address of such a row when the decoder
#: :func:`takes_address`) now holds the chunk's bytes in memory order; False when the
#: caller must take the general path (:func:`decode_chunk_into`), which names the failure
FastDecoder = Callable[[Any, "np.ndarray | int"], bool]
#: ``decode(buffer, address, rows, offsets, sizes, dst) -> failed rows``: see :func:`span_decoder`
SpanDecoder = Callable[[Any, int, "list[int]", "list[int]", "list[int]", int], "list[int]"]
#: ``encode(chunk) -> payload`` for a full-size chunk already in ``meta.order`` layout
FastEncoder = Callable[[np.ndarray], bytes]
#: ``encode(address) -> payload`` for a full-size chunk whose bytes (memory order) sit at ``address``
RowEncoder = Callable[[int], bytes]

#: native encoders checked against numcodecs' own bytes, by configuration (see _self_checked)
_SELF_CHECKED: dict[tuple[Any, ...], bool] = {}
_BLOSC_MAX_OVERHEAD = 16


def _is_zstd(comp: Any) -> bool:
    return type(comp).__name__ == "Zstd" and getattr(comp, "codec_id", None) == "zstd"


def _native_decoder(decoder: Any) -> FastDecoder:
    """Mark a decoder that also takes the integer address of its output row."""
    decoder.takes_address = True
    return decoder


def takes_address(decoder: FastDecoder | None) -> bool:
    """Whether ``decoder`` accepts the address of its output row instead of an array."""
    return bool(getattr(decoder, "takes_address", False))


def fast_decoder(meta: DraftArrayMeta) -> FastDecoder | None:
    """A per-chunk decoder into a byte row for the common pipelines (no filters; blosc, zstd
    or no compressor), or None. It checks the sizes the payload announces before decoding
    and returns False on any mismatch or codec error, so that the reference path (the one
    definition of what a chunk means) decides and reports it."""
    if meta.filters:
        return None
    nbytes = chunk_nbytes(meta)
    comp = meta.compressor
    if comp is None:
        memmove = _native.memmove

        def raw(payload: Any, out: Any) -> bool:
            if len(payload) != nbytes:
                return False
            if type(out) is int:
                memmove(out, payload if type(payload) is bytes else bytes(payload), nbytes)
            else:
                out[:] = np.frombuffer(payload, dtype=np.uint8)
            return True

        return _native_decoder(raw)
    if _is_blosc(comp):
        sizes = _BLOSC_SIZES.unpack_from
        funcs = _native.blosc_for(nbytes)
        if funcs is not None:
            blosc_ctx, address = funcs.blosc_decompress_ctx, _native.data_address

            def blosc_native(payload: Any, out: Any) -> bool:
                src = payload if type(payload) is bytes else bytes(payload)
                # the announced sizes must be this chunk's and this payload's (blosc 1 trusts
                # its header's cbytes: a truncated payload is never handed to it)
                if len(src) < 16 or sizes(src, 0) != (nbytes, len(src)):
                    return False
                return blosc_ctx(src, out if type(out) is int else address(out), nbytes, 1) == nbytes

            return _native_decoder(blosc_native)
        _numcodecs_adapter.load()  # numcodecs without its entry-point scan
        from numcodecs.blosc import decompress as blosc_decompress

        def blosc(payload: Any, out: Any) -> bool:
            if type(out) is int or len(payload) < 16 or sizes(payload, 0) != (nbytes, len(payload)):
                return False
            try:
                blosc_decompress(payload, out)
            except Exception:  # noqa: BLE001 - the general path names the error
                return False
            return True

        return blosc
    if _is_zstd(comp):
        lib = _native.zstd()
        if lib is not None:
            frame_size = lib.held.ZSTD_getFrameContentSize  # a header read: keep the GIL
            decompress, dctx, address = lib.released.ZSTD_decompressDCtx, _native.zstd_dctx, _native.data_address

            def zstd_native(payload: Any, out: Any) -> bool:
                src = payload if type(payload) is bytes else bytes(payload)
                # the first frame must announce this chunk's size, and the output buffer is
                # exactly one chunk: a payload with more in it fails (general path decides)
                if frame_size(src, len(src)) != nbytes:
                    return False
                addr = out if type(out) is int else address(out)
                return decompress(dctx(lib), addr, nbytes, src, len(src)) == nbytes

            return _native_decoder(zstd_native)
        _numcodecs_adapter.load()  # numcodecs without its entry-point scan
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


class Run(NamedTuple):
    """Consecutive rows whose payloads follow each other in a read buffer."""

    row: int  # first row
    count: int  # type: ignore[assignment]  # rows (a field named like tuple.count)
    start: int  # first byte in the buffer
    nbytes: int  # bytes of the payloads together


def _runs(rows: list[int], offsets: list[int], sizes: list[int]) -> list[Run]:
    """The :class:`Run` s of ``rows`` (a compact shard read whole is one run)."""
    runs: list[Run] = []
    r0 = prev = -2
    o0 = end = 0
    for i, o, n in zip(rows, offsets, sizes):
        if i == prev + 1 and o == end:
            prev, end = i, o + n
            continue
        if r0 >= 0:
            runs.append(Run(r0, prev - r0 + 1, o0, end - o0))
        r0 = prev = i
        o0, end = o, o + n
    if r0 >= 0:
        runs.append(Run(r0, prev - r0 + 1, o0, end - o0))
    return runs


def span_decoder(meta: DraftArrayMeta) -> SpanDecoder | None:
    """Decode many chunks lying in one read buffer (a whole shard object) in one Python call.

    ``decode(buffer, address, rows, offsets, sizes, dst)`` decodes, for each ``i``, the
    payload ``buffer[offsets[i] : offsets[i] + sizes[i]]`` (``address``: the buffer's
    address; ranges already checked to lie inside it) into the row at
    ``dst + rows[i] * chunk_nbytes``, straight from the buffer (no per-chunk ``bytes``
    copy). Returns the rows it did not decode (a size it does not announce as this
    chunk's, or a codec error): the reference path decides those. None when the native
    libraries are unavailable or the pipeline has filters.

    Python threads only decode in parallel when the GIL is released for long enough, so
    blosc and zstd chunks are decoded by one call of our loops over all of them
    (:func:`_native.loops`, ``_loops.c``: the GIL is released once per call), checking each
    payload's announced sizes in C exactly as below. Without that library: zstd and
    uncompressed chunks that follow each other in the buffer are decoded with one call per
    run (zstd decodes concatenated frames in one go), and small blosc chunks one by one
    with the GIL held (see :data:`HOLD_GIL_BELOW`).
    """
    if meta.filters:
        return None
    nbytes = chunk_nbytes(meta)
    comp = meta.compressor
    batch = _batch_decoder(comp, nbytes)
    if batch is not None:
        return batch
    if comp is None:
        return _raw_span_decoder(nbytes)
    funcs = _native.blosc_for(nbytes) if _is_blosc(comp) else None
    if funcs is not None:
        return _blosc_span_decoder(funcs, nbytes)
    lib = _native.zstd() if _is_zstd(comp) else None
    if lib is not None:
        return _zstd_span_decoder(lib, nbytes)
    return None


def _raw_span_decoder(nbytes: int) -> SpanDecoder:
    """Uncompressed chunks: one copy per run of payloads that follow each other."""
    memmove = _native.memmove

    def raw(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
        failed = [i for i, n in zip(rows, sizes) if n != nbytes]
        if failed:
            kept = [(i, o, n) for i, o, n in zip(rows, offsets, sizes) if n == nbytes]
            rows, offsets, sizes = [t[0] for t in kept], [t[1] for t in kept], [t[2] for t in kept]
        for r0, _, o0, length in _runs(rows, offsets, sizes):
            memmove(dst + r0 * nbytes, address + o0, length)
        return failed

    return raw


def _blosc_span_decoder(funcs: Any, nbytes: int) -> SpanDecoder:
    """blosc chunks one by one with the GIL held (small chunks: see :data:`HOLD_GIL_BELOW`)."""
    sizes_of, blosc_ctx = _BLOSC_SIZES.unpack_from, funcs.blosc_decompress_ctx

    def blosc(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
        failed = []
        for i, o, n in zip(rows, offsets, sizes):
            # the header must announce this chunk's size and exactly this payload's length
            # (blosc 1 trusts its cbytes: a truncated payload is never handed to it)
            if n < 16 or sizes_of(buf, o) != (nbytes, n) or blosc_ctx(address + o, dst + i * nbytes, nbytes, 1) != nbytes:
                failed.append(i)
        return failed

    return blosc


def _zstd_span_decoder(lib: Any, nbytes: int) -> SpanDecoder:
    """zstd chunks: one call per run of frames that follow each other (zstd decodes
    concatenated frames in one go), one call per chunk of a run that failed."""
    held = lib.held
    frame_size, frame_len, decompress = held.ZSTD_getFrameContentSize, held.ZSTD_findFrameCompressedSize, lib.released.ZSTD_decompressDCtx

    def zstd(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
        ctx = _native.zstd_dctx(lib)
        failed, good = [], []
        for i, o, n in zip(rows, offsets, sizes):
            # exactly one frame, announcing this chunk's size: then decoding the run's
            # frames in one call puts every chunk's bytes in its own row, and any error
            # falls back to one call per chunk
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


def _batch_decoder(comp: Any, nbytes: int) -> SpanDecoder | None:
    """The :class:`SpanDecoder` of a blosc or zstd compressor through our C loops (one call,
    the GIL released once, per batch), or None (no loops library, another codec)."""
    loops = _native.loops()
    if loops is None or nbytes < 1:
        return None
    if _is_blosc(comp) and loops.blosc_rows is not None and _native.blosc() is not None:
        rows_fn, blosc_fn = loops.blosc_rows, loops.blosc_decompress

        def call(address: int, table: int, n: int, dst: int, failed: int) -> int:
            return rows_fn(blosc_fn, address, table, table + 8 * n, table + 16 * n, n, dst, nbytes, failed)

    elif _is_zstd(comp) and loops.zstd_rows is not None and loops.zstd_functions is not None:
        lib = _native.zstd()
        if lib is None:
            return None
        zstd_rows, (content_size, frame_size, decompress) = loops.zstd_rows, loops.zstd_functions
        dctx = _native.zstd_dctx

        def call(address: int, table: int, n: int, dst: int, failed: int) -> int:
            return zstd_rows(
                content_size, frame_size, decompress, dctx(lib), address, table, table + 8 * n, table + 16 * n, n, dst, nbytes, failed
            )

    else:
        return None
    batch_table = _native.batch_table

    def decode(buf: Any, address: int, rows: list[int], offsets: list[int], sizes: list[int], dst: int) -> list[int]:
        n = len(rows)
        if not n:
            return []
        _table, table, failed, failed_address = batch_table(rows, offsets, sizes)
        if not call(address, table, n, dst, failed_address):
            return []
        return [r for r, bad in zip(rows, failed) if bad]

    return decode


#: ``scatter(buf, length, geom, fill, out, out_nbytes) -> status`` (see :func:`shard_scatterer`)
ShardScatter = Callable[[int, int, bytes, int, int, int], int]


def shard_scatterer(meta: DraftArrayMeta) -> ShardScatter | None:
    """Whole draft shards straight into an output array, in one C call per shard (the GIL
    released once): ``_loops.c``'s ``ss_shard_scatter`` checks the index (as
    :func:`~sharding_store.formats.shard_index.entry_lists` does), decodes each chunk into a
    per-thread chunk of scratch with the checks of the batch loops (sizes announced by a
    blosc header or zstd frame must be exactly this chunk's and this payload's), and copies
    it to its place in the output. ``scatter(buf, length, geom, fill, out, out_nbytes)``
    takes addresses (``geom``: bytes, see ``_loops.c``) and returns 0 when every chunk
    landed; anything else means: read this shard again on the reference path, which
    decides and names the error. None without the loops library, with filters, for other
    codecs or for item types that are not plain bytes."""
    loops = _native.loops()
    comp = meta.compressor
    nbytes = chunk_nbytes(meta)
    if loops is None or loops.shard_scatter is None or meta.filters or nbytes < 1 or meta.dtype.hasobject:
        return None
    fns: Any
    if comp is None:
        codec, fns, lib = 0, None, None
    elif _is_blosc(comp) and loops.blosc_decompress is not None and _native.blosc() is not None:
        codec, fns, lib = 1, _native.pointer_table([loops.blosc_decompress]), None
    elif _is_zstd(comp) and loops.zstd_functions is not None and _native.zstd() is not None:
        codec, fns, lib = 2, _native.pointer_table(loops.zstd_functions), _native.zstd()
    else:
        return None
    call = loops.shard_scatter
    dctx = _native.zstd_dctx
    tls = threading.local()

    def scatter(buf: int, length: int, geom: bytes, fill: int, out: int, out_nbytes: int) -> int:
        tmp = getattr(tls, "tmp", None)
        if tmp is None:
            tmp = tls.tmp = np.empty(nbytes, dtype=np.uint8)
            tls.address = _native.data_address(tmp)
        ctx = dctx(lib) if lib is not None else None
        return call(codec, fns, ctx, buf, length, geom, len(geom) // 8, fill, tls.address, out, out_nbytes)

    return scatter


def decode_chunk_into(meta: DraftArrayMeta, payload: Any, out: np.ndarray, *, key: str | None = None) -> None:
    """The general path of a batch decode: :func:`decode`, then its bytes in memory order
    into the uint8 row ``out`` (raises :class:`ChunkDecodeError`)."""
    chunk = decode(meta, payload, key=key)
    out[:] = chunk.ravel(order="F" if meta.order == "F" else "C").view(np.uint8)


def fast_encoder(meta: DraftArrayMeta) -> FastEncoder:
    """Encode full-size chunks that are contiguous in ``meta.order`` (no padding step):
    the same bytes as :func:`encode`, with the checks and copies that a batch has already
    done left out."""
    comp = meta.compressor
    if meta.filters:
        return lambda chunk: encode(meta, chunk)
    if comp is None:
        return lambda chunk: chunk.tobytes(order="A")
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    from numcodecs.compat import ensure_bytes as ensure

    encode_ = comp.encode  # blosc: its *_ctx function (GIL released) off the main thread
    return lambda chunk: ensure(encode_(chunk))


def _zstd_native_encoder(comp: Any, nbytes: int) -> RowEncoder | None:
    """``encode(address) -> payload`` for ``nbytes`` at ``address``, with this thread's
    reused context; None unless it gives exactly ``numcodecs.zstd.compress``'s bytes."""
    lib = _native.zstd()
    level = getattr(comp, "level", None)
    checksum = bool(getattr(comp, "checksum", False))
    if lib is None or not isinstance(level, int) or not 1 <= level <= 22 or nbytes < 1:
        return None
    bound = lib.released.ZSTD_compressBound(nbytes)
    compress2, is_error = lib.released.ZSTD_compress2, lib.released.ZSTD_isError
    buffer, cctx, string_at = _native.thread_buffer, _native.zstd_cctx, _native.string_at

    def encode_row(address: int) -> bytes:
        dst = buffer("zdst", bound)
        n = compress2(cctx(lib, level, checksum), dst, bound, address, nbytes)
        if is_error(n):
            raise RuntimeError(f"zstd: compression failed (code {n})")
        return string_at(dst, n)

    key = ("zstd", type(comp), level, checksum, nbytes)
    return encode_row if _self_checked(key, encode_row, comp, np.dtype(np.uint8), nbytes) else None


def _blosc_native_encoder(comp: Any, dtype: np.dtype, nbytes: int) -> RowEncoder | None:
    """``encode(address) -> payload`` for a chunk of ``nbytes`` of ``dtype`` at ``address``:
    ``blosc_compress_ctx`` as numcodecs calls it off the main thread, with the GIL held for
    small chunks (see :data:`HOLD_GIL_BELOW`); None unless it gives exactly ``comp.encode``'s
    bytes."""
    funcs = _native.blosc_for(nbytes)
    if funcs is None or dtype.fields is not None or dtype.kind not in "biufcmM" or nbytes < 1:
        return None
    config = comp.get_config()
    cname, clevel, shuffle, blocksize = config["cname"].encode(), config["clevel"], config["shuffle"], config["blocksize"]
    typesize = dtype.itemsize
    if shuffle == -1:  # AUTOSHUFFLE, resolved as numcodecs' compress() does
        shuffle = 2 if typesize == 1 else 1
    compress_ctx = funcs.blosc_compress_ctx
    bound = nbytes + _BLOSC_MAX_OVERHEAD
    buffer, string_at = _native.thread_buffer, _native.string_at

    def encode_row(address: int) -> bytes:
        dst = buffer("bdst", bound)
        n = compress_ctx(clevel, shuffle, typesize, nbytes, address, dst, bound, cname, blocksize, 1)
        if n <= 0:
            raise RuntimeError(f"blosc: compression failed (code {n})")
        return string_at(dst, n)

    key = ("blosc", cname, clevel, shuffle, blocksize, typesize, nbytes)
    return encode_row if _self_checked(key, encode_row, comp, dtype, nbytes) else None


def _self_checked(key: tuple[Any, ...], encode_row: RowEncoder, comp: Any, dtype: np.dtype, nbytes: int) -> bool:
    """Whether ``encode_row`` gives exactly ``comp.encode``'s bytes for a probe chunk of
    ``dtype`` (mixed runs and noise, so that shuffling and matching both matter); checked
    once per configuration."""
    if key not in _SELF_CHECKED:
        probe = (np.arange(max(nbytes, 4096), dtype=np.uint32) * 2654435761 >> 7).astype(np.uint8)
        probe[::7] = 0
        probe = probe[:nbytes]
        try:
            _SELF_CHECKED[key] = encode_row(_native.data_address(probe)) == ensure_bytes(comp.encode(probe.view(dtype)))
        except Exception:  # noqa: BLE001
            _SELF_CHECKED[key] = False
    return _SELF_CHECKED[key]


def fast_row_encoder(meta: DraftArrayMeta) -> RowEncoder | None:
    """``encode(address) -> payload`` for a full-size chunk whose bytes (memory order) sit at
    ``address``: zstd through a reused per-thread context, blosc through its context
    function (numcodecs' bytes exactly, both self-checked), or None (use :func:`fast_encoder`)."""
    if meta.filters:
        return None
    if _is_zstd(meta.compressor):
        return _zstd_native_encoder(meta.compressor, chunk_nbytes(meta))
    if _is_blosc(meta.compressor) and type(meta.compressor) is _blosc_class():
        return _blosc_native_encoder(meta.compressor, meta.dtype, chunk_nbytes(meta))
    return None


# --------------------------------------------------------------------------- the interface


class ChunkCodec:
    """The codecs of one array, with the fastest path that gives the reference's result
    chosen once per operation (what an array or the shard engine holds on to).

    Rows are a chunk's bytes in memory order (``meta.order``): a C-contiguous uint8 array
    of :attr:`nbytes` bytes, or the integer address of such memory.
    """

    __slots__ = ("meta", "nbytes", "_fast", "_by_address", "_spans", "_encode", "_encode_row", "_row_ready", "scatter")

    def __init__(self, meta: DraftArrayMeta) -> None:
        self.meta = meta
        self.nbytes = chunk_nbytes(meta)
        self._fast = fast_decoder(meta)
        self._by_address = takes_address(self._fast)
        self._spans = span_decoder(meta)
        #: whole shards straight into an output array (:func:`shard_scatterer`), or None
        self.scatter = shard_scatterer(meta)
        self._encode = fast_encoder(meta)
        self._encode_row: RowEncoder | None = None
        self._row_ready = False  # the row encoder self-checks: built on first use

    def decode(self, payload: Any, *, key: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """:func:`decode` (the reference, bounded): a full-size chunk array."""
        return decode(self.meta, payload, key=key, out=out)

    def decode_into(self, payload: Any, row: np.ndarray | int, *, key: str | None = None) -> None:
        """Decode one payload into ``row``; raises :class:`ChunkDecodeError` naming ``key``."""
        fast = self._fast
        if fast is not None:
            if type(row) is int and not self._by_address:
                row = _native.row_at(row, self.nbytes)
            if fast(payload, row):
                return
        decode_chunk_into(self.meta, payload, _native.row_at(row, self.nbytes) if isinstance(row, int) else row, key=key)

    def decode_many(
        self,
        buffer: Any,
        address: int,
        rows: Sequence[int],
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: int,
        *,
        key_of: Callable[[int], str | None] = lambda row: None,
    ) -> None:
        """Decode ``buffer[offsets[i] : offsets[i] + sizes[i]]`` into row ``rows[i]`` of the
        rows at ``dst``, for every ``i`` (``address``: the buffer's; the ranges lie inside
        it). Fast where it can (:func:`span_decoder`), the rest one by one; the first
        payload that does not decode raises :class:`ChunkDecodeError` naming
        ``key_of(row)``."""
        if type(rows) is not list or type(offsets) is not list or type(sizes) is not list:
            rows, offsets, sizes = list(rows), list(offsets), list(sizes)
        failed = rows if self._spans is None else self._spans(buffer, address, rows, offsets, sizes, dst)
        if not failed:
            return
        view = memoryview(buffer).cast("B") if not isinstance(buffer, (bytes, bytearray)) else memoryview(buffer)
        where = dict(zip(rows, zip(offsets, sizes)))
        for i in failed:
            o, n = where[i]
            self.decode_into(view[o : o + n], dst + i * self.nbytes, key=key_of(i))

    def encode(self, chunk: np.ndarray) -> bytes:
        """A full-size chunk, contiguous in ``meta.order`` -> its payload (the reference's bytes)."""
        return self._encode(chunk)

    def encode_row(self, address: int) -> bytes:
        """The chunk whose bytes (memory order) sit at ``address`` -> its payload."""
        if not self._row_ready:
            self._encode_row = fast_row_encoder(self.meta)
            self._row_ready = True
        if self._encode_row is not None:
            return self._encode_row(address)
        chunk = _native.row_at(address, self.nbytes).view(self.meta.dtype)
        shaped = chunk.reshape(self.meta.chunks, order=self.meta.order)
        return self._encode(shaped)


class _Cached(NamedTuple):
    meta: DraftArrayMeta  # held, so that its id cannot be reused while cached
    codec: ChunkCodec
    native: tuple[bool, bool]  # the native switches it was built with (``_native.switches()``)


_CODECS: dict[int, _Cached] = {}
_CODECS_MAX = 256


def codec_for(meta: DraftArrayMeta) -> ChunkCodec:
    """The :class:`ChunkCodec` of ``meta`` (kept for the last few hundred metadata objects
    seen, by identity: metadata objects are not hashable; rebuilt when :func:`set_native`
    or ``_native.using_loops`` changed since)."""
    hit = _CODECS.get(id(meta))
    native = _native.switches()
    if hit is not None and hit.meta is meta and hit.native == native:
        return hit.codec
    codec = ChunkCodec(meta)
    if len(_CODECS) >= _CODECS_MAX:
        _CODECS.clear()
    _CODECS[id(meta)] = _Cached(meta, codec, native)
    return codec


def decode_into(meta: DraftArrayMeta, payload: Any, row: np.ndarray | int, *, key: str | None = None) -> None:
    """:meth:`ChunkCodec.decode_into` for ``meta``."""
    codec_for(meta).decode_into(payload, row, key=key)


def decode_many(
    meta: DraftArrayMeta,
    buffer: Any,
    address: int,
    rows: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    dst: int,
    *,
    key_of: Callable[[int], str | None] = lambda row: None,
) -> None:
    """:meth:`ChunkCodec.decode_many` for ``meta``."""
    codec_for(meta).decode_many(buffer, address, rows, offsets, sizes, dst, key_of=key_of)
