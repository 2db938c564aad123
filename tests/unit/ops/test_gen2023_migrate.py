"""``migrate SRC DST`` and ``verify SRC DST`` for the 2023 intermediate generation (copy mode).

Every array of the real 2023 stores (``../shared/fixtures/draft-2023/``, copied to a
temporary directory first: the fixtures are never written) is migrated, then read by
zarr-python 3 and by tensorstore from the destination and compared with ``expected.npz``;
the source tree is hashed before and after. Then the decisions the issue asks for: a plain
undeclared index gets its CRC32C appended (or not, ``--no-index-checksum``), shards that
disagree are refused, damaged documents, mixed hierarchies, a final v3 source, a flipped
byte found by ``verify``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sharding_store.cli import main
from sharding_store.errors import DraftMetadataError, ShardCorruptError, StoreNotFoundError, VerificationError
from sharding_store.formats.gen2023 import NODE_KEY
from sharding_store.ops.destination import RECORD_KEY
from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify
from tests.draft_factory import tree_hash

from ... import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

COLLECTIONS = (fixtures.ZARRJS_ZARRITA_2023, fixtures.ZARRITAJS_2023_ENDIAN)
SHARDED = "1d.contiguous.compressed.i4.shards.zarr"  # zarrita June 2023: undeclared CRC32C after each index
TWO_SHARDS = "3d.chunked.mixed.compressed.i4.shards.zarr"


_copy = fixtures.copy_writable


def _array_paths(store: Path) -> list[str]:
    out = []
    for doc in sorted(store.rglob(NODE_KEY)):
        if json.loads(doc.read_bytes()).get("node_type") == "array":
            out.append(doc.parent.relative_to(store).as_posix())
    return out


def _arrays() -> list:
    if not fixtures.available(fixtures.DRAFT_2023):
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason=fixtures.missing(fixtures.DRAFT_2023)),
                             id="fixtures-absent")]
    out = []
    for collection in COLLECTIONS:
        for store in sorted(p for p in collection.iterdir() if p.is_dir()):
            for path in _array_paths(store):
                out.append(pytest.param(collection.name, store.name, path, id=f"{collection.name}/{store.name}::{path}"))
    return out


ARRAYS = _arrays()


def _expected(collection: str, store: str, path: str) -> np.ndarray:
    with np.load(fixtures.DRAFT_2023 / collection / "expected.npz") as npz:
        return npz[f"{store}::{path.replace('/', '__')}"]


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert (got.dtype.kind, got.dtype.itemsize) == (want.dtype.kind, want.dtype.itemsize)
    np.testing.assert_array_equal(got, want)


def _read_zarr(root: Path, path: str) -> np.ndarray:
    import zarr
    from zarr.storage import LocalStore

    if path == "":
        return zarr.open_array(store=LocalStore(str(root)), mode="r")[...]
    g = zarr.open_group(store=LocalStore(str(root)), mode="r")
    return g[path][...]


def _read_ts(root: Path, path: str) -> np.ndarray:
    ts = pytest.importorskip("tensorstore")
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / path).rstrip("/") + "/"}}
    return ts.open(spec, read=True).result().read().result()


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """Every fixture store copied, migrated (verified), the copy hashed before and after."""
    fixtures.require(fixtures.DRAFT_2023)
    base = tmp_path_factory.mktemp("gen2023")
    out = {}
    for collection in COLLECTIONS:
        for store in sorted(p for p in collection.iterdir() if p.is_dir()):
            src = base / "src" / collection.name / store.name
            dst = base / "dst" / collection.name / store.name
            _copy(store, src)
            before = tree_hash(src)
            report = migrate(str(src), str(dst), jobs=2)
            assert report.verification is not None and report.verification.ok
            assert tree_hash(src) == before, f"{src}: the migration modified its source"
            out[(collection.name, store.name)] = (src, dst, report)
    return out


@pytest.mark.parametrize("collection, store, path", ARRAYS)
def test_zarr_python_3_reads_the_migrated_array(migrated, collection, store, path):
    _, dst, _ = migrated[(collection, store)]
    _same(_read_zarr(dst, path), _expected(collection, store, path))


@pytest.mark.parametrize("collection, store, path", ARRAYS)
def test_tensorstore_reads_the_migrated_array(migrated, collection, store, path):
    _, dst, _ = migrated[(collection, store)]
    _same(_read_ts(dst, path), _expected(collection, store, path))


@fixtures.needs(fixtures.DRAFT_2023)
def test_every_fixture_array_is_covered():
    assert len(ARRAYS) == 63


def test_documents_are_final_and_data_objects_verbatim(migrated):
    from sharding_store.api.hierarchy import Generation, detect_generation
    from sharding_store.stores import as_inner

    for (_collection, store), (src, dst, _report) in migrated.items():
        assert detect_generation(as_inner(str(dst)))[0] is Generation.FINAL_V3, store
        root = json.loads((dst / NODE_KEY).read_bytes())
        if not (src / NODE_KEY).exists():  # an implicit root group becomes explicit
            root.pop("consolidated_metadata", None)  # by default (issue 16; test_migrate_ecosystem.py)
            assert root == {"zarr_format": 3, "node_type": "group", "attributes": {}}
        src_objects = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file() and p.name != NODE_KEY)
        dst_objects = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file() and p.name != NODE_KEY)
        assert dst_objects[0] == RECORD_KEY, store  # the migration's record (sharding_store.ops.destination), and
        assert src_objects == dst_objects[1:], store  # the keys unchanged
        for key in src_objects:  # every shard here has a declared or a hidden checksum: verbatim
            assert (src / key).read_bytes() == (dst / key).read_bytes(), key


def test_hidden_checksum_is_declared(migrated):
    _, dst, _ = migrated[(fixtures.ZARRJS_ZARRITA_2023.name, SHARDED)]
    cfg = json.loads((dst / "a" / NODE_KEY).read_bytes())["codecs"][0]["configuration"]
    assert cfg["index_codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
    assert cfg["index_location"] == "end"


# --------------------------------------------------------------------------- a plain undeclared index


def _plain_copy(tmp_path: Path, store: str = SHARDED, only: int | None = None) -> Path:
    """A fixture store whose shards lost zarrita's hidden checksum (a plain undeclared index);
    ``only``: strip it from that shard only (the shards then disagree)."""
    src = tmp_path / "plain"
    _copy(fixtures.require(fixtures.ZARRJS_ZARRITA_2023) / store, src)
    shards = sorted(p for p in (src / "a").rglob("*") if p.is_file() and p.name != NODE_KEY)
    for i, p in enumerate(shards):
        if only is None or i == only:
            p.write_bytes(p.read_bytes()[:-4])
    return src


def test_a_plain_index_gets_its_checksum_appended(tmp_path):
    src = _plain_copy(tmp_path)
    before = tree_hash(src)
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == 0
    assert tree_hash(src) == before
    original = fixtures.ZARRJS_ZARRITA_2023 / SHARDED / "a"
    for p in sorted(original.rglob("*")):
        if p.is_file() and p.name != NODE_KEY:  # plain + appended CRC32C == what zarrita wrote
            assert (tmp_path / "dst" / "a" / p.relative_to(original)).read_bytes() == p.read_bytes()
    cfg = json.loads((tmp_path / "dst" / "a" / NODE_KEY).read_bytes())["codecs"][0]["configuration"]
    assert cfg["index_codecs"][-1] == {"name": "crc32c"}
    want = _expected(fixtures.ZARRJS_ZARRITA_2023.name, SHARDED, "a")
    _same(_read_zarr(tmp_path / "dst", "a"), want)
    _same(_read_ts(tmp_path / "dst", "a"), want)


def test_no_index_checksum_copies_a_plain_index_verbatim(tmp_path):
    src = _plain_copy(tmp_path)
    assert main(["migrate", str(src), str(tmp_path / "dst"), "--no-index-checksum"]) == 0
    cfg = json.loads((tmp_path / "dst" / "a" / NODE_KEY).read_bytes())["codecs"][0]["configuration"]
    assert cfg["index_codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    for p in sorted((src / "a").rglob("*")):
        if p.is_file() and p.name != NODE_KEY:
            assert (tmp_path / "dst" / "a" / p.relative_to(src / "a")).read_bytes() == p.read_bytes()
    want = _expected(fixtures.ZARRJS_ZARRITA_2023.name, SHARDED, "a")
    _same(_read_zarr(tmp_path / "dst", "a"), want)
    _same(_read_ts(tmp_path / "dst", "a"), want)
    assert main(["verify", str(src), str(tmp_path / "dst")]) == 0


def test_shards_that_disagree_are_refused_naming_two(tmp_path, capsys):
    src = _plain_copy(tmp_path, TWO_SHARDS, only=1)
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == ShardCorruptError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "disagree" in err and err.count("a/c/") >= 2
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())
    assert main(["migrate", str(src), str(tmp_path / "dst2"), "--skip-damaged"]) == 0
    assert not (tmp_path / "dst2" / "a" / NODE_KEY).exists()


# --------------------------------------------------------------------------- damage, generations


def _endian_copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    _copy(fixtures.require(fixtures.ZARRITAJS_2023_ENDIAN) / "data.zarr", src)
    return src


def test_a_damaged_document_is_named_or_skipped(tmp_path, capsys):
    src = _endian_copy(tmp_path)
    victim = _array_paths(src)[0]
    doc = json.loads((src / victim / NODE_KEY).read_bytes())
    doc["codecs"] = [{"name": "endian", "configuration": {"endian": "middle"}}]
    (src / victim / NODE_KEY).write_text(json.dumps(doc))
    before = tree_hash(src)
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == DraftMetadataError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{victim}/zarr.json" in err and "--skip-damaged" in err
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())
    assert main(["migrate", str(src), str(tmp_path / "dst"), "--skip-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["path"] for s in report["skipped"]["arrays"]] == [victim]
    assert report["verified"]["ok"] is True
    assert not (tmp_path / "dst" / victim).exists()
    assert tree_hash(src) == before
    others = [p for p in _array_paths(src) if p != victim]
    for path in others:
        _same(_read_zarr(tmp_path / "dst", path), _expected(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr", path))
    assert main(["verify", str(src), str(tmp_path / "dst")]) == DraftMetadataError.exit_code
    assert main(["verify", str(src), str(tmp_path / "dst"), "--skip-damaged"]) == 0


def test_a_mixed_hierarchy_is_refused_naming_the_node(tmp_path, capsys):
    src = _endian_copy(tmp_path)
    (src / "legacy").mkdir()
    (src / "legacy" / ".zarray").write_text("{}")
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == DraftMetadataError.exit_code
    err = capsys.readouterr().err.strip()
    assert "legacy/.zarray" in err and "mixes generations" in err


def test_a_final_v3_source_is_already_zarr_v3(migrated, tmp_path, capsys):
    _, dst, _ = migrated[(fixtures.ZARRITAJS_2023_ENDIAN.name, "data.zarr")]
    assert main(["migrate", str(dst), str(tmp_path / "again")]) == StoreNotFoundError.exit_code
    assert "already Zarr v3" in capsys.readouterr().err


def test_dry_run_writes_nothing(tmp_path, capsys):
    src = _endian_copy(tmp_path)
    assert main(["migrate", str(src), str(tmp_path / "dst"), "--dry-run"]) == 0
    assert "dry run: would migrate 33 arrays" in capsys.readouterr().out
    assert not (tmp_path / "dst").exists()


def test_verify_finds_a_flipped_byte_and_a_changed_document(tmp_path, capsys):
    src = _endian_copy(tmp_path)
    dst = tmp_path / "dst"
    migrate(str(src), str(dst))
    verify(str(src), str(dst))
    victim = next(p for p in sorted(dst.rglob("*")) if p.is_file() and p.name not in (NODE_KEY, RECORD_KEY))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    key = victim.relative_to(dst).as_posix()
    assert main(["verify", str(src), str(dst)]) == VerificationError.exit_code
    err = capsys.readouterr().err
    assert key in err
    with pytest.raises(VerificationError):
        verify(str(src), str(dst))
    report = verify(str(src), str(dst), raise_on_error=False)
    assert [k for k, _ in report.check.problems] == [key]
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    doc_path = dst / _array_paths(src)[0] / NODE_KEY
    doc = json.loads(doc_path.read_bytes())
    doc["fill_value"] = 7 if doc["fill_value"] != 7 else 8
    doc_path.write_text(json.dumps(doc))
    report = verify(str(src), str(dst), raise_on_error=False)
    assert [k for k, _ in report.check.problems] == [doc_path.relative_to(dst).as_posix()]


# --------------------------------------------------------------------------- info


def test_info_says_the_generation_and_what_will_change(tmp_path, capsys):
    src = tmp_path / "src"
    _copy(fixtures.require(fixtures.ZARRJS_ZARRITA_2023) / SHARDED, src)
    assert main(["info", str(src)]) == 0
    out = capsys.readouterr().out
    assert "2023 intermediate" in out and "/ (implicit)\n" in out
    assert "/\n  will change: no zarr.json (an implicit group): an explicit group document is written" in out
    assert "undeclared CRC32C" in out and "'bytes' (little endian) inserted" in out
    assert main(["info", str(src), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (a,) = [n for n in doc["nodes"] if n["kind"] == "array"]
    assert a["path"] == "a" and a["index_reading"] == "crc32c-hidden" and a["changes"]
    (src / "a" / NODE_KEY).write_text('{"zarr_format": 3, "node_type": "array", "codecs": [{"name": "endian"}]}')
    assert main(["info", str(src)]) == 0
    assert "damaged (DraftMetadataError)" in capsys.readouterr().out
    assert main(["info", str(src), "--strict"]) == DraftMetadataError.exit_code


def test_nodes_below_a_damaged_group_are_left_out_and_reported(tmp_path, capsys):
    src = _endian_copy(tmp_path)
    arrays = _array_paths(src)
    (src / "sub").mkdir()
    (src / "sub" / NODE_KEY).write_text('{"zarr_format": 3, "node_type": "group", "attributes": 5}')
    shutil.move(str(src / arrays[0]), str(src / "sub" / arrays[0]))
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == DraftMetadataError.exit_code
    assert "sub/zarr.json" in capsys.readouterr().err
    assert main(["migrate", str(src), str(tmp_path / "dst"), "--skip-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(s["path"] for s in report["skipped"]["arrays"]) == ["sub", f"sub/{arrays[0]}"]
    assert not (tmp_path / "dst" / "sub").exists()
    assert main(["verify", str(src), str(tmp_path / "dst"), "--skip-damaged"]) == 0


def test_a_corrupt_declared_shard_index_is_refused(tmp_path, capsys):
    src = _endian_copy(tmp_path)
    sharded = next(p for p in _array_paths(src) if "shard" in p)
    victim = next(p for p in sorted((src / sharded).rglob("*")) if p.is_file() and p.name != NODE_KEY)
    data = bytearray(victim.read_bytes())
    data[-6] ^= 0xFF  # inside the index: its declared CRC32C no longer matches
    victim.write_bytes(bytes(data))
    assert main(["migrate", str(src), str(tmp_path / "dst")]) == ShardCorruptError.exit_code
    err = capsys.readouterr().err
    assert victim.relative_to(src).as_posix() in err and len(err.strip().splitlines()) == 1
    assert main(["migrate", str(src), str(tmp_path / "dst2"), "--skip-damaged", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["path"] for s in report["skipped"]["arrays"]] == [sharded]


@pytest.mark.parametrize("no_checksum", [False, True])
def test_mapping_stores_read_and_write_when_no_copy_capability(tmp_path, no_checksum):
    """Stores without ``copy_to`` (here: dicts) get every object read and written, the
    CRC32C appended by this process."""
    src_dir = _plain_copy(tmp_path)
    src = {p.relative_to(src_dir).as_posix(): p.read_bytes() for p in src_dir.rglob("*") if p.is_file()}
    frozen = dict(src)
    dst: dict[str, bytes] = {}
    report = migrate(src, dst, index_checksum=not no_checksum)
    assert report.verification.ok and src == frozen
    out = tmp_path / "out"
    for key, value in dst.items():
        (out / key).parent.mkdir(parents=True, exist_ok=True)
        (out / key).write_bytes(value)
    want = _expected(fixtures.ZARRJS_ZARRITA_2023.name, SHARDED, "a")
    _same(_read_zarr(out, "a"), want)
    _same(_read_ts(out, "a"), want)
    appended = {k: v for k, v in dst.items() if k.startswith("a/c")}
    assert all(len(v) == len(src[k]) + (0 if no_checksum else 4) for k, v in appended.items())


def test_verify_finds_missing_and_extra_objects_and_groups(tmp_path):
    src = tmp_path / "src"
    _copy(fixtures.require(fixtures.ZARRJS_ZARRITA_2023) / TWO_SHARDS, src)
    dst = tmp_path / "dst"
    migrate(str(src), str(dst))
    shards = sorted(p for p in (dst / "a").rglob("*") if p.is_file() and p.name != NODE_KEY)
    shards[0].unlink()
    (dst / "a" / "c" / "9" / "9").mkdir(parents=True)
    (dst / "a" / "c" / "9" / "9" / "9").write_bytes(b"extra")
    report = verify(str(src), str(dst), raise_on_error=False)
    problems = dict(report.check.problems)
    assert set(problems) == {shards[0].relative_to(dst).as_posix(), "a/c/9/9/9"}
    (dst / NODE_KEY).unlink()  # the implicit root's explicit document
    report = verify(str(src), str(dst), raise_on_error=False)
    assert NODE_KEY in dict(report.check.problems) and report.check.n_problems == 3
