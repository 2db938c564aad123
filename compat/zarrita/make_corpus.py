"""Write the zarrita 0.2.x corpus: real stores of the 2023 intermediate v3 spelling.

Runs in compat/.venv-zarrita with one zarrita version on PYTHONPATH (setup_zarrita.sh):

    PYTHONPATH=compat/.venv-zarrita/zarrita-0.2.7 compat/.venv-zarrita/bin/python \
        compat/zarrita/make_corpus.py OUTDIR

Writes OUTDIR/stores/<case>/ (one zarrita LocalStore per case), OUTDIR/expected.npz (each
array as zarrita itself reads it back from disk, key ``<case>::<path>``) and
OUTDIR/manifest.json. Every array is also compared with the values the generator meant to
write (numpy); a mismatch stops the generation, except for the zarrita defects listed in
``KNOWN_DEFECTS`` (those arrays are left out for that version and recorded as skipped).

The generation each store belongs to is predicted here from the documents zarrita wrote,
with rules of this script's own (``prefinal_spellings``), independent of sharding_store:
a store is "2023" when a document uses a pre-v1.0 spelling or a group has no document.
A case whose every array needs a newer zarrita is written empty (manifest: ``skipped``).
Deterministic: seeded RNG, fixed case list (gzip's header carries no timestamp for
in-memory data in numcodecs 0.11).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarrita
from zarrita.codecs import (
    blosc_codec,
    bytes_codec,
    crc32c_codec,
    gzip_codec,
    sharding_codec,
    transpose_codec,
    zstd_codec,
)

warnings.simplefilter("ignore")  # zarrita warns when sharding is combined with other codecs

VERSION = metadata.version("zarrita")
V = tuple(int(x) for x in VERSION.split("."))
RNG = np.random.default_rng(20231)

#: (min version, reason): zarrita releases that read back something else than they wrote
KNOWN_DEFECTS = {
    "transpose_nonsymmetric": ((0, 2, 3), "zarrita < 0.2.3 decodes a transpose with the permutation "
                               "instead of its inverse (fixed in 0.2.3: np.argsort)"),
    "index_location_start": ((0, 2, 2), "index_location appeared in zarrita 0.2.2"),
}

BOOL_DEFECT = ("the values written: zarrita 0.2.x cannot read bool back "
               "(BytesCodec.decode asks numpy for dtype '<bool')")

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64"]


def values(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Seeded data covering the type's range (floats with NaN, +-inf, -0.0)."""
    n = math.prod(shape)
    if dtype == "bool":
        out = RNG.integers(0, 2, n).astype(bool)
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        out = RNG.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        if n >= 2:
            out[:2] = (info.min, info.max)
    else:
        out = (RNG.standard_normal(n) * 1000).astype(dtype)
        for i, v in enumerate((np.nan, np.inf, -np.inf, -0.0)):
            if i < n:
                out[i] = v
    return out.reshape(shape)


# ------------------------------------------------------------------ spelling predictions


def _bare_non_finite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def prefinal_spellings(doc: dict, *, ndim: int | None = None) -> list[str]:
    """Pre-v1.0 spellings in one node document zarrita wrote (rules of this script)."""
    out: list[str] = []
    if doc.get("node_type") != "array":
        return out
    if _bare_non_finite(doc.get("fill_value")):
        out.append(f"fill_value {doc['fill_value']!r} as a bare JSON token (v1.0: a string)")

    def chain(codecs: list[dict], where: str) -> None:
        for c in codecs:
            name, cfg = c["name"], c.get("configuration", {})
            if name == "transpose" and isinstance(cfg.get("order"), str):
                out.append(f"{where}transpose order {cfg['order']!r} (v1.0: a permutation)")
            if name == "endian":
                out.append(f"{where}endian codec (v1.0: bytes)")
            if name == "sharding_indexed":
                if "index_location" not in cfg:
                    out.append(f"{where}sharding_indexed without index_location")
                if "index_codecs" not in cfg:
                    out.append(f"{where}sharding_indexed without index_codecs")
                chain(cfg.get("codecs", []), where + "sharding.codecs: ")
                chain(cfg.get("index_codecs", []), where + "sharding.index_codecs: ")

    chain(doc["codecs"], "")
    return out


# ------------------------------------------------------------------ case building


