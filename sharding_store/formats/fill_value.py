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
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    if not isinstance(v, list) or len(v) != 2:
        raise ValueError(f"expected [real, imaginary], got {v!r}")
    part = np.dtype(f"f{dtype.itemsize // 2}")
    out = np.zeros(2, dtype=part)
    out[0], out[1] = (_float(x, part) for x in v)
    return out.view(dtype.newbyteorder("="))[0]


def _integer(v: Any, dtype: np.dtype[Any]) -> Any:
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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


# --------------------------------------------------------------------------- without numpy

@dataclass(frozen=True)
class PlainType:
    """A data type of the common table (bool, int/uint 8-64, float 16-64, complex 64/128),
    described without numpy from the spelling the document gives: what numpy's dtype of
    that spelling would say (``tests/unit/formats/test_plain_types.py`` checks it)."""

    spelling: str  # what ``np.dtype`` is given
    kind: str  # numpy's kind: b i u f c
    itemsize: int
    big: bool  # big-endian (spelled ``>``), for the v3 ``bytes`` codec
    v3_name: str  # the v1.0 core data type

    def dtype(self) -> np.dtype[Any]:
        import numpy  # noqa: PLC0415 - built when a caller needs numpy's object

        return numpy.dtype(self.spelling)


def _plain_table() -> dict[str, PlainType]:
    table: dict[str, PlainType] = {}
    for spelling in ("bool", "|b1"):
        table[spelling] = PlainType(spelling, "b", 1, False, "bool")
    for spelling, v3 in (("i1", "int8"), ("|i1", "int8"), ("u1", "uint8"), ("|u1", "uint8")):
        table[spelling] = PlainType(spelling, spelling[-2], 1, False, v3)
    for v3, np_name in V3_CORE_DTYPES.items():
        kind, size = np_name[0], int(np_name[1:] or 1)
        if size > 1 and kind in "iufc":
            for order in "<>":
                table[order + np_name] = PlainType(order + np_name, kind, size, order == ">", v3)
    return table


#: the draft spellings taken without numpy (zarr-python 2.18's ``encode_dtype`` of the table's types)
PLAIN_TYPES = _plain_table()


def plain_type(spelling: Any) -> PlainType | None:
    """The :class:`PlainType` of a draft ``data_type`` (a string, or an extension object's
    ``type``) in :data:`PLAIN_TYPES`; None for anything else (numpy parses it)."""
    if isinstance(spelling, dict):
        spelling = spelling.get("type")
    return PLAIN_TYPES.get(spelling) if isinstance(spelling, str) else None


_F = {2: "<e", 4: "<f", 8: "<d"}
NOT_PLAIN: Any = object()  # a value :func:`plain_fill` leaves to numpy


def _plain_float(v: Any, itemsize: int) -> Any:
    """A float of ``itemsize`` bytes (rounded as numpy rounds), or NOT_PLAIN."""
    if isinstance(v, str):
        return FLOAT_WORDS.get(v, NOT_PLAIN)  # "0x..." bit patterns: numpy
    if type(v) is int or type(v) is float:
        try:
            x = float(v)
            return x if itemsize == 8 else struct.unpack(_F[itemsize], struct.pack(_F[itemsize], x))[0]
        except OverflowError:  # beyond the type: numpy says so, in its words
            return NOT_PLAIN
    return NOT_PLAIN


def plain_fill(v: Any, t: PlainType) -> Any:
    """The value of JSON fill value ``v`` for type ``t`` as Python's bool, int, float or
    (real, imag), equal to what :func:`decode_fill_value` gives (``None`` stays ``None``);
    NOT_PLAIN when it is not plainly valid (numpy then decodes it, or says why not)."""
    if v is None:
        return None
    if t.kind == "b":
        return bool(v) if type(v) is bool or (type(v) is int and v in (0, 1)) else NOT_PLAIN
    if t.kind in "iu":
        if type(v) is float and v.is_integer():
            v = int(v)
        bits = 8 * t.itemsize
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if t.kind == "i" else (0, 2**bits - 1)
        return v if type(v) is int and low <= v <= high else NOT_PLAIN
    if t.kind == "f":
        return _plain_float(v, t.itemsize)
    if type(v) is not list or len(v) != 2:
        return NOT_PLAIN
    parts = tuple(_plain_float(x, t.itemsize // 2) for x in v)
    return NOT_PLAIN if NOT_PLAIN in parts else parts


def plain_fill_json(value: Any, t: PlainType) -> Any:
    """:func:`encode_fill_value` of a :func:`plain_fill` value (``None``: the type's zero,
    as v3 requires a fill value)."""
    if t.kind == "b":
        return bool(value)
    if t.kind in "iu":
        return 0 if value is None else int(value)
    if t.kind == "f":
        return _float_json(0.0 if value is None else value)
    re_, im = (0.0, 0.0) if value is None else value
    return [_float_json(re_), _float_json(im)]


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
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
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
