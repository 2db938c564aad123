"""The 2023 intermediate generation: its node documents, normalised to the final v1.0 spelling.

From spring to autumn 2023 writers (zarrita 0.1.0 alphas and 0.2.x, webknossos-libs,
zarrita.js fixtures, early tensorstore ``zarr3``) put a ``zarr.json`` with ``zarr_format: 3``
and ``node_type`` beside every node, as final Zarr v3 does, but spelled codecs and fields
the way the spec said that month. :func:`normalise_node` reads such a document and returns
the same node in the final spelling, the list of what changed (for ``info``), and whether a
sharding index carries a checksum the document does not declare (then only the shard bytes
can tell: :func:`sharding_store.formats.shard_index.index_reading`).

Pure: no I/O. Imports only the format layer.

Accepted spellings (each one changes the document; the change is listed):

* **no array->bytes codec**: ``"codecs": []``, or only bytes->bytes codecs (``[gzip]``,
  ``[blosc]``, ``[crc32c]``), also inside ``sharding_indexed``: ``bytes`` (little endian;
  no ``endian`` for 1-byte types) is inserted after the array->array codecs. The chunk
  bytes of those writers are the C-ordered little-endian array, which is what it says;
* ``{"name": "endian", "configuration": {"endian": "little"|"big"}}`` (renamed ``bytes`` on
  2023-08-23) -> ``bytes`` with the same endianness (none for 1-byte types), anywhere,
  ``index_codecs`` included;
* ``transpose`` with ``"order": "C"`` (identity permutation) or ``"F"`` (reversed axes)
  -> the permutation (spec change of late 2023);
* ``blosc`` with ``shuffle`` as an integer (0, 1, 2, numcodecs' spelling) or as the
  spellings of the March 2023 draft (``null``, ``"byte"``, ``"bit"``) -> ``"noshuffle"``,
  ``"shuffle"``, ``"bitshuffle"``; a shuffling blosc without ``typesize`` gets the item size
  of the data type; no ``blocksize`` -> 0. (A ``noshuffle`` blosc without ``typesize`` is
  valid v1.0 and left alone.)
* ``zstd`` without ``checksum`` -> ``false``;
* ``sharding_indexed`` without ``index_location`` -> ``"end"``; without ``index_codecs``
  -> ``[bytes little]`` **or** ``[bytes little, crc32c]``: zarrita wrote an undeclared
  4-byte CRC32C after the index from 2023-05-09 to 2023-07-15, so the document cannot
  tell; :attr:`Normalised.hidden_checksum` is ``None`` and the caller decides from the
  bytes (:meth:`Normalised.document_for`). Nested codec chains are normalised the same way;
  an undeclared index inside a nested ``sharding_indexed`` is refused (its bytes are not
  reachable by a tail read);
* ``"dimension_names": null`` -> the key is dropped; ``attributes`` missing -> ``{}``
  (arrays and groups);
* ``fill_value`` ``0``/``1`` for ``bool`` -> ``false``/``true``; bare JSON ``NaN``,
  ``Infinity``, ``-Infinity`` (Python's ``json.dumps``: zarrita 0.2.x) -> the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
* ``"extensions": []`` (an empty list of the 2022 drafts' extension points) -> dropped.

Spellings that are already final and kept as they are: ``chunk_key_encoding`` ``default``
with separator ``"/"`` or ``"."`` (or none: ``"/"``) and ``v2`` (``"."`` or ``"/"``);
``storage_transformers: []``; big-endian ``bytes``; chunk shapes larger than the array;
extra top-level fields that are objects with ``"must_understand": false``.

Anything else that is not final v1.0 is a **damaged** node: :class:`DraftMetadataError`
naming the key and the field, never a guess. Codecs and data types this module does not
know are passed through untouched when the document needs no decision about them
(e.g. ``numcodecs.*`` codecs, zarr-python's ``string`` type in a final document); where it
would (an unknown codec in a chain without a known array->bytes codec, a shuffling blosc
without ``typesize`` on an unknown data type) the node is damaged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

if TYPE_CHECKING:
    pass

from ..errors import DraftMetadataError
from .draft_metadata import DRAFT_PROTOCOL, MAX_SHARD_INDEX_BYTES, _load_document, _text
from .fill_value import V3_CORE_DTYPES, decode_fill_value
from .shard_index import ENTRY_NBYTES

__all__ = [
    "Normalised",
    "NodeClass",
    "normalise_node",
    "classify_node",
    "classify",
    "NODE_KEY",
    "chunk_key_pattern",
    "sharding_of",
    "index_readable",
    "shard_grid",
]

#: the document of every node of this generation (and of final Zarr v3)
NODE_KEY = "zarr.json"

#: data type name -> item size in bytes (v1.0 core types; ``r<bits>`` raw types too)
DATA_TYPE_SIZES: dict[str, int] = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "float16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
    "complex128": 16,
}
_RAW = re.compile(r"r([1-9][0-9]*)")

ARRAY_TO_ARRAY = frozenset({"transpose"})
ARRAY_TO_BYTES = frozenset({"bytes", "endian", "sharding_indexed"})
BYTES_TO_BYTES = frozenset({"blosc", "gzip", "zstd", "crc32c"})
#: codecs allowed in ``index_codecs`` (fixed size)
INDEX_CODECS = frozenset({"transpose", "bytes", "endian", "crc32c"})

BLOSC_CNAMES = frozenset({"lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib"})
BLOSC_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")
#: pre-final spellings of blosc's ``shuffle`` -> the final name
_BLOSC_SHUFFLE_OLD: dict[Any, str] = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle", "byte": "shuffle", "bit": "bitshuffle"}

ARRAY_KEYS = frozenset({
    "zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding",
    "fill_value", "codecs", "attributes", "dimension_names", "storage_transformers",
})
GROUP_KEYS = frozenset({"zarr_format", "node_type", "attributes"})

#: how a node's document reads: final v1.0, a recognised 2023 spelling, a 2022 draft entry
#: point, or none of them (not JSON, another ``zarr_format``, no ``node_type``)
NodeClass = Literal["final", "2023", "draft-2022", "unknown"]


@dataclass(frozen=True)
class Normalised:
    """One node document in the final v1.0 spelling.

    ``document``: the final document (with the index of an undecided ``sharding_indexed``
    read as plain, see ``hidden_checksum``). ``changes``: what was respelled, one line each
    (empty: the document was final already). ``hidden_checksum``: ``False`` when there is
    nothing to decide (no sharding, or ``index_codecs`` declared); ``None`` when the
    outer ``sharding_indexed`` has no ``index_codecs``, so whether a CRC32C follows each
    index must be decided from the shard bytes.
    """

    document: dict[str, Any]
    changes: tuple[str, ...]
    hidden_checksum: bool | None
    key: str = NODE_KEY

    @property
    def is_final(self) -> bool:
        """True when the document was valid final v1.0 as it was (nothing to migrate)."""
        return not self.changes

    @property
    def node_type(self) -> str:
        return str(self.document["node_type"])

    def document_for(self, reading: Literal["plain", "crc32c-hidden"]) -> dict[str, Any]:
        """The final document once the shard bytes decided the index's reading
        (:func:`~sharding_store.formats.shard_index.index_reading`): ``"crc32c-hidden"`` declares the
        checksum (``index_codecs`` ``[bytes little, crc32c]``), ``"plain"`` leaves
        ``[bytes little]``. Only for an undecided document."""
        if self.hidden_checksum is not None:
            raise ValueError(f"{self.key}: the document declares its shard index; nothing to decide")
        if reading not in ("plain", "crc32c-hidden"):
            raise ValueError(f"reading must be 'plain' or 'crc32c-hidden', got {reading!r}")
        doc: dict[str, Any] = json.loads(json.dumps(self.document))
        if reading == "crc32c-hidden":
            sharding = next(c for c in doc["codecs"] if _name(c) == "sharding_indexed")
            sharding["configuration"]["index_codecs"].append({"name": "crc32c"})
        return doc


class _Damage(Exception):
    def __init__(self, fld: str, message: str) -> None:
        super().__init__(message)
        self.fld = fld
        self.message = message


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(value: Any, fld: str, *, minimum: int, length: int | None = None) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) and v >= minimum for v in value):
        raise _Damage(fld, f"expected a list of integers >= {minimum}, got {_text(value)}")
    if length is not None and len(value) != length:
        raise _Damage(fld, f"has {len(value)} entries, the array has {length} dimensions")
    return list(value)


def _item_size(data_type: Any) -> int | None:
    """Item size of a v1.0 data type; None for types this module does not know."""
    if isinstance(data_type, str):
        if data_type in DATA_TYPE_SIZES:
            return DATA_TYPE_SIZES[data_type]
        m = _RAW.fullmatch(data_type)
        if m and int(m.group(1)) % 8 == 0:
            return int(m.group(1)) // 8
    return None


@dataclass
class _Chain:
    """What a codec chain is applied to: the data type, its item size, the chunk's rank."""

    data_type: Any
    item_size: int | None
    ndim: int
    index: bool = False  # an ``index_codecs`` chain
    nested: bool = False  # inside a ``sharding_indexed``


