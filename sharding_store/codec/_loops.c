/*
 * Loops over the chunks of one shard, for sharding_store/codec/_native.py (loaded with ctypes,
 * which releases the GIL for the whole call: once per shard instead of once per chunk).
 *
 * No Python API and no codec library is linked in: the decompression functions are
 * passed in as pointers, taken by _native.py from the libraries inside numcodecs'
 * extension modules (the same libzstd / c-blosc 1 numcodecs decodes with), so the bytes
 * are numcodecs' bytes and there is one copy of each library in the process.
 *
 * ss_blosc_rows / ss_zstd_rows decode chunk i of a read buffer, buf[offsets[i] : offsets[i] +
 * sizes[i]] (the caller has checked that these ranges lie inside the buffer), into row rows[i]
 * of the rows at dst, each exactly `nbytes` long (one decoded chunk). ss_shard_scatter (at the
 * end) does the same for every chunk of a whole draft shard, checking its index itself, and
 * copies each decoded chunk to its place in the output array. Before decoding, the
 * sizes a payload announces must be exactly this chunk's and this payload's; the output
 * is bounded by the row (the libraries never write more than the size they are given).
 * failed[i] is set to 1 for a chunk not decoded (the caller's reference path then decides
 * and names the error), 0 otherwise; the return value counts the failures.
 *
 * ss_read_tails (POSIX, at the end) reads the index tails of a run of files in one directory for
 * a virtual migration: open, fstat, pread, close and the reference path's lstat per file.
 *
 * Built by setup.py as an optional extension (a plain shared library, no module init);
 * without it, _native.loops() is None and the per-chunk ctypes path is used.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define SS_EXPORT __declspec(dllexport)
#else
#define SS_EXPORT __attribute__((visibility("default")))
#endif

/* the interface generation; _native.py refuses a library that reports another */
#define SS_LOOPS_ABI 3

typedef int (*blosc_decompress_ctx_t)(const void *src, void *dest, size_t destsize, int nthreads);
typedef unsigned long long (*zstd_content_size_t)(const void *src, size_t size);
typedef size_t (*zstd_frame_size_t)(const void *src, size_t size);
typedef size_t (*zstd_decompress_dctx_t)(void *dctx, void *dst, size_t dst_capacity, const void *src, size_t size);

SS_EXPORT int ss_loops_abi(void) { return SS_LOOPS_ABI; }

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* one c-blosc 1 payload of `size` bytes at src into dst (`nbytes`): 1 when decoded, 0 when
 * refused (see ss_blosc_rows for the checks) */
static int blosc_one(blosc_decompress_ctx_t decompress, const uint8_t *src, int64_t size, uint8_t *dst, int64_t nbytes) {
    int ok = nbytes > 0 && nbytes <= INT32_MAX && size >= 16 && le32(src + 4) == (uint64_t)nbytes &&
             le32(src + 12) == (uint64_t)size;
    if (ok && (src[2] & 0x2) && size < nbytes + 16) ok = 0;
    if (ok) ok = decompress(src, dst, (size_t)nbytes, 1) == (int)nbytes;
    return ok;
}

/* one zstd payload (exactly one frame announcing `nbytes`) into dst: 1 when decoded */
static int zstd_one(zstd_content_size_t announced, zstd_frame_size_t frame, zstd_decompress_dctx_t decompress,
                    void *dctx, const uint8_t *src, int64_t size, uint8_t *dst, int64_t nbytes) {
    int ok = nbytes > 0 && size > 0 && announced(src, (size_t)size) == (unsigned long long)nbytes &&
             frame(src, (size_t)size) == (size_t)size;
    if (ok) ok = decompress(dctx, dst, (size_t)nbytes, src, (size_t)size) == (size_t)nbytes;
    return ok;
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
        int ok = blosc_one(decompress, buf + offsets[i], sizes[i], dst + rows[i] * nbytes, nbytes);
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
        int ok = zstd_one(announced, frame, decompress, dctx, buf + offsets[i], sizes[i], dst + rows[i] * nbytes, nbytes);
        failed[i] = (uint8_t)!ok;
        bad += !ok;
    }
    return bad;
}

/* --------------------------------------------------------------------------------------------
 * Whole shards: index check, decode and scatter into the output array in one call.
 */

#define SS_ENTRY 16
#define SS_NONE UINT64_MAX
#define SS_MAX_DIMS 32

static uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/*
 * The draft index (no checksum, at the end: the last 16 * n_entries bytes of an object of
 * `len` bytes) checked as shard_index.entry_lists checks it with payload_start 0: every entry
 * is either both sentinels (absent) or an (offset, nbytes) pair with neither a sentinel,
 * offset + nbytes not overflowing and not past the payload area (len - 16 * n_entries).
 * Overlapping entries are allowed, as there. 0: valid; 1: the caller's reference path must
 * decide (and raise its error naming the key).
 */
