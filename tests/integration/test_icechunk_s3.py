"""Icechunk repositories on moto S3 (issue 24): a repository at an ``s3://`` URL, virtual
chunks in an S3 source checked by their ETag on every read through zarr-python 3."""

from __future__ import annotations

import json

import numpy as np
import pytest

ic = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")

from sharding_store.errors import SourceChangedError  # noqa: E402
from sharding_store.stores.base import ChunkRef, Location  # noqa: E402
from sharding_store.stores.icechunk_store import is_repository, open_icechunk  # noqa: E402
from tests.s3server import s3, s3_server  # noqa: E402,F401
from tests.unit.stores.test_icechunk_store import GROUP, array_doc  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]
DATA = np.arange(16, dtype="u1")


def reader(s3, prefix: str | None) -> object:
    """The branch tip's store, opened as the README says for S3."""
    storage = ic.s3_storage(bucket="dst", prefix="repo", region="us-east-1", endpoint_url=s3.endpoint, allow_http=True,
                            access_key_id="testing", secret_access_key="testing", force_path_style=True)
    grants = None if prefix is None else ic.containers_credentials({
        prefix: ic.s3_credentials(access_key_id="testing", secret_access_key="testing")})
    repo = ic.Repository.open(storage, authorize_virtual_chunk_access=grants)
    return repo.readonly_session("main").store


@pytest.fixture
def virtual_s3(s3):
    s3.make_bucket("src")
    s3.make_bucket("dst")
    s3.fs.pipe("src/store/data/obj", b"XX" + DATA.tobytes() + b"YY")
    info = s3.fs.info("src/store/data/obj")
    source = Location("s3", s3.endpoint, "src/store")
    dst = open_icechunk("s3://dst/repo", s3.storage_options, virtual=True, source=source,
                        source_options=s3.storage_options)
    dst.set("zarr.json", GROUP)
    dst.set("a/zarr.json", array_doc())
    dst.put_reference("a/c/0", ChunkRef("s3://src/store/data/obj", 2, 16, info["size"], etag=info["ETag"]))
    dst.commit("virtual on S3")
    return s3


def test_virtual_chunks_on_s3_read_through_zarr_python_3(virtual_s3):
    store = reader(virtual_s3, "s3://src/store/")
    assert np.array_equal(zarr.open_array(store, path="a", mode="r")[...], DATA)
    assert is_repository("s3://dst/repo", virtual_s3.storage_options)


def test_the_same_bytes_written_again_keep_their_etag_and_read(virtual_s3):
    virtual_s3.fs.pipe("src/store/data/obj", b"XX" + DATA.tobytes() + b"YY")
    assert np.array_equal(zarr.open_array(reader(virtual_s3, "s3://src/store/"), path="a", mode="r")[...], DATA)


@pytest.mark.parametrize("change", ["rewritten", "truncated", "deleted"])
def test_a_changed_s3_source_object_makes_the_read_raise(virtual_s3, change):
    fs = virtual_s3.fs
    if change == "rewritten":
        fs.pipe("src/store/data/obj", b"XX" + bytes(16) + b"YY")
    elif change == "truncated":
        fs.pipe("src/store/data/obj", b"XX" + DATA.tobytes()[:3])
    else:
        fs.rm("src/store/data/obj")
    with pytest.raises(ic.IcechunkError):
        zarr.open_array(reader(virtual_s3, "s3://src/store/"), path="a", mode="r")[...]
    dst = open_icechunk("s3://dst/repo", virtual_s3.storage_options, source=Location("s3", virtual_s3.endpoint,
                        "src/store"), source_options=virtual_s3.storage_options)
    with pytest.raises(SourceChangedError, match="a/c/0"):
        dst.get("a/c/0")


def test_a_materialised_repository_on_s3_shows_nothing_before_its_commit(s3):
    s3.make_bucket("dst")
    dst = open_icechunk("s3://dst/repo", s3.storage_options)
    dst.set("zarr.json", GROUP)
    dst.set("a/zarr.json", array_doc())
    dst.set("a/c/0", DATA.tobytes())
    dst.set(".sharding-store-record.json", json.dumps({"src": "x"}).encode())
    with pytest.raises(FileNotFoundError):
        zarr.open_array(reader(s3, None), path="a", mode="r")
    dst.commit("materialised on S3")
    assert np.array_equal(zarr.open_array(reader(s3, None), path="a", mode="r")[...], DATA)
    assert json.loads(open_icechunk("s3://dst/repo", s3.storage_options).get(".sharding-store-record.json")) == {
        "src": "x"}