class Case:
    """One store: a root group (or none, or a root array) and the arrays written into it."""

    def __init__(self, name: str, description: str, *, root: str = "group",
                 root_attributes: dict | None = None) -> None:
        self.name = name
        self.description = description
        self.dir = OUT / "stores" / name
        self.store = zarrita.LocalStore(str(self.dir))
        self.arrays: list[dict] = []
        self.groups: list[dict] = []
        self.skipped: list[dict] = []
        self.root = root
        if root == "group":
            zarrita.Group.create(self.store, attributes=root_attributes or {})
            self.groups.append({"path": "", "attributes": root_attributes or {}})

    def group(self, path: str, attributes: dict | None = None) -> None:
        zarrita.Group.create(self.store / path, attributes=attributes or {})
        self.groups.append({"path": path, "attributes": attributes or {}})

    def array(self, path: str, data: np.ndarray, *, chunk_shape: tuple[int, ...],
              codecs: list | Callable | None = None, fill_value: Any = None, write: Callable | None = None,
              needs: str | None = None, description: str = "", **kwargs: Any) -> None:
        """Create ``path`` with zarrita, write ``data`` (or ``write(array, data)`` for a partial
        write; ``data`` then holds the values meant, fill included), read it back."""
        if needs is not None and V < KNOWN_DEFECTS[needs][0]:
            self.skipped.append({"path": path, "reason": KNOWN_DEFECTS[needs][1]})
            return
        if callable(codecs):
            codecs = codecs()
        target = self.store / path if path else self.store
        a = zarrita.Array.create(target, shape=data.shape, dtype=data.dtype.name,
                                 chunk_shape=chunk_shape, codecs=codecs, fill_value=fill_value,
                                 **kwargs)
        if write is not None:
            write(a, data)
        elif data.ndim == 0:
            a[()] = data
        else:
            a[tuple(slice(None) for _ in data.shape)] = data
        if data.dtype == bool:
            # zarrita 0.2.x writes bool but cannot read it: BytesCodec.decode builds
            # np.dtype("<bool"). The values given are the expectation (see manifest).
            got, expected_from = data, BOOL_DEFECT
        else:
            back = zarrita.Array.open(target)
            got = back[()] if data.ndim == 0 else back[tuple(slice(None) for _ in data.shape)]
            got, expected_from = np.asarray(got), "zarrita read-back"
        if got.shape != data.shape or not np.array_equal(got.astype(data.dtype), data,
                                                          equal_nan=data.dtype.kind == "f"):
            raise SystemExit(f"{self.name}/{path}: zarrita {VERSION} reads back other values than "
                             f"it was given (dtype {got.dtype}, shape {got.shape})")
        doc = json.loads((self.dir / path / "zarr.json").read_text()) if path else \
            json.loads((self.dir / "zarr.json").read_text())
        key = f"{self.name}::{path}"
        EXPECTED[key] = got
        sharding = next((c for c in doc["codecs"] if c["name"] == "sharding_indexed"), None)
        self.arrays.append({
            "path": path, "key": key, "shape": list(data.shape), "dtype": got.dtype.str,
            "data_type": doc["data_type"], "chunk_shape": list(chunk_shape),
            "codec_names": codec_names(doc["codecs"]),
            "transpose_orders": transpose_orders(doc["codecs"]),
            "sharded": sharding is not None,
            "index_codecs": [c["name"] for c in sharding["configuration"].get("index_codecs", [])]
            if sharding else None,
            "index_location": sharding["configuration"].get("index_location") if sharding else None,
            "fill_value": repr(doc["fill_value"]),
            "chunk_key_encoding": doc["chunk_key_encoding"],
            "prefinal": prefinal_spellings(doc),
            "description": description, "expected_from": expected_from,
        })

    def finish(self) -> dict:
        implicit = implicit_groups(self.dir)
        prefinal = sorted({s for a in self.arrays for s in a["prefinal"]})
        generation = "2023" if prefinal or implicit else "final"
        return {"name": self.name, "store": f"stores/{self.name}", "description": self.description,
                "root": self.root, "generation": generation, "implicit_groups": implicit,
                "prefinal": prefinal, "groups": self.groups, "arrays": self.arrays,
                "skipped": self.skipped}


def codec_names(codecs: list[dict]) -> list[str]:
    """Flattened codec names, sharding's inner chain in brackets."""
    out: list[str] = []
    for c in codecs:
        if c["name"] == "sharding_indexed":
            inner = codec_names(c["configuration"].get("codecs", []))
            out.append(f"sharding_indexed[{','.join(inner)}]")
        else:
            out.append(c["name"])
    return out


