"""``open_v3`` decodes within bounds and names what is damaged, for every generation
(issue 25 item 13).

On 198ea53 the view of a 2023 store passed chunk objects to zarr-python unchecked: a 1 MB
gzip payload inflating to 1 GiB took over 2 GB of memory and ended in a bare ValueError, a
payload that is not gzip at all in a bare ``gzip.BadGzipFile``; and ``open_v3(store)[path]``
of a damaged 2022 node raised a bare KeyError. Now every payload served is check-decoded
within its chunk's size first (the bounded decoders ``open_draft`` uses), so damage is a
``ChunkDecodeError`` naming the key, and a damaged node's document raises its own error.

Memory is measured in a child process under an address-space cap (as in
``tests/unit/codec/test_codec_bounds.py``), so a regression fails with a number.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import zarr

import sharding_store as ss
from sharding_store import (
    ChunkDecodeError,
    DraftMetadataError,
    create_draft_array,
    create_draft_group,
)

from ...gen2023_writer import shard_blob, write_2023
from ..codec.test_codec_bounds import MIB, RSS_LIMIT_MB, run_child_script

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

N = 1024  # items per chunk (float32: 4 KiB chunks)


def gzip_bomb(mib: int) -> bytes:
    """A valid gzip member of ``mib`` MiB of zeros (about 1 KB per MiB): one full-flush
    deflate segment repeated (each restarts the compressor's state, so copies concatenate),
    then the final block, the CRC-32 and the size of the zeros."""
    zeros = bytes(MIB)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    segment = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    final = c.flush()
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, (mib * MIB) % 2**32)
    return header + head + segment * (mib - 1) + final + trailer


@pytest.fixture(scope="module")
def bomb() -> bytes:
    assert gzip.decompress(gzip_bomb(3)) == bytes(3 * MIB)  # a valid stream: refused for its size only
    data = gzip_bomb(1024)  # 1 GiB
    assert len(data) < 1.1 * MIB
    return data


def _store_2023(root: Path, sharded: bool) -> None:
    write_2023(root, "a", np.arange(4 * N, dtype="<f4"), chunks=(N,), cps=(1,) if sharded else None,
               b2b=("gzip",), index="hidden", spelling="bytes")


def _put(root: Path, payload: bytes, sharded: bool) -> None:
    (root / "a/c/1").write_bytes(shard_blob({0: payload}, 1, hidden_crc=True) if sharded else payload)


CHILD = r"""
import sharding_store as ss
from sharding_store import ChunkDecodeError
try:
    a = ss.open_v3(sys.argv[2], sys.argv[3])
    a[...] if sys.argv[4] == "all" else a[int(sys.argv[4]) : int(sys.argv[4]) + 5]
    result["outcome"] = "read"
except ChunkDecodeError as e:
    result.update(outcome="ChunkDecodeError", key=e.key, message=str(e))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_a_gzip_bomb_in_a_2023_store_is_refused_by_open_v3_without_the_memory(tmp_path: Path, bomb: bytes, sharded: bool) -> None:
    root = tmp_path / "store"
    _store_2023(root, sharded)
    _put(root, bomb, sharded)
    got = run_child_script(tmp_path, CHILD, str(root), "a", "all")
    assert got["outcome"] == "ChunkDecodeError", got
    assert got["key"] == "a/c/1" and "a/c/1" in got["message"], got
    assert got["maxrss_mb"] < RSS_LIMIT_MB, got


@pytest.mark.slow
def test_a_gzip_bomb_read_as_one_chunk_of_its_shard_is_refused_without_the_memory(tmp_path: Path, bomb: bytes) -> None:
    """zarr reads one chunk of a shard by its index and a range: the chunk the view serves
    is check-decoded too (chunk 1 of shard ``a/c/0`` is ``a/c/1``)."""
    root = tmp_path / "store"
    write_2023(root, "a", np.arange(4 * N, dtype="<f4"), chunks=(N,), cps=(2,), b2b=("gzip",), index="hidden",
               spelling="bytes")
    good = gzip.compress(np.arange(N, dtype="<f4").tobytes())
    (root / "a/c/0").write_bytes(shard_blob({0: good, 1: bomb}, 2, hidden_crc=True))
    assert np.array_equal(ss.open_v3(str(root), "a")[:N], np.arange(N, dtype="<f4"))  # chunk 0 reads
    got = run_child_script(tmp_path, CHILD, str(root), "a", str(N))
    assert got["outcome"] == "ChunkDecodeError", got
    assert got["key"] == "a/c/1", got
    assert got["maxrss_mb"] < RSS_LIMIT_MB, got


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("payload", [b"not a gzip member " * 20, b"\x1f\x8b" + b"\x00" * 64], ids=["text", "bad-header"])
def test_a_payload_that_is_not_gzip_is_a_chunk_decode_error_naming_the_key(tmp_path: Path, sharded: bool, payload: bytes) -> None:
    root = tmp_path / "store"
    _store_2023(root, sharded)
    _put(root, payload, sharded)
    a = ss.open_v3(str(root), "a")
    assert np.array_equal(a[:N], np.arange(N, dtype="<f4"))  # the other chunks read
    with pytest.raises(ChunkDecodeError) as e:
        a[...]
    assert e.value.key == "a/c/1"
    with pytest.raises(ChunkDecodeError):
        zarr.open_group(store=a.store, mode="r")["a"][N : 2 * N]


def test_a_damaged_2022_node_is_named_when_reached_through_its_group(tmp_path: Path) -> None:
    root = tmp_path / "store"
    create_draft_group(str(root), "images")
    create_draft_array(str(root), "images/raw", shape=(4,), chunks=(2,), dtype="<u2")
    create_draft_array(str(root), "images/ok", shape=(4,), chunks=(2,), dtype="<u2")
    meta = root / "meta/root/images/raw.array.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = [2**63]
    meta.write_text(json.dumps(doc))
    group = ss.open_v3(str(root))
    for reach in (lambda: group["images/raw"], lambda: group["images"]["raw"], lambda: ss.open_v3(str(root), "images/raw")):
        with pytest.raises(DraftMetadataError) as e:
            reach()
        assert e.value.key == "meta/root/images/raw.array.json", e.value.key
        assert "shape" in str(e.value)
    assert group["images/ok"].shape == (4,)
    assert "raw" not in dict(group["images"].members())


def test_a_damaged_2023_node_is_named_when_reached_through_its_group(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store_2023(root, sharded=False)
    write_2023(root, "b", np.arange(4, dtype="<u2"), chunks=(2,), spelling="bytes")
    doc = json.loads((root / "a/zarr.json").read_text())
    doc["codecs"] = [{"name": "transpose", "configuration": {"order": "X"}}]
    (root / "a/zarr.json").write_text(json.dumps(doc))
    group = ss.open_v3(str(root))
    with pytest.raises(DraftMetadataError) as e:
        group["a"]
    assert e.value.key == "a/zarr.json"
    assert np.array_equal(group["b"][...], np.arange(4, dtype="<u2"))
