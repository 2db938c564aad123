"""The one translation of draft metadata into Zarr v3.0 (``zarr.json``) documents.

Used by both the zarr-3 view and the migrator. The translation is chosen so that
draft chunk payloads and draft shard objects are *verbatim* valid v3 chunks/shards
(index at the end, ``bytes`` little-endian index codec, no checksum); asking for a
checksum or a start index means the caller rewrites the shard index.
Data types and fill values are spelled exactly as zarr-python 3 writes and reads them:
plain numeric types directly (so migrating them never imports zarr), the rest through
zarr 3's own dtype machinery.

No document zarr-python 3 cannot use is ever produced: codec parameters are checked as
they are translated (what zarr 3 parses, and what the codec can encode with: blosc clevel
0-9, gzip level 0-9, zstd level an int), each filter and the compressor run a test chunk
there and back, and array->array filters must produce what zarr 3 expects of them. An
array that fails is *untranslatable*: :class:`DraftMetadataError` naming the document and
the field (migrate: exit 10, ``--skip-damaged`` leaves it out). Values a library clamps
are translated to what it used (zstd level 30 was level 22; gzip -1 is level 6).
"""

from __future__ import annotations

import base64
import json
import math
import struct
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

from .. import _numcodecs_adapter, _zarr_adapter
from ..errors import DraftMetadataError, UsageError
from .draft_metadata import (
    DraftArrayMeta,
    KnownCompressor,
    array_meta_key,
    compressor_id,
    has_a_compressor,
    known_compressor,
    plain_fill_of,
    plain_type_of,
    stored,
    stored_compressor,
)
from .fill_value import encode_fill_value, plain_fill_json

if TYPE_CHECKING:
    from numcodecs.abc import Codec


def ensure_contiguous_ndarray(buf: Any) -> Any:
    """``numcodecs.compat.ensure_contiguous_ndarray``; numcodecs is imported when a codec is
    translated, not with this module."""
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    from numcodecs.compat import ensure_contiguous_ndarray as ensure

    return ensure(buf)

__all__ = [
    "v3_array_document",
    "v3_group_document",
    "consolidated_metadata",
    "inner_codecs",
    "is_portable",
    "portability_problems",
    "portable_target",
    "v3_chunk_key",
    "v3_chunk_key_head",
    "same_json",
    "document_difference",
]

_KEEP: Any = object()  # sentinel: "use the array's own value"

#: Codecs every v3 implementation (tensorstore included) understands.
PORTABLE_CODECS = frozenset(
    {"bytes", "transpose", "blosc", "gzip", "zstd", "crc32c", "sharding_indexed"}
)
#: zarr-python 3 data type names that every v3 implementation understands.
PORTABLE_DATA_TYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64", "complex64", "complex128"}
)
_BLOSC_SHUFFLE = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def _untranslatable(meta: DraftArrayMeta, message: str) -> DraftMetadataError:
    key = array_meta_key(meta.path)
    return DraftMetadataError(f"{key}: {message}", key=key)


#: numpy (kind, itemsize) -> v3 name of the types every reader knows; these are
#: translated here without importing zarr-python (~0.2 s), the rest through zarr's own
#: dtype machinery. A test checks both agree on every type and many fill values.
_NUMERIC_NAMES = {
    ("b", 1): "bool",
    **{("i", n): f"int{8 * n}" for n in (1, 2, 4, 8)},
    **{("u", n): f"uint{8 * n}" for n in (1, 2, 4, 8)},
    **{("f", n): f"float{8 * n}" for n in (2, 4, 8)},
    **{("c", n): f"complex{8 * n}" for n in (8, 16)},
}


class _NumericType:
    """A numeric data type as zarr-python 3's dtype objects present it (the part we use)."""

    def __init__(self, dtype: np.dtype, name: str) -> None:
        self.dtype = dtype
        self.name = name
        self.has_endianness = dtype.itemsize > 1

    def to_json(self) -> str:
        return self.name

    def fill_json(self, fill: Any) -> Any:
        """A draft ``null`` becomes the type's zero (v3 requires a fill value)."""
        return encode_fill_value(self.dtype.type(0) if fill is None else fill, self.dtype)


#: time units zarr-python 3 takes (its ``DateTimeUnit``); another unit goes through zarr (its error)
_TIME_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs", "as", "generic"})


