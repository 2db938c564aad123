"""The operations' typed options (``sharding_store/ops/options.py``, issue 23): every record
refuses a bad value when it is built, naming the field; the keywords of 0.1.0 reach the
same records through the one translation; ``reshard``/``shard``/``unshard`` and the
``reshard`` command run on the records."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import FrozenInstanceError, fields

import numpy as np
import pytest

from sharding_store import create_draft_array, open_draft, reshard, shard, unshard
from sharding_store.cli import build_parser
from sharding_store.cli.reshard import options as reshard_cli_options
from sharding_store.errors import UsageError
from sharding_store.ops.options import (
    MigrateOptions,
    ReshardOptions,
    RunOptions,
    StoreOptions,
    UpgradeOptions,
    VerifyOptions,
    legacy_options,
)
from sharding_store.testing import CountingInner

BAD = [
    (RunOptions, {"jobs": 0}, "RunOptions.jobs"),
    (RunOptions, {"jobs": True}, "RunOptions.jobs"),
    (RunOptions, {"retries": 0}, "RunOptions.retries"),
    (RunOptions, {"retry_delay": -1}, "RunOptions.retry_delay"),
    (RunOptions, {"retry_delay": float("nan")}, "RunOptions.retry_delay"),
    (RunOptions, {"progress": "yes"}, "RunOptions.progress"),
    (StoreOptions, {"src": "anon=true"}, "StoreOptions.src"),
    (StoreOptions, {"dst": ["anon"]}, "StoreOptions.dst"),
    (MigrateOptions, {"overwrite": True, "resume": True}, "overwrite and resume contradict"),
    (MigrateOptions, {"index_location": "middle"}, "index_location must be 'start' or 'end'"),
    (MigrateOptions, {"chunks_per_shard": 0}, "MigrateOptions.chunks_per_shard"),
    (MigrateOptions, {"chunks_per_shard": (2, -1)}, "MigrateOptions.chunks_per_shard"),
    (MigrateOptions, {"chunks_per_shard": "4"}, "MigrateOptions.chunks_per_shard"),
    (MigrateOptions, {"verify": "no"}, "MigrateOptions.verify"),
    (MigrateOptions, {"dimension_names": {"a": "xy"}}, "dimension names for 'a'"),
    (MigrateOptions, {"assume_chunks_per_shard": [("a", 2)]}, "MigrateOptions.assume_chunks_per_shard"),
    (UpgradeOptions, {"resume": True, "undo": True}, "--resume and --undo contradict"),
    (UpgradeOptions, {"dry_run": 1}, "UpgradeOptions.dry_run"),
    (VerifyOptions, {"max_differences": 0}, "VerifyOptions.max_differences"),
    (VerifyOptions, {"skip_arrays": ["a"]}, "VerifyOptions.skip_arrays"),
    (ReshardOptions, {"chunks_per_shard": None, "only_unsharded": True}, "chunks_per_shard is required"),
    (ReshardOptions, {"chunks_per_shard": 2, "arrays": "a/b"}, "ReshardOptions.arrays"),
]


@pytest.mark.parametrize(("record", "given", "message"), BAD, ids=[f"{r.__name__}-{m}" for r, _, m in BAD])
def test_a_bad_option_is_refused_when_the_record_is_built_naming_it(record, given, message):
    args = {"chunks_per_shard": 2} if record is ReshardOptions else {}
    with pytest.raises(UsageError, match=message):
        record(**{**args, **given})


def test_numpy_integers_are_numbers_and_bools_are_not():
    import numpy as np

    run = RunOptions(jobs=np.int64(3), retries=np.uint8(2), retry_delay=np.float32(0.5))
    assert (run.jobs, run.retries) == (3, 2) and type(run.jobs) is int
    assert MigrateOptions(chunks_per_shard=np.int32(4)).chunks_per_shard == 4
    with pytest.raises(UsageError, match="MigrateOptions.chunks_per_shard"):  # a list or tuple, not an array
        MigrateOptions(chunks_per_shard=np.array([2, 3]))
    assert ReshardOptions([np.int64(2), 3]).chunks_per_shard == (2, 3)
    for bad in (np.bool_(True), True):
        with pytest.raises(UsageError, match="RunOptions.jobs"):
            RunOptions(jobs=bad)


def test_records_are_frozen_and_normalized():
    o = MigrateOptions(chunks_per_shard=[2, 3], dimension_names={"/a/": ["t", None]})
    assert o.chunks_per_shard == (2, 3) and o.dimension_names == {"a": ("t", None)}
    given = {"anon": True}
    s = StoreOptions.both(given)
    given["anon"] = False  # the record keeps what it was given
    assert s.src == s.dst == {"anon": True}
    assert ReshardOptions(4, arrays=["a", "b"]).arrays == ("a", "b")
    with pytest.raises(FrozenInstanceError):
        o.resume = True  # type: ignore[misc]


def test_the_keywords_of_0_1_0_map_onto_the_records():
    op, run, stores = legacy_options(
        "migrate", MigrateOptions(portable=True),
        {"resume": True, "jobs": 3, "retries": 2, "retry_delay": 0.0, "progress": False,
         "storage_options": {"anon": True}, "dst_storage_options": {"key": "k"}, "skip_untranslatable": True},
    )
    assert op == MigrateOptions(portable=True, resume=True, skip_damaged=True)  # on top of what was given
    assert run == RunOptions(jobs=3, retries=2, retry_delay=0.0, progress=False)
    assert stores == StoreOptions({"anon": True}, {"key": "k"})  # a side's own options win
    # no keyword: the records as given, untouched
    given = (VerifyOptions(max_differences=3), RunOptions(jobs=1), StoreOptions(dst={"a": 1}))
    assert legacy_options("verify", given[0], {}, given[1], given[2]) == given
    # a keyword of the old spelling is still checked as the record checks it
    with pytest.raises(UsageError, match="RunOptions.jobs"):
        legacy_options("verify", VerifyOptions(), {"jobs": 0})
    # a keyword no record has is refused as Python refuses one, naming it
    with pytest.raises(TypeError, match="unexpected keyword argument 'resmue'"):
        legacy_options("migrate", MigrateOptions(), {"resmue": True})
    with pytest.raises(TypeError, match="'skip_untranslatable'"):  # reshard has no skip_damaged to rename to
        legacy_options("reshard", ReshardOptions(2), {"skip_untranslatable": True})
    assert {f.name for f in fields(RunOptions)} == {"jobs", "retries", "retry_delay", "progress", "executor"}


def _store(root, cps=(2, 2)):
    a = create_draft_array(str(root), "a/b", shape=(10, 9), chunks=(2, 3), dtype="<i4", chunks_per_shard=cps)
    a[...] = np.arange(90, dtype="<i4").reshape(10, 9)
    return root


def test_reshard_shard_and_unshard_run_on_the_records(tmp_path):
    src = _store(tmp_path / "src")
    report = reshard(src, tmp_path / "out", ReshardOptions((1, 3)), run=RunOptions(jobs=1, progress=False))
    assert report.arrays_changed == ["a/b"]
    assert open_draft(str(tmp_path / "out"), "a/b").meta.chunks_per_shard == (1, 3)
    np.testing.assert_array_equal(open_draft(str(tmp_path / "out"), "a/b")[...], np.arange(90).reshape(10, 9))
    counting = CountingInner(str(src))
    assert shard(counting, options=ReshardOptions(5)).arrays_skipped == ["a/b"]  # sharded already: left alone
    assert counting.writes == 0
    with pytest.raises(TypeError, match="pass it as options="):  # the records are never taken for a store
        shard(counting, ReshardOptions(5))
    assert unshard(src, run=RunOptions(jobs=2)).arrays_changed == ["a/b"]
    assert open_draft(str(src), "a/b").meta.chunks_per_shard is None
    # the old keywords still work, and are checked as the records check them
    assert reshard(src, chunks_per_shard=2, jobs=1, arrays=["a/b"]).arrays_changed == ["a/b"]
    with pytest.raises(UsageError, match="RunOptions.jobs"):
        reshard(src, chunks_per_shard=2, jobs=0)
    with pytest.raises(TypeError, match="chunks_per_shard"):
        reshard(src)
    with ThreadPoolExecutor(1) as pool, pytest.raises(UsageError, match="executor does not apply"):
        reshard(src, None, ReshardOptions(4), run=RunOptions(executor=pool))


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["reshard", *argv])


def test_the_reshard_command_maps_its_arguments_in_one_place():
    layout, run, stores = reshard_cli_options(_args(
        "s3://b/src", "out", "--chunks-per-shard", "2,4", "--array", "a", "--array", "b/c", "--overwrite",
        "--jobs", "3", "--no-progress", "--storage-options", '{"anon": true}', "--dst-storage-options", '{"k": 1}'))
    assert layout == ReshardOptions((2, 4), arrays=("a", "b/c"), overwrite=True)
    assert run == RunOptions(jobs=3, progress=False)
    assert stores == StoreOptions({"anon": True}, {"k": 1})
    assert reshard_cli_options(_args("src", "--unshard"))[0] == ReshardOptions(None)
    assert reshard_cli_options(_args("src", "--chunks-per-shard", "4", "--only-unsharded"))[0] == \
        ReshardOptions((4,), only_unsharded=True)  # as --chunks-per-shard always parsed it
    with pytest.raises(UsageError, match="--jobs 0: must be >= 1"):
        reshard_cli_options(_args("src", "--unshard", "--jobs", "0"))


def test_verify_runs_on_the_records_and_the_command_maps_them_in_one_place(tmp_path):
    from sharding_store import migrate, verify
    from sharding_store.cli.migrate import verify_options

    src = _store(tmp_path / "src")
    migrate(str(src), str(tmp_path / "dst"), progress=False)
    shards = [p for p in (tmp_path / "dst" / "a" / "b").rglob("*") if p.is_file() and p.name != "zarr.json"]
    for obj in shards[:2]:
        obj.write_bytes(b"\0" * obj.stat().st_size)  # two shards differ: one is kept in full
    report = verify(src, tmp_path / "dst", VerifyOptions(raise_on_error=False, max_differences=1),
                    run=RunOptions(jobs=1, progress=False), stores=StoreOptions.both(None))
    assert not report.ok and len(report.check.problems) == 1 and report.check.n_problems > 1
    assert not verify(src, tmp_path / "dst", raise_on_error=False, jobs=1).ok  # the keywords of 0.1.0
    args = build_parser().parse_args(["verify", "s", "d", "--json", "--max-differences", "3", "--jobs", "2",
                                      "--skip-damaged", "--src-storage-options", '{"a": 1}', "--no-progress"])
    assert verify_options(args) == (VerifyOptions(raise_on_error=False, skip_damaged=True, max_differences=3,
                                                  assume_chunks_per_shard={}),
                                    RunOptions(jobs=2, progress=False), StoreOptions({"a": 1}, {}))


def test_migrate_runs_on_the_records_and_says_what_it_returns(tmp_path):
    """``migrate(src, dst, MigrateOptions, run=, stores=)`` is the copy and returns a
    :class:`MigrationReport`; ``in_place=True`` is the upgrade, and the overloads say so;
    what only a copy takes is refused by name with ``in_place`` (``dimension_names`` was
    silently ignored before), and the records are never taken for a store."""
    import typing

    from sharding_store import migrate
    from sharding_store.ops.migration import MigrationReport
    from sharding_store.ops.upgrade import InPlaceReport

    src = _store(tmp_path / "src")
    report = migrate(src, tmp_path / "dst", MigrateOptions(chunks_per_shard=(5, 3), dimension_names={"a/b": ["y", "x"]}),
                     run=RunOptions(jobs=1, progress=False), stores=StoreOptions.both(None))
    assert isinstance(report, MigrationReport) and report.verification.ok
    assert report.arrays[0].chunks_per_shard == [5, 3]
    legacy = migrate(str(src), str(tmp_path / "dst2"), chunks_per_shard=(5, 3), dimension_names={"a/b": ["y", "x"]},
                     jobs=1, progress=False, skip_untranslatable=True, undo=False)
    assert legacy.to_dict()["arrays"] == report.to_dict()["arrays"]
    for bad, error, message in (
        (dict(in_place=True, chunks_per_shard=2), UsageError, "not with chunks_per_shard"),
        (dict(in_place=True, dimension_names={"a/b": ["y", "x"]}), UsageError, "not with dimension_names"),
        (dict(in_place=True, options=MigrateOptions()), UsageError, "not with MigrateOptions"),
        (dict(undo=True), UsageError, "give in_place=True"),
        (dict(options=UpgradeOptions()), UsageError, "UpgradeOptions are for in_place=True"),
        (dict(resmue=True), TypeError, "unexpected keyword argument 'resmue'"),
    ):
        with pytest.raises(error, match=message):
            migrate(str(src), None if bad.get("in_place") or "undo" in bad else str(tmp_path / "x"), **bad)
    with pytest.raises(TypeError, match="pass it as options="):
        migrate(str(src), MigrateOptions())
    assert not (tmp_path / "x").exists()
    returns = [typing.get_type_hints(f, localns={"InPlaceReport": InPlaceReport})["return"]
               for f in typing.get_overloads(migrate)]
    assert returns == [MigrationReport, InPlaceReport]


def test_the_migrate_command_maps_its_arguments_in_one_place_per_operation():
    from sharding_store.cli.migrate import migrate_options, upgrade_options

    def parse(*argv: str) -> argparse.Namespace:
        return build_parser().parse_args(["migrate", *argv])

    options, run, stores = migrate_options(parse(
        "s", "d", "--chunks-per-shard", "4", "--index-location", "start", "--portable", "--resume", "--no-verify",
        "--skip-untranslatable", "--dimension-names", "a/b=y,x", "--no-consolidate", "--no-index-checksum",
        "--jobs", "3", "--progress", "--storage-options", '{"a": 1}', "--dst-storage-options", '{"b": 2}'))
    assert options == MigrateOptions(chunks_per_shard=(4,), index_checksum=False, index_location="start", portable=True,
                                      resume=True, verify=False, skip_damaged=True, assume_chunks_per_shard={},
                                      dimension_names={"a/b": ("y", "x")}, consolidate=False)
    assert run == RunOptions(jobs=3, progress=True) and stores == StoreOptions({"a": 1}, {"b": 2})
    with pytest.raises(UsageError, match="overwrite and resume contradict"):
        migrate_options(parse("s", "d", "--overwrite", "--resume"))
    options, run, stores = upgrade_options(parse("s", "--in-place", "--undo", "--take-over", "--jobs", "2",
                                                 "--src-storage-options", '{"a": 1}'))
    assert options == UpgradeOptions(undo=True, take_over=True) and run.jobs == 2 and stores == StoreOptions({"a": 1})
    with pytest.raises(UsageError, match="--in-place: not with --portable"):
        upgrade_options(parse("s", "--in-place", "--portable"))
