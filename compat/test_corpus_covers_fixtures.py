"""The legacy corpus covers every case of the zarr-js stores, so a bare clone still tests them.

The 47 zarr-js stores live in ``../shared/fixtures`` (other people's data, never vendored).
What they exercise is reduced here to a set of *features* (dtype, codec, fill value, ndim,
layout: chunks per shard, ragged edges, shards beyond the array, unwritten chunks, root
arrays, groups with consolidated metadata, sharded/unsharded twins and how their chunk
shapes relate), computed from the store files alone, the same way for both collections.

- ``ZARR_JS_FEATURES`` is that set, frozen; where ``../shared`` is present a test recomputes
  it from the stores and insists it is unchanged.
- The corpus (written by zarr-python 2.18.7, ``make_corpus.py``) must hold every feature of
  the set: checked without ``../shared``.
- The ``twins`` case's pairs then stand in for zarr-js's sharded/unsharded twins: they read
  alike through ``open_draft`` and ``open_v3``, 2.18 returns the same payloads for both
  where the inner chunk shapes match, and ``unshard`` turns the sharded one into exactly the
  unsharded twin's chunk objects (what tests/unit/ops/test_reshard.py checks on zarr-js's stores).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from compat import oracle
from compat.oracle import arrays_equal
from tests.fixtures import ZARR_JS, require

pytestmark = pytest.mark.legacy

MAX_U64 = 2**64 - 1
CHUNK_KEY = re.compile(r"^c\d+([./]\d+)*$")
#: upstream zarr-js data whose sharded store holds another dataset than its twin (compat/README.md)
KNOWN_DIFFERENT_TWINS = {"2d.chunked.compressed.sharded.i2.zarr"}


# --------------------------------------------------------------------------- features


def _draft_arrays(store: Path) -> dict[str, dict]:
    """Every array document of a 2022 draft store (``meta/root[/...].array.json``), by path."""
    out = {}
    for f in sorted((store / "meta").rglob("*.array.json")):
        rel = f.relative_to(store / "meta").as_posix()[: -len(".array.json")]
        if rel == "root":
            out[""] = json.loads(f.read_bytes())
        elif rel.startswith("root/"):
            out[rel[len("root/"):]] = json.loads(f.read_bytes())
    return out


def _dtype(doc: dict) -> np.dtype:
    dt = doc["data_type"]
    dt = dt["type"] if isinstance(dt, dict) else dt  # extension object: {"type": "|S7", ...}
    if isinstance(dt, list):  # structured: a descr list
        return np.dtype([tuple(tuple(x) if isinstance(x, list) else x for x in field) for field in dt])
    return np.dtype(dt)


def _codec(doc: dict) -> str:
    comp = doc.get("compressor")
    return "none" if comp is None else comp["codec"].rstrip("/").split("/")[-2]


def _cps(doc: dict) -> list[int] | None:
    st = doc.get("storage_transformers") or []
    if not st:
        return None
    cps = list(st[0]["configuration"]["chunks_per_shard"])
    return cps + [1] * (len(doc["shape"]) - len(cps))


def _written_chunks(store: Path, path: str, doc: dict) -> int:
    """Chunks inside the array that hold data (objects, or live index entries of shards)."""
    shape, chunks, cps = doc["shape"], doc["chunk_grid"]["chunk_shape"], _cps(doc)
    sep = doc["chunk_grid"].get("separator", "/")
    base = store / "data" / "root" / path if path else store / "data" / "root"
    grid = [math.ceil(s / c) for s, c in zip(shape, chunks)]
    n = 0
    for f in (p for p in base.rglob("*") if p.is_file()) if base.is_dir() else ():
        rel = f.relative_to(base).as_posix()
        if not CHUNK_KEY.match(rel):
            continue  # another array's objects (root array: everything under data/root)
        coords = [int(x) for x in rel[1:].split(sep)] if shape else []
        if len(coords) != len(shape) and shape:
            continue
        if cps is None:
            n += 1
            continue
        k = math.prod(cps)
        index = np.frombuffer(f.read_bytes()[-16 * k:], dtype="<u8").reshape(k, 2)
        for i, (o, b) in enumerate(index):
            if o == MAX_U64 and b == MAX_U64:
                continue
            local = np.unravel_index(i, cps) if cps else ()
            chunk = [c * p + q for c, p, q in zip(coords, cps, local)]
            n += all(x < g for x, g in zip(chunk, grid))
    return n


def array_features(store: Path, path: str, doc: dict) -> set[tuple]:
    dt, codec, cps = _dtype(doc), _codec(doc), _cps(doc)
    shape, chunks = doc["shape"], doc["chunk_grid"]["chunk_shape"]
    sharded, ndim = cps is not None, len(shape)
    f = {
        ("dtype", sharded, dt.str),
        ("codec", sharded, codec),
        ("dtype+codec", sharded, dt.str, codec),
        ("fill", sharded, dt.kind, json.dumps(doc["fill_value"])),
        ("ndim", sharded, ndim),
    }
    if path == "":
        f.add(("root array", sharded))
    if len(set(chunks)) > 1:
        f.add(("chunk shape differs per dimension", sharded))
    if any(s % c for s, c in zip(shape, chunks)):
        f.add(("ragged", sharded, ndim))
    if _written_chunks(store, path, doc) < math.prod(math.ceil(s / c) for s, c in zip(shape, chunks)):
        f.add(("chunks never written", sharded))
    if sharded:
        if all(c == 1 for c in cps):
            f.add(("one chunk per shard", ndim))
        beyond = sum(math.ceil(s / (c * p)) * c * p > math.ceil(s / c) * c
                     for s, c, p in zip(shape, chunks, cps))
        if beyond:
            f.add(("shard reaches beyond the array", ndim, beyond))
    return f


def twin_feature(sharded: dict, twin: dict) -> tuple:
    a, b = sharded["chunk_grid"]["chunk_shape"], twin["chunk_grid"]["chunk_shape"]
    shard = [c * p for c, p in zip(a, _cps(sharded))]
    relation = "same chunks" if a == b else "twin chunk = shard" if b == shard else "other chunks"
    return ("sharded/unsharded twin", len(a), relation)


def store_features(store: Path) -> set[tuple]:
    f: set[tuple] = set()
    for path, doc in _draft_arrays(store).items():
        f |= array_features(store, path, doc)
    if (store / "meta" / "root.group.json").is_file():
        f.add(("explicit root group",))
    if (store / "meta" / "root" / "consolidated" / ".zmetadata").is_file():
        f.add(("consolidated metadata",))
    return f


def zarr_js_features(root: Path) -> set[tuple]:
    f: set[tuple] = set()
    for store in sorted(root.glob("*.zarr")):
        f |= store_features(store)
        twin = root / store.name.replace(".sharded", "")
        if ".sharded." in store.name and store.name not in KNOWN_DIFFERENT_TWINS:
            mine, theirs = _draft_arrays(store), _draft_arrays(twin)
            f |= {twin_feature(mine[p], theirs[p]) for p in mine}
    return f


def corpus_features(corpus: Path) -> set[tuple]:
    manifest = oracle.load_manifest(corpus)
    f: set[tuple] = set()
    for case in manifest["cases"]:
        store = corpus / case["store"]
        f |= store_features(store)
        docs = _draft_arrays(store)
        for a in case["arrays"]:
            if a.get("twin") and a["chunks_per_shard"] is not None:
                f.add(twin_feature(docs[a["path"]], docs[a["twin"]]))
    return f


#: what the 47 zarr-js stores exercise (recomputed from ../shared/fixtures where present)
ZARR_JS_FEATURES = {
    ("codec", False, "none"), ("codec", False, "zlib"), ("codec", True, "zlib"),
    *{("dtype", s, d) for s in (False, True)
      for d in ("<i2", "<i4", "|u1", "|b1", "<f4", "<f8", "|S7", "<U7", "<U13")},
    *{("dtype+codec", s, d, "zlib") for s in (False, True)
      for d in ("<i2", "<i4", "|u1", "|b1", "<f4", "<f8", "|S7", "<U7", "<U13")},
    *{("dtype+codec", False, d, "none") for d in ("<i2", "<i4", "|b1", "<f8", "|S7", "<U7", "<U13")},
    *{("fill", s, k, v) for s in (False, True)
      for k, v in (("i", "0"), ("u", "0"), ("b", "false"), ("f", "0.0"), ("S", '""'), ("U", '""'))},
    *{("ndim", s, n) for s in (False, True) for n in (1, 2, 3)},
    ("root array", False), ("root array", True),
    ("chunk shape differs per dimension", False), ("chunk shape differs per dimension", True),
    ("ragged", False, 1), ("ragged", False, 2),
    ("one chunk per shard", 1), ("one chunk per shard", 2),
    ("shard reaches beyond the array", 1, 1), ("shard reaches beyond the array", 2, 2),
    ("shard reaches beyond the array", 3, 2), ("shard reaches beyond the array", 3, 3),
    ("sharded/unsharded twin", 1, "same chunks"), ("sharded/unsharded twin", 1, "twin chunk = shard"),
    ("sharded/unsharded twin", 2, "same chunks"), ("sharded/unsharded twin", 2, "twin chunk = shard"),
    ("sharded/unsharded twin", 3, "same chunks"), ("sharded/unsharded twin", 3, "twin chunk = shard"),
    ("explicit root group",), ("consolidated metadata",),
}


def test_zarr_js_features_are_the_frozen_set():
    """Keeps ZARR_JS_FEATURES honest: it is what the shared stores really exercise."""
    got = zarr_js_features(require(ZARR_JS))
    assert got == ZARR_JS_FEATURES, (
        f"zarr-js stores changed: new {sorted(got - ZARR_JS_FEATURES, key=str)}, "
        f"gone {sorted(ZARR_JS_FEATURES - got, key=str)}; update ZARR_JS_FEATURES and the corpus")


def test_corpus_covers_every_zarr_js_feature(legacy_corpus):
    missing = ZARR_JS_FEATURES - corpus_features(legacy_corpus)
    assert not missing, ("the legacy corpus lacks cases the zarr-js stores cover (add them to "
                         f"compat/legacy/make_corpus.py, case 'twins'): {sorted(missing, key=str)}")


# --------------------------------------------------------------------------- the twins


def _twin_pairs(legacy_corpus) -> list[tuple[oracle.CorpusArray, oracle.CorpusArray]]:
    arrays = {(a.case, a.path): a for a in oracle.corpus_arrays(legacy_corpus)}
    pairs = [(a, arrays[(a.case, a.entry["twin"])]) for a in arrays.values()
             if a.entry.get("twin") and a.sharded]
    assert len(pairs) >= 25, len(pairs)
    return pairs


def test_twins_read_alike_through_open_draft_and_open_v3(legacy_corpus):
    from sharding_store import open_draft, open_v3

    for sharded, twin in _twin_pairs(legacy_corpus):
        expected = sharded.expected()
        assert arrays_equal(expected, twin.expected()), sharded.id
        for reader in (open_draft, open_v3):
            got = reader(str(sharded.store), sharded.path)[...]
            assert arrays_equal(np.asarray(got), expected), (reader.__name__, sharded.id)
            got = reader(str(twin.store), twin.path)[...]
            assert arrays_equal(np.asarray(got), expected), (reader.__name__, twin.id)


def test_2_18_gives_twins_with_the_same_chunks_the_same_payloads(legacy_corpus):
    same = 0
    pairs = _twin_pairs(legacy_corpus)
    dump = oracle.legacy_dump(pairs[0][0].store).assert_ok()
    for sharded, twin in pairs:
        assert arrays_equal(dump.arrays[sharded.path], dump.arrays[twin.path]), sharded.id
        if sharded.entry["chunks"] == twin.entry["chunks"]:
            assert dump.relative_listing(sharded.path) == dump.relative_listing(twin.path), sharded.id
            mine = {k[len(dump.data_prefix(sharded.path)):]: v for k, v in dump.chunks[sharded.path].items()}
            theirs = {k[len(dump.data_prefix(twin.path)):]: v for k, v in dump.chunks[twin.path].items()}
            assert mine == theirs, sharded.id
            same += 1
    assert same >= 20, same


def test_unshard_gives_the_unsharded_twins_chunk_objects(legacy_corpus, tmp_path):
    """tests/unit/ops/test_reshard.py's zarr-js twin check, on the corpus pairs."""
    from sharding_store import unshard

    pairs = [(s, t) for s, t in _twin_pairs(legacy_corpus) if s.entry["chunks"] == t.entry["chunks"]]
    src = Path(shutil.copytree(pairs[0][0].store, tmp_path / "twins"))
    unshard(src)

    def objects(path: str) -> dict[str, bytes]:
        base = src / "data" / "root" / path
        return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}

    for sharded, twin in pairs:
        assert objects(sharded.path) == objects(twin.path), sharded.id
