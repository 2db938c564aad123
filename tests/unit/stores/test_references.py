"""The reference file (issue 24): :class:`ReferenceFileSink` as a store, the file it writes,
and the guarded reader :func:`open_references` against a source changed after the fact.

A source shard rewritten with the same size, truncated or deleted after the migration:
the guarded reader raises :class:`SourceChangedError` naming the URL and what changed;
plain fsspec (no guard, as the README says) returns whatever the bytes are now.
"""

from __future__ import annotations

import json
import os
import re
import time

import fsspec
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as hs

from sharding_store import SourceChangedError, migrate, open_references
from sharding_store.errors import DestinationExistsError, ObjectChangedError, StoreNotFoundError
from sharding_store.stores import ChunkRef
from sharding_store.stores.references import REFERENCE_KEY, ReferenceFileSink
from tests.draft_factory import make_big_array, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _plain(path) -> zarr.Group:
    """The reference file through fsspec alone (no guard)."""
    fs = fsspec.filesystem("reference", fo=str(path), asynchronous=True)
    return zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r")


def _guarded(path) -> zarr.Group:
    return zarr.open_group(open_references(str(path)), mode="r")


# --------------------------------------------------------------------------- the sink as a store


def test_the_sink_holds_documents_and_references_until_commit(tmp_path):
    (tmp_path / "obj").write_bytes(b"0123456789")
    st = os.stat(tmp_path / "obj")
    sink = ReferenceFileSink(str(tmp_path / "out.json"), source="SRC")
    assert sink.takes_references() and list(sink.list_prefix("")) == []
    sink.set("zarr.json", b'{"node_type": "group"}')
    url = f"file://{tmp_path / 'obj'}"
    sink.put_reference("a/c/0", ChunkRef(url, 2, 5, 10, modified_ns=st.st_mtime_ns))
    assert sink.get("a/c/0") == b"23456" and sink.get_ranges([("a/c/0", 1, 3)]) == [b"34"]
    assert sink.get_tails([("a/c/0", 2)])[0].data == b"56" and sink.size("a/c/0") == 5
    assert list(sink.list_sized("")) == [("a/c/0", 5), ("zarr.json", 22)]
    assert not (tmp_path / "out.json").exists()  # nothing visible before the commit
    assert sink.commit("a message") == str(tmp_path / "out.json")
    doc = json.loads((tmp_path / "out.json").read_bytes())
    assert doc == {"version": 1, "refs": {"a/c/0": [url, 2, 5], "zarr.json": '{"node_type": "group"}'},
                   REFERENCE_KEY: {"schema": 1, "source": "SRC", "message": "a message",
                                   "objects": {url: {"size": 10, "modified_ns": st.st_mtime_ns}}}}
    again = ReferenceFileSink(str(tmp_path / "out.json"), read_only=True)
    assert again.reference("a/c/0") == sink.reference("a/c/0") and again.get("zarr.json") == sink.get("zarr.json")
    assert not again.takes_references()


def test_a_reference_outside_its_object_is_refused(tmp_path):
    sink = ReferenceFileSink(str(tmp_path / "out.json"))
    with pytest.raises(ObjectChangedError, match=r"\[8, 12\) does not lie inside its 10 bytes"):
        sink.put_reference("k", ChunkRef("file:///x", 8, 4, 10))


def test_two_references_to_one_object_must_agree_on_what_it_is(tmp_path):
    sink = ReferenceFileSink(str(tmp_path / "out.json"))
    sink.put_reference("a", ChunkRef("file:///x", 0, 4, 10, modified_ns=1))
    sink.put_reference("b", ChunkRef("file:///x", 4, 4, 10, modified_ns=1))
    with pytest.raises(ObjectChangedError, match="changed between two references"):
        sink.put_reference("c", ChunkRef("file:///x", 0, 4, 11, modified_ns=2))


def test_a_file_that_is_no_reference_file_is_never_overwritten(tmp_path):
    (tmp_path / "out.json").write_text('{"mine": true}')
    with pytest.raises(DestinationExistsError, match="not an fsspec reference file"):
        ReferenceFileSink(str(tmp_path / "out.json"))
    with pytest.raises(StoreNotFoundError, match="not an fsspec reference file"):
        open_references(str(tmp_path / "out.json"))
    with pytest.raises(StoreNotFoundError, match="no such reference file"):
        open_references(str(tmp_path / "missing.json"))
    assert (tmp_path / "out.json").read_text() == '{"mine": true}'


# --------------------------------------------------------------------------- a migrated store, then changed


