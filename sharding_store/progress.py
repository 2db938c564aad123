"""Progress bars: tqdm on a terminal, nothing (and no tqdm import) otherwise."""

from __future__ import annotations

import sys
from typing import Any


class NullBar:
    """What the code drives when no bar is shown: tqdm's methods we use, doing nothing.
    Importing tqdm costs ~20 ms (it reads package metadata and makes a multiprocessing
    lock), a visible share of migrating a small store."""

    total = 0

    def __enter__(self) -> NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None

    def refresh(self) -> None:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None


def progress_bar(total: int, desc: str, unit: str, enabled: bool | None) -> Any:
    """A tqdm bar on stderr when asked for, or by default only on a terminal."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        return NullBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False)
