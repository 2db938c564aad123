"""``migrate PATH --in-place``: a 2023-generation store upgraded by rewriting only its documents.

Every array of the real 2023 stores (``../shared/fixtures/draft-2023/``, copied first) reads
equal to ``expected.npz`` through zarr-python 3 and tensorstore after the upgrade, every data
object is untouched (hashed before and after), and every document is the one the copy
migration writes (one translation). Then each refusal: its exit code, one line, and a
store whose every file is byte for byte what it was; the journal's refusals (a second run,
a copy migration, a conflict), ``info`` on an interrupted upgrade. The kills are in
``test_gen2023_inplace_kill.py``.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sharding_store.api.hierarchy import Generation, detect_generation
from sharding_store.cli import main
from sharding_store.errors import (
    DraftMetadataError,
    LinkOutsideStoreError,
    MigrationError,
    StoreNotFoundError,
    UsageError,
)
from sharding_store.formats.gen2023 import NODE_KEY
from sharding_store.formats.upgrade_journal import UPGRADE_JOURNAL_KEY
from sharding_store.ops.migration import migrate
from sharding_store.ops.options import RunOptions, StoreOptions, UpgradeOptions
from sharding_store.ops.upgrade import upgrade_in_place
from sharding_store.stores import as_inner
from sharding_store.testing import fault_hook
from tests.draft_factory import make_hierarchy, tree_hash
from tests.unit.ops.test_gen2023_migrate import (
    ARRAYS,
    COLLECTIONS,
    SHARDED,
    _array_paths,
    _expected,
    _read_ts,
    _read_zarr,
    _same,
)

from ... import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
_copy = fixtures.copy_writable


def data_hash(root: Path) -> dict[str, bytes]:
    """Every object that is not a node document (nor the upgrade's journal): name -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (NODE_KEY, UPGRADE_JOURNAL_KEY)}


def documents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob(NODE_KEY))}


class Crash(BaseException):
    """What the in-process fault hook raises: nothing in the package catches it."""


def crash_at(n: int, phase: str | None = None):
    seen = [0]

    def hook(p: str) -> None:
        if phase is not None and p != phase:
            return
        seen[0] += 1
        if seen[0] == n:
            raise Crash(p)

    return fault_hook(hook)


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    """Every fixture store copied and upgraded in place through the CLI; its data objects
    before, and the documents a copy migration writes of the same store."""
    fixtures.require(fixtures.DRAFT_2023)
    base = tmp_path_factory.mktemp("inplace")
    out = {}
    for collection in COLLECTIONS:
        for store in sorted(p for p in collection.iterdir() if p.is_dir()):
            src = base / "src" / collection.name / store.name
            _copy(store, src)
            before = data_hash(src)
            originals = documents(src)
            copy_dst = base / "copy" / collection.name / store.name
            migrate(str(src), str(copy_dst), verify=False, consolidate=False)  # in place adds none
            assert main(["migrate", str(src), "--in-place"]) == 0
            out[(collection.name, store.name)] = (src, before, documents(copy_dst), originals)
    return out


@pytest.mark.parametrize("collection, store, path", ARRAYS)
def test_zarr_python_3_reads_the_upgraded_array(upgraded, collection, store, path):
    src, *_ = upgraded[(collection, store)]
    _same(_read_zarr(src, path), _expected(collection, store, path))


@pytest.mark.parametrize("collection, store, path", ARRAYS)
def test_tensorstore_reads_the_upgraded_array(upgraded, collection, store, path):
    src, *_ = upgraded[(collection, store)]
    _same(_read_ts(src, path), _expected(collection, store, path))


def test_only_documents_changed_and_they_are_the_copy_migrations(upgraded):
    for (_collection, store), (src, before, copied_docs, originals) in upgraded.items():
        assert data_hash(src) == before, store  # no data object written, added or removed
        docs = documents(src)
        assert docs.keys() == copied_docs.keys(), store
        for key, doc in docs.items():
            if doc != copied_docs[key]:  # only a document final already is left as it was, byte for byte
                assert doc == originals[key] and json.loads(doc) == json.loads(copied_docs[key]), key
        assert not (src / UPGRADE_JOURNAL_KEY).exists()
        assert detect_generation(as_inner(str(src)))[0] is Generation.FINAL_V3, store


