"""Memory for reads: buffers whose first byte lies on a page boundary.

glibc serves a big allocation (numpy's ``np.empty`` of a MiB or more) from its own
mapping, with the data 16 bytes past a page boundary. The kernel copies a file's cached
pages (page aligned) into such a buffer with ``rep movsb``, and on AMD EPYC (this
project's benchmark machine) that copy runs about 8x slower when destination and source
are exactly 16 bytes apart modulo 4 KiB: a ``preadv`` of a 79 KB shard took 52 µs into
``np.empty(1 MiB)`` and 6 µs into the same memory at any other offset from 0 to 256
(``benchmarks/profile_notes.md``, "Round of 2026-11-26, page offsets"). Buffers that
receive file reads or big copies come from :func:`io_buffer`.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["PAGE", "io_buffer"]

PAGE = mmap.PAGESIZE


def io_buffer(nbytes: int) -> np.ndarray:
    """A new, uninitialised ``uint8`` array of ``nbytes`` (at least 1) starting on a page boundary."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)

    from . import _native  # noqa: PLC0415 - ctypes and the bindings only where used (start-up)

    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    skip = _native.align_skip(raw, PAGE)
    return raw[skip : skip + nbytes]
