"""Where the test data lives (one place for the fact).

``ZARR_JS``: the 47 real draft-era stores from zarr-js's test data (MIT, see the LICENSE
beside them), vendored so that a fresh clone runs the whole suite without ../shared.
They are read-only input: tests copy them before writing.
"""

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
ZARR_JS = DATA / "zarr-js-draft-v3"
