"""A destination that is the source, inside it or around it is refused, however spelled (issue 12 item 1).

"Same store / nested" is decided once, on the stores' canonical locations
(``Location.relation``), by migrate, reshard and verify alike. Every test goes through
the CLI and hashes the source tree before and after: nothing of it may change, not
even with ``--overwrite`` (which used to delete the source when DST was spelled
``file://SRC``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from sharding_store import create_draft_array
from sharding_store.cli import main
from tests.draft_factory import tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
USAGE = 2


@pytest.fixture
def src(tmp_path, monkeypatch):
    """A small draft store at ``tmp_path/src``; cwd is ``tmp_path`` and ``~`` is ``tmp_path``."""
    root = tmp_path / "src"
    create_draft_array(str(root), "a", shape=(8, 6), chunks=(2, 3), dtype="<i4",
                       chunks_per_shard=(2, 1))[...] = np.arange(48, dtype="<i4").reshape(8, 6)
    (tmp_path / "to_src").symlink_to(root, target_is_directory=True)
    (tmp_path / "into_src").symlink_to(root / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    return root


#: spellings of a destination that is the source itself (a local directory ``src``)
SAME = [
    "file://{src}",
    "file://{src}/",
    "src",
    "./src/",
    "~/src",
    "{src}/data/..",
    "{tmp}/src//",
    "to_src",
    "file://{tmp}/to_src",
]
#: spellings of a destination inside the source, or containing it
NESTED = [
    "file://{src}/new",
    "src/new",
    "~/src/data/new",
    "to_src/new",
    "into_src",
    "into_src/deeper",
    "{tmp}",
    ".",
    "file://{tmp}",
]


def spell(template: str, src) -> str:
    return template.format(src=src, tmp=src.parent)


@pytest.mark.parametrize("dst", SAME + NESTED)
def test_migrate_refuses_and_leaves_the_source_untouched(src, dst, capsys):
    before = tree_hash(src)
    code = main(["migrate", str(src), spell(dst, src), "--overwrite", "--no-verify"])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert "the destination is the source, inside it, or contains it" in err and len(err.strip().splitlines()) == 1
    assert tree_hash(src) == before
    assert not (src / "new").exists() and not (src / "data" / "new").exists()


@pytest.mark.parametrize("src_spelling", ["file://{src}", "to_src", "./src", "~/src/"])
def test_migrate_refuses_whatever_the_source_spelling(src, src_spelling, capsys):
    before = tree_hash(src)
    assert main(["migrate", spell(src_spelling, src), str(src), "--overwrite", "--no-verify"]) == USAGE
    assert main(["migrate", spell(src_spelling, src), f"{src}/new"]) == USAGE
    assert "the destination is the source" in capsys.readouterr().err
    assert tree_hash(src) == before


@pytest.mark.parametrize("dst", ["file://{src}", "to_src", "src/new", "into_src", "{tmp}"])
def test_reshard_refuses_and_leaves_the_source_untouched(src, dst, capsys):
    before = tree_hash(src)
    code = main(["reshard", str(src), spell(dst, src), "--unshard", "--overwrite", "--no-progress"])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert "the destination is the source, inside it, or contains it" in err
    assert tree_hash(src) == before


@pytest.mark.parametrize("dst", ["file://{src}", "to_src", "./src/"])
def test_verify_refuses_the_source_itself(src, dst, capsys):
    assert main(["verify", str(src), spell(dst, src)]) == USAGE
    assert "the destination is the source" in capsys.readouterr().err


def test_a_sibling_with_a_common_name_prefix_is_apart(src, tmp_path, capsys):
    """``src2`` is not inside ``src``: the decision is component-wise, not on strings."""
    assert main(["migrate", str(src), str(tmp_path / "src2"), "--json"]) == 0, capsys.readouterr().err
    assert os.path.exists(tmp_path / "src2" / "zarr.json")


def test_two_mappings_are_apart_and_one_mapping_is_the_same_store(tmp_path):
    from sharding_store import UsageError, migrate

    store: dict = {}
    create_draft_array(store, "a", shape=(4,), chunks=(2,), dtype="<i2", chunks_per_shard=(2,))[...] = np.arange(4)
    with pytest.raises(UsageError, match="destination is the source"):
        migrate(store, store, overwrite=True)
    assert "zarr.json" in store and any(k.startswith("data/") for k in store)
    out: dict = {}
    assert migrate(store, out, progress=False).verification.ok
