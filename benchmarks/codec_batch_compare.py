"""Decoding many small zstd chunks: our binding (``chunk_codec.span_decoder``: numcodecs'
libzstd through ``_native``) against ``zstandard``'s ``multi_decompress_to_buffer``.

A quick script, not a timed unit test; ``zstandard`` is not a dependency of the package:
    pip install --target /tmp/zstd zstandard
    PYTHONPATH=/tmp/zstd .venv/bin/python benchmarks/codec_batch_compare.py
Results and the decision: benchmarks/profile_notes.md, "Codecs behind one door".
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np
import zstandard as zs

from sharding_store.codec.chunk_codec import encode_chunk_payload, span_decoder
from sharding_store.formats import draft_metadata as dm

REPEAT = 5


def meta_for(chunks, dtype):
    return dm.draft_array_document(
        path="a", shape=chunks, chunks=chunks, dtype=dtype, compressor=numcodecs.Zstd(level=1), fill_value=0,
        order="C", separator="/", filters=None, attributes=None, chunks_per_shard=(1,) * len(chunks),
    )


def make_case(n_shards, per_shard, chunks, dtype):
    rng = np.random.default_rng(0)
    meta = meta_for(chunks, dtype)
    n_elem = int(np.prod(chunks))
    shards = []
    for s in range(n_shards):
        parts = []
        for c in range(per_shard):
            base = np.sin(np.arange(n_elem) / 50.0 + s + c) * 1000
            chunk = np.round(base + rng.normal(0, 1, n_elem), 1).astype(dtype).reshape(chunks)
            parts.append(encode_chunk_payload(meta, chunk))
        offs = np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()
        buf = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
        shards.append((buf, offs, [len(p) for p in parts]))
    return meta, shards


def ours(meta, shards, threads):
    decode = span_decoder(meta)
    nb = int(np.prod(meta.chunks)) * meta.dtype.itemsize
    per = len(shards[0][1])
    outs = [np.empty(per * nb, np.uint8) for _ in range(threads)]

    def work(i_part):
        i, part = i_part
        out = outs[i]
        for buf, offs, sizes in part:
            failed = decode(buf, buf.ctypes.data, list(range(per)), offs, sizes, out.ctypes.data)
            assert not failed

    parts = [(i, shards[i::threads]) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: None, range(threads)))  # threads started outside the timing
        t = time.perf_counter()
        list(pool.map(work, parts))
        return time.perf_counter() - t


def zstandard_multi(meta, shards, threads, copy_out=True):
    nb = int(np.prod(meta.chunks)) * meta.dtype.itemsize
    per = len(shards[0][1])
    dctx = zs.ZstdDecompressor()
    # one BufferWithSegments per shard (frames lie in the shard buffer), all shards in one call
    segs = [zs.BufferWithSegments(buf.tobytes(), np.array([(o, n) for o, n in zip(offs, sizes)], dtype="<u8").tobytes())
            for buf, offs, sizes in shards]
    coll = zs.BufferWithSegmentsCollection(*segs)
    out = np.empty(len(shards) * per * nb, np.uint8)
    t = time.perf_counter()
    res = dctx.multi_decompress_to_buffer(coll, threads=threads)
    if copy_out:
        # the result is zstandard's own buffer(s): landing it in our scratch rows is one more copy
        pos = 0
        for i in range(len(res)):
            b = res[i]
            mv = memoryview(b)
            out[pos:pos + len(mv)] = np.frombuffer(mv, np.uint8)
            pos += len(mv)
    return time.perf_counter() - t


def zstandard_multi_per_shard(meta, shards, threads):
    """multi_decompress_to_buffer called per shard (how a whole-shard read would call it)."""
    nb = int(np.prod(meta.chunks)) * meta.dtype.itemsize
    per = len(shards[0][1])
    dctx_local = [zs.ZstdDecompressor() for _ in range(threads)]
    segs = [(buf.tobytes(), np.array([(o, n) for o, n in zip(offs, sizes_)], dtype="<u8").tobytes())
            for buf, offs, sizes_ in shards]
    outs = [np.empty(per * nb, np.uint8) for _ in range(threads)]

    def work(i):
        d = dctx_local[i]
        out = outs[i]
        for data, seg in segs[i::threads]:
            res = d.multi_decompress_to_buffer(zs.BufferWithSegments(data, seg), threads=1)
            out[:] = np.frombuffer(memoryview(res[0]) if len(res) == 1 else b"".join(bytes(res[k]) for k in range(len(res))), np.uint8)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: None, range(threads)))
        t = time.perf_counter()
        list(pool.map(work, range(threads)))
        return time.perf_counter() - t


def best(fn, *a, **k):
    """(best wall seconds, best CPU seconds of the process) over REPEAT runs."""
    walls, cpus = [], []
    for _ in range(REPEAT):
        c = time.process_time()
        walls.append(fn(*a, **k))
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def main():
    print(f"zstandard {zs.__version__} (libzstd {zs.ZSTD_VERSION}), numcodecs {numcodecs.__version__}; best of {REPEAT}")
    cases = [
        ("512 shards x 16 chunks of 64x64 float32", 512, 16, (64, 64), "<f4"),
        ("16384 chunks of 4 KiB (1024 shards x 16, 32x32 float32)", 1024, 16, (32, 32), "<f4"),
    ]
    for name, n, per, chunks, dtype in cases:
        meta, shards = make_case(n, per, chunks, dtype)
        mib = n * per * int(np.prod(chunks)) * 4 / 2**20
        print(f"\n{name}: {mib:.0f} MiB decoded, {sum(len(b[0]) for b in shards) / 2**20:.1f} MiB compressed")
        for threads in (1, 2):
            a = best(ours, meta, shards, threads)
            b = best(zstandard_multi, meta, shards, threads)
            b0 = best(zstandard_multi, meta, shards, threads, copy_out=False)
            c = best(zstandard_multi_per_shard, meta, shards, threads)
            f = lambda x: f"{x[0] * 1e3:6.1f} ms (cpu {x[1] * 1e3:6.1f})"  # noqa: E731
            print(f"  threads={threads}: ours (span decoder) {f(a)} | zstandard, one call for all {f(b)}, "
                  f"same without copying out {f(b0)} | zstandard, one call per shard {f(c)}")


if __name__ == "__main__":
    sys.exit(main())
