"""``migrate PATH --in-place``: upgrade a 2023-generation store to final Zarr v3 by rewriting only its documents.

A store of the 2023 intermediate generation whose chunk keys are already final holds
v1.0 shards and chunks: only its ``zarr.json`` documents are spelled as before v1.0. The
in-place upgrade rewrites just those documents (:func:`gen2023.normalise_node`, the one
translation, through :func:`node_plan.plan_hierarchy`, as the copy migration does), so
its cost depends on the number of nodes and shards, never on the bytes stored.

What the upgrade takes (anything else is refused before anything is written, one line,
the store unchanged):

* the 2023 generation only: a final v3 store is "already Zarr v3" (exit 7, as ``migrate``
  says), a 2022 ``meta/root`` store or Zarr v2 store is another layout (exit 2 / 7:
  migrate it to a destination);
* **keys already final**: every array's ``chunk_key_encoding`` is one v1.0 defines and the
  copy migration keeps: ``default`` with ``"/"`` or ``"."`` (``c/0/0``, ``c.0.0``) or ``v2``
  (``0.0``, ``0/0``) — :data:`FINAL_KEY_ENCODINGS` is the one place that says so; any other
  is refused (exit 2: migrate to a destination). Objects in an
  array's directory that are no chunk key of it are left as they are (a warning), as the
  copy migration leaves them out;
* **no data object changes**: a shard index that the document does not declare is decided
  from every shard's tail (:func:`node_plan.decide_reading`); zarrita's hidden CRC32C is
  declared, a plain index would need a CRC32C appended to every shard, which is refused
  (exit 2) unless ``index_checksum=False`` (``--no-index-checksum``: declared as
  ``[bytes little]``, nothing appended);
* damaged nodes (exit 3/4, naming the key) are refused unless ``skip_damaged``: then the
  damaged node and every node below it keep their documents untouched and are reported;
* a chunk or document that is a link out of the store is refused (exit 13).

Crash safety (:mod:`sharding_store.formats.upgrade_journal`): before the first document changes,
a journal holding every original document and its replacement is created exclusively
at the root (a second run, or one racing it, is refused with exit 10 naming ``--resume``
and ``--undo``). Then each document is replaced with one atomic put (the root's document
last; on object stores the others in parallel), the result is verified, and the journal
is deleted. Each
document is at every moment either its original or its replacement, so a run killed
anywhere is finished by ``--resume`` or rolled back byte for byte by ``--undo``. Each
put is conditional on the document still being what the journal says it was
(:meth:`Inner.put_if_unchanged`: an exchange-and-compare locally, ``If-Match`` on S3), so a
document another writer changed meanwhile is not overwritten (exit 10, naming it; the
windows that remain are in that method's docstring and the README).

Verification (``verify=True``), decided here: every document written is read back and
must equal the plan and be final v1.0 under :func:`gen2023.normalise_node`; the whole
hierarchy must now walk as final Zarr v3 (unless damaged nodes were left); and the index
of **every** shard of every rewritten sharded array is read (one tail read per shard, no
payload) and validated under the new document: entries inside the object, the declared
CRC32C checked. Payload bytes are not read: they did not change.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..api.hierarchy import ReadCache, detect, node_model, refuse_in_place_upgrade, walk_v3_nodes
from ..errors import (
    MigrationError,
    OtherGenerationError,
    ShardCorruptError,
    ShardingStoreError,
    StoreIOError,
    StoreNotFoundError,
    UsageError,
    VerificationError,
)
from ..formats import gen2023
from ..formats.draft_metadata import ENTRY_POINT_KEY, escape_name
from ..formats.upgrade_journal import (
    UPGRADE_JOURNAL_KEY,
    Claim,
    DocumentStep,
    UpgradeJournal,
    interrupted_upgrade,
    interrupted_upgrade_error,
    resume_upgrade_command,
    undo_upgrade_command,
    upgrade_status,
)
from ..formats.v3_documents import consolidated_metadata, same_json
from ..stores import Inner
from . import node_plan
from .jobs import StoreRef, cancelling, fault_point, with_retries
from .options import RunOptions, StoreOptions, UpgradeOptions, legacy_options
from .progress import plural
from .units import json_bytes, node_key

__all__ = ["FINAL_KEY_ENCODINGS", "InPlaceReport", "upgrade_in_place", "upgrade_leftovers", "upgrade_status"]

#: chunk key encodings whose keys the in-place upgrade takes as final: (name, separator)
FINAL_KEY_ENCODINGS = frozenset({("default", "/"), ("default", "."), ("v2", "."), ("v2", "/")})
#: threads for reads (and object-store writes): documents and shard tails are small requests
JOBS = 8
#: the fault-point phases of this module (tests kill the process there)
FAULT_UPGRADE = "upgrade"
FAULT_UNDO = "undo"
FAULT_CLAIM = "claim"


@dataclass
class InPlaceReport:
    """What an in-place upgrade did (or, in a dry run, would do)."""

    location: str
    action: str  # "upgrade" | "resume" | "undo" | "dry-run"
    arrays: int = 0  # array documents rewritten (planned)
    groups: int = 0  # group documents rewritten (planned), created ones included
    created: int = 0  # groups that had no document (an implicit group, the root included)
    written: int = 0  # documents written by this run
    restored: int = 0  # documents written back to their original (undo)
    deleted: int = 0  # documents deleted (undo of a created group document)
    already: int = 0  # documents already in their target state
    shards_checked: int = 0
    leftovers_removed: int = 0  # temporary files of an interrupted run removed
    changes: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    verified: bool | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.location, "destination": None, "action": self.action, "in_place": True, "arrays": self.arrays,
                "groups": self.groups, "created": self.created, "written": self.written, "restored": self.restored,
                "deleted": self.deleted, "already_done": self.already, "shards_checked": self.shards_checked,
                "leftovers_removed": self.leftovers_removed,
                "changes": self.changes, "skipped": self.skipped, "warnings": list(self.warnings),
                "verified": self.verified, "seconds": round(self.seconds, 3)}

    def summary(self) -> str:
        """A few human lines; the ``warnings`` are not in them (the CLI prints those on stderr)."""
        docs = f"{plural(self.arrays, 'array document')} and {plural(self.groups, 'group document')} ({self.created} created)"
        if self.action == "dry-run":
            lines = [f"dry run: would upgrade {self.location} in place: {docs}"]
            for path, changes in self.changes.items():
                lines += [f"  {path or '/'}: {c}" for c in changes]
        elif self.action == "undo":
            lines = [f"{self.location}: in-place upgrade undone: {plural(self.restored, 'document')} restored, "
                     f"{plural(self.deleted, 'created document')} deleted, {self.already} unchanged, in {self.seconds:.2f} s"]
        else:
            what = "upgrade resumed and completed" if self.action == "resume" else "upgraded in place to Zarr v3"
            lines = [f"{self.location}: {what}: {docs}; {self.written} written, {self.already} already done, "
                     f"in {self.seconds:.2f} s"]
            if self.verified:
                checked = plural(self.shards_checked, "shard index", "shard indices")
                lines.append(f"  verified: every document final v1.0, {checked} checked")
        if self.leftovers_removed:
            lines.append(f"  removed {plural(self.leftovers_removed, 'temporary file')} an interrupted run left")
        lines += [f"left as it was {escape_name(p) or '/'} (damaged): {r}" for p, r in self.skipped.items()]
        return "\n".join(lines)


# --------------------------------------------------------------------------- planning


def _key_encoding(doc: dict[str, Any]) -> tuple[str, str]:
    cke = doc["chunk_key_encoding"]
    name = cke["name"]
    sep = (cke.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    return name, sep


def _refuse_links(inner: Inner, plan: node_plan.Plan2023) -> None:
    """A listed object whose size the listing did not give is asked for it: a link out
    of the store raises :class:`LinkOutsideStoreError` (exit 13) there."""
    for a in plan.arrays:
        for key, size in a.objects:
            if size is None:
                inner.size(key)


def _plan(inner: Inner, location: str, *, index_checksum: bool,
          skip_damaged: bool) -> tuple[UpgradeJournal, InPlaceReport]:
    """The journal of a fresh upgrade (every refusal raised here, before any write)."""
    root_raw = inner.get(ENTRY_POINT_KEY)
    found = detect(ReadCache(inner), root_raw)  # the one walk: the node model and the plan use it
    refuse_in_place_upgrade(inner, location, root_raw, found)
    walk = found.walk
    if walk is None or not walk.nodes:
        raise StoreNotFoundError(f"{location}: no Zarr hierarchy here (no zarr.json)", key=ENTRY_POINT_KEY)
    if walk.first_2023() is None:
        raise OtherGenerationError(location, "Zarr v3", "already Zarr v3 (every zarr.json is final v1.0)",
                                   "nothing to upgrade; open it with zarr-python 3", key=ENTRY_POINT_KEY)
    model = node_model(inner, root_raw, location=location, detected=found)
    plan = node_plan.plan_hierarchy(model, left_out="left as it is")
    node_plan.refuse_damage(plan, skip_damaged, "nothing was changed")
    _refuse_links(inner, plan)
    for a in plan.arrays:
        key = node_key(a.path)
        name, sep = _key_encoding(a.normalised.document)
        if (name, sep) not in FINAL_KEY_ENCODINGS:
            example = "c" + sep + sep.join("0" * len(a.normalised.document["shape"])) if name == "default" else \
                ".".join("0" * len(a.normalised.document["shape"])) or "0"
            raise UsageError(
                f"{key}: array '{a.path or '/'}' has chunk_key_encoding {name!r} with separator {sep!r} (keys like "
                f"'{example}'): the in-place upgrade takes only stores whose keys are already the final default "
                f"spelling ('c/0/0'); migrate it to a destination: `sharding-store migrate {location} DST`", key=key)
        if a.appends(index_checksum):
            raise UsageError(
                f"{key}: array '{a.path or '/'}' declares no index_codecs and its shard indices carry no checksum: "
                "the final layout appends a CRC32C to every shard, which changes data objects and cannot be done in "
                "place; rerun with --no-index-checksum (declares [bytes little], only documents change) or migrate "
                f"to a destination: `sharding-store migrate {location} DST`", key=key)
    raws = {n.path: n.raw for n in walk.nodes}
    report = InPlaceReport(location, "upgrade", warnings=list(plan.warnings),
                           skipped={p: str(e) for p, e in plan.damaged.items()})
    steps: list[DocumentStep] = []
    root_array: DocumentStep | None = None
    for a in sorted(plan.arrays, key=lambda a: a.path):
        if not plan.changes.get(a.path):
            continue  # final already: left byte for byte
        step = DocumentStep(a.path, node_key(a.path), raws[a.path], json_bytes(a.document(index_checksum)))
        report.arrays += 1
        report.changes[a.path] = plan.changes[a.path]
        if a.path == "":
            root_array = step
        else:
            steps.append(step)
    for path, doc in plan.groups:  # deepest first, the root last
        if not plan.changes.get(path):
            continue
        if path == "" and "" in plan.consolidated:
            doc = _consolidated_root(doc, plan, raws, steps, report)
        original = raws.get(path)
        steps.append(DocumentStep(path, node_key(path), original, json_bytes(doc)))
        report.groups += 1
        report.created += original is None
        report.changes[path] = plan.changes[path]
    if root_array is not None:
        steps.append(root_array)
    journal = UpgradeJournal(location, index_checksum, steps, dict(report.skipped))
    return journal, report


def _consolidated_root(doc: dict[str, Any], plan: node_plan.Plan2023, raws: Mapping[str, bytes | None],
                       steps: Sequence[DocumentStep], report: InPlaceReport) -> dict[str, Any]:
    """The root group's document when it held consolidated metadata: the block written
    again from the documents the store holds after the upgrade (``steps``: every document
    but the root's), as the copy migration writes it; dropped when damaged nodes are left
    as they were (a block must not list documents that are not final v1.0)."""
    if plan.damaged:
        report.warnings.append(f"{ENTRY_POINT_KEY}: consolidated_metadata dropped (damaged nodes are left as they "
                               "were; readers walk the hierarchy instead)")
        return doc
    docs = {p: json.loads(raw) for p, raw in raws.items() if p and raw is not None}
    docs.update({s.path: json.loads(s.new) for s in steps})
    return {**doc, "consolidated_metadata": consolidated_metadata(docs)}


# --------------------------------------------------------------------------- running


class _Runner:
    """The writes and checks of one run. Reads go through a pool of ``jobs`` threads; so do
    writes on object stores (a put leaves nothing behind when the process dies), while a
    local directory is written one document at a time (milliseconds each), so that a kill
    never leaves a half-written temporary file that ``--undo`` would have to find."""

    def __init__(self, inner: Inner, location: str, report: InPlaceReport, retries: int, retry_delay: float,
                 jobs: int) -> None:
        self.inner, self.location, self.report = inner, location, report
        self.retries, self.retry_delay, self.jobs = retries, retry_delay, max(1, jobs)
        self.local = inner.local_path(UPGRADE_JOURNAL_KEY) is not None

    def retried(self, fn: Any, *args: Any) -> Any:
        return with_retries(fn, *args, attempts=self.retries, base_delay=self.retry_delay)

    def map(self, fn: Any, items: Sequence[Any], *, write: bool = False) -> list[Any]:
        """``fn`` over ``items`` (in order), on the pool unless writing locally."""
        if len(items) < 2 or self.jobs == 1 or (write and self.local):
            return [fn(item) for item in items]
        with cancelling(ThreadPoolExecutor(min(self.jobs, len(items)), thread_name_prefix="inplace")) as pool:
            return list(pool.map(fn, items))

    def states(self, journal: UpgradeJournal, action: str) -> list[tuple[DocumentStep, str]]:
        """Each step with the state of its document now; a document that is neither its
        original nor its replacement stops the run before any write (not overwritten)."""
        currents = self.map(lambda s: self.retried(self.inner.get, s.key), journal.steps)
        for s, current in zip(journal.steps, currents):
            if s.state(current) == "other":
                raise self.changed(s, current, action)
        return [(s, s.state(c)) for s, c in zip(journal.steps, currents)]

    def changed(self, s: DocumentStep, current: bytes | None, action: str) -> MigrationError:
        """The error (exit 10) for a document another writer changed: never written over."""
        what = "deleted" if current is None else "changed"
        return MigrationError(
            f"{s.key}: {what} by another writer since the in-place upgrade began (neither its original "
            f"nor its upgraded document): refusing to {action} over it; the journal "
            f"{UPGRADE_JOURNAL_KEY} holds both versions: put one of them back, then run "
            f"`{resume_upgrade_command(self.location)}` or `{undo_upgrade_command(self.location)}`", key=s.key)

    def put(self, s: DocumentStep, value: bytes | None, expected: bytes | None, action: str) -> None:
        """Replace one document only while it is still ``expected`` (re-checked at the write:
        :meth:`Inner.put_if_unchanged`); a document already ``value`` (a retried put that
        went through) is done; anything else is another writer's and is not overwritten."""
        if self.retried(self.inner.put_if_unchanged, s.key, value, expected):
            return
        current = self.retried(self.inner.get, s.key)
        if current != value:
            raise self.changed(s, current, action)

    def forward(self, states: list[tuple[DocumentStep, str]]) -> None:
        """Replace every document still original, the root's last (resumable at each step)."""
        todo = [s for s, state in states if state != "new"]
        self.report.already += len(states) - len(todo)

        def write(s: DocumentStep) -> None:
            self.put(s, s.new, s.original, "write")
            fault_point(FAULT_UPGRADE)

        root = [s for s in todo if s.key == ENTRY_POINT_KEY]
        self.map(write, [s for s in todo if s.key != ENTRY_POINT_KEY], write=True)
        self.map(write, root, write=True)
        self.report.written += len(todo)

    def backward(self, states: list[tuple[DocumentStep, str]]) -> None:
        """Write back every original (delete what had none), the root's first."""
        todo = [s for s, state in states if state != "original"]
        self.report.already += len(states) - len(todo)

        def restore(s: DocumentStep) -> None:
            self.put(s, s.original, s.new, "restore")
            fault_point(FAULT_UNDO)

        root = [s for s in todo if s.key == ENTRY_POINT_KEY]
        self.map(restore, root, write=True)
        self.map(restore, [s for s in todo if s.key != ENTRY_POINT_KEY], write=True)
        self.report.deleted += sum(s.original is None for s in todo)
        self.report.restored += sum(s.original is not None for s in todo)

    def verify(self, journal: UpgradeJournal, *, walk: bool) -> None:
        """See the module docstring: documents, every shard index, and (``walk``: on a
        resume, whose plan is not at hand) the generation of the whole hierarchy."""
        undo = f"`{undo_upgrade_command(self.location)}` restores the original documents"

        def check(s: DocumentStep) -> int:
            got = self.retried(self.inner.get, s.key)
            if got != s.new:  # another writer's since this run wrote it: exit 10, as before a write
                raise self.changed(s, got, "call the upgrade done")
            norm = gen2023.normalise_node(got, s.key)
            if not norm.is_final or norm.hidden_checksum is None:
                raise VerificationError(f"{s.key}: the upgraded document is not final v1.0 ({'; '.join(norm.changes)}); "
                                        f"{undo}", key=s.key)
            if norm.node_type != "array" or gen2023.sharding_of(norm.document) is None:
                return 0
            prefix = f"{s.path}/" if s.path else ""
            pattern = gen2023.chunk_key_pattern(norm.document)
            objects = [(k, size) for k, size in self.retried(lambda: list(self.inner.list_sized(prefix)))
                       if pattern.fullmatch(k[len(prefix):])]
            try:
                node_plan.check_declared_indices(self.inner, norm.document, objects)
            except ShardCorruptError as e:
                raise VerificationError(f"{e} (array '{s.path or '/'}' read through its upgraded document); {undo}",
                                        key=e.key) from e
            return len(objects)

        self.report.shards_checked += sum(self.map(check, journal.steps))
        self.verify_consolidated(journal, undo)
        if walk and not journal.skipped:
            first = walk_v3_nodes(self.inner).first_2023()
            if first is not None:
                raise VerificationError(f"{first}: still spelled as before v1.0 after the upgrade; {undo}", key=first)
        self.report.verified = True
        fault_point(FAULT_UPGRADE)

    def claim(self, journal: UpgradeJournal, raw: bytes, action: str, *,
              take_over: bool) -> tuple[UpgradeJournal, bytes]:
        """The journal held by this run (and its bytes), replaced conditionally on ``raw``:
        of two runs claiming the same journal at most one gets it."""
        holder = journal.owner
        if holder is not None and not take_over and holder.alive() is not False:
            raise self.held(holder)
        journal = journal.owned_by(Claim.mine(action))
        mine = journal.encode()
        fault_point(FAULT_CLAIM)  # (two runs racing for the journal are released together here)
        if not self.retried(self.inner.put_if_unchanged, UPGRADE_JOURNAL_KEY, mine, raw):
            now = self.retried(self.inner.get, UPGRADE_JOURNAL_KEY)
            if now != mine:
                other = None if now is None else UpgradeJournal.parse(now).owner
                raise self.held(other)
        return journal, mine

    def held(self, holder: Claim | None) -> MigrationError:
        """Exit 10: another run holds (or just took, or finished) the journal."""
        if holder is None:
            return MigrationError(f"{UPGRADE_JOURNAL_KEY}: another run changed or removed the journal while this one "
                                  "claimed it; nothing was changed by this run", key=UPGRADE_JOURNAL_KEY)
        alive = holder.alive()
        state = "still running" if alive else "no longer running" if alive is False else \
            "on another host: this host cannot tell whether it still runs"
        return MigrationError(
            f"{self.location}: the in-place upgrade is held by {holder.describe()}, {state}; nothing was changed by "
            f"this run; wait for it to end{'' if alive else ', or if it is dead rerun with --take-over'}",
            key=UPGRADE_JOURNAL_KEY)

    @contextlib.contextmanager
    def holding(self, journal: UpgradeJournal, mine: bytes) -> Iterator[None]:
        """On any error (not a kill) the claim is released, so that the next ``--resume`` or
        ``--undo`` need not take it over; best effort (the error raised is the first one)."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.inner.put_if_unchanged(UPGRADE_JOURNAL_KEY, journal.owned_by(None).encode(), mine)
            raise

    def tidy(self, journal: UpgradeJournal) -> None:
        """Remove the temporary files an interrupted run left next to the journal and to each
        journalled document (local stores: a write killed before its rename)."""
        keys = [UPGRADE_JOURNAL_KEY, *(s.key for s in journal.steps)]
        self.report.leftovers_removed += sum(self.map(self.inner.remove_temp_leftovers, keys))

    def verify_consolidated(self, journal: UpgradeJournal, undo: str) -> None:
        """A root document written with consolidated metadata must list exactly the node
        documents the store now holds (one more walk: a listing per group, a get per node)."""
        root = next((s for s in journal.steps if s.key == ENTRY_POINT_KEY), None)
        block = None if root is None else json.loads(root.new).get("consolidated_metadata")
        if block is None:
            return
        docs = {n.path: json.loads(n.raw) for n in walk_v3_nodes(self.inner).nodes if n.path}
        if not same_json(block, consolidated_metadata(docs)):
            raise VerificationError(f"{ENTRY_POINT_KEY}: consolidated_metadata does not list the upgraded "
                                    f"documents; {undo}", key=ENTRY_POINT_KEY)

    def finish(self, mine: bytes) -> None:
        """Delete the journal, only if this run still holds it."""
        if self.retried(self.inner.put_if_unchanged, UPGRADE_JOURNAL_KEY, None, mine):
            return
        now = self.retried(self.inner.get, UPGRADE_JOURNAL_KEY)
        if now is not None:  # (None: a retried delete whose first attempt went through)
            raise self.held(UpgradeJournal.parse(now).owner)


def upgrade_in_place(
    location: Any,
    options: UpgradeOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    **legacy: Any,
) -> InPlaceReport:
    """Upgrade the 2023-generation store at ``location`` (a path, fsspec URL or store object)
    to final Zarr v3 in place, rewriting only its ``zarr.json`` documents (module docstring).
    ``options``: :class:`~sharding_store.ops.options.UpgradeOptions`; ``run``: jobs (default
    8), retries, retry delay (no executor); ``stores.src``: the store's options. The
    keywords of 0.1.0 (``resume=True, jobs=4, storage_options={...}``) still work.

    ``resume`` finishes an interrupted run, ``undo`` rolls it back (the journal decides what
    they write; ``index_checksum`` and ``skip_damaged`` then do not apply); each first
    claims the journal (:mod:`~sharding_store.formats.upgrade_journal`): a journal held by a live
    run, or by one on another host unless ``take_over``, is exit 10 naming it. Raises
    :class:`UsageError` (exit 2: the store needs data objects changed, keys not final, a
    2022 store; nothing to resume or undo), :class:`StoreNotFoundError` (exit 7: already
    Zarr v3, Zarr v2, no hierarchy), the damage's own class (exit 3/4) without
    ``skip_damaged``, :class:`LinkOutsideStoreError` (13), :class:`MigrationError` (exit 10:
    an upgrade is already in progress or interrupted; a document changed by another
    writer) and :class:`VerificationError` (exit 9; the journal is kept, ``undo`` restores).
    """
    options, run, stores = legacy_options("upgrade_in_place", options or UpgradeOptions(), legacy, run, stores)
    run.refuse_executor("in-place upgrade")
    started = time.perf_counter()
    ref = StoreRef.of(location, run.one_store("in-place upgrade", stores))
    inner = ref.open()
    described = ref.describe()
    jobs = run.jobs_or(JOBS)
    if options.resume or options.undo:
        report = InPlaceReport(described, "resume" if options.resume else "undo")
        runner = _Runner(inner, described, report, run.retries, run.retry_delay, jobs)
        _recover(runner, undo=options.undo, verify=options.verify, dry_run=options.dry_run, take_over=options.take_over)
        report.seconds = time.perf_counter() - started
        return report
    journal = interrupted_upgrade(inner)
    if journal is not None:
        raise interrupted_upgrade_error(journal, described, "nothing was changed by this run")
    journal, report = _plan(inner, described, index_checksum=options.index_checksum, skip_damaged=options.skip_damaged)
    if options.dry_run:
        report.action = "dry-run"
        report.seconds = time.perf_counter() - started
        return report
    runner = _Runner(inner, described, report, run.retries, run.retry_delay, jobs)
    if not journal.steps:
        report.verified = None
        report.seconds = time.perf_counter() - started
        return report
    _upgrade(runner, journal.owned_by(Claim.mine("upgrade")), verify=options.verify)
    report.seconds = time.perf_counter() - started
    return report


def _upgrade(runner: _Runner, journal: UpgradeJournal, *, verify: bool) -> None:
    """A fresh run: the journal created exclusively (held by this run), then every document."""
    mine = journal.encode()
    if not runner.retried(runner.inner.create_exclusive, UPGRADE_JOURNAL_KEY, mine):
        raise interrupted_upgrade_error(UpgradeJournal.parse(runner.inner.get(UPGRADE_JOURNAL_KEY) or b"{}"),
                                        runner.location,
                                        "another run created its journal while this one planned; nothing was changed")
    with runner.holding(journal, mine):
        fault_point(FAULT_UPGRADE)
        runner.tidy(journal)
        try:
            states = runner.states(journal, "write")
        except MigrationError:  # changed between the plan and the journal: nothing written yet
            runner.finish(mine)
            raise
        with _interrupted_on_error(runner.location):
            runner.forward(states)
            if verify:
                runner.verify(journal, walk=False)
            runner.finish(mine)


def _recover(runner: _Runner, *, undo: bool, verify: bool, dry_run: bool, take_over: bool) -> None:
    """``--resume`` / ``--undo``: the journal claimed for this run first (at most one
    recovery runs), then every document read and written from the claimed journal."""
    action = "undo" if undo else "resume"
    raw = runner.retried(runner.inner.get, UPGRADE_JOURNAL_KEY)
    if raw is None:
        raise UsageError(f"{runner.location}: no interrupted in-place upgrade here (no {UPGRADE_JOURNAL_KEY}): "
                         f"nothing to {action}", key=UPGRADE_JOURNAL_KEY)
    journal = UpgradeJournal.parse(raw)
    runner.report.skipped = dict(journal.skipped)
    _count(runner.report, journal)
    if dry_run:
        runner.report.action = "dry-run"
        return
    journal, mine = runner.claim(journal, raw, action, take_over=take_over)
    with runner.holding(journal, mine), _interrupted_on_error(runner.location):
        runner.tidy(journal)
        if undo:
            runner.backward(runner.states(journal, "restore"))
        else:
            runner.forward(runner.states(journal, "write"))
            if verify:
                runner.verify(journal, walk=True)
        runner.finish(mine)


@contextlib.contextmanager
def _interrupted_on_error(location: str) -> Iterator[None]:
    """An error once the journal exists says how to end the upgrade (same class, same exit
    code): the store holds a mix of original and upgraded documents until then."""
    try:
        yield
    except (ShardingStoreError, OSError) as e:
        if isinstance(e, ShardingStoreError) and "--in-place --" in str(e):
            raise  # says it already
        hint = (f"the upgrade is interrupted: finish it with `{resume_upgrade_command(location)}` or roll it back "
                f"with `{undo_upgrade_command(location)}`")
        if isinstance(e, ShardingStoreError):
            raise type(e)(f"{e}; {hint}", key=e.key) from e
        cause = e.strerror or str(e) or type(e).__name__
        raise StoreIOError(f"{e.filename or 'a write'}: {type(e).__name__}: {cause}; {hint}",
                           key=str(e.filename) if e.filename else None) from e


def _count(report: InPlaceReport, journal: UpgradeJournal) -> None:
    for s in journal.steps:
        kind = json.loads(s.new).get("node_type")
        if kind == "array":
            report.arrays += 1
        else:
            report.groups += 1
            report.created += s.original is None


def upgrade_leftovers(inner: Inner, paths: Sequence[str]) -> list[str]:
    """Temporary files an interrupted write left next to the documents of the nodes at
    ``paths`` or next to the journal (one directory listing per node on local stores; none
    elsewhere): what ``info`` reports and the next run (or ``--resume``/``--undo``) removes."""
    keys = [UPGRADE_JOURNAL_KEY, *sorted({node_key(p) for p in paths})]
    return [leftover for key in keys for leftover in inner.temp_leftovers(key)]


