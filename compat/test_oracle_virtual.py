"""Every corpus array, virtually migrated into a reference file (issue 24), reads in
zarr-python 3 — through plain fsspec and through the guarded reader — exactly what
zarr-python 2.18 reads from the draft-era original."""

from __future__ import annotations

import json
import warnings

import fsspec
import pytest
import zarr

from compat import oracle
from compat.test_oracle_migrate import LEGACY_DEFECTS, ZARR3_CANNOT_READ, same_values
from compat.test_xarray_legacy import migrated, written  # noqa: F401 - fixtures
from sharding_store import DraftMetadataError, open_references
from sharding_store.ops.migration import migrate

pytestmark = [pytest.mark.legacy, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def referenced(legacy_corpus, tmp_path_factory):
    """{case: (source store, reference file or None when the source cannot be parsed)}."""
    root = tmp_path_factory.mktemp("referenced")
    out = {}
    for case, store in oracle.corpus_stores(legacy_corpus).items():
        dst = root / f"{case}.json"
        try:
            report = migrate(store, dst, skip_untranslatable=True, progress=False)
            assert report.verification.ok and report.totals.bytes_now == 0, case
        except DraftMetadataError:  # object arrays: not even the draft metadata parses
            dst = None
        out[case] = (store, dst)
    return out


def _readers(dst):
    fs = fsspec.filesystem("reference", fo=str(dst), asynchronous=True)
    return {"fsspec": zarr.storage.FsspecStore(fs, read_only=True, path=""), "guarded": open_references(str(dst))}


def _read(store, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if path == "":
            return zarr.open_array(store, mode="r")[...]
        return zarr.open_group(store, mode="r")[path][...]


def test_zarr3_reads_what_legacy_reads_through_both_readers(referenced, legacy_dump):
    compared = 0
    for case, (store, dst) in referenced.items():
        if dst is None or case in LEGACY_DEFECTS:
            continue
        dump = legacy_dump(store, chunks=False)
        readers = _readers(dst)
        documents = json.loads(dst.read_bytes())["refs"]
        for path, expected in dump.arrays.items():
            if path in dump.errors or (case, path) in ZARR3_CANNOT_READ:
                continue
            if f"{path}/zarr.json".lstrip("/") not in documents:
                continue  # left out as untranslatable (reported by the migration)
            got = {name: _read(reader, path) for name, reader in readers.items()}
            for name, values in got.items():
                assert same_values(values, expected), (case, path, name)
            compared += 1
    assert compared >= 60


# --------------------------------------------------------------------------- xarray-written datasets


@pytest.fixture(scope="module")
def referenced_xarray(written, tmp_path_factory) -> dict:
    """Each xarray-written case migrated by the CLI into a reference file: case -> file."""
    from compat.test_xarray_legacy import cases
    from sharding_store.cli import main

    out = {}
    for case, _, store, _ in cases(written):
        if case not in out:
            dst = tmp_path_factory.mktemp("referenced-xarray") / f"{case}.json"
            assert main(["migrate", str(store), str(dst), "--no-progress"]) == 0
            out[case] = dst
    return out


def test_open_zarr_reads_a_reference_file_as_the_copy(written, migrated, referenced_xarray):
    """``xr.open_zarr`` over the guarded reader (and over plain fsspec) gives the very dataset
    it gives over the copy migration, which ``compat/test_xarray_legacy.py`` compares with
    what xarray 2024.7 read from the draft store."""
    xr = pytest.importorskip("xarray")
    from compat.test_xarray_legacy import cases

    for case, group, _, _ in cases(written):
        with xr.open_zarr(migrated[case], group=group or None) as copy:
            for store in _readers(referenced_xarray[case]).values():
                with xr.open_zarr(store, group=group or None) as ds:
                    xr.testing.assert_identical(ds.load(), copy.load())
