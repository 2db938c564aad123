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

import math
from typing import Any

import numcodecs
import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_bytes, ensure_ndarray_like

from .draft_metadata import DraftArrayMeta
from .errors import ChunkDecodeError, UsageError

__all__ = ["decode_chunk_payload", "encode_chunk_payload", "fill_chunk", "pad_chunk", "chunk_nbytes"]


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
