"""The reshard journal: the document an in-place reshard keeps per array while it runs.

An in-place ``reshard`` (see :mod:`sharding_store.ops.resharding`) moves an array through the
phases ``stage``, ``swap`` and ``move``; from the start of ``swap`` until the end of
``move`` the array's metadata document is gone, so a reader walking the hierarchy does
not see the array at all. The journal ``__reshard__/journal/<array metadata key>`` is
the only trace of it. This module owns that document (its key, encoding and parsing,
pure) and the one question every command that reads a hierarchy must ask first: is an
in-place reshard of this store unfinished (:func:`interrupted_reshards`, one listing of
the journal prefix plus one get per journal found)? ``info`` reports it, ``migrate`` and
``verify`` refuse (:func:`refuse_interrupted_reshards`), ``reshard --resume`` completes it.

Layer: format. It imports only :mod:`errors` and :mod:`draft_metadata`; a store is any
object with ``list_prefix`` and ``get`` (the ``Inner`` protocol).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Protocol

from ..errors import MigrationError
from . import draft_metadata as dm

__all__ = [
    "JOURNAL_PREFIX",
    "JOURNAL_VERSION",
    "PHASES",
    "STAGING_PREFIX",
    "Journal",
    "interrupted_error",
    "interrupted_reshards",
    "journal_key",
    "refuse_interrupted_reshards",
    "resume_command",
    "staging_leftovers",
]

#: everything an in-place reshard writes lives under this prefix, outside ``meta/`` and ``data/``
STAGING_PREFIX = "__reshard__/"
JOURNAL_PREFIX = STAGING_PREFIX + "journal/"
JOURNAL_VERSION = 1
PHASES = ("stage", "swap", "move")
#: what a reader of the store sees of the array in each phase
_VISIBILITY = {
    "stage": "still readable with its old layout",
    "swap": "hidden: its metadata is removed until the reshard completes",
    "move": "hidden until the reshard writes its new metadata",
}


class _Readable(Protocol):
    def list_prefix(self, prefix: str) -> Iterator[str]: ...
    def get(self, key: str) -> bytes | None: ...


class _Listable(_Readable, Protocol):
    def temp_leftovers(self, key: str) -> list[str]: ...


class _Writable(Protocol):
    def set(self, key: str, value: bytes) -> None: ...


def journal_key(meta_key: str) -> str:
    """The journal key of the array whose metadata document is ``meta_key``."""
    return JOURNAL_PREFIX + meta_key


@dataclass
class Journal:
    """The in-place protocol's state for one array (see :mod:`sharding_store.ops.resharding`)."""

    path: str
    meta_key: str
    old: str  # the old metadata document, exactly as it was stored
    new: str  # the new metadata document
    phase: str  # "stage" | "swap" | "move"
    consolidated: bool  # whether consolidated metadata listed the array
    version: int = JOURNAL_VERSION

    @property
    def key(self) -> str:
        return journal_key(self.meta_key)

    @property
    def hides_array(self) -> bool:
        """True once the array's metadata may be gone (phases ``swap`` and ``move``)."""
        return self.phase != "stage"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    def save(self, inner: _Writable, phase: str) -> None:
        """Record ``phase`` in the journal object (one atomic ``set``)."""
        self.phase = phase
        inner.set(self.key, self.encode())

    @classmethod
    def parse(cls, raw: bytes, key: str) -> Journal:
        """The journal stored at ``key``; :class:`MigrationError` naming it when it is not one."""
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
            journal = cls(**doc)
        except (ValueError, TypeError, RecursionError) as e:
            raise MigrationError(f"{key}: unreadable reshard journal ({e}); inspect it, then delete it by hand", key=key) from None
        if journal.version != JOURNAL_VERSION or journal.phase not in PHASES:
            raise MigrationError(f"{key}: unknown reshard journal version {journal.version!r} / phase {journal.phase!r}", key=key)
        wrong = [f.name for f in fields(cls) if not isinstance(getattr(journal, f.name), _TYPES[f.name])]
        if wrong or journal.key != key:
            why = f"field {wrong[0]!r} has the wrong type" if wrong else f"it describes {journal.meta_key!r}"
            raise MigrationError(f"{key}: unreadable reshard journal ({why}); inspect it, then delete it by hand", key=key)
        return journal

    load = parse  # the name ops/resharding.py used

    def metas(self) -> tuple[dm.DraftArrayMeta, dm.DraftArrayMeta]:
        """The old and the new metadata of the array."""
        old = dm.parse_array_metadata(self.old.encode(), self.meta_key, self.path)
        new = dm.parse_array_metadata(self.new.encode(), self.meta_key, self.path)
        return old, new

    def describe(self) -> str:
        """``array 'a/b' (phase swap: hidden: ...)`` for messages."""
        return f"array '{self.path or '/'}' (phase {self.phase}: {_VISIBILITY[self.phase]})"

    def to_json(self) -> dict[str, object]:
        """The ``info --json`` entry of an interrupted reshard."""
        return {"path": self.path, "phase": self.phase, "journal": self.key, "hidden": self.hides_array}


