"""Generate a draft-era (2022 sharding storage transformer) corpus with zarr-python 2.18.

Runs INSIDE the legacy virtualenv (compat/.venv-legacy), never in the project venv.

    python make_corpus.py OUTDIR

Writes, under OUTDIR:
  stores/<case>/            one DirectoryStoreV3 per case (zarr.json, meta/, data/)
  expected/<case>/<i>.npy   the values the generator *intended* for each array,
                            computed with numpy independently of zarr
  manifest.json             every case, every array, every skipped case

Everything is deterministic (seeded numpy RNG, fixed write order), so the bytes of
the corpus depend only on this script and the zarr/numcodecs versions.
"""

from __future__ import annotations

import os

os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"

import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numcodecs  # noqa: E402
import numpy as np  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
import zarr  # noqa: E402
from numcodecs import BZ2, LZ4, LZMA, Blosc, GZip, Zlib, Zstd  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer  # noqa: E402

SEED = 20240229

# numcodecs.GZip writes the current time into each gzip header (bytes 4..8), which is
# the only non-deterministic byte in the corpus. Pin it so regeneration is byte-identical.
import gzip as _gzip  # noqa: E402
import types as _types  # noqa: E402

_gzip.time = _types.SimpleNamespace(time=lambda: 1645142400.0)  # 2022-02-18
MAX_U64 = 2**64 - 1


def T(cps):
    return [ShardingStorageTransformer("indexed", chunks_per_shard=cps)]


# --------------------------------------------------------------------------- helpers


class Case:
    """One store directory; collects manifest entries for its arrays/groups."""

    def __init__(self, out: Path, name: str, description: str):
        self.name = name
        self.description = description
        self.out = out
        self.dir = out / "stores" / name
        self.expected_dir = out / "expected" / name
        for d in (self.dir, self.expected_dir):
            if d.exists():
                shutil.rmtree(d)
        self.dir.mkdir(parents=True)
        self.expected_dir.mkdir(parents=True)
        self.store = DirectoryStoreV3(str(self.dir))
        self.arrays: list[dict] = []
        self.groups: list[dict] = []
        self.notes: list[str] = []
        self._pending: list[tuple] = []

    # -- arrays -------------------------------------------------------------
    def array(self, path, shape, dtype, chunks, cps=None, *, description, fill_value=0,
              compressor="default", filters=None, order="C", separator=None,
              attrs=None, write_empty_chunks=True, object_codec=None, **extra):
        kw = dict(shape=shape, chunks=chunks, dtype=dtype, store=self.store, path=path,
                  zarr_version=3, fill_value=fill_value, order=order,
                  write_empty_chunks=write_empty_chunks)
        if compressor != "default":
            kw["compressor"] = compressor
        if filters is not None:
            kw["filters"] = filters
        if separator is not None:
            kw["dimension_separator"] = separator
        if cps is not None:
            kw["storage_transformers"] = T(cps)
        if object_codec is not None:
            kw["object_codec"] = object_codec
        z = zarr.create(**kw)
        if attrs:
            z.attrs.update(attrs)
        # expected values: fill first (numpy only), then mirror every write
        exp = np.empty(z.shape, dtype=z.dtype)
        if z.dtype == object:
            exp[...] = fill_value
        elif fill_value is None:
            exp[...] = np.zeros((), dtype=z.dtype)
        else:
            exp[...] = np.array(fill_value, dtype=z.dtype) if not isinstance(fill_value, str) \
                else np.array(fill_value).astype(z.dtype)
        entry = {"path": path, "description": description, **extra}
        self._pending.append((z, exp, entry))
        return Writer(z, exp)

    def group(self, path, attrs=None):
        g = zarr.group(self.store, path=path, zarr_version=3)
        if attrs:
            g.attrs.update(attrs)
        self.groups.append({"path": path, "attributes": attrs or {}})
        return g

    # -- finalisation ---------------------------------------------------------
    def finish(self) -> dict:
        for i, (_z, exp, entry) in enumerate(self._pending):
            meta = read_array_meta(self.dir, entry["path"])
            st = meta.get("storage_transformers") or []
            cps = st[0]["configuration"]["chunks_per_shard"] if st else None
            npy = self.expected_dir / f"{i}.npy"
            np.save(npy, exp, allow_pickle=(exp.dtype == object))
            sep = meta.get("dimension_separator", meta["chunk_grid"].get("separator", "/"))
            e = {
                "path": entry.pop("path"),
                "shape": list(meta["shape"]),
                "dtype": exp.dtype.descr if exp.dtype.fields else exp.dtype.str,
                "data_type": meta["data_type"],
                "chunks": list(meta["chunk_grid"]["chunk_shape"]),
                "chunks_per_shard": cps,
                "compressor": meta.get("compressor"),
                "filters": meta.get("attributes", {}).get("filters"),
                "order": meta["chunk_memory_layout"],
                "separator": sep,
                "fill_value": meta["fill_value"],
                "expected": str(npy.relative_to(self.out)),
                **entry,
            }
            if cps is not None:
                e["shards"] = shard_stats(self.dir, e["path"], cps, len(meta["shape"]))
            self.arrays.append(e)
        return {
            "name": self.name,
            "store": str(self.dir.relative_to(self.out)),
            "description": self.description,
            "arrays": self.arrays,
            "groups": self.groups,
            "notes": self.notes,
        }