@pytest.fixture
def migrated(tmp_path):
    data = make_big_array(tmp_path / "src", shards=6)
    migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    shard = next(p for p in sorted((tmp_path / "src").rglob("*")) if p.is_file() and "/data/" in str(p))
    return tmp_path / "out.json", data, shard


def test_both_readers_read_the_source_values(migrated):
    out, data, _ = migrated
    np.testing.assert_array_equal(_plain(out)["big"][...], data)
    np.testing.assert_array_equal(_guarded(out)["big"][...], data)


def test_a_shard_rewritten_with_the_same_size_is_refused_by_the_guard(migrated):
    out, data, shard = migrated
    blob = shard.read_bytes()
    time.sleep(0.05)  # a later modification time than the one recorded (the guard's evidence)
    shard.write_bytes(blob[:8][::-1] + blob[8:])  # same size, other bytes
    with pytest.raises(SourceChangedError, match=rf"file://{shard}: modified since"):
        _guarded(out)["big"][...]


def _replace_keeping_size_and_mtime(shard) -> None:
    """Put a new file of other bytes in ``shard``'s place, as ``rsync -t`` does (a temporary
    file renamed over it), with the same size and modification time to the nanosecond."""
    st = shard.stat()
    blob = shard.read_bytes()
    new = shard.with_name(shard.name + ".tmp")
    new.write_bytes(blob[:8][::-1] + blob[8:])
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, shard)
    now = shard.stat()
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns) and now.st_ino != st.st_ino


def test_the_inode_is_recorded_and_a_replaced_shard_is_refused_by_every_reader(migrated, capsys):
    """A shard replaced by a file of the same size and modification time (only its inode
    differs): the guarded reader, ``verify`` (exit 14) and the reference check refuse it
    naming the URL."""
    from sharding_store.cli import main

    out, _, shard = migrated
    recorded = json.loads(out.read_bytes())[REFERENCE_KEY]["objects"][f"file://{shard}"]
    assert recorded["inode"] == shard.stat().st_ino
    inode = shard.stat().st_ino
    _replace_keeping_size_and_mtime(shard)
    words = rf"file://{shard}: replaced by another file of the same size and modification time \(inode \d+, was {inode}\)"
    with pytest.raises(SourceChangedError, match=words):
        _guarded(out)["big"][...]
    assert main(["verify", str(out.parent / "src"), str(out), "--no-progress"]) == 14
    assert re.search(words, capsys.readouterr().err)
    assert main(["verify", str(out.parent / "src"), str(out), "--references-only", "--no-progress"]) == 9
    assert re.search(words, capsys.readouterr().out + capsys.readouterr().err)


def test_a_source_made_read_only_still_reads(migrated):
    """chmod changes a file's ctime, never its inode or mtime: an archive made read-only
    keeps its references (ctime is deliberately not recorded)."""
    from sharding_store import verify

    out, data, _ = migrated
    for path in (out.parent / "src").rglob("*"):
        if path.is_file():
            os.chmod(path, 0o444)
    np.testing.assert_array_equal(_guarded(out)["big"][...], data)
    assert verify(str(out.parent / "src"), str(out)).ok


def test_a_reference_file_of_an_earlier_version_without_inodes_still_reads(migrated):
    """A file written before inodes were recorded is read and verified as before: size and
    mtime checked, the inode not (a replacement keeping both is not seen there)."""
    from sharding_store import verify

    out, data, shard = migrated
    doc = json.loads(out.read_bytes())
    for info in doc[REFERENCE_KEY]["objects"].values():
        del info["inode"]
    out.write_text(json.dumps(doc))
    np.testing.assert_array_equal(_guarded(out)["big"][...], data)
    assert verify(str(out.parent / "src"), str(out)).ok
    size = shard.stat().st_size
    os.truncate(shard, size - 10)  # still checked: the size
    with pytest.raises(SourceChangedError, match=rf"now {size - 10} bytes, was {size}"):
        _guarded(out)["big"][...]


def test_a_truncated_shard_is_refused_by_the_guard_naming_both_sizes(migrated):
    out, _, shard = migrated
    size = shard.stat().st_size
    os.truncate(shard, size - 10)
    with pytest.raises(SourceChangedError, match=rf"file://{shard}: now {size - 10} bytes, was {size}"):
        _guarded(out)["big"][...]


def test_a_deleted_shard_is_refused_by_the_guard(migrated):
    out, _, shard = migrated
    shard.unlink()
    with pytest.raises(SourceChangedError, match=rf"file://{shard}: deleted since the references were taken"):
        _guarded(out)["big"][...]