def transpose_orders(codecs: list[dict]) -> list[Any]:
    """Every transpose ``order`` in the chain, nested ones included, as written."""
    out: list[Any] = []
    for c in codecs:
        if c["name"] == "transpose":
            out.append(c["configuration"]["order"])
        elif c["name"] == "sharding_indexed":
            out += transpose_orders(c["configuration"].get("codecs", []))
    return out


def implicit_groups(store_dir: Path) -> list[str]:
    """Directories above some node document that have no document of their own."""
    docs = {p.parent.relative_to(store_dir).as_posix() for p in store_dir.rglob("zarr.json")}
    docs = {"" if d == "." else d for d in docs}
    implicit = set()
    for d in docs:
        parts = d.split("/") if d else []
        for i in range(len(parts)):
            parent = "/".join(parts[:i])
            if parent not in docs:
                implicit.add(parent)
    return sorted(implicit)


def write_region(*regions: tuple[slice, ...]) -> Callable:
    """A partial write: only ``regions`` of the meant values are written."""
    def write(a: Any, data: np.ndarray) -> None:
        for r in regions:
            a[r] = data[r]
    return write


def with_fill(data: np.ndarray, fill: Any, *regions: tuple[slice, ...]) -> np.ndarray:
    """The values meant by a partial write: ``fill`` outside ``regions``."""
    out = np.full(data.shape, fill, dtype=data.dtype)
    for r in regions:
        out[r] = data[r]
    return out


# ------------------------------------------------------------------ the cases


def case_dtypes() -> Case:
    c = Case("dtypes", "every data type zarrita 0.2.x has, little and big endian, with a fill "
             "value and a partial write (fill visible)", root_attributes={"case": "dtypes"})
    fills = {"bool": True, "float32": 0.25, "float64": -1.5}
    region = (slice(0, 9), slice(2, 7))
    for dt in DTYPES:
        fill = fills.get(dt, 7 if dt.startswith("u") else -3)
        data = with_fill(values(dt, (13, 7)), fill, region)
        c.array(dt, data, chunk_shape=(5, 4), fill_value=fill, write=write_region(region),
                description=f"{dt}, [bytes little], fill {fill!r}")
        c.array(f"{dt}_F", values(dt, (6, 5)), chunk_shape=(4, 4),
                codecs=[transpose_codec("F"), bytes_codec()], description=f"{dt}, transpose F")
        if np.dtype(dt).itemsize > 1:
            data = values(dt, (11, 6))
            c.array(f"{dt}_be", data, chunk_shape=(4, 4), codecs=[bytes_codec("big")],
                    description=f"{dt}, [bytes big]")
    return c


def case_codecs() -> Case:
    c = Case("codecs", "every codec zarrita 0.2.x has, unsharded", root_attributes={"case": "codecs"})
    c.array("gzip1", values("int32", (17, 5)), chunk_shape=(6, 5), codecs=[bytes_codec(), gzip_codec(1)])
    c.array("gzip9", values("float64", (17, 5)), chunk_shape=(6, 5), codecs=[bytes_codec(), gzip_codec(9)])
    c.array("zstd0", values("uint16", (40,)), chunk_shape=(16,), codecs=[bytes_codec(), zstd_codec(0)])
    c.array("zstd5_checksum", values("int64", (40,)), chunk_shape=(16,),
            codecs=[bytes_codec(), zstd_codec(5, True)])
    types = ["uint8", "int16", "int32", "float32", "float64"]
    i = 0
    for cname in ["lz4", "lz4hc", "blosclz", "zstd", "zlib"]:
        for shuffle in ["noshuffle", "shuffle", "bitshuffle"]:
            dt = types[i % len(types)]
            i += 1
            c.array(f"blosc_{cname}_{shuffle}", values(dt, (10, 10)), chunk_shape=(4, 7),
                    codecs=[bytes_codec(), blosc_codec(typesize=np.dtype(dt).itemsize, cname=cname,
                                                       clevel=5, shuffle=shuffle)],
                    description=f"blosc {cname} {shuffle} on {dt}")
    c.array("crc32c", values("int16", (9, 9)), chunk_shape=(4, 4), codecs=[bytes_codec(), crc32c_codec()])
    c.array("gzip_crc32c", values("float32", (9, 9)), chunk_shape=(4, 4),
            codecs=[bytes_codec(), gzip_codec(), crc32c_codec()])
    c.array("transpose_C", values("int32", (7, 5)), chunk_shape=(4, 3),
            codecs=[transpose_codec("C"), bytes_codec()])
    c.array("transpose_F", values("int32", (7, 5)), chunk_shape=(4, 3),
            codecs=[transpose_codec("F"), bytes_codec()])
    c.array("transpose_F_3d", values("uint16", (5, 6, 7)), chunk_shape=(2, 3, 4),
            codecs=[transpose_codec("F"), bytes_codec(), zstd_codec(3)])
    c.array("transpose_10", values("float64", (7, 5)), chunk_shape=(4, 3),
            codecs=[transpose_codec((1, 0)), bytes_codec()])
    c.array("transpose_201", values("int16", (5, 6, 7)), chunk_shape=(2, 3, 4),
            codecs=[transpose_codec((2, 0, 1)), bytes_codec(), gzip_codec()],
            needs="transpose_nonsymmetric")
    c.array("big_gzip", values("float32", (12, 3)), chunk_shape=(5, 3),
            codecs=[bytes_codec("big"), gzip_codec()])
    c.array("transpose_F_big_blosc", values("uint32", (6, 9)), chunk_shape=(4, 4),
            codecs=[transpose_codec("F"), bytes_codec("big"),
                    blosc_codec(typesize=4, cname="lz4", shuffle="shuffle")])
    return c


