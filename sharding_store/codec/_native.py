"""The one door to compiled code called through ``ctypes``.

Everything in the package that calls into a C library without a Python wrapper goes
through this module, so that what is bound, to which version, and what happens when it
is missing is decided in one place:

* **libzstd and libblosc inside numcodecs' own extension modules** (``numcodecs.zstd`` and
  ``numcodecs.blosc`` export the libraries' symbols). Calling their context functions
  directly lets a chunk be decoded straight from a read buffer into its row of a scratch
  buffer, with reused per-thread contexts and the GIL released only where that pays
  (see :data:`HOLD_GIL_BELOW`); numcodecs' Python wrappers cost more than the work on
  chunks of a few KiB. Being numcodecs' own copies of the libraries, the bytes are
  numcodecs' bytes; :mod:`.chunk_codec` additionally checks each encoder against
  numcodecs once per configuration, and the property tests compare every path.
* **libc's** ``madvise`` (Linux: a run of shards' part of a big read output is faulted in at
  once with ``MADV_POPULATE_WRITE``, with huge pages while they come fast, see
  ``array._Pages``) and
  ``memcmp`` (``verify`` compares copied shards block by block without the GIL).
* **our own loops**, ``sharding_store/codec/_loops.c``, built by ``setup.py`` into the plain
  shared library ``sharding_store/codec/_loops.so`` (``_loops.dll`` on Windows; no interpreter
  tag: it does not use Python's API) beside this file (:func:`loops_path` tells where it
  was found; a build by an earlier setup.py, ``_loops<EXTENSION_SUFFIX>``, is found too). A plain shared library,
  no Python API: it decodes a whole shard's chunks in one call, calling the libzstd /
  libblosc functions above through pointers, so the GIL is released once per shard instead
  of once per chunk (and, for a draft shard read whole, checks its index and copies each
  decoded chunk straight to its place in the output array: ``ss_shard_scatter``) (neither
  c-blosc 1 nor libzstd has a call over many independent
  buffers; see benchmarks/profile_notes.md). Optional: without a C compiler at install
  time it is absent and callers take the per-chunk path. The same library reads the index
  tails of a run of files in one directory for the local store (``ss_read_tails``:
  :func:`read_tails`; open, ``fstat``, ``pread``, close and the reference path's ``lstat`` per
  file, the GIL released once a run), bound on its own (:func:`tail_reader`: no numcodecs).

Each binding is made once, on first use (importing this module loads nothing of numcodecs),
and checked: the library's version must be the one
numcodecs reports for itself (so a symbol of another copy of the library can never be
picked up) and of the API generation the signatures below were written for (zstd 1.4 to
1.x, c-blosc 1.6 to 1.x). When a library, a symbol or the expected version is missing,
or when native code is switched off with :func:`set_enabled` (tests compare both
paths that way), the accessor returns None and the caller takes the numcodecs / pure
Python path, which is the reference.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import mmap
import os
import sys
import threading
from array import array as _array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import _numcodecs_adapter

__all__ = [
    "HOLD_GIL_BELOW",
    "Library",
    "Loops",
    "blosc",
    "blosc_for",
    "enabled",
    "loops",
    "loops_path",
    "madvise",
    "memcmp",
    "memmove",
    "pointer_table",
    "list_dir",
    "read_tails",
    "tail_reader",
    "rename_exchange",
    "report",
    "row_at",
    "address_of",
    "align_skip",
    "batch_table",
    "data_address",
    "madvise_array",
    "same_bytes",
    "Source",
    "set_enabled",
    "string_at",
    "switches",
    "thread_buffer",
    "using",
    "using_loops",
    "zstd",
    "zstd_cctx",
    "zstd_dctx",
]

#: chunks of up to this many decoded bytes are (de)compressed without releasing the GIL:
#: for calls of a few microseconds, releasing and re-taking it costs more than it buys
#: (measured: benchmarks/profile_notes.md, "1 write" and the read path)
HOLD_GIL_BELOW = 64 * 2**10

#: the API generations the signatures below were written for: [low, high)
ZSTD_VERSIONS = (10400, 20000)  # ZSTD_compress2 / ZSTD_CCtx_setParameter: 1.4.0 on
BLOSC_VERSIONS = ((1, 6), (2, 0))  # blosc_*_ctx: c-blosc 1.6 on; c-blosc 2 has other calls

_ZSTD_C_LEVEL, _ZSTD_C_CHECKSUM = 100, 201  # ZSTD_c_compressionLevel, ZSTD_c_checksumFlag


@dataclass(frozen=True)
class Library:
    """One bound library: the same functions called two ways.

    ``released`` (``ctypes.CDLL``) releases the GIL for each call, for work long enough to
    run in parallel on the thread pool; ``held`` (``ctypes.PyDLL``) keeps it, for header
    reads and small chunks where the release/re-take costs more than the call.
    """

    name: str
    version: str
    released: Any
    held: Any


def _load_both_ways(path: str, sigs: dict[str, tuple[Any, Any]]) -> tuple[Any, Any]:
    """The library at ``path`` loaded as ``ctypes.CDLL`` and as ``ctypes.PyDLL`` (see
    :class:`Library`), each with the ``(return type, argument types)`` of ``sigs`` set on its
    functions (a missing function raises ``AttributeError``)."""
    libs = []
    for dll in (ctypes.CDLL, ctypes.PyDLL):
        lib = dll(path)
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        libs.append(lib)
    return libs[0], libs[1]


def _bind_zstd() -> Library | None:
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    import numcodecs.zstd as nz

    size_t, vp = ctypes.c_size_t, ctypes.c_void_p
    sigs = {
        "ZSTD_versionNumber": (ctypes.c_uint, []),
        "ZSTD_createDCtx": (vp, []),
        "ZSTD_freeDCtx": (size_t, [vp]),
        # sources as void*: bytes, or the integer address of bytes inside a read buffer
        "ZSTD_decompressDCtx": (size_t, [vp, vp, size_t, vp, size_t]),
        "ZSTD_getFrameContentSize": (ctypes.c_ulonglong, [vp, size_t]),
        "ZSTD_findFrameCompressedSize": (size_t, [vp, size_t]),
        "ZSTD_createCCtx": (vp, []),
        "ZSTD_freeCCtx": (size_t, [vp]),
        "ZSTD_CCtx_setParameter": (size_t, [vp, ctypes.c_int, ctypes.c_int]),
        "ZSTD_compress2": (size_t, [vp, vp, size_t, vp, size_t]),
        "ZSTD_compressBound": (size_t, [size_t]),
        "ZSTD_isError": (ctypes.c_uint, [size_t]),
        "ZSTD_getErrorCode": (ctypes.c_int, [size_t]),
        "ZSTD_getErrorName": (ctypes.c_char_p, [size_t]),
    }
    libs = _load_both_ways(nz.__file__, sigs)
    version = libs[0].ZSTD_versionNumber()
    if version != nz.VERSION_NUMBER or not ZSTD_VERSIONS[0] <= version < ZSTD_VERSIONS[1]:
        return None
    return Library("zstd", f"{version // 10000}.{version // 100 % 100}.{version % 100}", libs[0], libs[1])


def _bind_blosc() -> Library | None:
    _numcodecs_adapter.load()  # numcodecs without its entry-point scan
    import numcodecs.blosc as nb

    size_t, vp = ctypes.c_size_t, ctypes.c_void_p
    sigs = {
        "blosc_get_version_string": (ctypes.c_char_p, []),
        # (src, dest, destsize, numinternalthreads) -> decompressed bytes, <= 0 on error
        "blosc_decompress_ctx": (ctypes.c_int, [vp, vp, size_t, ctypes.c_int]),
        # (clevel, doshuffle, typesize, nbytes, src, dest, destsize, compressor, blocksize, nthreads)
        "blosc_compress_ctx": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, size_t, size_t, vp, vp, size_t, ctypes.c_char_p, size_t,
                                              ctypes.c_int]),
    }
    libs = _load_both_ways(nb.__file__, sigs)
    version = libs[0].blosc_get_version_string().decode("ascii", "replace")
    if version != nb.VERSION_STRING or not BLOSC_VERSIONS[0] <= _major_minor(version) < BLOSC_VERSIONS[1]:
        return None
    return Library("blosc", version, libs[0], libs[1])


#: the interface generation of _loops.c this module was written for (``ss_loops_abi()``)
LOOPS_ABI = 3


@dataclass(frozen=True)
class Loops:
    """Our batch loops (``_loops.c``), bound to this process's libzstd / libblosc.

    ``blosc_rows`` / ``zstd_rows`` take, after the codec's function pointers: the read
    buffer's address, three int64 arrays (rows, offsets, sizes), their length, the rows'
    address, the row size and a uint8 array of failure flags; they return the number of
    chunks not decoded. Called through ``ctypes.CDLL``: the GIL is released for the call.

    ``shard_scatter(codec, fns, dctx, buf, len, geom, geom_len, fill, tmp, out, out_nbytes)`` checks a
    whole draft shard's index, decodes its chunks and copies each into the output array
    (GIL released; see ``_loops.c`` for ``geom``); 0 when every chunk landed, anything else
    sends the shard to the reference path. ``check_index(buf, len, n_entries)`` checks a
    draft index as :func:`~sharding_store.formats.shard_index.entry_lists` does (0: valid), through
    ``ctypes.PyDLL`` (a loop over a few entries: the GIL is kept).
    """

    path: str
    blosc_rows: Any  # None without libblosc
    zstd_rows: Any  # None without libzstd
    #: function pointers handed to the loops (addresses inside numcodecs' libraries)
    blosc_decompress: int | None
    zstd_functions: tuple[int, int, int] | None  # content size, frame size, decompressDCtx
    shard_scatter: Any = None
    check_index: Any = None


def _loops_path() -> str | None:
    """Where setup.py put ``_loops.c``'s library (beside this module), or None. Its own
    name first (``_loops.so``), then an extension-style name left by an earlier setup.py
    (:data:`LOOPS_ABI` refuses it when it is out of date)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in (".dll" if sys.platform == "win32" else ".so", *importlib.machinery.EXTENSION_SUFFIXES):
        path = os.path.join(here, "_loops" + suffix)
        if os.path.isfile(path):
            return path
    return None


