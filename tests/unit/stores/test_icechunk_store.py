"""stores/icechunk_store.py: one Icechunk session as a migration's destination (issue 24).

Local repositories only (the S3 cases are in tests/integration/test_icechunk_s3.py). What
Icechunk checks of a virtual chunk's source object is shown by reading through zarr-python 3
after rewriting, truncating, replacing and deleting the object.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

ic = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")

from sharding_store.errors import DestinationExistsError, SourceChangedError, StoreIOError, UsageError  # noqa: E402
from sharding_store.stores.base import ChunkRef, Location  # noqa: E402
from sharding_store.stores.icechunk_store import (  # noqa: E402
    is_repository,
    local_checksum,
    open_icechunk,
    stand_in,
)
from sharding_store.stores.zarr_store import ZarrStoreInner  # noqa: E402

MARKER, RECORD = ".sharding-store-migration.json", ".sharding-store-record.json"
DATA = np.arange(16, dtype="u1")


def array_doc(shape: tuple[int, ...] = (16,), chunks: tuple[int, ...] = (16,)) -> bytes:
    arr = zarr.create_array(zarr.storage.MemoryStore(), shape=shape, chunks=chunks, dtype="u1", compressors=None,
                            fill_value=0)
    return json.dumps(arr.metadata.to_dict()).encode()


GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


def ref_of(path: Path, offset: int = 0, length: int = 16) -> ChunkRef:
    st = os.stat(path)
    modified = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=st.st_mtime_ns // 1000)
    return ChunkRef(f"file://{path}", offset, length, st.st_size, modified=modified)


def read(repo: Path, path: str = "a", authorise: str | None = None) -> np.ndarray:
    """The array at ``path`` of the branch tip, read by zarr-python 3 as the README says."""
    grants = {authorise: None} if authorise else None
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)), authorize_virtual_chunk_access=grants)
    return zarr.open_array(repository.readonly_session("main").store, path=path, mode="r")[...]


@pytest.fixture
def virtual_repo(tmp_path: Path) -> tuple[Path, Path, str]:
    """A committed repository whose array ``a`` is one virtual chunk: bytes 2..18 of ``src/obj``."""
    src = tmp_path / "src"
    src.mkdir()
    obj = src / "obj"
    obj.write_bytes(b"XX" + DATA.tobytes() + b"YY")
    dst = open_icechunk(str(tmp_path / "repo"), virtual=True, source=Location("file", "", str(src)))
    dst.set("zarr.json", GROUP)
    dst.set("a/zarr.json", array_doc())
    dst.put_reference("a/c/0", ref_of(obj, 2, 16))
    dst.commit("virtual")
    return tmp_path / "repo", obj, f"file://{src}/"


def test_virtual_chunk_reads_through_zarr_python_3(virtual_repo):
    repo, _, prefix = virtual_repo
    assert np.array_equal(read(repo, authorise=prefix), DATA)


def test_a_reader_that_does_not_authorise_the_container_is_refused(virtual_repo):
    repo, _, _ = virtual_repo
    with pytest.raises(ic.IcechunkError):
        read(repo)


def _rewrite_same_size(obj: Path) -> None:
    obj.write_bytes(b"XX" + bytes(16) + b"YY")


def _rewrite_keeping_mtime_by_rename(obj: Path) -> None:
    st = os.stat(obj)
    new = obj.with_name("new")
    new.write_bytes(b"XX" + bytes(16) + b"YY")
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, obj)


def _rewrite_with_older_mtime(obj: Path) -> None:
    st = os.stat(obj)
    obj.write_bytes(b"XX" + bytes(16) + b"YY")
    os.utime(obj, ns=(st.st_atime_ns, st.st_mtime_ns - 5 * 10**9))


@pytest.mark.parametrize("change", [
    _rewrite_same_size,
    _rewrite_keeping_mtime_by_rename,
    _rewrite_with_older_mtime,
    lambda obj: obj.write_bytes(b"XX" + DATA.tobytes()[:4]),
    lambda obj: obj.unlink(),
], ids=["rewritten", "replaced-same-mtime", "older-mtime", "truncated", "deleted"])
def test_a_changed_source_object_makes_the_read_raise(virtual_repo, change):
    """Icechunk compares the file's ETag (inode, mtime in µs, size) on every read: each change
    raises in zarr-python 3 and in our store, never returns other bytes."""
    repo, obj, prefix = virtual_repo
    change(obj)
    with pytest.raises(ic.IcechunkError):
        read(repo, authorise=prefix)
    dst = open_icechunk(str(repo))
    with pytest.raises(SourceChangedError, match="a/c/0"):
        dst.get("a/c/0")


def test_the_same_bytes_rewritten_in_place_with_the_old_mtime_is_not_seen(virtual_repo):
    """The one change Icechunk cannot see locally (documented): the same inode, size and
    modification time. Here the bytes are the same, so the read is right."""
    repo, obj, prefix = virtual_repo
    st = os.stat(obj)
    with open(obj, "r+b") as f:
        f.write(b"XX" + DATA.tobytes() + b"YY")
    os.utime(obj, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert np.array_equal(read(repo, authorise=prefix), DATA)


def test_a_reference_to_an_object_changed_since_it_was_taken_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    obj = src / "obj"
    obj.write_bytes(DATA.tobytes())
    ref = ref_of(obj)
    obj.write_bytes(DATA.tobytes() * 2)
    dst = open_icechunk(str(tmp_path / "repo"), virtual=True, source=Location("file", "", str(src)))
    dst.set("a/zarr.json", array_doc())
    with pytest.raises(SourceChangedError, match="changed since its reference"):
        dst.put_reference("a/c/0", ref)


def test_local_checksum_is_object_stores_etag(tmp_path):
    obj = tmp_path / "obj"
    obj.write_bytes(b"abc")
    st = os.stat(obj)
    assert local_checksum(f"file://{obj}", 3, None) == f"{st.st_ino:x}-{st.st_mtime_ns // 1000:x}-3"
    with pytest.raises(SourceChangedError):
        local_checksum(f"file://{obj}", 4, None)
    assert local_checksum(f"file://{obj}", 3, st.st_mtime_ns, st.st_ino).startswith(f"{st.st_ino:x}-")
    with pytest.raises(SourceChangedError, match="replaced by another file"):  # the reference's file, not another
        local_checksum(f"file://{obj}", 3, st.st_mtime_ns, st.st_ino + 1)


def test_materialised_writes_are_invisible_until_the_commit(tmp_path):
    repo = tmp_path / "repo"
    first = open_icechunk(str(repo))
    first.set("zarr.json", GROUP)
    first.set("a/zarr.json", array_doc())
    first.set("a/c/0", DATA.tobytes())
    first.commit("first")
    second = open_icechunk(str(repo))
    assert not second.takes_references()
    second.set("a/c/0", bytes(16))
    second.set("b/zarr.json", array_doc())
    assert second.get("a/c/0") == bytes(16)  # the session sees its own writes
    assert np.array_equal(read(repo), DATA)  # the branch does not
    with pytest.raises(FileNotFoundError):
        read(repo, "b")
    snapshot = second.commit("second")
    assert np.array_equal(read(repo), np.zeros(16, "u1"))
    repository = ic.Repository.open(ic.local_filesystem_storage(str(repo)))
    assert repository.lookup_branch("main") == snapshot
    assert repository.lookup_snapshot(snapshot).message == "second"


def test_marker_and_record_live_beside_the_hierarchy(tmp_path):
    repo = tmp_path / "repo"
    dst = open_icechunk(str(repo))
    assert dst.create_exclusive(MARKER, b'{"m": 1}')
    assert not dst.create_exclusive(MARKER, b'{"m": 1}')
    dst.set(RECORD, b'{"src": "x"}')
    dst.set("zarr.json", GROUP)
    assert dst.list_dir("") == ([MARKER, RECORD, "zarr.json"], [])
    dst.delete(MARKER)
    dst.commit("with a record")
    again = open_icechunk(str(repo))
    assert again.get(RECORD) == b'{"src": "x"}' and again.exists(RECORD)
    assert not again.exists(MARKER) and again.get(MARKER) is None
    assert again.record() == {RECORD: {"src": "x"}}
    session = ic.Repository.open(ic.local_filesystem_storage(str(repo))).readonly_session("main")
    assert sorted(zarr.open_group(session.store, mode="r").keys()) == []  # no node of ours in the hierarchy
    again.delete(RECORD)  # --overwrite empties it: the next snapshot has none
    again.set("zarr.json", GROUP.replace(b"{}", b'{"x": 1}'))
    again.commit("without")
    assert open_icechunk(str(repo)).get(RECORD) is None


def test_keys_icechunk_cannot_hold_are_refused_by_name(tmp_path):
    dst = open_icechunk(str(tmp_path / "repo"))
    dst.set("a/zarr.json", array_doc())
    for key in ("a/c.0", "a/0", "a/notes.txt"):
        with pytest.raises(UsageError, match=f"{key}: Icechunk takes"):
            dst.set(key, b"x")
        assert dst.get(key) is None and not dst.exists(key)


def test_put_reference_only_on_a_virtual_destination(tmp_path):
    dst = open_icechunk(str(tmp_path / "repo"))
    with pytest.raises(NotImplementedError):
        dst.put_reference("a/c/0", ChunkRef("file:///x", 0, 1, 1))


def test_two_sessions_of_one_branch_the_second_commit_is_refused(tmp_path):
    repo = tmp_path / "repo"
    a, b = open_icechunk(str(repo)), open_icechunk(str(repo))
    a.set("zarr.json", GROUP)
    b.set("zarr.json", GROUP)
    a.commit("a")
    with pytest.raises(DestinationExistsError, match="another writer committed"):
        b.commit("b")


def test_a_source_path_icechunk_cannot_address_is_refused(tmp_path):
    src = tmp_path / "with space"
    src.mkdir()
    with pytest.raises(UsageError, match="cannot address"):
        open_icechunk(str(tmp_path / "repo"), virtual=True, source=Location("file", "", str(src)))


def test_a_reference_icechunk_cannot_address_or_check_is_refused(tmp_path):
    src = tmp_path / "src"
    (src / "my array").mkdir(parents=True)
    obj = src / "my array" / "c0"
    obj.write_bytes(DATA.tobytes())
    dst = open_icechunk(str(tmp_path / "repo"), virtual=True, source=Location("file", "", str(src)))
    dst.set("a/zarr.json", array_doc())
    with pytest.raises(UsageError, match="cannot address a virtual chunk whose path holds spaces"):
        dst.put_reference("a/c/0", ref_of(obj))
    with pytest.raises(UsageError, match="no ETag"):
        dst.put_reference("a/c/0", ChunkRef("s3://b/k", 0, 16, 16, modified=ref_of(obj).modified))


def test_a_non_empty_directory_is_no_repository_to_write(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"x")
    assert not is_repository(str(tmp_path / "d"))
    with pytest.raises(DestinationExistsError, match="not an Icechunk repository"):
        open_icechunk(str(tmp_path / "d"))
    open_icechunk(str(tmp_path / "new"))
    assert is_repository(str(tmp_path / "new"))


def test_a_session_that_changed_nothing_commits_nothing(tmp_path):
    repo = tmp_path / "repo"
    first = open_icechunk(str(repo))
    first.set("zarr.json", GROUP)
    snapshot = first.commit("first")
    again = open_icechunk(str(repo))
    again.set("zarr.json", GROUP)
    assert again.commit("same") == snapshot


def test_a_node_replaced_by_one_of_the_other_type_and_emptied(tmp_path):
    """What ``--overwrite`` does to a repository: everything deleted in the session, then written
    again (an array where a group was: Icechunk refuses that unless the node is deleted first)."""
    repo = tmp_path / "repo"
    first = open_icechunk(str(repo))
    first.set("zarr.json", GROUP)
    first.set("a/zarr.json", array_doc((4,), (2,)))
    first.set("a/c/0", b"xx")
    first.set(RECORD, b"{}")
    first.commit("first")
    again = open_icechunk(str(repo))
    again.set("a/zarr.json", GROUP)  # the array becomes a group: its chunks go with it
    assert list(again.list_prefix("a/")) == ["a/zarr.json"]
    again.delete("a/c/1")  # a chunk of a node gone: nothing to delete
    with pytest.raises(UsageError, match="b/c/0: no array holds this chunk"):
        again.set("b/c/0", b"x")
    assert again.get("b/c/0") is None and not again.exists("b/c/0")
    again.delete_prefix("")
    assert list(again.list_prefix("")) == []
    again.set("zarr.json", GROUP)
    again.commit("emptied")
    assert list(open_icechunk(str(repo)).list_prefix("")) == ["zarr.json"]


def test_listing_a_prefix_that_is_no_node(tmp_path):
    """Icechunk lists only below a node: other prefixes (a missing array, part of a name) filter
    the whole listing, as in any store."""
    dst = open_icechunk(str(tmp_path / "repo"))
    dst.set("zarr.json", GROUP)
    dst.set("imgs/zarr.json", GROUP)
    dst.set("imgs/zl/zarr.json", array_doc((4,), (2,)))
    dst.set("imgs/zl/c/1", b"ab")
    assert list(dst.list_prefix("imgs/z")) == ["imgs/zarr.json", "imgs/zl/c/1", "imgs/zl/zarr.json"]
    assert list(dst.list_prefix("imgs/zl")) == ["imgs/zl/c/1", "imgs/zl/zarr.json"]
    assert list(dst.list_prefix("imgs/none/")) == []
    assert dst.list_dir("imgs/") == (["imgs/zarr.json"], ["imgs/zl/"])


def test_tails_and_sizes_of_chunks(tmp_path):
    dst = open_icechunk(str(tmp_path / "repo"))
    dst.set("a/zarr.json", array_doc((4096,), (4096,)))
    blob = bytes(range(256)) * 16
    dst.set("a/c/0", blob)
    assert dst.size("a/c/0") == 4096 and dst.size("a/c/1") is None
    tail = dst.get_tails([("a/c/0", 8)])[0]
    assert tail is not None and tail.data == blob[-8:] and tail.size == 4096
    assert dst.get_ranges([("a/c/0", 10, 20), ("a/c/0", -4, None)]) == [blob[10:20], blob[-4:]]


def test_chunk_keys_to_array_and_coordinates():
    from sharding_store.stores.icechunk_store import _chunk_coords

    assert _chunk_coords("a/b/c/0/12") == ("/a/b", [0, 12])
    assert _chunk_coords("c/c/3") == ("/c", [3])  # an array named c
    assert _chunk_coords("c/0") == ("/", [0]) and _chunk_coords("c") == ("/", [])  # a root array
    assert _chunk_coords("s/c") == ("/s", [])  # 0-d
    assert _chunk_coords("a/zarr.json") is None and _chunk_coords(RECORD) is None


def test_icechunk_read_errors_become_ours(tmp_path):
    """Icechunk's reports (as 1.1 words them) mapped: a changed, shortened or missing source is
    SourceChangedError; a source that cannot be read otherwise is an I/O error with its cause."""
    from sharding_store.errors import StoreIOError

    dst = open_icechunk(str(tmp_path / "repo"))
    changed = "  x the checksum of the object owning the virtual chunk has changed (file:///s/o)"
    short = "  x error retrieving virtual chunk, not enough data. Expected: (16), available (4)"
    gone = "  x error fetching virtual reference\n  |-> Object at location /s/o not found: No such file"
    denied = "  x error fetching virtual reference\n  |-> error fetching virtual reference\n  `-> Access Denied"
    s3_gone = ("  x error fetching virtual reference\n  |-> service error\n  |-> NoSuchKey: The specified key does not "
               "exist.")
    for text in (changed, short, gone, s3_gone):
        assert isinstance(dst._error("a/c/0", Exception(text)), SourceChangedError), text
    error = dst._error("a/c/0", Exception(denied))
    assert type(error) is StoreIOError and "Access Denied" in str(error) and str(error).startswith("a/c/0: ")


def test_a_repository_created_by_another_run_meanwhile_is_opened(tmp_path, monkeypatch):
    """Two runs find no repository and both create it: the second's create fails, and it opens
    the one the first made (their commits then decide: only one of two sessions commits)."""
    import sharding_store.stores.icechunk_store as module

    repo = tmp_path / "repo"
    first = open_icechunk(str(repo))
    first.set("zarr.json", GROUP)
    first.commit("first")
    seen = []
    real = module._exists

    def raced(storage, location):  # the check ran before the other run created it
        seen.append(1)
        return False if len(seen) == 1 else real(storage, location)

    monkeypatch.setattr(module, "_exists", raced)
    second = open_icechunk(str(repo))
    assert second.get("zarr.json") == GROUP and len(seen) >= 2


def _outcome(fn):
    try:
        return fn()
    except (SourceChangedError, UsageError) as e:
        return (type(e).__name__, str(e))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hst.lists(hst.tuples(hst.sampled_from(["same", "grown", "touched", "gone", "bad key", "space", "datetime",
                                              "replaced"]),
                          hst.integers(1, 64)), min_size=1, max_size=6))
def test_checksums_of_a_batch_are_each_references_own(tmp_path_factory, cases):
    """``put_references``' inline checksums (the usual local reference) are exactly what
    ``_checksum`` of each one gives (the model), and each changed, gone or unstorable
    reference fails the batch as it fails alone."""
    src = tmp_path_factory.mktemp("src")
    dst = open_icechunk(str(src / "repo"), virtual=True, source=Location("file", "", str(src)))
    refs = []
    for i, (case, size) in enumerate(cases):
        obj = src / (f"o {i}" if case == "space" else f"o{i}")
        obj.write_bytes(bytes(size))
        st_ = os.stat(obj)
        ref = ChunkRef(f"file://{obj}", 0, size, size, modified_ns=st_.st_mtime_ns, inode=st_.st_ino)
        if case == "datetime":
            ref = ref_of(obj, 0, size)
        elif case == "grown":  # its size alone differs
            obj.write_bytes(bytes(size + 1))
            os.utime(obj, ns=(st_.st_atime_ns, st_.st_mtime_ns))
        elif case == "touched":  # its modification time alone differs
            os.utime(obj, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1000))
        elif case == "gone":
            obj.unlink()
        elif case == "replaced":  # another file of its size and time in its place: its inode alone differs
            other = src / f"new{i}"
            other.write_bytes(bytes(size))
            os.utime(other, ns=(st_.st_atime_ns, st_.st_mtime_ns))
            os.replace(other, obj)
        refs.append(("a/c-0" if case == "bad key" else f"a/c/{i}", (i,), ref))
    model = []
    for key, _, ref in refs:
        model.append(_outcome(lambda k=key, r=ref: dst._checksum(k, r)))
    first_error = next((m for m in model if isinstance(m, tuple)), None)
    assert _outcome(lambda: dst._checksums(refs)) == (first_error or model)
    if first_error is None:
        assert model == [local_checksum(r.url, r.object_size, r.modified_ns or r.modified, r.inode)
                         for _, _, r in refs]


def test_stand_in_keeps_what_icechunk_needs_of_an_array():
    doc = json.loads(array_doc((64, 32), (16, 8)))
    doc["attributes"] = {"long": "x" * 500}
    doc["dimension_names"] = ["y", "x"]
    raw = json.dumps(doc, indent=2).encode()
    lean = json.loads(stand_in(raw) or b"")
    assert {k: lean[k] for k in ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value",
                                 "dimension_names")} == {k: doc[k] for k in ("shape", "data_type", "chunk_grid",
                                                                             "chunk_key_encoding", "fill_value",
                                                                             "dimension_names")}
    assert "attributes" not in lean and lean["codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert stand_in(GROUP) is None and stand_in(b"not json") is None


def _docs_repo(tmp_path: Path, chunks: int = 8) -> tuple[Any, list[tuple[str, tuple[int, ...], ChunkRef]]]:
    src = tmp_path / "src"
    src.mkdir()
    dst = open_icechunk(str(tmp_path / "repo"), virtual=True, source=Location("file", "", str(src)))
    dst.set("zarr.json", GROUP)
    refs = []
    for i in range(chunks):
        obj = src / f"o{i}"
        obj.write_bytes(bytes([i]) * 2)
        refs.append((f"a/c/{i}", (i,), ChunkRef(f"file://{obj}", 0, 2, 2, modified_ns=os.stat(obj).st_mtime_ns)))
    return dst, refs


def _doc(tag: int) -> bytes:
    doc = json.loads(array_doc((16,), (2,)))
    doc["attributes"] = {"tag": tag, "pad": "p" * 300}
    return json.dumps(doc, indent=2).encode()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hst.lists(hst.one_of(hst.tuples(hst.just("refs"), hst.integers(0, 7)), hst.tuples(hst.just("get"), hst.just(0)),
                            hst.tuples(hst.just("set"), hst.integers(1, 9)), hst.tuples(hst.just("size"), hst.just(0))),
                 max_size=8))
def test_no_read_and_no_snapshot_sees_a_stand_in(tmp_path_factory, steps):
    """Against a model (the document last set; the references put): whatever reads or writes
    come between ``put_references`` calls, each read gives the document as set, and the
    snapshot holds it and every reference. While references are set the session holds the
    stand-in (the cost it saves), and the first read puts the document back."""
    dst, refs = _docs_repo(tmp_path_factory.mktemp("t"))
    model, put = _doc(0), set()
    dst.set("a/zarr.json", model)
    for op, n in steps:
        if op == "refs":
            dst.put_references("a", refs[n:n + 1])
            put.add(refs[n][0])
            assert ZarrStoreInner.get(dst, "a/zarr.json") == stand_in(model)  # the session's, raw
        elif op == "get":
            assert dst.get("a/zarr.json") == model
        elif op == "size":
            assert dst.size("a/zarr.json") == len(model)
        else:
            model = _doc(n)
            dst.set("a/zarr.json", model)
        assert ZarrStoreInner.get(dst, "a/zarr.json") in (model, stand_in(model))
    dst.commit("c")
    again = open_icechunk(str(dst.url), create=False)
    assert again.get("a/zarr.json") == model
    assert again.chunk_keys("a") == sorted(put)


def test_a_failed_put_references_leaves_the_document_as_set(tmp_path):
    dst, refs = _docs_repo(tmp_path)
    dst.set("a/zarr.json", _doc(1))
    with pytest.raises(StoreIOError, match="invalid chunk index"):
        dst.put_references("a", [("a/c/0", (99,), refs[0][2])])  # outside the chunk grid: Icechunk refuses it
    assert ZarrStoreInner.get(dst, "a/zarr.json") == _doc(1)
