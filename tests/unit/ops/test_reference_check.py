"""The reference check a virtual migration verifies with (issue 24, ``ops/reference_check.py``).

A reference file and a virtual Icechunk repository, hand-edited or left behind by a source
that changed, are read back: each wrong url, offset, length, missing or extra key, and each
rewritten, truncated or deleted source object is one problem naming its key. No chunk byte
of the source is read (a :class:`CountingInner` source says which keys were read, and how).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from sharding_store import MigrateOptions, SourceChangedError, UsageError, VerifyOptions, migrate, open_references, verify
from sharding_store.cli import main
from sharding_store.testing import CountingInner
from tests.draft_factory import make_big_array, make_hierarchy

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SHARDS = 8
INDEX = 4 * 16  # 2x2 chunks per shard, no checksum


def refs_only() -> VerifyOptions:
    """Only the references (and documents) checked; the report returned."""
    return VerifyOptions(references_only=True, raise_on_error=False)


@pytest.fixture
def big(tmp_path: Path) -> Path:
    make_big_array(tmp_path / "src", shards=SHARDS)
    return tmp_path / "src"


def _edit(out: Path, change) -> None:  # noqa: ANN001
    doc = json.loads(out.read_bytes())
    change(doc)
    out.write_text(json.dumps(doc))


def _problems(src: Path, dst: Path) -> dict[str, str]:
    report = verify(str(src), str(dst), refs_only(), progress=False)
    assert report.references is not None and report.check.n_problems == len(report.check.problems)
    return dict(report.check.problems)


def _shard(src: Path, i: int = 0) -> Path:
    return src / f"data/root/big/c{i}/0"


def _data_reads(counting: CountingInner) -> list[tuple[str, object]]:
    """Every read of a source object under ``data/`` (chunks and shards, not documents)."""
    out = []
    for name, detail in counting.log:
        if name in ("get", "read_into", "size") and isinstance(detail, str) and detail.startswith("data/"):
            out.append((name, detail))
        elif name == "get_ranges":
            out += [(name, r) for r in detail if r[0].startswith("data/")]
    return out


# --------------------------------------------------------------------------- a reference file


def test_a_virtual_migration_verifies_by_its_references_and_reads_no_chunk(big, tmp_path):
    """As typed (verify on): the check ran, said so, and the source's only data reads are the
    migration's own index tails (one per shard): the old verification read every shard whole."""
    src = CountingInner(str(big))
    report = migrate(src, str(tmp_path / "out.json"), progress=False)
    v = report.verification
    assert v.ok and v.references is not None and v.check.objects == SHARDS
    assert f"{SHARDS} references name their source objects whole and unchanged" in v.summary()
    assert "no chunk read (`sharding-store verify SRC DST` reads every chunk)" in v.summary()
    reads = _data_reads(src)
    assert len(reads) == SHARDS and all(r[0] == "get_ranges" and r[1][1:] == (-INDEX, None) for r in reads), reads
    assert v.to_dict()["checked"] == "references" and v.to_dict()["references"] == SHARDS


def test_the_reference_check_itself_reads_nothing_of_the_source_data(big, tmp_path):
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    src = CountingInner(str(big))
    assert verify(src, str(out), refs_only(), progress=False).ok
    assert _data_reads(src) == [] and src.calls["read_into"] == 0 and src.calls["copy_to"] == 0


@pytest.mark.parametrize("edit, key, words", [
    (lambda d: d["refs"]["big/c/0/0"].__setitem__(0, d["refs"]["big/c/1/0"][0]), "big/c/0/0", "names file://"),
    (lambda d: d["refs"]["big/c/1/0"].__setitem__(1, 4), "big/c/1/0", "names bytes [4, "),
    (lambda d: d["refs"]["big/c/2/0"].__setitem__(2, d["refs"]["big/c/2/0"][2] - 1), "big/c/2/0",
     "not the whole object"),
    (lambda d: d["refs"].pop("big/c/3/0"), "big/c/3/0", "missing (no reference to its source object"),
    (lambda d: d["refs"].__setitem__("big/c/99/0", d["refs"]["big/c/0/0"]), "big/c/99/0", "unexpected reference"),
    (lambda d: d["refs"].__setitem__("big/c/4/0", "inline"), "big/c/4/0", "unexpected object"),
], ids=["url", "offset", "length", "removed", "extra", "inline"])
def test_a_hand_edited_reference_is_one_problem_naming_its_key(big, tmp_path, edit, key, words):
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    _edit(out, edit)
    problems = _problems(big, out)
    assert key in problems and words in problems[key], problems
    if key != "big/c/4/0":  # inline data there: the key's reference is missing too
        assert len(problems) == 1, problems