class Writer:
    """Writes through zarr 2.18 and mirrors the write into the expected numpy array."""

    def __init__(self, z, exp):
        self.z, self.exp = z, exp

    def __setitem__(self, sel, value):
        self.z[sel] = value
        self.exp[sel] = value

    def delete_chunk(self, chunk_coords):
        """Delete one inner chunk through the array's (transformed) chunk store."""
        key = self.z._chunk_key(chunk_coords)
        del self.z.chunk_store[key]
        sl = tuple(slice(c * s, min((c + 1) * s, n))
                   for c, s, n in zip(chunk_coords, self.z.chunks, self.z.shape))
        self.exp[sl] = self.z.fill_value
        return key


def read_array_meta(store_dir: Path, path: str) -> dict:
    p = store_dir / "meta" / ("root.array.json" if path == "" else f"root/{path}.array.json")
    return json.loads(p.read_text())


def data_dir(store_dir: Path, path: str) -> Path:
    return store_dir / "data" / "root" / path if path else store_dir / "data" / "root"


CHUNK_KEY_RE = re.compile(r"^c\d+([./]\d+)*$")


def shard_stats(store_dir: Path, path: str, cps, ndim: int) -> dict:
    """Parse every shard object on disk: size, live chunks, dead (unreferenced) bytes."""
    cps = list(cps) + [1] * max(0, ndim - len(cps))
    n = int(np.prod(cps)) if cps else 1
    base = data_dir(store_dir, path)
    out = {}
    if not base.exists():
        return out
    prefix = "data/root/" + (path + "/" if path else "")
    for f in sorted(p for p in base.rglob("*") if p.is_file()):
        rel = f.relative_to(store_dir).as_posix()
        if not CHUNK_KEY_RE.match(rel[len(prefix):]):
            continue
        buf = f.read_bytes()
        idx = np.frombuffer(buf[-16 * n:], dtype="<u8").reshape(n, 2)
        live = [(i, int(o), int(b)) for i, (o, b) in enumerate(idx)
                if not (o == MAX_U64 and b == MAX_U64)]
        covered = np.zeros(len(buf) - 16 * n, dtype=bool)
        for _, o, b in live:
            covered[o:o + b] = True
        out[rel] = {
            "size": len(buf),
            "live_chunks": len(live),
            "live_bytes": int(sum(b for _, _, b in live)),
            "dead_bytes": int((~covered).sum()),
            # local C-order index positions of the live chunks, in payload (offset) order
            "payload_order": [i for i, _, _ in sorted(live, key=lambda t: t[1])],
        }
    return out


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng([SEED, sum(map(ord, name)) * 7919 + len(name)])


def rand_values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == bool:  # noqa: E721 - a numpy dtype equals its Python type
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -30000), min(info.max, 2**31 - 1)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind == "M":
        base = np.datetime64("2022-02-18T00:00:00", "ns").astype(np.int64)
        return (base + rng.integers(0, 10**15, size=shape)).astype(dtype)
    if dtype.kind == "S":
        alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype="S1")
        n = dtype.itemsize
        lens = rng.integers(0, n + 1, size=shape)
        chars = rng.choice(alphabet, size=tuple(shape) + (n,))
        return np.array([b"".join(c[:k]) for c, k in zip(chars.reshape(-1, n), lens.ravel())],
                        dtype=dtype).reshape(shape)
    if dtype.kind == "U":
        alphabet = list("abcdefghijklmnopqrstuvwxyzäöüßλπ€")
        n = dtype.itemsize // 4
        flat = ["".join(rng.choice(alphabet, size=int(k))) for k in
                rng.integers(0, n + 1, size=int(np.prod(shape)))]
        return np.array(flat, dtype=dtype).reshape(shape)
    raise TypeError(dtype)


