"""The in-place upgrade journal: the one object an in-place upgrade of a 2023 store keeps while it runs.

``sharding-store migrate PATH --in-place`` (:mod:`sharding_store.ops.upgrade`) rewrites only
the ``zarr.json`` documents of a 2023-generation store. Before it changes any of them it
creates ``.sharding-store-upgrade.json`` at the store's root, exclusively (so two runs
cannot both proceed), holding the whole plan: for every document it will write, its key,
its **original bytes** (None for a group that had no document) and the new bytes. That one
object is the backup: nothing else but the temporary files of atomic writes is written
beside the documents, so readers see no extra node (zarr-python 3, tensorstore and this package ignore a root file that is not
``zarr.json``), and the state of an interrupted run is read from the store itself, each
document being either its original, its new version, or something a third party wrote
(a conflict: each write is conditional on the document it replaces, so it is not
overwritten, within the limits :meth:`Inner.put_if_unchanged` states):

* ``--resume`` writes the new version of each document still original, verifies, then
  deletes the journal;
* ``--undo`` writes back each original (a created document is deleted), removes the
  temporary files a killed write left next to the documents, then deletes the journal:
  every file of the store is byte for byte what it was.

**One run at a time.** The journal names the run that holds it (``owner``: pid, host,
boot id, process start time, a token, the action). A fresh upgrade creates the journal
with itself as owner; ``--resume`` and ``--undo`` claim it by replacing the journal with
one naming themselves, conditionally on the bytes they read (:meth:`Inner.put_if_unchanged`),
so of two recovery runs at most one proceeds; the other, and any run that finds the
journal held by a live process, stops with exit 10 naming the holder. A holder that is
dead (same host and boot, no such process or a zombie, or another process under its pid)
is taken over automatically; one this host cannot check (another host) only with
``--take-over``. A run that stops with an error (not a kill) releases its claim. The run
that holds the journal deletes it at the end, again conditionally: if another run took
it over meanwhile, this one says so (exit 10) instead of reporting success.

This module owns the document (key, encoding, parsing: pure) and the question every
command reading such a store asks first: is an in-place upgrade unfinished
(:func:`interrupted_upgrade`, one get)? ``migrate`` refuses (exit 10, naming ``--resume``
and ``--undo``), ``info`` reports it.

Layer: format. Imports only :mod:`errors`; a store is any object with ``get``.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import MigrationError

__all__ = [
    "Claim",
    "UPGRADE_JOURNAL_KEY",
    "UPGRADE_JOURNAL_VERSION",
    "DocumentStep",
    "UpgradeJournal",
    "interrupted_upgrade",
    "interrupted_upgrade_error",
    "refuse_interrupted_upgrade",
    "resume_upgrade_command",
    "undo_upgrade_command",
    "upgrade_status",
]

#: the journal's key, at the store's root (not a node document: every reader ignores it)
UPGRADE_JOURNAL_KEY = ".sharding-store-upgrade.json"
UPGRADE_JOURNAL_VERSION = 1
_KIND = "sharding-store in-place upgrade"


class _Readable(Protocol):
    def get(self, key: str) -> bytes | None: ...


def _sha(data: bytes) -> str:
    import hashlib  # noqa: PLC0415 - hashlib (OpenSSL's start-up) loads with a journal, not with every command

    return hashlib.sha256(data).hexdigest()


def _encode_bytes(data: bytes) -> dict[str, str]:
    """Bytes as the journal keeps them: readable text when they are UTF-8, else base64."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii"), "sha256": _sha(data)}
    return {"text": text, "sha256": _sha(data)}


def _decode_bytes(value: Any, where: str) -> bytes:
    if not isinstance(value, dict) or not isinstance(value.get("sha256"), str):
        raise ValueError(f"{where}: expected {{\"text\" or \"base64\", \"sha256\"}}")
    if isinstance(value.get("text"), str):
        data = value["text"].encode("utf-8")
    elif isinstance(value.get("base64"), str):
        data = base64.b64decode(value["base64"], validate=True)
    else:
        raise ValueError(f"{where}: neither \"text\" nor \"base64\"")
    if _sha(data) != value["sha256"]:
        raise ValueError(f"{where}: its bytes do not match their sha256")
    return bytes(data)