def _fn_address(fn: Any) -> int:
    address = ctypes.cast(fn, ctypes.c_void_p).value
    if not address:
        raise OSError("no address for a bound function")
    return address


def _bind_loops(zstd: Library | None, blosc: Library | None) -> Loops | None:
    path = _loops_path()
    if path is None or (zstd is None and blosc is None):
        return None
    lib = ctypes.CDLL(path)
    lib.ss_loops_abi.restype, lib.ss_loops_abi.argtypes = ctypes.c_int, []
    if lib.ss_loops_abi() != LOOPS_ABI:
        return None
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    tail: list[Any] = [vp, vp, vp, vp, i64, vp, i64, vp]  # buf, rows, offsets, sizes, n, dst, nbytes, failed
    blosc_rows = zstd_rows = None
    blosc_fn = zstd_fns = None
    if blosc is not None:
        blosc_rows = lib.ss_blosc_rows
        blosc_rows.restype, blosc_rows.argtypes = i64, [vp, *tail]
        blosc_fn = _fn_address(blosc.released.blosc_decompress_ctx)
    if zstd is not None:
        zstd_rows = lib.ss_zstd_rows
        zstd_rows.restype, zstd_rows.argtypes = i64, [vp, vp, vp, vp, *tail]
        z = zstd.released
        zstd_fns = (
            _fn_address(z.ZSTD_getFrameContentSize),
            _fn_address(z.ZSTD_findFrameCompressedSize),
            _fn_address(z.ZSTD_decompressDCtx),
        )
    scatter = lib.ss_shard_scatter
    scatter.restype = i64
    scatter.argtypes = [i64, vp, vp, vp, i64, vp, i64, vp, vp, vp, i64]
    check = ctypes.PyDLL(path).ss_check_index
    check.restype, check.argtypes = i64, [vp, i64, i64]
    return Loops(path, blosc_rows, zstd_rows, blosc_fn, zstd_fns, scatter, check)