class _TimeType:
    """``datetime64``/``timedelta64`` as zarr-python 3's dtype objects present them
    (``numpy.datetime64`` with its unit and scale factor; scalars as int64, NaT the default)."""

    has_endianness = True

    def __init__(self, dtype: np.dtype, unit: str, scale: int) -> None:
        self.dtype, self.unit, self.scale = dtype, unit, scale
        self.name = "numpy.datetime64" if dtype.kind == "M" else "numpy.timedelta64"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": {"unit": self.unit, "scale_factor": self.scale}}

    def fill_json(self, fill: Any) -> Any:
        """A draft ``null`` becomes NaT; a value is its int64 view (zarr's ``to_json_scalar``)."""
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        if fill is None:
            fill = np.datetime64("NaT") if self.dtype.kind == "M" else np.timedelta64("NaT")
        return fill.view(np.int64).item()


def _time_type(dtype: np.dtype) -> _TimeType | None:
    """The :class:`_TimeType` of a plain time dtype whose unit zarr takes, else None."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    if dtype.kind not in "mM" or dtype.fields is not None or dtype.subdtype is not None:
        return None
    unit, scale = np.datetime_data(dtype)
    return _TimeType(dtype, unit, scale) if unit in _TIME_UNITS and 1 <= scale < 2**31 else None


class _ZarrType:
    """Any other data type, through zarr-python 3's dtype object."""

    def __init__(self, zdtype: Any) -> None:
        self.zdtype = zdtype
        self.has_endianness = _zarr_adapter.has_endianness(zdtype)

    def to_json(self) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.zdtype.to_json(zarr_format=3)

    def fill_json(self, fill: Any) -> Any:
        """A draft ``null`` becomes the type's default (zero/empty/NaT)."""
        fill = self.zdtype.default_scalar() if fill is None else fill
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.zdtype.to_json_scalar(fill, zarr_format=3)


def _data_type(dtype: np.dtype, meta: DraftArrayMeta, *,
               use_zarr: bool = False) -> _NumericType | _TimeType | _ZarrType:
    """The v3 data type of a numpy dtype: plain numeric and time types directly, the rest
    as zarr-python 3 spells them (quietly: string/structured types warn that their v3
    spelling is not yet standardised)."""
    name = None if dtype.fields is not None or dtype.subdtype is not None else _NUMERIC_NAMES.get((dtype.kind, dtype.itemsize))
    if name is not None and not use_zarr:
        return _NumericType(dtype, name)
    time = None if use_zarr else _time_type(dtype)
    return time if time is not None else _ZarrType(_zdtype(dtype, meta))


def _zdtype(dtype: np.dtype, meta: DraftArrayMeta) -> Any:
    """zarr-python 3's data type object for a numpy dtype."""
    if dtype.fields is not None:
        for name, (sub, *_rest) in dtype.fields.items():
            if sub.subdtype is not None:
                raise _untranslatable(
                    meta, f"field 'data_type': structured field {name!r} is a sub-array ({sub}), "
                    "which zarr v3 cannot express"
                )
            if sub.byteorder == ">" and sub.itemsize > 1:
                raise _untranslatable(
                    meta, f"field 'data_type': structured field {name!r} is big-endian ({sub.str}); "
                    "zarr v3 stores structured fields little-endian, so the chunks cannot be reused"
                )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _zarr_adapter.dtype_from_numpy(dtype)
        except Exception as e:
            raise _untranslatable(meta, f"field 'data_type': zarr v3 has no data type for {dtype}: {e}") from None


#: codecs zarr-python 3 (3.1 and later, setup.cfg's floor) registers itself under these names
#: (``zarr.codecs.numcodecs``): a compressor among them is known without importing zarr
#: (~0.2 s of a command's start-up); ``tests/unit/formats/`` checks the set against zarr's registry
ZARR_NUMCODECS = frozenset(f"numcodecs.{c}" for c in (
    "bz2", "crc32", "crc32c", "lz4", "lzma", "zfpy", "adler32", "astype", "bitround", "blosc", "delta",
    "fixedscaleoffset", "fletcher32", "gzip", "jenkins_lookup3", "pcodec", "packbits", "quantize", "shuffle",
    "zlib", "zstd"))


def _v3_known(name: str) -> bool:
    """Whether zarr-python 3 has a codec of this name (:data:`ZARR_NUMCODECS`, else its registry)."""
    return name in ZARR_NUMCODECS or _v3_class(name) is not None


def _v3_class(name: str) -> type | None:
    from zarr.registry import get_codec_class

    try:
        return get_codec_class(name)
    except KeyError:
        return None


