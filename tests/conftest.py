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


@pytest.fixture(scope="session", autouse=True)
def read_only_inputs_stay_untouched():
    """The shared real-world stores and the bundled sample are input: no test may change them."""
    roots = [r for r in (SHARED_FIXTURES, SAMPLES) if r.is_dir()]
    before = _tree_hash(*roots)
    yield
    assert _tree_hash(*roots) == before, f"a test modified {' or '.join(map(str, roots))}"
