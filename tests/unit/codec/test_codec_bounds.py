"""Bounded decompression (issue 12, item 8): a chunk payload that claims, or inflates to, far
more than its chunk is refused with a ``ChunkDecodeError`` naming the key, before the memory
is allocated.

The end-to-end tests go through the public API only (``open_draft(...)[...]`` and the
``sharding-store info`` command, whose lost-transformer probe decodes payloads) in a child
process that reports its peak RSS; the child runs under an address-space cap, so that a
regression fails with a number instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from sharding_store import ChunkDecodeError, create_draft_array

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: peak RSS a child may reach while refusing a bomb (it needs ~50 MB to read a small array)
RSS_LIMIT_MB = 300
#: the child's address-space cap: room for the interpreter and its threads (~400 MB of
#: mappings here), far less than any bomb below inflates to
CHILD_ADDRESS_SPACE = 4 * GIB


# --------------------------------------------------------------------------- bombs


def zlib_bomb(mib: int) -> bytes:
    """A valid zlib stream of ``mib`` MiB of zeros, ~1 KiB per MiB: one full-flush segment
    repeated (each segment restarts the compressor's state, so copies of it concatenate),
    then the final block and the Adler-32 of the zeros."""
    zeros = bytes(MIB)
    c = zlib.compressobj(9)
    head = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    segment = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    final = c.flush()[:-4]  # an empty last block; the checksum is ours
    n = mib * MIB
    return head + segment * (mib - 1) + final + struct.pack(">I", ((n % 65521) << 16) | 1)


def zstd_bomb(blocks: int, *, content_size: bool = True) -> bytes:
    """A valid zstd frame of ``blocks`` x 128 KiB of zeros in RLE blocks (4 bytes each):
    16384 blocks are 2 GiB in 66 KB, announced in the frame header (or not)."""
    n = blocks * 128 * KIB
    fhd = 0xC0 if content_size else 0x00  # an 8-byte content size, or none; not single-segment
    header = struct.pack("<I", 0xFD2FB528) + bytes([fhd, (17 - 10) << 3])  # window 128 KiB
    if content_size:
        header += struct.pack("<Q", n)
    rle = (1 << 1) | (128 * KIB << 3)
    body = (struct.pack("<I", rle)[:3] + b"\0") * (blocks - 1) + struct.pack("<I", rle | 1)[:3] + b"\0"
    return header + body


def blosc_bomb(blocks: int) -> bytes:
    """A valid blosc 1 buffer of ``blocks`` x 256 KiB of zeros: the header announces it all,
    each block is the same lz4 stream (8000 blocks: 1.95 GiB in 8.4 MB)."""
    block = 256 * KIB
    one = numcodecs.Blosc("lz4", 5, shuffle=0, blocksize=block).encode(bytes(2 * block))
    version, versionlz, flags, typesize, _, blocksize, _ = struct.unpack_from("<BBBBIII", one)
    start = struct.unpack_from("<I", one, 16)[0]
    stream = one[start : struct.unpack_from("<I", one, 20)[0]]  # block 0: its size, then its bytes
    first = 16 + 4 * blocks
    cbytes = first + blocks * len(stream)
    header = struct.pack("<BBBBIII", version, versionlz, flags, typesize, blocks * block, blocksize, cbytes)
    starts = struct.pack(f"<{blocks}I", *(first + i * len(stream) for i in range(blocks)))
    return header + starts + stream * blocks


def test_the_bombs_are_valid_streams():
    """Small copies decode (by the libraries themselves) to exactly what they announce, so
    the refusals below are about size, not about garbage."""
    assert zlib.decompress(zlib_bomb(3)) == bytes(3 * MIB)
    from numcodecs.zstd import decompress

    assert bytes(decompress(zstd_bomb(3))) == bytes(3 * 128 * KIB)
    assert bytes(decompress(zstd_bomb(2, content_size=False))) == bytes(2 * 128 * KIB)
    assert bytes(numcodecs.Blosc().decode(blosc_bomb(3))) == bytes(3 * 256 * KIB)
    assert len(zlib_bomb(4000)) < 4.2e6 and len(zstd_bomb(16384)) < 66_000 and len(blosc_bomb(8000)) < 9e6


# --------------------------------------------------------------------------- end to end

CHILD_HEAD = r"""
import json, resource, sys
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
result = {}
try:
"""
CHILD_BODY = r"""
    if sys.argv[2] == "read":
        from sharding_store import ChunkDecodeError, open_draft
        try:
            open_draft(sys.argv[3], sys.argv[4])[...]
            result["outcome"] = "read"
        except ChunkDecodeError as e:
            result.update(outcome="ChunkDecodeError", key=e.key, message=str(e))
    else:
        import runpy
        sys.argv = ["sharding-store", "info", sys.argv[3]]
        try:
            runpy.run_module("sharding_store.cli", run_name="__main__")
        except SystemExit as e:
            result["exit"] = e.code
        result["outcome"] = "info"
"""
CHILD_TAIL = r"""
except BaseException as e:
    result.update(outcome=type(e).__name__, message=str(e)[:300])
# the peak resident set of this process image: /proc's VmHWM starts afresh at exec, while
# getrusage's ru_maxrss is kept across exec (a child of a big pytest worker would report
# the worker's size)
try:
    with open("/proc/self/status") as status:
        hwm = [line for line in status if line.startswith("VmHWM:")][0]
    result["maxrss_mb"] = int(hwm.split()[1]) / 1024
except (OSError, IndexError):
    result["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(result), flush=True)
"""


def run_child(tmp_path: Path, *args: str) -> dict:
    return run_child_script(tmp_path, CHILD_BODY, *args)


def run_child_script(tmp_path: Path, body: str, *args: str) -> dict:
    """Run ``body`` (statements indented by 4, filling ``result``; ``sys.argv[2:]`` are
    ``args``) in a child under the address-space cap; its ``result`` with ``maxrss_mb``."""
    import textwrap

    script = tmp_path / "child.py"
    script.write_text(CHILD_HEAD + textwrap.indent(textwrap.dedent(body), "    ") + CHILD_TAIL)
    proc = subprocess.run(
        [sys.executable, str(script), str(CHILD_ADDRESS_SPACE), *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "SHARDING_STORE_DEBUG": "1"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the child died (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def bomb_in_a_shard(tmp_path: Path, compressor, dtype: str, bomb: bytes) -> tuple[Path, str]:
    """A sharded array of 4 KiB chunks (one chunk per shard), written by us, whose shard
    ``c1`` is replaced by one holding ``bomb`` (the draft shard layout: payloads, then the
    index of (offset, nbytes) little-endian uint64 pairs at the end)."""
    root = tmp_path / "store"
    n = 4 * KIB // np.dtype(dtype).itemsize
    a = create_draft_array(str(root), "a", shape=(4 * n,), chunks=(n,), dtype=dtype, chunks_per_shard=(1,), compressor=compressor)
    a[...] = np.arange(4 * n).astype(dtype)
    shard = next(p for p in root.rglob("c1") if p.is_file())
    shard.write_bytes(bomb + struct.pack("<QQ", 0, len(bomb)))
    return root, shard.relative_to(root).as_posix()


BOMBS = {
    # 4.1 MB inflating to 4000 MiB
    "zlib-4MB-to-4GB": (lambda: numcodecs.Zlib(1), "<f4", lambda: zlib_bomb(4000)),
    # 66 KB announcing (and decoding to) 2 GiB
    "zstd-66KB-to-2GB": (lambda: numcodecs.Zstd(1), "<f4", lambda: zstd_bomb(16384)),
    # 8.4 MB whose header announces (and which decodes to) 1.95 GiB
    "blosc-8MB-to-2GB": (lambda: numcodecs.Blosc("lz4", 5, shuffle=0), "|u1", lambda: blosc_bomb(8000)),
}


@pytest.mark.slow  # memory-capped children
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_bomb_in_a_shard_is_refused_by_open_draft_without_the_memory(tmp_path, name):
    compressor, dtype, bomb = BOMBS[name]
    root, key = bomb_in_a_shard(tmp_path, compressor(), dtype, bomb())
    got = run_child(tmp_path, "read", str(root), "a")
    assert got["outcome"] == "ChunkDecodeError", got
    assert key in got["message"], got  # names the shard and chunk
    assert got["maxrss_mb"] < RSS_LIMIT_MB, got


@pytest.mark.slow  # memory-capped children
@pytest.mark.parametrize("chain", [("zstd",), ("zstd", "crc32c")])
def test_a_bomb_in_a_2023_shard_is_refused_by_open_draft_without_the_memory(tmp_path, chain):
    """The 2023 generation goes through the same bounded path: a June-2023 zarrita array
    (no array->bytes codec, an undeclared CRC32C after each index) whose shard ``a/c/1``
    holds a zstd bomb announcing 2 GiB; with ``crc32c`` after zstd, zstd is a filter
    (bounded by the filters' growth) and the bomb's checksum is valid."""
    from ...gen2023_writer import shard_blob, write_2023

    root = tmp_path / "store"
    n = 1024
    write_2023(root, "a", np.arange(4 * n, dtype="<f4"), chunks=(n,), cps=(1,), b2b=chain, index="hidden", spelling="none")
    payload = zstd_bomb(16384)
    if "crc32c" in chain:
        import crc32c

        payload += crc32c.crc32c(payload).to_bytes(4, "little")
    (root / "a/c/1").write_bytes(shard_blob({0: payload}, 1, hidden_crc=True))
    got = run_child(tmp_path, "read", str(root), "a")
    assert got["outcome"] == "ChunkDecodeError", got
    assert "a/c/1" in got["message"], got
    assert got["maxrss_mb"] < RSS_LIMIT_MB, got


@pytest.mark.slow  # memory-capped children
@pytest.mark.parametrize("name", ["zlib-4MB-to-4GB", "zstd-66KB-to-2GB"])
def test_the_lost_transformer_probe_of_info_decodes_a_bomb_within_bounds(tmp_path, name):
    """``info`` on an unsharded array whose first object looks like a shard (a payload, then
    an index pointing at it) decodes that payload to test the guess: bounded too."""
    compressor, dtype, bomb = BOMBS[name]
    root = tmp_path / "store"
    n = 4 * KIB // np.dtype(dtype).itemsize
    a = create_draft_array(str(root), "a", shape=(4 * n,), chunks=(n,), dtype=dtype, compressor=compressor())
    a[...] = np.arange(4 * n).astype(dtype)
    first = next(p for p in root.rglob("c0") if p.is_file())
    payload = bomb()
    first.write_bytes(payload + struct.pack("<QQ", 0, len(payload)))
    got = run_child(tmp_path, "info", str(root))
    assert got["outcome"] == "info" and got.get("exit") in (0, None), got
    assert got["maxrss_mb"] < RSS_LIMIT_MB, got


# --------------------------------------------------------------------------- each codec, in process


def _meta(compressor, chunks=(1024,), dtype="<f4", filters=None):
    from sharding_store.formats import draft_metadata as dm

    return dm.draft_array_document(dm.DraftArraySpec(
        path="a", shape=chunks, chunks=chunks, dtype=dtype, compressor=compressor, fill_value=0, order="C",
        separator="/", filters=filters, attributes=None, chunks_per_shard=None,
    ))


def _lz4_bomb(nbytes: int) -> bytes:
    return numcodecs.LZ4().encode(bytes(nbytes))


def _peak_while(fn) -> int:
    """Peak bytes allocated through Python's allocators while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


SMALL_BOMBS = {
    # (compressor, payload decoding to 32 MiB): each must be refused for a 4 KiB chunk
    "zlib": (numcodecs.Zlib(1), lambda: zlib_bomb(32)),
    "gzip": (numcodecs.GZip(1), lambda: numcodecs.GZip(9).encode(bytes(32 * MIB))),
    "bz2": (numcodecs.BZ2(9), lambda: numcodecs.BZ2(9).encode(bytes(32 * MIB))),
    "lzma": (numcodecs.LZMA(), lambda: numcodecs.LZMA().encode(bytes(32 * MIB))),
    "zstd": (numcodecs.Zstd(1), lambda: zstd_bomb(256)),
    "zstd-without-content-size": (numcodecs.Zstd(1), lambda: zstd_bomb(256, content_size=False)),
    "zstd-second-frame": (numcodecs.Zstd(1), lambda: numcodecs.Zstd(1).encode(bytes(4 * KIB)) + zstd_bomb(256)),
    "blosc": (numcodecs.Blosc("lz4", 5, shuffle=0), lambda: blosc_bomb(128)),
    "lz4": (numcodecs.LZ4(), lambda: _lz4_bomb(32 * MIB)),
}


@pytest.fixture(scope="module")
def small_bombs():
    return {name: (comp, make()) for name, (comp, make) in SMALL_BOMBS.items()}


@pytest.mark.parametrize("name", sorted(SMALL_BOMBS))
def test_every_codec_refuses_a_payload_larger_than_its_chunk_before_allocating_it(small_bombs, name):
    """The reference decode (``decode_chunk_payload``, as verify, migrate and inspect call it)
    refuses each bomb naming the key, having allocated a fraction of what it inflates to."""
    from sharding_store.codec.chunk_codec import decode_chunk_payload

    comp, payload = small_bombs[name]
    meta = _meta(comp)

    def refused():
        with pytest.raises(ChunkDecodeError, match="data/root/a/c7") as e:
            decode_chunk_payload(meta, payload, key="data/root/a/c7")
        assert e.value.key == "data/root/a/c7"

    # 32 MiB would have been decoded; lzma's decoder state alone is its 8 MiB dictionary
    assert _peak_while(refused) < 12 * MIB, name


@pytest.mark.parametrize("native", [True, False], ids=["native", "numcodecs"])
@pytest.mark.parametrize("name", sorted(SMALL_BOMBS))
def test_every_decode_path_refuses_a_bomb_before_allocating_it(small_bombs, name, native):
    """The same through every entry of the codec interface, with and without native code."""
    from sharding_store.codec.chunk_codec import ChunkCodec, decode, using_native

    comp, payload = small_bombs[name]
    with using_native(native):
        meta = _meta(comp)
        codec = ChunkCodec(meta)
        row = np.empty(4 * KIB, np.uint8)
        buf = np.frombuffer(payload, np.uint8)
        for attempt in (
            lambda: decode(meta, payload, key="data/root/a/c7", out=np.empty(1024, "<f4")),
            lambda: codec.decode_into(payload, row, key="data/root/a/c7"),
            lambda: codec.decode_into(memoryview(payload), row.ctypes.data, key="data/root/a/c7"),
            lambda: codec.decode_many(buf, buf.ctypes.data, [0], [0], [len(payload)], row.ctypes.data,
                                      key_of=lambda i: "data/root/a/c7"),
        ):
            def refused(attempt=attempt):
                with pytest.raises(ChunkDecodeError, match="data/root/a/c7") as e:
                    attempt()
                assert e.value.key == "data/root/a/c7"

            assert _peak_while(refused) < 12 * MIB, name


def test_a_pipeline_with_filters_bounds_the_compressor_by_the_filters_growth():
    """With filters the compressor's output may exceed the chunk (a filter may widen items):
    bounded by FILTER_GROWTH times the chunk, so a bomb is still refused, and a legitimate
    widening filter still decodes."""
    from sharding_store.codec.chunk_codec import FILTER_GROWTH, decode, encode

    meta = _meta(numcodecs.Zlib(1), dtype="|u1", chunks=(4096,), filters=[numcodecs.AsType("<f8", "|u1")])
    chunk = (np.arange(4096) % 251).astype("|u1")
    assert np.array_equal(decode(meta, encode(meta, chunk)), chunk)  # 8x wider in between: fine
    assert FILTER_GROWTH * 4096 < 32 * MIB
    with pytest.raises(ChunkDecodeError, match="c0.*compressor 'zlib'.*more than"):
        decode(meta, zlib_bomb(32), key="c0")


BOUNDARY_CODECS = [
    numcodecs.Zlib(1), numcodecs.GZip(1), numcodecs.BZ2(1), numcodecs.LZMA(), numcodecs.LZ4(),
    numcodecs.Zstd(1), numcodecs.Blosc("lz4", 5, shuffle=1), numcodecs.Blosc("zstd", 1, shuffle=2),
]


@pytest.mark.parametrize("native", [True, False], ids=["native", "numcodecs"])
@pytest.mark.parametrize("comp", BOUNDARY_CODECS, ids=repr)
def test_a_payload_of_exactly_one_chunk_decodes_and_one_byte_more_is_refused(comp, native):
    from sharding_store.codec.chunk_codec import decode, using_native

    with using_native(native):
        meta = _meta(comp, chunks=(64 * KIB,), dtype="|u1")
        data = np.random.default_rng(1).integers(0, 4, 64 * KIB, dtype=np.uint8)
        assert np.array_equal(decode(meta, comp.encode(data)), data)
        with pytest.raises(ChunkDecodeError, match=r"c9: .*(more than the 65536|decoded chunk is 65537)"):
            decode(meta, comp.encode(np.append(data, np.uint8(1))), key="c9")


def _truncated_blosc():
    comp = numcodecs.Blosc("lz4", 5, shuffle=1)
    payload = comp.encode(np.random.default_rng(0).random(1024).astype("<f4"))
    return _meta(comp), [payload[:cut] for cut in (len(payload) - 1, len(payload) // 2, 17, 16, 15, 13, 1)]


def test_a_truncated_blosc_payload_is_never_handed_to_blosc():
    """blosc 1 trusts the compressed size in its header: a payload shorter than that would be
    read past its end (numcodecs decodes it, from whatever memory follows). Refused,
    naming the key."""
    from sharding_store.codec.chunk_codec import decode_chunk_payload

    meta, cuts = _truncated_blosc()
    for payload in cuts:
        with pytest.raises(ChunkDecodeError, match="c3"):
            decode_chunk_payload(meta, payload, key="c3")


@pytest.mark.parametrize("native", [True, False], ids=["native", "numcodecs"])
def test_a_truncated_blosc_payload_is_refused_by_every_decode_path(native):
    from sharding_store.codec.chunk_codec import ChunkCodec, decode, using_native

    with using_native(native):
        meta, cuts = _truncated_blosc()
        codec = ChunkCodec(meta)
        for payload in cuts:
            with pytest.raises(ChunkDecodeError, match="c3"):
                decode(meta, payload, key="c3", out=np.empty(1024, "<f4"))
            with pytest.raises(ChunkDecodeError, match="c3"):
                decode(meta, payload, key="c3")  # the bounded general path (evidence probes take it)
            with pytest.raises(ChunkDecodeError, match="c3"):
                codec.decode_into(payload, np.empty(4096, np.uint8), key="c3")
