"""``info --path P`` and ``DraftGroup.tree()`` show exactly the subtree at P (issue 12
item 12): the sample's ``info --path images`` used to list ``tables`` and drop ``labels``
(the tree's lines, depth-first, were zipped with the nodes, breadth-first)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sharding_store
from sharding_store import create_draft_array, create_draft_group, open_draft
from sharding_store.cli import main

SAMPLE = Path(sharding_store.__file__).resolve().parents[1] / "samples" / "zarr-2.18-sharded.zr3"


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def tree_names(text: str) -> list[tuple[int, str]]:
    """(depth, name) of each tree line."""
    out = []
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        out.append(((len(line) - len(stripped)) // 2, stripped.split(" ")[0]))
    return out


def test_sample_info_path_lists_only_its_subtree():
    code, out, err = run("info", str(SAMPLE), "--path", "images")
    assert code == 0, err
    tree = out.split("\n\n")[1]  # after the header line
    assert tree_names(tree) == [(0, "images"), (1, "labels"), (1, "mean"), (1, "raw")]
    assert "tables" not in out and "measurements" not in out and "timestamps" not in out
    blocks = [b.splitlines()[0] for b in out.split("\n\n")[2:]]
    assert blocks == ["/images/labels", "/images/mean", "/images/raw"]


def test_sample_group_trees():
    images = open_draft(str(SAMPLE), "images").tree()
    assert tree_names(images) == [(0, "images"), (1, "labels"), (1, "mean"), (1, "raw")]
    tables = open_draft(str(SAMPLE), "tables").tree()
    assert tree_names(tables) == [(0, "tables"), (1, "measurements"), (1, "timestamps")]
    root = open_draft(str(SAMPLE)).tree()
    assert tree_names(root) == [(0, "/"), (1, "images"), (2, "labels"), (2, "mean"), (2, "raw"),
                                (1, "tables"), (2, "measurements"), (2, "timestamps")]


NAMES = st.sampled_from(["a", "b", "ab", "b.c", "z"])


@pytest.mark.slow  # 40 random hierarchies through the CLI; the sample's subtrees stay in the fast loop
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(paths=st.lists(st.lists(NAMES, min_size=1, max_size=3).map("/".join), min_size=1, max_size=6, unique=True))
def test_every_subtree_is_exactly_its_nodes(tmp_path_factory, paths):
    """For random hierarchies: each group's tree (and ``info --path``'s) holds exactly the
    nodes at and below it, each under its parent, depth-first."""
    root = tmp_path_factory.mktemp("subtree") / "s.zr3"
    for p in sorted(paths, key=len):  # a path with others below it is a group, the rest are arrays
        if any(q.startswith(p + "/") for q in paths):
            create_draft_group(str(root), p)
        else:
            create_draft_array(str(root), p, shape=(2,), chunks=(1,), dtype="u1")
    h = open_draft(str(root)).hierarchy
    for group in [n.path for n in h.groups()]:
        expected = sorted((p for p in h.nodes if group == "" or p == group or p.startswith(group + "/")),
                          key=lambda p: p.split("/") if p else [])
        base = group.count("/") + 1 if group else 0
        want = [((p.count("/") + 1 if p else 0) - base, p.rpartition("/")[2] or "/") for p in expected]
        assert tree_names(open_draft(str(root), group).tree()) == want, group
        code, out, err = run("info", str(root), "--path", group or "/")
        assert code == 0, err
        assert tree_names(out.split("\n\n")[1]) == want, group  # after the header line