def _split_filters(meta: DraftArrayMeta) -> tuple[list[Codec], list[Codec]]:
    """Draft filters as (array->array, bytes->bytes) numcodecs codecs for zarr 3.

    Every draft filter works on the chunk's memory buffer, so a filter that zarr 3
    registers as bytes->bytes (e.g. ``shuffle``) may move behind the ``bytes`` codec,
    but only if no array->array filter follows it.
    """
    if not meta.filters:
        return [], []
    from zarr.abc.codec import ArrayArrayCodec, BytesBytesCodec

    aa: list[Codec] = []
    bb: list[Codec] = []
    for f in meta.filters:
        cls = _v3_class(f"numcodecs.{f.codec_id}")
        if cls is not None and issubclass(cls, ArrayArrayCodec) and not bb:
            aa.append(f)
        elif cls is not None and issubclass(cls, BytesBytesCodec):
            bb.append(f)
        else:
            raise _untranslatable(
                meta, f"field 'attributes.filters': filter {f.codec_id!r} has no zarr-python 3 "
                "equivalent in this position"
            )
    return aa, bb


#: The test chunk has the array's own chunk size up to this many bytes (a filter may depend
#: on it: ``shuffle`` needs a multiple of its element size), else 8 items.
PROBE_BYTES = 1 << 16


def _probe_items(meta: DraftArrayMeta) -> int:
    n = math.prod(meta.chunks)
    return n if n * meta.dtype.itemsize <= PROBE_BYTES else 8


def _probe(meta: DraftArrayMeta, compressor: Codec | None, *, encoded: bool = False) -> list[Any]:
    """Run a tiny chunk through the filters (and, with ``encoded``, the compressor and back
    through everything) as a reader and a writer of the translated array will: a parameter
    the codec rejects (numcodecs accepts almost any configuration and fails only when used:
    zlib level 99, lzma preset 99, an lz4 acceleration of "x") makes the array untranslatable
    instead of a ``zarr.json`` that fails on first use. Returns the chunk after each filter
    (``[0]``: the chunk itself): their types are what the draft writer handed to the next
    stage (so e.g. ``Delta(astype=...)`` and blosc's typesize are seen exactly)."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    out: Any = np.zeros(_probe_items(meta), dtype=meta.dtype)
    outputs = [out]
    stages: list[tuple[str, Codec, Any]] = []  # (field, codec, its input)
    fld = "attributes.filters"
    try:
        for i, f in enumerate(meta.filters):
            fld = f"attributes.filters[{i}]"
            stages.append((fld, f, out))
            out = f.encode(out)
            outputs.append(out)
        if not encoded:
            return outputs
        if compressor is not None:
            fld = "compressor"
            stages.append((fld, compressor, out))
            out = compressor.encode(ensure_contiguous_ndarray(out))
        for _fld, codec, given in reversed(stages):
            out = codec.decode(out)
            got, want = ensure_contiguous_ndarray(out).nbytes, ensure_contiguous_ndarray(given).nbytes
            if got != want:  # e.g. packbits over packbits: the chunk cannot come back
                raise ValueError(f"decodes to {got} bytes, not the {want} it encoded")
    except Exception as e:  # noqa: BLE001 - any failure of a third-party codec
        raise _untranslatable(
            meta, f"field '{fld}': the codec fails on a test chunk ({type(e).__name__}: {_short_text(e)}); "
            "zarr-python 3 could not read or write the array"
        ) from None
    return outputs


def _short_text(e: BaseException, limit: int = 160) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_config(meta: DraftArrayMeta, codec: Codec, fld: str) -> dict[str, Any]:
    """A numcodecs codec's configuration as zarr-python 3 will see it: JSON, from which
    numcodecs must build the same codec (zarr 3 does that on first use)."""
    config: dict[str, Any] = codec.get_config()
    config.pop("id", None)
    try:
        config = json.loads(json.dumps(config))
        _numcodecs_adapter.load()  # numcodecs without its entry-point scan
        import numcodecs

        numcodecs.get_codec({"id": codec.codec_id, **config})
    except Exception as e:  # noqa: BLE001 - non-JSON values, or numcodecs refusing its own config
        raise _untranslatable(
            meta, f"field '{fld}': the {codec.codec_id!r} configuration does not survive JSON "
            f"({type(e).__name__}: {_short_text(e)})"
        ) from None
    return config


def _numcodecs_entry(codec: Codec, meta: DraftArrayMeta, fld: str) -> dict[str, Any]:
    return {"name": f"numcodecs.{codec.codec_id}", "configuration": _json_config(meta, codec, fld)}


#: What zarr-python 3's native codecs accept (zarr/codecs/{blosc,gzip,zstd}.py), and what the
#: codecs themselves can encode with (a parameter zarr 3 parses but the library refuses would
#: give an array that fails on its first write).
BLOSC_CNAMES = frozenset({"lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib"})
BLOSC_CLEVELS = range(0, 10)
GZIP_LEVELS = range(0, 10)
#: libzstd's ``ZSTD_maxCLevel()``: zarr 3 refuses higher levels; libzstd clamps them to it,
#: so a draft written with level 30 was compressed at level 22 and is translated as such.
ZSTD_MAX_LEVEL = 22
_C_INT = range(-(2**31), 2**31)


def _int_param(meta: DraftArrayMeta, cid: str, name: str, value: Any, allowed: range) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in allowed:
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 4000 else "<huge integer>"
        shown = shown if len(shown) <= 24 else f"{shown[:16]}... ({len(shown)} characters)"
        raise _untranslatable(
            meta, f"field 'compressor': {cid} {name} {shown} is not an integer in "
            f"[{allowed.start}, {allowed.stop - 1}], so zarr-python 3 cannot use it"
        )
    return value


def _compressor_entry(config: dict[str, Any], meta: DraftArrayMeta, typesize: int, codec: Codec | None) -> dict[str, Any]:
    """A draft compressor (numcodecs' ``get_config()``; ``codec`` None for one of
    :data:`~sharding_store.formats.draft_metadata.KNOWN_COMPRESSORS` not built) as a v3 codec
    that decodes the draft payload unchanged; its parameters are checked against what
    zarr-python 3 and the codec accept."""
    cid = config.pop("id")
    if cid == "blosc":
        cname = config.get("cname")
        if cname not in BLOSC_CNAMES:
            raise _untranslatable(
                meta, f"field 'compressor': blosc cname {str(cname)[:40]!r} is not one of "
                f"{', '.join(sorted(BLOSC_CNAMES))}, so zarr-python 3 cannot use it"
            )
        shuffle = config.get("shuffle")
        if isinstance(shuffle, bool) or shuffle not in (-1, *_BLOSC_SHUFFLE):
            raise _untranslatable(
                meta, f"field 'compressor': blosc shuffle {str(shuffle)[:40]!r} is not -1, 0, 1 or 2"
            )
        if shuffle == -1:  # AUTOSHUFFLE, resolved as numcodecs' compress() does
            shuffle = 2 if typesize == 1 else 1
        return {
            "name": "blosc",
            "configuration": {
                "cname": cname,
                "clevel": _int_param(meta, cid, "clevel", config.get("clevel"), BLOSC_CLEVELS),
                "shuffle": _BLOSC_SHUFFLE[shuffle],
                "typesize": typesize,
                "blocksize": _int_param(meta, cid, "blocksize", config.get("blocksize", 0), range(0, 2**31)),
            },
        }
    if cid == "gzip":
        level = config.get("level")
        if level == -1 and not isinstance(level, bool):
            level = 6  # zlib's Z_DEFAULT_COMPRESSION is level 6; zarr 3 takes 0-9 only
        return {"name": "gzip", "configuration": {"level": _int_param(meta, cid, "level", level, GZIP_LEVELS)}}
    if cid == "zstd":
        level = min(_int_param(meta, cid, "level", config.get("level"), _C_INT), ZSTD_MAX_LEVEL)
        checksum = config.get("checksum", False)
        if not isinstance(checksum, bool):
            raise _untranslatable(meta, f"field 'compressor': zstd checksum {str(checksum)[:40]!r} is not true or false")
        return {"name": "zstd", "configuration": {"level": level, "checksum": checksum}}
    if not _v3_known(f"numcodecs.{cid}"):
        raise _untranslatable(meta, f"field 'compressor': {cid!r} has no zarr-python 3 codec")
    if codec is None:  # a known configuration: JSON already, and numcodecs builds it (tested)
        return {"name": f"numcodecs.{cid}", "configuration": config}
    return _numcodecs_entry(codec, meta, "compressor")


def _check_zarr_resolves(meta: DraftArrayMeta, entries: list[dict[str, Any]], outputs: list[Any], positions: list[int]) -> None:
    """zarr-python 3 does not run an array->array filter to learn what it produces: it asks
    the codec (``resolve_metadata``), then reshapes each decoded chunk to that shape and has
    the bytes codec read the chunk as that type. A chain where the answer differs in size
    from what the filter really produces (e.g. ``quantize(dtype=f2)`` after a filter that
    made int32, ``quantize(astype=...)``, a second ``delta`` over the first one's wider
    output) would fail to reshape, or read wrong values: refused."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    fld = "attributes.filters"
    n_in = _probe_items(meta)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr 3 warns that numcodecs codecs are not in the spec
            zdtype = _zdtype(meta.dtype, meta)
            spec = _zarr_adapter.array_spec((n_in,), zdtype)
            for entry, out, i in zip(entries, outputs, positions):
                fld = f"attributes.filters[{i}]"
                codec = _v3_class(entry["name"]).from_dict(entry)  # type: ignore[union-attr]
                codec = codec.evolve_from_array_spec(spec)
                spec = codec.resolve_metadata(spec)
                expected, n = np.dtype(spec.dtype.to_native_dtype()), math.prod(spec.shape)
                actual = np.asarray(out)
                # only the bytes matter (bitround hands on an integer view of its floats)
                if actual.size != n or actual.dtype.itemsize != expected.itemsize:
                    raise _untranslatable(
                        meta, f"field '{fld}': {entry['name']!r} produces {actual.size} items of {actual.dtype} "
                        f"from a {n_in}-item chunk, where zarr-python 3 expects {n} of {expected}: it could "
                        "not read the chunks"
                    )
    except DraftMetadataError:
        raise
    except Exception as e:  # noqa: BLE001 - zarr 3 itself failing on the configuration
        raise _untranslatable(
            meta, f"field '{fld}': zarr-python 3 cannot set it up ({type(e).__name__}: {_short_text(e)})"
        ) from None


def inner_codecs(meta: DraftArrayMeta, compressor: Codec | None = _KEEP) -> list[dict[str, Any]]:
    """The v3 codec chain that decodes one draft chunk payload:
    transpose (F order) -> filters -> bytes -> compressor.

    Raises DraftMetadataError (untranslatable) for a codec or parameter zarr-python 3 would
    refuse or fail on, so no ``zarr.json`` it cannot use is ever produced."""
    plain = _plain_chain(meta) if compressor is _KEEP else None
    if plain is not None:
        return plain
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    known = _known_alone(meta) if compressor is _KEEP else None
    compressor = None if known is not None else meta.compressor if compressor is _KEEP else compressor
    aa, bb = _split_filters(meta)
    index = {id(f): i for i, f in enumerate(meta.filters)}
    codecs = _transpose(meta)
    aa_entries = [_numcodecs_entry(f, meta, f"attributes.filters[{index[id(f)]}]") for f in aa]
    codecs += aa_entries
    stages = _probe(meta, compressor)
    if aa:
        _check_zarr_resolves(meta, aa_entries, stages[1 : len(aa) + 1], [index[id(f)] for f in aa])
    array_dtype = np.asarray(stages[len(aa)]).dtype  # what the bytes codec sees
    seen, own = _data_type(array_dtype, meta).has_endianness, _data_type(meta.dtype, meta).has_endianness
    if seen and not own:
        # zarr-python 3 sets the bytes codec up from the array's own type (evolve_from_array_spec)
        # and then fails on the wider type the filters hand it
        raise _untranslatable(
            meta, f"field 'attributes.filters': the filters turn {meta.dtype} items into {array_dtype}, "
            "which zarr-python 3 cannot decode for an array of 1-byte items"
        )
    if own:  # zarr 3 requires the byte order whenever the array's own type has one
        big = seen and (array_dtype.byteorder == ">" or (array_dtype.byteorder == "=" and not np.little_endian))
        codecs.append({"name": "bytes", "configuration": {"endian": "big" if big else "little"}})
    else:
        codecs.append({"name": "bytes"})
    codecs += [_numcodecs_entry(f, meta, f"attributes.filters[{index[id(f)]}]") for f in bb]
    if known is not None:  # the chunk is the array's own items: typesize is their size
        codecs.append(_compressor_entry(known, meta, meta.dtype.itemsize, None))
        return codecs  # a known compressor with no filter encodes every plain type (tested)
    if compressor is not None:
        # numcodecs' Blosc takes typesize (and AUTOSHUFFLE) from the buffer it is given
        typesize = ensure_contiguous_ndarray(stages[-1]).itemsize
        codecs.append(_compressor_entry(compressor.get_config(), meta, typesize, compressor))  # checks its parameters first
    _probe(meta, compressor, encoded=True)
    return codecs


def _transpose(meta: DraftArrayMeta) -> list[dict[str, Any]]:
    """The chain's first codec: F order becomes a transpose (none for C, or one dimension)."""
    if meta.order == "F" and meta.ndim > 1:
        return [{"name": "transpose", "configuration": {"order": list(range(meta.ndim))[::-1]}}]
    return []


def _plain_chain(meta: DraftArrayMeta) -> list[dict[str, Any]] | None:
    """:func:`inner_codecs` of an array with a :class:`PlainType`, no filter and a known
    compressor or none, from the descriptions alone (no numpy, no numcodecs, no probe: the
    chunk is the array's own items); None for any other array."""
    plain = plain_type_of(meta)
    known = known_compressor(meta)
    if plain is None or meta.filters or (known is None and has_a_compressor(meta)):
        return None
    codecs = _transpose(meta)
    if plain.itemsize > 1:  # zarr 3 requires the byte order whenever the type has one
        codecs.append({"name": "bytes", "configuration": {"endian": "big" if plain.big else "little"}})
    else:
        codecs.append({"name": "bytes"})
    if known is not None:
        codecs.append(_compressor_entry(known, meta, plain.itemsize, None))
    return codecs


def _known_alone(meta: DraftArrayMeta) -> dict[str, Any] | None:
    """The configuration of ``meta``'s compressor when it is a known one not built yet
    (:func:`~sharding_store.formats.draft_metadata.known_compressor`), the array has no
    filter and a plain numeric or time type: the chain then needs neither numcodecs nor a probe."""
    if meta.filters or meta.dtype.fields is not None or meta.dtype.kind not in "biufcmM":
        return None
    return known_compressor(meta)


def _dimension_names(attributes: dict[str, Any], ndim: int) -> tuple[list[Any] | None, dict[str, Any]]:
    """xarray's ``_ARRAY_DIMENSIONS`` attribute becomes v3 ``dimension_names``."""
    dims = attributes.get("_ARRAY_DIMENSIONS")
    if (
        isinstance(dims, list)
        and len(dims) == ndim
        and all(d is None or isinstance(d, str) for d in dims)
    ):
        rest = {k: v for k, v in attributes.items() if k != "_ARRAY_DIMENSIONS"}
        return dims, rest
    return None, attributes


def _type_and_fill(dt: _NumericType | _TimeType | _ZarrType, meta: DraftArrayMeta) -> tuple[Any, Any]:
    """The v3 ``data_type`` and ``fill_value``; zarr-python 3's dtype machinery failing on
    one (e.g. the default of a structured type with a raw-bytes field) is untranslatable."""
    fld = "data_type"
    try:
        data_type = dt.to_json()
        fld = "fill_value"
        return data_type, dt.fill_json(meta.fill_value)
    except DraftMetadataError:
        raise
    except Exception as e:  # noqa: BLE001 - zarr-python 3 refusing the type or the value
        raise _untranslatable(
            meta, f"field '{fld}': zarr-python 3 cannot express it for {meta.dtype} ({type(e).__name__}: {_short_text(e)})"
        ) from None


def _v3_type_and_fill(meta: DraftArrayMeta) -> tuple[Any, Any]:
    """The v3 ``data_type`` and ``fill_value``: from the :class:`PlainType` description when
    the document gave one (no numpy), else through numpy's dtype (:func:`_type_and_fill`)."""
    plain, fill = plain_type_of(meta), plain_fill_of(meta)
    if plain is not None and fill is not None:
        return plain.v3_name, plain_fill_json(fill.value, plain)
    return _type_and_fill(_data_type(meta.dtype, meta), meta)


def v3_array_document(
    meta: DraftArrayMeta,
    *,
    chunks_per_shard: tuple[int, ...] | None = _KEEP,
    index_codecs_checksum: bool = True,
    index_location: Literal["start", "end"] = "end",
    compressor_override: Codec | None = None,
    portable: bool = False,
    dimension_names: list[str | None] | None = None,
) -> dict[str, Any]:
    """The v3.0 ``zarr.json`` for a draft array.

    With ``chunks_per_shard=None`` the array is unsharded (codecs = inner chain, grid =
    inner chunks); otherwise the grid is the shard shape and everything sits inside
    ``sharding_indexed``. ``portable=True`` refuses (UsageError) a document some v3
    reader could not open; pass a ``compressor_override`` to make it portable.
    ``dimension_names`` names the dimensions of an array that has none (a draft array
    written by xarray has them already, from ``_ARRAY_DIMENSIONS``: giving other names
    is refused).
    """
    if chunks_per_shard is not _KEEP:
        meta = meta.with_chunks_per_shard(chunks_per_shard)
    if index_location not in ("start", "end"):
        raise UsageError(f"index_location must be 'start' or 'end', got {index_location!r}")
    compressor = _KEEP if compressor_override is None else compressor_override
    if portable:
        problems = portability_problems(meta, compressor=compressor)
        if problems:
            raise UsageError(
                f"{array_meta_key(meta.path)}: not portable to every v3 reader: " + "; ".join(problems)
            )
    data_type_json, fill_json = _v3_type_and_fill(meta)
    inner = inner_codecs(meta, compressor)
    if meta.chunks_per_shard is None:
        grid, codecs = list(meta.chunks), inner
    else:
        index_codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if index_codecs_checksum:
            index_codecs.append({"name": "crc32c"})
        grid = list(meta.shard_shape)
        codecs = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": list(meta.chunks),
                    "codecs": inner,
                    "index_codecs": index_codecs,
                    "index_location": index_location,
                },
            }
        ]
    own_names, attributes = _dimension_names(meta.attributes, meta.ndim)
    if own_names is not None:
        attributes = _xarray_fill_attribute(meta, attributes)
    if dimension_names is not None:
        dimension_names = _given_dimension_names(meta, dimension_names, own_names)
    else:
        dimension_names = own_names
    doc: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(meta.shape),
        "data_type": data_type_json,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": meta.separator}},
        # v3 requires a fill value; a draft ``null`` (never defined by zarr 2) is the
        # type's default: zero, empty, NaT
        "fill_value": fill_json,
        "codecs": codecs,
        "attributes": attributes,
    }
    if dimension_names is not None:
        doc["dimension_names"] = dimension_names
    plain: dict[str, Any] = json.loads(json.dumps(doc))  # plain JSON types only (zarr returns tuples)
    return plain


def _xarray_fill_attribute(meta: DraftArrayMeta, attributes: dict[str, Any]) -> dict[str, Any]:
    """xarray of the draft era (``_ARRAY_DIMENSIONS``) kept the CF ``_FillValue`` in the zarr
    ``fill_value`` (``null`` when there was none) and read it back from there; xarray reads
    Zarr v3's from a ``_FillValue`` attribute instead, spelled as its ``FillValueCoder``
    writes it (floats: base64 of a little-endian float64). Without it, values equal to the
    fill value would no longer read as missing after the migration."""
    fill = meta.fill_value
    kind = meta.dtype.kind
    if fill is None or "_FillValue" in attributes or kind not in "biufc":
        return attributes
    if kind == "b":
        value: Any = bool(fill)
    elif kind in "iu":
        value = int(fill)
    elif kind == "f":
        value = _b64_float64(float(fill))
    else:
        value = [_b64_float64(complex(fill).real), _b64_float64(complex(fill).imag)]
    return {**attributes, "_FillValue": value}


def _b64_float64(value: float) -> str:
    return base64.standard_b64encode(struct.pack("<d", value)).decode()


def _given_dimension_names(meta: DraftArrayMeta, names: Any, own: list[Any] | None) -> list[str | None]:
    key = array_meta_key(meta.path)
    if not isinstance(names, (list, tuple)) or not all(n is None or isinstance(n, str) for n in names):
        raise UsageError(f"'/{meta.path}': dimension names must be a list of strings, got {names!r}", key=key)
    names = list(names)
    checked: list[str | None] = names
    if len(names) != meta.ndim:
        raise UsageError(f"'/{meta.path}': {len(names)} dimension name{'' if len(names) == 1 else 's'} {names} "
                         f"for an array of {meta.ndim} dimension{'' if meta.ndim == 1 else 's'}", key=key)
    if own is not None and own != names:
        raise UsageError(f"'/{meta.path}': the array names its dimensions {own} already (_ARRAY_DIMENSIONS); "
                         f"refusing to rename them {names}", key=key)
    return checked


def consolidated_metadata(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """zarr-python 3's inline consolidated metadata for a root group: the document of every
    node below the root by path, as ``zarr.consolidate_metadata`` writes it (a nested
    group carries an empty one of its own). ``docs``: path -> ``zarr.json`` document."""
    inner: dict[str, Any] = {}
    for path in sorted(docs):
        if path == "":
            continue
        doc = dict(docs[path])
        if doc.get("node_type") == "group":
            doc["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": {}}
        inner[path] = doc
    return {"kind": "inline", "must_understand": False, "metadata": inner}


def v3_group_document(attributes: dict[str, Any]) -> dict[str, Any]:
    """The v3.0 ``zarr.json`` of a group."""
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes or {})}


def portability_problems(meta: DraftArrayMeta, compressor: Codec | None = _KEEP) -> list[str]:
    """Why some v3 reader (e.g. tensorstore) could not open this array; [] if none."""
    try:
        dt_json, _ = _v3_type_and_fill(meta)
        codecs = inner_codecs(meta, compressor)
    except DraftMetadataError as e:
        return [str(e)]
    problems = []
    dt_name = dt_json if isinstance(dt_json, str) else dt_json["name"]
    if dt_name not in PORTABLE_DATA_TYPES:
        problems.append(f"data type {meta.dtype.str} becomes {dt_name!r}, which only zarr-python reads")
    if dt_name == "structured" and meta.is_sharded:
        problems.append("zarr-python 3.1 cannot read sharded structured arrays (unhashable fill value)")
    for i, c in enumerate(codecs):
        if c["name"] not in PORTABLE_CODECS:
            has_compressor = has_a_compressor(meta) if compressor is _KEEP else compressor is not None
            role = "compressor" if has_compressor and i == len(codecs) - 1 else "filter"
            problems.append(f"{role} codec {c['name']!r} is only known to zarr-python")
    return problems


