"""Progress bars: tqdm on a terminal (or when asked), nothing (and no tqdm import) otherwise.

A bar counts what its command's report counts, in the report's words (:func:`object_noun`:
"shard" only when every object counted is a shard), and shows after the count the running
total of bytes of the whole run (:func:`human_bytes`), never one unit's bytes.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: seconds between two redraws caused by a growing total (planning streams while units run)
REDRAW = 0.2


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; bytes below 1 KiB as ``"12 B"``; None -> ``"unknown"``."""
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def plural(n: int, word: str, words: str | None = None) -> str:
    """``n`` and the noun in the right number: ``1 group``, ``2 groups``, ``0 groups``
    (``words``: an irregular plural). Every count a report prints goes through it: no
    ``array(s)``, no ``1 arrays``."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def object_noun(all_shards: bool, n: int = 2) -> str:
    """What a count of target objects is called: shards when every one is a shard, else
    objects (an unsharded array's objects are chunks); singular for ``n == 1``."""
    word = "shard" if all_shards else "object"
    return word if n == 1 else word + "s"


class NullBar:
    """What the code drives when no bar is shown: the bar's methods, doing nothing.
    Importing tqdm costs ~20 ms (it reads package metadata and makes a multiprocessing
    lock), a visible share of migrating a small store."""

    def __enter__(self) -> NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def grow(self, n: int) -> None:
        return None

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        return None

    def reach(self, count: int, nbytes: int) -> None:
        return None


class Bar(NullBar):
    """A tqdm bar on stderr: a count (its total may grow while the work is planned) and the
    running total of bytes after it. Driven from one thread (the one collecting results)."""

    def __init__(self, total: int, desc: str, unit: str, *, file: Any = None, mininterval: float = 0.1) -> None:
        from tqdm import tqdm

        self.count = 0
        self.nbytes = 0
        self._drawn = 0.0
        self._tqdm = tqdm(total=total, desc=desc, unit=unit, leave=False, file=file if file is not None else sys.stderr,
                          mininterval=mininterval, dynamic_ncols=True)

    @property
    def total(self) -> int:
        return int(self._tqdm.total or 0)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tqdm.close()

    def grow(self, n: int) -> None:
        """``n`` more to do (redrawn at most every :data:`REDRAW` seconds)."""
        self._tqdm.total = (self._tqdm.total or 0) + n
        now = time.monotonic()
        if now - self._drawn >= REDRAW:
            self._drawn = now
            self._tqdm.refresh()

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        """``n`` more done, ``nbytes`` more bytes: the bytes shown are the run's total so far."""
        self.count += n
        self.nbytes += nbytes
        self._tqdm.set_postfix_str(human_bytes(self.nbytes), refresh=False)
        self._tqdm.update(n)

    def reach(self, count: int, nbytes: int) -> None:
        """Show these running totals (a report's counters), when they are ahead."""
        self.advance(max(0, count - self.count), max(0, nbytes - self.nbytes))


def progress_bar(total: int, desc: str, unit: str, enabled: bool | None) -> NullBar:
    """A :class:`Bar` on stderr when ``enabled``, or (None) only when stderr is a terminal;
    else a :class:`NullBar` (tqdm is not imported)."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        return NullBar()
    return Bar(total, desc, unit)
