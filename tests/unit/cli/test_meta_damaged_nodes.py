"""A damaged metadata document damages its own node only, and never crashes a command
(issue 12 item 10).

* a float ``fill_value`` of ``10**400`` (beyond float64) is invalid draft metadata: exit 3
  naming the field, in every command, not exit 70 (``OverflowError``);
* attributes nested 500 deep are valid data: migrate, reshard, info and the readers handle
  them (they used to hit ``RecursionError`` in ``copy.deepcopy``); nesting beyond
  ``MAX_JSON_DEPTH`` is damage (exit 3), never a crash;
* a metadata key whose path has a character outside the legal set
  (``meta/root/bad name.array.json``, ``meta/root/a@b.group.json``) is that node's damage:
  ``info``/``ls`` list it as damaged, ``--skip-damaged`` leaves it out and migrates the
  rest, ``migrate`` without it names it (exit 3).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from sharding_store import create_draft_array, open_draft
from sharding_store.api.v3view import open_v3
from sharding_store.cli import main
from sharding_store.errors import DraftMetadataError
from sharding_store.formats.draft_metadata import array_meta_key, parse_array_metadata, parse_group_metadata
from tests.draft_factory import tree_hash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
VALUES = np.arange(64, dtype="<f8").reshape(8, 8)


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def one_line(code: int, err: str, expected: int, *fragments: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == expected, (code, err)
    if expected:
        (line,) = err.strip().splitlines()
        assert line.startswith("sharding-store: error: ") and all(f in line for f in fragments), line


def healthy(root: Path, *paths: str) -> None:
    for path in paths:
        create_draft_array(str(root), path, shape=VALUES.shape, chunks=(4, 4), dtype=VALUES.dtype,
                           chunks_per_shard=(2, 1), compressor=numcodecs.Zlib(1))[...] = VALUES


def edit(root: Path, path: str, change) -> None:
    key = root / array_meta_key(path)
    doc = json.loads(key.read_text())
    change(doc)
    key.write_text(json.dumps(doc))


def deep(n: int) -> dict:
    value: dict = {"leaf": 1}
    for i in range(n):
        value = {f"k{i % 3}": value}
    return value


def published(dst: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(dst)) for p in dst.rglob("zarr.json")
                  if json.loads(p.read_text())["node_type"] == "array")


# --------------------------------------------------------------------------- fill_value 10**400


@pytest.fixture
def huge_fill(tmp_path) -> Path:
    root = tmp_path / "fill.zr3"
    healthy(root, "good", "bad")

    def change(doc):
        doc["fill_value"] = 10**400

    edit(root, "bad", change)
    return root


def test_huge_float_fill_value_is_invalid_metadata_in_every_command(huge_fill, tmp_path):
    src = str(huge_fill)
    before = tree_hash(huge_fill)
    code, out, err = run("info", src)
    one_line(code, err, 0)
    assert "/bad\n  damaged (DraftMetadataError): meta/root/bad.array.json: field 'fill_value'" in out
    one_line(*run("info", src, "--strict")[::2], 3, "meta/root/bad.array.json", "'fill_value'", "float64")
    code, out, err = run("ls", src)
    one_line(code, err, 0)
    assert "/bad\tdamaged\tDraftMetadataError" in out
    one_line(*run("migrate", src, str(tmp_path / "plain"))[::2], 3, "'fill_value'", "--skip-damaged")
    code, _, err = run("migrate", src, str(tmp_path / "skip"), "--skip-damaged")
    one_line(code, err, 0)
    assert published(tmp_path / "skip") == ["good"]
    one_line(*run("verify", src, str(tmp_path / "skip"))[::2], 3, "'fill_value'")
    one_line(*run("verify", src, str(tmp_path / "skip"), "--skip-damaged")[::2], 0)
    one_line(*run("reshard", src, str(tmp_path / "resharded"), "--chunks-per-shard", "1", "--array", "bad")[::2],
             3, "'fill_value'")
    one_line(*run("reshard", src, str(tmp_path / "resharded2"), "--chunks-per-shard", "1")[::2], 0)
    assert tree_hash(huge_fill) == before
    for opener in (open_draft, open_v3):
        with pytest.raises(DraftMetadataError, match="fill_value"):
            opener(src, "bad")
        assert np.array_equal(opener(src, "good")[...], VALUES)


@pytest.mark.parametrize("fill", [10**400, -(10**400), [10**400, 0]], ids=["big", "-big", "complex"])
def test_fill_values_beyond_float64_are_refused_by_the_parser(fill):
    doc = {"shape": [2], "chunk_grid": {"type": "regular", "chunk_shape": [2], "separator": "/"},
           "data_type": "<c16" if isinstance(fill, list) else "<f8", "chunk_memory_layout": "C",
           "fill_value": fill, "extensions": [], "attributes": {}}
    if isinstance(fill, list):
        doc["data_type"] = {"extension": "x", "type": "<c16", "fallback": None}
    with pytest.raises(DraftMetadataError, match="fill_value") as e:
        parse_array_metadata(json.dumps(doc), array_meta_key("a"))
    assert len(str(e.value)) < 400  # the 401-digit number is not pasted into the message
    for text in (json.dumps(doc), doc):  # already-parsed documents too
        with pytest.raises(DraftMetadataError, match="fill_value"):
            parse_array_metadata(text, array_meta_key("a"))


# --------------------------------------------------------------------------- deep attributes


def test_attributes_nested_500_deep_migrate_reshard_and_info(tmp_path):
    root = tmp_path / "deep.zr3"
    healthy(root, "good", "nested")
    attributes = {"deep": deep(500), "title": "t"}

    def change(doc):
        doc["attributes"] = attributes

    edit(root, "nested", change)
    src = str(root)
    for args in (("info", src), ("info", src, "--json"), ("info", src, "--strict"), ("ls", src)):
        one_line(*run(*args)[::2], 0)
    code, _, err = run("migrate", src, str(tmp_path / "dst"), "--jobs", "1")
    one_line(code, err, 0)
    migrated = zarr.open_array(str(tmp_path / "dst"), path="nested", mode="r")
    assert dict(migrated.attrs) == attributes and np.array_equal(migrated[...], VALUES)
    one_line(*run("reshard", src, "--chunks-per-shard", "1", "--array", "nested")[::2], 0)
    resharded = open_draft(src, "nested")
    assert resharded.chunks_per_shard == (1, 1) and dict(resharded.attrs) == attributes
    assert np.array_equal(resharded[...], VALUES)


def test_nesting_beyond_the_limit_is_damage_not_a_crash(tmp_path):
    root = tmp_path / "deeper.zr3"
    healthy(root, "good", "bad")
    key = root / array_meta_key("bad")
    doc = json.loads(key.read_text())
    depth = 6000  # deeper than Python's json parser can recurse
    text = json.dumps(doc)[:-1] + ', "extra": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    key.write_text(text)
    code, out, err = run("info", str(root))
    one_line(code, err, 0)
    assert "/bad\n  damaged (DraftMetadataError)" in out and "nested deeper than" in out
    code, _, err = run("migrate", str(root), str(tmp_path / "dst"), "--skip-damaged")
    one_line(code, err, 0)
    assert published(tmp_path / "dst") == ["good"]
    # 900 levels still parse, but leave later steps (encoders, zarr-python 3 reading the
    # migrated zarr.json from a deeper stack) too little of the interpreter's 1000 frames
    nested = json.dumps({"attributes": deep(900)})
    with pytest.raises(DraftMetadataError, match="nested deeper than"):
        parse_group_metadata(nested, "meta/root/g.group.json")


# --------------------------------------------------------------------------- illegal key characters


@pytest.mark.parametrize(
    "bad_key, damaged_path",
    [("meta/root/bad name.array.json", "bad name"), ("meta/root/a@b.group.json", "a@b"),
     ("meta/root/x/bad name.array.json", "x/bad name")],
)
def test_an_illegal_key_damages_its_node_only(tmp_path, bad_key, damaged_path):
    root = tmp_path / "keys.zr3"
    healthy(root, "good", "g/other")
    (root / bad_key).parent.mkdir(parents=True, exist_ok=True)
    (root / bad_key).write_bytes((root / array_meta_key("good")).read_bytes())
    src = str(root)

    code, out, err = run("info", src)
    one_line(code, err, 0)
    assert f"/{damaged_path}\n  damaged (DraftMetadataError): {bad_key}: malformed node path" in out
    assert "/good\n" in out and "/g/other\n" in out
    code, out, err = run("info", src, "--json")
    (damaged,) = json.loads(out)["damaged"]
    assert damaged["path"] == damaged_path and damaged["key"] == bad_key
    code, out, _ = run("ls", src)
    assert f"/{damaged_path}\tdamaged\tDraftMetadataError" in out and "/good\tarray" in out
    one_line(*run("info", src, "--strict")[::2], 3, bad_key)

    one_line(*run("migrate", src, str(tmp_path / "plain"))[::2], 3, bad_key, "--skip-damaged")
    assert not (tmp_path / "plain").exists()
    code, out, err = run("migrate", src, str(tmp_path / "skip"), "--skip-damaged", "--json")
    one_line(code, err, 0)
    report = json.loads(out)
    assert report["verified"]["ok"] and sorted(a["path"] for a in report["arrays"]) == ["g/other", "good"]
    assert [(s["path"], s["kind"]) for s in report["skipped"]["arrays"]] == [(damaged_path, "damaged")]
    assert published(tmp_path / "skip") == ["g/other", "good"]
    for path in ("good", "g/other"):
        assert np.array_equal(zarr.open_array(str(tmp_path / "skip"), path=path, mode="r")[...], VALUES)
    one_line(*run("verify", src, str(tmp_path / "skip"), "--skip-damaged")[::2], 0)
    one_line(*run("reshard", src, "--chunks-per-shard", "1")[::2], 0)  # the other arrays, in place
    assert open_draft(src, "good").chunks_per_shard == (1, 1)


def test_cli_process_never_prints_a_traceback_for_these(huge_fill, tmp_path):
    """The same through the console script in a real process (what a user runs)."""
    proc = subprocess.run([sys.executable, "-m", "sharding_store.cli", "migrate", str(huge_fill), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    one_line(proc.returncode, proc.stderr, 3, "'fill_value'")
