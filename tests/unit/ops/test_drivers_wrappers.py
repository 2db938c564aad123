"""migrate, verify and reshard work over any store wrapper, taking the same branches (issue 13 item 1).

Capabilities (kernel copies, renames, local file paths) are methods of the store
interface, delegated by wrappers; nothing asks which class a store is. So a run over
``CountingInner(store)`` must give the same result as over the store itself, and a run
over ``CountingInner(CountingInner(store))`` the same requests at both levels as over
one wrapper: the counts seen by the outer wrapper of the double wrap equal those of the
single wrap (the wrappers are invisible to the drivers). ``reshard(src,
CountingInner(dst))`` used to fail ("copied, but not found at the destination"), and an
in-place reshard through a wrapper moved staged objects by get/set/delete instead of a
rename.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sharding_store import migrate, reshard, verify
from sharding_store.ops.destination import RECORD_KEY

try:
    from sharding_store.testing import CountingInner
except ImportError:  # 6befc1a, where the tests are also run to see them fail
    from sharding_store.counting import CountingInner  # type: ignore[no-redef]
from tests.draft_factory import make_big_array, make_hierarchy, tree_bytes, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _claims_at_one_instant(monkeypatch):
    """The destination lock records when it was taken (``since``, a float whose repr varies
    in length): the byte counts of two runs compared here would differ by a byte or two."""
    import time
    import types

    from sharding_store.formats import upgrade_journal

    clock = types.SimpleNamespace(time=lambda: 1764300000.25, strftime=time.strftime, gmtime=time.gmtime)
    monkeypatch.setattr(upgrade_journal, "time", clock)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("wrappers") / "src"
    make_hierarchy(root)
    make_big_array(root, shards=6)
    return root


def counts(c: CountingInner) -> dict:
    return {"calls": dict(c.calls), "ranges": c.ranges, "bytes_read": c.bytes_read, "bytes_written": c.bytes_written}


def wrapped(path, depth: int) -> CountingInner:
    store = str(path)
    for _ in range(depth):
        store = CountingInner(store)
    return store  # type: ignore[return-value]


def stable(report: dict) -> dict:
    """A report without what names the stores or times the run."""
    out = {k: v for k, v in report.items() if k not in ("src", "dst", "seconds", "throughput_mib_s", "source", "destination")}
    if isinstance(out.get("verified"), dict):
        out["verified"] = stable(out["verified"])
    return out


def without_src(tree: dict[str, bytes]) -> dict[str, bytes]:
    """A migrated tree with its record's ``src`` (the source as spelled: a wrapper's name) left out."""
    record = json.loads(tree.pop(RECORD_KEY))
    assert record.pop("src")
    return {**tree, RECORD_KEY: json.dumps(record).encode()}


@pytest.mark.parametrize("options", [{}, {"index_checksum": False}, {"chunks_per_shard": 3}], ids=["crc", "copy", "reshard"])
def test_migrate_and_verify_through_wrappers_match_the_store_itself(src, tmp_path, options):
    plain = migrate(src, tmp_path / "plain", progress=False, **options)
    runs = {}
    for depth in (1, 2):
        s, d = wrapped(src, depth), wrapped(tmp_path / f"w{depth}", depth)
        report = migrate(s, d, progress=False, **options)
        runs[depth] = (report, s, d)
        assert stable(report.to_dict()) == stable(plain.to_dict()), depth
        assert without_src(tree_bytes(tmp_path / f"w{depth}")) == without_src(tree_bytes(tmp_path / "plain"))
    (_, s1, d1), (_, s2, d2) = runs[1], runs[2]
    assert counts(s2) == counts(s2.inner) == counts(s1)  # type: ignore[attr-defined]
    assert counts(d2) == counts(d2.inner) == counts(d1)  # type: ignore[attr-defined]
    if plain.totals.copied:  # the kernel copies went through the wrappers, as copies (of the source)
        assert s1.calls["copy_to"] == plain.totals.copied
    # the verification of copied shards compared the two local files: no shard of a sharded
    # array was read through the destination store (only documents and unsharded chunks)
    if not options.get("chunks_per_shard"):
        sharded = tuple(f"{a.path}/" for a in plain.arrays if a.chunks_per_shard is not None)
        read = [k for name, detail in d1.log if name in ("get", "get_ranges")
                for k in ([detail] if name == "get" else [r[0] for r in detail])]
        assert read and not [k for k in read if k.startswith(sharded) and not k.endswith("zarr.json")], read


def test_verify_alone_through_wrappers(src, tmp_path):
    migrate(src, tmp_path / "out", verify=False, progress=False)
    plain = verify(src, tmp_path / "out")
    seen = {}
    for depth in (1, 2):
        s, d = wrapped(src, depth), wrapped(tmp_path / "out", depth)
        assert stable(verify(s, d).to_dict()) == stable(plain.to_dict())
        seen[depth] = (counts(s), counts(d))
    assert seen[1] == seen[2]


@pytest.mark.parametrize("cps", [None, 2, 4])
def test_reshard_to_a_wrapped_destination(src, tmp_path, cps):
    before = tree_hash(src)
    plain = reshard(src, tmp_path / "plain", chunks_per_shard=cps, progress=False)
    seen = {}
    for depth in (1, 2):
        s, d = wrapped(src, depth), wrapped(tmp_path / f"w{depth}", depth)
        report = reshard(s, d, chunks_per_shard=cps, progress=False)
        assert stable(report.to_dict()) == stable(plain.to_dict())
        assert tree_bytes(tmp_path / f"w{depth}") == tree_bytes(tmp_path / "plain")
        seen[depth] = (counts(s), counts(d))
    assert seen[1] == seen[2]
    assert seen[1][0]["calls"].get("copy_to", 0) == plain.objects_copied  # verbatim copies by the kernel
    assert tree_hash(src) == before


def test_in_place_reshard_through_a_wrapper_renames(src, tmp_path):
    results = {}
    for depth in (0, 1, 2):
        copy = tmp_path / f"copy{depth}"
        shutil.copytree(src, copy)
        store = wrapped(copy, depth) if depth else str(copy)
        report = reshard(store, chunks_per_shard=3, progress=False, jobs=2)
        results[depth] = (stable(report.to_dict()), tree_bytes(copy), None if not depth else counts(store), store)
    assert results[0][:2] == results[1][:2] == results[2][:2]
    one = results[1][2]
    assert results[2][2] == one
    assert one["calls"]["move"] == results[1][0]["objects_written"] > 0  # staged objects renamed into place
    # not read back and written again under the final key
    staged_reads = [d for name, d in results[1][3].log if name == "get" and d.startswith("__reshard__/data/")]
    assert staged_reads == []


def test_values_read_back_after_wrapped_runs(src, tmp_path):
    from tests.draft_factory import read_v3

    out = tmp_path / "out"
    migrate(CountingInner(str(src)), CountingInner(str(out)), progress=False)
    plain = tmp_path / "plain"
    migrate(src, plain, progress=False)
    big = read_v3(out, "big")
    assert big.size and np.array_equal(big, read_v3(plain, "big"))
