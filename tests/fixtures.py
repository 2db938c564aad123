"""Where the real-world test data lives (the one place that knows the paths).

The draft-era stores written by *other* software come from other public repositories and
are not part of this repository: they live in ``../shared/fixtures/`` beside the clone
(``SHARED_FIXTURES``; CI checks ``../shared`` out there). Each collection has a
``SOURCE.txt``/``README.md`` naming origin, commit, licence and writer. They are read-only
input: a test copies a store before writing to it. Where ``../shared`` is absent the tests
that need them skip with ``MISSING`` as the reason; the corpus that zarr-python 2.18.7
writes in ``compat/`` (``compat/legacy/make_corpus.py``) covers the same cases (dtypes,
codecs, sharded/unsharded twins) in a bare clone.

- ``ZARR_JS``: 47 stores, 2022 draft layout (``meta/root``, sharding storage transformer),
  written by zarr-python 2.x; zarr-js's test data.
- ``ZARRITA_2021``: one 2021 zarrita store (``zarrita.zr3``, implicit groups, no sharding)
  with ``expected.npz``.
- ``DRAFT_2023``: the 2023 intermediate generation (``ZARRJS_ZARRITA_2023``,
  ``ZARRITAJS_2023_ENDIAN``), each with ``expected.npz``. Paths only: reading that
  generation is a later issue.

Use ``stores()`` to parametrize over a collection (one skipped parameter when it is
absent, instead of pytest's silent "empty parameter set"), ``require()`` inside a test or
fixture, and ``needs()`` / ``needs_zarr_js`` as a decorator.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"

ZARR_JS = SHARED_FIXTURES / "zarr-js-draft-v3"
ZARRITA_2021 = SHARED_FIXTURES / "zarrita-2021" / "zarrita2021-zr3"
DRAFT_2023 = SHARED_FIXTURES / "draft-2023"
ZARRJS_ZARRITA_2023 = DRAFT_2023 / "zarrjs-zarrita-2023-06"
ZARRITAJS_2023_ENDIAN = DRAFT_2023 / "zarritajs-2023-08-endian"

ZARR_JS_COUNT = 47  # stores in ZARR_JS


def missing(root: Path = ZARR_JS) -> str:
    """The skip reason when ``root`` is absent."""
    return (f"shared fixtures absent: {root} (stores from other repositories are read from "
            f"../shared/fixtures beside the clone, never vendored; compat/'s corpus covers the same cases)")


MISSING = missing()


def available(root: Path = ZARR_JS) -> bool:
    return root.is_dir()


def require(root: Path = ZARR_JS) -> Path:
    """``root`` if present, else skip the calling test with a clear reason."""
    if not root.is_dir():
        pytest.skip(missing(root))
    return root


def needs(root: Path = ZARR_JS) -> pytest.MarkDecorator:
    """Decorator: skip the test with a clear reason when ``root`` is absent."""
    return pytest.mark.skipif(not root.is_dir(), reason=missing(root))


needs_zarr_js = needs(ZARR_JS)


def store_paths(root: Path = ZARR_JS, pattern: str = "*.zarr") -> list[Path]:
    """Sorted stores of a collection; [] when it is absent (call ``require`` where that matters)."""
    return sorted(root.glob(pattern)) if root.is_dir() else []


def stores(root: Path = ZARR_JS, pattern: str = "*.zarr", *, names: bool = False) -> list:
    """Parameters for ``pytest.mark.parametrize``: the stores of a collection (paths, or names
    with ``names=True``), or one skipped parameter saying why when the collection is absent."""
    if not root.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=missing(root)), id="fixtures-absent")]
    found = store_paths(root, pattern)
    return [p.name for p in found] if names else found


def copy_writable(src: Path, dst: Path) -> None:
    """Copy a read-only fixture store to ``dst`` as writable files (tests never write into
    ``../shared``)."""
    for dirpath, _dirs, files in os.walk(src):
        target = dst / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(Path(dirpath) / f, target / f)