def _major_minor(version: str) -> tuple[int, int]:
    """``(1, 21)`` for ``"1.21.7.dev"``; ``(0, 0)`` for what does not parse."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or "0")
    except ValueError:
        return (0, 0)


def _bind_libc(name: str, restype: Any, argtypes: list[Any], **kw: Any) -> Any:
    """A function of the C library the interpreter runs on (POSIX), or None."""
    try:
        fn = getattr(ctypes.CDLL(None, **kw), name)
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _try(bind: Callable[[], Any]) -> Any:
    try:
        return bind()
    except Exception:  # noqa: BLE001 - no such module or symbol, another build: the reference path
        return None


class _Bound(NamedTuple):
    zstd: Library | None
    blosc: Library | None
    loops: Loops | None


_BOUND: _Bound | None = None
_BIND_LOCK = threading.Lock()


def _new_bind_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent may have held it at the fork)."""
    global _BIND_LOCK
    _BIND_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_bind_lock)


def _bound() -> _Bound:
    """The codec libraries, bound on first use: importing this module loads nothing of
    numcodecs (a verbatim migration and the CLI's start-up never need it); the first
    codec call pays the binding (a few ctypes look-ups; numcodecs is loaded by then)."""
    global _BOUND
    bound = _BOUND
    if bound is None:
        with _BIND_LOCK:
            bound = _BOUND
            if bound is None:
                zstd, blosc = _try(_bind_zstd), _try(_bind_blosc)
                bound = _BOUND = _Bound(zstd, blosc, _try(lambda: _bind_loops(zstd, blosc)))
    return bound