@pytest.mark.parametrize("truncated", [False, True])
def test_an_unrecorded_object_is_refused_with_one_message_by_every_reader(migrated, truncated):
    """A reference whose URL the file's ``"sharding-store"`` block records nothing of: the
    file read back as a store (what ``verify`` reads through) refuses it as the guarded
    reader does, in the same words (it read it, or said "now N bytes, was M")."""
    out, _, shard = migrated
    doc = json.loads(out.read_bytes())
    key, (url, _, _) = next((k, v) for k, v in doc["refs"].items() if isinstance(v, list) and v[0].endswith(
        str(shard.relative_to(shard.parents[4]))))
    del doc[REFERENCE_KEY]["objects"][url]
    out.write_text(json.dumps(doc))
    if truncated:
        os.truncate(shard, shard.stat().st_size - 10)
    with pytest.raises(SourceChangedError) as guarded:
        _guarded(out)["big"][...]
    with pytest.raises(SourceChangedError) as back:
        ReferenceFileSink(str(out), read_only=True).get(key)
    assert str(guarded.value) == str(back.value) == f"{url}: referenced, but the reference file records nothing of it"


def test_plain_fsspec_is_not_guarded(migrated):
    """What the README warns of: without the guard a rewritten source is read as it is now."""
    out, data, shard = migrated
    before = _plain(out)["big"][...]
    blob = bytearray(shard.read_bytes())
    index_at = len(blob) - 16 * 4
    shard.write_bytes(bytes(blob[:index_at]) + bytes(blob[index_at:index_at + 16]) * 4)  # every chunk -> the first
    after = _plain(out)["big"][...]
    assert np.array_equal(before, data) and not np.array_equal(after, data)


def test_the_migration_leaves_the_source_as_it_was(tmp_path):
    make_big_array(tmp_path / "src", shards=3)
    before = tree_hash(tmp_path / "src")
    migrate(str(tmp_path / "src"), str(tmp_path / "out.json"), progress=False)
    assert tree_hash(tmp_path / "src") == before


def test_a_reference_past_the_end_of_its_object_is_refused_on_read(migrated):
    """A hand-edited file whose reference reaches past its object: verify and the guarded
    reader refuse it (never a short read handed to a codec)."""
    from sharding_store import verify

    out, _, shard = migrated
    doc = json.loads(out.read_bytes())
    key = next(k for k, v in doc["refs"].items() if isinstance(v, list) and v[0] == f"file://{shard}")
    doc["refs"][key][2] += 8
    out.write_text(json.dumps(doc))
    with pytest.raises(SourceChangedError, match=rf"file://{shard}: a reference reaches byte \d+, past the object's"):
        _guarded(out)["big"][...]
    with pytest.raises(SourceChangedError, match="past the object's recorded"):
        verify(str(out.parent / "src"), str(out))


def test_a_local_commit_streams_the_file_in_pieces(tmp_path, monkeypatch):
    """The file is written piece by piece into its temporary file, never joined in memory."""
    sink = ReferenceFileSink(str(tmp_path / "out.json"))
    for i in range(10):
        sink.put_reference(f"a/c/{i}", ChunkRef(f"file:///x{i}", 0, 1, 1, modified_ns=i))
    monkeypatch.setattr(sink, "encode", lambda message="": pytest.fail("the whole file was built in memory"))
    sink.commit("m")
    doc = json.loads((tmp_path / "out.json").read_bytes())
    assert list(doc["refs"]) == [f"a/c/{i}" for i in range(10)] and len(doc[REFERENCE_KEY]["objects"]) == 10
    assert [p for p in os.listdir(tmp_path) if p != "out.json"] == []  # no temporary file left


# --------------------------------------------------------------------------- memory, retries


MANY_REFERENCES = r"""
    import os
    from sharding_store.stores import ChunkRef
    from sharding_store.stores.references import ReferenceFileSink

    def rss_mb():
        with open("/proc/self/status") as status:
            return int([line for line in status if line.startswith("VmRSS:")][0].split()[1]) / 1024

    n, out = int(sys.argv[2]), sys.argv[3]
    sink = ReferenceFileSink(out, source="SRC")
    sink.set("zarr.json", b'{"node_type": "group"}')
    result["before_mb"] = rss_mb()
    for i in range(n):  # as the driver makes them: one object per shard, its own URL
        url = f"file:///data/a-long-source-prefix/array/c{i // 1000}/{i % 1000}"
        sink.put_reference(f"array/c/{i // 1000}/{i % 1000}", ChunkRef(url, 0, 4096 + i, 4096 + i,
                                                                        modified_ns=1_700_000_000_000_000_000 + i))
    sink.commit("many")
    result["outcome"] = "committed"
"""


