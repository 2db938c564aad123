"""What xarray and zarr-python 3 users expect of a migrated hierarchy: dimension names for
arrays that had none (``--dimension-names``) and zarr-python 3's consolidated metadata in
the root ``zarr.json`` (``--no-consolidate`` leaves it out). Both are checked by ``verify``."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest

from sharding_store import UsageError
from sharding_store.cli import main
from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "zarr-2.18-sharded.zr3"


def _doc(root: Path, path: str = "") -> dict:
    return json.loads((root / path / "zarr.json").read_text())


def _with_xarray_dims(tmp_path: Path) -> Path:
    """The sample with xarray's ``_ARRAY_DIMENSIONS`` on images/mean."""
    src = tmp_path / "src.zr3"
    shutil.copytree(SAMPLE, src)
    key = src / "meta" / "root" / "images" / "mean.array.json"
    doc = json.loads(key.read_text())
    doc["attributes"]["_ARRAY_DIMENSIONS"] = ["y", "x"]
    key.write_text(json.dumps(doc))
    return src


def test_dimension_names_are_given_to_arrays_without_them(tmp_path):
    dst = tmp_path / "out.zarr"
    code = main(["migrate", str(SAMPLE), str(dst), "--dimension-names", "images/raw=t,y,x",
                 "--dimension-names", "/tables/timestamps/=t"])
    assert code == 0
    assert _doc(dst, "images/raw")["dimension_names"] == ["t", "y", "x"]
    assert _doc(dst, "tables/timestamps")["dimension_names"] == ["t"]
    assert "dimension_names" not in _doc(dst, "images/labels")
    import zarr

    assert zarr.open_array(str(dst), path="images/raw", mode="r").metadata.dimension_names == ("t", "y", "x")
    assert verify(SAMPLE, dst, progress=False).ok  # verify knows names were given


@pytest.mark.parametrize("given, why", [
    ({"nope": ["a"]}, "no array at '/nope'"),
    ({"images/raw": ["t", "y"]}, "2 dimension names"),
    ({"images": ["a"]}, "no array at '/images'"),
])
def test_bad_dimension_names_are_refused_before_anything_is_written(tmp_path, given, why):
    dst = tmp_path / "out.zarr"
    with pytest.raises(UsageError, match=re.escape(why)):
        migrate(SAMPLE, dst, dimension_names=given, progress=False)
    assert not dst.exists() or not any(dst.iterdir())


def test_dimension_names_do_not_overrule_the_arrays_own(tmp_path, capsys):
    src = _with_xarray_dims(tmp_path)
    dst = tmp_path / "out.zarr"
    assert main(["migrate", str(src), str(dst), "--dimension-names", "images/mean=a,b"]) == 2
    err = capsys.readouterr().err
    assert "already" in err and "images/mean" in err and len(err.strip().splitlines()) == 1
    assert not dst.exists() or not any(dst.iterdir())
    migrate(src, dst, dimension_names={"images/mean": ["y", "x"]}, progress=False)  # the same names: fine
    assert _doc(dst, "images/mean")["dimension_names"] == ["y", "x"]