@dataclass(frozen=True)
class DocumentStep:
    """One document the upgrade writes: ``original`` None when the node had none (an
    implicit group made explicit)."""

    path: str
    key: str
    original: bytes | None
    new: bytes

    def state(self, current: bytes | None) -> str:
        """``"new"``, ``"original"`` (None counts when there was no original) or ``"other"``."""
        if current is not None and current == self.new:
            return "new"
        if current == self.original:
            return "original"
        return "other"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "key": self.key,
                "original": None if self.original is None else _encode_bytes(self.original),
                "new": _encode_bytes(self.new)}


def _host() -> str:
    """This host's name: ``uname``'s node name, what ``socket.gethostname()`` returns on POSIX
    (glibc's ``gethostname`` reads it from ``uname``) without importing socket (~3-9 ms of
    every locking command's start-up, with selectors and its enums)."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket  # noqa: PLC0415 - no uname (Windows)

    return socket.gethostname()


def _uuid4_hex() -> str:
    """A random version-4 UUID's 32 hex digits, as ``uuid.uuid4().hex`` spells them (version
    and variant bits set), without importing uuid (it imports platform: ~3 ms of start-up)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a local process from ``/proc``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Claim:
    """The run that holds the journal (the only one that may write documents)."""

    action: str  # "upgrade" | "resume" | "undo"
    pid: int
    host: str
    since: float  # time.time() when claimed
    token: str
    boot: str | None = None
    start: int | None = None  # the process's start time in clock ticks (/proc), when known

    @classmethod
    def mine(cls, action: str) -> Claim:
        stat = _proc_stat(os.getpid())
        return cls(action, os.getpid(), _host(), time.time(), _uuid4_hex(), _boot_id(),
                   None if stat is None else stat[1])

    def alive(self) -> bool | None:
        """Whether the holder still runs: None when this host cannot tell (another host)."""
        if self.host != _host():
            return None
        if self.boot is not None and _boot_id() not in (None, self.boot):
            return False  # claimed before a reboot
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        stat = _proc_stat(self.pid)
        if stat is not None and (stat[0] in ("Z", "X") or (self.start is not None and stat[1] != self.start)):
            return False  # a zombie (killed, not yet reaped), or another process under a reused pid
        return True

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        article = "an" if self.action[:1] in ("a", "e", "i", "o", "u") else "a"
        return f"{article} {self.action} run (pid {self.pid} on host {self.host}, since {when})"

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "pid": self.pid, "host": self.host, "since": self.since, "token": self.token,
                "boot": self.boot, "start": self.start}

    @classmethod
    def from_json(cls, doc: Any) -> Claim:
        if not isinstance(doc, dict) or not isinstance(doc.get("pid"), int) or not isinstance(doc.get("host"), str) \
                or not isinstance(doc.get("token"), str) or not isinstance(doc.get("since"), (int, float)):
            raise ValueError("field 'owner': expected {\"action\", \"pid\", \"host\", \"since\", \"token\"}")
        start = doc.get("start")
        return cls(str(doc.get("action")), doc["pid"], doc["host"], float(doc["since"]), doc["token"],
                   doc.get("boot") if isinstance(doc.get("boot"), str) else None,
                   start if isinstance(start, int) else None)