@pytest.mark.slow
def test_memory_stays_flat_in_the_number_of_references(tmp_path):
    """200k references made and committed in a capped child: its peak resident set grows by
    a few MiB, where holding every reference until the commit took ~400 B each (80 MB)."""
    from tests.unit.codec.test_codec_bounds import run_child_script

    n = 200_000
    got = run_child_script(tmp_path, MANY_REFERENCES, str(n), str(tmp_path / "out.json"))
    assert got["outcome"] == "committed", got
    doc = json.loads((tmp_path / "out.json").read_bytes())
    assert len(doc["refs"]) == n + 1 and len(doc[REFERENCE_KEY]["objects"]) == n
    assert doc["refs"]["array/c/199/999"][1:] == [0, 4096 + n - 1]
    assert got["maxrss_mb"] - got["before_mb"] < 24, got
    assert sorted(os.listdir(tmp_path)) == ["child.py", "out.json"]  # no temporary file left


def test_a_key_put_again_is_written_once_the_last_one_holding(tmp_path):
    """A retried unit puts its references again: the file holds each key once (fsspec would
    read a repeated JSON key as whichever came last), the last put's reference; a key deleted
    (a damaged array's) or replaced by a document is gone from the references."""
    sink = ReferenceFileSink(str(tmp_path / "out.json"))
    sink.put_reference("a/c/0", ChunkRef("file:///x", 0, 4, 10, modified_ns=1))
    sink.put_reference("a/c/1", ChunkRef("file:///y", 0, 4, 10, modified_ns=1))
    sink.put_reference("a/c/0", ChunkRef("file:///x", 4, 4, 10, modified_ns=1))
    sink.put_reference("a/c/2", ChunkRef("file:///z", 0, 4, 10, modified_ns=1))
    sink.set("a/c/1", b"{}")
    sink.delete("a/c/2")
    assert list(sink.list_sized("a/")) == [("a/c/0", 4), ("a/c/1", 2)] and not sink.exists("a/c/2")
    sink.commit("m")
    raw = (tmp_path / "out.json").read_text()
    assert raw.count('"a/c/0"') == 1 and raw.count('"file:///x"') == 2  # its reference, its object
    assert json.loads(raw)["refs"] == {"a/c/0": ["file:///x", 4, 4], "a/c/1": "{}"}


def test_a_reference_file_in_a_directory_not_writable_is_still_read(migrated, monkeypatch):
    """The sink's table goes beside the file, or (that directory not writable: a read-only
    share) into the temporary directory: verify still reads the file. (A sink holds its first
    ``IN_MEMORY`` references in memory: none here, so the table is made.)"""
    import tempfile

    from sharding_store import verify
    from sharding_store.stores import references

    monkeypatch.setattr(references, "IN_MEMORY", 0)
    out, _, _ = migrated
    mkstemp, tried = tempfile.mkstemp, []

    def refusing(*args, dir=None, **kwargs):
        tried.append(dir)
        if dir == str(out.parent):
            raise PermissionError(13, "Permission denied", dir)
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refusing)
    assert verify(str(out.parent / "src"), str(out)).ok
    assert str(out.parent) in tried and None in tried


# --------------------------------------------------------------------------- batches, the file's bytes


def test_the_file_is_what_json_writes_whatever_the_keys_and_urls_hold(tmp_path):
    """Keys, URLs and ETags are written through the JSON encoder's string function: the bytes
    are exactly ``json.dumps``' (compact, ``ensure_ascii=False``) of what they say, for quotes,
    backslashes, control characters and non-ASCII text."""
    odd = ['plain', 'quo"te', 'back\\slash', 'new\nline', 'tab\t', 'bell\x07', 'ünï/çødé', 'del\x7f', 'e\u2028']
    sink = ReferenceFileSink(str(tmp_path / "out.json"), source='S"RC')
    sink.set("zarr.json", '{"attributes": {"t": "ü\\n"}}'.encode())
    for i, text in enumerate(odd):
        sink.put_reference(f"a/{text}/c/{i}", ChunkRef(f"file:///x/{text}", i, 1, 2 + i, modified_ns=i))
        sink.put_reference(f"b/c/{i}", ChunkRef(f"s3://b/{text}", 0, 1, 1, etag=f'"{text}"'))
    sink.commit('m"essage')
    raw = (tmp_path / "out.json").read_bytes()
    doc = json.loads(raw)
    assert raw == json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    for i, text in enumerate(odd):
        assert doc["refs"][f"a/{text}/c/{i}"] == [f"file:///x/{text}", i, 1]
        assert doc[REFERENCE_KEY]["objects"][f"file:///x/{text}"] == {"size": 2 + i, "modified_ns": i}
        assert doc[REFERENCE_KEY]["objects"][f"s3://b/{text}"] == {"size": 1, "etag": f'"{text}"'}


