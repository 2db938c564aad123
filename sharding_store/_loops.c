/*
 * Loops over the chunks of one shard, for sharding_store/_native.py (loaded with ctypes,
 * which releases the GIL for the whole call: once per shard instead of once per chunk).
 *
 * No Python API and no codec library is linked in: the decompression functions are
 * passed in as pointers, taken by _native.py from the libraries inside numcodecs'
 * extension modules (the same libzstd / c-blosc 1 numcodecs decodes with), so the bytes
 * are numcodecs' bytes and there is one copy of each library in the process.
 *
 * Every function decodes chunk i of a read buffer, buf[offsets[i] : offsets[i] + sizes[i]]
 * (the caller has checked that these ranges lie inside the buffer), into row rows[i] of
 * the rows at dst, each exactly `nbytes` long (one decoded chunk). Before decoding, the
 * sizes a payload announces must be exactly this chunk's and this payload's; the output
 * is bounded by the row (the libraries never write more than the size they are given).
 * failed[i] is set to 1 for a chunk not decoded (the caller's reference path then decides
 * and names the error), 0 otherwise; the return value counts the failures.
 *
 * Built by setup.py as an optional extension (a plain shared library, no module init);
 * without it, _native.loops() is None and the per-chunk ctypes path is used.
 */

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SS_EXPORT __declspec(dllexport)
#else
#define SS_EXPORT __attribute__((visibility("default")))
#endif

/* the interface generation; _native.py refuses a library that reports another */
#define SS_LOOPS_ABI 1

typedef int (*blosc_decompress_ctx_t)(const void *src, void *dest, size_t destsize, int nthreads);
typedef unsigned long long (*zstd_content_size_t)(const void *src, size_t size);
typedef size_t (*zstd_frame_size_t)(const void *src, size_t size);
typedef size_t (*zstd_decompress_dctx_t)(void *dctx, void *dst, size_t dst_capacity, const void *src, size_t size);

SS_EXPORT int ss_loops_abi(void) { return SS_LOOPS_ABI; }

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * c-blosc 1 buffers: the 16-byte header (version, versionlz, flags, typesize, nbytes,
 * blocksize, cbytes) must announce `nbytes` decoded bytes and exactly `sizes[i]`
 * compressed ones (blosc 1 trusts its cbytes: a truncated payload is never handed to it);
 * a stored (memcpyed) buffer must hold its bytes. blosc_decompress_ctx(src, dst, nbytes,
 * 1 thread) must then return `nbytes`.
 */
SS_EXPORT int64_t ss_blosc_rows(void *decompress_ctx, const uint8_t *buf, const int64_t *rows,
                                const int64_t *offsets, const int64_t *sizes, int64_t n, uint8_t *dst,
                                int64_t nbytes, uint8_t *failed) {
    blosc_decompress_ctx_t decompress = (blosc_decompress_ctx_t)decompress_ctx;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *src = buf + offsets[i];
        int64_t size = sizes[i];
        int ok = nbytes > 0 && nbytes <= INT32_MAX && size >= 16 && le32(src + 4) == (uint64_t)nbytes &&
                 le32(src + 12) == (uint64_t)size;
        if (ok && (src[2] & 0x2) && size < nbytes + 16) ok = 0;
        if (ok) ok = decompress(src, dst + rows[i] * nbytes, (size_t)nbytes, 1) == (int)nbytes;
        failed[i] = (uint8_t)!ok;
        bad += !ok;
    }
    return bad;
}

/*
 * zstd: each payload must be exactly one frame (ZSTD_findFrameCompressedSize == its
 * length) announcing `nbytes` (ZSTD_getFrameContentSize), decoded with the caller's
 * context into a destination of `nbytes` (libzstd refuses a frame whose output differs
 * from what it announces, and never writes past the destination).
 */
SS_EXPORT int64_t ss_zstd_rows(void *content_size, void *frame_size, void *decompress_dctx, void *dctx,
                               const uint8_t *buf, const int64_t *rows, const int64_t *offsets,
                               const int64_t *sizes, int64_t n, uint8_t *dst, int64_t nbytes, uint8_t *failed) {
    zstd_content_size_t announced = (zstd_content_size_t)content_size;
    zstd_frame_size_t frame = (zstd_frame_size_t)frame_size;
    zstd_decompress_dctx_t decompress = (zstd_decompress_dctx_t)decompress_dctx;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *src = buf + offsets[i];
        size_t size = (size_t)sizes[i];
        int ok = nbytes > 0 && sizes[i] > 0 && announced(src, size) == (unsigned long long)nbytes &&
                 frame(src, size) == size;
        if (ok) ok = decompress(dctx, dst + rows[i] * nbytes, (size_t)nbytes, src, size) == (size_t)nbytes;
        failed[i] = (uint8_t)!ok;
        bad += !ok;
    }
    return bad;
}