_TYPES: dict[str, type | tuple[type, ...]] = {
    "path": str, "meta_key": str, "old": str, "new": str, "phase": str, "consolidated": bool, "version": int,
}


def interrupted_reshards(inner: _Readable, unreadable: list[MigrationError] | None = None) -> list[Journal]:
    """The journals of unfinished in-place reshards in a store, sorted by key.

    One listing of ``__reshard__/journal/`` (empty in a store no reshard was ever
    interrupted in) plus one get per journal found. A journal that is not one raises
    :class:`MigrationError` naming its key (an unreadable trace of a hidden array is not
    something to skip), or is appended to ``unreadable`` when the caller reports it.
    """
    out = []
    for key in inner.list_prefix(JOURNAL_PREFIX):
        raw = inner.get(key)
        if raw is None:  # completed between the listing and the get
            continue
        try:
            out.append(Journal.parse(raw, key))
        except MigrationError as e:
            if unreadable is None:
                raise
            unreadable.append(e)
    return out


def resume_command(location: str) -> str:
    """The command that completes the interrupted reshards of the store at ``location``."""
    return f"sharding-store reshard {location} --resume"


def interrupted_error(journals: Iterable[Journal], location: str, consequence: str = "") -> MigrationError:
    """The error (exit 10) naming every interrupted array and the command that completes them."""
    journals = list(journals)
    names = "; ".join(j.describe() for j in journals)
    what = "interrupted in-place reshard" + ("s" if len(journals) > 1 else "")
    tail = f" ({consequence})" if consequence else ""
    return MigrationError(
        f"{location}: {what} of {names}{tail}; complete it first with `{resume_command(location)}`",
        key=journals[0].key if journals else None,
    )


def refuse_interrupted_reshards(inner: _Readable, location: str, consequence: str = "") -> None:
    """Raise :class:`MigrationError` (exit 10) if an in-place reshard of the store is
    unfinished: its array may be hidden, so a command reading the hierarchy now would
    silently leave it out. Costs one listing of the (normally empty) journal prefix."""
    journals = interrupted_reshards(inner)
    if journals:
        raise interrupted_error(journals, location, consequence)


def staging_leftovers(inner: _Listable) -> list[str]:
    """Keys below ``__reshard__/`` that no journal accounts for: staged objects and
    temporary files an interrupted in-place reshard left (one listing, plus a walk of the
    staging directory on local stores). Empty while any journal exists (they are its
    staging then) and in a store no reshard ever ran in. Here, not in the driver: ``info``
    asks without loading it."""
    if interrupted_reshards(inner):
        return []
    return sorted({*inner.list_prefix(STAGING_PREFIX), *inner.temp_leftovers(STAGING_PREFIX)})
