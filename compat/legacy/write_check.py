"""Check that zarr-python 2.18 reads a store (e.g. one written by sharding_store) as expected.

Runs INSIDE the legacy virtualenv (compat/.venv-legacy).

    python write_check.py STORE_DIR EXPECTED_JSON REPORT_JSON

EXPECTED_JSON maps array path ("" for a root array) -> .npy file with the expected
values. For each path the array is opened with zarr 2.18 (mode="r") and compared with
exact dtype (incl. byte order), shape, and NaN-aware equality. On top of the values,
every chunk key 2.18's chunk store lists must be readable, and for sharded arrays
the listing must contain only keys inside the array's chunk grid.

REPORT_JSON: {"ok": bool, "store": str, "arrays": {path: {"ok": bool, "error": str|null,
"mismatch": str|null, "dtype": str, "shape": [...], "sharded": bool, "n_chunks": int}}}
Exit status 0 if ok, 1 otherwise.
"""

from __future__ import annotations

import os

os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"

import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
import zarr  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402


def equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        return f"dtype {a.dtype.str} != expected {b.dtype.str}"
    if a.shape != b.shape:
        return f"shape {a.shape} != expected {b.shape}"
    if a.dtype == object:
        ok = all(x == y for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
    elif a.dtype.fields is not None or a.dtype.kind == "V":
        ok = a.tobytes() == b.tobytes()
    elif a.dtype.kind in "fcmM":
        ok = np.array_equal(a, b, equal_nan=True)
    else:
        ok = np.array_equal(a, b)
    if ok:
        return None
    if a.dtype != object and a.dtype.fields is None and a.ndim:
        diff = np.argwhere(~((a == b) | ((a != a) & (b != b))) if a.dtype.kind in "fc"
                           else a != b)
        return f"{len(diff)} elements differ, first at {diff[0].tolist()}"
    return f"values differ: {a!r} vs expected {b!r}"[:500]


def check_array(store, path, expected_file):
    r = {"ok": False, "error": None, "mismatch": None}
    try:
        exp = np.load(expected_file, allow_pickle=True)
        z = zarr.open_array(store, mode="r", zarr_version=3, path=path)
        cs = z.chunk_store
        r.update(dtype=z.dtype.str, shape=list(z.shape),
                 sharded=z._transformed_chunk_store is not None)
        r["mismatch"] = equal(z[...], exp)
        listing = cs.list_prefix(z._data_key_prefix)
        for key in listing:
            cs[key]  # every listed chunk must be readable through the transformer
        r["n_chunks"] = len(listing)
        # every listed key must be a chunk of this array's grid
        grid = [range(-(-s // c)) for s, c in zip(z.shape, z.chunks)] or [range(1)]
        valid = {z._chunk_key(cc) for cc in itertools.product(*grid)}
        extra = sorted(set(listing) - valid)
        if extra:
            r["mismatch"] = (r["mismatch"] or "") + f" listing has keys outside the grid: {extra[:5]}"
        r["ok"] = r["mismatch"] is None
    except Exception as e:
        r["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        r["traceback"] = traceback.format_exc()
    return r


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    store_dir, expected_json, report_json = argv[1:]
    spec = json.load(open(expected_json))
    store = DirectoryStoreV3(store_dir)
    report = {"store": store_dir, "zarr_version": zarr.__version__, "arrays": {}}
    for path, f in spec.items():
        report["arrays"][path] = check_array(store, path, f)
    report["ok"] = all(r["ok"] for r in report["arrays"].values())
    with open(report_json, "w") as fh:
        json.dump(report, fh, indent=1)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
