#!/usr/bin/env bash
# Create the isolated zarr-python 2.18.7 (+ xarray 2024.7.0) virtualenv used as a test oracle.
#
#   bash compat/setup_legacy.sh          # idempotent; fast when already done
#   LEGACY_FORCE=1 bash compat/setup_legacy.sh   # rebuild from scratch
#
# Env overrides: LEGACY_VENV (default compat/.venv-legacy), LEGACY_PYTHON
# (default: python3.11 if found, else python3; must be Python >= 3.11).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${LEGACY_VENV:-$HERE/.venv-legacy}"
# numpy is capped at the newest release known to work with zarr 2.18.7 (2.4.x).
# xarray 2024.7.0 (+ pandas 2.2.3, the last 2.x before pandas 3 changed string dtypes) is
# the draft-era xarray: it wrote draft stores with to_zarr(..., zarr_version=3) over zarr 2.x.
REQS=("zarr==2.18.7" "numcodecs<0.16" "numpy<2.5" "pytest" "xarray==2024.7.0" "pandas==2.2.3")
# The stamp records exactly what was requested; change REQS -> rebuild.
STAMP_CONTENT="v1 ${REQS[*]}"
STAMP="$VENV/.legacy-ready"

if [[ -z "${LEGACY_PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then LEGACY_PYTHON=python3.11; else LEGACY_PYTHON=python3; fi
fi

check_env() {
    "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import os, sys
os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"
import zarr, numcodecs
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer
assert zarr.__version__ == "2.18.7", zarr.__version__
import xarray
assert xarray.__version__ == "2024.7.0", xarray.__version__
PY
}

if [[ "${LEGACY_FORCE:-0}" != "1" && -f "$STAMP" && -x "$VENV/bin/python" ]] \
        && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    # Fast path: stamp present. Only do a cheap sanity check of the interpreter.
    if "$VENV/bin/python" -c "pass" >/dev/null 2>&1; then
        exit 0
    fi
fi

"$LEGACY_PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"setup_legacy.sh: need Python >= 3.11, got {sys.version.split()[0]}")
PY

# Anything that is not a finished venv (no stamp, wrong stamp, broken python)
# is thrown away and rebuilt: a half-made venv is never reused.
echo "setup_legacy.sh: creating $VENV" >&2
rm -rf "$VENV"
# Build in place (venv scripts embed their absolute path). The stamp is written
# only at the very end, so an interrupted run leaves no stamp and the next run
# starts over; a failed run removes what it made.
trap 'rm -rf "$VENV"' ERR
"$LEGACY_PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip >&2
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "${REQS[@]}" >&2
if ! check_env; then
    trap - ERR
    echo "setup_legacy.sh: legacy env at $VENV failed its import check" >&2
    "$VENV/bin/python" -c 'import os; os.environ["ZARR_V3_EXPERIMENTAL_API"]="1"; os.environ["ZARR_V3_SHARDING"]="1"; import zarr; print(zarr.__version__)' >&2 || true
    exit 1
fi
printf '%s' "$STAMP_CONTENT" > "$STAMP"
echo "setup_legacy.sh: ready ($("$VENV/bin/python" -c 'import zarr,numcodecs,sys;print("python",sys.version.split()[0],"zarr",zarr.__version__,"numcodecs",numcodecs.__version__)' 2>/dev/null))" >&2