def test_an_upgraded_store_is_already_zarr_v3(upgraded, capsys):
    src, *_ = upgraded[(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr")]
    before = tree_hash(src)
    assert main(["migrate", str(src), "--in-place"]) == StoreNotFoundError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already Zarr v3" in err
    assert tree_hash(src) == before


# --------------------------------------------------------------------------- API, dry run, report


def _endian(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    _copy(fixtures.require(fixtures.ZARRITAJS_2023_ENDIAN) / "data.zarr", src)
    return src


def _zarrjs(tmp_path: Path, store: str = SHARDED, name: str = "src") -> Path:
    src = tmp_path / name
    _copy(fixtures.require(fixtures.ZARRJS_ZARRITA_2023) / store, src)
    return src


def test_the_api_and_a_dry_run(tmp_path):
    src = _zarrjs(tmp_path)
    before = tree_hash(src)
    report = migrate(str(src), in_place=True, dry_run=True)
    assert report.action == "dry-run" and report.arrays == 1 and report.created == 1
    assert any("undeclared CRC32C" in c for c in report.changes["a"])
    assert tree_hash(src) == before
    report = migrate(str(src), in_place=True)
    assert report.written == 2 and report.verified and report.shards_checked == 1
    cfg = json.loads((src / "a" / NODE_KEY).read_bytes())["codecs"][0]["configuration"]
    assert cfg["index_codecs"][-1] == {"name": "crc32c"}  # the hidden checksum, declared
    assert json.loads((src / NODE_KEY).read_bytes()) == {"zarr_format": 3, "node_type": "group", "attributes": {}}
    _same(_read_zarr(src, "a"), _expected(fixtures.ZARRJS_ZARRITA_2023.name, SHARDED, "a"))


def test_upgrade_in_place_runs_on_the_typed_options(tmp_path, capsys):
    """``upgrade_in_place(location, UpgradeOptions(...), run=RunOptions(...))`` (issue 23):
    the same upgrade as the keywords of 0.1.0; what does not apply to one store changed
    where it is (an executor, another store's options, ``--dimension-names``, which the
    command used to ignore) is refused by name before anything is read or written."""
    src = _zarrjs(tmp_path)
    before = tree_hash(src)
    report = upgrade_in_place(str(src), UpgradeOptions(dry_run=True), run=RunOptions(jobs=1))
    assert report.action == "dry-run" and report.arrays == 1 and tree_hash(src) == before
    with ThreadPoolExecutor(1) as pool, pytest.raises(UsageError, match="executor does not apply"):
        upgrade_in_place(str(src), run=RunOptions(executor=pool))
    with pytest.raises(UsageError, match="StoreOptions.dst does not apply"):
        upgrade_in_place(str(src), stores=StoreOptions(dst={"anon": True}))
    _refused(["migrate", str(src), "--in-place", "--dimension-names", "a=y,x"], src, UsageError.exit_code, capsys,
             "--dimension-names")
    report = upgrade_in_place(str(src), UpgradeOptions(), run=RunOptions(jobs=2, retries=1),
                              stores=StoreOptions.both(None))
    assert report.written == 2 and report.verified and report.shards_checked == 1
    assert detect_generation(as_inner(str(src)))[0] is Generation.FINAL_V3


def test_the_cli_json_report(tmp_path, capsys):
    src = _endian(tmp_path)
    assert main(["migrate", str(src), "--in-place", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["in_place"] and report["arrays"] == 33 and report["written"] == 33 and report["verified"]
    assert report["shards_checked"] > 0


# --------------------------------------------------------------------------- refusals


def _refused(argv: list[str], root: Path, code: int, capsys, *needles: str) -> str:
    before = tree_hash(root)
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    assert tree_hash(root) == before, "a refused upgrade changed the store"
    return err


def _strip_checksums(src: Path) -> None:
    """zarrita's hidden CRC32C removed from every shard: a plain undeclared index."""
    for p in sorted((src / "a").rglob("*")):
        if p.is_file() and p.name != NODE_KEY:
            p.write_bytes(p.read_bytes()[:-4])


def test_a_plain_index_is_refused_unless_no_index_checksum(tmp_path, capsys):
    src = _zarrjs(tmp_path)
    _strip_checksums(src)
    _refused(["migrate", str(src), "--in-place"], src, UsageError.exit_code, capsys,
             "a/zarr.json", "--no-index-checksum", "DST")
    before = data_hash(src)
    assert main(["migrate", str(src), "--in-place", "--no-index-checksum"]) == 0
    assert data_hash(src) == before
    cfg = json.loads((src / "a" / NODE_KEY).read_bytes())["codecs"][0]["configuration"]
    assert cfg["index_codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    want = _expected(fixtures.ZARRJS_ZARRITA_2023.name, SHARDED, "a")
    _same(_read_zarr(src, "a"), want)
    _same(_read_ts(src, "a"), want)


def _respell_keys(array: Path, encoding: dict) -> None:
    """Move an unsharded array's chunk objects to the keys ``encoding`` spells, and say so."""
    doc = json.loads((array / NODE_KEY).read_bytes())
    doc["chunk_key_encoding"] = encoding
    (array / NODE_KEY).write_text(json.dumps(doc))
    sep = encoding.get("configuration", {}).get("separator", ".")
    for p in sorted((array / "c").rglob("*")):
        if p.is_file():
            coords = p.relative_to(array / "c").parts
            name = ("c" + sep + sep.join(coords)) if encoding["name"] == "default" else sep.join(coords)
            p.rename(array / name)


@pytest.mark.parametrize("encoding", [{"name": "default", "configuration": {"separator": "."}},
                                      {"name": "v2", "configuration": {"separator": "."}}], ids=["dot", "v2"])
def test_other_final_key_encodings_are_upgraded_in_place(tmp_path, encoding):
    """``c.0.0`` and v2 keys are v1.0 keys (the copy migration keeps them): only documents change."""
    src = _endian(tmp_path)
    array = src / "2d.chunked.i2"
    _respell_keys(array, encoding)
    copy = tmp_path / "dst"
    assert migrate(str(src), str(copy)).verification.ok  # the copy migration takes them as they are
    before = data_hash(src)
    assert main(["migrate", str(src), "--in-place"]) == 0
    assert data_hash(src) == before
    doc = json.loads((array / NODE_KEY).read_bytes())
    assert doc["chunk_key_encoding"] == encoding
    assert doc == json.loads((copy / "2d.chunked.i2" / NODE_KEY).read_bytes())
    want = _expected(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr", "2d.chunked.i2")
    _same(_read_zarr(src, "2d.chunked.i2"), want)
    _same(_read_ts(src, "2d.chunked.i2"), want)


def test_a_damaged_document_is_refused_or_left_as_it_was(tmp_path, capsys):
    src = _endian(tmp_path)
    victim = _array_paths(src)[0]
    doc = json.loads((src / victim / NODE_KEY).read_bytes())
    doc["codecs"] = [{"name": "endian", "configuration": {"endian": "middle"}}]
    (src / victim / NODE_KEY).write_text(json.dumps(doc))
    _refused(["migrate", str(src), "--in-place"], src, DraftMetadataError.exit_code, capsys,
             f"{victim}/zarr.json", "--skip-damaged", "nothing was changed")
    damaged_doc = (src / victim / NODE_KEY).read_bytes()
    before = data_hash(src)
    assert main(["migrate", str(src), "--in-place", "--skip-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["skipped"]) == [victim] and report["verified"]
    assert (src / victim / NODE_KEY).read_bytes() == damaged_doc  # left as it was
    assert data_hash(src) == before
    for path in _array_paths(src):
        if path != victim:
            _same(_read_ts(src, path), _expected(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr", path))


def test_a_2022_store_is_refused_saying_to_use_a_destination(tmp_path, capsys):
    make_hierarchy(tmp_path / "old")
    _refused(["migrate", str(tmp_path / "old"), "--in-place"], tmp_path / "old", UsageError.exit_code, capsys,
             "2022", "migrate it to a destination")


def test_a_zarr_v2_store_and_an_empty_directory_are_refused(tmp_path, capsys):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / ".zgroup").write_text('{"zarr_format": 2}')
    _refused(["migrate", str(v2), "--in-place"], v2, StoreNotFoundError.exit_code, capsys, "Zarr v2")
    (tmp_path / "empty").mkdir()
    _refused(["migrate", str(tmp_path / "empty"), "--in-place"], tmp_path / "empty", StoreNotFoundError.exit_code,
             capsys, "no Zarr hierarchy")


def test_a_mixed_hierarchy_is_refused(tmp_path, capsys):
    src = _endian(tmp_path)
    (src / "legacy").mkdir()
    (src / "legacy" / ".zarray").write_text("{}")
    _refused(["migrate", str(src), "--in-place"], src, DraftMetadataError.exit_code, capsys, "legacy/.zarray")


def test_a_chunk_linked_out_of_the_store_is_refused(tmp_path, capsys):
    src = _endian(tmp_path)
    chunk = src / "1d.contiguous.raw.i2" / "c" / "0"
    outside = tmp_path / "outside"
    outside.write_bytes(chunk.read_bytes())
    chunk.unlink()
    os.symlink(outside, chunk)
    _refused(["migrate", str(src), "--in-place"], src, LinkOutsideStoreError.exit_code, capsys,
             "1d.contiguous.raw.i2/c/0", "outside the store")


def test_options_that_do_not_apply_are_refused(tmp_path, capsys):
    src = _endian(tmp_path)
    for argv, needle in (([str(tmp_path / "dst"), "--in-place"], "DST"),
                         (["--in-place", "--chunks-per-shard", "2"], "--chunks-per-shard"),
                         (["--in-place", "--overwrite"], "--overwrite"),
                         (["--undo"], "--in-place"),
                         (["--in-place", "--resume"], "nothing to resume"),
                         (["--in-place", "--undo"], "nothing to undo"),
                         (["--in-place", "--resume", "--undo"], "contradict")):
        _refused(["migrate", str(src), *argv], src, UsageError.exit_code, capsys, needle)
    with pytest.raises(UsageError, match="dst"):
        migrate(str(src), str(tmp_path / "dst"), in_place=True)
    with pytest.raises(UsageError, match="destination"):
        migrate(str(src))


# --------------------------------------------------------------------------- an interrupted upgrade


def _interrupted(tmp_path: Path, at: int = 5) -> tuple[Path, str]:
    src = _endian(tmp_path)
    before = tree_hash(src)
    with crash_at(at), pytest.raises(Crash):
        upgrade_in_place(str(src))
    assert (src / UPGRADE_JOURNAL_KEY).exists()
    return src, before


def test_a_second_run_and_a_copy_migration_are_refused_naming_resume_and_undo(tmp_path, capsys):
    src, _ = _interrupted(tmp_path)
    _refused(["migrate", str(src), "--in-place"], src, MigrationError.exit_code, capsys,
             "--in-place --resume", "--in-place --undo")
    _refused(["migrate", str(src), str(tmp_path / "dst")], src, MigrationError.exit_code, capsys,
             "--in-place --resume")
    assert not (tmp_path / "dst").exists()


def test_info_reports_an_interrupted_upgrade(tmp_path, capsys):
    src, _ = _interrupted(tmp_path, at=5)  # the journal, then 4 documents
    assert main(["info", str(src)]) == 0
    out = capsys.readouterr().out
    assert "interrupted in-place upgrade" in out and "4 of 33 documents upgraded" in out
    assert "--in-place --resume" in out and "--in-place --undo" in out
    assert main(["info", str(src), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["interrupted_upgrade"]
    assert doc["documents"] == 33 and len(doc["upgraded"]) == 4 and len(doc["original"]) == 29
    assert main(["info", str(src), "--strict"]) == MigrationError.exit_code


def test_a_document_changed_by_another_writer_is_never_overwritten(tmp_path, capsys):
    src, before = _interrupted(tmp_path)
    pending = json.loads((src / UPGRADE_JOURNAL_KEY).read_bytes())["steps"][-1]["key"]
    (src / pending).write_text('{"zarr_format": 3, "node_type": "group"}')
    for flag in ("--resume", "--undo"):
        _refused(["migrate", str(src), "--in-place", flag], src, MigrationError.exit_code, capsys,
                 pending, "another writer")


def test_undo_restores_every_byte_and_resume_completes(tmp_path):
    src, before = _interrupted(tmp_path)
    assert main(["migrate", str(src), "--in-place", "--undo"]) == 0
    assert tree_hash(src) == before
    src2, _ = _interrupted(tmp_path / "two")
    data = data_hash(src2)
    assert main(["migrate", str(src2), "--in-place", "--resume"]) == 0
    assert data_hash(src2) == data and not (src2 / UPGRADE_JOURNAL_KEY).exists()
    for path in _array_paths(src2):
        _same(_read_zarr(src2, path), _expected(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr", path))


def test_a_journal_that_is_not_one_is_refused(tmp_path, capsys):
    src = _endian(tmp_path)
    (src / UPGRADE_JOURNAL_KEY).write_text("{not json")
    _refused(["migrate", str(src), "--in-place", "--resume"], src, MigrationError.exit_code, capsys,
             UPGRADE_JOURNAL_KEY, "unreadable")


class _FullDisk(dict):
    """A store (a dict) whose writes of one key fail as a full disk would."""

    fail: str = ""

    def __setitem__(self, key: str, value: bytes) -> None:
        if key == self.fail:
            raise OSError(28, "No space left on device", key)
        super().__setitem__(key, value)


def test_a_failed_write_names_resume_and_undo_and_undo_restores(tmp_path):
    src = _endian(tmp_path)
    store = _FullDisk({p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()})
    frozen = dict(store)
    store.fail = "2d.chunked.i2/zarr.json"
    with pytest.raises(OSError) as e:  # StoreIOError (exit 12), an OSError
        upgrade_in_place(store, retry_delay=0)
    assert "--in-place --resume" in str(e.value) and "--in-place --undo" in str(e.value)
    assert UPGRADE_JOURNAL_KEY in store and store != frozen
    report = upgrade_in_place(store, undo=True)
    assert report.restored > 0 and dict(store) == frozen
    store.fail = ""
    upgrade_in_place(store)
    assert all(json.loads(v)["zarr_format"] == 3 for k, v in store.items() if k.endswith(NODE_KEY))
    assert {k: v for k, v in store.items() if not k.endswith(NODE_KEY)} == \
        {k: v for k, v in frozen.items() if not k.endswith(NODE_KEY)}


def test_of_two_runs_racing_only_one_proceeds(tmp_path, monkeypatch):
    """The journal is created exclusively: a run that planned while another created its
    journal stops before writing anything (exit 10), and the other run finishes."""
    import sharding_store.ops.upgrade as inplace

    src = _endian(tmp_path)
    real_plan = inplace._plan
    raced = []

    def plan_then_race(*args, **kwargs):
        out = real_plan(*args, **kwargs)
        if not raced:  # the other run gets its journal in first, then is paused (killed) there
            raced.append(True)
            with crash_at(1), pytest.raises(Crash):
                upgrade_in_place(str(src))
        return out

    monkeypatch.setattr(inplace, "_plan", plan_then_race)
    theirs = (src / UPGRADE_JOURNAL_KEY)
    with pytest.raises(MigrationError, match="another run created its journal"):
        upgrade_in_place(str(src))
    assert json.loads(theirs.read_bytes())["steps"]  # the other run's journal, untouched
    monkeypatch.setattr(inplace, "_plan", real_plan)
    assert upgrade_in_place(str(src), resume=True).written == 33
