"""The local store's directory walk (``stores.local_fd.DirFds.resolve``) against ``realpath``.

The walk opens each directory ``O_NOFOLLOW`` from its parent's descriptor, reads a link it
meets and walks its target the same way, and caches the descriptors it opened. Model: going
through the spelled components in order, the first prefix whose ``realpath`` lies outside
the store's real root makes it refuse (``LinkOutsideStoreError``); the first one that is no
directory makes it "missing"; else it reaches the directory ``realpath`` names (same device
and inode). Random trees of real directories, links to directories inside and outside the
store, links to links and ``.``/``..`` components, resolved in random order by one store
object (so descriptors cached by earlier walks decide later ones): every walk must agree
with the model, and every cached descriptor must be a directory inside the store at the
canonical (link-free) path it is cached under.
"""

from __future__ import annotations

import errno
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


@pytest.mark.slow  # 300 random trees; test_stores_local_fd.py and test_stores_local_race.py walk them fast
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=trees())
def test_directory_walks_agree_with_realpath(case):
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
            check_one(inner, root, real_root, rel)
        for path, d in inner._dirs._cache.items():
            here = os.path.join(real_root, path) if path else real_root
            assert os.path.realpath(here) == here, path  # canonical: no link on the way
            st, at = os.fstat(d.fd), os.stat(here)
            assert (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino), path
        inner.close()


def expected(root: str, real_root: str, rel: str) -> str | None:
    """``"out"``, ``"missing"`` or the real directory the model says ``rel`` reaches."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        here = os.path.join(root, *parts[:i])
        real = os.path.realpath(here)
        if not (real == real_root or real.startswith(real_root + "/")):
            return "out"
        if not os.path.isdir(here):
            return "missing"
    return os.path.realpath(os.path.join(root, rel))


def check_one(inner: LocalInner, root: str, real_root: str, rel: str) -> None:
    want = expected(root, real_root, rel)
    if want == "out":
        with pytest.raises(LinkOutsideStoreError) as info:
            inner._dirs.resolve(rel, rel)
        assert info.value.key == rel
        return
    try:
        got = inner._dirs.resolve(rel, rel)
    except OSError as e:  # a loop of links: the kernel says ELOOP too
        assert e.errno == errno.ELOOP and want == "missing", (rel, want, e)
        return
    if want == "missing":
        assert got is None, (rel, got and got[0].path)
        return
    assert got is not None, (rel, want)
    try:
        st, at = os.fstat(got[0].fd), os.stat(want)
        assert (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino), (rel, want, got[0].path)
    finally:
        inner._dirs.release(got[0])
