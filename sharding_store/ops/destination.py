"""A migration's destination: what claims it, what it remembers, what may be emptied or continued.

Shared by the copy migration of every generation (:mod:`.migrate`) and
by :mod:`.verify`, so the rules are one set:

* the **lock** (:data:`LOCK_KEY`, :func:`destination_lock`, placed by :func:`lock_site`) is
  taken by every run that writes into DST before it removes or writes anything and held to
  its end, so ``--overwrite`` never empties what another run is writing; it is no content
  of DST (never listed as such, never emptied);
* the **marker** (:data:`MARKER_KEY`) exists while a migration (or a reshard's copy)
  writes into DST: created before the first write, deleted after the root document;
* the **record** (:data:`RECORD_KEY`) is written right after the marker and stays: what
  DST was migrated from (the source as spelled and its canonical location) and with which
  options (generation, chunks per shard, index checksum and location, portable,
  dimension names, assumed layouts, consolidation). It is a small JSON object at DST's
  root, beside ``zarr.json``: no Zarr reader lists a root object that is not a
  directory as a node, and :func:`extra_nodes` never counts it;
* ``--resume`` continues DST only when its marker and its record say the same source and
  options as the run (:func:`check_resume`), else :class:`UsageError` (exit 2) naming
  what differs; a DST holding neither is not ours to continue;
* ``--overwrite`` empties DST only when it holds a Zarr hierarchy (a document of any
  generation at its root) or one of our markers or records (:func:`check_overwrite`,
  else :class:`DestinationExistsError`, exit 8, naming what is there); what identifies it
  is deleted last, so an interrupted emptying can be run again. A reshard's copy follows
  the same rule (:func:`prepare_plain`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..api.hierarchy import V2_ROOT_KEYS
from ..errors import DestinationExistsError, ShardingStoreError, UsageError
from ..formats import draft_metadata as dm
from ..formats.upgrade_journal import Claim
from ..stores import Inner
from ..stores.location import objects_url_prefix

if TYPE_CHECKING:
    from .options import StoreOptions

#: the object that marks a destination as a migration in progress (and records its options)
MARKER_KEY = ".sharding-store-migration.json"
#: the object that records, for good, what a destination was migrated from and how
RECORD_KEY = ".sharding-store-record.json"
#: the object a run writing into a destination holds until it ends (:func:`destination_lock`):
#: never counted as DST's content, never removed by ``--overwrite``
LOCK_KEY = ".sharding-store-lock.json"
#: root objects that make a directory a Zarr hierarchy (any generation) or a destination of ours
RECOGNISED = ("zarr.json", *V2_ROOT_KEYS, MARKER_KEY, RECORD_KEY)
#: what an option was when a marker written by an older version does not say it
DEFAULTS: dict[str, Any] = {
    "generation": "2022", "chunks_per_shard": None, "index_checksum": True, "index_location": "end",
    "portable": False, "dimension_names": None, "assume_chunks_per_shard": None, "consolidate": True,
    "target": "zarr", "virtual": False,
}
#: in-process stores are identified by ``id()``: no identity across runs, never compared
IN_PROCESS = ("mapping", "zarr")
NODE_DOCUMENT = "zarr.json"

Retried = Callable[..., Any]


def record(generation: str, src: str, source: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The marker's and the record's content: ``source`` is the source store's
    :class:`~sharding_store.stores.Location`, ``options`` those that shape DST."""
    unknown = set(options) - set(DEFAULTS)
    assert not unknown, unknown
    return {"migration": "sharding-store", "generation": generation, "src": src,
            "source": [source.kind, source.authority, source.path], **{k: options.get(k, DEFAULTS[k]) for k in DEFAULTS
                                                                       if k != "generation"}}


def _load(dst: Inner, key: str, retried: Retried) -> dict[str, Any] | None:
    """The JSON object at ``key`` (None: absent). Anything else there: :class:`UsageError`."""
    raw = retried(dst.get, key)
    if raw is None:
        return None
    doc = dm.json_object(raw)
    if doc is None:
        raise UsageError(f"{key}: not a record this tool wrote (not a JSON object); nothing to resume: "
                         "start again with --overwrite", key=key)
    return doc