def _url(d: dict, key: str) -> str:
    return d["refs"][key][0]


@pytest.mark.parametrize("edit, key, words", [
    (lambda d: d["refs"]["big/c/1/0"].__setitem__(2, d["refs"]["big/c/1/0"][2] + 8), "big/c/1/0",
     "not the whole object"),
    (lambda d: d["refs"]["big/c/2/0"].__setitem__(1, 8), "big/c/2/0", "names bytes [8, "),
    (lambda d: d["sharding-store"]["objects"][_url(d, "big/c/3/0")].__setitem__(
        "modified_ns", d["sharding-store"]["objects"][_url(d, "big/c/3/0")]["modified_ns"] + 1), "big/c/3/0",
     "modified since (st_mtime_ns"),
    (lambda d: d["sharding-store"]["objects"][_url(d, "big/c/4/0")].__setitem__(
        "size", d["sharding-store"]["objects"][_url(d, "big/c/4/0")]["size"] + 1), "big/c/4/0", "bytes, was "),
    (lambda d: d["sharding-store"]["objects"][_url(d, "big/c/5/0")].pop("modified_ns"), "big/c/5/0", None),
    (lambda d: d["sharding-store"]["objects"][_url(d, "big/c/6/0")].__setitem__("etag", None), "big/c/6/0", None),
], ids=["past-its-end", "offset-past-its-end", "recorded-mtime", "recorded-size", "no-mtime-recorded",
        "etag-null"])
def test_a_reference_outside_its_object_or_a_wrong_record_is_one_problem(big, tmp_path, edit, key, words):
    """A reference reaching past its object's end, and a record of the object (the guard a
    reader checks) that is not the object as it is: each one problem naming its key. A
    record without ``modified_ns`` (nothing to compare) or with ``"etag": null`` is what
    it was before the quick acceptance: no problem."""
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    _edit(out, edit)
    problems = _problems(big, out)
    if words is None:
        assert problems == {}, problems
    else:
        assert list(problems) == [key] and words in problems[key], problems


def test_the_check_after_a_migration_reads_the_written_file_back(big, tmp_path, monkeypatch):
    """What the migration wrote, not what it meant to write: a reference changed in the file
    after its commit (as a writer's bug would leave it) fails the migration's own check."""
    from sharding_store.errors import VerificationError
    from sharding_store.stores import references

    real = references.ReferenceFileSink.commit

    def commit_then_damage(self, *args, **kwargs):  # noqa: ANN001, ANN202
        name = real(self, *args, **kwargs)
        _edit(Path(self.path), lambda d: d["refs"]["big/c/6/0"].__setitem__(1, 1))
        return name

    monkeypatch.setattr(references.ReferenceFileSink, "commit", commit_then_damage)
    with pytest.raises(VerificationError) as raised:
        migrate(str(big), str(tmp_path / "out.json"), progress=False)
    assert raised.value.key == "big/c/6/0" and "names bytes [1, " in str(raised.value)


def test_a_source_shard_reached_through_links_inside_the_store_checks(big, tmp_path):
    """A shard that is a link to a file inside the store, and a directory that is a link
    inside it: the reference names the resolved file (as a reader resolves it), and the
    check, which takes those the long way, finds every reference right; a link made after
    the migration to another file of the same store is a problem."""
    import shutil

    spare = big / "spare"
    spare.mkdir()
    shutil.move(_shard(big, 1), spare / "one")
    _shard(big, 1).symlink_to(spare / "one")
    shutil.move(big / "data/root/big/c2", spare / "c2")
    (big / "data/root/big/c2").symlink_to(spare / "c2")
    out = tmp_path / "out.json"
    report = migrate(str(big), str(out), progress=False)
    assert report.verification.ok and report.verification.check.objects == SHARDS
    refs = json.loads(out.read_bytes())["refs"]
    assert refs["big/c/1/0"][0] == f"file://{os.path.realpath(spare / 'one')}"
    assert refs["big/c/2/0"][0] == f"file://{os.path.realpath(spare / 'c2' / '0')}"
    _shard(big, 1).unlink()
    _shard(big, 1).symlink_to(_shard(big, 3))
    problems = _problems(big, out)
    assert list(problems) == ["big/c/1/0"] and "names file://" in problems["big/c/1/0"], problems


