"""``verify``: every difference between a migrated hierarchy and its source is caught."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sharding_store import VerificationError
from sharding_store.cli import main
from sharding_store.formats.shard_index import read_index
from sharding_store.ops.migration import migrate
from sharding_store.ops.verification import verify
from tests.draft_factory import make_hierarchy

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def migrated(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_hierarchy(src)
    migrate(src, out, verify=False, progress=False)
    return src, out


def test_a_faithful_migration_verifies(migrated):
    src, out = migrated
    report = verify(src, out)
    assert report.ok and report.arrays == 5 and report.check.chunks == 107 and report.check.objects == 30


def test_cli_names_a_corrupted_payload_byte_and_counts(migrated, capsys):
    src, out = migrated
    path = out / "imgs/raw/c/1/0"
    blob = bytearray(path.read_bytes())
    _, off, nb = next(read_index(bytes(blob), (2, 2), checksum=True).live())
    blob[off + nb // 2] ^= 0x01  # inside a payload: the index still checksums
    path.write_bytes(bytes(blob))
    code = main(["verify", str(src), str(out)])
    err = capsys.readouterr().err
    assert code == VerificationError.exit_code != 0
    assert "imgs/raw/c/1/0 chunk (0, 0): differs from the source" in err and "1 difference;" in err


def test_broken_index_checksum_missing_and_extra_objects(migrated):
    src, out = migrated
    idx = out / "imgs/zl/c/0/1"
    blob = bytearray(idx.read_bytes())
    blob[-6] ^= 0xFF  # inside the index
    idx.write_bytes(bytes(blob))
    (out / "lone/deep/dots/c.1.1").unlink()
    (out / "tab/plain/c.9.0").write_bytes(b"junk")
    with pytest.raises(VerificationError) as e:
        verify(src, out)
    report = verify(src, out, raise_on_error=False)
    messages = " | ".join(m for _, m in report.check.problems)
    assert report.check.n_problems == 3, messages
    assert "imgs/zl/c/0/1: shard index checksum mismatch" in messages
    assert "lone/deep/dots/c.1.1: missing" in messages
    assert "tab/plain/c.9.0: unexpected object" in messages
    assert "3 differences" in str(e.value) and e.value.key == report.check.problems[0][0]


def test_metadata_must_be_the_translation(migrated):
    src, out = migrated
    doc_path = out / "imgs/raw/zarr.json"
    doc = json.loads(doc_path.read_text())
    doc["fill_value"] = 7
    doc_path.write_text(json.dumps(doc))
    (out / "imgs/zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    with pytest.raises(VerificationError, match="first: imgs/raw/zarr.json: not the translation") as e:
        verify(src, out)
    assert "2 differences" in str(e.value) and "fill_value" in str(e.value)
    report = verify(src, out, raise_on_error=False)
    assert [k for k, _ in report.check.problems] == ["imgs/raw/zarr.json", "imgs/zarr.json"]
    assert "field 'attributes'" in report.check.problems[1][1]


def test_recompressed_arrays_are_compared_by_value(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    values = make_hierarchy(src)
    report = migrate(src, out, portable=True, progress=False)
    assert report.verification.ok and [a.path for a in report.arrays if a.recompressed] == ["imgs/zl", "tab/plain"]
    # re-encode one recompressed chunk with other values: same size class, different data
    import numcodecs

    chunk = np.full((8, 7), 42.0)
    (out / "tab/plain/c.0.0").write_bytes(numcodecs.Zstd(level=3).encode(chunk.tobytes()))
    with pytest.raises(VerificationError, match=r"tab/plain/c\.0\.0: differs from source chunk"):
        verify(src, out)
    assert values["tab/plain"][0, 0] != 42.0


def test_an_interrupted_destination_does_not_verify(migrated):
    src, out = migrated
    (out / "zarr.json").unlink()
    (out / "scalar/zarr.json").unlink()
    report = verify(src, out, raise_on_error=False)
    assert {k for k, _ in report.check.problems} == {"zarr.json", "scalar/zarr.json"}


@pytest.mark.parametrize("native", [True, False], ids=["memcmp", "python"])
@pytest.mark.parametrize("block", [7, 1 << 20])
def test_copied_shards_compared_in_blocks_catch_any_byte(tmp_path, monkeypatch, native, block):
    """The local fast path for copied shards (source bytes + index CRC) compares the two
    files block by block: a flipped byte anywhere (first, block edges, last payload
    byte, the index) is reported, whatever the block size, with or without memcmp."""
    import sys

    vmod = sys.modules["sharding_store.ops.verification"]
    monkeypatch.setattr(vmod, "BLOCK", block)
    if not native:  # no libc memcmp: the Python comparison
        from sharding_store.codec import _native

        monkeypatch.setattr(_native, "memcmp", lambda: None)
    src, out = tmp_path / "src", tmp_path / "out"
    make_hierarchy(src)
    report = migrate(src, out, verify=False, progress=False)
    assert report.totals.copied > 0  # the fast path has copied shards to check
    fast = []
    real = vmod._check_local_copy
    monkeypatch.setattr(vmod, "_check_local_copy", lambda *a: fast.append(real(*a)) or fast[-1])
    assert verify(src, out, jobs=1).ok
    unsharded_objects = sum(a.shards for a in report.arrays if a.chunks_per_shard is None)
    copied_shards = report.totals.copied - unsharded_objects
    assert copied_shards > 0 and sum(r is not None for r in fast) == copied_shards  # one pass each
    path = out / "imgs/raw/c/1/0"
    original = path.read_bytes()
    positions = {0, block - 1, block, len(original) - 5, len(original) - 1} | {len(original) // 2}
    for pos in sorted(p for p in positions if 0 <= p < len(original)):
        blob = bytearray(original)
        blob[pos] ^= 0x10
        path.write_bytes(bytes(blob))
        assert not verify(src, out, raise_on_error=False).ok, pos
    path.write_bytes(original)
    assert verify(src, out).ok
