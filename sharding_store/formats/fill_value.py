"""The one fill-value codec: JSON fill values <-> numpy scalars, for every generation.

Pure (numpy only, no I/O). The draft documents (zarr 2.18's ``Metadata2`` spellings), the
2023 intermediate documents once normalised (:mod:`sharding_store.formats.gen2023`) and final v3
documents (:mod:`sharding_store.formats.v3_layout`) are all decoded by :func:`decode_fill_value`,
and every fill value we write, draft or v3, is spelled by :func:`encode_fill_value`, so the
generations cannot disagree about a value (they did: ``[real, imag]`` vs ``[real,
imaginary]``, hex bit patterns read by one decoder only, an overflowing float refused by one
and made infinite by the other).

Spellings read (anything else raises ``ValueError`` saying what was expected):

* ``bool``: ``true``/``false`` (and zarr 2's ``0``/``1``);
* integers: a JSON integer in the type's range (and an integral float such as ``1.0``, which
  zarr 2 wrote for some arrays);
* floats: a number (one that overflows the type is refused, never made infinite), the
  strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, or ``"0x..."``: the IEEE 754 bit
  pattern as an unsigned integer (v3), exactly (NaN payloads, ``-0.0``);
* complex: ``[real, imaginary]``, each part spelled as a float of half the item size;
* datetimes (integers or ISO strings), strings, bytes (base64, or zarr 2's plain strings)
  and structured types (base64 of the item), as zarr 2 wrote them.

The scalar returned is native (numpy scalars have no byte order); the byte order of the
data is the dtype's, applied where chunks are decoded.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

import numpy as np

__all__ = ["V3_CORE_DTYPES", "decode_fill_value", "encode_fill_value"]

#: v1.0 core data type -> numpy type (byte order from the ``bytes`` codec)
V3_CORE_DTYPES = {
    "bool": "?", "int8": "i1", "uint8": "u1",
    "int16": "i2", "uint16": "u2", "float16": "f2",
    "int32": "i4", "uint32": "u4", "float32": "f4",
    "int64": "i8", "uint64": "u8", "float64": "f8",
    "complex64": "c8", "complex128": "c16",
}

FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_HEX = re.compile(r"0x[0-9a-fA-F]+")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any) -> str:
    """A number for a message: at most 40 characters (10**400 has 401 digits)."""
    text = repr(v) if not _is_int(v) or v.bit_length() < 4000 else f"an integer of {v.bit_length()} bits"
    return text if len(text) <= 40 else f"{text[:12]}...({len(text)} digits)"


def _float(v: Any, dtype: np.dtype[Any]) -> Any:
    """One float of ``dtype`` (any byte order) from its JSON spelling."""
    native = dtype.newbyteorder("=")
    if isinstance(v, str) and v in FLOAT_WORDS:
        return native.type(FLOAT_WORDS[v])
    if isinstance(v, str) and _HEX.fullmatch(v):
        bits = int(v, 16)
        if bits >= 1 << (8 * dtype.itemsize):
            raise ValueError(f"bit pattern {v[:24]} is wider than {dtype.itemsize} bytes")
        return np.array(bits, dtype=f"u{dtype.itemsize}").view(native)[()]
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"expected a number, 'NaN', 'Infinity', '-Infinity' or '0x...', got {v!r}")
    try:  # an int beyond float64 (10**400) raises OverflowError in float() and numpy alike
        finite = math.isfinite(float(v))
        with np.errstate(over="ignore"):
            out = native.type(v)
    except OverflowError:
        finite, out = True, native.type(math.inf)
    if finite and not np.isfinite(out):
        raise ValueError(f"{_short(v)} overflows {dtype.str}")
    return out


def _complex(v: Any, dtype: np.dtype[Any]) -> Any:
    """``[real, imaginary]``, each part a float of half the item size (bits kept exactly)."""
    if not isinstance(v, list) or len(v) != 2:
        raise ValueError(f"expected [real, imaginary], got {v!r}")
    part = np.dtype(f"f{dtype.itemsize // 2}")
    out = np.zeros(2, dtype=part)
    out[0], out[1] = (_float(x, part) for x in v)
    return out.view(dtype.newbyteorder("="))[0]


def _integer(v: Any, dtype: np.dtype[Any]) -> Any:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise ValueError(f"expected an integer, got {v!r}")
    info = np.iinfo(dtype)
    if not info.min <= v <= info.max:
        raise ValueError(f"{_short(v)} out of range for {dtype.str} [{info.min}, {info.max}]")
    return dtype.newbyteorder("=").type(v)


def _bytes_like(v: Any, dtype: np.dtype[Any]) -> Any:
    """``S``: base64 (or zarr 2's plain strings, ``0`` for empty); ``V``: base64 of one item."""
    if dtype.kind == "S" and _is_int(v) and v == 0:  # zarr 2 leniency for pre-base64 files
        return dtype.type(b"")
    if not isinstance(v, str):
        raise ValueError(f"expected a base64 string, got {v!r}")
    if dtype.kind == "S":
        try:
            b = base64.standard_b64decode(v)
        except (binascii.Error, ValueError):
            b = v.encode("ascii", errors="strict")  # zarr 2: plain strings predate base64
        if len(b) > dtype.itemsize:
            raise ValueError(f"{len(b)} bytes do not fit {dtype.str}")
        return np.array(b, dtype=dtype)[()]
    try:
        b = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"invalid base64: {e}") from None
    if len(b) != dtype.itemsize:
        raise ValueError(f"{len(b)} bytes, but {dtype} has {dtype.itemsize}")
    return np.frombuffer(b, dtype=dtype)[0]