# --------------------------------------------------------------------------- cases

CASES = []


def case(name, description):
    def deco(fn):
        CASES.append((name, description, fn))
        return fn
    return deco


@case("dtypes", "one sharded 2-d array per data type, ragged edges, blosc default compressor")
def _dtypes(c: Case):
    rng = rng_for(c.name)
    specs = [
        ("u1", 0), ("<i2", -1), (">u4", 7), ("<f4", "NaN"), ("<f8", -0.5), ("bool", False),
        ("<c16", 1 + 2j), ("<M8[ns]", 0), ("|S7", b"fill"), ("<U5", "ø"), ("<i8", 0), ("<f2", 0),
    ]
    for dt, fill in specs:
        name = np.dtype(dt).str.replace("<", "lt_").replace(">", "be_").replace("|", "na_") \
            .replace("[", "_").replace("]", "")
        fv = np.nan if fill == "NaN" else fill
        w = c.array(f"dtypes/{name}", (7, 9), dt, (2, 4), (2, 2), fill_value=fv,
                    description=f"{dt} sharded (2,4)x(2,2) on (7,9); fill {fill!r}; "
                                f"rows 5-6 stay fill (chunk row 2 half written, chunk row 3 "
                                f"never written)")
        w[:5, :] = rand_values(rng, (5, 9), dt)
    # an unsharded twin for one dtype, in the same store
    w = c.array("dtypes/unsharded_lt_f8", (7, 9), "<f8", (2, 4), None, fill_value=-0.5,
                description="<f8 unsharded twin-style array next to sharded ones")
    w[:5, :] = rand_values(rng, (5, 9), "<f8")


@case("compressors", "the same int/float data under every compressor zarr 2.18 can describe in v3")
def _compressors(c: Case):
    rng = rng_for(c.name)
    data = (np.cumsum(rng.integers(-3, 4, size=(40, 30)), axis=1)).astype("<i4")
    comps = {
        "blosc_lz4_shuffle": Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE),
        "blosc_zstd_bitshuffle": Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE),
        "blosc_zstd_shuffle": Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE),
        "blosc_lz4_noshuffle": Blosc(cname="lz4", clevel=9, shuffle=Blosc.NOSHUFFLE),
        "blosc_blosclz_autoshuffle": Blosc(cname="blosclz", clevel=5, shuffle=Blosc.AUTOSHUFFLE),
        "zstd": Zstd(level=3),
        "gzip": GZip(level=5),
        "zlib": Zlib(level=1),
        "bz2": BZ2(level=9),
        "lzma": LZMA(preset=1),
        "lz4": LZ4(acceleration=1),
        "none": None,
    }
    for name, comp in comps.items():
        w = c.array(f"{name}/i4", data.shape, "<i4", (8, 7), (2, 3), compressor=comp,
                    description=f"<i4 (40,30) chunks (8,7) cps (2,3) compressor {name}")
        w[:] = data
        w = c.array(f"{name}/f8", (33,), "<f8", (5,), (3,), compressor=comp, fill_value=np.nan,
                    description=f"<f8 (33,) chunks 5 cps 3, compressor {name}, partial")
        w[3:29] = rng.standard_normal(26)


