"""The local store's directory check (``LocalInner._check_dir``) against ``realpath``.

The check remembers directories it found inside the store and decides a new one below a
remembered one with one ``lstat``. Model: a directory is acceptable exactly when its
``realpath`` lies inside the store's real root. Random trees of real directories, links
to directories inside and outside the store, links to links and ``.``/``..``
components, checked in random order by one store object (so the remembered directories
of earlier checks decide later ones): every check must agree with the model, and every
remembered directory must be a directory inside the store.
"""

from __future__ import annotations

import os
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from sharding_store.errors import LinkOutsideStoreError
from sharding_store.stores.local import LocalInner

NAMES = ["a", "b", "c", "d"]


@st.composite
def trees(draw):
    """(entries, paths to check): entries are (relative path, kind, link target)."""
    entries = []
    made = [""]
    for _ in range(draw(st.integers(1, 10))):
        parent = draw(st.sampled_from(made))
        name = draw(st.sampled_from(NAMES))
        rel = f"{parent}/{name}".lstrip("/")
        if rel in made:
            continue
        kind = draw(st.sampled_from(["dir", "dir", "dir", "link-in", "link-out", "link-up", "file"]))
        target = draw(st.sampled_from(made)) if kind == "link-in" else None
        entries.append((rel, kind, target))
        made.append(rel)
    parts = st.lists(st.sampled_from(NAMES + ["..", "."]), min_size=1, max_size=5)
    checks = draw(st.lists(parts, min_size=1, max_size=12))
    return entries, ["/".join(p) for p in checks]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=trees())
def test_directory_checks_agree_with_realpath(case):
    entries, checks = case
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "store")
        outside = os.path.join(tmp, "outside")
        os.makedirs(os.path.join(outside, "a", "b"))
        os.makedirs(root)
        for rel, kind, target in entries:
            path = os.path.join(root, rel)
            if not os.path.isdir(os.path.dirname(path)) or os.path.lexists(path):
                continue  # its parent is a file or a dangling link, or a link made it already
            if kind == "dir":
                os.mkdir(path)
            elif kind == "file":
                open(path, "w").close()
            elif kind == "link-in":
                os.symlink(os.path.join(root, target) if target else root, path)
            elif kind == "link-out":
                os.symlink(outside, path)
            else:  # a relative link up and out, then back in under another name
                os.symlink("../" * (rel.count("/") + 2) + os.path.basename(tmp) + "/store", path)
        inner = LocalInner(root)
        real_root = os.path.realpath(root)
        for rel in checks:
            directory = f"{inner.root}/{rel}"
            real = os.path.realpath(directory)
            inside = real == real_root or real.startswith(real_root + "/")
            if inside:
                inner._check_dir(directory, rel)
            else:
                with pytest.raises(LinkOutsideStoreError):
                    inner._check_dir(directory, rel)
            for remembered in inner._safe_dirs:
                r = os.path.realpath(remembered)
                assert os.path.isdir(r)
                assert r == real_root or r.startswith(real_root + "/"), remembered