class TailReader(NamedTuple):
    """``ss_read_tails`` and ``ss_list_dir`` of our loops' library (see :func:`read_tails`,
    :func:`list_dir`)."""

    path: str
    fn: Any
    list_dir: Any


#: what ``ss_read_tails`` leaves in a file's first meta slot for the caller's own path
TAIL_OTHER = 2**64 - 1
#: meta slots per file: bytes read, size, st_dev, st_ino, st_mtime_ns, vouched
TAIL_META = 6
_TAIL_READER: list[TailReader | None] = []


def _bind_tail_reader() -> TailReader | None:
    path = _loops_path()
    if path is None or os.name != "posix":
        return None
    lib = ctypes.CDLL(path, use_errno=True)  # the GIL released for the run's system calls
    lib.ss_loops_abi.restype, lib.ss_loops_abi.argtypes = ctypes.c_int, []
    if lib.ss_loops_abi() != LOOPS_ABI:
        return None
    fn = lib.ss_read_tails
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.restype, fn.argtypes = i64, [ctypes.c_int, ctypes.c_char_p, i64, i64, ctypes.c_char_p, vp, vp]
    lister = lib.ss_list_dir
    lister.restype, lister.argtypes = i64, [ctypes.c_int, ctypes.c_int, vp, i64, vp, vp, i64, vp]
    return TailReader(path, fn, lister)


def tail_reader() -> TailReader | None:
    """``ss_read_tails`` (bound on first use, without numcodecs), or None: not built, another
    interface generation, not POSIX, or switched off (:func:`set_enabled`, :func:`using_loops`)."""
    if not (_enabled and _loops_enabled):
        return None
    if not _TAIL_READER:
        with _BIND_LOCK:
            if not _TAIL_READER:
                _TAIL_READER.append(_try(_bind_tail_reader))
    return _TAIL_READER[0]


def read_tails(reader: TailReader, dir_fd: int, names: bytes, count: int, tail_nbytes: int,
               real_dir: bytes | None) -> tuple[bytes, Any]:
    """The last ``min(size, tail_nbytes)`` bytes of each of ``count`` files of the directory
    open as ``dir_fd``, named by ``names`` (NUL-terminated, back to back), opened
    ``O_NOFOLLOW``: ``(tails, meta)``, file ``i``'s bytes at ``tails[i * tail_nbytes:]`` and
    its :data:`TAIL_META` slots at ``meta[TAIL_META * i:]``: bytes read (:data:`TAIL_OTHER`:
    not read, the caller's own path decides: missing, a link, no regular file, a failed or
    short read), size, ``st_dev``, ``st_ino``, ``st_mtime_ns``, and 1 when ``lstat`` of
    ``real_dir/name`` (given) found that very regular file, no link. See ``_loops.c``."""
    tails = bytearray(count * tail_nbytes)
    meta = _array("Q", bytes(8 * TAIL_META * count))
    address = _addressof(ctypes.c_char.from_buffer(tails)) if tails else None
    reader.fn(dir_fd, names, count, tail_nbytes, real_dir, address, meta.buffer_info()[0])
    return bytes(tails), meta