@case("filters", "numcodecs filters stored in attributes['filters'] (zarr 2.18 v3 convention)")
def _filters(c: Case):
    rng = rng_for(c.name)
    w = c.array("delta", (50,), "<i4", (8,), (4,), filters=[numcodecs.Delta(dtype="<i4")],
                compressor=Zlib(level=1), description="<i4 with Delta filter + zlib, sharded")
    w[:] = np.cumsum(rng.integers(0, 10, 50)).astype("<i4")
    w = c.array("quantize", (6, 10), "<f8", (3, 4), (2, 2),
                filters=[numcodecs.Quantize(digits=3, dtype="<f8")], compressor=Zstd(level=1),
                description="<f8 with Quantize(digits=3) + zstd, sharded; expected = quantized")
    vals = rng.standard_normal((6, 10))
    w.z[:] = vals
    w.exp[:] = numcodecs.Quantize(digits=3, dtype="<f8").decode(
        numcodecs.Quantize(digits=3, dtype="<f8").encode(vals)).reshape(6, 10)
    w = c.array("fixedscaleoffset", (20,), "<f8", (6,), (2,),
                filters=[numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i2")],
                compressor=None,
                description="<f8 with FixedScaleOffset(scale=10, astype <i2), no compressor")
    vals = np.round(rng.standard_normal(20) * 50) / 10
    w[:] = vals
    w = c.array("delta_unsharded", (50,), "<i4", (8,), None, filters=[numcodecs.Delta(dtype="<i4")],
                compressor=Zlib(level=1), description="<i4 with Delta + zlib, unsharded")
    w[:] = np.cumsum(rng.integers(0, 10, 50)).astype("<i4")


@case("separators", "'/' and '.' dimension separators, sharded and not")
def _separators(c: Case):
    rng = rng_for(c.name)
    data = rng.integers(0, 1000, size=(6, 7, 5)).astype("<u2")
    for sep, nm in (("/", "slash"), (".", "dot")):
        w = c.array(f"{nm}/sharded", data.shape, "<u2", (2, 3, 2), (2, 1, 2), separator=sep,
                    description=f"3-d <u2 sharded, dimension_separator {sep!r}, ragged")
        w[:] = data
        w = c.array(f"{nm}/unsharded", data.shape, "<u2", (2, 3, 2), None, separator=sep,
                    description=f"3-d <u2 unsharded, dimension_separator {sep!r}")
        w[:] = data


@case("order_f", "chunk_memory_layout F (Fortran order chunk bytes)")
def _order_f(c: Case):
    rng = rng_for(c.name)
    data = rng.integers(-500, 500, size=(9, 11, 4)).astype("<i2")
    w = c.array("f_none", data.shape, "<i2", (4, 3, 4), (2, 2, 1), order="F", compressor=None,
                description="F order, no compressor: inner chunk bytes are column-major")
    w[:] = data
    w = c.array("f_blosc", data.shape, "<i2", (4, 3, 4), (2, 2, 1), order="F",
                description="F order, blosc")
    w[:] = data
    w = c.array("f_unsharded", data.shape, "<i2", (4, 3, 4), None, order="F", compressor=None,
                description="F order unsharded")
    w[:] = data
    w = c.array("c_none", data.shape, "<i2", (4, 3, 4), (2, 2, 1), order="C", compressor=None,
                description="same data in C order for comparison")
    w[:] = data


@case("ragged", "shape not a multiple of chunks, nor of shards")
def _ragged(c: Case):
    rng = rng_for(c.name)
    w = c.array("r1", (25,), "<f4", (4,), (3,), fill_value=1.5,
                description="1-d 25 elems, chunks 4, cps 3 -> 7 chunks; the last shard has "
                            "1 of 3 chunks in range, and that chunk holds 1 element")
    w[:] = rng.standard_normal(25).astype("<f4")
    w = c.array("r2", (13, 17), "u1", (3, 5), (2, 3), compressor=None, fill_value=255,
                description="2-d ragged in both dims, no compressor (edge chunks padded with fill)")
    w[:] = rng.integers(0, 200, (13, 17)).astype("u1")
    w = c.array("r3", (5, 1, 9), "<i8", (2, 1, 4), (3, 1, 3), compressor=Zstd(level=1),
                description="3-d with a length-1 dimension, shards bigger than the array")
    w[:] = rng.integers(-(10**12), 10**12, (5, 1, 9))
    w = c.array("tiny_big_shard", (3,), "<i2", (2,), (8,), compressor=None,
                description="shard covers 8 chunks but only 2 are inside the array")
    w[:] = [1, -2, 3]


@case("partial", "partially written arrays: whole shards missing, inner chunks missing")
def _partial(c: Case):
    rng = rng_for(c.name)
    w = c.array("p2d", (16, 16), "<i4", (2, 2), (2, 2), fill_value=-7, compressor=GZip(level=1),
                description="(16,16) chunks 2 cps 2: only a few scattered chunks written")
    w[0:2, 0:2] = 1                     # chunk (0,0) of shard (0,0)
    w[2:4, 6:8] = 2                     # chunk (1,3) of shard (0,1)
    w[9:11, 9:11] = rng.integers(0, 9, (2, 2))  # touches 4 chunks across shards (2,2)
    w[15, 15] = 99                      # last chunk only (partial chunk write)
    w = c.array("p1d_unsharded", (16,), "<i4", (2,), None, fill_value=-7,
                description="unsharded with missing chunks")
    w[4:7] = [1, 2, 3]
    w = c.array("empty", (10, 10), "<f8", (3, 3), (2, 2), fill_value=np.nan,
                description="sharded array never written: no data keys at all")
    w = c.array("no_write_empty", (12,), "<u2", (2,), (3,), fill_value=0,
                write_empty_chunks=False,
                description="write_empty_chunks=False: chunks equal to fill are never stored")
    w[:] = np.array([0, 0, 1, 0, 0, 0, 0, 0, 5, 6, 0, 0], dtype="<u2")


@case("deleted", "chunks deleted through the transformer: index rewritten, dead bytes left")
def _deleted(c: Case):
    rng = rng_for(c.name)
    w = c.array("del_explicit", (8, 8), "<i2", (2, 2), (2, 2), compressor=Zlib(level=1),
                fill_value=0,
                description="all 16 chunks written, then `del chunk_store[key]` for chunks "
                            "(0,0),(1,1) (shard (0,0) keeps 2 live chunks) and all 4 chunks of "
                            "shard (1,1) (shard object removed)")
    w[:] = rng.integers(1, 100, (8, 8)).astype("<i2")
    deleted = [w.delete_chunk(cc) for cc in [(0, 0), (1, 1), (2, 2), (2, 3), (3, 2), (3, 3)]]
    w = c.array("del_by_fill", (12,), "<u4", (2,), (3,), compressor=None, fill_value=0,
                write_empty_chunks=False,
                description="write_empty_chunks=False, then overwriting chunks with the fill "
                            "value makes zarr 2.18 delete them (index-only rewrite)")
    w[:] = np.arange(1, 13, dtype="<u4")
    w[2:4] = 0          # chunk 1 (shard 0) -> deleted
    w[6:8] = 0          # chunk 3 (shard 1, first) -> deleted
    w = c.array("rewritten", (8,), "<i4", (2,), (4,), compressor=None,
                description="chunks of one shard rewritten several times in a scrambled order "
                            "(payload order != index order; whole-shard rewrite, no dead bytes)")
    for cc in [0, 3, 1, 2, 0, 2]:  # last write: chunk 2 -> it comes first in the object
        w[cc * 2:cc * 2 + 2] = rng.integers(0, 1000, 2)
    c.notes.append("deleted chunk keys: " + ", ".join(deleted))


@case("short_cps", "chunks_per_shard shorter than ndim (2.18 pads with 1s on the right)")
def _short_cps(c: Case):
    rng = rng_for(c.name)
    data = rng.integers(0, 255, (5, 6, 7)).astype("u1")
    w = c.array("cps1_of_3", data.shape, "u1", (2, 2, 3), (2,), compressor=None,
                description="3-d array, chunks_per_shard=(2,) stored as [2] "
                            "(effective (2,1,1)); written directly by zarr 2.18")
    w[:] = data
    w = c.array("cps2_of_3", data.shape, "u1", (2, 2, 3), (2, 3), compressor=Blosc(),
                description="3-d array, chunks_per_shard=(2,3) stored as [2,3] (effective (2,3,1))")
    w[:] = data
    w = c.array("cps_int_2d", (9, 4), "<i2", (2, 2), 3, compressor=None,
                description="chunks_per_shard given as int 3 -> stored [3] (effective (3,1))")
    w[:] = np.arange(36, dtype="<i2").reshape(9, 4)


@case("root_array", "sharded array at the root path ''")
def _root_array(c: Case):
    rng = rng_for(c.name)
    w = c.array("", (10, 6), "<f8", (3, 4), (2, 1), compressor=Zlib(level=1),
                attrs={"units": "m", "nested": {"a": [1, 2]}},
                description="root array (meta/root.array.json, data/root/c<i>/<j>)")
    w[:] = rng.standard_normal((10, 6))


@case("root_array_dot", "unsharded root array with '.' separator")
def _root_array_dot(c: Case):
    w = c.array("", (5, 5), "<i2", (2, 2), None, separator=".", compressor=None,
                description="root array unsharded, keys data/root/c<i>.<j>")
    w[:] = np.arange(25, dtype="<i2").reshape(5, 5)


@case("zero_d", "0-d arrays, sharded and unsharded")
def _zero_d(c: Case):
    w = c.array("sharded", (), "<f8", (), (), fill_value=0.0, compressor=None,
                description="0-d sharded: chunk_shape [], chunks_per_shard [1], key c0")
    w[...] = 3.25
    w = c.array("sharded_compressor_dropped", (), "<i4", (), (), fill_value=-1,
                compressor=Blosc(),
                description="0-d sharded, compressor=Blosc() requested: zarr 2.18 drops "
                            "compressors for 0-d arrays (no 'compressor' in metadata, raw payload)")
    w[...] = 42
    w = c.array("unsharded", (), "<c16", (), None, fill_value=0, compressor=None,
                description="0-d unsharded complex, key c0")
    w[...] = 1.5 - 2j
    w = c.array("sharded_unwritten", (), "<u2", (), (), fill_value=7,
                description="0-d sharded never written -> fill value")


@case("hierarchy", "nested groups with attributes, sharded next to unsharded arrays, "
                   "paths containing 'c', consolidated metadata")
def _hierarchy(c: Case):
    rng = rng_for(c.name)
    c.group("", {"title": "root group", "version": 1})
    c.group("acquisition", {"instrument": "scope", "channels": ["c0", "c1"]})
    c.group("acquisition/calibration/deep", {"depth": 3, "none": None, "pi": 3.14159})
    c.group("empty_group", {})
    cube = rng.integers(0, 4096, (4, 6, 6)).astype("<u2")
    w = c.array("acquisition/cube", (4, 6, 6), "<u2", (1, 3, 3), (2, 2, 2),
                attrs={"long_name": "cube", "scale": [1.0, 0.5, 0.5]},
                description="sharded, path containing 'c' (key parsing uses rpartition('c'))")
    w[:] = cube
    w = c.array("acquisition/cube_unsharded", (4, 6, 6), "<u2", (1, 3, 3), None,
                description="unsharded twin of acquisition/cube")
    w[:] = cube
    w = c.array("acquisition/calibration/deep/c", (7,), "<f4", (2,), (2,), compressor=Zstd(1),
                description="array literally named 'c' three groups deep (implicit parent "
                            "'acquisition/calibration')")
    w[:] = rng.standard_normal(7).astype("<f4")
    w = c.array("acquisition/calibration/offsets", (3, 2), "<i8", (3, 2), None,
                description="unsharded in an implicit group")
    w[:] = [[1, 2], [3, 4], [5, 6]]
    w = c.array("implicit_only/arr", (4,), "u1", (2,), (2,),
                description="sharded array whose parent group has no document")
    w[:] = [1, 2, 3, 4]
    zarr.consolidate_metadata(c.store)
    c.notes.append("meta/root/consolidated/.zmetadata + meta/root/consolidated.group.json "
                   "written by zarr.consolidate_metadata (2.18 also lists 'consolidated' as a group)")


@case("odd_dtypes", "dtypes 2.18 accepts with sharding that are not plain scalars")
def _odd_dtypes(c: Case):
    rng = rng_for(c.name)
    sdt = np.dtype([("a", "<i4"), ("b", "<f8"), ("s", "S3")])
    w = c.array("structured", (5,), sdt, (2,), (2,), fill_value=None, compressor=None,
                description="structured dtype (data_type is a descr list)")
    vals = np.zeros(5, dtype=sdt)
    vals["a"] = rng.integers(0, 100, 5)
    vals["b"] = rng.standard_normal(5)
    vals["s"] = [b"x", b"yy", b"zzz", b"", b"q"]
    w[:] = vals
    w = c.array("subarray", (4,), np.dtype(("<i2", (3,))), (2,), (2,), compressor=None,
                description="subarray dtype (<i2,(3,)): stored shape gets the extra dim, "
                            "chunks_per_shard [2] shorter than stored ndim")
    assert w.z.shape == (4, 3) and w.z.dtype == np.dtype("<i2"), (w.z.shape, w.z.dtype)
    w[:] = np.arange(12, dtype="<i2").reshape(4, 3)
    w = c.array("vlen_utf8", (5,), object, (2,), (2,), fill_value="",
                object_codec=numcodecs.VLenUTF8(), compressor=Zlib(1),
                description="object dtype with VLenUTF8 object codec (filters attribute)")
    w[:] = np.array(["α", "bb", "", "dddd", "e"], dtype=object)


@case("resized_defect", "legacy defect: Array.resize() drops storage_transformers from metadata")
def _resized(c: Case):
    w = c.array("resized", (4,), "u1", (2,), (2,), compressor=None,
                description="sharded (4,) written, then resize(6): metadata has no "
                            "storage_transformers but the object on disk is a shard",
                legacy_defect="resize dropped storage_transformers; zarr 2.18 then reads "
                              "the shard object as an unsharded chunk",
                intended_chunks_per_shard=[2])
    w[:] = [1, 2, 3, 4]
    w.z.resize(6)
    # intended values; zarr 2.18 itself reads something else (see legacy_defect)
    c._pending[-1] = (w.z, np.array([1, 2, 3, 4, 0, 0], dtype="u1"), c._pending[-1][2])


@case("twins", "zarr-js's cases written here: each sharded array next to an unsharded twin holding "
               "the same data (same inner chunk shape, or the twin's chunk = chunk x chunks_per_shard), "
               "zarr-js's dtypes with their default fill values (0, false, \"\"), zlib level 1 or none")
def _twins(c: Case):
    """The 47 zarr-js stores (../shared/fixtures, not in the repository) as corpus arrays.

    zarr-js: ``<ndim>d.<layout>.<compression>[.sharded].<dtype>``: contiguous (one chunk,
    chunks_per_shard 1), chunked, chunked.filled (chunks never written), chunked.ragged,
    chunked.mixed (chunk shape differs per dimension, shards beyond the array), 3-d
    contiguous with a shard of 27 chunks of which one is inside the array. Every pair is
    ``<name>/sharded`` and ``<name>/unsharded``; the manifest entry's ``twin`` names the other.
    """
    rng = rng_for(c.name)
    zlib1 = Zlib(level=1)

    def pair(name, shape, dtype, chunks, cps, twin_chunks=None, *, compressor=zlib1, write=None,
             description):
        fill = "" if np.dtype(dtype).kind in "SU" else (False if np.dtype(dtype) == bool else 0)
        data = rand_values(rng, shape, dtype)
        sel = write if write is not None else tuple(slice(None) for _ in shape)
        for kind, ch, cp in (("sharded", chunks, cps), ("unsharded", twin_chunks or chunks, None)):
            other = "unsharded" if kind == "sharded" else "sharded"
            w = c.array(f"{name}/{kind}", shape, dtype, ch, cp, compressor=compressor,
                        fill_value=fill, twin=f"{name}/{other}",
                        description=f"{description} ({kind} twin of {name}/{other})")
            w[sel] = data[sel]

    for dt in ("<i2", "<i4", "u1", "bool", "<f4", "<f8", "|S7", "<U7", "<U13"):
        nm = np.dtype(dt).str.replace("<", "lt_").replace("|", "na_")
        for cname, comp in (("zlib", zlib1), ("none", None)):
            pair(f"contiguous/{cname}/{nm}", (4,), dt, (4,), (1,), compressor=comp,
                 description=f"1-d {dt} (4,), one chunk, chunks_per_shard [1], {cname}")
    pair("chunked/i2", (4,), "<i2", (1,), (2,), (2,),
         description="1-d chunks 1 x cps 2; the twin's chunk is the shard (2)")
    pair("chunked/i2_same_chunks", (4,), "<i2", (2,), (2,),
         description="1-d chunks 2 x cps 2; the twin has the same chunks (payloads byte-identical)")
    pair("filled/i2", (4,), "<i2", (1,), (2,), (2,), write=(slice(0, 2),),
         description="1-d, only the first half written: the second shard/chunk never exists")
    pair("ragged/i2_1d", (5,), "<i2", (1,), (2,), (2,),
         description="1-d (5,), chunks 1 x cps 2: the last shard holds 1 of 2 chunks")
    pair("ragged/i2_2d", (3, 3), "<i2", (1, 1), (2, 2), (2, 2),
         description="2-d (3,3), chunks (1,1) x cps (2,2): edge shards partly outside")
    pair("ragged/i2_2d_same_chunks", (3, 3), "<i2", (2, 2), (2, 2),
         description="2-d (3,3), chunks (2,2) x cps (2,2), the twin with the same (padded) chunks")
    pair("contiguous/i2_2d", (2, 2), "<i2", (2, 2), (1, 1),
         description="2-d one chunk, chunks_per_shard [1, 1]")
    pair("chunked/i2_2d", (4, 4), "<i2", (1, 1), (2, 2), (2, 2),
         description="2-d (4,4), chunks (1,1) x cps (2,2)")
    pair("filled/U7_2d", (2, 2), "<U7", (1, 1), (2, 2), (1, 1), write=(0, slice(None)),
         description="2-d <U7 fill '', chunks (1,1), row 1 never written")
    pair("chunked/i2_3d", (4, 4, 4), "<i2", (1, 1, 1), (2, 2, 2), (2, 2, 2),
         description="3-d (4,4,4), chunks (1,1,1) x cps (2,2,2)")
    pair("mixed/i2_3d", (3, 3, 3), "<i2", (3, 3, 1), (3, 3, 1),
         description="3-d (3,3,3), chunks (3,3,1) x cps (3,3,1): shards (9,9,1) reach beyond the array")
    pair("contiguous/i2_3d", (3, 3, 3), "<i2", (3, 3, 3), (3, 3, 3),
         description="3-d one chunk, cps (3,3,3): 26 of the shard's 27 index entries lie outside the array")


@case("demo", "multi-array hierarchy of a few MiB for demos")
def _demo(c: Case):
    rng = rng_for(c.name)
    c.group("", {"title": "draft-era demo dataset", "writer": f"zarr-python {zarr.__version__}"})
    c.group("images", {"axes": ["t", "y", "x"], "pixel_size_um": 0.65})
    c.group("tables", {"rows": 5000})
    t, y, x = 16, 256, 256
    yy, xx = np.mgrid[0:y, 0:x]
    frames = np.stack([
        1000 + 800 * np.sin(xx / 17.0 + k / 3) * np.cos(yy / 23.0 - k / 5) for k in range(t)])
    raw = (frames + rng.normal(0, 40, frames.shape)).clip(0, 65535).astype("<u2")
    w = c.array("images/raw", raw.shape, "<u2", (1, 64, 64), (4, 2, 2),
                compressor=Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE),
                attrs={"long_name": "raw frames"},
                description="uint16 (16,256,256), chunks (1,64,64), cps (4,2,2), blosc zstd")
    w[:] = raw
    labels = (frames > 1400).astype("u1") + (frames > 1700).astype("u1")
    w = c.array("images/labels", labels.shape, "u1", (4, 64, 64), (2, 2, 2),
                compressor=GZip(level=6), description="uint8 labels, gzip, sharded")
    w[:] = labels
    w = c.array("images/mean", (y, x), "<f4", (64, 64), None, compressor=Zlib(level=1),
                description="float32 mean image, unsharded")
    w[:] = raw.mean(axis=0).astype("<f4")
    w = c.array("tables/measurements", (5000, 8), "<f8", (500, 8), (4, 1),
                compressor=Zstd(level=3), description="float64 table, zstd, sharded")
    w[:] = rng.standard_normal((5000, 8))
    w = c.array("tables/timestamps", (5000,), "<M8[ns]", (1000,), None, compressor=LZ4(),
                description="datetime64[ns], lz4, unsharded")
    w[:] = (np.datetime64("2023-06-01T00:00:00", "ns")
            + np.arange(5000) * np.timedelta64(1_000_000, "ns"))


