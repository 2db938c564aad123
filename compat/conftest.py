"""Fixtures for tests that use the zarr-python 2.18.7 oracle (see compat/README.md).

Tests that need them should be marked ``@pytest.mark.legacy``.
Set SHARDING_STORE_SKIP_LEGACY=1 to skip those tests instead of building the
legacy virtualenv (by default a failure to build it is an error, not a skip).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from compat import oracle
from compat.oracle import LegacyDump


def _skip_requested() -> bool:
    return os.environ.get("SHARDING_STORE_SKIP_LEGACY", "").lower() not in ("", "0", "false")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:  # oracle virtualenvs and corpora in subprocesses: `make check` leaves them to `make test`
        if Path(str(item.path)).resolve().is_relative_to(here):  # the hook sees every item of the session
            item.add_marker(pytest.mark.slow)
    if not _skip_requested():
        return
    skip = pytest.mark.skip(reason="SHARDING_STORE_SKIP_LEGACY is set")
    for item in items:
        if "legacy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def legacy_env() -> Path:
    """Path of the legacy (zarr 2.18.7) python interpreter; builds the venv if needed."""
    if _skip_requested():
        pytest.skip("SHARDING_STORE_SKIP_LEGACY is set")
    return oracle.ensure_legacy_env()


@pytest.fixture(scope="session")
def legacy_corpus(legacy_env) -> Path:
    """Corpus directory: manifest.json, stores/<case>/, expected/<case>/<i>.npy."""
    return oracle.legacy_corpus()


@pytest.fixture(scope="session")
def legacy_manifest(legacy_corpus) -> dict:
    return oracle.load_manifest(legacy_corpus)


@pytest.fixture(scope="session")
def legacy_dump(legacy_env) -> Callable[..., LegacyDump]:
    """legacy_dump(store_dir, *, chunks=True, arrays=None, cache=True) -> LegacyDump"""
    return oracle.legacy_dump


@pytest.fixture(scope="session")
def legacy_read_check(legacy_env) -> Callable[..., dict]:
    """legacy_read_check(store_dir, {path: ndarray}) -> report dict (report["ok"])"""
    return oracle.legacy_read_check