def test_a_batch_of_references_is_recorded_as_one_by_one(tmp_path):
    """``put_references`` records what ``put_reference`` of each would: an object referred to
    again (in the batch, or before it) is recorded once; one whose size or time differs is
    refused and none of the batch's references is taken."""
    sink = ReferenceFileSink(str(tmp_path / "out.json"))
    sink.put_reference("a/c/0", ChunkRef("file:///x", 0, 4, 10, modified_ns=1))
    sink.put_references("a", [("a/c/1", (1,), ChunkRef("file:///x", 4, 4, 10, modified_ns=1)),
                              ("a/c/2", (2,), ChunkRef("file:///y", 0, 4, 10, modified_ns=1)),
                              ("a/c/3", (3,), ChunkRef("file:///y", 4, 4, 10, modified_ns=1))])
    with pytest.raises(ObjectChangedError, match="file:///y: changed between two references"):
        sink.put_references("a", [("a/c/4", (4,), ChunkRef("file:///z", 0, 4, 10, modified_ns=1)),
                                  ("a/c/5", (5,), ChunkRef("file:///y", 0, 4, 11, modified_ns=2))])
    with pytest.raises(ObjectChangedError, match="file:///w: changed between two references"):
        sink.put_references("a", [("a/c/6", (6,), ChunkRef("file:///w", 0, 4, 10, modified_ns=1)),
                                  ("a/c/7", (7,), ChunkRef("file:///w", 0, 4, 10, modified_ns=2))])
    with pytest.raises(ObjectChangedError, match=r"\[8, 12\) does not lie inside"):
        sink.put_references("a", [("a/c/8", (8,), ChunkRef("file:///v", 8, 4, 10))])
    sink.put_references("a", [("a/c/0", (0,), ChunkRef("file:///y", 0, 2, 10, modified_ns=1))])  # put again
    sink.commit("m")
    doc = json.loads((tmp_path / "out.json").read_bytes())
    assert doc["refs"] == {"a/c/0": ["file:///y", 0, 2], "a/c/1": ["file:///x", 4, 4], "a/c/2": ["file:///y", 0, 4],
                           "a/c/3": ["file:///y", 4, 4]}
    assert list(doc[REFERENCE_KEY]["objects"]) == ["file:///x", "file:///y"]  # nothing of a refused batch


def _sink_ops(path) -> ReferenceFileSink:  # noqa: ANN001
    """Documents, references put in batches and alone, a key put again, a batch refused (it
    names an object recorded otherwise), a key deleted: the file committed."""
    sink = ReferenceFileSink(str(path), source="SRC")
    sink.set("zarr.json", b'{"node_type": "group"}')
    sink.set("a/zarr.json", b"{}")
    sink.put_references("a", [(f"a/c/{i}", (i,), ChunkRef(f"file:///s/c{i}", 0, 10 + i, 10 + i, modified_ns=i))
                              for i in (3, 1, 2)])
    sink.put_reference("b/c/0", ChunkRef("file:///s/\u00e9 \"q\"", 2, 4, 10, etag='"e"'))
    sink.put_references("a", [("a/c/1", (1,), ChunkRef("file:///s/c1", 1, 5, 11, modified_ns=1)),  # put again
                              ("a/c/4", (4,), ChunkRef("file:///s/c4", 0, 14, 14, modified_ns=4))])
    with pytest.raises(ObjectChangedError, match="file:///s/c2: changed between two references"):
        sink.put_references("a", [("a/c/5", (5,), ChunkRef("file:///s/c5", 0, 15, 15, modified_ns=5)),
                                  ("a/c/6", (6,), ChunkRef("file:///s/c2", 0, 12, 12, modified_ns=99))])
    sink.delete("a/c/3")
    return sink


