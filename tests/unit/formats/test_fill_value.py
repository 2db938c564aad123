"""One fill-value decoder for every generation (issue 23): ``sharding_store.formats.fill_value``.

Before, the 2022 draft reader (``draft_metadata``) and the final-v3 reader (``v3_layout``,
which the 2023 generation goes through) each decoded fill values and disagreed: a ``"0x..."``
bit pattern was read by one only, a float that overflows its type was refused by one and
made infinite by the other, and they named the complex spelling differently. Here, against
numpy and across dtypes (complex included, both byte orders, NaN/Infinity spellings, bit
patterns), the value a fill value decodes to is the same through the draft reader and
through the v3 reader (a 2023 document normalised by ``gen2023``, then ``layout_from_v3``),
and what we write reads back to the same bits.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import from_dtype

from sharding_store.errors import DraftMetadataError
from sharding_store.formats import draft_metadata as dm
from sharding_store.formats import gen2023
from sharding_store.formats.fill_value import decode_fill_value, encode_fill_value
from sharding_store.formats.v3_layout import layout_from_v3

V3_NAMES = {"?": "bool", "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "f2": "float16",
            "i4": "int32", "u4": "uint32", "f4": "float32", "i8": "int64", "u8": "uint64", "f8": "float64",
            "c8": "complex64", "c16": "complex128"}
NUMERIC = [np.dtype(order + code) if np.dtype(code).itemsize > 1 else np.dtype(code)
           for code in V3_NAMES for order in ("<", ">")
           if order == "<" or np.dtype(code).itemsize > 1]
FLOATS = [d for d in NUMERIC if d.kind == "f"]
COMPLEX = [d for d in NUMERIC if d.kind == "c"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def via_draft(spelled: Any, dtype: np.dtype) -> Any:
    """The fill value the 2022 draft reader decodes from a document spelling ``spelled``."""
    meta = dm.draft_array_document(dm.DraftArraySpec(
        path="a", shape=(4,), chunks=(2,), dtype=dtype, compressor=None, fill_value=None, order="C", separator="/",
        filters=None, attributes=None, chunks_per_shard=None))
    doc = json.loads(dm.encode_array_metadata(meta))
    doc["fill_value"] = spelled
    return dm.parse_array_metadata(json.dumps(doc), "meta/root/a.array.json", "a").fill_value


def via_v3(spelled: Any, dtype: np.dtype) -> Any:
    """The fill value the per-node reader decodes (2023 normalisation, then the v3 layout)."""
    endian = {"name": "bytes", "configuration": {"endian": "big" if dtype.byteorder == ">" else "little"}}
    doc = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": V3_NAMES["?" if dtype.kind == "b" else dtype.str[1:]],
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
           "fill_value": spelled, "codecs": [endian if dtype.itemsize > 1 else {"name": "bytes"}], "attributes": {}}
    norm = gen2023.normalise_node(json.dumps(doc).encode(), "a/zarr.json")
    return layout_from_v3(norm.document, "a", key="a/zarr.json", hidden_checksum=norm.hidden_checksum).fill_value


def bits(value: Any, dtype: np.dtype) -> bytes:
    """The value's bytes in ``dtype`` (bitwise comparison: -0.0 is not 0.0, NaN payloads count)."""
    return np.array(value, dtype=dtype).tobytes()


def both(spelled: Any, dtype: np.dtype) -> tuple[bytes | None, bytes | None]:
    """What the two readers decode ``spelled`` to (None: refused, as DraftMetadataError)."""
    out: list[bytes | None] = []
    for read in (via_draft, via_v3):
        try:
            out.append(bits(read(spelled, dtype), dtype))
        except DraftMetadataError:
            out.append(None)
    return out[0], out[1]


def hex_of(raw: int, nbytes: int) -> str:
    return f"0x{raw:0{2 * nbytes}x}"


