"""numcodecs, imported without scanning every installed package's entry points (issue 26, start-up).

``import numcodecs`` runs ``numcodecs.registry.run_entrypoints()``: ``importlib.metadata.entry_points()``
reads the entry points of every installed distribution (~30 M instructions and a file read per
package, 5-12 ms of each command's start-up here) to learn which third-party codecs announce
themselves under ``numcodecs.codecs``. The codecs draft documents name are numcodecs' own, registered
by its ``__init__``: the scan matters only for an id numcodecs does not register itself, and
``get_codec`` consults the scan's result (``registry.entries``) only for such an id.

:func:`load` imports numcodecs with that scan deferred to the first read of ``registry.entries``
(:class:`LazyEntries`), so ``numcodecs.get_codec`` answers exactly as before: an entry-point codec
is loaded and registered, an unknown id raises the same ``UnknownCodecError``; an explicit
``registry.run_entrypoints()`` scans at once, as it always did. Written against numcodecs 0.16
(``registry.entries``, ``registry.run_entrypoints``, ``registry.entry_points``); a registry of
another shape is scanned at import as numcodecs does (``tests/unit/test_numcodecs_adapter.py``).
Every module of the package imports numcodecs through :func:`load` (the first import decides).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["LazyEntries", "load"]

_import_lock = threading.Lock()


def _filled(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of :class:`LazyEntries`, called once its scan has filled it."""

    def call(self: LazyEntries, *args: Any, **kwargs: Any) -> Any:
        self._fill()
        return method(self, *args, **kwargs)

    call.__name__ = call.__qualname__ = method.__name__
    return call


class LazyEntries(dict):
    """``numcodecs.registry.entries``: the registry's own scan (``run_entrypoints``) runs on
    the first read, under a lock (a second thread waits for the whole result, never sees a
    half-filled mapping)."""

    def __init__(self, scan: Callable[[], object]) -> None:
        super().__init__()
        self._scan = scan
        self._scanned = False
        self._lock = threading.RLock()

    def _fill(self) -> None:
        with self._lock:
            if not self._scanned:
                self._scan()  # registry.run_entrypoints(): clear() below, then update()
                self._scanned = True

    def clear(self) -> None:
        """Called by ``run_entrypoints`` before it fills the mapping: the scan is its own."""
        with self._lock:
            self._scanned = True
            super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            super().update(*args, **kwargs)

    # every read fills the mapping first (numcodecs' ``get_codec`` uses ``in`` and ``[]``)
    __contains__ = _filled(dict.__contains__)
    __getitem__ = _filled(dict.__getitem__)
    get = _filled(dict.get)
    __iter__ = _filled(dict.__iter__)
    __len__ = _filled(dict.__len__)
    keys = _filled(dict.keys)
    values = _filled(dict.values)
    items = _filled(dict.items)
    __repr__ = _filled(dict.__repr__)


def load() -> ModuleType:
    """The ``numcodecs`` module, imported (once) with its entry-point scan deferred."""
    if "numcodecs.registry" not in sys.modules:
        with _import_lock:
            if "numcodecs.registry" not in sys.modules:  # else imported meanwhile, or by whoever came first
                return _import_deferring_the_scan()
    import numcodecs  # imported, or being imported by another thread: Python's import lock waits for it

    return numcodecs


def _import_deferring_the_scan() -> ModuleType:
    """``import numcodecs`` while ``importlib.metadata.entry_points`` answers the registry's
    import-time call (that one call, from ``numcodecs.registry``, in this thread) with no
    entry points; any other caller meanwhile gets the real answer."""
    import importlib.metadata as metadata

    real = metadata.entry_points
    me = threading.get_ident()
    deferred: list[bool] = []

    def entry_points(**params: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__")
        if not deferred and not params and caller == "numcodecs.registry" and threading.get_ident() == me:
            deferred.append(True)
            return metadata.EntryPoints(())
        return real(**params)

    metadata.entry_points = entry_points
    try:
        import numcodecs
    finally:
        metadata.entry_points = real
    registry = sys.modules["numcodecs.registry"]
    if getattr(registry, "entry_points", None) is entry_points:
        registry.entry_points = real  # type: ignore[attr-defined]
    if deferred:
        _defer_entries(registry)
    return numcodecs


def _defer_entries(registry: ModuleType) -> None:
    """Install :class:`LazyEntries` as the registry's ``entries`` (the scan it skipped runs on
    first read); a registry of another shape is scanned now, as its import would have."""
    entries, scan = getattr(registry, "entries", None), getattr(registry, "run_entrypoints", None)
    if type(entries) is dict and not entries and callable(scan):
        registry.entries = LazyEntries(scan)  # type: ignore[attr-defined]
    elif callable(scan):
        scan()
