"""A wrong ``--assume-chunks-per-shard`` guess is refused with the evidence (issue 12 item 7).

zarr-python 2.x's ``resize()``/``append()`` dropped ``storage_transformers`` from an
array's metadata while its objects stayed draft shards. The index at the end of a shard
says how many chunks a shard holds (64 here), never its shape: every factorisation of 64
parses, and before this fix ``(1, 1, 64)`` -- which ``open_draft``'s own message offered --
migrated with exit 0 and read mostly the fill value. Every shape but the real ``(4, 4, 4)``
is contradicted by the objects: shard keys outside the shard grid it implies, live index
entries for chunks outside the array, or a longer index before the one it implies. Such a
guess is refused naming the array and the evidence; ``info``, ``open_draft`` and
``migrate`` offer only the shapes nothing contradicts, most likely first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import create_draft_array, open_draft
from sharding_store.cli import main
from sharding_store.errors import DraftMetadataError, ShardCorruptError
from sharding_store.formats import draft_metadata as dm
from tests.draft_factory import read_v3

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

REAL = (4, 4, 4)
WRITTEN = (16, 16, 16)
RESIZED = (16, 16, 18)  # what append() left: the shards still hold (4, 4, 4) chunks of (2, 2, 2)
CHUNKS = (2, 2, 2)
#: every other factorisation of 64 (same index length: each one parses)
SAME_LENGTH = [
    (a, b, 64 // (a * b)) for a in (1, 2, 4, 8, 16, 32, 64) for b in (1, 2, 4, 8, 16, 32, 64)
    if 64 % (a * b) == 0 and (a, b, 64 // (a * b)) != REAL
]
#: shorter indices: the tail of the real index, which parses too
SHORTER = [(4, 4, 2), (2, 2, 2), (1, 1, 4)]
EVIDENCE = re.compile(r"lies outside the [\d x]+ shard grid|live index entry for chunk \(|shard index of more than \d+ entries")


def _values() -> np.ndarray:
    return np.random.default_rng(7).integers(1, 60000, WRITTEN).astype("<u2")  # no zeros: fill reads stand out


def expected() -> np.ndarray:
    out = np.zeros(RESIZED, "<u2")
    out[tuple(slice(0, n) for n in WRITTEN)] = _values()
    return out


def drop_transformer(root: Path, path: str, shape: tuple[int, ...]) -> None:
    """What 2.x's resize()/append() wrote: the new shape, no storage_transformers."""
    key = root / dm.array_meta_key(path)
    doc = json.loads(key.read_bytes())
    del doc["storage_transformers"]
    doc["shape"] = list(shape)
    key.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def lost(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evidence") / "store"
    create_draft_array(str(root), "vol", shape=WRITTEN, chunks=CHUNKS, dtype="<u2", compressor=numcodecs.Zlib(1),
                       chunks_per_shard=REAL)[...] = _values()
    create_draft_array(str(root), "ok", shape=(6,), chunks=(2,), dtype="<u2", chunks_per_shard=(3,))[...] = 5
    drop_transformer(root, "vol", RESIZED)
    return root


def offered(message: str) -> list[tuple[int, ...]]:
    """The shapes a lost-transformer message offers, in its order."""
    m = re.search(r"looks sharded with chunks_per_shard ((?:\(\d+(?:, \d+)*\)(?: or )?)+)", message)
    assert m is not None, message
    shapes = [tuple(int(x) for x in s.split(", ")) for s in re.findall(r"\((\d+(?:, \d+)*)\)", m.group(1))]
    option = re.search(r"--assume-chunks-per-shard vol=([\d,]+)", message)
    assert option is not None and tuple(int(x) for x in option.group(1).split(",")) == shapes[0], message
    return shapes


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- the right guess


def test_the_right_guess_reads_the_values_written(lost, tmp_path, capsys):
    assert np.array_equal(open_draft(str(lost), "vol", assume_chunks_per_shard=REAL)[...], expected())
    code, out, err = cli(capsys, "migrate", str(lost), str(tmp_path / "out"), "--assume-chunks-per-shard", "vol=4,4,4")
    assert code == 0, err
    assert np.array_equal(read_v3(tmp_path / "out", "vol"), expected())
    assert cli(capsys, "info", str(lost), "--assume-chunks-per-shard", "vol=4,4,4", "--strict")[0] == 0


# --------------------------------------------------------------------------- wrong guesses


@pytest.mark.parametrize("guess", SAME_LENGTH + SHORTER, ids=lambda g: "x".join(map(str, g)))
def test_open_draft_refuses_a_wrong_guess_naming_the_evidence(lost, guess):
    with pytest.raises(DraftMetadataError) as e:
        open_draft(str(lost), "vol", assume_chunks_per_shard=guess)
    text = str(e.value)
    assert "array 'vol'" in text and f"vol={','.join(map(str, guess))}" in text
    assert EVIDENCE.search(text), text
    assert "--assume-chunks-per-shard vol=4,4,4" in text  # the one the evidence allows
    assert e.value.key == dm.array_meta_key("vol")


@pytest.mark.parametrize("guess", [(1, 1, 64), (2, 4, 8), (8, 8, 1), (4, 4, 2)], ids=lambda g: "x".join(map(str, g)))
def test_migrate_and_info_refuse_a_wrong_guess_with_exit_3(lost, tmp_path, capsys, guess):
    option = "vol=" + ",".join(map(str, guess))
    dst = tmp_path / "out"
    code, out, err = cli(capsys, "migrate", str(lost), str(dst), "--assume-chunks-per-shard", option)
    assert code == DraftMetadataError.exit_code == 3, (out, err)
    assert "array 'vol'" in err and EVIDENCE.search(err) and "verified" not in out
    assert not (dst / "vol" / "zarr.json").exists()
    code, out, err = cli(capsys, "info", str(lost), "--assume-chunks-per-shard", option)
    assert code == 3 and "array 'vol'" in err and EVIDENCE.search(err)


def test_a_guess_whose_index_is_not_there_fails_on_that_shard(lost):
    with pytest.raises(ShardCorruptError, match=r"data/root/vol/c\d/\d/\d: .*array 'vol'.*vol=4,4,4") as e:
        open_draft(str(lost), "vol", assume_chunks_per_shard=(8, 8, 8))
    assert e.value.key.startswith("data/root/vol/")


# --------------------------------------------------------------------------- candidates


def test_every_command_offers_only_the_shape_the_evidence_allows(lost, tmp_path, capsys):
    with pytest.raises(DraftMetadataError) as e:
        open_draft(str(lost), "vol")
    from_open = offered(str(e.value))
    code, out, _ = cli(capsys, "info", str(lost))
    (problem,) = [line for line in out.splitlines() if "problem:" in line]
    from_info = offered(problem)
    code, out, err = cli(capsys, "migrate", str(lost), str(tmp_path / "refused"))
    assert code == 3
    from_migrate = offered(err)
    assert from_open == from_info == from_migrate == [REAL]


def test_ambiguous_evidence_offers_every_shape_it_allows_ranked(tmp_path):
    """One shard written: its key cannot tell (2, 2) from (1, 4) or (4, 1). All three are
    offered, the one whose shard grid fits the keys most tightly first; each is accepted,
    and no other shape of 4 chunks is offered."""
    a = create_draft_array(str(tmp_path), "vol", shape=(16, 16), chunks=(2, 2), dtype="<i4",
                           compressor=numcodecs.GZip(1), chunks_per_shard=(2, 2))
    a[:4, :4] = 7
    drop_transformer(tmp_path, "vol", (16, 16))
    with pytest.raises(DraftMetadataError) as e:
        open_draft(str(tmp_path), "vol")
    shapes = offered(str(e.value))
    assert shapes[0] == (2, 2) and set(shapes) == {(1, 4), (2, 2), (4, 1)}
    for cps in shapes:
        open_draft(str(tmp_path), "vol", assume_chunks_per_shard=cps)  # never one the evidence rules out


def test_the_evidence_costs_a_bounded_number_of_reads(tmp_path):
    """Beyond the listing the command makes, detecting and checking read a few index tails
    and payloads, however many objects the array has."""
    from sharding_store.api.evidence import check_assumed_layout, data_keys, detect_lost_transformer
    from sharding_store.stores import as_inner
    from sharding_store.testing import CountingInner

    costs = []
    for side in (8, 16):  # 8 and 64 shards
        root = tmp_path / str(side)
        shape = (side, side, side)
        create_draft_array(str(root), "vol", shape=shape, chunks=(1, 1, 1), dtype="u1", compressor=numcodecs.Zlib(1),
                           chunks_per_shard=(4, 4, 4))[...] = 1
        drop_transformer(root, "vol", shape)
        meta = open_draft(str(root), "vol", assume_chunks_per_shard=REAL).meta.with_chunks_per_shard(None)
        keys, _ = data_keys(as_inner(str(root)), meta)
        counting = CountingInner(as_inner(str(root)))
        found = detect_lost_transformer(counting, meta, keys)
        assert found is not None and found.candidates[0] == REAL
        for guess in (REAL, (1, 1, 64), (4, 4, 2)):
            try:
                check_assumed_layout(counting, meta.with_chunks_per_shard(guess), keys)
            except DraftMetadataError:
                assert guess != REAL
        assert counting.calls["list_prefix"] == 0
        costs.append((sum(counting.calls.values()), counting.ranges))
    assert costs[0] == costs[1], costs  # independent of the number of objects
    assert costs[1][0] <= 16 and costs[1][1] <= 64, costs


# --------------------------------------------------------------------------- zarr 2.18 itself

LEGACY_HEADER = """
import os, sys
os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"
import warnings
warnings.filterwarnings("ignore")
import numpy as np, numcodecs, zarr
from zarr._storage.v3 import DirectoryStoreV3
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer
"""
APPENDED = LEGACY_HEADER + """
z = zarr.create(shape=(16, 16, 16), chunks=(2, 2, 2), dtype="<u2", store=DirectoryStoreV3(sys.argv[1]), path="vol",
                zarr_version=3, compressor=numcodecs.Zlib(1),
                storage_transformers=[ShardingStorageTransformer("indexed", chunks_per_shard=(4, 4, 4))])
z[...] = np.random.default_rng(7).integers(1, 60000, (16, 16, 16)).astype("<u2")
z.resize(16, 16, 18)  # the defect: the metadata loses storage_transformers
"""
SHRUNK = LEGACY_HEADER + """
z = zarr.create(shape=(16, 16), chunks=(2, 2), dtype="<i4", store=DirectoryStoreV3(sys.argv[1]), path="vol",
                zarr_version=3, compressor=numcodecs.Zlib(1),
                storage_transformers=[ShardingStorageTransformer("indexed", chunks_per_shard=(2, 2))])
z[...] = np.arange(256, dtype="<i4").reshape(16, 16) + 1
z.resize(5, 5)  # chunks cut off are deleted through the transformer, empty shards removed
"""


def legacy_store(tmp_path: Path, script: str) -> Path:
    """A store written by zarr-python 2.18 itself (compat/.venv-legacy)."""
    if os.environ.get("SHARDING_STORE_SKIP_LEGACY", "").lower() not in ("", "0", "false"):
        pytest.skip("SHARDING_STORE_SKIP_LEGACY is set")
    from compat import oracle

    python = oracle.ensure_legacy_env()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    src = tmp_path / "legacy"
    subprocess.run([str(python), "-c", script, str(src)], check=True, env=env, capture_output=True, timeout=300)
    assert "storage_transformers" not in json.loads((src / dm.array_meta_key("vol")).read_bytes())
    return src


@pytest.mark.legacy
def test_zarr_2_18_append_defect(tmp_path, capsys):
    src = legacy_store(tmp_path, APPENDED)
    assert json.loads((src / dm.array_meta_key("vol")).read_bytes())["shape"] == list(RESIZED)
    code, out, err = cli(capsys, "migrate", str(src), str(tmp_path / "wrong"), "--assume-chunks-per-shard", "vol=1,1,64")
    assert code == 3 and EVIDENCE.search(err), (out, err)
    code, out, err = cli(capsys, "migrate", str(src), str(tmp_path / "refused"))
    assert code == 3 and offered(err) == [REAL]
    code, out, err = cli(capsys, "migrate", str(src), str(tmp_path / "out"), "--assume-chunks-per-shard", "vol=4,4,4")
    assert code == 0, err
    assert np.array_equal(read_v3(tmp_path / "out", "vol"), expected())


@pytest.mark.legacy
def test_zarr_2_18_shrunk_array_keeps_its_candidate(tmp_path):
    """The edge shards of a shrunk array hold no live entry outside it and no shard lies
    outside its grid: the right shape stays uncontradicted."""
    src = legacy_store(tmp_path, SHRUNK)
    with pytest.raises(DraftMetadataError) as e:
        open_draft(str(src), "vol")
    assert offered(str(e.value))[0] == (2, 2)
    got = open_draft(str(src), "vol", assume_chunks_per_shard=(2, 2))[...]
    assert np.array_equal(got, np.arange(256, dtype="<i4").reshape(16, 16)[:5, :5] + 1)