#: compressors that exist only as zarr-python's ``numcodecs.*`` codecs; ``--portable``
#: recompresses them to zstd
NON_PORTABLE_COMPRESSORS = frozenset({"zlib", "bz2", "lz4", "lzma"})
#: the level ``--portable`` recompresses with (zstd's own default)
PORTABLE_ZSTD_LEVEL = 3


def portable_target(meta: DraftArrayMeta) -> DraftArrayMeta | None:
    """The array as ``--portable`` writes it, or None when it stays as it is.

    Filters some v3 reader does not know (``numcodecs.delta``, ``fixedscaleoffset``,
    ``quantize``...) are applied once and dropped: the target chunk holds the values a
    reader of the source gets. A compressor only zarr-python knows becomes zstd. None when
    the array is portable already, or when no codec change makes it portable (its data
    type: :func:`portability_problems` names it), so such an array is copied verbatim.
    """
    if not portability_problems(meta):
        return None
    compressor, filters = stored_compressor(meta), meta.filters
    if compressor_id(meta) in NON_PORTABLE_COMPRESSORS:
        # numcodecs' Zstd(level=3), built when the copy encodes with it
        compressor = KnownCompressor({"id": "zstd", "level": PORTABLE_ZSTD_LEVEL, "checksum": False}, array_meta_key(meta.path))
    if filters:
        try:
            unknown = any(c["name"] not in PORTABLE_CODECS for c in inner_codecs(meta, None))
        except DraftMetadataError:
            unknown = True
        if unknown:
            filters = ()
    if compressor is stored_compressor(meta) and filters is meta.filters:
        return None
    target = replace(meta, **{**stored(meta), "compressor": compressor}, filters=filters)
    return None if portability_problems(target) else target


def is_portable(meta: DraftArrayMeta) -> bool:
    """True iff every v3 reader (tensorstore included) knows all codecs and the dtype."""
    return not portability_problems(meta)


def v3_chunk_key(coords: tuple[int, ...], separator: str) -> str:
    """Default v3 chunk key: ``c/1/0`` or ``c.1.0``; a 0-d array's only chunk is ``c``."""
    return f"{v3_chunk_key_head(separator)}{separator.join(map(str, coords))}" if coords else "c"  # (no list built)


def v3_chunk_key_head(separator: str) -> str:
    """What every default v3 chunk key of coordinates (not a 0-d array's ``c``) starts
    with: :func:`v3_chunk_key` is this followed by the coordinates joined by ``separator``
    (for a caller that spells many keys of one array without a call each)."""
    if separator not in ("/", "."):
        raise UsageError(f"chunk key separator must be '/' or '.', got {separator!r}")
    return f"c{separator}"


# --------------------------------------------------------------------------- comparing documents


def same_json(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values are the same document: types and values compared
    strictly, without recursion (``False`` ≠ ``0`` ≠ ``0.0``, ``-0.0`` ≠ ``0.0``, a float
    by its bits; a NaN equals a NaN, JSON spells no payload; strings exactly, so every
    ``"NaN"``/``"0x7fc00000"`` spelling of a fill value is its own). Python's ``==``
    holds ``False == 0 == 0.0 == -0.0``: a verifier built on it accepts documents a reader
    then refuses. Lists and tuples are both JSON arrays."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        tx, ty = type(x), type(y)
        if tx is not ty and not (tx in (list, tuple) and ty in (list, tuple)):
            return False
        if isinstance(x, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, (list, tuple)):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif isinstance(x, float):
            if not (math.isnan(x) and math.isnan(y)) and struct.pack("<d", x) != struct.pack("<d", y):
                return False
        elif x != y:
            return False
    return True


def document_difference(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> str | None:
    """The first field (in name order) in which ``actual`` is not ``expected`` by
    :func:`same_json`, in words; None when the documents are the same."""
    for k in sorted(set(expected) | set(actual)):
        if k not in actual or k not in expected or not same_json(expected[k], actual[k]):
            got = json.dumps(actual[k])[:120] if k in actual else "absent"
            want = json.dumps(expected[k])[:120] if k in expected else "absent"
            return f"field {k!r} is {got}, expected {want}"
    return None
