"""One walk per operation (issue 23): a migration, its verification, ``info`` and ``open_v3``
each decide the generation of every node of the source once, and list each directory of
the source once, for a 2023 hierarchy (nested explicit and implicit groups, arrays at
several depths) and a 2022 one.

The count of a node's classification is the number of calls of the readers' classify
function (``formats.gen2023.classify``, which ``classify_node`` calls too) on that node's
own document bytes; the listings are the ``list_dir`` calls a
:class:`~sharding_store.testing.CountingInner` over the source sees.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sharding_store
from sharding_store.api import hierarchy
from sharding_store.cli import main
from sharding_store.formats import gen2023
from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify
from sharding_store.testing import CountingInner
from tests.draft_factory import make_hierarchy
from tests.gen2023_writer import write_2023

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _store_2023(root: Path) -> Path:
    """Explicit groups ``g`` and ``g/h``, implicit ones (the root, ``x``, ``x/y``), arrays at
    depths 1 to 3, one of them sharded with an undeclared index."""
    write_2023(root, "a", np.arange(6, dtype="<i2"), chunks=(2,))
    write_2023(root, "g/h/b", np.arange(16, dtype="<u4").reshape(4, 4), chunks=(2, 2), cps=(1, 2))
    write_2023(root, "x/y/c", np.arange(8, dtype="<f8"), chunks=(4,), spelling="bytes")
    for group in ("g", "g/h"):
        (root / group / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                            "attributes": {"name": group}}))
    return root


def _store_2022(root: Path) -> Path:
    make_hierarchy(root)
    return root


STORES = {"2023": _store_2023, "2022": _store_2022}


def _info(src: CountingInner, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m, contextlib.redirect_stdout(io.StringIO()):
        m.setattr(hierarchy, "inner_of", lambda *a, **k: src)  # the command's store, counted
        assert main(["info", "the-source"]) == 0


OPERATIONS: dict[str, Callable[[CountingInner, Path, pytest.MonkeyPatch], Any]] = {
    "migrate": lambda src, dst, mp: migrate(src, str(dst), progress=False, verify=False),
    "verify": lambda src, dst, mp: verify(src, str(dst)),
    "info": lambda src, dst, mp: _info(src, mp),
    "open_v3": lambda src, dst, mp: sharding_store.open_v3(src),
}


@pytest.mark.parametrize("generation", sorted(STORES))
def test_each_operation_detects_every_node_once_and_lists_once(tmp_path, monkeypatch, generation):
    src = STORES[generation](tmp_path / "src")
    dst = tmp_path / "dst"
    migrate(str(src), str(dst), progress=False)  # what verify compares against
    documents = {p.read_bytes(): p.relative_to(src).as_posix() for p in src.rglob("zarr.json")}
    assert not set(documents) & {p.read_bytes() for p in dst.rglob("zarr.json")}  # a source document is told apart
    expected = Counter(documents.values())
    assert len(expected) == (5 if generation == "2023" else 1)  # the 2023 root is implicit
    seen: Counter[str] = Counter()
    classify = gen2023.classify

    def counted(raw: Any, key: str = gen2023.NODE_KEY) -> Any:
        if isinstance(raw, (bytes, bytearray)) and bytes(raw) in documents:
            seen[documents[bytes(raw)]] += 1
        return classify(raw, key)

    monkeypatch.setattr(gen2023, "classify", counted)
    for name, operation in OPERATIONS.items():
        inner = CountingInner(str(src))
        target = tmp_path / f"dst-{name}" if name == "migrate" else dst
        operation(inner, target, monkeypatch)
        assert seen == expected, (name, seen)
        listings = Counter(prefix for call, prefix in inner.log if call == "list_dir")
        assert listings or generation == "2022", name  # the 2022 reader lists meta/ with list_prefix
        assert all(n == 1 for n in listings.values()), (name, listings)
        seen.clear()