def read_record(dst: Inner) -> dict[str, Any] | None:
    """DST's record (None: none, or not a JSON object: then nothing is taken from it)."""
    try:
        return _load(dst, RECORD_KEY, lambda fn, *a: fn(*a))
    except UsageError:
        return None


def recorded_dimension_names(doc: Mapping[str, Any] | None) -> dict[str, tuple[Any, ...]]:
    """The names ``--dimension-names`` gave, per array path, as the record keeps them."""
    names = (doc or {}).get("dimension_names")
    if not isinstance(names, dict):
        return {}
    return {p: tuple(n) for p, n in names.items() if isinstance(p, str) and isinstance(n, list)}


def _differences(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """In words: the source and the options in which ``previous`` differs from ``current``."""
    out = []
    before, now = previous.get("source"), current["source"]
    if before is None:
        pass  # a marker of a version before issue 12: it did not record the source's location
    elif not (isinstance(before, list) and len(before) == 3):
        out.append(f"source that cannot be told ({before!r}), not {current['src']!r}")
    elif before[0] not in IN_PROCESS and now[0] not in IN_PROCESS and before != now:
        out.append(f"read another source ({previous.get('src')!r}, at {':'.join(map(str, before))}), not "
                   f"{current['src']!r}")
    other = []
    for k in current:
        if k in ("src", "source", "migration"):
            continue
        was = previous.get(k, DEFAULTS.get(k))
        if was != current[k] or type(was) is not type(current[k]):
            other.append(f"{k}={was!r}, now {current[k]!r}")
    if other:
        out.append(f"used other options ({'; '.join(other)})")
    return out


def check_resume(dst: Inner, name: str, current: Mapping[str, Any], retried: Retried) -> bool:
    """Under ``--resume``: True when DST holds a migration to continue with ``current``
    (its marker and its record agree with it), False when DST is empty (a fresh start).
    :class:`UsageError` naming what differs, or when DST holds something not ours."""
    found = [(key, doc) for key in (MARKER_KEY, RECORD_KEY) if (doc := _load(dst, key, retried)) is not None]
    if not found:
        keys, prefixes = contents(dst, retried)
        if not keys and not prefixes:
            return False
        raise UsageError(f"{name}: nothing to resume (no {MARKER_KEY} nor {RECORD_KEY}: this destination is not "
                         "one of ours); start again with --overwrite", key=MARKER_KEY)
    for key, doc in found:
        diff = _differences(doc, current)
        if diff:
            what = "the interrupted migration" if key == MARKER_KEY else "the migration that wrote it"
            raise UsageError(f"{name}: {what} ({key}) {' and '.join(diff)}: resuming would mix two migrations; "
                             "resume with that source and those options, or start again with --overwrite", key=key)
    return True


# --------------------------------------------------------------------------- --overwrite


@dataclass
class Removal:
    """What ``--overwrite`` removes (or would remove): DST's top-level entries, each with
    its objects and bytes (a directory's name ends in ``/``)."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def objects(self) -> int:
        return sum(e["objects"] for e in self.entries)

    @property
    def bytes(self) -> int:
        return sum(e["bytes"] for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {"objects": self.objects, "bytes": self.bytes, "entries": list(self.entries)}


def _names(keys: Iterable[str], prefixes: Iterable[str], limit: int = 8) -> str:
    """Up to ``limit`` top-level names, escaped (``repr``), and how many more."""
    names = sorted([*keys, *prefixes])
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", … (+{len(names) - limit} more)" if len(names) > limit else "")


def contents(dst: Inner, retried: Retried = lambda fn, *a: fn(*a)) -> tuple[list[str], list[str]]:
    """DST's top-level keys and prefixes, its lock (:data:`LOCK_KEY`) left out: a destination
    that holds only a lock holds nothing."""
    keys, prefixes = retried(dst.list_dir, "")
    return [k for k in keys if k != LOCK_KEY], list(prefixes)


def check_overwrite(dst: Inner, name: str) -> tuple[list[str], list[str]]:
    """DST's top-level keys and prefixes, when ``--overwrite`` may empty it: it holds a
    Zarr hierarchy (a document of any generation at its root) or one of our markers or
    records; :class:`DestinationExistsError` (exit 8) naming what is there otherwise."""
    keys, prefixes = contents(dst)
    if (keys or prefixes) and not set(keys) & set(RECOGNISED):
        raise DestinationExistsError(
            f"{name}: --overwrite empties only a Zarr hierarchy or a destination of sharding-store, and this holds "
            f"neither (no {', '.join(RECOGNISED)} at its root; found {_names(keys, prefixes)}): remove its contents "
            "yourself, or choose another destination", key=name)
    return keys, prefixes


def removal(dst: Inner, keys: list[str], prefixes: list[str]) -> Removal:
    """What emptying DST removes, per top-level entry (each listed as a stream, counted)."""
    out = Removal()
    for key in sorted(keys):
        out.entries.append({"name": key, "objects": 1, "bytes": dst.size(key) or 0})
    for prefix in sorted(prefixes):
        n = size = 0
        for _, s in dst.list_sized(prefix):
            n, size = n + 1, size + (s or 0)
        out.entries.append({"name": prefix, "objects": n, "bytes": size})
    return out


def empty(dst: Inner, keys: list[str], prefixes: list[str]) -> None:
    """Empty DST, what identifies it (root documents, marker, record) last: an interrupted
    emptying leaves a DST that ``--overwrite`` still recognises. Its lock stays: the run
    emptying it holds it (:func:`destination_lock`)."""
    for prefix in prefixes:
        dst.delete_prefix(prefix)
    for key in sorted(keys, key=lambda k: k in RECOGNISED):
        if key != LOCK_KEY:
            dst.delete(key)


def describe_removal(r: Removal, human_bytes: Callable[[int], str], limit: int = 20) -> list[str]:
    """Lines for a dry run's report: what ``--overwrite`` would remove."""
    from .progress import plural

    lines = [f"  --overwrite would remove {plural(r.objects, 'object')}, {human_bytes(r.bytes)}:"]
    for e in r.entries[:limit]:
        lines.append(f"    {e['name']!r}: {plural(e['objects'], 'object')}, {human_bytes(e['bytes'])}")
    if len(r.entries) > limit:
        lines.append(f"    … (+{len(r.entries) - limit} more entries)")
    return lines


def prepare_plain(dst: Inner, name: str, *, overwrite: bool) -> None:
    """A destination without resume or dry run (reshard's copy): empty is ready; a non-empty
    one is refused, or with ``overwrite`` emptied when :func:`check_overwrite` recognises it
    (a directory of other files is never emptied; a local delete removes links, never what
    they point to)."""
    keys, prefixes = contents(dst)
    if not keys and not prefixes:
        return
    if not overwrite:
        raise DestinationExistsError(f"{name}: destination exists and is not empty (use --overwrite)", key=name)
    empty(dst, *check_overwrite(dst, name))


def prepare(dst: Inner, name: str, current: Mapping[str, Any], *, overwrite: bool, resume: bool, dry_run: bool,
            retried: Retried) -> tuple[bool, Removal | None]:
    """A destination to write into: empty, emptied (``overwrite``: recognised first), or
    continued (``resume``: :func:`check_resume`). Returns (whether a migration is being
    continued, what ``overwrite`` would remove under ``dry_run``: a dry run deletes nothing)."""
    if resume:
        return check_resume(dst, name, current, retried), None
    keys, prefixes = contents(dst)
    if not keys and not prefixes:
        return False, (Removal() if dry_run and overwrite else None)
    if not overwrite:
        raise DestinationExistsError(f"{name}: destination exists and is not empty (use --overwrite, or --resume "
                                     "to finish an interrupted migration)", key=name)
    keys, prefixes = check_overwrite(dst, name)
    if dry_run:
        return False, removal(dst, keys, prefixes)
    empty(dst, keys, prefixes)
    return False, None


# --------------------------------------------------------------------------- a destination's lock

def _holder(raw: bytes | None) -> Claim | None:
    """The run a lock object names (None: absent, or not a lock this tool wrote)."""
    try:
        doc = json.loads(raw or b"")
        return Claim.from_json(doc.get("owner") if isinstance(doc, dict) else None)
    except ValueError:
        return None


def lock_advice(where: str, holder: Claim | None, alive: bool | None) -> tuple[str, str]:
    """``(state, what to do)`` of the lock at ``where`` held by ``holder`` (None: a lock this
    tool cannot read), ``alive`` its :meth:`~Claim.alive`: the words of ``migrate``'s refusal
    (exit 8) and of ``info``, one place."""
    remove = f"remove {where} (only when no run of sharding-store writes there)"
    if holder is None:
        return "not one this run can read", f"wait for it to end, or {remove}"
    if alive:
        return "still running", "wait for it to end"
    if alive is None:
        return ("on another host: this host cannot tell whether it still runs",
                f"wait for it to end, or if it is dead {remove}")
    return ("no longer running (killed, or its host rebooted)",
            "nothing to remove: the next migrate or reshard into this destination takes the lock over "
            "(`migrate --resume` continues a migration)")


def _held(name: str, where: str, holder: Claim | None) -> DestinationExistsError:
    """Exit 8, one line: who holds the destination, and how to recover when it is dead."""
    state, advice = lock_advice(where, holder, None if holder is None else holder.alive())
    if holder is None:
        return DestinationExistsError(
            f"{name}: another migration or reshard is writing into this destination (its lock {where} is {state}); "
            f"nothing was changed by this run; {advice}", key=where)
    return DestinationExistsError(
        f"{name}: another migration or reshard is writing into this destination: its lock {where} is held by "
        f"{holder.describe()}, {state}; nothing was changed by this run; {advice}", key=where)


@dataclass(frozen=True)
class LockState:
    """A destination's lock as ``info`` finds it: the object, who holds it (None: not a lock
    this tool can read), whether the holder still runs (None: this host cannot tell)."""

    where: str
    holder: Claim | None
    alive: bool | None

    def advice(self) -> tuple[str, str]:
        """:func:`lock_advice` of this lock."""
        return lock_advice(self.where, self.holder, self.alive)

    def to_json(self) -> dict[str, Any]:
        state, advice = self.advice()
        holder = self.holder
        return {"object": self.where, "held_by": None if holder is None else holder.describe(),
                "action": None if holder is None else holder.action, "pid": None if holder is None else holder.pid,
                "host": None if holder is None else holder.host, "since": None if holder is None else holder.since,
                "running": self.alive, "state": state, "advice": advice}

    def text(self) -> str:
        """One line: the object, its holder, its state and what to do."""
        state, advice = self.advice()
        if self.holder is None:
            return f"lock: {self.where} is {state}; {advice}"
        return f"lock: {self.where} held by {self.holder.describe()}: {state}; {advice}"


def find_lock(dst: str, storage_options: Mapping[str, Any] | None) -> LockState | None:
    """The lock of the destination spelled ``dst`` (None: none), wherever a run of any kind
    would have put it (:func:`lock_site`): inside a directory or store, or beside a
    reference file or an Icechunk repository (what DST is while a run writes it cannot
    always be told: a reference file or a new repository may not exist yet), one read each."""
    from ..stores import as_inner

    name = dst.rstrip("/")
    sites: list[tuple[str, str]] = []
    local = _local_path(name)
    if not name.endswith(".json") or (local and os.path.isdir(local)):  # a directory is no reference file
        sites.append((os.path.abspath(local) if local else name, LOCK_KEY))
    beside = _beside(name)
    if beside not in sites:  # at a bucket's root the two are one
        sites.append(beside)
    for where, key in sites:
        try:
            store = as_inner(where, storage_options=storage_options)
            raw = store.get(key)
        except (ShardingStoreError, OSError, ValueError):
            continue  # nothing there to be read: no lock there
        if raw is not None:
            holder = _holder(raw)
            return LockState(f"{store.describe().rstrip('/')}/{key}", holder,
                             None if holder is None else holder.alive())
    return None


@contextlib.contextmanager
def destination_lock(store: Inner, key: str, name: str, action: str, retried: Retried = lambda fn, *a: fn(*a)
                     ) -> Iterator[None]:
    """Hold ``key`` in ``store`` (DST, or where DST's lock lives: :func:`lock_site`) for the
    block: every run that writes into a destination takes it *before* it removes or writes
    anything and releases it when it ends, so of two runs (``--overwrite``, ``--resume`` or
    plain) one writes and the other refuses (:class:`DestinationExistsError`, exit 8, naming the
    holder) having changed nothing. ``retried``: how a store call is retried.

    Created exclusively (``O_EXCL``-like locally, a conditional PUT on S3). A lock left by a run
    that was killed is taken over only when its holder is provably dead (this host and boot,
    no such process, a zombie, or another process under its pid), conditionally on the bytes
    read, so of two runs taking it over one wins; a holder on another host is never guessed
    dead: the message says which object to remove. Released (conditionally: only while it is
    still this run's) on any exit but a kill."""
    mine = json.dumps({"lock": "sharding-store", "owner": Claim.mine(action).to_json()}).encode()
    where = f"{store.describe().rstrip('/')}/{key}"
    from .jobs import fault_point  # here: a local DST's questions (info) need none of the job machinery

    fault_point("lock")  # nothing of DST has been removed or written yet
    try:  # (a store error names the lock's location: ``where``)
        created = retried(lambda _: store.create_exclusive(key, mine), where)
    except (NotADirectoryError, FileExistsError, IsADirectoryError) as e:
        raise DestinationExistsError(f"{name}: not a directory: a file is in the way of the destination "
                                     f"({e.strerror}); choose another destination", key=name) from e
    if not created:
        _take_over(store, key, name, where, mine, retried)
    try:
        yield
    finally:
        _release(store, key, mine)


def _take_over(store: Inner, key: str, name: str, where: str, mine: bytes, retried: Retried) -> None:
    """The lock at ``key`` made this run's when its holder is provably dead (conditionally on
    the bytes read); :class:`DestinationExistsError` naming the holder otherwise."""
    raw = retried(lambda _: store.get(key), where)
    holder = _holder(raw)
    if raw is not None and holder is not None and holder.alive() is False \
            and retried(lambda _: store.put_if_unchanged(key, mine, raw), where):
        return
    raise _held(name, where, None if raw is None else holder)


def _release(store: Inner, key: str, mine: bytes, attempts: int = 8) -> None:
    """Delete the lock while it is still this run's; best effort, retried (a lock left behind
    names this process: only its end makes it one a later run may take over)."""
    for _ in range(attempts):
        try:
            store.put_if_unchanged(key, None, mine)
            return
        except Exception:  # noqa: BLE001 - the error being raised, if any, is the one to report
            continue


def lock_site(dst: Any, opened: Inner, target: str, stores: StoreOptions) -> tuple[Inner, str]:
    """Where the lock of DST (as spelled; ``opened``: the store it names, or the reference file
    it is) lives: in a Zarr store itself; beside a reference file or an Icechunk repository
    (their name and :data:`LOCK_KEY`: a reference file is written whole at the end, and what
    an Icechunk session writes no other run sees before it commits, nor may a repository be
    created where a file already is). Every spelling of one DST (``file://``, ``~``, ``..``)
    names one place, so one lock. An Icechunk repository at a bucket's root has nothing beside
    it: its lock is :data:`LOCK_KEY` at the root, inside (no key Icechunk uses: it keeps its
    objects under ``refs/``, ``snapshots/``, ... and ``config.yaml``; the same object a copy
    into that bucket's root locks: one destination, one lock)."""
    parent, name = getattr(opened, "parent", None), getattr(opened, "name", None)
    if target == "references" and parent is not None and isinstance(name, str):
        return parent, name + LOCK_KEY
    if target == "icechunk" and isinstance(dst, (str, os.PathLike)):
        from .jobs import StoreRef

        where, key = _beside(os.fspath(dst).rstrip("/"))
        return StoreRef.of(where, stores.dst).open(), key
    return opened, LOCK_KEY


def _beside(spelled: str) -> tuple[str, str]:
    """``(directory, key)`` of the lock beside the object ``spelled`` names (its name and
    :data:`LOCK_KEY` in its parent); at a bucket's root (no parent to put it in) the root
    itself and :data:`LOCK_KEY`."""
    local = _local_path(spelled)
    head, _, name = (os.path.abspath(local) if local else spelled).rpartition("/")
    if not local and head.endswith(":/"):
        return spelled, LOCK_KEY
    return head or "/", name + LOCK_KEY


#: what reports call each kind of destination, by (target, virtual)
DESTINATION_KINDS = {("zarr", False): "copy", ("icechunk", True): "Icechunk virtual",
                     ("icechunk", False): "Icechunk materialised", ("references", True): "reference file"}
#: objects every Icechunk repository holds (its first snapshot; the main branch's ref)
ICECHUNK_MARKS = ("snapshots/1CECHNKREP0F1RSTCMT0", "refs/branch.main/ref.json")
ICECHUNK_HINT = "pip install 'sharding-store[icechunk]'"


def resolve_target(dst: Any, target: str | None, virtual: bool,
                   storage_options: Mapping[str, Any] | None = None) -> str:
    """What DST is (``MigrateOptions.target``) when not given: a name ending ``.json`` (not an
    existing directory) is a reference file; with ``virtual``, or a location holding an
    Icechunk repository (a local directory; a remote URL when ``storage_options``, DST's, are
    given: one or two existence checks there), an Icechunk repository; a store object that
    takes references is its own kind (``references``); anything else a Zarr store."""
    if target is not None:
        return target
    if not isinstance(dst, (str, os.PathLike)):
        return "references" if callable(getattr(dst, "takes_references", None)) and dst.takes_references() else "zarr"
    name = os.fspath(dst).rstrip("/")
    local = _local_path(name)
    if name.endswith(".json") and not (local and os.path.isdir(local)):  # a directory is no reference file
        return "references"
    if virtual:
        return "icechunk"
    if local and any(os.path.isfile(os.path.join(local, mark)) for mark in ICECHUNK_MARKS):
        return "icechunk"
    if not local and storage_options is not None and _remote_repository(name, storage_options):
        return "icechunk"
    return "zarr"


def _local_path(name: str) -> str:
    """The local path a DST name spells (``file://`` stripped, ``~`` expanded); "" for a URL."""
    local = name[len("file://"):] if name.startswith("file://") else name
    return os.path.expanduser(local) if "://" not in local and "::" not in local else ""


def copied_by_us(dst: Any, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether DST (a path or URL) holds the record a copy migration leaves (:data:`RECORD_KEY`):
    a stat on local disk, one existence check on a remote store (one that cannot be looked
    at holds none: opening it as a store then says why)."""
    name = os.fspath(dst).rstrip("/")
    local = _local_path(name)
    if local:
        return os.path.isfile(os.path.join(local, RECORD_KEY))
    from .jobs import StoreRef  # here: a local DST needs none of the job machinery

    try:
        return StoreRef.of(name, storage_options or {}).open().exists(RECORD_KEY)
    except (ShardingStoreError, OSError, ValueError):
        return False


def _remote_repository(url: str, storage_options: Mapping[str, Any]) -> bool:
    """Whether the objects every Icechunk repository holds are at the remote ``url`` (a
    location that cannot be looked at is none: opening it as a store then says why)."""
    from .jobs import StoreRef  # here: what a local DST is needs none of the job machinery

    try:
        inner = StoreRef.of(url, storage_options).open()
        return any(inner.exists(mark) for mark in ICECHUNK_MARKS)
    except (ShardingStoreError, OSError, ValueError):
        return False


def open_destination(dst: Any, target: str, virtual: bool, stores: StoreOptions, source: Inner | None = None, *,
                     read_only: bool = False, dry_run: bool = False) -> Inner:
    """The destination store of a migration, by ``target``: a Zarr store (the store DST
    names), a reference file (:class:`~sharding_store.stores.references.ReferenceFileSink`)
    or an Icechunk repository (``stores/icechunk_store.open_icechunk``, which needs the
    ``icechunk`` extra). ``source``: the store references point into (its location configures
    an Icechunk repository's virtual chunk container). Whatever DST is, the driver writes
    it through the one store interface and finishes it with :meth:`Inner.commit` after a
    complete run. ``read_only``: to read it (``verify``): a reference file is not written;
    ``read_only`` or ``dry_run``: an absent Icechunk repository is not created (it reads as empty);
    ``read_only`` with a ``source`` (verify): a reference file reads only objects of the source."""
    from .jobs import StoreRef

    if target == "zarr" or (not isinstance(dst, (str, os.PathLike)) and target != "icechunk"):
        return StoreRef.of(dst, stores.dst).open()
    if target == "references":
        within = objects_url_prefix(source.location()) if read_only and source is not None else None
        sink: Inner = importlib.import_module("sharding_store.stores.references").ReferenceFileSink(
            os.fspath(dst), stores.dst, source="" if source is None else source.describe(), source_options=stores.src,
            read_only=read_only, within=within)
        return sink
    try:
        module = importlib.import_module("sharding_store.stores.icechunk_store")
    except ImportError as e:
        missing = "" if e.name == "icechunk" else " (this version of sharding-store has no Icechunk support)"
        raise UsageError(f"{dst}: an Icechunk destination needs the icechunk package{missing}: {ICECHUNK_HINT}",
                         key=str(dst)) from None
    try:
        opened: Inner = module.open_icechunk(os.fspath(dst), stores.dst, virtual=virtual,
                                             source=None if source is None else source.location(),
                                             source_options=stores.src, create=not (read_only or dry_run))
    except ImportError:
        raise UsageError(f"{dst}: an Icechunk destination needs the icechunk package: {ICECHUNK_HINT}",
                         key=str(dst)) from None
    return opened


# --------------------------------------------------------------------------- verify


def extra_nodes(dst: Inner, groups: Iterable[str], nodes: Container[str]) -> Iterator[str]:
    """The node documents in DST at paths that are no node of the source, outside the
    source's arrays (``groups``: the source's group paths; ``nodes``: every source node
    path, damaged ones included). An array's directory is not listed here: its own
    listing reports what lies below it (:func:`extra_node_key`).

    Walks DST's directories without recursion: a source group's directory is listed; an
    unknown directory with a ``zarr.json`` is an extra node (not descended: what lies
    below it belongs to it), one without is listed further. Root objects that are not
    directories (the record, the marker) are no nodes."""
    group_paths = set(groups)
    stack = [""] if "" in group_paths else []  # a root array's own listing covers DST
    while stack:
        path = stack.pop()
        _, subs = dst.list_dir(f"{path}/" if path else "")
        for sub in sorted(subs, reverse=True):
            child = sub.rstrip("/")
            if child in group_paths:
                stack.append(child)
            elif child in nodes:
                continue  # an array of the source: see extra_node_key
            elif dst.exists(sub + NODE_DOCUMENT):
                yield sub + NODE_DOCUMENT
            else:
                stack.append(child)


def extra_node_key(key: str, prefix: str, nodes: Container[str]) -> bool:
    """Whether ``key``, listed below an array's ``prefix``, is the document of a node the
    source does not have (``nodes``: every source node path)."""
    if not key.endswith("/" + NODE_DOCUMENT) or len(key) <= len(prefix) + len(NODE_DOCUMENT):
        return False
    return key[: -len(NODE_DOCUMENT) - 1] not in nodes


__all__ = [
    "DESTINATION_KINDS", "ICECHUNK_HINT", "LOCK_KEY", "MARKER_KEY", "RECORD_KEY", "Removal", "check_overwrite",
    "check_resume", "contents", "copied_by_us", "destination_lock", "extra_node_key", "extra_nodes", "find_lock",
    "lock_advice", "lock_site", "LockState",
    "open_destination", "prepare", "prepare_plain", "read_record", "record", "recorded_dimension_names",
    "resolve_target",
]
