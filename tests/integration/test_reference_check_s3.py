"""The reference check of a virtual migration from a moto S3 source (issue 24): into a
reference file and into an Icechunk repository on S3. The server's request log shows that the
check GETs no chunk data of the source (a reference file: no GET of a data object at all; an
Icechunk repository: one ranged GET of each shard's index tail); a source object rewritten,
truncated or deleted since is one problem naming its key; ``verify SRC s3://bucket/repo``
tells an Icechunk repository on S3 from its objects, as it does a local one.
"""

from __future__ import annotations

import json

import pytest

from sharding_store import MigrateOptions, VerifyOptions, migrate, verify
from sharding_store.cli import main
from sharding_store.ops.options import StoreOptions
from tests.draft_factory import make_big_array
from tests.s3server import change_object, s3, s3_server  # noqa: F401 - fixtures

pytest.importorskip("s3fs")
pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::UserWarning")]

SRC = "s3://src/store"
SHARDS = 6
INDEX = 4 * 16  # 2x2 chunks per shard, no checksum
KEY = "src/store/data/root/big/c2/0"


@pytest.fixture
def source(s3, tmp_path):  # noqa: F811
    make_big_array(tmp_path / "local", shards=SHARDS)
    s3.make_bucket("src")
    s3.make_bucket("dst")
    s3.fs.put(str(tmp_path / "local") + "/", "src/store", recursive=True)
    return s3


def _check(s3, dst: str) -> dict[str, str]:  # noqa: F811
    report = verify(SRC, dst, VerifyOptions(references_only=True, raise_on_error=False),
                    stores=StoreOptions.both(s3.storage_options), progress=False)
    assert report.references is not None
    return dict(report.check.problems)


def _data_gets(s3) -> list[str | None]:  # noqa: F811
    """The Range header of every GET of a source data object."""
    gets = [r for r in s3.requests() if r["method"] == "GET" and "/store/data/" in r["url"]]
    return [{k.lower(): v for k, v in r["headers"].items()}.get("range") for r in gets]


def _change(s3, change: str) -> None:  # noqa: F811
    change_object(s3.fs, KEY, change)


def test_a_reference_file_of_an_s3_source_is_checked_without_a_data_get(source, tmp_path):
    out = str(tmp_path / "out.json")
    report = migrate(SRC, out, stores=StoreOptions(src=source.storage_options), progress=False)
    assert report.verification.ok and report.verification.references is not None
    source.start_counting()
    assert _check(source, out) == {}
    assert _data_gets(source) == []  # sizes and ETags from the listing


@pytest.mark.parametrize("change, words", [("rewritten", "rewritten (ETag no longer"), ("truncated", "now "),
                                           ("deleted", "deleted since the references were taken")])
def test_a_changed_s3_object_behind_a_reference_file_is_one_problem(source, tmp_path, change, words):
    out = str(tmp_path / "out.json")
    migrate(SRC, out, MigrateOptions(verify=False), stores=StoreOptions(src=source.storage_options), progress=False)
    _change(source, change)
    problems = _check(source, out)
    assert list(problems) == ["big/c/2/0"] and f"s3://{KEY}: {words}" in problems["big/c/2/0"], problems


def test_a_hand_edited_reference_to_an_s3_object_is_one_problem(source, tmp_path):
    out = tmp_path / "out.json"
    migrate(SRC, str(out), MigrateOptions(verify=False), stores=StoreOptions(src=source.storage_options),
            progress=False)
    doc = json.loads(out.read_bytes())
    doc["refs"]["big/c/1/0"][1] = 2
    del doc["refs"]["big/c/4/0"]
    out.write_text(json.dumps(doc))
    problems = _check(source, str(out))
    assert sorted(problems) == ["big/c/1/0", "big/c/4/0"] and "names bytes [2, " in problems["big/c/1/0"]
    assert "missing" in problems["big/c/4/0"]


ic = pytest.importorskip("icechunk")


def test_an_icechunk_repository_on_s3_is_checked_reading_index_tails_only(source):
    stores = StoreOptions.both(source.storage_options)
    report = migrate(SRC, "s3://dst/repo", MigrateOptions(virtual=True), stores=stores, progress=False)
    assert report.verification.ok and report.verification.references[0] == "Icechunk virtual"
    source.start_counting()
    assert _check(source, "s3://dst/repo") == {}
    gets = _data_gets(source)  # the source's index tails (ours), and Icechunk's reads of the same bytes
    ours = [g for g in gets if g == f"bytes=-{INDEX}"]
    icechunks = [tuple(map(int, g.removeprefix("bytes=").split("-"))) for g in gets if g not in ours]
    assert len(ours) == len(icechunks) == SHARDS and all(b - a + 1 == INDEX for a, b in icechunks), gets


@pytest.mark.parametrize("change", ["rewritten", "truncated", "deleted"])
def test_a_changed_s3_object_behind_an_icechunk_repository_is_one_problem(source, change):
    stores = StoreOptions.both(source.storage_options)
    migrate(SRC, "s3://dst/repo", MigrateOptions(virtual=True, verify=False), stores=stores, progress=False)
    _change(source, change)
    problems = _check(source, "s3://dst/repo")
    assert "big/c/2/0" in problems and "since the migration" in problems["big/c/2/0"], problems


def test_verify_tells_an_icechunk_repository_on_s3_from_its_objects(source, capsys):
    """``verify SRC s3://dst/repo`` with no option saying what DST is: read as the repository
    it is (every chunk through Icechunk), as a local repository is."""
    options = json.dumps(source.storage_options)
    migrate(SRC, "s3://dst/repo", MigrateOptions(virtual=True, verify=False),
            stores=StoreOptions.both(source.storage_options), progress=False)
    assert main(["verify", SRC, "s3://dst/repo", "--storage-options", options, "--no-progress"]) == 0
    assert f"{SHARDS} shards" in capsys.readouterr().out
    assert main(["verify", SRC, "s3://dst/repo", "--storage-options", options, "--no-progress",
                 "--references-only"]) == 0
    assert f"Icechunk virtual: {SHARDS} references" in capsys.readouterr().out


def test_the_check_after_a_migration_from_s3_lists_the_source_again(source, tmp_path, monkeypatch):
    """On S3 the listing is what tells each object's size and ETag now (a request per 1000
    objects): the check after a virtual migration lists the source again instead of taking
    the migration's listing, and sees an object rewritten since it was listed, with no HEAD."""
    from sharding_store.errors import VerificationError
    from sharding_store.ops import migration

    real = migration._verify_after

    def changed_first(*args, **kwargs):  # noqa: ANN202
        _change(source, "rewritten")
        source.start_counting()
        return real(*args, **kwargs)

    monkeypatch.setattr(migration, "_verify_after", changed_first)
    with pytest.raises(VerificationError) as raised:
        migrate(SRC, str(tmp_path / "out.json"), stores=StoreOptions(src=source.storage_options), progress=False)
    assert raised.value.key == "big/c/2/0" and "rewritten (ETag no longer" in str(raised.value)
    assert [r for r in source.requests() if r["method"] == "HEAD" and "/store/data/" in r["url"]] == []
    assert [r for r in source.requests() if r["method"] == "GET" and "list-type=2" in r["url"]] != []
