"""inspect statistics and the ``info``/``ls`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import create_draft_array, create_draft_group
from sharding_store.api.evidence import array_stats, codec_chain_text, covered_bytes, hierarchy_stats
from sharding_store.cli import main
from sharding_store.formats.shard_index import ShardIndex, index_nbytes
from sharding_store.testing import CountingInner
from tests.fixtures import ZARR_JS, require

FIXTURES = ZARR_JS


@pytest.fixture
def store(tmp_path):
    """/ (explicit), /g/img sharded blosc (3 of 4 shards written), /g/raw unsharded zlib."""
    root = str(tmp_path / "s.zarr")
    create_draft_group(root, "", attrs={"title": "t"})
    img = create_draft_array(root, "g/img", shape=(100, 100), chunks=(25, 25), dtype="<u2", chunks_per_shard=(2, 2))
    img[0:50, :] = 1  # shards c0/0 and c0/1 full (8 chunks)
    img[50:60, 0:10] = 2  # one chunk of shard c1/0
    raw = create_draft_array(root, "g/raw", shape=(10,), chunks=(4,), dtype="<i4", compressor=numcodecs.Zlib(level=1))
    raw[...] = np.arange(10)
    return Path(root)


def add_dead_bytes(path: Path, key: str, cps: tuple[int, ...]) -> int:
    """Drop the first live chunk from a shard's index only, as zarr 2.x deletes: returns its size."""
    blob = (path / key).read_bytes()
    n = index_nbytes(cps)
    index = ShardIndex.from_bytes(blob[-n:], cps)
    coords, _, nbytes = next(index.live())
    index.clear(coords)
    (path / key).write_bytes(blob[:-n] + index.to_bytes())
    return nbytes


def test_stats(store):
    h, stats = hierarchy_stats(str(store))
    by_path = {s.path: s for s in stats}
    img, raw = by_path["g/img"], by_path["g/raw"]
    assert (img.n_objects, img.n_chunks, img.dead_bytes) == (3, 9, 0)
    files = [p for p in (store / "data/root/g/img").rglob("*") if p.is_file()]
    assert img.bytes_stored == sum(p.stat().st_size for p in files)
    assert (raw.n_objects, raw.n_chunks, raw.dead_bytes) == (3, 3, 0)
    assert img.portable is True and raw.portable is False
    assert any("zlib" in p for p in raw.portability_problems)
    dead = add_dead_bytes(store, "data/root/g/img/c0/0", (2, 2))
    img2 = array_stats(h.inner, h.node("g/img").meta)
    assert img2.dead_bytes == dead and img2.n_chunks == 8 and img2.bytes_stored == img.bytes_stored


def test_stats_read_indices_in_one_batch(store):
    h, _ = hierarchy_stats(str(store))
    counting = CountingInner(str(store))
    array_stats(counting, h.node("g/img").meta)
    assert counting.calls["list_prefix"] == 1 and counting.calls["get_ranges"] == 1 and counting.ranges == 3
    assert counting.bytes_read == 3 * index_nbytes((2, 2))


def test_stray_keys_and_corrupt_shards_are_reported(store):
    (store / "data/root/g/img/notes.txt").write_bytes(b"hello")
    (store / "data/root/g/img/c1/1").write_bytes(b"short")
    h, stats = hierarchy_stats(str(store), "g/img")
    (s,) = stats
    assert s.stray_keys == ("data/root/g/img/notes.txt",)
    assert s.problems and "data/root/g/img/c1/1" in s.problems[0] and s.dead_bytes is None


def test_lost_transformer_hint():
    store: dict = {}
    a = create_draft_array(store, "a", shape=(8,), chunks=(2,), dtype="u1", compressor=None, chunks_per_shard=2)
    a[...] = 1
    doc = json.loads(store["meta/root/a.array.json"])
    del doc["storage_transformers"]  # what zarr 2.x resize() did
    store["meta/root/a.array.json"] = json.dumps(doc).encode()
    _, (s,) = hierarchy_stats(store)
    assert s.problems and "lost its storage transformer" in s.problems[0]


def test_covered_bytes_counts_shared_bytes_once():
    index = ShardIndex.empty((3,))
    index.set((0,), 0, 10)
    index.set((1,), 5, 10)  # overlaps the first
    index.set((2,), 20, 5)
    assert covered_bytes(index) == 20