def test_the_check_leaves_the_garbage_collector_as_it_found_it(big, tmp_path):
    import gc

    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    assert gc.isenabled()
    assert _problems(big, out) == {} and gc.isenabled()
    gc.disable()
    try:
        assert _problems(big, out) == {} and not gc.isenabled()
    finally:
        gc.enable()
    _edit(out, lambda d: d["refs"].pop("big/c/3/0"))
    with pytest.raises(Exception, match="missing"):
        verify(str(big), str(out), VerifyOptions(references_only=True), progress=False)
    assert gc.isenabled()


def _rewrite(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes())  # the same size and bytes, a new modification time
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _truncate(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:-3])


def _delete(shard: Path) -> None:
    shard.unlink()


@pytest.mark.parametrize("change, words", [
    (_rewrite, "modified since (st_mtime_ns"),
    (_truncate, "now "),
    (_delete, "deleted since the references were taken"),
], ids=["rewritten", "truncated", "deleted"])
def test_a_changed_source_object_is_one_problem_naming_its_key(big, tmp_path, change, words):
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    change(_shard(big, 5))
    problems = _problems(big, out)
    assert list(problems) == ["big/c/5/0"] and f"file://{os.path.realpath(_shard(big, 5))}: {words}" in problems[
        "big/c/5/0"], problems


def _array_listings(src: CountingInner) -> list[str]:
    """The listings of the array's data prefix (or below) the counting source was asked for."""
    return [d for name, d in src.log
            if name.startswith("list_") and isinstance(d, str) and d.startswith("data/root/big")]


@pytest.mark.parametrize("target", ["references", "icechunk"])
def test_a_verifying_virtual_migration_lists_the_source_once(big, tmp_path, target):
    """The reference check after a virtual migration takes the units the migration listed
    (it listed them twice before); ``verify --references-only`` alone lists them itself."""
    if target == "icechunk":
        pytest.importorskip("icechunk")
    dst = tmp_path / ("out.json" if target == "references" else "repo")
    src = CountingInner(str(big))
    report = migrate(src, str(dst), MigrateOptions(target=target, virtual=True), progress=False)
    assert report.verification.ok and report.verification.check.objects == SHARDS
    assert _array_listings(src) == ["data/root/big/"]
    alone = CountingInner(str(big))
    assert verify(alone, str(dst), refs_only(), progress=False).ok
    assert _array_listings(alone) == ["data/root/big/"]


@pytest.mark.parametrize("change, words", [
    (_rewrite, "modified since (st_mtime_ns"),
    (_truncate, "now "),
    (_delete, "deleted since the references were taken"),
], ids=["rewritten", "truncated", "deleted"])
def test_the_check_after_a_migration_looks_at_each_object_as_it_is_now(big, tmp_path, monkeypatch, change, words):
    """Taking the migration's listing, the check still looks at every source object as it
    is when checked: one changed between the migration and its check is one problem."""
    from sharding_store.errors import VerificationError
    from sharding_store.ops import migration

    real = migration._verify_after

    def changed_first(*args, **kwargs):  # noqa: ANN202
        change(_shard(big, 5))
        return real(*args, **kwargs)

    monkeypatch.setattr(migration, "_verify_after", changed_first)
    with pytest.raises(VerificationError) as raised:
        migrate(str(big), str(tmp_path / "out.json"), progress=False)
    assert raised.value.key == "big/c/5/0" and "1 difference;" in str(raised.value) and words in str(raised.value)


def test_the_cli_verify_checks_references_only_when_asked_and_says_what_it_checked(big, tmp_path, capsys):
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    assert main(["verify", str(big), str(out), "--references-only", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "reference file: 8 references name their source objects whole and unchanged" in text
    assert main(["verify", str(big), str(out), "--no-progress", "--json"]) == 0  # by default: every chunk read
    assert json.loads(capsys.readouterr().out)["checked"] == "chunks"
    _edit(out, lambda d: d["refs"]["big/c/1/0"].__setitem__(1, 4))
    assert main(["verify", str(big), str(out), "--references-only", "--no-progress"]) == 9
    captured = capsys.readouterr()
    assert "big/c/1/0: names bytes [4, " in captured.err and len(captured.err.strip().splitlines()) == 1


def test_references_only_refuses_a_copy(big, tmp_path):
    migrate(str(big), str(tmp_path / "copy"), MigrateOptions(verify=False), progress=False)
    with pytest.raises(UsageError, match="not a virtual destination"):
        verify(str(big), str(tmp_path / "copy"), refs_only(), progress=False)


def test_every_node_and_array_of_a_hierarchy_checks(tmp_path):
    """Groups, a sharded array with '.' keys, an unsharded array, a 0-d array, a shard
    without a live chunk: no problem, and a document changed is found as the copy finds it."""
    make_hierarchy(tmp_path / "src")
    out = tmp_path / "out.json"
    report = migrate(str(tmp_path / "src"), str(out), progress=False)
    assert report.verification.ok and report.verification.references is not None
    _edit(out, lambda d: d["refs"].__setitem__("imgs/zarr.json", json.dumps(
        {**json.loads(d["refs"]["imgs/zarr.json"]), "attributes": {"x": 1}})))
    problems = _problems(tmp_path / "src", out)
    assert list(problems) == ["imgs/zarr.json"], problems


def test_an_unrecorded_object_is_one_message_from_every_reader(big, tmp_path):
    """A reference whose URL the file records nothing of: ``verify`` (reading every chunk),
    the guarded reader and the reference check say the same."""
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    url = json.loads(out.read_bytes())["refs"]["big/c/2/0"][0]
    _edit(out, lambda d: d["sharding-store"]["objects"].pop(url))
    message = f"{url}: referenced, but the reference file records nothing of it"
    with pytest.raises(SourceChangedError) as reader:
        import zarr

        zarr.open_group(open_references(str(out)), mode="r")["big"][...]
    with pytest.raises(SourceChangedError) as full:
        verify(str(big), str(out), progress=False)
    assert str(reader.value) == str(full.value) == message
    assert _problems(big, out) == {"big/c/2/0": f"big/c/2/0: {message}"}


# --------------------------------------------------------------------------- an Icechunk repository


needs_icechunk = pytest.mark.skipif(importlib.util.find_spec("icechunk") is None, reason="the icechunk extra")


def _icechunk(big: Path, tmp_path: Path, src=None) -> Path:  # noqa: ANN001
    repo = tmp_path / "repo"
    migrate(src or str(big), str(repo), MigrateOptions(virtual=True, verify=False), progress=False)
    return repo


def _session_edit(repo: Path, big: Path, change) -> None:  # noqa: ANN001
    """Edit the repository's branch in one commit, through Icechunk (as a user could)."""
    from sharding_store.stores import as_inner
    from sharding_store.stores.icechunk_store import open_icechunk

    inner = open_icechunk(str(repo), virtual=True, source=as_inner(str(big)).location())
    change(inner)
    inner.commit("hand edit")


def _ref(big: Path, i: int, offset: int = 0, shard: int | None = None):  # noqa: ANN202
    from sharding_store.stores.base import ChunkRef

    path = os.path.realpath(_shard(big, i if shard is None else shard))
    st = os.stat(path)
    return ChunkRef(f"file://{path}", offset, st.st_size - offset, st.st_size, modified_ns=st.st_mtime_ns)


def _longer(inner, big: Path, key: str) -> None:  # noqa: ANN001
    """A reference 4 bytes longer than its object (Icechunk's own call: ours refuses it)."""
    from sharding_store.stores.icechunk_store import local_checksum

    ref = _ref(big, 2)
    inner.store.set_virtual_ref(key, ref.url, offset=0, length=ref.length + 4,
                                checksum=local_checksum(ref.url, ref.object_size, ref.modified_ns))


@needs_icechunk
def test_an_icechunk_migration_verifies_by_its_references_and_reads_no_chunk(big, tmp_path):
    src = CountingInner(str(big))
    report = migrate(src, str(tmp_path / "repo"), MigrateOptions(virtual=True), progress=False)
    v = report.verification
    assert v.ok and v.references == ("Icechunk virtual", v.references[1]) and v.check.objects == SHARDS
    assert "Icechunk virtual: 8 references name their source objects whole and unchanged" in v.summary()
    reads = _data_reads(src)  # the migration's tails, then the check's: index bytes only, never a payload
    assert len(reads) == 2 * SHARDS and all(r[0] == "get_ranges" and r[1][1:] == (-INDEX, None) for r in reads), reads


@needs_icechunk
@pytest.mark.parametrize("change, words", [
    (_rewrite, "changed, shrank or is gone since the migration"),
    (_truncate, "changed, shrank or is gone since the migration"),
    (_delete, "changed, shrank or is gone since the migration"),
], ids=["rewritten", "truncated", "deleted"])
def test_an_icechunk_source_changed_is_one_problem_naming_its_key(big, tmp_path, change, words):
    repo = _icechunk(big, tmp_path)
    change(_shard(big, 5))
    problems = _problems(big, repo)
    assert "big/c/5/0" in problems and words in problems["big/c/5/0"], problems
    assert all(k in ("big/c/5/0", f"file://{os.path.realpath(_shard(big, 5))}") for k in problems), problems


@needs_icechunk
@pytest.mark.parametrize("edit, key, words", [
    (lambda inner, big: inner.delete("big/c/3/0"), "big/c/3/0", "missing (no reference to its source object"),
    (lambda inner, big: inner.put_reference("big/c/2/0", _ref(big, 2, offset=4)), "big/c/2/0",
     "not the index of its source object"),
    (lambda inner, big: _longer(inner, big, "big/c/2/0"), "big/c/2/0", "Icechunk cannot read its bytes"),
    (lambda inner, big: inner.put_reference("big/c/2/0", _ref(big, 2, shard=6)), "big/c/2/0",
     "not the index of its source object"),
], ids=["removed", "offset", "longer", "other-object"])
def test_a_hand_edited_icechunk_reference_is_a_problem_naming_its_key(big, tmp_path, edit, key, words):
    repo = _icechunk(big, tmp_path)
    _session_edit(repo, big, lambda inner: edit(inner, big))
    problems = _problems(big, repo)
    assert key in problems and words in problems[key], problems


@needs_icechunk
def test_an_icechunk_reference_swap_is_caught_by_key_and_by_the_urls(big, tmp_path):
    """Two shards' references pointing at one object: each wrong key by its index, and the
    URLs of all virtual chunks say one object is named twice, another never."""
    repo = _icechunk(big, tmp_path)
    _session_edit(repo, big, lambda inner: inner.put_reference("big/c/1/0", _ref(big, 0)))
    problems = _problems(big, repo)
    one, zero = (f"file://{os.path.realpath(_shard(big, i))}" for i in (1, 0))
    assert "big/c/1/0" in problems and "named by 0 virtual chunks" in problems[one]
    assert "named by 2 virtual chunks" in problems[zero]


@needs_icechunk
def test_a_materialised_repository_has_no_references_to_check(big, tmp_path):
    migrate(str(big), str(tmp_path / "repo"), MigrateOptions(target="icechunk", verify=False), progress=False)
    with pytest.raises(UsageError, match="not a virtual destination"):
        verify(str(big), str(tmp_path / "repo"), refs_only(), progress=False)
    assert verify(str(big), str(tmp_path / "repo"), progress=False).ok  # every chunk read



@needs_icechunk
def test_an_extra_node_in_a_repository_is_found_by_its_listing_of_nodes(big, tmp_path):
    """A group added to the repository: both checks find it, listing one node at a time
    through Icechunk (``IcechunkInner.list_dir``), never every chunk key."""
    repo = _icechunk(big, tmp_path)
    _session_edit(repo, big, lambda inner: inner.set("more/zarr.json", b'{"zarr_format": 3, "node_type": "group"}'))
    from sharding_store.stores.icechunk_store import open_icechunk

    inner = open_icechunk(str(repo), create=False)
    assert inner.list_dir("") == ([".sharding-store-record.json", "zarr.json"], ["big/", "more/"])
    assert inner.list_dir("big/") == (["big/zarr.json"], ["big/c/"])
    assert _problems(big, repo) == {"more/zarr.json": "more/zarr.json: a node the source does not have"}
    full = verify(str(big), str(repo), VerifyOptions(raise_on_error=False), progress=False)
    assert dict(full.check.problems) == {"more/zarr.json": "more/zarr.json: a node the source does not have"}


@pytest.mark.parametrize("edit, words", [
    (lambda r: r.__setitem__(1, 0.0), "not a reference [url, offset, length]"),
    (lambda r: r.__setitem__(1, False), "not a reference [url, offset, length]"),
    (lambda r: r.__setitem__(2, float(r[2])), "not a reference [url, offset, length]"),
    (lambda r: r.append(0), "not a reference [url, offset, length]"),
], ids=["offset-float", "offset-bool", "length-float", "four-items"])
def test_a_reference_equal_to_the_right_one_but_of_other_types_is_refused(big, tmp_path, edit, words):
    """``[url, 0.0, size]`` and ``[url, False, size]`` compare equal to ``[url, 0, size]`` in
    Python: the check's quick acceptance of a right reference must not take them."""
    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    _edit(out, lambda d: edit(d["refs"]["big/c/1/0"]))
    problems = _problems(big, out)
    assert list(problems) == ["big/c/1/0"] and words in problems["big/c/1/0"], problems


def test_right_references_are_accepted_without_a_per_reference_diagnosis(big, tmp_path, monkeypatch):
    """A right reference (its URL, offset 0, the object's size, recorded as the object is
    now) is accepted by one comparison; only another one is diagnosed (``_wrong``, which
    says what is wrong), and a reference file's references are told from its inline
    documents without a call each."""
    from sharding_store.ops import reference_check

    out = tmp_path / "out.json"
    migrate(str(big), str(out), MigrateOptions(verify=False), progress=False)
    calls = {"_wrong": 0, "document_bytes": 0}
    wrong, document_bytes = reference_check.ReferenceFileBack._wrong, reference_check.document_bytes

    def counted_wrong(self, ref, now):  # noqa: ANN001, ANN202
        calls["_wrong"] += 1
        return wrong(self, ref, now)

    def counted_document_bytes(value):  # noqa: ANN001, ANN202
        calls["document_bytes"] += 1
        return document_bytes(value)

    monkeypatch.setattr(reference_check.ReferenceFileBack, "_wrong", counted_wrong)
    monkeypatch.setattr(reference_check, "document_bytes", counted_document_bytes)
    assert _problems(big, out) == {}
    assert calls["_wrong"] == 0 and calls["document_bytes"] < SHARDS, calls
    _edit(out, lambda d: d["refs"]["big/c/2/0"].__setitem__(1, 4))
    assert list(_problems(big, out)) == ["big/c/2/0"] and calls["_wrong"] == 1, calls


@needs_icechunk
def test_verify_reads_no_virtual_chunk_of_another_store(big, tmp_path, capsys):
    """A repository with a second container (an identical copy of the source, as a user or a
    hostile file could add) and one chunk pointing into it: ``verify SRC DST`` authorises the
    source's container alone, so that chunk is refused unread (exit 13, naming it), never
    called identical to the source while it depends on another store."""
    import shutil

    from sharding_store.errors import LinkOutsideStoreError

    repo = _icechunk(big, tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(big, copy)  # copy2: the same bytes, sizes and modification times
    _session_edit(repo, copy, lambda inner: inner.put_reference("big/c/2/0", _ref(copy, 2)))
    with pytest.raises(LinkOutsideStoreError, match=r"big/c/2/0: a virtual chunk of another store than the source"):
        verify(str(big), str(repo), progress=False)
    code = main(["verify", str(big), str(repo), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if "sharding-store" in line]
    assert code == 13 and len(err) == 1 and f"file://{os.path.realpath(copy)}/" in err[0], err


@needs_icechunk
@pytest.mark.slow
def test_an_icechunk_source_file_replaced_by_a_fifo_is_a_problem_not_a_wait(big, tmp_path):
    """A FIFO put in a source shard's place: the reference check reports it (exit 9, naming
    the key and the URL) instead of reading it through Icechunk, which would wait for ever
    (a child process, killed after 60 s where it does)."""
    import subprocess
    import sys

    repo = _icechunk(big, tmp_path)
    shard = _shard(big, 5)
    shard.unlink()
    os.mkfifo(shard)
    done = subprocess.run([sys.executable, "-m", "sharding_store", "verify", str(big), str(repo), "--references-only",
                           "--no-progress"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    url = f"file://{os.path.realpath(shard)}"
    assert done.returncode == 9, done.stderr[-2000:]
    assert f"big/c/5/0: unexpected reference, not read: {url}: no longer a regular file" in done.stdout, done.stdout


@needs_icechunk
def test_a_virtual_chunk_climbing_out_of_its_container_is_refused_as_such(big, tmp_path):
    """A reference spelled ``file:///src/../copy/...`` (Icechunk normalises it out of every
    container): reading it is a link out of the source (exit 13, naming it) for ``verify`` and
    ``materialize``, not "Icechunk cannot store this" (a write's refusal, exit 2)."""
    import shutil

    from sharding_store.errors import LinkOutsideStoreError
    from sharding_store.stores.icechunk_store import materialize

    repo = _icechunk(big, tmp_path)
    shutil.copytree(big, tmp_path / "copy")
    ref = _ref(tmp_path / "copy", 2)
    climbing = f"file://{os.path.realpath(big)}/../copy/{ref.url.rsplit('/copy/', 1)[1]}"
    _session_edit(repo, big, lambda inner: inner.store.set_virtual_ref(
        "big/c/2/0", climbing, offset=0, length=ref.length, validate_container=False))
    pattern = f"big/c/2/0: a virtual chunk of another store than the source \\({ref.url}\\): not read"
    with pytest.raises(LinkOutsideStoreError, match=pattern):
        verify(str(big), str(repo), progress=False)
    with pytest.raises(LinkOutsideStoreError, match=pattern):
        materialize(str(repo))


@needs_icechunk
def test_materialize_copies_no_virtual_chunk_of_another_store(big, tmp_path):
    """A repository whose configuration gained a second container and one chunk pointing
    into it: ``materialize`` authorises the recorded source's container alone, so it refuses
    that chunk (exit 13, naming it) and commits nothing, never copies another store's bytes in."""
    import shutil

    import icechunk as ic

    from sharding_store.errors import LinkOutsideStoreError
    from sharding_store.stores.icechunk_store import materialize

    repo = _icechunk(big, tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(big, copy)
    _session_edit(repo, copy, lambda inner: inner.put_reference("big/c/2/0", _ref(copy, 2)))
    before = ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main")
    with pytest.raises(LinkOutsideStoreError, match=r"big/c/2/0: a virtual chunk of another store than the source"):
        materialize(str(repo))
    assert ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main") == before


@needs_icechunk
def test_verify_and_materialize_never_follow_a_link_in_the_source_leading_out_of_it(big, tmp_path, capsys):
    """A virtual chunk named through a directory link of the source that leads out of it
    (``src/link -> ../copy``, an identical copy, its checksum Icechunk's for the copy): the
    URL lies in the source's container as text, and Icechunk would follow the link. ``verify
    SRC DST`` and ``materialize`` refuse it unread (exit 13, naming the URL); materialize
    commits nothing (never copies another store's bytes in)."""
    import shutil

    import icechunk as ic

    from sharding_store.errors import LinkOutsideStoreError
    from sharding_store.stores.icechunk_store import local_checksum, materialize

    repo = _icechunk(big, tmp_path)
    shutil.copytree(big, tmp_path / "copy")
    (big / "link").symlink_to(tmp_path / "copy")
    ref = _ref(tmp_path / "copy", 2)
    url = f"file://{os.path.realpath(big)}/link/data/root/big/c2/0"
    _session_edit(repo, big, lambda inner: inner.store.set_virtual_ref(
        "big/c/2/0", url, offset=0, length=ref.length, checksum=local_checksum(ref.url, ref.object_size,
                                                                               ref.modified_ns)))
    pattern = re.escape(f"{url}: a virtual chunk leading out of the source")
    with pytest.raises(LinkOutsideStoreError, match=pattern):
        verify(str(big), str(repo), progress=False)
    code = main(["verify", str(big), str(repo), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if "sharding-store" in line]
    assert code == 13 and len(err) == 1 and url in err[0], err
    before = ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main")
    with pytest.raises(LinkOutsideStoreError, match=pattern):
        materialize(str(repo))
    assert ic.Repository.open(ic.local_filesystem_storage(str(repo))).lookup_branch("main") == before