def test_cli_dimension_names_syntax_error_exits_2(tmp_path, capsys):
    assert main(["migrate", str(SAMPLE), str(tmp_path / "o"), "--dimension-names", "images/raw"]) == 2
    assert "PATH=NAME" in capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [
    (["images/raw=t,x,x"], ["'x' given twice", "images/raw"]),  # one array, one name twice
    (["images/raw=t,y,x", "images/raw=a,b,c"], ["given twice with different names", "t,y,x", "a,b,c"]),
    (["images/raw=t,y,x", "/images/raw/=a,b,c"], ["given twice with different names", "/images/raw"]),
    (["images//raw=t,y,x"], ["images//raw", "empty path segment"]),  # not a node path: usage, not damage
    (["images/../raw=t,y,x"], ["images/../raw", "'..'"]),
])
def test_cli_dimension_names_refuses_duplicates_and_conflicts(tmp_path, capsys, argv, named):
    """Exit 2 with one line naming what is wrong (it was: t,x,x accepted, the last repeat winning,
    exit 3 for a path with an empty segment); nothing written."""
    dst = tmp_path / "o"
    words = [w for a in argv for w in ("--dimension-names", a)]
    assert main(["migrate", str(SAMPLE), str(dst), *words]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(n in err for n in named), err
    assert not dst.exists() or not any(dst.iterdir())


def test_api_dimension_names_refuses_duplicates_and_conflicts(tmp_path):
    dst = tmp_path / "o"
    with pytest.raises(UsageError, match="'y' given twice"):
        migrate(SAMPLE, dst, dimension_names={"images/raw": ["y", "y", "x"]}, progress=False)
    with pytest.raises(UsageError, match="given twice with different names"):
        migrate(SAMPLE, dst, dimension_names={"images/raw": ["t", "y", "x"], "/images/raw": ["a", "b", "c"]},
                progress=False)
    with pytest.raises(UsageError, match="empty path segment"):
        migrate(SAMPLE, dst, dimension_names={"images//raw": ["t", "y", "x"]}, progress=False)
    assert not dst.exists() or not any(dst.iterdir())
    # the same names twice, and unnamed dimensions beside names, are fine
    migrate(SAMPLE, dst, dimension_names={"images/raw": ["t", None, None], "/images/raw/": ["t", None, None]},
            progress=False)
    assert _doc(dst, "images/raw")["dimension_names"] == ["t", None, None]


def test_verify_catches_changed_dimension_names(tmp_path):
    dst = tmp_path / "out.zarr"
    migrate(SAMPLE, dst, dimension_names={"images/raw": ["t", "y", "x"]}, progress=False, consolidate=False)
    doc = _doc(dst, "images/raw")
    doc["dimension_names"] = ["t", "y"]  # wrong length: not something migrate writes
    (dst / "images/raw/zarr.json").write_text(json.dumps(doc))
    report = verify(SAMPLE, dst, progress=False, raise_on_error=False)
    assert not report.ok and any(key == "images/raw/zarr.json" for key, _ in report.check.problems)


# --------------------------------------------------------------------------- consolidated metadata


def test_root_gets_what_zarr_consolidate_metadata_writes(tmp_path):
    import zarr

    dst = tmp_path / "out.zarr"
    migrate(SAMPLE, dst, dimension_names={"images/raw": ["t", "y", "x"]}, progress=False)
    ours = _doc(dst)["consolidated_metadata"]
    # zarr-python 3's own writer, on a copy without it, is the oracle
    other = tmp_path / "other.zarr"
    shutil.copytree(dst, other)
    root = _doc(other)
    del root["consolidated_metadata"]
    (other / "zarr.json").write_text(json.dumps(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(other))
    theirs = _doc(other)["consolidated_metadata"]
    for doc in theirs["metadata"].values():  # zarr re-serialises arrays with this default
        if doc.get("storage_transformers") == []:
            del doc["storage_transformers"]
    assert ours == theirs
    assert set(ours["metadata"]) == {"images", "tables", "images/raw", "images/labels", "images/mean",
                                     "tables/measurements", "tables/timestamps"}


def test_xarray_and_zarr_open_it_consolidated_without_a_warning(tmp_path):
    xr = pytest.importorskip("xarray")
    import zarr

    dst = tmp_path / "out.zarr"
    names = {"images/mean": ["y", "x"], "images/raw": ["t", "y", "x"], "images/labels": ["t", "y", "x"]}
    migrate(SAMPLE, dst, dimension_names=names, progress=False)
    g = zarr.open_consolidated(str(dst), mode="r")
    assert g["images/mean"].shape == (256, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ds = xr.open_zarr(str(dst), group="images", consolidated=None, zarr_format=3)
    assert ds["mean"].dims == ("y", "x") and ds["raw"].dims == ("t", "y", "x")


def test_no_consolidate(tmp_path):
    dst = tmp_path / "out.zarr"
    assert main(["migrate", str(SAMPLE), str(dst), "--no-consolidate"]) == 0
    assert "consolidated_metadata" not in _doc(dst)


def test_verify_catches_stale_consolidated_metadata(tmp_path):
    dst = tmp_path / "out.zarr"
    migrate(SAMPLE, dst, progress=False)
    root = _doc(dst)
    root["consolidated_metadata"]["metadata"]["images/mean"]["shape"] = [128, 256]
    (dst / "zarr.json").write_text(json.dumps(root))
    report = verify(SAMPLE, dst, progress=False, raise_on_error=False)
    assert not report.ok
    assert any("consolidated_metadata" in msg and "'images/mean': field 'shape'" in msg for _, msg in report.check.problems)
    assert main(["verify", str(SAMPLE), str(dst)]) == 9


# --------------------------------------------------------------------------- the 2023 generation


def test_a_2023_copy_gets_consolidated_metadata_and_verify_checks_it(tmp_path):
    import zarr

    from tests import fixtures

    src = fixtures.require(fixtures.ZARRITAJS_2023_ENDIAN) / "data.zarr"
    dst = tmp_path / "out.zarr"
    migrate(src, dst, progress=False)
    root = _doc(dst)
    listed = root["consolidated_metadata"]["metadata"]
    assert listed and all(listed[p] == {**_doc(dst, p), **({"consolidated_metadata": listed[p]["consolidated_metadata"]}
                                                           if "consolidated_metadata" in listed[p] else {})}
                          for p in listed)
    g = zarr.open_consolidated(str(dst), mode="r")
    assert sorted(g.array_keys()) == sorted(p for p in listed if "/" not in p and listed[p]["node_type"] == "array")
    path = next(p for p in listed if listed[p]["node_type"] == "array")
    root["consolidated_metadata"]["metadata"][path]["shape"] = [1] * len(listed[path]["shape"])
    (dst / "zarr.json").write_text(json.dumps(root))
    report = verify(src, dst, progress=False, raise_on_error=False)
    assert not report.ok and any("consolidated_metadata" in msg for _, msg in report.check.problems)
    migrate(src, tmp_path / "plain.zarr", progress=False, consolidate=False)
    assert "consolidated_metadata" not in _doc(tmp_path / "plain.zarr")
