"""The draft-era (2022) Zarr v3 metadata model: parse, validate and re-encode.

Pure functions, no I/O. Parsing accepts every spelling real writers put on disk
(zarr-python 2.14-2.18, acquire, spec drafts; see DRAFT-FORMAT.md) and rejects
anything else with a :class:`DraftMetadataError` that names the key and the field.
Encoding reproduces zarr-python 2.18's ``Metadata3`` byte for byte, so a store we
rewrite is indistinguishable from one the legacy library wrote.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast

if TYPE_CHECKING:
    import numpy as np

from .. import _numcodecs_adapter
from ..errors import DraftMetadataError
from .fill_value import NOT_PLAIN, PlainType, decode_fill_value, encode_fill_value, plain_fill, plain_type

if TYPE_CHECKING:
    from numcodecs.abc import Codec

__all__ = [
    "ENTRY_POINT_KEY",
    "DRAFT_PROTOCOL",
    "SHARDING_EXTENSION",
    "CONSOLIDATED_KEY",
    "EntryPoint",
    "parse_entry_point",
    "encode_entry_point",
    "array_meta_key",
    "group_meta_key",
    "data_prefix",
    "normalize_path",
    "path_from_meta_key",
    "DraftArrayMeta",
    "parse_array_metadata",
    "encode_array_metadata",
    "DraftArraySpec",
    "draft_array_document",
    "parse_group_metadata",
    "encode_group_metadata",
    "parse_consolidated",
    "parse_chunks_per_shard",
    "find_sharding_transformer",
]

ENTRY_POINT_KEY = "zarr.json"
DRAFT_PROTOCOL = "https://purl.org/zarr/spec/protocol/core/3.0"
SHARDING_EXTENSION = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
#: Draft consolidated metadata; lives under ``meta/root`` but is not a node.
CONSOLIDATED_KEY = "meta/root/consolidated/.zmetadata"

META_ROOT = "meta/root"
DATA_ROOT = "data/root"
CODEC_URI_PREFIX = "https://purl.org/zarr/spec/codec/"
DRAFT_COMPRESSORS = ("gzip", "zlib", "blosc", "bz2", "lz4", "lzma", "zstd")

# Every URI/name under which the sharding transformer was published (DRAFT-FORMAT.md).
_SHARDING_EXTENSION_SPELLINGS = (
    SHARDING_EXTENSION,  # 1: zarr-python 2.x, acquire
    "https://purl.org/zarr/spec/extensions/storage_transformers/sharding/1.0",  # 4: late 2022
    "sharding",  # 5: Feb 2023
)

# Bounds that keep hostile metadata from making readers allocate absurd buffers.
MAX_CHUNKS_PER_SHARD = 2**32
MAX_SHARD_INDEX_BYTES = 2**30
MAX_CHUNK_ELEMENTS = 2**32
MAX_EXTENT = 2**63 - 1
#: Deepest nesting of JSON containers a metadata document may have (the document itself is
#: level 1). Python's json parser, encoder and ``==`` recurse once per level against the
#: interpreter's recursion limit (1000 frames in all, whatever the caller already uses), so a
#: document accepted here must leave room for every later step (our encoders, zarr-python 3
#: re-reading the migrated ``zarr.json`` from a deep asyncio stack). Deeper documents are
#: damaged (``DraftMetadataError``), not a crash.
MAX_JSON_DEPTH = 640

_LEGAL_PATH = re.compile(r"[A-Za-z0-9._\-]+")
#: the characters of a legal node name (one path segment; also not ``.``, ``..`` or empty)
LEGAL_NAME = _LEGAL_PATH

# Extension URLs zarr-python 2.18 writes for non-core data types (zarr/meta.py).
_EXT_COMPLEX = (
    "https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/"
    "extensions/complex-dtypes/v1.0.html"
)
_EXT_DATETIME = "https://zarr-specs.readthedocs.io/en/latest/extensions/data-types/datetime/v1.0.html"
_EXT_BYTES = "TODO: bytestring array protocol URL"
_EXT_UNICODE = "TODO: unicode array protocol URL"
_EXT_STRUCTURED = "TODO: structured array protocol URL"
_CORE_DTYPES = frozenset(
    {"bool", "i1", "u1"} | {f"{e}{k}{n}" for e in "<>" for k in "uif" for n in "248"}
)


def _error(key: str, fld: str | None, message: str) -> DraftMetadataError:
    where = f"{key}: field '{fld}'" if fld else key
    return DraftMetadataError(f"{where}: {message}", key=key)


def _json_dumps(obj: Any) -> bytes:
    """zarr-python 2.18's ``json_dumps`` (sorted keys, indent 4, ASCII)."""
    return json.dumps(
        obj, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": ")
    ).encode("ascii")