@dataclass
class UpgradeJournal:
    """The plan of one in-place upgrade (see the module docstring)."""

    location: str  # the store as the run spelled it (for messages only)
    index_checksum: bool
    steps: list[DocumentStep]
    #: nodes left as they were (``--skip-damaged``): path -> reason
    skipped: dict[str, str] = field(default_factory=dict)
    version: int = UPGRADE_JOURNAL_VERSION
    #: the run that holds the journal; None: released (a run that stopped with an error)
    owner: Claim | None = None

    key = UPGRADE_JOURNAL_KEY

    def encode(self) -> bytes:
        doc = {"kind": _KIND, "version": self.version, "location": self.location,
               "index_checksum": self.index_checksum, "skipped": self.skipped,
               "owner": None if self.owner is None else self.owner.to_json(),
               "steps": [s.to_json() for s in self.steps]}
        return json.dumps(doc, indent=1).encode()

    def owned_by(self, owner: Claim | None) -> UpgradeJournal:
        """The same journal held by ``owner`` (None: released)."""
        return replace(self, owner=owner)

    @classmethod
    def parse(cls, raw: bytes, key: str = UPGRADE_JOURNAL_KEY) -> UpgradeJournal:
        """The journal stored at ``key``; :class:`MigrationError` naming it when it is not one."""
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("kind") != _KIND:
                raise ValueError(f"not a journal of this tool (kind {doc.get('kind')!r})" if isinstance(doc, dict)
                                 else "not a JSON object")
            if doc.get("version") != UPGRADE_JOURNAL_VERSION:
                raise ValueError(f"unknown version {doc.get('version')!r}")
            if not isinstance(doc.get("index_checksum"), bool) or not isinstance(doc.get("location"), str):
                raise ValueError("field 'index_checksum' or 'location' has the wrong type")
            skipped = doc.get("skipped", {})
            if not isinstance(skipped, dict) or not all(isinstance(v, str) for v in skipped.values()):
                raise ValueError("field 'skipped' has the wrong type")
            steps_raw = doc.get("steps")
            if not isinstance(steps_raw, list):
                raise ValueError("field 'steps' is not a list")
            steps = []
            for i, s in enumerate(steps_raw):
                if not isinstance(s, dict) or not isinstance(s.get("path"), str) or not isinstance(s.get("key"), str):
                    raise ValueError(f"steps[{i}]: expected {{\"path\", \"key\", \"original\", \"new\"}}")
                original = None if s.get("original") is None else _decode_bytes(s["original"], f"steps[{i}].original")
                steps.append(DocumentStep(s["path"], s["key"], original, _decode_bytes(s.get("new"), f"steps[{i}].new")))
            owner = None if doc.get("owner") is None else Claim.from_json(doc["owner"])
        except (ValueError, TypeError, RecursionError) as e:
            raise MigrationError(f"{key}: unreadable in-place upgrade journal ({e}); inspect it before deleting it "
                                 "by hand: it holds the original documents", key=key) from None
        return cls(doc["location"], doc["index_checksum"], steps, dict(skipped), owner=owner)

    def progress(self, inner: _Readable) -> dict[str, list[str]]:
        """The state of each document now (one get each): keys by ``"new"``,
        ``"original"``, ``"other"``."""
        out: dict[str, list[str]] = {"new": [], "original": [], "other": []}
        for s in self.steps:
            out[s.state(inner.get(s.key))].append(s.key)
        return out


def interrupted_upgrade(inner: _Readable) -> UpgradeJournal | None:
    """The journal of an unfinished in-place upgrade of this store (one get), or None.
    An object at the key that is not a journal raises :class:`MigrationError` naming it."""
    raw = inner.get(UPGRADE_JOURNAL_KEY)
    return None if raw is None else UpgradeJournal.parse(raw)


def resume_upgrade_command(location: str) -> str:
    return f"sharding-store migrate {location} --in-place --resume"


def undo_upgrade_command(location: str) -> str:
    return f"sharding-store migrate {location} --in-place --undo"


def interrupted_upgrade_error(journal: UpgradeJournal, location: str, consequence: str = "") -> MigrationError:
    """The error (exit 10) naming the interrupted upgrade and the two commands that end it."""
    tail = f" ({consequence})" if consequence else ""
    return MigrationError(
        f"{location}: an in-place upgrade of this store ({len(journal.steps)} documents) is in progress or was "
        f"interrupted (its journal {UPGRADE_JOURNAL_KEY} holds the original documents){tail}; finish it with "
        f"`{resume_upgrade_command(location)}` or roll it back with `{undo_upgrade_command(location)}`",
        key=UPGRADE_JOURNAL_KEY,
    )


def refuse_interrupted_upgrade(inner: _Readable, location: str, consequence: str = "") -> None:
    """Raise :class:`MigrationError` (exit 10) when an in-place upgrade of the store is
    unfinished: its documents are a mix of old and new until ``--resume`` or ``--undo``."""
    journal = interrupted_upgrade(inner)
    if journal is not None:
        raise interrupted_upgrade_error(journal, location, consequence)


def upgrade_status(inner: _Readable, location: str) -> dict[str, Any] | None:
    """An interrupted in-place upgrade of ``inner`` for ``info`` (one get, plus one per
    document when there is one), or None. Here, not in the driver: ``info`` asks without
    loading it."""
    journal = interrupted_upgrade(inner)
    if journal is None:
        return None
    progress = journal.progress(inner)
    return {"journal": UPGRADE_JOURNAL_KEY, "documents": len(journal.steps), "upgraded": progress["new"],
            "original": progress["original"], "changed_by_others": progress["other"], "skipped": journal.skipped,
            "held_by": None if journal.owner is None else journal.owner.describe(),
            "holder_running": None if journal.owner is None else journal.owner.alive(),
            "resume": resume_upgrade_command(location), "undo": undo_upgrade_command(location)}