@pytest.mark.parametrize("in_memory", [0, 1, 3, 5])
def test_a_sink_answers_and_writes_the_same_whether_its_references_are_in_memory_or_its_table(
        tmp_path, monkeypatch, in_memory):
    """A sink holds its first ``IN_MEMORY`` references in dictionaries, then moves them into
    its SQLite table: wherever that happens, every answer (a reference, a size, a listing,
    the recorded objects), every refusal (a batch naming an object recorded otherwise: all of
    it refused, none of it kept) and the file written are those of a sink that never moved
    them (the control, all in memory)."""
    from sharding_store.stores import references

    control = _sink_ops(tmp_path / "control.json")
    assert control._table.sql is None  # the control never made its table
    control.commit("m")
    monkeypatch.setattr(references, "IN_MEMORY", in_memory)
    sink = _sink_ops(tmp_path / "out.json")
    assert sink._table.sql is not None  # moved into the table at some point
    assert sink.reference("a/c/5") is None and "file:///s/c5" not in sink._reader.objects  # none of it kept
    assert sink.reference("a/c/1") == ChunkRef("file:///s/c1", 1, 5, 11, modified_ns=1)
    assert list(sink.list_sized("a/")) == [("a/c/1", 5), ("a/c/2", 12), ("a/c/4", 14), ("a/zarr.json", 2)]
    assert sink.size("b/c/0") == 4 and sink.size("a/c/3") is None and len(sink._reader.objects) == 5
    sink.commit("m")
    doc = json.loads((tmp_path / "out.json").read_bytes())
    assert doc["refs"] == {"zarr.json": '{"node_type": "group"}', "a/zarr.json": "{}", "a/c/1": ["file:///s/c1", 1, 5],
                           "a/c/2": ["file:///s/c2", 0, 12], "a/c/4": ["file:///s/c4", 0, 14],
                           "b/c/0": ["file:///s/\u00e9 \"q\"", 2, 4]}
    assert list(doc[REFERENCE_KEY]["objects"]) == ["file:///s/c3", "file:///s/c1", "file:///s/c2",
                                                   "file:///s/\u00e9 \"q\"", "file:///s/c4"]
    assert (tmp_path / "out.json").read_bytes() == (tmp_path / "control.json").read_bytes()


# --------------------------------------------------------------------------- a damaged reference file


def _damaged(path, shard, edit) -> str:
    """The reference file at ``path`` with the reference to ``shard`` edited; its key."""
    doc = json.loads(path.read_text())
    key = next(k for k, v in doc["refs"].items() if isinstance(v, list) and v[0] == f"file://{shard}")
    edit(doc, key, f"file://{shard}")
    path.write_text(json.dumps(doc))
    return key


@pytest.mark.parametrize("edit, field", [
    (lambda d, k, u: d["refs"].__setitem__(k, [[u], 0, 10]), "refs"),
    (lambda d, k, u: d["refs"].__setitem__(k, [u, "0", d["refs"][k][2]]), "refs"),
    (lambda d, k, u: d["refs"].__setitem__(k, [u, 0.0, d["refs"][k][2]]), "refs"),
    (lambda d, k, u: d["refs"].__setitem__(k, [u, -5, d["refs"][k][2]]), "refs"),
    (lambda d, k, u: d["refs"].__setitem__(k, [u, False, True]), "refs"),
    (lambda d, k, u: d[REFERENCE_KEY].__setitem__("objects", [1]), "objects"),
    (lambda d, k, u: d[REFERENCE_KEY]["objects"][u].__setitem__("size", True), "objects"),
    (lambda d, k, u: d[REFERENCE_KEY]["objects"][u].__setitem__("modified_ns", [1]), "objects"),
], ids=["url-list", "offset-text", "offset-float", "offset-negative", "bools", "objects-list", "size-bool",
        "mtime-list"])
def test_a_damaged_reference_is_refused_by_every_reader_naming_it(migrated, capsys, edit, field):
    """A hand-damaged reference or record: each reader refuses the file naming the key or
    field (exit 7, one line), never an internal error (exit 70) nor values read from the
    wrong bytes (a negative offset read the object's tail as the chunk)."""
    from sharding_store.cli import main

    path, _, shard = migrated
    key = _damaged(path, shard, edit)
    named = f"refs[{key!r}]" if field == "refs" else f"{REFERENCE_KEY}.objects"
    with pytest.raises(StoreNotFoundError, match=re.escape(named)):
        _guarded(path)["big"][...]
    for argv in (["verify", str(path.parent / "src"), str(path), "--no-progress"], ["info", str(path)]):
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert (code, len(err)) == (7, 1) and named in err[0], (argv, err)


@pytest.mark.parametrize("info", [{"size": -1}, {"size": 1.0}, {"size": 4, "etag": 5}, {"size": 4, "modified_ns": 1.5},
                                  {"etag": "x"}, ["size", 4], {"size": True}, {"size": 4, "modified_ns": False},
                                  {"size": 4, "etag": ["e"]}, "size", {"size": None}, {"size": 4, "inode": "12"},
                                  {"size": 4, "inode": -1}, {"size": 4, "inode": True}],
                         ids=["size-negative", "size-float", "etag-number", "mtime-float", "no-size", "a-list",
                              "size-bool", "mtime-bool", "etag-list", "a-string", "size-null", "inode-text",
                              "inode-negative", "inode-bool"])