@pytest.mark.parametrize("virtual", [False, True], ids=["materialised", "virtual"])
def test_a_draft_hierarchy_on_s3_migrated_into_a_repository_on_s3(s3, tmp_path, virtual):
    """``migrate s3://src/store s3://dst/repo`` (materialised, or ``--virtual``: the references
    carry the listing's ETags), read by zarr-python 3; after ``--virtual`` a rewritten source
    shard makes the read raise, and ``materialize`` refuses it, committing nothing."""
    from sharding_store import MigrateOptions, migrate
    from sharding_store.cli import main
    from sharding_store.ops.options import StoreOptions
    from tests.draft_factory import make_hierarchy

    values = make_hierarchy(tmp_path / "src")
    s3.make_bucket("src")
    s3.make_bucket("dst")
    s3.fs.put(str(tmp_path / "src"), "src/store", recursive=True)
    report = migrate("s3://src/store", "s3://dst/repo", MigrateOptions(target="icechunk", virtual=virtual),
                     stores=StoreOptions.both(s3.storage_options), progress=False)
    assert report.verification is not None and report.verification.ok
    store = reader(s3, "s3://src/store/" if virtual else None)
    for path, value in values.items():
        np.testing.assert_array_equal(zarr.open_group(store, mode="r")[path][...], value)
    assert info_kind("s3://dst/repo", s3) == ("Icechunk virtual" if virtual else "Icechunk materialised")
    if not virtual:
        return
    shard = sorted(s3.fs.find("src/store/data/root/imgs/raw"))[0]
    data = s3.fs.cat(shard)
    s3.fs.pipe(shard, data[:8] + bytes(len(data) - 8))
    with pytest.raises(ic.IcechunkError):
        zarr.open_group(reader(s3, "s3://src/store/"), mode="r")["imgs/raw"][...]
    options = json.dumps(s3.storage_options)
    assert main(["materialize", "s3://dst/repo", "--storage-options", options, "--src-storage-options", options]) == 14
    s3.fs.pipe(shard, data)  # the same bytes again: the same ETag
    assert main(["materialize", "s3://dst/repo", "--storage-options", options, "--src-storage-options", options]) == 0
    s3.fs.rm("src", recursive=True)
    store = reader(s3, None)  # no container authorised, no source: every chunk is the repository's own
    for path, value in values.items():
        np.testing.assert_array_equal(zarr.open_group(store, mode="r")[path][...], value)


def info_json(url: str, s3) -> dict:
    """What ``sharding-store info URL --json`` prints."""
    import contextlib
    import io

    from sharding_store.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["info", url, "--json", "--storage-options", json.dumps(s3.storage_options)]) == 0
    return json.loads(out.getvalue())


def info_kind(url: str, s3) -> str:
    return info_json(url, s3)["destination_kind"]


def test_info_of_a_copy_on_s3_says_copy_and_of_a_draft_store_reads_it(s3, tmp_path):
    """``info s3://...`` names a destination kind on S3 as on local disk (it took every S3
    URL for a draft store: an Icechunk repository or a copy was 'already Zarr v3')."""
    from sharding_store import migrate
    from sharding_store.ops.options import StoreOptions
    from tests.draft_factory import make_hierarchy

    make_hierarchy(tmp_path / "src")
    s3.make_bucket("src")
    s3.make_bucket("dst")
    s3.fs.put(str(tmp_path / "src"), "src/store", recursive=True)
    migrate("s3://src/store", "s3://dst/copy", stores=StoreOptions.both(s3.storage_options), progress=False)
    doc = info_json("s3://dst/copy", s3)
    assert doc["destination_kind"] == "copy" and doc["source"] == "s3://src/store", doc
    draft = info_json("s3://src/store", s3)
    assert "destination_kind" not in draft and draft["ok"], draft


def test_a_repository_that_cannot_be_reached_is_one_line_exit_12(s3, tmp_path, capsys):
    """No bucket for the repository: an I/O error naming DST (exit 12), not a traceback."""
    from sharding_store.cli import main
    from tests.draft_factory import make_hierarchy

    make_hierarchy(tmp_path / "src")
    options = json.dumps(s3.storage_options)
    code = main(["migrate", str(tmp_path / "src"), "s3://no-such-bucket/repo", "--icechunk", "--dst-storage-options",
                 options])
    err = capsys.readouterr().err
    assert code == 12 and "s3://no-such-bucket/repo" in err and len(err.strip().splitlines()) == 1, err


def test_a_repository_at_a_bucket_root_is_locked_too(s3, tmp_path):
    """An Icechunk repository at a bucket's root has nothing beside it: its lock is
    ``.sharding-store-lock.json`` inside the root (Icechunk uses no such key). A second
    ``--overwrite`` arriving mid-run is refused (exit 8's class) naming that object and
    changes nothing; the first run's repository verifies and its lock is gone."""
    from sharding_store import DestinationExistsError, MigrateOptions, migrate, verify
    from sharding_store.cli import main
    from sharding_store.ops.destination import LOCK_KEY
    from sharding_store.ops.options import StoreOptions
    from sharding_store.testing import fault_hook
    from tests.draft_factory import make_two_sources

    sources = make_two_sources(tmp_path)
    s3.make_bucket("root")
    stores = StoreOptions.both(s3.storage_options)
    options = MigrateOptions(target="icechunk", virtual=False)
    seen: dict[str, object] = {}

    def hook(phase: str) -> None:
        if phase == "unit" and "result" not in seen:
            seen["lock"] = s3.fs.cat_file(f"root/{LOCK_KEY}")
            seen["info"] = main(["info", "s3://root", "--storage-options", json.dumps(s3.storage_options)])
            before = sorted(s3.fs.find("root"))
            try:
                migrate(str(sources["two"][0]), "s3://root", MigrateOptions(target="icechunk", overwrite=True),
                        stores=stores, progress=False)
                seen["result"] = None
            except DestinationExistsError as e:
                seen["result"] = e
            s3.fs.invalidate_cache()
            seen["unchanged"] = sorted(s3.fs.find("root")) == before

    with fault_hook(hook):
        report = migrate(str(sources["one"][0]), "s3://root", options, stores=stores, progress=False)
    error = seen["result"]
    assert isinstance(error, DestinationExistsError) and f"s3://root/{LOCK_KEY} is held by a migrate run" in str(error)
    assert seen["unchanged"] and json.loads(seen["lock"])["owner"]["action"] == "migrate"  # type: ignore[arg-type]
    assert seen["info"] == 0
    assert report.verification is not None and report.verification.ok
    assert verify(str(sources["one"][0]), "s3://root", stores=stores).ok
    s3.fs.invalidate_cache()
    assert not s3.fs.exists(f"root/{LOCK_KEY}")