def case_sharded() -> Case:
    c = Case("sharded", "sharding_indexed: index with and without checksum, index at the start, "
             "inner codecs, partial shards, missing shards, nested sharding", root_attributes={"case": "sharded"})
    c.array("default_index", values("int32", (20, 18)), chunk_shape=(8, 8),
            codecs=[sharding_codec((4, 4))], description="index_codecs [bytes, crc32c] (zarrita's default)")
    c.array("index_no_checksum", values("uint16", (20, 18)), chunk_shape=(8, 8),
            codecs=[sharding_codec((4, 4), [bytes_codec()], [bytes_codec()])],
            description="index_codecs [bytes]")
    c.array("index_start", values("float32", (16, 24)), chunk_shape=(8, 8),
            codecs=lambda: [sharding_codec((4, 4), [bytes_codec(), zstd_codec()], index_location="start")],
            needs="index_location_start", description="every inner chunk written (see case index_start_empty)")
    c.array("inner_gzip", values("float64", (16, 16)), chunk_shape=(16, 16),
            codecs=[sharding_codec((4, 8), [bytes_codec(), gzip_codec()])])
    c.array("inner_blosc", values("uint16", (30, 30)), chunk_shape=(16, 16),
            codecs=[sharding_codec((8, 8), [bytes_codec(), blosc_codec(typesize=2, cname="zstd", shuffle="bitshuffle")])])
    c.array("inner_transpose_F_big", values("int64", (12, 10)), chunk_shape=(8, 10),
            codecs=[sharding_codec((4, 5), [transpose_codec("F"), bytes_codec("big"), gzip_codec()])])
    c.array("inner_transpose_201", values("float32", (8, 6, 10)), chunk_shape=(4, 6, 10),
            codecs=[sharding_codec((2, 3, 5), [transpose_codec((2, 0, 1)), bytes_codec()])],
            needs="transpose_nonsymmetric")
    region = (slice(0, 5), slice(0, 3))
    data = with_fill(values("int32", (24, 24)), -1, region)
    c.array("partial", data, chunk_shape=(8, 8), fill_value=-1, write=write_region(region),
            codecs=[sharding_codec((4, 4), [bytes_codec(), zstd_codec()])],
            description="one shard with two inner chunks, the rest missing")
    regions = ((slice(0, 4), slice(0, 4)), (slice(12, 16), slice(12, 16)))
    data = with_fill(values("uint8", (16, 16)), 9, *regions)
    c.array("sparse_shards", data, chunk_shape=(8, 8), fill_value=9, write=write_region(*regions),
            codecs=[sharding_codec((4, 4))], description="first and last shard, one inner chunk each")
    c.array("fill_only", np.zeros((10, 10), dtype="float32"), chunk_shape=(8, 8),
            codecs=[sharding_codec((4, 4))], description="every value the fill value")
    c.array("shard_larger_than_array", values("int16", (5, 3)), chunk_shape=(16, 16),
            codecs=[sharding_codec((4, 4))], description="shard and inner chunks beyond the array")
    c.array("ragged_3d", values("float64", (9, 7, 5)), chunk_shape=(4, 4, 4),
            codecs=[sharding_codec((2, 2, 2), [bytes_codec(), gzip_codec()])])
    # 1-d and 0-d shards: zarrita 0.2.x cannot write them (indexing.decode_morton: max(*bits)
    # of a single dimension raises), so there are none in this corpus
    c.array("uint64", values("uint64", (50, 3)), chunk_shape=(32, 3), codecs=[sharding_codec((8, 3))])
    c.array("nested", values("uint16", (16, 16)), chunk_shape=(16, 16),
            codecs=[sharding_codec((8, 8), [sharding_codec((4, 4))])], description="sharding in sharding")
    c.array("bool", values("bool", (10, 10)), chunk_shape=(8, 8), codecs=[sharding_codec((4, 4))])
    return c