# Known refusals: attempted so that the manifest says *why* they are absent.
@case("cps_longer_than_ndim", "chunks_per_shard longer than ndim (1-d array, cps (2,2))")
def _cps_longer(c: Case):
    w = c.array("a", (4,), "u1", (2,), (2, 2), compressor=None, description="should fail")
    w[:] = [1, 2, 3, 4]


@case("root_array_with_children", "sharded root array plus an array below it")
def _root_with_children(c: Case):
    w = c.array("", (4,), "u1", (2,), (2,), compressor=None, description="root")
    w[:] = [1, 2, 3, 4]
    w2 = c.array("child", (4,), "u1", (2,), (2,), compressor=None, description="child")
    w2[:] = [5, 6, 7, 8]
    # 2.18's root transformer claims every key under data/root/ as one of its shards
    z = zarr.open_array(c.store, mode="r", zarr_version=3, path="")
    listing = z.chunk_store.list_prefix("data/root/")
    bad = [k for k in listing if k.startswith("data/root/child/")]
    if bad:
        raise RuntimeError("zarr 2.18 root-array transformer treats the child's shards as its "
                           f"own (lists {bad[:3]}...); not a valid store for 2.18")


# --------------------------------------------------------------------------- main


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "generator": "compat/legacy/make_corpus.py",
        "zarr_version": zarr.__version__,
        "numcodecs_version": numcodecs.__version__,
        "numpy_version": np.__version__,
        "seed": SEED,
        "cases": [],
        "skipped": [],
    }
    for name, description, fn in CASES:
        c = Case(out, name, description)
        try:
            fn(c)
            manifest["cases"].append(c.finish())
        except Exception as e:  # a case 2.18 refuses: record it, drop its files
            shutil.rmtree(c.dir, ignore_errors=True)
            shutil.rmtree(c.expected_dir, ignore_errors=True)
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            manifest["skipped"].append({"name": name, "description": description,
                                        "reason": f"zarr {zarr.__version__}: {tb}"})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