def _other(v: Any, dtype: np.dtype[Any]) -> Any:
    """Datetimes and strings, as zarr 2 wrote them."""
    if dtype.kind in "mM":
        if _is_int(v):
            if not -(2**63) <= v < 2**63:
                raise ValueError(f"{_short(v)} out of int64 range")
            return np.array(v, dtype=np.int64).astype(dtype)[()]
        if isinstance(v, str):
            return np.array(v, dtype=dtype)[()]
        raise ValueError(f"expected an integer, got {v!r}")
    if dtype.kind == "U":
        if not isinstance(v, str):
            raise ValueError(f"expected a string, got {v!r}")
        if len(v) > dtype.itemsize // 4:
            raise ValueError(f"string of {len(v)} characters does not fit {dtype.str}")
        return np.array(v, dtype=dtype)[()]
    raise ValueError(f"unsupported data type {dtype}")


def decode_fill_value(v: Any, dtype: np.dtype[Any]) -> Any:
    """A JSON fill value as a numpy scalar of ``dtype`` (``None`` stays ``None``: a draft
    ``null``; v3 callers refuse it). Raises ``ValueError`` saying what was expected."""
    if v is None:
        return None
    kind = dtype.kind
    if kind == "b":
        if isinstance(v, bool) or (_is_int(v) and v in (0, 1)):
            return np.bool_(v)
        raise ValueError(f"expected true/false, got {v!r}")
    if kind in "iu":
        return _integer(v, dtype)
    if kind == "f":
        return _float(v, dtype)
    if kind == "c":
        return _complex(v, dtype)
    if kind in "SV":
        return _bytes_like(v, dtype)
    return _other(v, dtype)


def _float_json(x: Any) -> float | str:
    """A float in JSON: NaN and the infinities as the strings every spec uses."""
    f = float(x)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return f


def encode_fill_value(v: Any, dtype: np.dtype[Any]) -> Any:
    """The JSON spelling of fill value ``v`` of ``dtype`` (``None`` stays ``None``), as zarr
    2.18 and zarr-python 3 both write it; :func:`decode_fill_value` reads it back."""
    if v is None:
        return None
    kind = dtype.kind
    if kind == "f":
        return _float_json(v)
    if kind in "ui":
        return int(v)
    if kind == "b":
        return bool(v)
    if kind == "c":
        return [_float_json(np.real(v)), _float_json(np.imag(v))]
    if kind in "SV":
        return base64.standard_b64encode(bytes(v) if kind == "S" else v.tobytes()).decode("ascii")
    if kind == "U":
        return str(v)
    if kind in "mM":
        return int(np.asarray(v).astype(np.int64))
    return v  # pragma: no cover