def _json_copy(value: Any, key: str) -> Any:
    """A copy of a JSON value (dicts and lists copied, leaves shared), without recursion,
    refusing nesting deeper than :data:`MAX_JSON_DEPTH`. Used instead of ``copy.deepcopy``,
    which recurses twice per level (a 500-deep attribute would raise ``RecursionError``)."""

    def shell(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {}
        if isinstance(v, (list, tuple)):
            return []
        return v

    root = shell(value)
    stack: list[tuple[Any, Any, int]] = [(value, root, 1)] if root is not value else []
    while stack:
        src, dst, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _error(key, None, f"nested deeper than {MAX_JSON_DEPTH} levels")
        items = src.items() if isinstance(src, Mapping) else enumerate(src)
        for k, v in items:
            child = shell(v)
            if isinstance(dst, dict):
                dst[k] = child
            else:
                dst.append(child)
            if child is not v:
                stack.append((v, child, depth + 1))
    return root


def json_depth(value: Any, limit: int | None = None) -> int:
    """How deeply lists and dicts nest in ``value`` (a scalar: 0), level by level, without
    recursion; stops counting past ``limit``. About half of ``json.loads``'s time."""
    depth = 0
    level = [value] if isinstance(value, (dict, list, tuple)) else []
    while level and (limit is None or depth <= limit):
        depth += 1
        deeper = []
        for v in level:
            for child in v.values() if isinstance(v, dict) else v:
                if isinstance(child, (dict, list, tuple)):
                    deeper.append(child)
        level = deeper
    return depth


def json_object(raw: bytes | str) -> dict[str, Any] | None:
    """The JSON object ``raw`` holds; None when it is not JSON (or nests past the recursion
    limit) or holds another JSON value. For the tool's own small files (records, reference
    files), which callers refuse with their own words."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _load_document(raw: bytes | str | Mapping[str, Any], key: str) -> dict[str, Any]:
    """Parse a JSON object document (or copy an already-parsed mapping); nesting deeper than
    :data:`MAX_JSON_DEPTH` is refused, so no later step can hit the recursion limit."""
    if isinstance(raw, Mapping):
        copied: dict[str, Any] = _json_copy(dict(raw), key)
        return copied
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _error(key, None, f"document is not UTF-8 text ({e.reason})") from None
    if not isinstance(raw, str):
        raise _error(key, None, f"expected JSON bytes/str or a mapping, got {type(raw).__name__}")
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise _error(key, None, f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:
        raise _error(key, None, f"invalid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise _error(key, None, f"document is not a JSON object (got {type(doc).__name__})")
    # every level opens a bracket: most documents are too short to need the walk
    if raw.count("{") + raw.count("[") > MAX_JSON_DEPTH and json_depth(doc, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise _error(key, None, f"nested deeper than {MAX_JSON_DEPTH} levels")
    return doc


def _text(value: Any, limit: int = 80) -> str:
    """A value for an error message, as JSON, cut to ``limit`` characters; never raises
    (an integer beyond Python's 4300-digit str limit, or a non-JSON object)."""
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, TypeError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text[:limit]


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_tuple(v: Iterable[Any] | int, n: int = 1) -> tuple[Any, ...]:
    """``(v,) * n`` for an integer (not a bool), else ``tuple(v)``."""
    if _is_int(v):
        return (v,) * n
    return tuple(cast("Iterable[Any]", v))


def _int_list(value: Any, key: str, fld: str, *, minimum: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _error(key, fld, f"expected a list of integers, got {_text(value)}")
    for v in value:
        if not _is_int(v):
            raise _error(key, fld, f"not an integer: {_text(v)}")
        if v < minimum:
            what = "negative extent" if minimum == 0 else "non-positive extent"
            raise _error(key, fld, f"{what} {v}")
        if v > MAX_EXTENT:
            raise _error(key, fld, f"extent {_short(v)} exceeds 2**63-1")
    return tuple(value)


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class EntryPoint:
    """The ``zarr.json`` entry point; only the key suffix affects how we read."""

    metadata_key_suffix: str = ".json"
    raw: dict[str, Any] = field(
        default_factory=lambda: {
            "extensions": [],
            "metadata_encoding": DRAFT_PROTOCOL,
            "metadata_key_suffix": ".json",
            "zarr_format": DRAFT_PROTOCOL,
        }
    )


def parse_entry_point(raw: bytes | str | dict[str, Any], key: str = ENTRY_POINT_KEY) -> EntryPoint:
    """Validate a draft entry point; a v1.0 ``zarr.json`` (``zarr_format: 3``) is refused."""
    doc = _load_document(raw, key)
    fmt = doc.get("zarr_format")
    if fmt != DRAFT_PROTOCOL:
        raise _error(
            key, "zarr_format", f"expected {DRAFT_PROTOCOL!r} (a draft-era hierarchy), got {fmt!r}"
        )
    enc = doc.get("metadata_encoding", DRAFT_PROTOCOL)
    if enc != DRAFT_PROTOCOL:
        raise _error(key, "metadata_encoding", f"unsupported metadata encoding {enc!r}")
    suffix = doc.get("metadata_key_suffix", ".json")
    if not isinstance(suffix, str) or not _LEGAL_PATH.fullmatch(suffix):
        raise _error(key, "metadata_key_suffix", f"expected a non-empty key suffix, got {suffix!r}")
    if not isinstance(doc.get("extensions", []), list):
        raise _error(key, "extensions", "expected a list")
    return EntryPoint(metadata_key_suffix=suffix, raw=doc)


def encode_entry_point(ep: EntryPoint | None = None) -> bytes:
    """The entry point exactly as zarr 2.18's ``encode_hierarchy_metadata`` writes it."""
    ep = ep or EntryPoint()
    return _json_dumps(
        {
            "extensions": ep.raw.get("extensions", []),
            "metadata_encoding": DRAFT_PROTOCOL,
            "metadata_key_suffix": ep.metadata_key_suffix,
            "zarr_format": DRAFT_PROTOCOL,
        }
    )


def escape_name(text: str) -> str:
    """A node name, path or key as we print it: as it is when every character is printable and
    none is a backslash or a double quote, else as a quoted JSON string with every such character
    escaped (``"a\\nb"``), so a name can never forge a line or drive the terminal."""
    if text.isprintable() and "\\" not in text and '"' not in text:
        return text
    return json.dumps(text, ensure_ascii=True)


def normalize_path(path: str) -> str:
    """Strip outer slashes and refuse anything zarr-python 2.x could not have written."""
    if not isinstance(path, str):
        raise DraftMetadataError(f"node path must be a string, got {type(path).__name__}")
    stripped = path.strip("/")
    if not stripped:
        return ""
    for segment in stripped.split("/"):
        if segment == "":
            raise DraftMetadataError(f"node path {path!r}: empty path segment", key=path)
        if segment in (".", ".."):
            raise DraftMetadataError(f"node path {path!r}: segment {segment!r} not allowed", key=path)
        if not _LEGAL_PATH.fullmatch(segment):
            bad = sorted(set(re.sub(r"[A-Za-z0-9._\-]", "", segment)))
            raise DraftMetadataError(
                f"node path {path!r}: illegal character{'' if len(bad) == 1 else 's'} {''.join(bad)!r} "
                "(allowed: A-Za-z0-9 . - _ /)",
                key=path,
            )
    return stripped


def _meta_key(path: str, kind: str, suffix: str) -> str:
    path = normalize_path(path)
    return f"{META_ROOT}/{path}.{kind}{suffix}" if path else f"{META_ROOT}.{kind}{suffix}"


def array_meta_key(path: str, suffix: str = ".json") -> str:
    """``""`` -> ``meta/root.array.json``; ``"a/b"`` -> ``meta/root/a/b.array.json``."""
    return _meta_key(path, "array", suffix)


def group_meta_key(path: str, suffix: str = ".json") -> str:
    """``""`` -> ``meta/root.group.json``; ``"a/b"`` -> ``meta/root/a/b.group.json``."""
    return _meta_key(path, "group", suffix)


def data_prefix(path: str) -> str:
    """Prefix of an array's chunk/shard keys: ``data/root/`` or ``data/root/a/b/``."""
    path = normalize_path(path)
    return f"{DATA_ROOT}/{path}/" if path else f"{DATA_ROOT}/"


def path_from_meta_key(
    key: str, suffix: str = ".json"
) -> tuple[str, Literal["array", "group"]] | None:
    """Inverse of :func:`array_meta_key`/:func:`group_meta_key`; None for non-node keys.

    A node-shaped key whose path is illegal (``..``, bad characters) raises, so that
    hostile keys are reported rather than silently skipped.
    """
    if key == CONSOLIDATED_KEY:
        return None
    for kind in ("array", "group"):
        tail = f".{kind}{suffix}"
        if not key.endswith(tail):
            continue
        stem = key[: -len(tail)]
        if stem == META_ROOT:
            return "", kind
        if stem.startswith(META_ROOT + "/") and len(stem) > len(META_ROOT) + 1:
            path = stem[len(META_ROOT) + 1 :]
            try:
                ok = path == normalize_path(path)
            except DraftMetadataError as e:
                raise DraftMetadataError(f"{key}: malformed node path: {e}", key=key) from None
            if not ok:
                raise DraftMetadataError(f"{key}: malformed node path {path!r}", key=key)
            return path, kind
    return None


# --------------------------------------------------------------------------- dtypes


def _decode_descr(d: Any) -> Any:
    """zarr 2's list-of-lists descr -> numpy's list-of-tuples (recursively)."""
    if isinstance(d, list):
        out = []
        for item in d:
            if not isinstance(item, list) or len(item) not in (2, 3):
                raise ValueError(f"bad structured field {item!r}")
            name, sub, *shape = item
            if not isinstance(name, str):
                raise ValueError(f"bad field name {name!r}")
            out.append((name, _decode_descr(sub), *(tuple(s) if isinstance(s, list) else s for s in shape)))
        return out
    if not isinstance(d, str):
        raise ValueError(f"expected a type string, got {d!r}")
    return d


def _check_dtype(dtype: np.dtype) -> None:
    """Raise ValueError for types zarr 2.18 could not have stored."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    if dtype.hasobject:
        raise ValueError("object data type (|O) is not supported: its chunks need an object codec")
    if dtype.subdtype is not None:
        raise ValueError(f"sub-array data type {dtype} is not allowed at the top level")
    if dtype.fields is not None:
        for sub, *_offset in dtype.fields.values():
            _check_dtype(sub.base)
        return
    kind = dtype.kind
    if kind in "mM" and np.datetime_data(dtype)[0] == "generic":
        raise ValueError(f"{dtype.str}: datetime/timedelta without a unit")
    if kind in "SUV" and dtype.itemsize == 0:
        raise ValueError(f"{dtype.str}: zero-length data type")
    if kind == "f" and dtype.itemsize not in (2, 4, 8):
        raise ValueError(f"{dtype.str}: unsupported float width")
    if kind == "c" and dtype.itemsize not in (8, 16):
        raise ValueError(f"{dtype.str}: unsupported complex width")
    if kind not in "biufcmMSUV":
        raise ValueError(f"unsupported data type {dtype.str}")


def _parse_dtype(value: Any, key: str) -> np.dtype:
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    spec = value
    if isinstance(value, dict):
        if "type" not in value:
            raise _error(key, "data_type", "extension data type object has no 'type'")
        spec = value["type"]
    try:
        dtype: np.dtype[Any] = np.dtype(_decode_descr(spec))
        _check_dtype(dtype)
    except DraftMetadataError:
        raise
    except Exception as e:  # numpy raises TypeError/ValueError/SyntaxError
        raise _error(key, "data_type", f"cannot parse {_text(value, 120)}: {e}") from None
    return dtype


def _encode_dtype(dtype: np.dtype) -> Any:
    """zarr 2.18 ``Metadata3.encode_dtype``."""
    s = dtype.str
    if s == "|b1":
        return "bool"
    if s in ("|u1", "|i1"):
        return s[1:]
    if s in _CORE_DTYPES:
        return s
    if dtype.kind == "c":
        ext, t = _EXT_COMPLEX, s
    elif dtype.kind in "mM":
        ext, t = _EXT_DATETIME, s
    elif dtype.kind == "S":
        ext, t = _EXT_BYTES, s
    elif dtype.kind == "U":
        ext, t = _EXT_UNICODE, s
    else:
        return {"extension": _EXT_STRUCTURED, "fallback": None, "type": dtype.descr}
    return {"extension": ext, "fallback": None, "type": t}


# --------------------------------------------------------------------------- fill values

def _short(v: Any) -> str:
    """A number for a message: at most 40 characters (10**400 has 401 digits)."""
    text = repr(v) if not _is_int(v) or v.bit_length() < 4000 else f"an integer of {v.bit_length()} bits"
    return text if len(text) <= 40 else f"{text[:12]}...({len(text)} digits)"


# --------------------------------------------------------------------------- codecs


def _parse_compressor(value: Any, key: str) -> Codec | KnownCompressor | None:
    if value is None:
        return None
    fld = "compressor"
    if not isinstance(value, dict) or not isinstance(value.get("codec"), str):
        raise _error(key, fld, f"expected {{'codec': URI, 'configuration': {{...}}}}, got {_text(value, 120)}")
    uri = value["codec"]
    m = re.fullmatch(re.escape(CODEC_URI_PREFIX) + r"([a-z0-9]+)/[0-9.]+", uri)
    if not m or m.group(1) not in DRAFT_COMPRESSORS:
        raise _error(key, fld, f"unknown codec {uri!r} (known: {', '.join(DRAFT_COMPRESSORS)})")
    name = m.group(1)
    config = value.get("configuration", {})
    if not isinstance(config, dict):
        raise _error(key, fld + ".configuration", "expected an object")
    known = known_compressor_config(name, config)
    if known is not None:
        return KnownCompressor(known, key)
    if name == "blosc":
        _numcodecs_adapter.load()  # numcodecs without its entry-point scan
        import numcodecs.blosc

        cname, shuffle = config.get("cname", "lz4"), config.get("shuffle", 1)
        if cname not in numcodecs.blosc.list_compressors():
            raise _error(key, fld, f"blosc: unknown cname {cname!r}")
        if shuffle not in (-1, 0, 1, 2) or isinstance(shuffle, bool):
            raise _error(key, fld, f"blosc: shuffle must be -1, 0, 1 or 2, got {shuffle!r}")
    return _make_codec({**config, "id": name}, key, fld)


#: The compressors a draft document usually names, by the parameters numcodecs' class takes
#: (in the order its ``get_config()`` lists them), each with its default and the values taken
#: here without building the codec: a SUBSET of what numcodecs accepts, chosen so that
#: numcodecs builds the codec, returns exactly this configuration from ``get_config()`` and
#: encodes a chunk with it (``tests/unit/formats/test_known_compressors.py`` checks all three
#: against numcodecs). Any other configuration builds numcodecs' codec, as it always did.
_INT = int
KNOWN_COMPRESSORS: dict[str, tuple[tuple[str, Any, type, Any], ...]] = {
    "zstd": (("level", 0, _INT, range(-(2**17), 23)), ("checksum", False, bool, (False, True))),
    "lz4": (("acceleration", 1, _INT, range(1, 2**16)),),
    "blosc": (
        ("cname", "lz4", str, ("blosclz", "lz4", "lz4hc", "zlib", "zstd")),  # always compiled in
        ("clevel", 5, _INT, range(0, 10)),
        ("shuffle", 1, _INT, range(-1, 3)),
        ("blocksize", 0, _INT, range(0, 2**31)),
    ),
    "gzip": (("level", 1, _INT, range(0, 10)),),
    "zlib": (("level", 1, _INT, range(0, 10)),),
}


def known_compressor_config(name: str, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """numcodecs' ``get_config()`` of the codec ``{**config, "id": name}`` builds, when
    :data:`KNOWN_COMPRESSORS` vouches for it without numcodecs; else None."""
    params = KNOWN_COMPRESSORS.get(name)
    if params is None or not all(k == "id" or any(k == p[0] for p in params) for k in config):
        return None
    out: dict[str, Any] = {"id": name}
    for param, default, kind, allowed in params:
        value = config.get(param, default)
        if type(value) is not kind or value not in allowed:
            return None
        out[param] = value
    return out


@dataclass(frozen=True)
class KnownCompressor:
    """A draft compressor of :data:`KNOWN_COMPRESSORS`, kept as its configuration until
    something needs numcodecs' codec object (:class:`_LazyCompressor`)."""

    config: dict[str, Any]  # numcodecs' get_config(), "id" first
    key: str

    def build(self) -> Codec:
        return _make_codec(dict(self.config), self.key, "compressor")


@dataclass(frozen=True)
class PlainFill:
    """A fill value of a :class:`~sharding_store.formats.fill_value.PlainType`, kept as its
    JSON (and :func:`~sharding_store.formats.fill_value.plain_fill`'s value) until something
    needs numpy's scalar, which :func:`decode_fill_value` then makes as it always did."""

    json: Any
    value: Any  # plain_fill(json): bool, int, float, (real, imag) or None


class _BuiltOnRead:
    """A field of :class:`DraftArrayMeta` that may be stored unbuilt: a ``KnownCompressor``,
    a ``PlainType`` or a ``PlainFill``, from which numcodecs' codec, numpy's dtype or numpy's
    scalar is made on first read (so a command that only translates documents imports
    neither). The description stays readable without building (:func:`stored`). No class
    default: the dataclass field stays required."""

    _lock = threading.RLock()  # building a fill value reads the dtype

    def __init__(self, name: str) -> None:
        self.slot, self.cache = f"_{name}", f"_{name}_built"

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            raise AttributeError(self.slot[1:])
        d = obj.__dict__
        value = d[self.slot]
        if not isinstance(value, (KnownCompressor, PlainType, PlainFill)):
            return value
        with self._lock:
            if self.cache not in d:
                d[self.cache] = _build(value, obj)
            return d[self.cache]

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.slot] = value
        obj.__dict__.pop(self.cache, None)


def _build(value: KnownCompressor | PlainType | PlainFill, meta: DraftArrayMeta) -> Any:
    if isinstance(value, KnownCompressor):
        return value.build()
    if isinstance(value, PlainType):
        return value.dtype()
    return decode_fill_value(value.json, meta.dtype)


def stored(meta: DraftArrayMeta) -> dict[str, Any]:
    """``meta``'s compressor, data type and fill value as stored (unbuilt ones stay
    descriptions): for ``replace(meta, **stored(meta), ...)``, which would build them."""
    return {name: meta.__dict__[f"_{name}"] for name in _BUILT_ON_READ}


def plain_type_of(meta: DraftArrayMeta) -> PlainType | None:
    """``meta``'s data type as a :class:`PlainType` (described without numpy), or None."""
    value = meta.__dict__["_dtype"]
    return value if isinstance(value, PlainType) else None


def plain_fill_of(meta: DraftArrayMeta) -> PlainFill | None:
    """``meta``'s fill value as a :class:`PlainFill` (decoded without numpy), or None."""
    value = meta.__dict__["_fill_value"]
    return value if isinstance(value, PlainFill) else None


def known_compressor(meta: DraftArrayMeta) -> dict[str, Any] | None:
    """The configuration (numcodecs' ``get_config()``) of ``meta``'s compressor when it is
    one of :data:`KNOWN_COMPRESSORS` whose codec was not needed yet; None otherwise."""
    value = stored_compressor(meta)
    return dict(value.config) if isinstance(value, KnownCompressor) else None


def stored_compressor(meta: DraftArrayMeta) -> Codec | KnownCompressor | None:
    """``meta``'s compressor as stored: a known one not built yet stays a :class:`KnownCompressor`
    (for ``replace(meta, compressor=...)`` and the checks below, which need no codec object)."""
    value: Codec | KnownCompressor | None = stored(meta)["compressor"]
    return value


def has_a_compressor(meta: DraftArrayMeta) -> bool:
    """``meta.compressor is not None``, without building a known compressor."""
    return stored_compressor(meta) is not None


def compressor_id(meta: DraftArrayMeta) -> str | None:
    """``meta.compressor.codec_id`` (None without one), without building a known compressor."""
    value = stored_compressor(meta)
    if isinstance(value, KnownCompressor):
        return str(value.config["id"])
    return None if value is None else str(value.codec_id)


def _make_codec(config: dict[str, Any], key: str, fld: str) -> Codec:
    """numcodecs' codec object (numcodecs is imported here, on the first codec parsed, not
    with this module)."""
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    import numcodecs

    try:
        return numcodecs.get_codec(dict(config))
    except Exception as e:  # unknown id, bad keyword arguments, bad values
        raise _error(key, fld, f"invalid codec configuration {_text(config, 120)}: {e}") from None


def _codec_config(codec: Codec) -> dict[str, Any]:
    config: dict[str, Any] = codec.get_config()
    config.pop("id", None)
    return config


def _encode_compressor(codec: Codec) -> dict[str, Any]:
    """zarr 2.18 ``Metadata3._encode_codec_metadata``."""
    if codec.codec_id not in DRAFT_COMPRESSORS:
        raise DraftMetadataError(
            f"compressor {codec.codec_id!r} cannot be stored in draft metadata "
            f"(known: {', '.join(DRAFT_COMPRESSORS)})"
        )
    return {"codec": f"{CODEC_URI_PREFIX}{codec.codec_id}/1.0", "configuration": _codec_config(codec)}


def _parse_filters(value: Any, key: str) -> tuple[Codec, ...]:
    fld = "attributes.filters"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _error(key, fld, "expected a list of numcodecs configurations")
    out = []
    for i, cfg in enumerate(value):
        if not isinstance(cfg, dict) or not isinstance(cfg.get("id"), str):
            raise _error(key, f"{fld}[{i}]", "expected a numcodecs configuration with an 'id'")
        out.append(_make_codec(cfg, key, f"{fld}[{i}]"))
    return tuple(out)


# --------------------------------------------------------------------------- sharding


def parse_chunks_per_shard(value: Any, ndim: int, key: str) -> tuple[int, ...]:
    """Normalise a draft ``chunks_per_shard`` to exactly ``ndim`` entries.

    Like zarr-python 2.18: an int n means ``(n,)``, a shorter list is padded with 1s on
    the right (so an int is *not* repeated over all dimensions), extra trailing 1s
    are dropped (a 0-d array is written with ``[1]``).
    """
    fld = "storage_transformers.configuration.chunks_per_shard"
    if _is_int(value):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise _error(key, fld, f"expected an integer or a list of integers, got {_text(value)}")
    for v in value:
        if not _is_int(v):
            raise _error(key, fld, f"not an integer: {v!r}")
        if v <= 0:
            raise _error(key, fld, f"non-positive entry {v}")
    cps = tuple(int(v) for v in value)
    if len(cps) > ndim:
        if any(v != 1 for v in cps[ndim:]):
            raise _error(key, fld, f"{list(cps)} has more than ndim={ndim} entries")
        cps = cps[:ndim]
    cps = cps + (1,) * (ndim - len(cps))
    n = math.prod(cps)
    if n > MAX_CHUNKS_PER_SHARD:
        raise _error(key, fld, f"{list(cps)} means {n} inner chunks per shard (limit 2**32)")
    if 16 * n > MAX_SHARD_INDEX_BYTES:
        raise _error(
            key, fld, f"{list(cps)} needs a {16 * n}-byte shard index (limit {MAX_SHARD_INDEX_BYTES} bytes)"
        )
    return cps


def _sharding_config(entry: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The configuration of a sharding transformer entry in any spelling, else None."""
    ext = entry.get("extension")
    name = entry.get("name")
    st = entry.get("storage_transformer")
    config = entry.get("configuration", {})
    if not isinstance(config, dict):
        raise _error(key, "storage_transformers.configuration", "expected an object")
    if ext in _SHARDING_EXTENSION_SPELLINGS:  # spellings 1, 4, 5
        fmt = entry.get("type", "indexed")
    elif name == "sharding" and ext is None:  # spelling 2
        fmt = config.get("format", "indexed")
    elif st == SHARDING_EXTENSION:  # spelling 3
        fmt = config.get("format", "indexed")
    else:
        return None
    if fmt != "indexed":
        raise _error(key, "storage_transformers", f"unsupported sharding format {fmt!r} (only 'indexed')")
    return config


def find_sharding_transformer(transformers: list[Any], key: str, ndim: int) -> tuple[int, ...] | None:
    """``chunks_per_shard`` of the sharding transformer in a ``storage_transformers`` list."""
    fld = "storage_transformers"
    if transformers is None:
        return None
    if not isinstance(transformers, list):
        raise _error(key, fld, "expected a list")
    found: tuple[int, ...] | None = None
    for entry in transformers:
        if not isinstance(entry, dict):
            raise _error(key, fld, f"expected objects, got {_text(entry)}")
        config = _sharding_config(entry, key)
        if config is None:
            ident = entry.get("extension") or entry.get("name") or entry.get("storage_transformer")
            raise _error(key, fld, f"unknown storage transformer {ident!r}")
        if found is not None:
            raise _error(key, fld, "more than one sharding transformer")
        if "chunks_per_shard" not in config:
            raise _error(key, fld + ".configuration", "missing 'chunks_per_shard'")
        found = parse_chunks_per_shard(config["chunks_per_shard"], ndim, key)
    return found


def _transformer_entry(cps: tuple[int, ...]) -> dict[str, Any]:
    """Spelling 1, as zarr-python 2.x writes it (a 0-d array gets ``[1]``)."""
    return {
        "configuration": {"chunks_per_shard": list(cps) or [1]},
        "extension": SHARDING_EXTENSION,
        "type": "indexed",
    }


# --------------------------------------------------------------------------- arrays


@dataclass(frozen=True)
class DraftArrayMeta:
    """One draft array document, validated and decoded. ``raw`` keeps the original."""

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    order: str
    separator: str
    compressor: Codec | None
    filters: tuple[Codec, ...]
    chunks_per_shard: tuple[int, ...] | None
    attributes: dict[str, Any]
    raw: dict[str, Any]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def declares_codecs(self) -> bool:
        """Whether the document declares the whole codec chain (a v3 node document does;
        a draft one may have lost its sharding transformer to zarr-python 2.x)."""
        return False

    @property
    def is_sharded(self) -> bool:
        return self.chunks_per_shard is not None

    @property
    def chunks_per_shard_or_ones(self) -> tuple[int, ...]:
        return self.chunks_per_shard if self.chunks_per_shard is not None else (1,) * self.ndim

    @property
    def n_chunks_per_shard(self) -> int:
        return math.prod(self.chunks_per_shard_or_ones)

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return tuple(c * n for c, n in zip(self.chunks, self.chunks_per_shard_or_ones))

    @property
    def chunk_grid_shape(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))

    @property
    def shard_grid_shape(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.shard_shape))

    def with_chunks_per_shard(self, cps: tuple[int, ...] | None) -> DraftArrayMeta:
        """The same array resharded (or unsharded); ``raw`` gets a spelling-1 transformer."""
        key = array_meta_key(self.path)
        if cps is not None:
            cps = parse_chunks_per_shard(list(cps), self.ndim, key)
        # only the top level changes: the rest is shared with self.raw, never mutated
        raw = {k: v for k, v in self.raw.items() if k != "storage_transformers"}
        if cps is not None:
            raw["storage_transformers"] = [_transformer_entry(cps)]
        # the compressor as stored: a known one stays unbuilt (replace() would read the field)
        return replace(self, chunks_per_shard=cps, raw=raw, **stored(self))


# installed after the dataclass is made, so the fields have no default; __init__ and replace()
# store through them (a description stays one until the object is read)
_BUILT_ON_READ = ("compressor", "dtype", "fill_value")
for _name in _BUILT_ON_READ:
    setattr(DraftArrayMeta, _name, _BuiltOnRead(_name))


def _check_chunk_bounds(chunks: tuple[int, ...], key: str) -> None:
    n = math.prod(chunks)
    if n > MAX_CHUNK_ELEMENTS:
        raise _error(key, "chunk_grid.chunk_shape", f"{list(chunks)} has {n} elements per chunk (limit 2**32)")


def _require(doc: dict[str, Any], name: str, key: str, types: type | tuple[type, ...]) -> Any:
    if name not in doc:
        raise _error(key, name, "missing")
    value = doc[name]
    if not isinstance(value, types):
        raise _error(key, name, f"wrong type {type(value).__name__}")
    return value


@dataclass(frozen=True)
class DraftArrayGeometry:
    """Just what mapping keys needs: shape, chunk grid, separator and sharding.

    Parsed without the dtype or codecs, so raw chunk access (the storage
    transformer, listing, copying) works even for arrays whose data type or
    compressor we cannot decode.
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    separator: str
    chunks_per_shard: tuple[int, ...] | None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def chunk_grid_shape(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))


def _geometry(doc: dict[str, Any], key: str, path: str | None) -> DraftArrayGeometry:
    if path is None:
        parsed = path_from_meta_key(key, key[key.rindex(".") :] if "." in key else ".json")
        if parsed is None or parsed[1] != "array":
            raise _error(key, None, "not an array metadata key; pass path= explicitly")
        path = parsed[0]
    path = normalize_path(path)

    shape = _int_list(_require(doc, "shape", key, list), key, "shape", minimum=0)
    grid = _require(doc, "chunk_grid", key, dict)
    if grid.get("type", "regular") != "regular":
        raise _error(key, "chunk_grid.type", f"unsupported chunk grid {grid.get('type')!r} (only 'regular')")
    if "chunk_shape" not in grid:
        raise _error(key, "chunk_grid.chunk_shape", "missing")
    chunks = _int_list(grid["chunk_shape"], key, "chunk_grid.chunk_shape", minimum=1)
    if len(chunks) != len(shape):
        raise _error(
            key, "chunk_grid.chunk_shape", f"{len(chunks)} dimensions, but shape has {len(shape)}"
        )
    separator = doc.get("dimension_separator") or grid.get("separator", "/")
    if separator not in ("/", "."):
        fld = "dimension_separator" if doc.get("dimension_separator") else "chunk_grid.separator"
        raise _error(key, fld, f"expected '/' or '.', got {separator!r}")
    cps = find_sharding_transformer(doc.get("storage_transformers", []), key, len(shape))
    _check_chunk_bounds(chunks, key)
    return DraftArrayGeometry(path, shape, chunks, separator, cps)


def parse_array_geometry(raw: bytes | str | dict[str, Any], key: str, path: str | None = None) -> DraftArrayGeometry:
    """The key-mapping part of a draft array document (see :class:`DraftArrayGeometry`)."""
    return _geometry(_load_document(raw, key), key, path)


def parse_array_metadata(raw: bytes | str | dict[str, Any], key: str, path: str | None = None) -> DraftArrayMeta:
    """Parse and validate a draft array document (``meta/root/<path>.array.json``)."""
    doc = _load_document(raw, key)
    geometry = _geometry(doc, key, path)
    path, shape, chunks, separator = geometry.path, geometry.shape, geometry.chunks, geometry.separator

    order = _require(doc, "chunk_memory_layout", key, str)
    if order not in ("C", "F"):
        raise _error(key, "chunk_memory_layout", f"expected 'C' or 'F', got {order!r}")
    dtype, fill_value = _type_and_fill(doc, key)
    compressor = _parse_compressor(doc.get("compressor"), key)
    attributes = doc.get("attributes", {})
    if not isinstance(attributes, dict):
        raise _error(key, "attributes", f"expected an object, got {type(attributes).__name__}")
    attributes = dict(attributes)
    filters = _parse_filters(attributes.pop("filters", None), key)
    extensions = doc.get("extensions", [])
    if not isinstance(extensions, list):
        raise _error(key, "extensions", "expected a list")
    for ext in extensions:
        if isinstance(ext, dict) and ext.get("must_understand", False) is not False:
            raise _error(key, "extensions", f"unsupported extension {_text(ext)}")

    cps = geometry.chunks_per_shard
    return DraftArrayMeta(
        path=path,
        shape=shape,
        chunks=chunks,
        dtype=cast("np.dtype", dtype),  # a PlainType / PlainFill is built on first read
        fill_value=fill_value,
        order=order,
        separator=separator,
        compressor=cast("Codec | None", compressor),  # a KnownCompressor is built on first read
        filters=filters,
        chunks_per_shard=cps,
        attributes=attributes,
        raw=doc,
    )


def _type_and_fill(doc: dict[str, Any], key: str) -> tuple[np.dtype | PlainType, Any]:
    """The document's data type and fill value: a :class:`PlainType` and :class:`PlainFill`
    when both are plainly valid (no numpy), else numpy's, parsed and refused as always."""
    if "data_type" not in doc:
        raise _error(key, "data_type", "missing")
    plain = plain_type(doc["data_type"])
    if plain is not None and "fill_value" in doc:
        value = plain_fill(doc["fill_value"], plain)
        if value is not NOT_PLAIN:
            return plain, PlainFill(doc["fill_value"], value)
    dtype = _parse_dtype(doc["data_type"], key)
    if "fill_value" not in doc:
        raise _error(key, "fill_value", "missing")
    try:
        fill_value = decode_fill_value(doc["fill_value"], dtype)
    except ValueError as e:
        raise _error(key, "fill_value", f"{_text(doc['fill_value'])} does not fit {dtype}: {e}") from None
    return dtype, fill_value


def _document(meta: DraftArrayMeta) -> dict[str, Any]:
    """The document zarr 2.18's ``Metadata3.encode_array_metadata`` builds for ``meta``."""
    attributes = dict(meta.attributes)
    if meta.filters:
        attributes["filters"] = [f.get_config() for f in meta.filters]
    doc: dict[str, Any] = {
        "shape": list(meta.shape),
        "chunk_grid": {"type": "regular", "chunk_shape": list(meta.chunks), "separator": meta.separator},
        "data_type": _encode_dtype(meta.dtype),
        "fill_value": encode_fill_value(meta.fill_value, meta.dtype),
        "chunk_memory_layout": meta.order,
        "attributes": attributes,
        "extensions": meta.raw.get("extensions", []),
    }
    if meta.compressor is not None:
        doc["compressor"] = _encode_compressor(meta.compressor)
    # zarr writes the top-level separator only when one was asked for explicitly;
    # "." can only have come from such a request.
    if meta.raw.get("dimension_separator") or meta.separator == ".":
        doc["dimension_separator"] = meta.separator
    if meta.chunks_per_shard is not None:
        doc["storage_transformers"] = [_transformer_entry(_written_chunks_per_shard(meta))]
    return doc


def _written_chunks_per_shard(meta: DraftArrayMeta) -> tuple[int, ...]:
    """``chunks_per_shard`` as zarr 2.18 keeps it: the list it was given (e.g. shorter
    than ndim), when the parsed document's spelling still means the same thing."""
    assert meta.chunks_per_shard is not None
    key = array_meta_key(meta.path)
    try:
        config = _sharding_config(meta.raw["storage_transformers"][0], key)
        written = config["chunks_per_shard"]  # type: ignore[index]
        written = (written,) if _is_int(written) else tuple(written)
        if parse_chunks_per_shard(list(written), meta.ndim, key) == meta.chunks_per_shard:
            return written
    except (KeyError, IndexError, TypeError, DraftMetadataError):
        pass
    return meta.chunks_per_shard


def encode_array_metadata(meta: DraftArrayMeta) -> bytes:
    """Bytes identical to what zarr-python 2.18 writes for the same array."""
    return _json_dumps(_document(meta))


@dataclass(frozen=True)
class DraftArraySpec:
    """What zarr 2.18's ``create()`` is given for an array, every field explicit (the
    defaults are the caller's): :func:`draft_array_document` turns it into the metadata."""

    path: str
    shape: tuple[int, ...] | int
    chunks: tuple[int, ...] | int
    dtype: Any
    compressor: Codec | None
    fill_value: Any
    order: str
    separator: str
    filters: tuple[Codec, ...] | list[Codec] | None
    attributes: dict[str, Any] | None
    chunks_per_shard: tuple[int, ...] | int | None


def draft_array_document(spec: DraftArraySpec) -> DraftArrayMeta:
    """Build a draft array as zarr 2.18's ``create()`` would (defaults are the caller's)."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    path, shape, chunks, dtype, separator = normalize_path(spec.path), spec.shape, spec.chunks, spec.dtype, spec.separator
    compressor, fill_value, attributes, chunks_per_shard = spec.compressor, spec.fill_value, spec.attributes, \
        spec.chunks_per_shard
    key = array_meta_key(path)
    dtype = np.dtype(dtype)
    shape_t = _as_tuple(shape) + dtype.shape  # zarr 2 folds sub-array dtypes into the shape
    dtype = dtype.base
    ndim = len(shape_t)
    chunks_t = _as_tuple(chunks, ndim)
    chunks_t = chunks_t + shape_t[len(chunks_t) :]  # zarr pads with full extents
    chunks_t = tuple(s if c in (None, -1) else c for s, c in zip(shape_t, chunks_t))
    if ndim == 0:
        compressor = None  # zarr 2.18: "no point in compressing a 0-dimensional array"
    fill: Any
    try:
        _check_dtype(dtype)
        if fill_value is None or isinstance(fill_value, np.void):
            fill = fill_value
        elif not isinstance(fill_value, (str, bytes)) and np.all(np.asarray(fill_value) == 0):
            fill = np.zeros((), dtype=dtype)[()]  # zarr's normalize_fill_value
        elif dtype.kind == "U" and not isinstance(fill_value, str):
            raise ValueError(f"fill_value {fill_value!r} is not a string")
        else:
            fill = np.array(fill_value, dtype=dtype)[()]
    except (TypeError, ValueError, OverflowError) as e:
        raise _error(key, "fill_value", f"{fill_value!r} does not fit {dtype}: {e}") from None
    attributes = dict(attributes or {})
    if "filters" in attributes:
        raise _error(key, "attributes", "'filters' is reserved for the filter pipeline")
    filters = tuple(spec.filters or ())
    if filters:
        attributes["filters"] = [f.get_config() for f in filters]
    doc: dict[str, Any] = {
        "shape": list(shape_t),
        "chunk_grid": {"type": "regular", "chunk_shape": list(chunks_t), "separator": separator},
        "data_type": _encode_dtype(dtype),
        "fill_value": encode_fill_value(fill, dtype),
        "chunk_memory_layout": spec.order,
        "attributes": attributes,
        "extensions": [],
    }
    if compressor is not None:
        doc["compressor"] = _encode_compressor(compressor)
    if separator == ".":
        doc["dimension_separator"] = separator
    if chunks_per_shard is not None:
        # zarr 2.18's ShardingStorageTransformer keeps the tuple it is given (n -> (n,))
        cps: tuple[int, ...] = _as_tuple(chunks_per_shard)
        doc["storage_transformers"] = [_transformer_entry(cps)]
    # Everything is validated in one place: the parser.
    return parse_array_metadata(json.loads(_json_dumps(doc)), key, path)


# --------------------------------------------------------------------------- groups


def parse_group_metadata(raw: bytes | str | dict[str, Any], key: str) -> dict[str, Any]:
    """A draft group document's attributes (zarr 2.18 requires the key to be present)."""
    doc = _load_document(raw, key)
    attributes = doc.get("attributes", {})
    if not isinstance(attributes, dict):
        raise _error(key, "attributes", f"expected an object, got {type(attributes).__name__}")
    return attributes


def encode_group_metadata(attributes: dict[str, Any]) -> bytes:
    """zarr 2.18 ``Metadata3.encode_group_metadata``."""
    return _json_dumps({"attributes": attributes or {}})


def parse_consolidated(raw: bytes | str | dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """Draft consolidated metadata: a map of metadata key -> parsed document."""
    doc = _load_document(raw, key)
    fmt = doc.get("zarr_consolidated_format")
    if fmt != 1:
        raise _error(key, "zarr_consolidated_format", f"expected 1, got {fmt!r}")
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        raise _error(key, "metadata", "expected an object mapping keys to documents")
    for k, v in metadata.items():
        if not isinstance(v, dict):
            raise _error(key, f"metadata.{k}", "expected a JSON object")
    return metadata
