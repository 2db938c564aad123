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
#: seconds between two frames written to a file or pipe (``--progress 2>log``): a log gets a
#: few frames, then the final one on a line of its own
LOG_INTERVAL = 2.0


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

    def planned(self) -> None:
        return None

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        return None

    def reach(self, count: int, nbytes: int) -> None:
        return None


class Bar(NullBar):
    """A tqdm bar on stderr: a count and the running total of bytes after it. Driven from one
    thread (the one collecting results).

    A total that is not known yet (``total=None``: the work is still being planned while
    units run) shows no percentage and no ETA, only the counts done and planned so far, as
    a spinner does; :meth:`planned` (or the end) fixes the total, and the bar then shows a
    percentage that means something. On a terminal the bar is erased when done; elsewhere
    (``--progress 2>log``) it is redrawn rarely and its final frame is left as a whole line."""

    def __init__(self, total: int | None, desc: str, unit: str, *, file: Any = None,
                 mininterval: float | None = None) -> None:
        from tqdm import tqdm

        out = file if file is not None else sys.stderr
        tty = _isatty(out)
        self.count = 0
        self.nbytes = 0
        self.known = total is not None
        self._planned = total or 0
        self._drawn = 0.0
        self._redraw = (REDRAW if tty else LOG_INTERVAL) if mininterval is None else mininterval
        self._tqdm = tqdm(total=total, desc=desc, unit=unit, leave=not tty, file=out, dynamic_ncols=tty,
                          mininterval=(0.1 if tty else LOG_INTERVAL) if mininterval is None else mininterval)
        self._set_counts()

    @property
    def total(self) -> int:
        """What is planned so far (the final total once :meth:`planned` was called)."""
        return self._planned

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.planned()  # all the work was planned, or the bar would not be closing without an error
        self._tqdm.close()

    def _set_counts(self) -> None:
        """The words after the bar: the bytes so far and, while the total is not known, how
        much is planned (``of 30 planned so far``)."""
        planning = "" if self.known else f", {self._planned} planned so far"
        self._tqdm.set_postfix_str(human_bytes(self.nbytes) + planning, refresh=False)

    def grow(self, n: int) -> None:
        """``n`` more to do (redrawn at most every :data:`REDRAW` seconds; in a log, every
        :data:`LOG_INTERVAL`)."""
        self._planned += n
        if self.known:
            self._tqdm.total = self._planned
        self._set_counts()
        now = time.monotonic()
        if now - self._drawn >= self._redraw:
            self._drawn = now
            self._tqdm.refresh()

    def planned(self) -> None:
        """Everything is planned: the total is known, and shown with a percentage from now on."""
        if not self.known:
            self.known = True
            self._tqdm.total = self._planned
            self._set_counts()
            self._tqdm.refresh()

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        """``n`` more done, ``nbytes`` more bytes: the bytes shown are the run's total so far."""
        self.count += n
        self.nbytes += nbytes
        self._set_counts()
        self._tqdm.update(n)

    def reach(self, count: int, nbytes: int) -> None:
        """Show these running totals (a report's counters), when they are ahead."""
        self.advance(max(0, count - self.count), max(0, nbytes - self.nbytes))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress_bar(total: int | None, desc: str, unit: str, enabled: bool | None) -> NullBar:
    """A :class:`Bar` on stderr when ``enabled``, or (None) only when stderr is a terminal;
    else a :class:`NullBar` (tqdm is not imported). ``total`` None: not known until the
    driver calls ``planned()``."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        return NullBar()
    return Bar(total, desc, unit)