SS_EXPORT int64_t ss_check_index(const uint8_t *buf, int64_t len, int64_t n_entries) {
    if (n_entries < 1 || n_entries > (INT64_MAX / SS_ENTRY) || len < n_entries * SS_ENTRY) return 1;
    uint64_t limit = (uint64_t)(len - n_entries * SS_ENTRY);
    const uint8_t *idx = buf + limit;
    for (int64_t e = 0; e < n_entries; e++) {
        uint64_t o = le64(idx + SS_ENTRY * e), s = le64(idx + SS_ENTRY * e + 8);
        if (o == SS_NONE && s == SS_NONE) continue;
        if (o == SS_NONE || s == SS_NONE || o > SS_NONE - s || o + s > limit) return 1;
    }
    return 0;
}

/* copy one n-d block (extents ext[], byte steps sstep[] / dstep[]) of `itemsize`-byte items */
static void copy_block(int nd, const int64_t *ext, const int64_t *sstep, const int64_t *dstep, int64_t itemsize,
                       const uint8_t *src, uint8_t *dst) {
    int64_t pos[SS_MAX_DIMS] = {0};
    int last = nd - 1;
    int64_t n = ext[last], ss = sstep[last], ds = dstep[last];
    int contiguous = ss == itemsize && ds == itemsize;
    for (;;) {
        if (contiguous) {
            memcpy(dst, src, (size_t)(n * itemsize));
        } else if (itemsize == 2) {
            for (int64_t k = 0; k < n; k++) memcpy(dst + k * ds, src + k * ss, 2);
        } else if (itemsize == 4) {
            for (int64_t k = 0; k < n; k++) memcpy(dst + k * ds, src + k * ss, 4);
        } else if (itemsize == 8) {
            for (int64_t k = 0; k < n; k++) memcpy(dst + k * ds, src + k * ss, 8);
        } else {
            for (int64_t k = 0; k < n; k++) memcpy(dst + k * ds, src + k * ss, (size_t)itemsize);
        }
        int d = last - 1;
        for (; d >= 0; d--) {
            src += sstep[d];
            dst += dstep[d];
            if (++pos[d] < ext[d]) break;
            src -= sstep[d] * ext[d];
            dst -= dstep[d] * ext[d];
            pos[d] = 0;
        }
        if (d < 0) return;
    }
}

/*
 * Decode every chunk of one shard read whole (`buf`, `len` bytes: payloads, then the draft
 * index) and copy each into its place in the output array `out` (`out_nbytes` long).
 *
 * codec: 0 uncompressed (a payload must be exactly one chunk), 1 c-blosc 1 (fns[0]:
 * blosc_decompress_ctx), 2 zstd (fns[0..2]: ZSTD_getFrameContentSize,
 * ZSTD_findFrameCompressedSize, ZSTD_decompressDCtx; dctx: this thread's context). The
 * checks of each payload are ss_blosc_rows' / ss_zstd_rows'. Absent chunks take `fill`
 * (one chunk of the fill value). `tmp`: one chunk of scratch (stays in cache between decode
 * and copy).
 *
 * geom (geom_len int64 values, all of them used): ndim, itemsize, nbytes (one chunk), n_entries,
 * then per dimension:
 * chunks_per_shard[nd], touched chunks counts[nd] (the shard's chunks inside the grid,
 * positions 0..counts-1), chunk byte strides cstride[nd] (memory order of a chunk), output
 * byte strides ostride[nd]; then for each dimension d, counts[d] quadruples (start and step
 * inside the chunk, number of elements, start in the output), in elements.
 *
 * Returns 0 when every touched chunk landed; -1 when the index is not valid (ss_check_index);
 * -2 when the geometry does not describe blocks inside the chunk and the output; 1 + i when
 * chunk i (C order of the touched chunks) was not decoded. On any non-zero return the caller
 * handles the whole shard on its reference path (which names the error): the output region
 * of this shard may have been partly written, never anything outside it.
 */
