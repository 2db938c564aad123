"""``local_fd.scan_sized`` through our loops' ``ss_list_dir`` (one C call a directory) against
``os.scandir`` (the Python path, the reference without the library): the same names, kinds
and sizes, whatever a directory holds (files, directories, links to either, dangling links,
FIFOs, names that are no UTF-8, more entries than the first buffer holds)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharding_store.codec import _native
from sharding_store.stores.local_fd import O_DIR, scan_sized

pytestmark = pytest.mark.skipif(_native.tail_reader() is None, reason="our loops' library is not built")

KINDS = ("file", "dir", "link_file", "link_dir", "dangling", "fifo")
NAMES = st.one_of(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1, max_size=12),
                  st.binary(min_size=1, max_size=8).filter(lambda b: b"/" not in b and b"\0" not in b))


def _make(top: bytes, name: bytes, kind: str, size: int) -> None:
    path = os.path.join(top, name)
    if kind == "file":
        with open(path, "wb") as f:
            f.write(b"x" * size)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "link_file":
        os.symlink(b"/etc/hostname", path)
    elif kind == "link_dir":
        os.symlink(b".", path)
    elif kind == "dangling":
        os.symlink(b"nowhere", path)
    else:
        os.mkfifo(path)


def _both(top: bytes, sizes: bool) -> tuple[list, list]:
    out = []
    for flag in (True, False):
        fd = os.open(top, O_DIR)  # a descriptor of its own each: a listing moves its offset
        try:
            with _native.using_loops(flag):
                out.append(sorted(scan_sized(fd, sizes=sizes)))
        finally:
            os.close(fd)
    return out[0], out[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.dictionaries(NAMES, st.tuples(st.sampled_from(KINDS), st.integers(0, 100)), max_size=12),
       sizes=st.booleans())
def test_the_c_listing_is_scandirs(tmp_path_factory, entries, sizes):
    top = os.fsencode(tmp_path_factory.mktemp("listing"))
    made = set()
    for name, (kind, size) in entries.items():
        raw = os.fsencode(name) if isinstance(name, str) else name
        if raw in made or raw in (b".", b".."):
            continue
        made.add(raw)
        _make(top, raw, kind, size)
    native, plain = _both(top, sizes)
    assert native == plain
    assert len(native) == len(made)


def test_a_directory_bigger_than_the_first_buffer_is_listed_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(_native, "LIST_ENTRIES", 16)
    monkeypatch.setattr(_native, "LIST_NAME_BYTES", 64)
    for i in range(300):
        (tmp_path / f"object-{i:04d}").write_bytes(b"y" * (i % 7))
    native, plain = _both(os.fsencode(tmp_path), True)
    assert native == plain and len(native) == 300 and native[5] == ("object-0005", "f", 5)


def test_an_unreadable_directory_takes_scandirs_way(tmp_path, monkeypatch):
    monkeypatch.setattr(_native, "list_dir", lambda *a: None)  # ``ss_list_dir`` could not read it
    (tmp_path / "a").write_bytes(b"12")
    native, plain = _both(os.fsencode(tmp_path), True)
    assert native == plain == [("a", "f", 2)]