class _Normaliser:
    def __init__(self, key: str, *, strict: bool) -> None:
        self.key = key
        self.strict = strict
        self.changes: list[str] = []
        self.damage: list[_Damage] = []
        self.hidden_checksum: bool | None = False

    def change(self, text: str) -> None:
        self.changes.append(text)

    def section(self, fn: Any, *args: Any) -> Any:
        """Run one independent part; a damaged part is recorded (the walk goes on, so that
        the classification sees every pre-final spelling), and None is returned."""
        try:
            return fn(*args)
        except _Damage as d:
            self.damage.append(d)
            if self.strict:
                raise
            return None

    # ------------------------------------------------------------------ the document
    def node(self, doc: dict[str, Any]) -> dict[str, Any]:
        node_type = doc.get("node_type")
        out: dict[str, Any] = {"zarr_format": 3, "node_type": node_type}
        known = ARRAY_KEYS if node_type == "array" else GROUP_KEYS
        for k, v in doc.items():
            if k in known:
                continue
            if k == "extensions" and v == []:
                self.change("extensions: [] dropped (a 2022 draft field)")
                continue
            if isinstance(v, Mapping) and v.get("must_understand") is False:
                out[k] = v
                continue
            self.section(self._unknown_field, k, v)
        if node_type == "array":
            self.array(doc, out)
        attributes = doc.get("attributes", _MISSING)
        if attributes is _MISSING:
            self.change("attributes missing: {} written")
            out["attributes"] = {}
        elif not isinstance(attributes, dict):
            self.section(self._raise, "attributes", f"expected an object, got {_text(attributes)}")
        else:
            out["attributes"] = attributes
        return out

    @staticmethod
    def _raise(fld: str, message: str) -> None:
        raise _Damage(fld, message)

    def _unknown_field(self, k: str, v: Any) -> None:
        raise _Damage(k, f"unknown field (value {_text(v, 60)}); an extra field must be an object with "
                         '"must_understand": false')

    def array(self, doc: dict[str, Any], out: dict[str, Any]) -> None:
        for k in ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "codecs"):
            if k not in doc:
                self.section(self._raise, k, "missing")
        shape = self.section(lambda: _int_list(doc["shape"], "shape", minimum=0)) if "shape" in doc else None
        ndim = len(shape) if shape is not None else None
        out["shape"] = shape
        data_type = doc.get("data_type")
        if "data_type" in doc and not isinstance(data_type, (str, dict)):
            self.section(self._raise, "data_type", f"expected a name or an object, got {_text(data_type)}")
        out["data_type"] = data_type
        item_size = _item_size(data_type)
        grid = self.section(self.chunk_grid, doc.get("chunk_grid"), ndim) if "chunk_grid" in doc else None
        out["chunk_grid"] = grid
        if "chunk_key_encoding" in doc:
            out["chunk_key_encoding"] = self.section(self.chunk_key_encoding, doc["chunk_key_encoding"])
        if "fill_value" in doc:
            out["fill_value"] = self.section(self.fill_value, doc["fill_value"], data_type)
        if "codecs" in doc:
            chain = _Chain(data_type, item_size, -1 if ndim is None else ndim)  # -1: rank unknown (shape damaged)
            out["codecs"] = self.section(self.codecs, doc["codecs"], "codecs", chain)
            if grid is not None and out["codecs"]:
                self.section(self._shard_fits, out["codecs"], grid["configuration"]["chunk_shape"])
        if "dimension_names" in doc:
            names = doc["dimension_names"]
            if names is None:
                self.change("dimension_names: null dropped")
            elif isinstance(names, list) and all(n is None or isinstance(n, str) for n in names) and (
                ndim is None or len(names) == ndim
            ):
                out["dimension_names"] = names
            else:
                self.section(self._raise, "dimension_names", f"expected {ndim} names (strings or null), got {_text(names)}")
        if "storage_transformers" in doc:
            st = doc["storage_transformers"]
            if st == []:
                out["storage_transformers"] = []
            else:
                self.section(self._raise, "storage_transformers", f"not supported in a v3 node document: {_text(st)}")

    def chunk_grid(self, grid: Any, ndim: int | None) -> dict[str, Any]:
        fld = "chunk_grid"
        if not isinstance(grid, dict) or grid.get("name") != "regular":
            raise _Damage(fld, f"expected {{\"name\": \"regular\", ...}}, got {_text(grid)}")
        extra = set(grid) - {"name", "configuration"}
        if extra:
            raise _Damage(fld, f"unknown key {sorted(extra)[0]!r}")
        config = grid.get("configuration")
        if not isinstance(config, dict) or set(config) != {"chunk_shape"}:
            raise _Damage(f"{fld}.configuration", f"expected {{\"chunk_shape\": [...]}}, got {_text(config)}")
        shape = _int_list(config["chunk_shape"], f"{fld}.configuration.chunk_shape", minimum=1, length=ndim)
        return {"name": "regular", "configuration": {"chunk_shape": shape}}

    def chunk_key_encoding(self, cke: Any) -> dict[str, Any]:
        fld = "chunk_key_encoding"
        if not isinstance(cke, dict) or cke.get("name") not in ("default", "v2") or set(cke) - {"name", "configuration"}:
            raise _Damage(fld, f"expected {{\"name\": \"default\" or \"v2\", \"configuration\": ...}}, got {_text(cke)}")
        config = cke.get("configuration", {})
        if not isinstance(config, dict) or set(config) - {"separator"}:
            raise _Damage(f"{fld}.configuration", f"expected {{\"separator\": \"/\" or \".\"}}, got {_text(config)}")
        if "separator" in config and config["separator"] not in ("/", "."):
            raise _Damage(f"{fld}.configuration.separator", f"expected \"/\" or \".\", got {_text(config['separator'])}")
        return {"name": cke["name"], **({"configuration": dict(config)} if "configuration" in cke else {})}

    def fill_value(self, value: Any, data_type: Any) -> Any:
        import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
        fld = "fill_value"
        if value is None:
            raise _Damage(fld, "null: v3 requires a fill value, and this document does not say which")
        if not isinstance(data_type, str) or _item_size(data_type) is None:
            return value  # a type this module does not know: zarr decides
        if data_type in V3_CORE_DTYPES:
            value = self._respelled(value, data_type)
            try:  # the one decoder says whether the value fits (range, overflow, bit pattern width)
                decode_fill_value(value, np.dtype(V3_CORE_DTYPES[data_type]))
            except (ValueError, OverflowError) as e:
                raise _Damage(fld, f"{_text(value)} does not fit {data_type}: {e}") from None
            return value
        # r<bits>: a list of bytes
        n = _item_size(data_type)
        if isinstance(value, list) and len(value) == n and all(_is_int(v) and 0 <= v < 256 for v in value):
            return value
        raise _Damage(fld, f"expected a list of {n} bytes for {data_type}, got {_text(value)}")

    def _respelled(self, value: Any, data_type: str) -> Any:
        """The final spelling of a 2023 fill value of a core type: ``0``/``1`` for ``bool``,
        bare JSON ``NaN``/``Infinity`` for floats (also as complex parts). Integers must be
        JSON integers (an integral float is not respelled: v1.0 has none)."""
        if data_type == "bool" and _is_int(value) and value in (0, 1):
            self.change(f"fill_value {value} -> {'true' if value else 'false'} (bool)")
            return bool(value)
        if data_type.startswith(("int", "uint")) and not _is_int(value):
            raise _Damage("fill_value", f"expected an integer for {data_type}, got {_text(value)}")
        if data_type.startswith("float") and isinstance(value, float) and not math.isfinite(value):
            return self._finite_spelling(value)
        if data_type.startswith("complex") and isinstance(value, list):
            return [self._finite_spelling(v) if isinstance(v, float) and not math.isfinite(v) else v for v in value]
        return value

    def _finite_spelling(self, value: float) -> str:
        """Bare JSON ``NaN``/``Infinity`` (Python's json.dumps, e.g. zarrita 0.2.x) -> the spec's strings."""
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        self.change(f"fill_value bare {text} -> \"{text}\" (JSON has no NaN/Infinity literals)")
        return text

    def _shard_fits(self, codecs: list[dict[str, Any]], grid: list[int], fld: str = "codecs") -> None:
        """Each ``sharding_indexed`` (nested ones too) divides the shape it shards, and its
        index stays within the bound every generation's reader allocates (a hostile chunk
        count damages this node, as a 2022 ``chunks_per_shard`` does)."""
        for i, c in enumerate(codecs):
            if isinstance(c, dict) and c.get("name") == "sharding_indexed":
                inner = c["configuration"]["chunk_shape"]
                at = f"{fld}[{i}].configuration"
                if fld == "codecs" and (len(inner) != len(grid) or any(g % s for g, s in zip(grid, inner))):
                    raise _Damage(f"{at}.chunk_shape", f"{inner} does not divide the chunk grid's chunk_shape {grid}")
                n = math.prod(-(-g // s) for g, s in zip(grid, inner))
                if ENTRY_NBYTES * n > MAX_SHARD_INDEX_BYTES:
                    raise _Damage(f"{at}.chunk_shape", f"{inner} in a shard of {grid} means {n} chunks per shard: a "
                                  f"{ENTRY_NBYTES * n}-byte shard index (limit {MAX_SHARD_INDEX_BYTES} bytes)")
                self._shard_fits(c["configuration"].get("codecs") or [], inner, f"{at}.codecs")

    # ------------------------------------------------------------------ codecs
    def codecs(self, codecs: Any, fld: str, chain: _Chain) -> list[dict[str, Any] | str]:
        if not isinstance(codecs, list):
            raise _Damage(fld, f"expected a list of codecs, got {_text(codecs)}")
        out: list[dict[str, Any] | str] = []  # a codec without configuration as its name (short form)
        kinds: list[str] = []
        opaque: str | None = None
        for i, entry in enumerate(codecs):
            efld = f"{fld}[{i}]"
            short = isinstance(entry, str)  # the short-hand form: a name without configuration
            if short:
                entry = {"name": entry}
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise _Damage(efld, f"expected {{\"name\": ..., \"configuration\": ...}}, got {_text(entry)}")
            extra = set(entry) - {"name", "configuration", "must_understand"}
            if extra:
                raise _Damage(efld, f"unknown key {sorted(extra)[0]!r} in a codec")
            name = entry["name"]
            if not isinstance(name, str):
                raise _Damage(f"{efld}.name", f"expected a string, got {_text(name)}")
            config = entry.get("configuration", {})
            if not isinstance(config, dict):
                raise _Damage(f"{efld}.configuration", f"expected an object, got {_text(config)}")
            if chain.index and name not in INDEX_CODECS:
                raise _Damage(efld, f"codec {name!r} in index_codecs: only fixed-size codecs (bytes, transpose, crc32c) "
                                    "can encode a shard index")
            handler = _CODECS.get(name)
            if handler is None:
                opaque = opaque or f"{efld} ({name!r})"
                out.append(entry)
                kinds.append("?")
                continue
            done = handler(self, config, efld, chain)
            out.append(name if short and done == {"name": name} else done)
            kinds.append("aa" if name in ARRAY_TO_ARRAY else "ab" if name in ARRAY_TO_BYTES else "bb")
        known = [k for k in kinds if k != "?"]
        if known.count("ab") > 1:
            raise _Damage(fld, "more than one array->bytes codec")
        order = {"aa": 0, "ab": 1, "bb": 2}
        if any(order[a] > order[b] for a, b in zip(known, known[1:])):
            raise _Damage(fld, f"codecs out of order ({', '.join(_name(c) for c in out)}): "
                               "array->array, then one array->bytes, then bytes->bytes")
        if "ab" not in known:
            if opaque is not None:
                raise _Damage(fld, f"no known array->bytes codec and an unknown codec {opaque}: cannot tell "
                                   "whether the chunks need a 'bytes' codec")
            at = known.count("aa")
            out.insert(at, self._bytes_codec("little", chain))
            self.change(f"{fld}: no array->bytes codec ({', '.join(_name(c) for c in out if _name(c) != 'bytes') or 'empty'}): "
                        "'bytes' (little endian) inserted")
        return out

    def _bytes_codec(self, endian: str, chain: _Chain) -> dict[str, Any]:
        if chain.item_size == 1:
            return {"name": "bytes"}
        return {"name": "bytes", "configuration": {"endian": endian}}

    def _endian(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        if set(config) != {"endian"} or config["endian"] not in ("little", "big"):
            raise _Damage(f"{fld}.configuration", f"expected {{\"endian\": \"little\" or \"big\"}}, got {_text(config)}")
        self.change(f"{fld}: 'endian' codec -> 'bytes' ({config['endian']})")
        return self._bytes_codec(config["endian"], chain)

    def _bytes(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        if set(config) - {"endian"}:
            raise _Damage(f"{fld}.configuration", f"unknown key {sorted(set(config) - {'endian'})[0]!r}")
        if "endian" in config:
            if config["endian"] not in ("little", "big"):
                raise _Damage(f"{fld}.configuration.endian", f"expected \"little\" or \"big\", got {_text(config['endian'])}")
            return {"name": "bytes", "configuration": {"endian": config["endian"]}}
        if chain.item_size is not None and chain.item_size > 1:
            raise _Damage(f"{fld}.configuration", f"no endian for a {chain.item_size}-byte data type")
        return {"name": "bytes"}

    def _transpose(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        order = config.get("order")
        if set(config) != {"order"}:
            raise _Damage(f"{fld}.configuration", f"expected {{\"order\": ...}}, got {_text(config)}")
        n = chain.ndim
        if order in ("C", "F"):
            if n < 0:
                raise _Damage(f"{fld}.configuration.order", "the array's rank is unknown (shape is damaged)")
            perm = list(range(n)) if order == "C" else list(range(n))[::-1]
            self.change(f"{fld}: transpose order {order!r} -> {perm}")
            return {"name": "transpose", "configuration": {"order": perm}}
        if isinstance(order, list) and all(_is_int(v) for v in order) and sorted(order) == list(range(len(order))) and (
            n < 0 or len(order) == n
        ):
            return {"name": "transpose", "configuration": {"order": list(order)}}
        raise _Damage(f"{fld}.configuration.order", f"expected a permutation of 0..{n - 1}, \"C\" or \"F\", got {_text(order)}")

    def _blosc(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        cfg = f"{fld}.configuration"
        extra = set(config) - {"cname", "clevel", "shuffle", "typesize", "blocksize"}
        if extra:
            raise _Damage(cfg, f"unknown key {sorted(extra)[0]!r} for blosc")
        if not isinstance(config.get("cname"), str) or config["cname"] not in BLOSC_CNAMES:
            raise _Damage(f"{cfg}.cname", f"expected one of {', '.join(sorted(BLOSC_CNAMES))}, got {_text(config.get('cname'))}")
        clevel = config.get("clevel")
        if not _is_int(clevel) or not 0 <= clevel <= 9:
            raise _Damage(f"{cfg}.clevel", f"expected an integer in [0, 9], got {_text(clevel)}")
        if "shuffle" not in config:
            raise _Damage(f"{cfg}.shuffle", "missing")
        shuffle = config["shuffle"]
        if shuffle is None:
            shuffle_name = "noshuffle"
        elif isinstance(shuffle, bool) or not isinstance(shuffle, (str, int)):
            shuffle_name = None
        else:
            shuffle_name = shuffle if shuffle in BLOSC_SHUFFLES else _BLOSC_SHUFFLE_OLD.get(shuffle)
        if shuffle_name is None:
            raise _Damage(f"{cfg}.shuffle", f"expected \"noshuffle\", \"shuffle\" or \"bitshuffle\", got {_text(shuffle)}")
        if shuffle_name != shuffle:
            self.change(f"{fld}: blosc shuffle {_text(shuffle)} -> {shuffle_name!r}")
        out: dict[str, Any] = {"cname": config["cname"], "clevel": clevel, "shuffle": shuffle_name}
        if "typesize" in config:
            ts = config["typesize"]
            if not _is_int(ts) or not 1 <= ts <= 255:
                raise _Damage(f"{cfg}.typesize", f"expected an integer in [1, 255], got {_text(ts)}")
            out["typesize"] = ts
        elif shuffle_name != "noshuffle":
            if chain.item_size is None:
                raise _Damage(f"{cfg}.typesize", f"missing, and the item size of data type {_text(chain.data_type)} is unknown")
            out["typesize"] = chain.item_size
            self.change(f"{fld}: blosc typesize missing: {chain.item_size} (the data type's item size)")
        blocksize = config.get("blocksize", 0)
        if not _is_int(blocksize) or blocksize < 0:
            raise _Damage(f"{cfg}.blocksize", f"expected an integer >= 0, got {_text(blocksize)}")
        if "blocksize" not in config:
            self.change(f"{fld}: blosc blocksize missing: 0")
        out["blocksize"] = blocksize
        return {"name": "blosc", "configuration": out}

    def _gzip(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        level = config.get("level")
        if set(config) != {"level"} or not _is_int(level) or not 0 <= level <= 9:
            raise _Damage(f"{fld}.configuration", f"expected {{\"level\": 0..9}}, got {_text(config)}")
        return {"name": "gzip", "configuration": {"level": level}}

    def _zstd(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        extra = set(config) - {"level", "checksum"}
        level = config.get("level")
        if extra or not _is_int(level) or not -131072 <= level <= 22:
            raise _Damage(f"{fld}.configuration", f"expected {{\"level\": an integer <= 22, \"checksum\": bool}}, got {_text(config)}")
        if "checksum" not in config:
            self.change(f"{fld}: zstd checksum missing: false")
        checksum = config.get("checksum", False)
        if not isinstance(checksum, bool):
            raise _Damage(f"{fld}.configuration.checksum", f"expected true or false, got {_text(checksum)}")
        return {"name": "zstd", "configuration": {"level": level, "checksum": checksum}}

    def _crc32c(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        if config:
            raise _Damage(f"{fld}.configuration", f"crc32c takes no configuration, got {_text(config)}")
        return {"name": "crc32c"}

    def _sharding(self, config: dict[str, Any], fld: str, chain: _Chain) -> dict[str, Any]:
        cfg = f"{fld}.configuration"
        extra = set(config) - {"chunk_shape", "codecs", "index_codecs", "index_location"}
        if extra:
            raise _Damage(cfg, f"unknown key {sorted(extra)[0]!r} for sharding_indexed")
        if "chunk_shape" not in config:
            raise _Damage(f"{cfg}.chunk_shape", "missing")
        if "codecs" not in config:
            raise _Damage(f"{cfg}.codecs", "missing")
        ndim = chain.ndim if chain.ndim >= 0 else None
        inner_shape = _int_list(config["chunk_shape"], f"{cfg}.chunk_shape", minimum=1, length=ndim)
        inner = _Chain(chain.data_type, chain.item_size, len(inner_shape), nested=True)
        codecs = self.codecs(config["codecs"], f"{cfg}.codecs", inner)
        index_chain = _Chain("uint64", 8, len(inner_shape) + 1, index=True, nested=True)
        if "index_codecs" in config:
            index_codecs = self.codecs(config["index_codecs"], f"{cfg}.index_codecs", index_chain)
        else:
            if chain.nested:
                raise _Damage(f"{cfg}.index_codecs", "missing in a nested sharding_indexed: whether a CRC32C follows its "
                                                      "index cannot be decided from the bytes")
            index_codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
            self.hidden_checksum = None
            self.change(f"{fld}: no index_codecs: [bytes little] or [bytes little, crc32c] (zarrita's undeclared "
                        "checksum, 2023-05 to 2023-07), decided from the shard bytes")
        location = config.get("index_location", _MISSING)
        if location is _MISSING:
            location = "end"
            self.change(f"{fld}: no index_location: \"end\"")
        elif location not in ("start", "end"):
            raise _Damage(f"{cfg}.index_location", f"expected \"start\" or \"end\", got {_text(location)}")
        return {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": inner_shape,
                "codecs": codecs,
                "index_codecs": index_codecs,
                "index_location": location,
            },
        }


_MISSING: Any = object()


def _name(codec: Any) -> str:
    return codec if isinstance(codec, str) else codec["name"]


_CODECS = {
    "bytes": _Normaliser._bytes,
    "endian": _Normaliser._endian,
    "transpose": _Normaliser._transpose,
    "blosc": _Normaliser._blosc,
    "gzip": _Normaliser._gzip,
    "zstd": _Normaliser._zstd,
    "crc32c": _Normaliser._crc32c,
    "sharding_indexed": _Normaliser._sharding,
}


def _node_document(raw: bytes | str | Mapping[str, Any], key: str) -> dict[str, Any]:
    doc = _load_document(raw, key)
    fmt = doc.get("zarr_format")
    if not (_is_int(fmt) and fmt == 3):
        raise DraftMetadataError(f"{key}: field 'zarr_format': expected 3, got {_text(fmt)}", key=key)
    if doc.get("node_type") not in ("array", "group"):
        raise DraftMetadataError(
            f"{key}: field 'node_type': expected \"array\" or \"group\", got {_text(doc.get('node_type'))}", key=key
        )
    return doc


def normalise_node(raw: bytes | str | Mapping[str, Any], key: str = NODE_KEY) -> Normalised:
    """One node document (``zarr.json`` of the 2023 generation or final v3) in the final
    v1.0 spelling. Raises :class:`DraftMetadataError` naming ``key`` and the field for a
    document that is damaged or spelled in a way this module does not recognise."""
    doc = _node_document(raw, key)
    n = _Normaliser(key, strict=True)
    try:
        out = n.node(doc)
    except _Damage as d:
        raise DraftMetadataError(f"{key}: field '{d.fld}': {d.message}", key=key) from None
    final = json.loads(json.dumps(out))
    return Normalised(final, tuple(n.changes), n.hidden_checksum, key)


def classify_node(raw: bytes | str | Mapping[str, Any], key: str = NODE_KEY) -> NodeClass:
    """How a ``zarr.json`` reads, without raising: ``"2023"`` when any pre-final spelling is
    in it (even if another part is damaged: :func:`normalise_node` then says what),
    ``"final"`` for a v3 node document with none (damaged or not: zarr decides),
    ``"draft-2022"`` for a 2022 entry point, ``"unknown"`` otherwise."""
    return classify(raw, key)[0]


def classify(raw: bytes | str | Mapping[str, Any], key: str = NODE_KEY) -> tuple[NodeClass, str | None]:
    """:func:`classify_node` and the document's ``node_type`` (``"array"``, ``"group"``;
    None for a 2022 entry point or an unknown document)."""
    try:
        doc = _load_document(raw, key)
    except DraftMetadataError:
        return "unknown", None
    fmt = doc.get("zarr_format")
    if fmt == DRAFT_PROTOCOL:
        return "draft-2022", None
    node_type = doc.get("node_type")
    if not (_is_int(fmt) and fmt == 3) or node_type not in ("array", "group"):
        return "unknown", None
    n = _Normaliser(key, strict=False)
    try:
        n.node(doc)
    except Exception:  # noqa: BLE001 - a part too damaged to walk: what was seen decides
        pass
    return ("2023" if n.changes else "final"), node_type


# --------------------------------------------------------------------------- final documents


def chunk_key_pattern(doc: dict[str, Any]) -> re.Pattern[str]:
    """The chunk keys (relative to the array's directory) of a final array document."""
    cke = doc["chunk_key_encoding"]
    name = cke["name"]
    ndim = len(doc["shape"])
    sep = (cke.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    s = re.escape(sep)
    coords = s.join([r"(0|[1-9][0-9]*)"] * ndim)
    if name == "default":
        return re.compile("c" + (s + coords if ndim else ""))
    return re.compile(coords if ndim else "0")


def sharding_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The ``sharding_indexed`` configuration of a final array document (None: unsharded)."""
    for c in doc.get("codecs", []):
        if isinstance(c, dict) and c.get("name") == "sharding_indexed":
            cfg: dict[str, Any] = c["configuration"]
            return cfg
    return None


def index_readable(doc: dict[str, Any]) -> bool:
    """Whether a sharded document's shard objects end (or start) with their index as stored:
    ``sharding_indexed`` is the last codec. A bytes->bytes codec after it (valid v1.0: the
    whole shard is compressed or checksummed) hides the index; such objects are copied and
    compared verbatim, their readers decode them."""
    codecs = doc.get("codecs") or []
    return bool(codecs) and isinstance(codecs[-1], dict) and codecs[-1].get("name") == "sharding_indexed"


def shard_grid(doc: dict[str, Any]) -> tuple[int, ...]:
    """Chunks per shard of a sharded final array document."""
    cfg = sharding_of(doc)
    assert cfg is not None  # a sharded document (the callers' precondition)
    grid = doc["chunk_grid"]["configuration"]["chunk_shape"]
    return tuple(g // c for g, c in zip(grid, cfg["chunk_shape"]))
