"""The package namespace: lazy public names."""

from __future__ import annotations


def test_package_exports_load_on_first_use_and_functions_win_over_submodules():
    """``import sharding_store`` loads none of the heavy modules; every public name
    resolves; ``sharding_store.migrate`` stays the function after its submodule loads."""
    import subprocess
    import sys

    code = (
        "import sys, sharding_store as s\n"
        "heavy = [m for m in ('numpy', 'numcodecs', 'zarr', 'fsspec') if m in sys.modules]\n"
        "import sharding_store.migrate, sharding_store.verify, sharding_store.reshard\n"
        "from sharding_store import migrate, verify, reshard\n"
        "ok = all(callable(f) and f.__module__ == 'sharding_store.' + f.__name__ for f in (s.migrate, s.verify, s.reshard, migrate))\n"
        "missing = [n for n in s.__all__ if getattr(s, n, None) is None]\n"
        "print(heavy, ok, missing, 'zarr' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    assert out == "[] True [] True"  # open_v3 (in __all__) imports zarr only when asked for