def test_a_damaged_record_is_refused_naming_its_object(info):
    """``recorded_objects`` takes the usual entry in one expression; every other one is
    refused as before, naming the object's URL."""
    from sharding_store.stores.references import recorded_objects

    good = {"size": 4, "modified_ns": 7}
    doc = {REFERENCE_KEY: {"objects": {"file:///s/a": good, "file:///s/b": info}}}
    with pytest.raises(StoreNotFoundError, match=re.escape("objects['file:///s/b']")):
        recorded_objects(doc, "x.json")
    assert recorded_objects({REFERENCE_KEY: {"objects": {"file:///s/a": good, "u": {"size": 0, "etag": "e"}}}},
                            "x.json") == {"file:///s/a": (4, None, 7, None), "u": (0, "e", None, None)}
    assert recorded_objects({REFERENCE_KEY: {"objects": {"f": {"size": 4, "modified_ns": 7, "inode": 9}}}},
                            "x.json") == {"f": (4, None, 7, 9)}


@settings(max_examples=300, deadline=None)
@given(hs.dictionaries(hs.text(max_size=8), hs.one_of(
    hs.dictionaries(hs.sampled_from(["size", "etag", "modified_ns", "inode", "other"]),
                    hs.one_of(hs.none(), hs.booleans(), hs.integers(-3, 2**70), hs.floats(allow_nan=False),
                              hs.text(max_size=3)), max_size=5),
    hs.integers(), hs.text(max_size=3), hs.lists(hs.integers(), max_size=2)), max_size=6))
def test_recorded_objects_in_c_passes_are_the_loops(objects):
    """The quick reading of an ``objects`` block (C passes over all of it) gives what the
    entry-by-entry loop gives, and refuses (by leaving it to the loop) what the loop refuses."""
    from sharding_store.stores import references

    def loop_only(doc: dict) -> object:
        real = references._usual_objects
        references._usual_objects = lambda objects: None
        try:
            return references.recorded_objects(doc, "x.json")
        except StoreNotFoundError as e:
            return str(e)
        finally:
            references._usual_objects = real

    doc = {REFERENCE_KEY: {"objects": objects}}
    try:
        got: object = references.recorded_objects(doc, "x.json")
    except StoreNotFoundError as e:
        got = str(e)
    want = loop_only(doc)
    assert got == want and type(got) is type(want)
    if isinstance(got, dict):
        assert all(type(a) is type(b) for u in got for a, b in zip(got[u], want[u]))