def case_outer_codec() -> Case:
    c = Case("outer_codec", "a bytes->bytes codec after sharding_indexed: the whole shard is "
             "compressed, its index is inside the gzip stream (valid v1.0)", root_attributes={"case": "outer_codec"})
    c.array("outer_gzip", values("int16", (16, 16)), chunk_shape=(8, 8),
            codecs=[sharding_codec((4, 4)), gzip_codec()])
    c.array("outer_crc32c", values("uint32", (10, 10)), chunk_shape=(8, 8),
            codecs=[sharding_codec((4, 4), [bytes_codec()], [bytes_codec()]), crc32c_codec()])
    return c


def case_index_start_empty() -> Case:
    c = Case("index_start_empty", "index_location start with empty inner chunks: zarrita 0.2.2+ "
             "adds the index size to every offset, the empty marker 2**64-1 too, so an empty "
             "entry reads (index size - 1, 2**64-1); a transpose F array beside it makes the "
             "store 2023", root_attributes={"case": "index_start_empty"})
    c.array("ragged", values("float32", (20, 18)), chunk_shape=(8, 8),
            codecs=lambda: [sharding_codec((4, 4), [bytes_codec(), zstd_codec()], index_location="start")],
            needs="index_location_start", description="edge shards hold inner chunks wholly outside the array")
    # an empty inner chunk *inside* the array is unreadable for zarrita itself (it reads the
    # wrapped entry), so only chunks wholly outside the array are empty here
    c.array("transpose_F", values("int8", (4, 6)), chunk_shape=(4, 4), codecs=[transpose_codec("F"), bytes_codec()])
    return c


def case_nonfinite_fill() -> Case:
    c = Case("nonfinite_fill", "NaN, Infinity and -Infinity fill values: zarrita writes them as bare "
             "JSON tokens (Python's json.dumps), not the strings v1.0 says", root_attributes={"case": "nonfinite_fill"})
    region = (slice(0, 5), slice(1, 3))
    for name, dt, fill in [("nan_f32", "float32", float("nan")), ("inf_f64", "float64", float("inf")),
                           ("neg_inf_f32", "float32", float("-inf"))]:
        c.array(name, with_fill(values(dt, (9, 4)), fill, region), chunk_shape=(4, 4), fill_value=fill,
                write=write_region(region))
    c.array("nan_sharded", with_fill(values("float64", (9, 4)), float("nan"), region), chunk_shape=(8, 4),
            fill_value=float("nan"), write=write_region(region), codecs=[sharding_codec((4, 2))])
    return c


def case_shapes() -> Case:
    c = Case("shapes", "0-d, 1-d, 3-d, ragged edges, chunks larger than the array, never written",
             root_attributes={"case": "shapes"})
    c.array("zero_d", values("int32", ()), chunk_shape=(), fill_value=3)
    c.array("zero_d_unwritten", np.full((), 3.25, dtype="float64"), chunk_shape=(), fill_value=3.25,
            write=lambda a, d: None)
    c.array("one_d", values("int8", (31,)), chunk_shape=(8,))
    c.array("three_d_ragged", values("int32", (7, 6, 5)), chunk_shape=(3, 4, 2))
    c.array("chunk_larger", values("uint16", (5, 3)), chunk_shape=(64, 64), codecs=[bytes_codec(), gzip_codec()])
    c.array("chunk_larger_3d", values("float32", (2, 3, 4)), chunk_shape=(10, 10, 10))
    c.array("never_written", np.full((6, 6), 42, dtype="uint32"), chunk_shape=(4, 4), fill_value=42,
            write=lambda a, d: None)
    c.array("single_element", values("int64", (1, 1, 1)), chunk_shape=(1, 1, 1))
    return c