#: entries and name bytes :func:`list_dir` makes room for first (more when a directory holds more)
LIST_ENTRIES, LIST_NAME_BYTES = 256, 8 * 1024


def list_dir(reader: TailReader, dir_fd: int, sizes: bool) -> tuple[list[str], bytes, Any] | None:
    """The entries of the directory open as ``dir_fd`` but ``.`` and ``..``: ``(names, kinds,
    sizes)``, kind ``f``/``d``/``l``/``o`` (a regular file, a directory, a link, anything
    else: ``d_type``, else ``fstatat`` not following), and with ``sizes`` each regular file's
    size (-1: none asked, or removed meanwhile); None when it could not be opened for
    reading (nothing read: the caller's own path then decides); ``OSError`` when reading it
    failed part way, as ``os.scandir`` raises. Reading moves ``dir_fd``'s offset, as
    ``os.scandir``'s does."""
    cap, room = LIST_ENTRIES, LIST_NAME_BYTES
    while True:
        names = ctypes.create_string_buffer(room)
        kinds = ctypes.create_string_buffer(cap)
        out = _array("q", bytes(8 * (cap + 1)))  # the sizes, then the name bytes written
        n = reader.list_dir(dir_fd, int(sizes), names, room, kinds, out.buffer_info()[0], cap,
                            out.buffer_info()[0] + 8 * cap)
        if n == -2:
            cap, room = cap * 4, room * 4
            continue
        if n == -3:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot read the directory: {os.strerror(err)}")
        if n < 0:
            return None
        if not n:
            return [], b"", out[:0]
        return os.fsdecode(ctypes.string_at(names, out[cap] - 1)).split("\0"), ctypes.string_at(kinds, n), out[:n]


def loops_path() -> str | None:
    """The file of our loops' library in use (None: not built, refused, or no codec library)."""
    lib = _bound().loops
    return lib.path if lib is not None else None
_MEMCMP = _bind_libc("memcmp", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t])
_MADVISE = (
    _bind_libc("madvise", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], use_errno=True)
    if sys.platform.startswith("linux")
    else None
)
_RENAMEAT2 = (
    _bind_libc("renameat2", ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint],
               use_errno=True)
    if os.name == "posix"
    else None
)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
PAGE_SIZE = mmap.PAGESIZE
#: Linux's MADV_NOHUGEPAGE
MADV_NOHUGEPAGE = 15
#: Linux's MADV_POPULATE_WRITE (5.14+): fault pages in, writable, in one call
MADV_POPULATE_WRITE = 23

_enabled = True


def set_enabled(flag: bool) -> bool:
    """Switch every native binding on or off for this process; returns the previous setting.

    Off, every accessor below returns None and callers take the numcodecs / Python path
    (the reference). Decoders and encoders already built (an array opened before the
    switch) keep the path they chose.
    """
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    return previous


def enabled() -> bool:
    """Whether native bindings are switched on (see :func:`set_enabled`)."""
    return _enabled


@contextmanager
def using(flag: bool) -> Iterator[None]:
    """``with using(False): ...``: :func:`set_enabled` for the block, then restored."""
    previous = set_enabled(flag)
    try:
        yield
    finally:
        set_enabled(previous)


def zstd() -> Library | None:
    """numcodecs' libzstd, or None (missing, another version, or switched off)."""
    return _bound().zstd if _enabled else None


def blosc() -> Library | None:
    """numcodecs' libblosc (c-blosc 1), or None (missing, another version, or switched off)."""
    return _bound().blosc if _enabled else None


_loops_enabled = True


def loops() -> Loops | None:
    """Our batch loops over a shard's chunks (``_loops.c``), or None (not built, another
    interface generation, or switched off with :func:`set_enabled` or :func:`using_loops`)."""
    return _bound().loops if _enabled and _loops_enabled else None


@contextmanager
def using_loops(flag: bool) -> Iterator[None]:
    """``with using_loops(False): ...``: the batch loops alone off for the block (the
    per-chunk bindings stay on), so that tests compare both native paths."""
    global _loops_enabled
    previous, _loops_enabled = _loops_enabled, bool(flag)
    try:
        yield
    finally:
        _loops_enabled = previous