SS_EXPORT int64_t ss_shard_scatter(int64_t codec, void *const *fns, void *dctx, const uint8_t *buf, int64_t len,
                                   const int64_t *geom, int64_t geom_len, const uint8_t *fill, uint8_t *tmp,
                                   uint8_t *out, int64_t out_nbytes) {
    if (geom_len < 4) return -2;
    int64_t nd = geom[0], itemsize = geom[1], nbytes = geom[2], n_entries = geom[3];
    if (nd < 1 || nd > SS_MAX_DIMS || itemsize < 1 || nbytes < itemsize || geom_len < 4 + 4 * nd) return -2;
    const int64_t *cps = geom + 4, *counts = cps + nd, *cstride = counts + nd, *ostride = cstride + nd;
    const int64_t *tables[SS_MAX_DIMS];
    const int64_t *t = ostride + nd;
    int64_t estride[SS_MAX_DIMS], total = 1, entries = 1;
    for (int64_t d = nd - 1; d >= 0; d--) {
        if (counts[d] < 1 || counts[d] > cps[d] || cstride[d] < 0 || ostride[d] < 0) return -2;
        estride[d] = entries;
        entries *= cps[d];
        total *= counts[d];
    }
    if (entries != n_entries) return -2;
    int64_t used = 4 + 4 * nd;
    for (int64_t d = 0; d < nd; d++) {
        tables[d] = t;
        t += 4 * counts[d];
        used += 4 * counts[d];
    }
    if (used != geom_len) return -2;
    if (ss_check_index(buf, len, n_entries)) return -1;
    const uint8_t *idx = buf + (len - n_entries * SS_ENTRY);

    int64_t pos[SS_MAX_DIMS] = {0};
    int64_t ext[SS_MAX_DIMS], sstep[SS_MAX_DIMS];
    for (int64_t i = 0; i < total; i++) {
        /* the block of this chunk: inside the chunk and inside the output, or refused */
        int64_t entry = 0, soff = 0, doff = 0, slast = 0, dlast = 0;
        for (int64_t d = 0; d < nd; d++) {
            const int64_t *q = tables[d] + 4 * pos[d];
            int64_t start = q[0], step = q[1], n = q[2], ostart = q[3];
            if (start < 0 || step < 1 || n < 1 || ostart < 0) return -2;
            entry += pos[d] * estride[d];
            ext[d] = n;
            sstep[d] = step * cstride[d];
            soff += start * cstride[d];
            slast += (start + (n - 1) * step) * cstride[d];
            doff += ostart * ostride[d];
            dlast += (ostart + n - 1) * ostride[d];
        }
        if (slast + itemsize > nbytes || dlast + itemsize > out_nbytes) return -2;

        uint64_t o = le64(idx + SS_ENTRY * entry), s = le64(idx + SS_ENTRY * entry + 8);
        const uint8_t *src;
        if (o == SS_NONE) {
            src = fill;
        } else if (codec == 0) {
            if (s != (uint64_t)nbytes) return 1 + i;
            src = buf + o;
        } else if (codec == 1) {
            if (!blosc_one((blosc_decompress_ctx_t)fns[0], buf + o, (int64_t)s, tmp, nbytes)) return 1 + i;
            src = tmp;
        } else if (codec == 2) {
            if (!zstd_one((zstd_content_size_t)fns[0], (zstd_frame_size_t)fns[1], (zstd_decompress_dctx_t)fns[2], dctx,
                          buf + o, (int64_t)s, tmp, nbytes))
                return 1 + i;
            src = tmp;
        } else {
            return -2;
        }
        copy_block((int)nd, ext, sstep, ostride, itemsize, src + soff, out + doff);

        for (int64_t d = nd - 1; d >= 0; d--) {
            if (++pos[d] < counts[d]) break;
            pos[d] = 0;
        }
    }
    return 0;
}

/* --------------------------------------------------------------------------------------------
 * The tails of a run of files in one directory (stores/local.py's get_tails, batched).
 */
#if !defined(_WIN32)
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#if defined(__APPLE__)
#define st_mtim st_mtimespec
#endif
#ifndef O_NOFOLLOW
#define O_NOFOLLOW 0
#endif
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

/* what meta[SS_META * i] holds for a file the caller must read its own way */
#define SS_TAIL_OTHER UINT64_MAX
#define SS_META 6

static int64_t mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + (int64_t)st->st_mtim.tv_nsec;
}

/*
 * For each of the `n` NUL-terminated names back to back at `names`, in the directory open as
 * `dir_fd`: openat(O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), fstat, pread of its last
 * min(size, tail_nbytes) bytes into tails + i * tail_nbytes, close -- what LocalInner._tails
 * does per key. meta[6 i .. 6 i + 5] = (bytes read, size, st_dev, st_ino, st_mtime_ns,
 * vouched). Anything unusual leaves meta[6 i] = SS_TAIL_OTHER for the caller's own path to
 * decide and name: the open fails (missing, a link, no permission), not a regular file (a
 * FIFO, a directory), a read fails or comes short, an mtime before 1970.
 *
 * `real_dir` (may be NULL): the directory's resolved path. Then each file read is also
 * lstat'ed at real_dir/name, the path a reference names: vouched = 1 when that is a regular
 * file (no link) with the descriptor's device, inode, mtime and size, else 0 (the caller's
 * reference path then checks it its own way). Returns the number of files read.
 */
