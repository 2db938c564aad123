#!/usr/bin/env bash
# Create the isolated zarrita 0.2.x virtualenv: a real writer of the 2023 intermediate
# v3 spelling (see compat/README.md, "zarrita 0.2.x").
#
#   bash compat/setup_zarrita.sh          # idempotent; fast when already done
#   ZARRITA_FORCE=1 bash compat/setup_zarrita.sh   # rebuild from scratch
#
# One venv holds the shared, pinned dependencies; each zarrita version is installed with
# --no-deps into its own directory $VENV/zarrita-<version>/ (put on PYTHONPATH to use it),
# so two writers of different months cost one venv. zarrita 0.2.0-0.2.4 need numpy < 2
# and numcodecs < 0.12 (0.2.0-0.2.3), zstandard < 0.22 (all 0.2.x): hence the pins, and
# Python 3.11 (zstandard 0.21 has no wheel for newer Pythons).
#
# Env overrides: ZARRITA_VENV (default compat/.venv-zarrita), ZARRITA_PYTHON
# (default: python3.11 if found, else python3; must be Python 3.11).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${ZARRITA_VENV:-$HERE/.venv-zarrita}"
REQS=("numpy==1.26.4" "numcodecs==0.11.0" "zstandard==0.21.0" "crc32c==2.3.post0"
      "attrs==23.1.0" "cattrs==23.1.2" "fsspec==2023.10.0")
# 0.2.1: sharding without index_location (summer 2023); 0.2.7: the last 0.2.x
VERSIONS=("0.2.1" "0.2.7")
STAMP_CONTENT="v1 ${REQS[*]} zarrita ${VERSIONS[*]}"
STAMP="$VENV/.zarrita-ready"

if [[ -z "${ZARRITA_PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then ZARRITA_PYTHON=python3.11; else ZARRITA_PYTHON=python3; fi
fi

check_env() {
    local v
    for v in "${VERSIONS[@]}"; do
        PYTHONPATH="$VENV/zarrita-$v" "$VENV/bin/python" -c "
import zarrita, importlib.metadata as md
assert md.version('zarrita') == '$v', md.version('zarrita')
assert zarrita.__file__.startswith('$VENV/zarrita-$v/'), zarrita.__file__
" >/dev/null 2>&1 || return 1
    done
}

if [[ "${ZARRITA_FORCE:-0}" != "1" && -f "$STAMP" && -x "$VENV/bin/python" ]] \
        && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    if "$VENV/bin/python" -c "pass" >/dev/null 2>&1; then
        exit 0
    fi
fi

# exit 3: no Python 3.11 here (the tests then skip, saying so)
if ! command -v "$ZARRITA_PYTHON" >/dev/null 2>&1 || ! "$ZARRITA_PYTHON" - <<'PY'
import sys
if sys.version_info[:2] != (3, 11):
    sys.exit(f"setup_zarrita.sh: need Python 3.11 (zstandard 0.21 wheels), got {sys.version.split()[0]}")
PY
then
    echo "setup_zarrita.sh: no Python 3.11 ($ZARRITA_PYTHON): set ZARRITA_PYTHON to build the zarrita venv" >&2
    exit 3
fi

# Anything that is not a finished venv (no stamp, wrong stamp, broken python) is thrown
# away and rebuilt; the stamp is written last.
echo "setup_zarrita.sh: creating $VENV" >&2
rm -rf "$VENV"
trap 'rm -rf "$VENV"' ERR
"$ZARRITA_PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --only-binary=:all: "${REQS[@]}" >&2
for v in "${VERSIONS[@]}"; do
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps --only-binary=:all: \
        --target "$VENV/zarrita-$v" "zarrita==$v" >&2
done
if ! check_env; then
    trap - ERR
    echo "setup_zarrita.sh: zarrita env at $VENV failed its import check" >&2
    exit 1
fi
printf '%s' "$STAMP_CONTENT" > "$STAMP"
echo "setup_zarrita.sh: ready (zarrita ${VERSIONS[*]})" >&2
