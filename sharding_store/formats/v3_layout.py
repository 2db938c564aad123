"""A final-v3 array document as what our reader needs (pure, no I/O).

The 2023 generation is read through the same path as the 2022 one: ``gen2023`` respells a
node document in the final v1.0 spelling, and :func:`layout_from_v3` turns that final
document into a :class:`V3ArrayMeta` — a :class:`~sharding_store.formats.draft_metadata.DraftArrayMeta`
(inner chunk shape, numpy dtype with its byte order, ``order`` C/F, compressor and filters as
numcodecs objects, ``chunks_per_shard``) plus what the 2022 layout fixes and v3 declares:
the chunk key encoding, where the shard index lies and whether a CRC32C follows it.

What it maps (and nothing else; the rest is refused, never approximated):

* codecs ``[transpose...] bytes [b2b...]`` or ``[sharding_indexed]`` whose inner chain is
  that; ``transpose`` compositions that are the identity (C) or reversed axes (F);
  ``bytes`` little or big endian (1-byte types: no endian); bytes->bytes ``gzip``, ``zstd``,
  ``blosc``, ``crc32c``: the last is the compressor, the others filters, which is the order
  ``chunk_codec`` applies them in (its bounded reference path decodes them);
* ``sharding_indexed`` with ``index_codecs`` ``[bytes little]`` or ``[bytes little, crc32c]``
  at the start or end, or undeclared (``hidden_checksum`` None: each shard's bytes decide,
  see :func:`~sharding_store.formats.shard_index.index_reading`);
* chunk keys ``default`` (``c/0/0``, ``c.0.0``, 0-d ``c``) and ``v2`` (``0.0``, 0-d ``0``);
* the v1.0 core data types; fill values as numbers, ``"NaN"``/``"Infinity"``/
  ``"-Infinity"``, ``"0x..."`` bit patterns, ``[real, imaginary]``, booleans (decoded by
  :func:`sharding_store.formats.fill_value.decode_fill_value`, the one decoder of every generation).

A document outside this (nested sharding, a codec after ``sharding_indexed``, other index
codecs, other transposes, unknown codecs or data types) raises
:class:`~sharding_store.errors.DraftMetadataError` naming the node's key and the field, and
pointing to ``open_v3`` (whose final-v3 view zarr-python 3 reads).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    pass

from .. import _numcodecs_adapter
from ..errors import DraftMetadataError
from .draft_metadata import MAX_CHUNK_ELEMENTS, DraftArrayMeta
from .fill_value import V3_CORE_DTYPES, decode_fill_value

if TYPE_CHECKING:
    from numcodecs.abc import Codec

__all__ = ["V3ArrayMeta", "layout_from_v3", "geometry_from_v3", "decided", "final_document", "data_prefix_v3", "KeyEncoding"]

KeyEncoding = Literal["draft", "default", "v2"]

_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


@dataclass(frozen=True)
class V3ArrayMeta(DraftArrayMeta):
    """A final-v3 array read through the draft reader: :class:`DraftArrayMeta` plus the
    layout facts v3 declares. ``index_checksum``: ``True`` a CRC32C follows each index
    (checked), ``False`` none, ``None`` undeclared (decided from each shard's bytes)."""

    key_encoding: KeyEncoding = "default"
    index_location: Literal["start", "end"] = "end"
    index_checksum: bool | None = False
    node_key: str = "zarr.json"
    #: why our reader cannot decode its payloads (None: it can); such an array is copied as
    #: it is, never decoded (:func:`geometry_from_v3`)
    opaque: str | None = None

    @property
    def data_prefix(self) -> str:
        return data_prefix_v3(self.path)

    @property
    def declares_codecs(self) -> bool:
        return True


def data_prefix_v3(path: str) -> str:
    """Where a v3 array's chunk keys start: its directory (``""`` for the root array)."""
    return f"{path}/" if path else ""


class _Unmappable(Exception):
    def __init__(self, fld: str, message: str) -> None:
        super().__init__(message)
        self.fld = fld
        self.message = message


def _refuse(key: str, fld: str, message: str) -> DraftMetadataError:
    return DraftMetadataError(
        f"{key}: {fld}: {message}; open_draft cannot read this array (open it with open_v3, whose "
        "final-v3 view zarr-python 3 reads)",
        key=key,
    )


def _name(codec: Any) -> str:
    return str(codec.get("name")) if isinstance(codec, dict) else str(codec)


def _config(codec: dict[str, Any]) -> dict[str, Any]:
    return codec.get("configuration") or {}


@dataclass
class _Chain:
    """One codec chain, mapped: order, byte order, compressor and filters."""

    order: str
    endian: str | None
    compressor: Codec | None
    filters: tuple[Codec, ...]
    sharding: dict[str, Any] | None = None


def _permutation_order(perms: list[list[int]], ndim: int, fld: str) -> str:
    """The composed transposes as a memory order: identity C, reversed axes F."""
    axes = list(range(ndim))
    for p in perms:
        if sorted(p) != list(range(ndim)):
            raise _Unmappable(fld, f"transpose order {p} is not a permutation of {ndim} axes")
        axes = [axes[i] for i in p]
    if axes == list(range(ndim)):
        return "C"
    if axes == list(range(ndim))[::-1]:
        return "F"
    raise _Unmappable(fld, f"transpose to axes {axes}: only the identity (C) or reversed axes (F) are read")


def _bytes_codec(codec: dict[str, Any], fld: str) -> Codec:
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    import numcodecs  # here, not with the module: reading a 2022 layout builds no v3 chain

    name, cfg = _name(codec), _config(codec)
    try:
        if name == "gzip":
            return numcodecs.GZip(level=int(cfg.get("level", 5)))
        if name == "zstd":
            return numcodecs.Zstd(level=int(cfg.get("level", 0)))
        if name == "blosc":
            shuffle = cfg.get("shuffle", "noshuffle")
            return numcodecs.Blosc(
                cname=cfg.get("cname", "lz4"), clevel=int(cfg.get("clevel", 5)),
                shuffle=_BLOSC_SHUFFLE[shuffle], blocksize=int(cfg.get("blocksize", 0) or 0),
            )
        if name == "crc32c":
            return numcodecs.CRC32C()
    except (KeyError, TypeError, ValueError) as e:
        raise _Unmappable(fld, f"{name} configuration {cfg} cannot be read ({type(e).__name__}: {e})") from None
    raise _Unmappable(fld, f"codec {name!r} is not one open_draft reads (bytes->bytes: gzip, zstd, blosc, crc32c)")


def _chain(codecs: Any, fld: str, ndim: int, *, nested: bool) -> _Chain:
    if not isinstance(codecs, list):
        raise _Unmappable(fld, "expected a list of codecs")
    perms: list[list[int]] = []
    i = 0
    while i < len(codecs) and _name(codecs[i]) == "transpose":
        order = _config(codecs[i]).get("order")
        if not isinstance(order, list):
            raise _Unmappable(f"{fld}[{i}].configuration.order", f"expected a permutation, got {order!r}")
        perms.append(order)
        i += 1
    if i >= len(codecs):
        raise _Unmappable(fld, "no array->bytes codec")
    ab = codecs[i]
    at = f"{fld}[{i}]"
    rest = codecs[i + 1 :]
    if _name(ab) == "sharding_indexed":
        if nested:
            raise _Unmappable(at, "nested sharding_indexed")
        if perms:
            raise _Unmappable(f"{fld}[0]", "a transpose before sharding_indexed")
        if rest:
            raise _Unmappable(f"{fld}[{i + 1}]", f"codec {_name(rest[0])!r} after sharding_indexed (applied to whole shards)")
        return _Chain("C", None, None, (), sharding=_config(ab))
    if _name(ab) != "bytes":
        raise _Unmappable(at, f"array->bytes codec {_name(ab)!r} is not one open_draft reads (bytes, sharding_indexed)")
    endian = _config(ab).get("endian")
    if endian not in (None, "little", "big"):
        raise _Unmappable(f"{at}.configuration.endian", f"expected 'little' or 'big', got {endian!r}")
    order = _permutation_order(perms, ndim, f"{fld}[0].configuration.order")
    b2b = [_bytes_codec(c, f"{fld}[{i + 1 + j}]") for j, c in enumerate(rest)]
    compressor = b2b[-1] if b2b else None
    return _Chain(order, endian, compressor, tuple(b2b[:-1]))


def _index(config: dict[str, Any], fld: str) -> tuple[Literal["start", "end"], bool]:
    """``(index_location, checksum)`` of a declared ``index_codecs``."""
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise _Unmappable(f"{fld}.index_location", f"expected 'start' or 'end', got {location!r}")
    codecs = config.get("index_codecs")
    names = [_name(c) for c in codecs] if isinstance(codecs, list) else None
    if names not in (["bytes"], ["bytes", "crc32c"]) or codecs is None or _config(codecs[0]).get("endian", "little") != "little":
        raise _Unmappable(
            f"{fld}.index_codecs",
            f"{codecs} is not an index open_draft reads ([bytes little] or [bytes little, crc32c])",
        )
    return location, names == ["bytes", "crc32c"]


def _regular_shape(value: Any, fld: str, ndim: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != ndim or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
    ):
        raise _Unmappable(fld, f"expected {ndim} integers >= 1, got {value!r}")
    return tuple(value)


def layout_from_v3(document: dict[str, Any], path: str, *, key: str, hidden_checksum: bool | None = False) -> V3ArrayMeta:
    """The final-v3 array ``document`` of the node at ``path`` (its ``zarr.json`` is ``key``)
    as a :class:`V3ArrayMeta`. ``hidden_checksum``: :attr:`meta2023.Normalised.hidden_checksum`
    (None: the outer index codecs are undeclared, each shard's bytes decide). Refuses what it
    cannot map with :class:`DraftMetadataError` (see the module docstring)."""
    try:
        return _layout(document, path, key, hidden_checksum)
    except _Unmappable as e:
        raise _refuse(key, e.fld, e.message) from None


def _layout(doc: dict[str, Any], path: str, key: str, hidden_checksum: bool | None) -> V3ArrayMeta:
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    shape = doc.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise _Unmappable("shape", f"expected a list of integers >= 0, got {shape!r}")
    ndim = len(shape)
    grid = doc.get("chunk_grid") or {}
    if _name(grid) != "regular":
        raise _Unmappable("chunk_grid.name", f"{_name(grid)!r}: only 'regular' is read")
    grid_shape = _regular_shape(_config(grid).get("chunk_shape"), "chunk_grid.configuration.chunk_shape", ndim)
    cke = doc.get("chunk_key_encoding") or {}
    encoding = _name(cke)
    if encoding not in ("default", "v2"):
        raise _Unmappable("chunk_key_encoding.name", f"{encoding!r}: only 'default' and 'v2' are read")
    separator = _config(cke).get("separator", "/" if encoding == "default" else ".")
    if separator not in ("/", "."):
        raise _Unmappable("chunk_key_encoding.configuration.separator", f"expected '/' or '.', got {separator!r}")
    data_type = doc.get("data_type")
    if data_type not in V3_CORE_DTYPES:
        raise _Unmappable("data_type", f"{data_type!r} is not a data type open_draft reads ({', '.join(V3_CORE_DTYPES)})")

    outer = _chain(doc.get("codecs"), "codecs", ndim, nested=False)
    chain, chunks, cps = outer, grid_shape, None
    location: Literal["start", "end"] = "end"
    checksum: bool | None = False
    if outer.sharding is not None:
        cfg = outer.sharding
        fld = "codecs[0].configuration"
        chunks = _regular_shape(cfg.get("chunk_shape"), f"{fld}.chunk_shape", ndim)
        if any(g % c for g, c in zip(grid_shape, chunks)):
            raise _Unmappable(f"{fld}.chunk_shape", f"{list(chunks)} does not divide the shard shape {list(grid_shape)}")
        cps = tuple(g // c for g, c in zip(grid_shape, chunks))
        chain = _chain(cfg.get("codecs"), f"{fld}.codecs", ndim, nested=True)
        if hidden_checksum is None:
            location = cfg.get("index_location", "end")
            if location != "end":
                raise _Unmappable(f"{fld}.index_location", "an undeclared index must be at the end (a tail read decides it)")
            checksum = None
        else:
            location, checksum = _index(cfg, fld)
    n = math.prod(chunks)
    if n > MAX_CHUNK_ELEMENTS:
        raise _Unmappable("chunk_shape", f"{list(chunks)} has {n} elements per chunk (limit 2**32)")

    base = np.dtype(V3_CORE_DTYPES[data_type])
    if base.itemsize > 1:
        base = base.newbyteorder(">" if chain.endian == "big" else "<")
    if "fill_value" not in doc:
        raise _Unmappable("fill_value", "missing")
    try:
        if doc["fill_value"] is None:
            raise ValueError("v3 requires a fill value")
        fill = decode_fill_value(doc["fill_value"], base)
    except (ValueError, OverflowError) as e:
        raise _Unmappable("fill_value", f"{doc['fill_value']!r} does not fit {data_type}: {e}") from None
    attributes = doc.get("attributes") or {}
    return V3ArrayMeta(
        path=path,
        shape=tuple(shape),
        chunks=chunks,
        dtype=base,
        fill_value=fill,
        order=chain.order,
        separator=separator,
        compressor=chain.compressor,
        filters=chain.filters,
        chunks_per_shard=cps,
        attributes=dict(attributes),
        raw=doc,
        key_encoding="default" if encoding == "default" else "v2",
        index_location=location,
        index_checksum=checksum,
        node_key=key,
    )


# --------------------------------------------------------------------------- the copy driver's view


def geometry_from_v3(document: dict[str, Any], path: str, *, key: str, reason: str,
                     hidden_checksum: bool | None = False) -> V3ArrayMeta:
    """A valid final-v3 array whose codec chain our reader cannot decode (``reason``: why,
    e.g. nested sharding, a transpose of other axes, a codec after ``sharding_indexed``) as
    what a copy needs: its shape, grid, key encoding and, where the shard index is readable
    (``sharding_indexed`` is the one codec), chunks per shard and index layout. ``opaque``
    holds ``reason``: payloads are never decoded, objects are copied as they are. A shard
    whose index is inside an encoded object is one opaque object (``chunks_per_shard`` None)."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    shape = [int(s) for s in document["shape"]]
    grid = tuple(int(g) for g in _config(document["chunk_grid"])["chunk_shape"])
    cke = document["chunk_key_encoding"]
    encoding: KeyEncoding = "v2" if _name(cke) == "v2" else "default"
    codecs = document.get("codecs") or []
    chunks, cps = grid, None
    location: Literal["start", "end"] = "end"
    checksum: bool | None = False
    if len(codecs) == 1 and _name(codecs[0]) == "sharding_indexed":
        cfg = _config(codecs[0])
        chunks = tuple(int(c) for c in cfg["chunk_shape"])
        cps = tuple(g // c for g, c in zip(grid, chunks))
        try:
            location, checksum = _index(cfg, "codecs[0].configuration")
        except _Unmappable:
            if hidden_checksum is not None:  # an index we cannot read: the objects stay opaque
                chunks, cps = grid, None
        if hidden_checksum is None and cps is not None:
            location, checksum = "end", None
    if hidden_checksum is None and (cps is None or location != "end" or
                                    _config(codecs[0]).get("index_location", "end") != "end"):
        raise DraftMetadataError(f"{key}: an undeclared shard index must be at the end of the shard, with "
                                 "sharding_indexed the one codec, to be decided from the bytes", key=key)
    return V3ArrayMeta(
        path=path, shape=tuple(shape), chunks=chunks, dtype=np.dtype("u1"), fill_value=None, order="C",
        separator=_config(cke).get("separator", "/" if encoding == "default" else "."), compressor=None,
        filters=(), chunks_per_shard=cps, attributes=dict(document.get("attributes") or {}), raw=document,
        key_encoding=encoding, index_location=location, index_checksum=checksum, node_key=key, opaque=reason,
    )


def decided(meta: V3ArrayMeta, hidden: bool) -> V3ArrayMeta:
    """``meta`` with its undeclared shard index decided from the shards' bytes: ``hidden``
    zarrita's CRC32C follows each index (declared now), else a plain index."""
    doc: dict[str, Any] = json.loads(json.dumps(meta.raw))
    if hidden:
        cfg = _config(doc["codecs"][0])
        cfg["index_codecs"] = [*cfg.get("index_codecs", [_INDEX_BYTES]), {"name": "crc32c"}]
    return replace(meta, index_checksum=hidden, raw=doc)


_INDEX_BYTES: dict[str, Any] = {"name": "bytes", "configuration": {"endian": "little"}}


def final_document(meta: V3ArrayMeta, *, chunks_per_shard: tuple[int, ...] | None, checksum: bool,
                   location: Literal["start", "end"], inner: list[dict[str, Any]] | None = None,
                   dimension_names: list[str | None] | None = None) -> dict[str, Any]:
    """The document a copy of this v3 array writes: its own (``meta.raw``, final spelling)
    with only what the copy changes respelled: the chunks per shard (``None``: unsharded),
    the shard index (CRC32C ``checksum``, ``location``), the inner codecs (``inner``: the
    re-encoded chain of ``--portable``; None keeps them) and given ``dimension_names``."""
    doc: dict[str, Any] = json.loads(json.dumps(meta.raw))
    codecs = doc.get("codecs") or []
    sharding = _config(codecs[0]) if meta.chunks_per_shard is not None else None
    if chunks_per_shard == meta.chunks_per_shard and inner is None:
        if sharding is not None and (checksum, location) != (meta.index_checksum, meta.index_location):
            sharding["index_codecs"] = [_INDEX_BYTES, {"name": "crc32c"}] if checksum else [_INDEX_BYTES]
            sharding["index_location"] = location
    else:
        chain = inner if inner is not None else (sharding["codecs"] if sharding is not None else codecs)
        grid = list(meta.chunks)
        doc["codecs"] = chain
        if chunks_per_shard is not None:
            grid = [c * k for c, k in zip(meta.chunks, chunks_per_shard)]
            doc["codecs"] = [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(meta.chunks), "codecs": chain,
                "index_codecs": [_INDEX_BYTES, {"name": "crc32c"}] if checksum else [_INDEX_BYTES],
                "index_location": location}}]
        doc["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": grid}}
    if dimension_names is not None:
        doc["dimension_names"] = list(dimension_names)
    return doc
