"""Dump what zarr-python 2.18 sees in a draft-era v3 store.

Runs INSIDE the legacy virtualenv (compat/.venv-legacy), never in the project venv.

    python dump.py STORE_DIR OUT_DIR [STORE_DIR OUT_DIR ...] [--no-chunks] [--array PATH ...]

The store is opened read-only (mode="r"); nothing is written to STORE_DIR.
For each STORE_DIR/OUT_DIR pair, OUT_DIR gets (see compat/README.md):

  dump.json        summary: hierarchy, groups, and per array: metadata, listings,
                   chunk index into chunks/<i>.bin, values file, error (if any)
  values/<i>.npy   the full array as zarr 2.18 reads it (z[...]), dtype kept exactly
                   (object arrays are pickled: load with allow_pickle=True)
  chunks/<i>.bin   every chunk payload the (transformed) chunk store returns,
                   concatenated; dump.json maps chunk key -> [offset, nbytes]

<i> is the array's position in the sorted list of array paths.
"""

from __future__ import annotations

import os

os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
import numcodecs  # noqa: E402
import zarr  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (bytes, bytearray)):
        return o.hex()
    if isinstance(o, tuple):
        return list(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return repr(o)


def walk_hierarchy(store_dir: Path):
    """Find arrays and groups from the files under meta/ (not via 2.18's hierarchy API,
    which hides implicit groups and needs a root group)."""
    entry = json.loads((store_dir / "zarr.json").read_text())
    suffix = entry.get("metadata_key_suffix", ".json")
    arrays, groups = {}, {}
    meta = store_dir / "meta"
    if not meta.is_dir():
        return entry, suffix, arrays, groups, set()
    for f in sorted(p for p in meta.rglob("*") if p.is_file()):
        rel = f.relative_to(meta).as_posix()
        for kind, table in (("array", arrays), ("group", groups)):
            tail = f".{kind}{suffix}"
            if rel == "root" + tail:
                table[""] = rel
            elif rel.startswith("root/") and rel.endswith(tail):
                table[rel[len("root/"):-len(tail)]] = rel
    # implicit groups: every directory under meta/root that is not an explicit node
    implicit = set()
    if (meta / "root").is_dir():
        implicit.add("")
        for d in (p for p in (meta / "root").rglob("*") if p.is_dir()):
            implicit.add(d.relative_to(meta / "root").as_posix())
    # every ancestor of a node is a group too
    for p in list(arrays) + list(groups):
        parts = p.split("/") if p else []
        for i in range(len(parts)):
            implicit.add("/".join(parts[:i]))
    implicit -= set(arrays)
    implicit -= set(groups)
    return entry, suffix, arrays, groups, implicit


def dump_array(store, store_dir: Path, path: str, meta_rel: str, out: Path, i: int,
               with_chunks: bool) -> dict:
    info: dict = {"metadata_key": "meta/" + meta_rel, "error": None}
    try:
        info["metadata"] = json.loads((store_dir / "meta" / meta_rel).read_text())
    except Exception as e:  # pragma: no cover
        info["metadata"] = None
        info["metadata_error"] = repr(e)
    try:
        z = zarr.open_array(store, mode="r", zarr_version=3, path=path)
        cs = z.chunk_store
        transformed = z._transformed_chunk_store is not None
        info.update(
            shape=list(z.shape),
            dtype=z.dtype.descr if z.dtype.fields else z.dtype.str,
            chunks=list(z.chunks),
            order=z.order,
            fill_value=z.fill_value,
            compressor=z.compressor.get_config() if z.compressor else None,
            filters=[f.get_config() for f in z.filters] if z.filters else None,
            attributes=z.attrs.asdict(),
            dimension_separator=z._dimension_separator,
            data_key_prefix=z._data_key_prefix,
            sharded=transformed,
            effective_chunks_per_shard=list(cs.chunks_per_shard) if transformed else None,
            chunk_store_type=type(cs).__name__,
        )
        values = z[...]
        vpath = out / "values" / f"{i}.npy"
        np.save(vpath, values, allow_pickle=(values.dtype == object))
        info["values"] = vpath.relative_to(out).as_posix()
        info["values_dtype"] = values.dtype.descr if values.dtype.fields else values.dtype.str
        # the transformer's own view: list_prefix(data prefix) -> StoreV3.list_prefix ->
        # list() -> iterating the inner store, expanding each shard via its index
        prefix = z._data_key_prefix
        listing = sorted(cs.list_prefix(prefix))
        info["listing"] = listing
        ld_keys, ld_prefixes = cs.list_dir(prefix)
        info["list_dir"] = {"keys": sorted(ld_keys), "prefixes": sorted(ld_prefixes)}
        # what is physically in the underlying store under the data prefix
        info["raw_keys"] = sorted(store.list_prefix(prefix))
        if with_chunks:
            index = {}
            cpath = out / "chunks" / f"{i}.bin"
            off = 0
            with open(cpath, "wb") as fh:
                for key in listing:
                    b = bytes(cs[key])  # ShardingStorageTransformer.__getitem__
                    fh.write(b)
                    index[key] = [off, len(b)]
                    off += len(b)
            info["chunk_index"] = index
            info["chunks_file"] = cpath.relative_to(out).as_posix()
    except Exception as e:
        info["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        info["traceback"] = traceback.format_exc()
    return info


def dump_store(store_dir: Path, out: Path, with_chunks=True, only=None) -> dict:
    store_dir = store_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "values").mkdir(exist_ok=True)
    (out / "chunks").mkdir(exist_ok=True)
    entry, suffix, arrays, groups, implicit = walk_hierarchy(store_dir)
    store = DirectoryStoreV3(str(store_dir))
    result = {
        "store": str(store_dir),
        "zarr_version": zarr.__version__,
        "numcodecs_version": numcodecs.__version__,
        "numpy_version": np.__version__,
        "entry_point": entry,
        "metadata_key_suffix": suffix,
        "groups": {},
        "arrays": {},
    }
    for p, rel in groups.items():
        try:
            doc = json.loads((store_dir / "meta" / rel).read_text())
            g = zarr.open_group(store, mode="r", zarr_version=3, path=p)
            result["groups"][p] = {"explicit": True, "metadata_key": "meta/" + rel,
                                   "attributes": g.attrs.asdict(), "document": doc}
        except Exception as e:
            result["groups"][p] = {"explicit": True, "metadata_key": "meta/" + rel,
                                   "error": repr(e)}
    for p in sorted(implicit):
        result["groups"][p] = {"explicit": False, "attributes": None}
    for i, p in enumerate(sorted(arrays)):
        if only is not None and p not in only:
            continue
        result["arrays"][p] = dump_array(store, store_dir, p, arrays[p], out, i, with_chunks)
    (out / "dump.json").write_text(json.dumps(result, indent=1, default=_json_default))
    return result


def main(argv):
    args = list(argv[1:])
    with_chunks = True
    only = None
    if "--no-chunks" in args:
        args.remove("--no-chunks")
        with_chunks = False
    while "--array" in args:
        k = args.index("--array")
        only = (only or set()) | {args[k + 1]}
        del args[k:k + 2]
    if not args or len(args) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for store_dir, out in zip(args[0::2], args[1::2]):
        try:
            dump_store(Path(store_dir), Path(out), with_chunks=with_chunks, only=only)
        except Exception:
            failed = True
            print(f"dump.py: failed on {store_dir}", file=sys.stderr)
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
