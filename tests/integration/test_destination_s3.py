"""The destination's record on S3 (moto on 127.0.0.1), issue 25 items 5-7: it is written
beside the root document and stays; ``--resume`` from another source or with other options
is refused naming them, DST unchanged; ``verify`` reports another source's nodes and not
the record; ``--overwrite`` refuses a prefix without Zarr data; 2022 and 2023 sources."""

from __future__ import annotations

import json

import pytest

from sharding_store.errors import DestinationExistsError, UsageError
from sharding_store.ops.migration import MARKER_KEY, migrate
from sharding_store.ops.verification import verify
from tests.s3server import s3, s3_server  # noqa: F401 - fixtures
from tests.unit.ops.test_destination import MAKERS, RECORD_KEY, U2

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]


def _objects(s3, prefix: str) -> dict[str, bytes]:  # noqa: F811
    s3.fs.invalidate_cache()
    return {k: s3.fs.cat_file(k) for k in s3.fs.find(prefix)}


@pytest.mark.parametrize("generation", ["2022", "2023"])
def test_the_record_on_s3_refuses_another_source_and_other_options(generation, s3, tmp_path):  # noqa: F811
    s3.make_bucket("dst")
    a = MAKERS[generation](tmp_path / "a", "A", {"imgs/raw": U2})
    b = MAKERS[generation](tmp_path / "b", "B", {"other/raw": U2})
    opts = s3.storage_options
    migrate(str(a), "s3://dst/out", dst_storage_options=opts, progress=False)
    record = json.loads(s3.fs.cat_file(f"dst/out/{RECORD_KEY}"))
    assert record["src"] == str(a) and record["generation"] == generation
    assert not s3.fs.exists(f"dst/out/{MARKER_KEY}")
    before = _objects(s3, "dst/out")
    with pytest.raises(UsageError, match="another source"):
        migrate(str(b), "s3://dst/out", dst_storage_options=opts, resume=True, progress=False)
    with pytest.raises(UsageError, match="index_checksum"):
        migrate(str(a), "s3://dst/out", dst_storage_options=opts, resume=True, index_checksum=False, progress=False)
    assert _objects(s3, "dst/out") == before
    assert verify(str(a), "s3://dst/out", dst_storage_options=opts, progress=False).ok  # the record is no node
    # another source's migrated nodes beside A's: reported
    migrate(str(b), "s3://dst/b", dst_storage_options=opts, progress=False)
    for key, data in _objects(s3, "dst/b/other").items():
        s3.fs.pipe_file("dst/out/" + key[len("dst/b/"):], data)
    report = verify(str(a), "s3://dst/out", dst_storage_options=opts, raise_on_error=False, progress=False)
    assert ("other/zarr.json", "other/zarr.json: a node the source does not have") in report.check.problems


def test_overwrite_refuses_an_s3_prefix_without_zarr_data(s3, tmp_path):  # noqa: F811
    s3.make_bucket("dst")
    a = MAKERS["2022"](tmp_path / "a", "A", {"x": U2})
    s3.fs.pipe_file("dst/out/docs/thesis.txt", b"years")
    with pytest.raises(DestinationExistsError, match="'docs/'"):
        migrate(str(a), "s3://dst/out", dst_storage_options=s3.storage_options, overwrite=True, progress=False)
    assert _objects(s3, "dst/out") == {"dst/out/docs/thesis.txt": b"years"}
    report = migrate(str(a), "s3://dst/out2", dst_storage_options=s3.storage_options, progress=False)
    assert report.verification.ok
    dry = migrate(str(a), "s3://dst/out2", dst_storage_options=s3.storage_options, overwrite=True, dry_run=True,
                  progress=False)
    assert {e["name"] for e in dry.removal.entries} == {"x/", "zarr.json", RECORD_KEY}
    assert migrate(str(a), "s3://dst/out2", dst_storage_options=s3.storage_options, overwrite=True,
                   progress=False).verification.ok