SS_EXPORT int64_t ss_read_tails(int dir_fd, const char *names, int64_t n, int64_t tail_nbytes,
                                const char *real_dir, uint8_t *tails, uint64_t *meta) {
    char path[PATH_MAX];
    size_t dir_len = real_dir != NULL ? strlen(real_dir) : 0;
    int64_t done = 0;
    const char *name = names;
    for (int64_t i = 0; i < n; i++) {
        size_t name_len = strlen(name);
        uint64_t *m = meta + SS_META * i;
        m[0] = SS_TAIL_OTHER;
        m[5] = 0;
        int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0 && mtime_ns(&st) >= 0) {
                int64_t size = (int64_t)st.st_size;
                int64_t want = size < tail_nbytes ? size : tail_nbytes, got = 0;
                uint8_t *dst = tails + i * tail_nbytes;
                while (got < want) {
                    ssize_t r = pread(fd, dst + got, (size_t)(want - got), (off_t)(size - want + got));
                    if (r < 0 && errno == EINTR) continue;
                    if (r <= 0) break;
                    got += r;
                }
                if (got == want) {
                    m[0] = (uint64_t)got;
                    m[1] = (uint64_t)size;
                    m[2] = (uint64_t)st.st_dev;
                    m[3] = (uint64_t)st.st_ino;
                    m[4] = (uint64_t)mtime_ns(&st);
                    done++;
                    struct stat at;
                    if (real_dir != NULL && dir_len + 1 + name_len < sizeof(path)) {
                        memcpy(path, real_dir, dir_len);
                        path[dir_len] = '/';
                        memcpy(path + dir_len + 1, name, name_len + 1);
                        m[5] = lstat(path, &at) == 0 && S_ISREG(at.st_mode) && at.st_dev == st.st_dev &&
                               at.st_ino == st.st_ino && at.st_size == st.st_size && mtime_ns(&at) == mtime_ns(&st);
                    }
                }
            }
            close(fd);
        }
        name += name_len + 1;
    }
    return done;
}

/*
 * The entries of the directory open as `dir_fd` (read through a duplicate, from its offset, as
 * os.scandir(fd) reads: the caller's own descriptor, moved to the end), "."
 * and ".." left out, as stores/local_fd.scan_sized lists them: each name NUL-terminated into
 * `names` (`names_cap` bytes; *names_used: how many were written), its kind into kinds[i] ('f' a regular file, 'd' a directory,
 * 'l' a link, 'o' anything else; from d_type, else an fstatat that does not follow) and, for
 * a regular file when `sizes`, its size (fstatat, not following) into sizes_out[i], else -1
 * (also when it was removed meanwhile). Returns the number of entries; -1 when the
 * directory could not be opened for reading (nothing read: the caller's own way may try);
 * -3 when reading it failed part way (errno set: the caller raises); -2 when `names` or the `cap` entries are too small (the offset
 * is put back where it was: the caller asks again with more room).
 */
SS_EXPORT int64_t ss_list_dir(int dir_fd, int sizes, char *names, int64_t names_cap, uint8_t *kinds,
                              int64_t *sizes_out, int64_t cap, int64_t *names_used) {
    int fd = dup(dir_fd);
    if (fd < 0) return -1;
    off_t start = lseek(fd, 0, SEEK_CUR);
    DIR *dir = fdopendir(fd);
    if (dir == NULL) {
        close(fd);
        return -1;
    }
    int64_t n = 0, used = 0, result = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(dir)) != NULL) {
        const char *name = e->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
        size_t len = strlen(name);
        if (n >= cap || used + (int64_t)len + 1 > names_cap) {
            result = -2;
            break;
        }
        struct stat st;
        int have = 0;
        uint8_t kind;
        switch (e->d_type) {
            case DT_REG: kind = 'f'; break;
            case DT_DIR: kind = 'd'; break;
            case DT_LNK: kind = 'l'; break;
            case DT_UNKNOWN:
                if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
                    kind = 'o';
                    break;
                }
                have = 1;
                kind = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'o';
                break;
            default: kind = 'o';
        }
        int64_t size = -1;
        if (kind == 'f' && sizes) {
            if (have || fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) == 0) size = (int64_t)st.st_size;
        }
        memcpy(names + used, name, len + 1);
        used += (int64_t)len + 1;
        kinds[n] = kind;
        sizes_out[n] = size;
        n++;
        errno = 0;
    }
    if (result == 0 && errno != 0) result = -3;
    if (result == -2 && (start < 0 || lseek(dirfd(dir), start, SEEK_SET) < 0)) result = -3;  /* asked again from there */
    *names_used = used;
    int saved = errno;
    closedir(dir);
    errno = saved;
    return result < 0 ? result : n;
}
#endif