def switches() -> tuple[bool, bool]:
    """``(native on, loops on)``: what decoders and encoders built now depend on."""
    return _enabled, _loops_enabled


def blosc_for(nbytes: int) -> Any:
    """libblosc's functions as called for chunks of ``nbytes``: keeping the GIL up to
    :data:`HOLD_GIL_BELOW`, releasing it above; None when it is not available."""
    lib = blosc()
    if lib is None:
        return None
    return lib.held if nbytes <= HOLD_GIL_BELOW else lib.released


def memcmp() -> Any:
    """libc ``memcmp(a, b, n)`` on addresses (releases the GIL), or None."""
    return _MEMCMP if _enabled else None


def madvise(address: int, nbytes: int, advice: int) -> bool:
    """``madvise`` the whole pages inside ``[address, address + nbytes)``. Advice only:
    False (nothing done) without the call (another OS, switched off) or when the kernel
    refuses (an old one)."""
    if _MADVISE is None or not _enabled:
        return False
    lo = -(-address // PAGE_SIZE) * PAGE_SIZE
    hi = (address + nbytes) // PAGE_SIZE * PAGE_SIZE
    return hi > lo and _MADVISE(lo, hi - lo, advice) == 0


_from_buffer, _addressof = ctypes.c_char.from_buffer, ctypes.addressof


def data_address(arr: Any) -> int:
    """The address of a numpy array's first byte, for the calls of this module and of
    :mod:`.chunk_codec` that take addresses (the caller keeps ``arr`` alive while the
    address is in use). The one place outside the bindings where an address is taken:
    through ``ctypes.c_char.from_buffer`` for a writable contiguous array (a third of
    ``arr.ctypes.data``'s cost, which builds a ctypes object per call), else that."""
    try:
        return _addressof(_from_buffer(arr))
    except (TypeError, ValueError, BufferError):  # read-only, empty or not contiguous
        return int(arr.ctypes.data)


def madvise_array(arr: Any, advice: int, start: int = 0, stop: int | None = None) -> bool:
    """:func:`madvise` the whole pages inside bytes ``[start, stop)`` of array ``arr``
    (``stop``: its end when None). Advice only, as :func:`madvise`."""
    stop = arr.nbytes if stop is None else min(stop, arr.nbytes)
    return madvise(data_address(arr) + start, max(stop - start, 0), advice)


def same_bytes(a: Any, b: Any, nbytes: int) -> bool:
    """Whether the first ``nbytes`` of numpy byte arrays ``a`` and ``b`` are equal: libc
    ``memcmp`` (the GIL released), or a Python comparison without it (:func:`memcmp`)."""
    cmp = memcmp()
    if cmp is None:
        return bool(a[:nbytes].tobytes() == b[:nbytes].tobytes())
    return bool(cmp(data_address(a), data_address(b), nbytes) == 0)


def batch_table(rows: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> tuple[Any, int, Any, int]:
    """The tables of a batch loop call (``Loops.blosc_rows`` / ``zstd_rows``): ``(table,
    its address, failure flags, their address)``, ``table`` holding rows, offsets and sizes
    back to back as int64, the flags one zero byte per row for the loop to set (keep both
    alive during the call). ``array.array``: a few microseconds less per shard than numpy
    arrays and ``.ctypes``."""
    table = _array("q", rows)
    table.extend(offsets)
    table.extend(sizes)
    failed = _array("B", bytes(len(rows)))
    return table, table.buffer_info()[0], failed, failed.buffer_info()[0]


def align_skip(arr: Any, align: int) -> int:
    """How many bytes past the start of ``arr`` the next multiple of ``align`` lies."""
    return -data_address(arr) % align


def rename_exchange(a: bytes, b: bytes, dir_fd: int | None = None) -> int | None:
    """Swap the files at paths ``a`` and ``b`` atomically: libc ``renameat2(AT_FDCWD, a,
    AT_FDCWD, b, RENAME_EXCHANGE)`` (Linux 3.15+, glibc 2.28+); with ``dir_fd``, ``a`` and
    ``b`` are names in the directory open as ``dir_fd``. 0 when swapped, the errno
    when refused, None when this C library has no such call. Not switched off by
    :func:`set_enabled` (no codec: the stores' atomic replace)."""
    if _RENAMEAT2 is None:
        return None
    at = _AT_FDCWD if dir_fd is None else dir_fd
    if _RENAMEAT2(at, a, at, b, _RENAME_EXCHANGE) == 0:
        return 0
    return ctypes.get_errno()


#: ``memmove(dst, src, n)`` and ``string_at(address, n) -> bytes``: ctypes' own helpers
#: (no library binding; here so that no other module needs ctypes)
memmove = ctypes.memmove
string_at = ctypes.string_at


def pointer_table(addresses: Sequence[int]) -> Any:
    """A C array of ``void*`` holding ``addresses`` (function pointers handed to the loops)."""
    return (ctypes.c_void_p * max(4, len(addresses)))(*addresses)


def row_at(address: int, nbytes: int) -> Any:
    """The ``nbytes`` at ``address`` as a writable uint8 numpy array (no copy), for the
    general path of a decoder given an address (the caller keeps the memory alive)."""
    import numpy as np

    return np.frombuffer(memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B"), dtype=np.uint8)


class Source(NamedTuple):
    """A bytes-like object passed as a ``void*`` source."""

    arg: Any  # what to pass: the bytes themselves, or an address
    keep: Any  # what owns the memory at that address (keep it while the call runs)


def address_of(buf: Any) -> Source:
    """``buf`` as a ``void*`` argument: bytes as themselves, anything else (memoryview,
    array) by address through numpy, without a copy."""
    if type(buf) is bytes:
        return Source(buf, None)
    import numpy as np

    arr = np.frombuffer(buf, dtype=np.uint8)
    return Source(data_address(arr), arr)


class _Ctx:
    """A zstd context owned by one thread, freed with it."""

    __slots__ = ("ptr", "_free")

    def __init__(self, ptr: int, free: Callable[[int], Any]) -> None:
        if not ptr:
            raise MemoryError("zstd: cannot allocate a context")
        self.ptr, self._free = ptr, free

    def __del__(self) -> None:
        try:
            self._free(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process frees it anyway
            pass


_TLS = threading.local()


def zstd_dctx(lib: Library) -> int:
    """This thread's zstd decompression context (created on first use)."""
    ctx = getattr(_TLS, "dctx", None)
    if ctx is None:
        ctx = _TLS.dctx = _Ctx(lib.released.ZSTD_createDCtx(), lib.released.ZSTD_freeDCtx)
    return ctx.ptr


def zstd_cctx(lib: Library, level: int, checksum: bool) -> int:
    """This thread's compression context for ``(level, checksum)``, parameters set once
    (``ZSTD_compress2`` resets the session and keeps them)."""
    cctxs = getattr(_TLS, "cctx", None)
    if cctxs is None:
        cctxs = _TLS.cctx = {}
    ctx = cctxs.get((level, checksum))
    if ctx is None:
        c = lib.released
        ctx = _Ctx(c.ZSTD_createCCtx(), c.ZSTD_freeCCtx)
        for param, value in ((_ZSTD_C_LEVEL, level), (_ZSTD_C_CHECKSUM, int(checksum))):
            if c.ZSTD_isError(c.ZSTD_CCtx_setParameter(ctx.ptr, param, value)):
                raise ValueError(f"zstd: parameter {param}={value} refused")
        cctxs[(level, checksum)] = ctx
    return ctx.ptr


def thread_buffer(name: str, nbytes: int) -> Any:
    """A per-thread ``ctypes`` char buffer of at least ``nbytes`` (encoders' output), reused."""
    buf = getattr(_TLS, name, None)
    if buf is None or len(buf) < nbytes:
        buf = ctypes.create_string_buffer(nbytes)
        setattr(_TLS, name, buf)
    return buf


def report() -> dict[str, str | None]:
    """What is bound (library -> version, None when not), for ``--version``-style output and
    bug reports; independent of :func:`set_enabled`."""
    bound = _bound()
    return {
        "zstd": bound.zstd.version if bound.zstd is not None else None,
        "blosc": bound.blosc.version if bound.blosc is not None else None,
        "loops": bound.loops.path if bound.loops is not None else None,
        "memcmp": "libc" if _MEMCMP is not None else None,
        "madvise": "libc" if _MADVISE is not None else None,
    }