def case_keys() -> Case:
    c = Case("keys", "chunk_key_encoding default and v2, each separator, sharded and not",
             root_attributes={"case": "keys"})
    for enc, sep, label in [("default", "/", "default_slash"), ("default", ".", "default_dot"),
                            ("v2", ".", "v2_dot"), ("v2", "/", "v2_slash")]:
        c.array(label, values("int16", (9, 10)), chunk_shape=(4, 4), chunk_key_encoding=(enc, sep))
        c.array(f"{label}_sharded", values("float32", (9, 10)), chunk_shape=(8, 8),
                chunk_key_encoding=(enc, sep), codecs=[sharding_codec((4, 4))])
        c.array(f"{label}_3d", values("uint8", (3, 4, 5)), chunk_shape=(2, 2, 2), chunk_key_encoding=(enc, sep))
    c.array("v2_zero_d", values("int32", ()), chunk_shape=(), chunk_key_encoding=("v2", "."))
    return c


def case_hierarchy() -> Case:
    c = Case("hierarchy", "nested groups with attributes, implicit groups, dimension names, "
             "array attributes, names containing c", root_attributes={"title": "zarrita corpus", "n": [1, 2]})
    c.group("g", {"level": 1, "nested": {"a": None, "b": [True, 1.5]}})
    c.group("g/h", {"level": 2})
    c.array("g/h/arr", values("int32", (6, 4)), chunk_shape=(3, 3), dimension_names=["y", "x"],
            attributes={"units": "m", "scale": [0.5, 0.25]})
    c.array("g/sharded", values("float64", (6, 8)), chunk_shape=(6, 8), codecs=[sharding_codec((3, 4))],
            dimension_names=["t", "c"])
    c.array("implicit/deeper/arr", values("uint8", (5,)), chunk_shape=(2,),
            description="its two parent groups have no document")
    c.array("c/c0", values("int16", (3, 3)), chunk_shape=(2, 2), description="paths looking like chunk keys")
    c.array("g/c", values("int16", (3,)), chunk_shape=(2,))
    return c


def case_implicit_root() -> Case:
    c = Case("implicit_root", "no zarr.json at the root (arrays addressed by path)", root="implicit")
    c.array("a", values("float32", (7, 7)), chunk_shape=(4, 4))
    c.array("b/c", values("int32", (9, 2)), chunk_shape=(4, 2), codecs=[sharding_codec((2, 1))])
    return c


def case_root_array() -> Case:
    c = Case("root_array", "the root itself is an array", root="array")
    c.array("", values("int16", (10, 10)), chunk_shape=(8, 8), codecs=[sharding_codec((4, 4), [transpose_codec("F"), bytes_codec()])])
    return c


def case_final() -> Case:
    c = Case("final", "only spellings v1.0 kept: what zarrita 0.2.x writes without an 'F'/'C' "
             "transpose, a non-finite fill value or an implicit group", root_attributes={"case": "final"})
    c.array("plain", values("int32", (9, 9)), chunk_shape=(4, 4))
    c.array("blosc", values("float64", (9, 9)), chunk_shape=(4, 4),
            codecs=[transpose_codec((1, 0)), bytes_codec(), blosc_codec(typesize=8, shuffle="shuffle")])
    c.array("sharded", values("uint16", (9, 9)), chunk_shape=(8, 8), codecs=[sharding_codec((4, 4))])
    return c


CASES = [case_dtypes, case_codecs, case_sharded, case_outer_codec, case_index_start_empty,
         case_nonfinite_fill, case_shapes, case_keys, case_hierarchy, case_implicit_root,
         case_root_array, case_final]


def main() -> None:
    global OUT
    OUT = Path(sys.argv[1])
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "stores").mkdir(parents=True)
    cases = [make().finish() for make in CASES]
    np.savez(OUT / "expected.npz", **EXPECTED)
    manifest = {"zarrita_version": VERSION, "numpy_version": np.__version__,
                "numcodecs_version": numcodecs.__version__, "seed": 20231, "cases": cases}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    n = sum(len(c["arrays"]) for c in cases)
    print(f"zarrita {VERSION}: {n} arrays in {len(cases)} stores -> {OUT}")


OUT: Path
EXPECTED: dict[str, np.ndarray] = {}

if __name__ == "__main__":
    main()
