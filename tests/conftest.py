"""Suite-wide guards."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.fixtures import SHARED_FIXTURES

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _tree_hash(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


#: fixtures that make a test slow wherever it is: a moto S3 server (``tests/s3server.py``)
SLOW_FIXTURES = frozenset({"s3", "s3_server"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make check`` runs ``-m "not slow"``: besides the tests and modules marked ``slow``
    by hand (kill tests, dask clusters, memory-capped children, installs, the heaviest
    property tests), every test on the moto S3 server (the ``s3`` marker or fixture) and
    every test of the zarr-python 2.18 oracle virtualenv (``legacy``, as in compat/) is
    slow. ``make test`` runs them all."""
    slow = pytest.mark.slow
    for item in items:
        if "s3" in item.keywords or "legacy" in item.keywords or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(slow)


@pytest.fixture(scope="session", autouse=True)
def read_only_inputs_stay_untouched():
    """The shared real-world stores and the bundled sample are input: no test may change them."""
    roots = [r for r in (SHARED_FIXTURES, SAMPLES) if r.is_dir()]
    before = _tree_hash(*roots)
    yield
    assert _tree_hash(*roots) == before, f"a test modified {' or '.join(map(str, roots))}"
