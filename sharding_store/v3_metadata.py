"""The one translation of draft metadata into Zarr v3.0 (``zarr.json``) documents.

Used by both the zarr-3 view and the migrator. The translation is chosen so that
draft chunk payloads and draft shard objects are *verbatim* valid v3 chunks/shards
(index at the end, ``bytes`` little-endian index codec, no checksum); asking for a
checksum or a start index means the caller rewrites the shard index.
Data types and fill values go through zarr-python 3's own dtype machinery, so the
JSON is exactly what zarr 3 writes and reads.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Literal

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray

from .draft_metadata import DraftArrayMeta, array_meta_key
from .errors import DraftMetadataError, UsageError

__all__ = [
    "v3_array_document",
    "v3_group_document",
    "inner_codecs",
    "is_portable",
    "portability_problems",
    "v3_chunk_key",
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


def _zdtype(dtype: np.dtype, meta: DraftArrayMeta) -> Any:
    """zarr-python 3's data type object for a numpy dtype (quietly: string/structured
    types warn that their v3 spelling is not yet standardised)."""
    from zarr.core.dtype import get_data_type_from_native_dtype

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
            return get_data_type_from_native_dtype(dtype)
        except Exception as e:
            raise _untranslatable(meta, f"field 'data_type': zarr v3 has no data type for {dtype}: {e}") from None


def _has_endianness(zdtype: Any) -> bool:
    from zarr.core.dtype.common import HasEndianness

    return isinstance(zdtype, HasEndianness)


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


def _run_filters(meta: DraftArrayMeta, filters: list[Codec]) -> Any:
    """Run a tiny chunk through ``filters``: their output type is what the draft writer
    handed to the next stage (so e.g. ``Delta(astype=...)`` is seen exactly)."""
    out: Any = np.zeros(8, dtype=meta.dtype)
    try:
        for f in filters:
            out = f.encode(out)
        return out
    except Exception as e:
        raise _untranslatable(
            meta, f"field 'attributes.filters': cannot determine the filters' output type: {e}"
        ) from None


def _numcodecs_entry(codec: Codec) -> dict:
    config = codec.get_config()
    config.pop("id", None)
    return {"name": f"numcodecs.{codec.codec_id}", "configuration": config}


def _compressor_entry(codec: Codec, meta: DraftArrayMeta, typesize: int) -> dict:
    """A draft compressor as a v3 codec that decodes the draft payload unchanged."""
    config = codec.get_config()
    cid = config.pop("id")
    if cid == "blosc":
        shuffle = config["shuffle"]
        if shuffle == -1:  # AUTOSHUFFLE, resolved as numcodecs' compress() does
            shuffle = 2 if typesize == 1 else 1
        return {
            "name": "blosc",
            "configuration": {
                "cname": config["cname"],
                "clevel": config["clevel"],
                "shuffle": _BLOSC_SHUFFLE[shuffle],
                "typesize": typesize,
                "blocksize": config.get("blocksize", 0),
            },
        }
    if cid == "gzip":
        return {"name": "gzip", "configuration": {"level": config["level"]}}
    if cid == "zstd":
        return {
            "name": "zstd",
            "configuration": {"level": config["level"], "checksum": bool(config.get("checksum", False))},
        }
    if _v3_class(f"numcodecs.{cid}") is None:
        raise _untranslatable(meta, f"field 'compressor': {cid!r} has no zarr-python 3 codec")
    return _numcodecs_entry(codec)


def inner_codecs(meta: DraftArrayMeta, compressor: Codec | None = _KEEP) -> list[dict]:
    """The v3 codec chain that decodes one draft chunk payload:
    transpose (F order) -> filters -> bytes -> compressor."""
    compressor = meta.compressor if compressor is _KEEP else compressor
    aa, bb = _split_filters(meta)
    codecs: list[dict] = []
    if meta.order == "F" and meta.ndim > 1:
        codecs.append({"name": "transpose", "configuration": {"order": list(range(meta.ndim))[::-1]}})
    codecs += [_numcodecs_entry(f) for f in aa]
    array_dtype = np.asarray(_run_filters(meta, aa)).dtype if aa else meta.dtype
    if _has_endianness(_zdtype(array_dtype, meta)):
        big = array_dtype.byteorder == ">" or (array_dtype.byteorder == "=" and not np.little_endian)
        codecs.append({"name": "bytes", "configuration": {"endian": "big" if big else "little"}})
    else:
        codecs.append({"name": "bytes"})
    codecs += [_numcodecs_entry(f) for f in bb]
    if compressor is not None:
        # numcodecs' Blosc takes typesize (and AUTOSHUFFLE) from the buffer it is given
        typesize = ensure_contiguous_ndarray(_run_filters(meta, list(meta.filters))).itemsize
        codecs.append(_compressor_entry(compressor, meta, typesize))
    return codecs


def _fill_value_json(meta: DraftArrayMeta, zdt: Any) -> Any:
    """v3 JSON fill value; a draft ``null`` becomes the type's default (zero/empty/NaT),
    since v3 requires a value and zarr 2 never defined what ``null`` reads as."""
    fill = zdt.default_scalar() if meta.fill_value is None else meta.fill_value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zdt.to_json_scalar(fill, zarr_format=3)


def _dimension_names(attributes: dict, ndim: int) -> tuple[list | None, dict]:
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


def v3_array_document(
    meta: DraftArrayMeta,
    *,
    chunks_per_shard: tuple[int, ...] | None = _KEEP,
    index_codecs_checksum: bool = True,
    index_location: Literal["start", "end"] = "end",
    compressor_override: Codec | None = None,
    portable: bool = False,
) -> dict:
    """The v3.0 ``zarr.json`` for a draft array.

    With ``chunks_per_shard=None`` the array is unsharded (codecs = inner chain, grid =
    inner chunks); otherwise the grid is the shard shape and everything sits inside
    ``sharding_indexed``. ``portable=True`` refuses (UsageError) a document some v3
    reader could not open; pass a ``compressor_override`` to make it portable.
    """
    if chunks_per_shard is not _KEEP:
        meta = meta.with_chunks_per_shard(chunks_per_shard)
    if index_location not in ("start", "end"):
        raise UsageError(f"index_location must be 'start' or 'end', got {index_location!r}")
    compressor = meta.compressor if compressor_override is None else compressor_override
    if portable:
        problems = portability_problems(meta, compressor=compressor)
        if problems:
            raise UsageError(
                f"{array_meta_key(meta.path)}: not portable to every v3 reader: " + "; ".join(problems)
            )
    zdt = _zdtype(meta.dtype, meta)
    inner = inner_codecs(meta, compressor)
    if meta.chunks_per_shard is None:
        grid, codecs = list(meta.chunks), inner
    else:
        index_codecs: list[dict] = [{"name": "bytes", "configuration": {"endian": "little"}}]
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
    dimension_names, attributes = _dimension_names(meta.attributes, meta.ndim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data_type = zdt.to_json(zarr_format=3)
    doc: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(meta.shape),
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": meta.separator}},
        "fill_value": _fill_value_json(meta, zdt),
        "codecs": codecs,
        "attributes": attributes,
    }
    if dimension_names is not None:
        doc["dimension_names"] = dimension_names
    return json.loads(json.dumps(doc))  # plain JSON types only (zarr returns tuples)


def v3_group_document(attributes: dict) -> dict:
    """The v3.0 ``zarr.json`` of a group."""
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes or {})}


def portability_problems(meta: DraftArrayMeta, compressor: Codec | None = _KEEP) -> list[str]:
    """Why some v3 reader (e.g. tensorstore) could not open this array; [] if none."""
    compressor = meta.compressor if compressor is _KEEP else compressor
    try:
        zdt = _zdtype(meta.dtype, meta)
        codecs = inner_codecs(meta, compressor)
    except DraftMetadataError as e:
        return [str(e)]
    problems = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dt_json = zdt.to_json(zarr_format=3)
    dt_name = dt_json if isinstance(dt_json, str) else dt_json["name"]
    if dt_name not in PORTABLE_DATA_TYPES:
        problems.append(f"data type {meta.dtype.str} becomes {dt_name!r}, which only zarr-python reads")
    if dt_name == "structured" and meta.is_sharded:
        problems.append("zarr-python 3.1 cannot read sharded structured arrays (unhashable fill value)")
    for i, c in enumerate(codecs):
        if c["name"] not in PORTABLE_CODECS:
            role = "compressor" if compressor is not None and i == len(codecs) - 1 else "filter"
            problems.append(f"{role} codec {c['name']!r} is only known to zarr-python")
    return problems


def is_portable(meta: DraftArrayMeta) -> bool:
    """True iff every v3 reader (tensorstore included) knows all codecs and the dtype."""
    return not portability_problems(meta)


def v3_chunk_key(coords: tuple[int, ...], separator: str) -> str:
    """Default v3 chunk key: ``c/1/0`` or ``c.1.0``; a 0-d array's only chunk is ``c``."""
    if separator not in ("/", "."):
        raise UsageError(f"chunk key separator must be '/' or '.', got {separator!r}")
    return separator.join(["c", *map(str, coords)])