def from_bits(raw: int, dtype: np.dtype) -> np.ndarray:
    """numpy's reading of an unsigned bit pattern as one float of ``dtype``'s size."""
    native = dtype.newbyteorder("=")
    return np.frombuffer(raw.to_bytes(dtype.itemsize, sys.byteorder), dtype=native)[0]


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@SETTINGS
@given(data=st.data())
def test_what_we_write_reads_back_bit_for_bit_through_both_readers(dtype: np.dtype, data: st.DataObject) -> None:
    value = data.draw(from_dtype(dtype, allow_nan=True, allow_infinity=True, allow_subnormal=True))
    spelled = json.loads(json.dumps(encode_fill_value(value, dtype)))
    decoded = decode_fill_value(spelled, dtype)
    if dtype.kind in "fc" and np.isnan(np.asarray(value)).any():  # "NaN" names no payload
        assert np.array_equal(np.array(decoded, dtype), np.array(value, dtype), equal_nan=True)
        assert both(spelled, dtype) == (bits(decoded, dtype), bits(decoded, dtype))
        return
    assert bits(decoded, dtype) == bits(value, dtype)
    assert both(spelled, dtype) == (bits(value, dtype), bits(value, dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@SETTINGS
@given(data=st.data())
def test_float_spellings_decode_as_numpy_reads_them_in_both_readers(dtype: np.dtype, data: st.DataObject) -> None:
    raw = data.draw(st.integers(0, 2 ** (8 * dtype.itemsize) - 1))
    word = data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
    number = data.draw(st.floats(width=8 * dtype.itemsize, allow_nan=False, allow_infinity=False))
    for spelled, want in [
        (hex_of(raw, dtype.itemsize), from_bits(raw, dtype)),  # the exact bits, NaN payload and -0.0 included
        (word, np.array(float(word), dtype=dtype)),
        (number, np.array(number, dtype=dtype)),
    ]:
        assert bits(decode_fill_value(spelled, dtype), dtype) == bits(want, dtype), spelled
        assert both(spelled, dtype) == (bits(want, dtype), bits(want, dtype)), spelled


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@SETTINGS
@given(data=st.data())
def test_complex_spellings_decode_part_by_part_in_both_readers(dtype: np.dtype, data: st.DataObject) -> None:
    part = np.dtype(f"f{dtype.itemsize // 2}")
    parts = []
    for _ in range(2):
        raw = data.draw(st.integers(0, 2 ** (8 * part.itemsize) - 1))
        kind = data.draw(st.sampled_from(["hex", "word", "number"]))
        if kind == "hex":
            parts.append((hex_of(raw, part.itemsize), from_bits(raw, part)))
        elif kind == "word":
            w = data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
            parts.append((w, part.type(float(w))))
        else:
            x = data.draw(st.floats(width=8 * part.itemsize, allow_nan=False, allow_infinity=False))
            parts.append((x, part.type(x)))
    spelled = [p[0] for p in parts]
    want = np.array([p[1] for p in parts], dtype=part).view(dtype.newbyteorder("="))[0]
    assert bits(decode_fill_value(spelled, dtype), dtype) == bits(want, dtype), spelled
    assert both(spelled, dtype) == (bits(want, dtype), bits(want, dtype)), spelled


#: a finite JSON number beyond each float width (10**400: beyond float64 itself)
TOO_BIG = {2: 1e5, 4: 1e39, 8: 10**400}


@pytest.mark.parametrize("dtype", FLOATS + COMPLEX, ids=str)
def test_a_value_that_overflows_the_type_is_refused_by_both_readers(dtype: np.dtype) -> None:
    """Never made infinite: the document does not say infinity."""
    big = TOO_BIG[dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize]
    spelled: Any = [0.0, big] if dtype.kind == "c" else big
    with pytest.raises(ValueError, match="overflows"):
        decode_fill_value(spelled, dtype)
    assert both(spelled, dtype) == (None, None)


@pytest.mark.parametrize("spelled", [1.0, [1.0], [1.0, 2.0, 3.0], "1+2j", {"re": 1}])
def test_complex_takes_real_and_imaginary_and_says_so_in_both_readers(spelled: Any) -> None:
    with pytest.raises(ValueError, match=r"expected \[real, imaginary\]"):
        decode_fill_value(spelled, np.dtype("<c8"))
    for read in (via_draft, via_v3):
        with pytest.raises(DraftMetadataError, match=r"\[real, imaginary\]"):
            read(spelled, np.dtype("<c8"))


def test_a_bit_pattern_wider_than_the_type_is_refused() -> None:
    with pytest.raises(ValueError, match="wider than 2 bytes"):
        decode_fill_value("0x10000", np.dtype("<f2"))
    assert both("0x10000", np.dtype("<f2")) == (None, None)