def test_verify_never_reads_a_reference_leading_out_of_the_source(migrated, capsys):
    """A reference file naming an object of another store (an identical copy of the source,
    recorded as it is: every reader's check passes), climbing out with ``..``, or through a
    directory link of the source that leads out of it (below the source's prefix as text):
    ``verify SRC DST`` refuses it before opening it (exit 13, naming the URL; not as the
    source array's damage), never calls DST identical to SRC while it reads another store."""
    import shutil

    from sharding_store import verify
    from sharding_store.cli import main
    from sharding_store.errors import LinkOutsideStoreError

    path, _, shard = migrated
    src = path.parent / "src"
    shutil.copytree(src, path.parent / "src2")  # copy2: the same sizes and modification times
    other = path.parent / "src2" / shard.relative_to(src)
    (src / "link").symlink_to(path.parent / "src2")
    for url in (f"file://{other}", f"file://{src}/../src2/{shard.relative_to(src)}",
                f"file://{src}/link/{shard.relative_to(src)}"):
        doc = json.loads(path.read_text())
        key = next(k for k, v in doc["refs"].items() if isinstance(v, list) and v[0] == f"file://{shard}")
        doc["refs"][key][0] = url
        st = other.stat()
        doc[REFERENCE_KEY]["objects"][url] = {"size": st.st_size, "modified_ns": st.st_mtime_ns}
        edited = path.parent / "edited.json"
        edited.write_text(json.dumps(doc))
        with pytest.raises(LinkOutsideStoreError, match=re.escape(f"{url}: a reference leading outside the source")):
            verify(str(src), str(edited))
        code = main(["verify", str(src), str(edited), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert (code, len(err)) == (13, 1) and url in err[0] and "damaged" not in err[0], err
    (path.parent / "nothing").mkdir()  # a SRC that is no draft hierarchy is said to be that first (exit 7)
    with pytest.raises(StoreNotFoundError, match="no draft-era hierarchy here"):
        verify(str(path.parent / "nothing"), str(edited))


def test_a_source_file_replaced_by_a_fifo_is_refused_not_waited_on(migrated):
    """The guarded reader opens a source object without blocking: a FIFO put in a shard's
    place is "no longer a regular file" (SourceChangedError), not a read that never ends."""
    import subprocess
    import sys

    path, _, shard = migrated
    shard.unlink()
    os.mkfifo(shard)
    code = ("import zarr, sharding_store\n"
            f"g = zarr.open_group(sharding_store.open_references({str(path)!r}), mode='r')\n"
            "try:\n    g['big'][...]\nexcept sharding_store.SourceChangedError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert f"file://{shard}: no longer a regular file" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("url, inside", [
    ("file:///s/a", True), ("file:///s/a/b/c", True), ("file:///s2/a", False), ("file:///s", False),
    ("file:///s/", False), ("file:///s/a/", False), ("file:///s/.", False), ("file:///s/..", False),
    ("file:///s/a/..", False), ("file:///s/../s/a", False), ("file:///s/./a", False), ("file:///s//a", False),
    ("file:///s/a/../../t", False), ("s3://s/a", False), ("file:///t/s/a", False),
])
def test_the_guard_of_verify_takes_only_urls_below_the_source(url, inside):
    """Guard.refuse_outside answers by directory once, then by name: the same answers as
    segment by segment (no empty, ``.`` or ``..`` segment, below the prefix), asked twice."""
    from sharding_store.errors import LinkOutsideStoreError
    from sharding_store.stores.references import Guard

    guard = Guard({}, within="file:///s/")
    for _ in range(2):
        if inside:
            guard.refuse_outside(url)
        else:
            with pytest.raises(LinkOutsideStoreError, match="a reference leading outside the source file:///s/"):
                guard.refuse_outside(url)


def test_verify_of_a_reference_file_kept_inside_its_source_writes_nothing_there(migrated, monkeypatch):
    """The references of a file verify opens go into a temporary table beside it once they
    are many; a file kept inside its source's tree puts that table elsewhere: verify creates
    (and unlinks) nothing in the source, whose directory stays as it was."""
    import tempfile

    from sharding_store import verify
    from sharding_store.stores import references

    path, _, _ = migrated
    src = path.parent / "src"
    inside = src / "out.json"
    path.rename(inside)
    monkeypatch.setattr(references, "IN_MEMORY", 1)  # the table from the second reference on
    made = []
    mkstemp = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: made.append(k.get("dir")) or mkstemp(*a, **k))
    before = src.stat().st_mtime_ns
    assert verify(str(src), str(inside), progress=False).ok
    assert made and not [d for d in made if d is not None and os.path.realpath(d).startswith(str(src))], made
    assert src.stat().st_mtime_ns == before


@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "sqlite"])
def test_what_is_recorded_of_each_object_reads_back_as_written(tmp_path_factory, monkeypatch, spill):
    """Property: any mix of (size, ETag, st_mtime_ns, inode), each of the last three present
    or not, is written into the ``objects`` block and read back unchanged (an entry without an
    inode is what an earlier version wrote), through the dictionaries or the SQLite table."""
    from sharding_store.stores import references
    from sharding_store.stores.references import recorded_objects

    monkeypatch.setattr(references, "IN_MEMORY", 0 if spill else 8192)
    info = hs.tuples(hs.integers(1, 2**40), hs.none() | hs.text(max_size=6), hs.none() | hs.integers(0, 2**62),
                     hs.none() | hs.integers(0, 2**63 - 1))

    @settings(max_examples=25, deadline=None)
    @given(hs.dictionaries(hs.integers(0, 99), info, min_size=1, max_size=12))
    def check(model: dict) -> None:
        path = tmp_path_factory.mktemp("prop") / "out.json"
        sink = ReferenceFileSink(str(path))
        for n, (size, etag, modified_ns, inode) in model.items():
            sink.put_reference(f"a/c/{n}", ChunkRef(f"file:///s/{n}", 0, 1, size, etag=etag, modified_ns=modified_ns,
                                                    inode=inode))
        sink.commit("")
        doc = json.loads(path.read_bytes())
        assert recorded_objects(doc, str(path)) == {f"file:///s/{n}": i for n, i in model.items()}
        assert ReferenceFileSink(str(path), read_only=True).reference("a/c/0") == sink.reference("a/c/0")

    check()
