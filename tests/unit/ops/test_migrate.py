"""``migrate``: draft-era hierarchies to Zarr v3, read back by zarr-python 3 and tensorstore."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

from sharding_store import DestinationExistsError, MigrationError, UsageError, open_draft
from sharding_store.cli import main
from sharding_store.formats.shard_index import read_index
from sharding_store.ops.destination import RECORD_KEY
from sharding_store.ops.migration import MARKER_KEY, migrate
from sharding_store.stores import as_inner
from tests.draft_factory import (
    FIXTURES,
    add_dead_bytes,
    fixture_names,
    make_hierarchy,
    read_v3,
    tree_bytes,
    tree_hash,
)
from tests.fixtures import needs_zarr_js

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: upstream wrote different data into this sharded store than into its twin (compat/README.md)
TWIN_DIFFERS = {"2d.chunked.compressed.sharded.i2.zarr"}


def zarr_json_docs(root) -> dict[str, dict]:
    return {k: json.loads(v) for k, v in tree_bytes(root).items() if k.endswith("zarr.json")}


def array_paths(root) -> list[str]:
    return [os.path.dirname(k) for k, d in zarr_json_docs(root).items() if d["node_type"] == "array"]


# --------------------------------------------------------------------------- the zarr-js fixtures


@pytest.fixture(scope="module")
def migrated_fixtures(tmp_path_factory):
    before = tree_hash(FIXTURES)
    out = tmp_path_factory.mktemp("fixtures")
    reports = {name: migrate(FIXTURES / name, out / name, progress=False) for name in fixture_names()}
    assert tree_hash(FIXTURES) == before, "the source fixtures were modified"
    return out, reports


def test_every_fixture_migrates_and_verifies(migrated_fixtures):
    out, reports = migrated_fixtures
    assert len(reports) == 47
    for name, report in reports.items():
        assert report.verification is not None and report.verification.ok, name
        assert report.totals.written + report.totals.copied == report.shards > 0, name


def test_zarr3_reads_fixtures_like_the_draft_reader_and_the_unsharded_twin(migrated_fixtures):
    out, _ = migrated_fixtures
    for name in fixture_names():
        for path in array_paths(out / name):
            got = read_v3(out / name, path)
            draft = open_draft(str(FIXTURES / name), path)[...]
            assert got.dtype == draft.dtype and np.array_equal(got, draft), (name, path)
            twin = name.replace(".sharded", "")
            if twin != name and name not in TWIN_DIFFERS:
                assert np.array_equal(got, read_v3(out / twin, path)), (name, path)


def test_output_is_final_v3_with_checksummed_indices(migrated_fixtures):
    out, _ = migrated_fixtures
    for name in fixture_names():
        docs = zarr_json_docs(out / name)
        assert docs["zarr.json"]["zarr_format"] == 3
        assert not any(k.startswith(("meta/", "data/")) for k in tree_bytes(out / name)), name
        for key, doc in docs.items():
            assert "storage_transformers" not in json.dumps(doc), key
            if doc["node_type"] == "array" and ".sharded" in name:
                (codec,) = doc["codecs"]
                assert codec["name"] == "sharding_indexed"
                assert codec["configuration"]["index_codecs"][-1] == {"name": "crc32c"}
                assert codec["configuration"]["index_location"] == "end"
    # one shard, checked by hand: the index checksums and points at the draft payloads
    dst = as_inner(str(out / "2d.chunked.compressed.sharded.i2.zarr"))
    src = as_inner(str(FIXTURES / "2d.chunked.compressed.sharded.i2.zarr"))
    new, old = dst.get("c/1/0"), src.get("data/root/c1/0")
    cps = (2, 2)
    new_index = read_index(new, cps, checksum=True, key="c/1/0")
    old_index = read_index(old, cps)
    for (c, o, n), (c2, o2, n2) in zip(old_index.live(), new_index.live()):
        assert c == c2 and old[o : o + n] == new[o2 : o2 + n2]


def test_group_fixture_keeps_groups_and_drops_consolidated(migrated_fixtures):
    out, _ = migrated_fixtures
    docs = zarr_json_docs(out / "1d.contiguous.compressed.sharded.i2.group.zarr")
    assert sorted(docs) == ["a/zarr.json", "b/zarr.json", "zarr.json"]
    g = zarr.open_group(str(out / "1d.contiguous.compressed.sharded.i2.group.zarr"), mode="r")
    assert sorted(g.array_keys()) == ["a", "b"]


def test_tensorstore_reads_portable_numeric_fixtures(tmp_path):
    ts = pytest.importorskip("tensorstore")
    names = [n for n in fixture_names() if not any(t in n for t in (".S7", ".U7", ".U13"))]
    for name in names:
        report = migrate(FIXTURES / name, tmp_path / name, portable=True, progress=False)
        assert report.warnings == [], (name, report.warnings)
        for path in array_paths(tmp_path / name):
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / name / path) + "/"}}
            got = ts.open(spec, read=True).result().read().result()
            assert np.array_equal(got, open_draft(str(FIXTURES / name), path)[...]), (name, path)


@needs_zarr_js
def test_without_portable_the_report_warns(tmp_path):
    report = migrate(FIXTURES / "1d.chunked.compressed.sharded.i2.zarr", tmp_path / "o", progress=False)
    assert len(report.warnings) == 1 and "numcodecs.zlib" in report.warnings[0] and "--portable" in report.warnings[0]


# --------------------------------------------------------------------------- layouts


@pytest.fixture
def hierarchy(tmp_path):
    src = tmp_path / "src"
    values = make_hierarchy(src)
    return src, values


def test_hierarchy_groups_become_explicit_with_attributes(hierarchy, tmp_path):
    src, values = hierarchy
    migrate(src, tmp_path / "out", progress=False)
    docs = zarr_json_docs(tmp_path / "out")
    root = dict(docs["zarr.json"])
    consolidated = root.pop("consolidated_metadata")  # by default (issue 16); --no-consolidate: none
    assert root == {"zarr_format": 3, "node_type": "group", "attributes": {"title": "root"}}
    assert consolidated["metadata"]["imgs"]["attributes"] == {"kind": "images"}
    assert docs["imgs/zarr.json"]["attributes"] == {"kind": "images"}
    for implicit in ("tab", "lone", "lone/deep"):
        assert docs[f"{implicit}/zarr.json"] == {"zarr_format": 3, "node_type": "group", "attributes": {}}
    assert docs["tab/plain/zarr.json"]["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "."}}
    assert os.path.exists(tmp_path / "out/tab/plain/c.1.0")  # c1.0 renamed, bytes verbatim
    assert (tmp_path / "out/tab/plain/c.1.0").read_bytes() == (src / "data/root/tab/plain/c1.0").read_bytes()
    assert (tmp_path / "out/scalar/c").exists()
    for path, expected in values.items():
        assert np.array_equal(read_v3(tmp_path / "out", path), expected), path
        assert zarr.open_array(str(tmp_path / "out"), path=path, mode="r").attrs["name"] == path


@pytest.mark.parametrize("cps", [(3,), (1, 2), (4, 4)])
def test_chunks_per_shard_reshards_every_array_verbatim(hierarchy, tmp_path, cps):
    src, values = hierarchy
    report = migrate(src, tmp_path / "out", chunks_per_shard=cps, index_location="start", progress=False)
    assert report.verification.ok
    docs = zarr_json_docs(tmp_path / "out")
    for path, expected in values.items():
        assert np.array_equal(read_v3(tmp_path / "out", path), expected), path
        cfg = docs[f"{path}/zarr.json"]["codecs"][0]["configuration"]
        assert cfg["index_location"] == "start"
    raw = docs["imgs/raw/zarr.json"]
    assert raw["chunk_grid"]["configuration"]["chunk_shape"] == [4 * (cps * 2)[0], 5 * (cps * 2)[0 if len(cps) == 1 else 1]]
    # the unsharded zlib array is sharded now, and its payloads are the draft chunk objects
    plain = as_inner(str(src))
    shard = (tmp_path / "out/tab/plain/c.0.0").read_bytes()
    cps2 = tuple(cps * 2) if len(cps) == 1 else cps
    index = read_index(shard, cps2, checksum=True, index_location="start")
    payloads = {c: shard[o : o + n] for c, o, n in index.live()}
    assert payloads[(0, 0)] == plain.get("data/root/tab/plain/c0.0")


def test_dead_bytes_are_dropped(hierarchy, tmp_path):
    src, values = hierarchy
    dead = add_dead_bytes(src, "data/root/imgs/raw/c0/0", (2, 2), (0, 1))
    before = (src / "data/root/imgs/raw/c0/0").stat().st_size
    report = migrate(src, tmp_path / "out", index_checksum=False, progress=False)
    assert report.totals.dead_bytes == dead > 0
    after = (tmp_path / "out/imgs/raw/c/0/0").stat().st_size
    assert after == before - dead
    index = read_index((tmp_path / "out/imgs/raw/c/0/0").read_bytes(), (2, 2))
    assert index.is_compact(after) and index.get((0, 1)) is None
    expected = values["imgs/raw"].copy()
    expected[0:4, 5:10] = 0  # the deleted chunk reads as the fill value
    assert np.array_equal(read_v3(tmp_path / "out", "imgs/raw"), expected)


def test_no_index_checksum_copies_compact_shards_byte_for_byte(hierarchy, tmp_path):
    src, _ = hierarchy
    report = migrate(src, tmp_path / "out", index_checksum=False, progress=False)
    assert report.totals.written == 0 and report.totals.copied == report.shards
    for key in ("imgs/raw/c0/0", "imgs/zl/c1/1", "lone/deep/dots/c1.1", "scalar/c0"):
        v3 = key.replace("/c", "/c/", 1).replace("c/0/0", "c/0/0") if "." not in key else key.replace("/c", "/c.", 1)
        v3 = {"scalar/c0": "scalar/c"}.get(key, v3)
        assert (tmp_path / "out" / v3).read_bytes() == (src / "data/root" / key).read_bytes(), key
    assert "index_codecs" in json.dumps(zarr_json_docs(tmp_path / "out")["imgs/raw/zarr.json"])
    assert "crc32c" not in json.dumps(zarr_json_docs(tmp_path / "out")["imgs/raw/zarr.json"])


def test_default_index_has_a_crc32c_that_zarr_checks(hierarchy, tmp_path):
    src, _ = hierarchy
    migrate(src, tmp_path / "out", progress=False)
    path = tmp_path / "out/imgs/raw/c/0/0"
    blob = bytearray(path.read_bytes())
    read_index(bytes(blob), (2, 2), checksum=True)
    blob[-1] ^= 0xFF  # the checksum itself
    path.write_bytes(bytes(blob))
    with pytest.raises(Exception):
        read_v3(tmp_path / "out", "imgs/raw")


def test_jobs_1_and_default_give_identical_output(hierarchy, tmp_path):
    src, _ = hierarchy
    migrate(src, tmp_path / "a", jobs=1, progress=False)
    migrate(src, tmp_path / "b", progress=False)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")


def test_default_jobs_one_thread_per_core_between_local_paths_two_elsewhere(hierarchy, tmp_path, monkeypatch):
    """Local-to-local work is CPU-bound (more threads than cores only contend); remote
    stores wait on the network. The rule reaches both the copy and the verification."""
    import concurrent.futures as cf
    import importlib

    mm = importlib.import_module("sharding_store.ops.migration")
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert mm.default_jobs(local=True) == mm.default_jobs() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert (mm.default_jobs(local=True), mm.default_jobs()) == (3, 6)
    pools: list[tuple[str, int]] = []

    class Counting(cf.ThreadPoolExecutor):  # both drivers run their units through jobs.run_units
        def __init__(self, n: int, **kw: str) -> None:
            pools.append((kw.get("thread_name_prefix", ""), n))
            super().__init__(n, **kw)

    monkeypatch.setattr(cf, "ThreadPoolExecutor", Counting)  # jobs imports it where it makes a pool
    src, _ = hierarchy
    migrate(src, tmp_path / "out", progress=False)
    assert pools == [("migrate", 3), ("verify", 3)]
    pools.clear()
    try:
        migrate(src, "memory://jobs-default-test", progress=False)
    finally:
        import fsspec

        fsspec.filesystem("memory").rm("/jobs-default-test", recursive=True)
    assert pools == [("migrate", 6), ("verify", 6)]


# --------------------------------------------------------------------------- safety


def test_dry_run_writes_nothing(hierarchy, tmp_path):
    src, _ = hierarchy
    before = tree_hash(src)
    report = migrate(src, tmp_path / "out", dry_run=True)
    assert not (tmp_path / "out").exists()
    assert tree_hash(src) == before
    assert report.shards == 30 and len(report.arrays) == 5 and report.bytes > 0
    assert report.summary().startswith("dry run: would migrate 5 arrays")


def test_refuses_a_non_empty_destination_unless_overwrite(hierarchy, tmp_path):
    src, values = hierarchy
    (tmp_path / "out").mkdir()
    (tmp_path / "out/old.txt").write_text("keep me")
    with pytest.raises(DestinationExistsError, match="not empty"):
        migrate(src, tmp_path / "out")
    assert (tmp_path / "out/old.txt").exists()
    (tmp_path / "out/zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    migrate(src, tmp_path / "out", overwrite=True, progress=False)  # a Zarr hierarchy: emptied
    assert not (tmp_path / "out/old.txt").exists()
    assert np.array_equal(read_v3(tmp_path / "out", "imgs/raw"), values["imgs/raw"])
    (tmp_path / "empty").mkdir()
    migrate(src, tmp_path / "empty", verify=False, progress=False)  # an empty directory is fine


@pytest.mark.parametrize("dst", ["src", "src/inside", "."])
def test_refuses_destination_that_is_or_contains_the_source(hierarchy, tmp_path, dst):
    src, _ = hierarchy
    before = tree_hash(src)
    with pytest.raises(UsageError, match="destination is the source"):
        migrate(src, tmp_path / dst, overwrite=True)
    assert tree_hash(src) == before


def test_resume_skips_complete_shards_and_rejects_other_options(hierarchy, tmp_path):
    src, values = hierarchy
    out = tmp_path / "out"
    migrate(src, out, verify=False, progress=False)
    # simulate an interruption: the root document never written, two shards lost, one torn
    (out / "zarr.json").unlink()
    (out / "imgs/raw/c/1/1").unlink()
    (out / "imgs/raw/zarr.json").unlink()
    torn = out / "imgs/zl/c/0/0"
    torn.write_bytes(torn.read_bytes()[:-3])
    as_inner(str(out)).set(MARKER_KEY, json.dumps({"migration": "sharding-store", "src": str(src), "chunks_per_shard": None,
                                                  "index_checksum": True, "index_location": None,  # None: the source's
                                                  "portable": False}).encode())
    with pytest.raises(UsageError, match="other options"):
        migrate(src, out, resume=True, index_checksum=False)
    report = migrate(src, out, resume=True, progress=False)
    assert report.totals.written + report.totals.copied == 2 and report.totals.skipped == report.shards - 2
    assert report.verification.ok and not (out / MARKER_KEY).exists()
    for path, expected in values.items():
        assert np.array_equal(read_v3(out, path), expected)


def test_overwrite_and_resume_contradict(hierarchy, tmp_path):
    src, _ = hierarchy
    with pytest.raises(UsageError):
        migrate(src, tmp_path / "out", overwrite=True, resume=True)


def test_untranslatable_array_fails_before_writing_unless_skipped(tmp_path):
    from sharding_store import create_draft_array

    src = tmp_path / "src"
    create_draft_array(src, "ok", shape=(4,), chunks=(2,), dtype="<i2", chunks_per_shard=(2,))[...] = np.arange(4)
    create_draft_array(src, "sub", shape=(4,), chunks=(2,), dtype=[("a", "<i2", (2,))], chunks_per_shard=(2,), fill_value=None)
    with pytest.raises(MigrationError, match="sub"):
        migrate(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    report = migrate(src, tmp_path / "out2", skip_untranslatable=True, verify=False, progress=False)
    assert [s["path"] for s in report.skipped_arrays] == ["sub"]
    assert np.array_equal(read_v3(tmp_path / "out2", "ok"), np.arange(4))


# --------------------------------------------------------------------------- retries


class Flaky(dict):
    """An in-memory store whose reads of some keys fail with connection resets."""

    def __init__(self, data, failing: dict[str, int]):
        super().__init__(data)
        self.failing = dict(failing)  # key -> failures left (-1: forever)

    def __getitem__(self, key):
        left = self.failing.get(key, 0)
        if left:
            self.failing[key] = left - 1 if left > 0 else -1
            raise ConnectionResetError(f"simulated reset reading {key}")
        return super().__getitem__(key)


def test_transient_errors_are_retried_and_exhaustion_is_resumable(hierarchy, tmp_path):
    src, values = hierarchy
    data = {k: v for k, v in ((k, as_inner(str(src)).get(k)) for k in as_inner(str(src)).list_prefix(""))}
    dst: dict[str, bytes] = {}
    report = migrate(Flaky(data, {"data/root/imgs/raw/c1/1": 2}), dst, retry_delay=0.001, progress=False)
    assert report.verification.ok
    dst2: dict[str, bytes] = {}
    with pytest.raises(MigrationError, match=r"imgs/raw/c/1/1: ConnectionResetError.*--resume"):
        migrate(Flaky(data, {"data/root/imgs/raw/c1/1": -1}), dst2, retry_delay=0.001, progress=False)
    assert "zarr.json" not in dst2 and "imgs/raw/zarr.json" not in dst2
    report = migrate(data, dst2, resume=True, progress=False)
    assert report.verification.ok and report.totals.written >= 1 and report.totals.skipped >= 1
    # the record names the source as spelled ("Flaky", then "dict"); everything else is the same
    assert json.loads(dst2.pop(RECORD_KEY))["src"] == "dict" and json.loads(dst.pop(RECORD_KEY))["src"] == "Flaky"
    assert dst2 == dst


# --------------------------------------------------------------------------- CLI


def test_cli_json_report(hierarchy, tmp_path, capsys):
    src, _ = hierarchy
    assert main(["migrate", str(src), str(tmp_path / "out"), "--json", "--jobs", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    for field in ("arrays", "objects", "bytes", "seconds", "throughput_mib_s", "warnings", "skipped", "verified"):
        assert field in report, field
    assert len(report["arrays"]) == 5 and report["objects"] == 30
    assert report["verified"]["ok"] is True and report["skipped"] == {"objects": 0, "arrays": []}
    assert any("imgs/zl" in w for w in report["warnings"])


def test_cli_human_report_and_errors(hierarchy, tmp_path, capsys):
    src, _ = hierarchy
    assert main(["migrate", str(src), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("migrated 5 arrays") and len(out.splitlines()) <= 6
    assert main(["migrate", str(src), str(tmp_path / "out")]) == DestinationExistsError.exit_code
    err = capsys.readouterr().err
    assert "not empty" in err and len(err.strip().splitlines()) == 1
    assert main(["migrate", str(src), str(tmp_path / "dry"), "--dry-run", "--chunks-per-shard", "2"]) == 0
    assert "dry run" in capsys.readouterr().out and not (tmp_path / "dry").exists()


def test_the_commit_message_names_this_version_without_reading_package_metadata(tmp_path, monkeypatch):
    """A migration names the tool's version in its commit (Icechunk's snapshot message) as
    ``--version`` does: ``sharding_store.__version__``, the version setup.cfg installs; reading
    it from the installed package's metadata (a scan of every installed distribution) cost
    every migration, whatever its destination, ~15 M instructions."""
    import configparser
    import importlib.metadata
    from pathlib import Path

    import sharding_store
    from sharding_store.api.arrays import create_draft_array
    from sharding_store.ops.migration import commit_message

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[3] / "setup.cfg")
    assert sharding_store.__version__ == setup["metadata"]["version"]

    def no_metadata(name):
        raise AssertionError(f"importlib.metadata.version({name!r}) asked")

    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    assert commit_message("/src", "copy") == f"sharding-store {sharding_store.__version__}: copy migration of /src"
    create_draft_array(str(tmp_path / "s"), "a", shape=(4,), chunks=(2,), dtype="<u2", chunks_per_shard=(2,))[...] = 7
    migrate(str(tmp_path / "s"), str(tmp_path / "d"))
    assert (open_draft(str(tmp_path / "s"), "a")[...] == 7).all() and (tmp_path / "d" / "a" / "zarr.json").is_file()