def test_codec_chain_text():
    a = create_draft_array({}, "a", shape=(4,), chunks=(2,), dtype="<i4", filters=[numcodecs.Delta(dtype="<i4")],
                           compressor=numcodecs.Zlib(level=3))
    assert codec_chain_text(a.meta) == "delta(dtype='<i4', astype='<i4') -> zlib(level=3)"
    b = create_draft_array({}, "b", shape=(4,), chunks=(2,), dtype="<i4", compressor=None)
    assert codec_chain_text(b.meta) == "none"


# --------------------------------------------------------------------------- CLI


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_human(store, capsys):
    dead = add_dead_bytes(store, "data/root/g/img/c0/0", (2, 2))
    code, out, err = run(capsys, "info", str(store))
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"{store}: draft-era Zarr v3 (2022); `sharding-store migrate` translates it to final " \
        "Zarr v3 (shard indices rebuilt, chunk payloads copied verbatim)"
    assert out.splitlines()[1:3] == ["", "/  attributes title=\"t\""]
    assert "    img (100, 100) <u2 chunks (25, 25) chunks per shard (2, 2)" in out
    block = out.split("/g/img\n")[1].split("\n\n")[0]
    assert "shape 100 x 100  dtype <u2" in block
    assert "inner chunks 25 x 25  chunks per shard 2 x 2  shard shape 50 x 50" in block
    assert "codecs blosc(cname='lz4', clevel=5, shuffle=1, blocksize=0)" in block
    assert "stored 3 shards, 8 inner chunks," in block and f", dead {dead} B" in block
    assert "portable yes" in block
    raw = out.split("/g/raw\n")[1]
    assert "(unsharded)" in raw and "3 chunk objects" in raw and "portable no: compressor codec" in raw


def test_info_json(store, capsys):
    code, out, _ = run(capsys, "info", str(store), "--json")
    assert code == 0
    doc = json.loads(out)
    assert [n["path"] for n in doc["nodes"]] == ["", "g", "g/img", "g/raw"]
    assert doc["nodes"][0]["attributes"] == {"title": "t"} and doc["nodes"][1]["explicit"] is False
    img = {a["path"]: a for a in doc["arrays"]}["g/img"]
    assert img["shape"] == [100, 100] and img["chunks_per_shard"] == [2, 2] and img["shard_shape"] == [50, 50]
    assert (img["n_shards"], img["n_chunks"], img["dead_bytes"], img["portable"]) == (3, 9, 0, True)
    assert img["codecs"] == [{"role": "compressor", "id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}]
    code, out, _ = run(capsys, "info", str(store), "--json", "--path", "g/raw")
    doc = json.loads(out)
    assert [a["path"] for a in doc["arrays"]] == ["g/raw"] and doc["arrays"][0]["portable"] is False


def test_ls(store, capsys):
    code, out, _ = run(capsys, "ls", str(store))
    assert code == 0
    assert out.splitlines() == ["/\tgroup", "/g\tgroup", "/g/img\tarray\t100 x 100\t<u2", "/g/raw\tarray\t10\t<i4"]
    _, out, _ = run(capsys, "ls", str(store), "--path", "/g/img")
    assert out.splitlines() == ["/g/img\tarray\t100 x 100\t<u2"]


@pytest.mark.parametrize("name", ["1d.contiguous.compressed.sharded.i2.group.zarr", "3d.chunked.mixed.compressed.sharded.i2.zarr"])
def test_info_on_real_fixtures(name, capsys):
    code, out, _ = run(capsys, "info", str(require(FIXTURES) / name), "--json")
    assert code == 0
    for a in json.loads(out)["arrays"]:
        assert a["n_shards"] >= 1 and a["n_chunks"] >= 1 and a["dead_bytes"] == 0 and a["portable"] is False  # zlib


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["info", "{missing}"], 7, "no draft-era hierarchy here"),
        (["ls", "{missing}"], 7, "no draft-era hierarchy here"),
        (["info", "{store}", "--path", "nope"], 7, "no array or group at 'nope'"),
        (["info", "{store}", "--storage-options", "[1"], 2, "--storage-options: not valid JSON"),
        (["info"], 2, "required"),
    ],
)
def test_errors_are_one_line_with_exit_codes(store, tmp_path, argv, code, message):
    argv = [a.format(missing=tmp_path / "missing", store=store) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "sharding_store.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == code
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr
