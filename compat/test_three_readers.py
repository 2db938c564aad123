"""Three independent readers of everything we write: zarr-python 3, tensorstore and zarrs.

zarrs is the Rust implementation, used through zarr-python 3's codec pipeline in strict
mode (``codec_pipeline.path = "zarrs.ZarrsCodecPipeline"``, ``codec_pipeline.strict =
True``: it refuses instead of falling back to Python). For every migrated array:

* a reader that opens it must read exactly the source's values (never wrong data);
* a reader may refuse it only when the migration report names the array as not portable
  (``ArrayReport.portable`` False and a warning naming its path);
* with ``--portable`` every numeric array is portable and read by all three; the
  ``--portable`` hint is given for an array it would make portable and only for those.

Sources: the zarr-python 2.18.7 corpus (values from 2.18 itself) and the draft stores in
``../shared/fixtures`` (values from ``open_draft``, which other tests hold to their own
oracles).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from compat import oracle
from compat.oracle import arrays_equal
from sharding_store import DraftMetadataError, open_draft
from sharding_store.ops.migration import MigrationReport, migrate
from tests import fixtures

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LEGACY_DEFECTS = {"resized_defect"}  # 2.18 itself reads that store wrong (see test_oracle_migrate)
OPTIONS = {"default": {}, "portable": {"portable": True}}


def read_zarr(dst: Path, path: str, *, zarrs: bool = False) -> np.ndarray:
    import zarr

    cfg = {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True} if zarrs else {}
    with warnings.catch_warnings(), zarr.config.set(cfg):
        warnings.simplefilter("ignore")
        return zarr.open_array(str(dst), path=path, mode="r")[...]


def read_tensorstore(dst: Path, path: str) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(dst / path) + "/" if path else str(dst) + "/"}}
    return ts.open(spec, read=True).result().read().result()


READERS = {
    "zarr-python": read_zarr,
    "zarrs": lambda dst, path: read_zarr(dst, path, zarrs=True),
    "tensorstore": read_tensorstore,
}


@pytest.fixture(scope="module", autouse=True)
def _readers_installed():
    for mod in ("zarr", "tensorstore", "zarrs"):
        pytest.importorskip(mod, reason=f"{mod} is one of the three independent readers (test extra)")


def same_values(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal values; readers hand out big-endian data in native byte order."""
    got, expected = np.asarray(got), np.asarray(expected)
    native = expected.dtype.newbyteorder("=")
    if got.dtype != expected.dtype and got.dtype == native:
        expected = expected.astype(native)
    return arrays_equal(got, expected)


def array_paths(dst: Path) -> list[str]:
    out = []
    for doc in dst.rglob("zarr.json"):
        if json.loads(doc.read_text()).get("node_type") == "array":
            rel = doc.parent.relative_to(dst).as_posix()
            out.append("" if rel == "." else rel)
    return sorted(out)


def check_readers(dst: Path, report: MigrationReport, expected: dict[str, np.ndarray], option: str) -> dict:
    """Read every array of ``dst`` with the three readers; returns counts per reader."""
    by_path = {a.path: a for a in report.arrays}
    counts = {name: 0 for name in READERS} | {"refused": 0}
    for path in array_paths(dst):
        if path not in expected:
            continue  # the source reader could not read it (counted by the caller's minimum)
        arep = by_path[path]
        named = [w for w in report.warnings if w.startswith(f"{path or '/'}:")]
        want = expected[path]
        if option == "portable" and want.dtype.kind in "biufc":
            assert arep.portable, (dst, path, named)
        for name, read in READERS.items():
            try:
                got = read(dst, path)
            except Exception as e:  # noqa: BLE001 - any refusal; checked against the report
                assert not arep.portable and named, f"{name} refused {dst}/{path}, which the report calls portable: {e}"
                counts["refused"] += 1
                continue
            assert same_values(got, want), f"{name} read different values from {dst}/{path}"
            counts[name] += 1
    return counts


def _migrate(src: Path, dst: Path, option: str) -> MigrationReport | None:
    try:
        return migrate(src, dst, skip_untranslatable=True, progress=False, **OPTIONS[option])
    except DraftMetadataError:  # object arrays: not even the draft metadata parses
        return None


# --------------------------------------------------------------------------- the 2.18 corpus


@pytest.mark.legacy
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_three_readers_read_the_migrated_legacy_corpus(legacy_corpus, legacy_dump, tmp_path, option):
    totals = {name: 0 for name in READERS} | {"refused": 0}
    for case, store in oracle.corpus_stores(legacy_corpus).items():
        if case in LEGACY_DEFECTS:
            continue
        report = _migrate(store, tmp_path / case, option)
        if report is None:
            continue
        dump = legacy_dump(store, chunks=False)
        expected = {p: v for p, v in dump.arrays.items() if p not in dump.errors}
        for k, v in check_readers(tmp_path / case, report, expected, option).items():
            totals[k] += v
    # every reader read most of the corpus; portable output leaves only non-numeric types out
    assert min(totals[name] for name in READERS) >= 60, totals


@pytest.mark.legacy
def test_portable_hint_only_where_portable_helps(legacy_corpus, tmp_path):
    hinted, unhinted = set(), set()
    for case in ("filters", "compressors", "dtypes"):
        store = oracle.corpus_stores(legacy_corpus)[case]
        report = _migrate(store, tmp_path / case, "default")
        for w in report.warnings:
            (hinted if "--portable" in w else unhinted).add(f"{case}/{w.split(':')[0]}")
    assert {"filters/delta", "filters/quantize", "filters/fixedscaleoffset", "compressors/lz4/f8", "compressors/zlib/i4"} <= hinted
    # a datetime or string data type stays non-portable whatever the codecs: no hint
    assert {"dtypes/dtypes/lt_M8_ns", "dtypes/dtypes/lt_U5"} <= unhinted


# --------------------------------------------------------------------------- the shared fixtures


def _fixture_stores() -> list:
    stores = []
    for root in (fixtures.ZARR_JS, fixtures.ZARRITA_2021.parent):
        if root.is_dir():
            stores += [pytest.param(p, id=f"{root.name}/{p.name}") for p in sorted(root.iterdir()) if p.is_dir()]
    return stores or [pytest.param(None, marks=pytest.mark.skip(reason=fixtures.MISSING))]


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("src", _fixture_stores())
def test_three_readers_read_migrated_fixtures(src, option, tmp_path):
    dst = tmp_path / "out"
    report = _migrate(src, dst, option)
    if report is None:
        pytest.skip("the draft metadata itself does not parse (object arrays); covered by the migrate tests")
    expected = {a.path: open_draft(src, a.path)[...] for a in report.arrays}
    counts = check_readers(dst, report, expected, option)
    assert counts["zarr-python"] + counts["refused"] >= len(expected) > 0
