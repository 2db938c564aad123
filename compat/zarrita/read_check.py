"""Does zarrita (this venv's version) read a store as expected? Runs in compat/.venv-zarrita.

    read_check.py STORE TMPDIR REPORT_JSON

TMPDIR holds paths.json (array paths) and expected.npz (``a<i>`` = the i-th path's values).
Writes {"zarrita_version", "arrays": {path: {"ok": bool, "error"?: str}}}; never raises for
an array zarrita cannot open or read (the error text is the report).
"""

from __future__ import annotations

import json
import sys
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np
import zarrita

warnings.simplefilter("ignore")


def main() -> None:
    store, tmp, report = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    paths = json.loads((tmp / "paths.json").read_text())
    out = {}
    with np.load(tmp / "expected.npz") as npz:
        for i, path in enumerate(paths):
            want = npz[f"a{i}"]
            try:
                s = zarrita.LocalStore(str(store))
                a = zarrita.Array.open(s / path if path else s)
                got = np.asarray(a[()] if want.ndim == 0 else a[tuple(slice(None) for _ in want.shape)])
                ok = got.shape == want.shape and bool(np.array_equal(got.astype(want.dtype), want, equal_nan=want.dtype.kind == "f"))
                out[path] = {"ok": ok} if ok else {"ok": False, "error": f"values differ (got {got.dtype} {got.shape})"}
            except Exception as e:  # the report says what zarrita could not do
                out[path] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    report.write_text(json.dumps({"zarrita_version": metadata.version("zarrita"), "arrays": out}, indent=1))


if __name__ == "__main__":
    main()
