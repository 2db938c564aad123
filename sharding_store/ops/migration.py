"""``migrate``: a draft-era hierarchy becomes a final Zarr v3 hierarchy.

Every array gets the v1.0 ``zarr.json`` of the shared translation
(:func:`~sharding_store.formats.v3_documents.v3_array_document`), every group (explicit or
implicit) an explicit group document. Inner chunk payloads are copied verbatim; only
shard indices are rebuilt (checksummed, compacted). See :mod:`.migrate_units` for the
plan and the work units, :mod:`.jobs` for how they run.

Claiming the destination: before anything is written a marker object records the
options; it is created *exclusively* (``O_EXCL``-like locally, a conditional PUT on S3),
so of two migrations started into one destination only one proceeds, the other refuses
(:class:`DestinationExistsError`); then the record, which stays (:mod:`.destination`).
``resume=True`` continues under an existing marker and record with the same source and
options, skipping target shards whose index parses (and checksums); another source or
other options are refused, also on a finished destination. Other fsspec backends have no
atomic create: there two migrations started at the same instant can both claim it (a
documented limit). Before all that, and before ``overwrite`` empties a destination that
holds a Zarr hierarchy or one of our markers or records, the run takes DST's lock and
holds it to its end (:func:`~.destination.destination_lock`): a run that finds it held by
a live run refuses, having changed nothing.

Order of writes, so that a killed migration never leaves an array that reads wrong
values: an array's shards, then its ``zarr.json`` (zarr cannot open it before); groups
after all arrays; the root ``zarr.json`` last, then the marker is deleted.

Damaged sources. An array whose metadata does not parse, or whose objects are shards
under metadata that lost its storage transformer (zarr-python 2.x ``resize()``), is
found while planning, as is one a v3 translation cannot express: the migration stops
before writing anything, or with ``skip_damaged`` leaves it out and reports why. A
damaged shard is found when its unit reads it: the array's ``zarr.json`` is then never
written (other arrays may be complete), and with ``skip_damaged`` the rest goes on and
the array's partial objects are removed. Payloads are copied verbatim, not decoded,
so a chunk whose payload cannot be decoded is carried over as it is (and fails in the
reader, as in the source). A source with an unfinished in-place reshard is refused
(its array is hidden: migrating now would leave it out).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, overload

from ..api.hierarchy import DraftHierarchy, ReadCache, detect, node_model
from ..errors import (
    DestinationExistsError,
    DraftMetadataError,
    Interrupted,
    MigrationError,
    ShardingStoreError,
    StoreIOError,
    UsageError,
)
from ..formats import draft_metadata as dm
from ..formats.reshard_journal import refuse_interrupted_reshards
from ..formats.upgrade_journal import refuse_interrupted_upgrade
from ..formats.v3_documents import consolidated_metadata, v3_group_document
from ..stores import Inner
from ..stores.location import objects_url_prefix
from . import destination
from .destination import (
    DESTINATION_KINDS,
    ICECHUNK_HINT,
    RECORD_KEY,
    Removal,
    describe_removal,
    destination_lock,
    lock_site,
    open_destination,
    resolve_target,
)
from .jobs import (
    INLINE_BATCH,
    StoreRef,
    check_apart,
    check_picklable,
    collections_paused,
    copy_words,
    damage_error,
    default_jobs,
    fault_point,
    is_transient,
    jobs_for,
    lost_transformer,
    other_prefixes,
    run_units,
    with_retries,
)
from .options import (
    AssumeChunksPerShard,
    MigrateOptions,
    RunOptions,
    StoreOptions,
    UpgradeOptions,
    VerifyOptions,
    legacy_options,
)
from .progress import human_bytes, object_noun, plural, progress_bar
from .units import (
    DAMAGE_ERRORS,
    MARKER_KEY,
    ArrayJob,
    ArrayPlan,
    ArrayReport,
    Listed,
    Options,
    Present,
    Unit,
    UnitLog,
    UnitResult,
    array_units,
    decide_index,
    json_bytes,
    node_key,
    plan_array,
    refer_units,
    run_unit,
    virtual_refusal,
)

if TYPE_CHECKING:
    from concurrent.futures import Executor  # a type only: concurrent.futures loads with a pool

    from .upgrade import InPlaceReport

MiB = 1 << 20
SKIP_HINT = "--skip-damaged migrates the other arrays and lists the damaged ones"

__all__ = ["ICECHUNK_HINT", "MARKER_KEY", "ArrayReport", "MigrationReport", "default_jobs", "jobs_for", "migrate",
           "open_destination", "resolve_target"]


def assume_marker(assume: AssumeChunksPerShard | None) -> dict[str, list[int]] | None:
    """``assume_chunks_per_shard`` as the migration marker records it (None when empty)."""
    if not assume:
        return None
    return {dm.normalize_path(p): [c] if isinstance(c, int) else list(c) for p, c in sorted(assume.items())}


def incomplete(name: str, error: BaseException) -> ShardingStoreError:
    """The error a migration stops with when a unit or a write gave up after its retries.
    ``--resume`` is advised only where running again can help: after transient errors (and
    a source that changed while read), not after a full disk, a permission or a file in
    the way (:class:`StoreIOError`, exit 12, naming the cause)."""
    if isinstance(error, ShardingStoreError):
        again = ": run again with --resume" if isinstance(error, MigrationError) or error.exit_code == 12 else ""
        return type(error)(f"{error}; the destination is incomplete{again}", key=error.key or name)
    if isinstance(error, OSError) and not is_transient(error):
        cause = error.strerror or str(error) or type(error).__name__
        return StoreIOError(f"{name}: {type(error).__name__}: {cause}; the destination is incomplete "
                            "(retrying cannot help until the cause is fixed)", key=name)
    return MigrationError(
        f"{name}: {type(error).__name__}: {error}; the destination is incomplete: run again with --resume", key=name
    )


# --------------------------------------------------------------------------- report


@dataclass
class MigrationReport:
    """What a migration did (or, in a dry run, would do)."""

    src: str
    dst: str
    dry_run: bool = False
    arrays: list[ArrayReport] = field(default_factory=list)
    groups: int = 0
    totals: UnitResult = field(default_factory=UnitResult)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    #: arrays left out: ``{"path", "kind": "damaged" | "untranslatable", "error": class name, "reason"}``
    skipped_arrays: list[dict[str, str]] = field(default_factory=list)
    verification: Any = None  # a VerifyReport when verified
    #: how objects counted as ``copied`` were copied, in words (:func:`copy_words`)
    copied_by: str = ""
    #: a dry run with ``overwrite``: what emptying DST would remove
    removal: Removal | None = None
    #: what DST is: "copy", "Icechunk virtual", "Icechunk materialised", "reference file"
    destination: str = "copy"

    def skip(self, path: str, kind: str, error: ShardingStoreError) -> None:
        self.skipped_arrays.append({"path": path, "kind": kind, "error": type(error).__name__, "reason": str(error)})
        self.arrays = [a for a in self.arrays if a.path != path]

    @property
    def skipped_paths(self) -> dict[str, str]:
        return {s["path"]: s["reason"] for s in self.skipped_arrays}

    @property
    def bytes(self) -> int:
        return sum(a.bytes for a in self.arrays)

    @property
    def shards(self) -> int:
        return sum(a.shards for a in self.arrays)

    @property
    def all_shards(self) -> bool:
        """Whether every target object is a shard (no array is migrated unsharded): the
        counts are then called shards, else objects."""
        return all(a.chunks_per_shard is not None for a in self.arrays)

    def throughput(self) -> float | None:
        """MiB/s of the bytes this run wrote; None for a dry run or a run that wrote nothing."""
        moved = self.totals.bytes_now
        if self.dry_run or self.seconds <= 0 or not moved:
            return None
        return moved / MiB / self.seconds

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report, in the vocabulary every command shares (``source``,
        ``destination``, ``objects_written``, ...): target objects are ``objects`` (shards
        when the array is sharded, chunk objects when not), ``chunks_per_shard`` says which."""
        t = self.totals
        rate = self.throughput()
        return {
            "source": self.src,
            "destination": self.dst,
            "dry_run": self.dry_run,
            "destination_kind": self.destination,
            "arrays": [_array_dict(a) for a in self.arrays],
            "groups": self.groups,
            "objects": self.shards,
            "bytes": self.bytes,
            "objects_written": t.written,
            "objects_copied": t.copied,
            "objects_referenced": t.referenced,
            "objects_empty": t.empty,
            "chunks": t.chunks,
            "bytes_read": t.bytes_read,
            "bytes_written": t.bytes_written,
            "bytes_copied": t.bytes_copied,
            "dead_bytes_dropped": t.dead_bytes,
            "seconds": round(self.seconds, 3),
            "throughput_mib_s": None if rate is None else round(rate, 1),
            "warnings": list(self.warnings),
            "skipped": {"objects": t.skipped, "arrays": list(self.skipped_arrays)},
            "verified": None if self.verification is None else self.verification.to_dict(),
            **({"would_remove": self.removal.to_dict()} if self.removal is not None else {}),
        }

    def summary(self) -> str:
        """A few human lines. What this run wrote ("written now") is told apart from what an
        interrupted run had written ("already done"); a dry run shows no rate. The
        ``warnings`` are not in it: the CLI prints them on stderr, apart from the result."""
        sharded = self.all_shards
        head = (f"{plural(len(self.arrays), 'array')}, {plural(self.groups, 'group')}: "
                f"{self.shards} {object_noun(sharded, self.shards)}, "
                f"{human_bytes(self.bytes)}")
        lines = self._dry_run_lines(head) if self.dry_run else self._done_lines(head)
        lines += [f"skipped {dm.escape_name(s['path']) or '/'} ({s['kind']}, {s['error']}): {s['reason']}" for s in self.skipped_arrays]
        return "\n".join(lines)

    def _dry_run_lines(self, head: str) -> list[str]:
        lines = [f"dry run: would migrate {head} from {self.src} to {self.dst}"]
        for a in self.arrays:
            cps = ("unsharded" if a.chunks_per_shard is None
                   else ("x".join(map(str, a.chunks_per_shard)) or "1") + " chunks per shard")
            extra = ", re-encoded (--portable)" if a.recompressed else ""
            lines.append(f"  {a.path or '/'}: {a.shards} {object_noun(a.chunks_per_shard is not None, a.shards)}, "
                         f"{human_bytes(a.bytes)}, {cps}{extra}")
        if self.removal is not None:
            lines += describe_removal(self.removal, human_bytes)
        return lines

    def _done_lines(self, head: str) -> list[str]:
        t, sharded = self.totals, self.all_shards
        now = t.written + t.copied
        done = f"  written now: {now} {object_noun(sharded, now)}, {human_bytes(t.bytes_now)}"
        if t.copied:
            done += f" ({t.copied} by {self.copied_by or 'copy'})"
        if t.referenced:
            done += f"; referenced: {t.referenced} {object_noun(sharded, t.referenced)} of the source (no byte copied)"
        if t.skipped:
            done += f"; already done: {t.skipped} {object_noun(sharded, t.skipped)}"
        if t.empty:
            done += f"; {t.empty} without a live chunk, not written"
        if t.dead_bytes:
            done += f"; {human_bytes(t.dead_bytes)} dead bytes dropped"
        rate = self.throughput()
        speed = "" if rate is None else f" ({human_bytes(round(rate * MiB))}/s)"
        into = "" if self.destination == "copy" else f" (destination: {self.destination})"
        lines = [f"migrated {head}{into} in {self.seconds:.1f} s{speed}", done]
        lines += self._bytes_lines()
        recoded = [dm.escape_name("/" + a.path) for a in self.arrays if a.recompressed]
        if recoded:
            lines.append(f"  re-encoded (--portable: filters applied, zstd): {', '.join(recoded)}; "
                         "every other array's chunks copied verbatim")
        if self.verification is not None:
            lines.append(f"  verified: {self.verification.summary()}")
        return lines

    def _bytes_lines(self) -> list[str]:
        """Why the bytes written differ from the source's (the first line's size), when a
        complete run wrote every byte itself: the shard indices are rebuilt (with a 4-byte
        crc32c each), dead bytes are dropped, re-encoded chunks have other sizes."""
        t = self.totals
        delta = t.bytes_now - self.bytes
        if not delta or t.skipped or t.referenced:
            return []
        why = []
        if any(a.chunks_per_shard is not None for a in self.arrays):
            checksums = any(a.index_checksum for a in self.arrays)
            why.append("the shard indices rebuilt" + (" with a 4-byte crc32c checksum each" if checksums else ""))
        if t.dead_bytes:
            why.append("dead bytes dropped")
        if any(a.recompressed for a in self.arrays):
            why.append("the re-encoded arrays")
        sign = "+" if delta > 0 else "-"
        return [f"  {human_bytes(t.bytes_now)} written for {human_bytes(self.bytes)} in the source "
                f"({sign}{human_bytes(abs(delta))}: {', '.join(why) or 'index and layout'})"]


def _array_dict(a: ArrayReport) -> dict[str, Any]:
    """One array of the ``--json`` report: its target objects are ``objects``."""
    d = asdict(a)
    d["objects"] = d.pop("shards")
    return d


# --------------------------------------------------------------------------- running


def _run_with_retries(job: ArrayJob, unit: Unit, attempts: int, delay: float) -> UnitResult:
    """The function every worker runs: one unit, retried on transient errors."""
    return with_retries(run_unit, job, unit, attempts=attempts, base_delay=delay)


def _unit_name(job: ArrayJob, unit: Unit) -> str:
    return job.dst_key(unit.target) if unit.target is not None else unit.sources[0].key


class _Driver:
    """Feeds every array's units to the executor as its listing arrives, and writes an
    array's metadata once its listing is exhausted and its last unit has finished.

    Holds per array a few counters, never per shard: the units in flight are those of
    :func:`~sharding_store.ops.jobs.run_bounded`'s window (plus the interleaving span of
    :func:`~sharding_store.ops.units.job_units`), and under ``resume`` the
    destination's listing is read as a stream beside the source's (:class:`Present`)."""

    def __init__(self, h: DraftHierarchy, plans: list[ArrayPlan], src: Inner, dst: Inner, report: MigrationReport,
                 *, resume: bool, attempts: int, delay: float, progress: bool | None, skip_damaged: bool,
                 documents_first: bool = False, log: UnitLog | None = None) -> None:
        self.h, self.plans, self.src, self.dst, self.report = h, plans, src, dst, report
        #: a destination that shows nothing before its commit (Icechunk, a reference file) takes an
        #: array's zarr.json before its chunks (Icechunk needs it), the order no reader can see
        self.documents_first = documents_first
        self.resume, self.attempts, self.delay, self.skip_damaged = resume, attempts, delay, skip_damaged
        self.damaged: dict[str, ShardingStoreError] = {}
        self.remaining: dict[str, int] = {}  # units handed out and not finished, per array
        self.listing: dict[str, Listed] = {}  # per array, while its units are planned
        self.root_doc: dict[str, Any] | None = None
        self.by_path = {p.node.path: p for p in plans}
        self.virtual = dst.takes_references()
        #: where every planned unit is recorded (for the reference check that follows), or None
        self.log = log
        self.bar = progress_bar(None, "migrate", object_noun(report.all_shards, 1), progress)

    def present(self, plan: ArrayPlan) -> Present | None:
        """Under ``resume``: what the destination holds for this array, as a sorted stream."""
        if not self.resume:
            return None
        return Present(self.dst.list_sized(plan.job.dst_prefix), probe=self.dst.size)

    def items(self) -> Generator[tuple[Any, ...], None, None]:
        for plan in self.plans:
            path = plan.node.path
            # a virtual destination creates no file: units in the listing's order (no directory to spread over)
            units, listed = array_units(plan, self.h, self.src, self.present(plan), spread=not self.virtual)
            self.listing[path] = listed
            self.remaining[path] = 0
            if self.documents_first:
                self.set(node_key(path), json_bytes(plan.doc))
            job, damaged, remaining, grow, log = plan.job, self.damaged, self.remaining, self.bar.grow, self.log
            if log is not None:
                log.begin(path)
            for unit in units:
                if log is not None:
                    log.add(unit)
                if path in damaged:
                    continue  # the listing still runs out: it counts the array's objects
                remaining[path] += 1
                grow(unit.objects)
                yield job, unit, self.attempts, self.delay
            if log is not None:
                log.end(path)
            self.report.warnings += listed.warnings(path)
            self.done_if_complete(plan)
        self.bar.planned()  # every array listed: the bar's total is known

    def done_if_complete(self, plan: ArrayPlan) -> None:
        """Write an array's ``zarr.json`` once its units are all planned and finished."""
        path = plan.node.path
        listed = self.listing.get(path)
        if listed is None or not listed.done or self.remaining[path] or path in self.damaged:
            return
        del self.listing[path]
        self.finish(plan)

    def retried(self, fn: Any, key: str, *args: Any) -> Any:
        """``fn(key, *args)`` on the destination, retried like a unit; when the retries run
        out, the error :func:`incomplete` gives."""
        try:
            return with_retries(fn, key, *args, attempts=self.attempts, base_delay=self.delay)
        except Exception as e:
            raise incomplete(key, e) from e

    def set(self, key: str, value: bytes) -> None:
        """A metadata write (as idempotent as a unit)."""
        self.retried(self.dst.set, key, value)
        fault_point("meta")

    def claim(self, marker: bytes, name: str) -> None:
        """Create the marker, exclusively: of two migrations into one destination only one
        gets past this point. Under ``resume`` an existing marker (same source and options,
        checked before) is ours to continue. Then the record, with the marker's content."""
        try:
            created = with_retries(self.dst.create_exclusive, MARKER_KEY, marker,
                                   attempts=self.attempts, base_delay=self.delay)
        except (NotADirectoryError, FileExistsError, IsADirectoryError) as e:
            raise DestinationExistsError(
                f"{name}: not a directory: a file is in the way of the destination ({e.strerror}); choose another destination",
                key=name,
            ) from e
        except Exception as e:
            raise incomplete(MARKER_KEY, e) from e
        if not created and not self.resume:
            raise DestinationExistsError(
                f"{name}: another migration is writing into this destination (its {MARKER_KEY} appeared "
                "after the destination was found empty); wait for it, or use another destination",
                key=MARKER_KEY,
            )
        if not created:
            self.set(MARKER_KEY, marker)
        else:
            fault_point("meta")
        self.set(RECORD_KEY, marker)  # outlives the marker: what DST was migrated from, and how

    def finish(self, plan: ArrayPlan) -> None:
        if self.documents_first:
            return  # written before its units
        if plan.node.path == "":
            self.root_doc = plan.doc  # a root array's zarr.json is the hierarchy's: written last
        else:
            self.set(node_key(plan.node.path), json_bytes(plan.doc))

    def failed(self, job: ArrayJob, unit: Unit, e: Exception) -> None:
        """A unit gave up: its array is skipped as damaged (or named); anything else stops the run."""
        name = _unit_name(job, unit)
        if not isinstance(e, DAMAGE_ERRORS):
            raise incomplete(name, e) from e
        if not self.skip_damaged:
            raise damage_error(e, job.path, f"its zarr.json was not written; {SKIP_HINT}") from e
        if job.path not in self.damaged:
            self.damaged[job.path] = e
            self.report.skip(job.path, "damaged", e)

    def remove_damaged(self) -> None:
        """Delete what the completed units of damaged arrays wrote (their zarr.json never was,
        unless ``documents_first``: then it goes too)."""
        for path in self.damaged:
            job = self.by_path[path].job
            if self.documents_first:
                self.retried(self.dst.delete, node_key(path))
            for key, _ in self.dst.list_sized(job.dst_prefix):  # deletes keys listed already: safe
                if job.is_dst_key(key[len(job.dst_prefix) :]):
                    self.retried(self.dst.delete, key)

    def run(self, jobs: int, executor: Executor | None) -> None:
        """Every unit (:func:`~sharding_store.ops.jobs.run_units`: inline for one job), the
        bar counting target objects and the bytes written so far."""
        if self.virtual:
            self.run_references()
            return
        results = run_units(_run_with_retries, self.items(), jobs=jobs, executor=executor, name="migrate")
        advance = self.bar.advance
        with self.bar, closing(results):  # closed: pending units cancelled, on error or interruption
            for item, future in results:
                job, unit = item[0], item[1]
                try:
                    result = future.result()
                except Exception as e:
                    self.failed(job, unit, e)
                    continue
                if self.took(job, result):
                    advance(unit.objects, result.bytes_now)

    def run_references(self) -> None:
        """A virtual destination's units, a batch at a time in this thread
        (:func:`~sharding_store.ops.units.refer_units`: one tail read per batch), each unit's
        outcome taken as :meth:`run` takes it, the bar advanced once a batch (a reference
        unit is a few microseconds: a generator hop and an outcome object per unit cost a
        visible share of it). The garbage collector is held off meanwhile
        (:func:`~sharding_store.ops.jobs.collections_paused`: nothing per shard to collect)."""
        items = self.items()
        with self.bar, closing(items), collections_paused():  # closed: no further unit planned, on error or interruption
            while batch := list(itertools.islice(items, INLINE_BATCH)):
                objects = nbytes = 0
                for (job, unit, _, _), (ok, result) in zip(batch, refer_units(batch)):
                    if not ok:
                        self.failed(job, unit, result)
                    elif self.took(job, result):
                        objects += unit.objects
                        nbytes += result.bytes_now
                self.bar.advance(objects, nbytes)

    def took(self, job: ArrayJob, result: UnitResult) -> bool:
        """A unit's result counted (:meth:`run` and :meth:`run_references` alike): its array
        published once its last unit is in; False for a unit of an array found damaged
        meanwhile (left out, not counted)."""
        path = job.path
        if path in self.damaged:
            return False
        self.report.totals.add(result)
        self.remaining[path] -= 1
        if self.remaining[path] == 0:
            self.done_if_complete(self.by_path[path])
        fault_point("unit")
        return True


# --------------------------------------------------------------------------- the API


def _prepare(dst_ref: StoreRef, dst: Inner, current: Mapping[str, Any], report: MigrationReport, *, overwrite: bool,
             resume: bool, dry_run: bool, retries: int, delay: float) -> bool:
    """A destination to write into (:func:`destination.prepare`: empty, emptied by
    ``overwrite`` when it is recognised, or continued under ``resume`` with the source and
    options ``current`` records); a dry run deletes nothing and reports what ``overwrite``
    would remove. Returns whether an earlier migration is being continued."""

    def retried(fn: Any, *args: Any) -> Any:
        return with_retries(fn, *args, attempts=retries, base_delay=delay)

    continuing, report.removal = destination.prepare(dst, dst_ref.describe(), current, overwrite=overwrite,
                                                     resume=resume, dry_run=dry_run, retried=retried)
    return continuing


def _retried(run: RunOptions) -> Callable[..., Any]:
    """``retried(fn, key, ...)``: a destination call retried like a unit; when the retries run
    out, the error :func:`incomplete` gives (a file in the way is the caller's to say)."""

    def retried(fn: Callable[..., Any], key: str, *args: Any) -> Any:
        try:
            return with_retries(fn, key, *args, attempts=run.retries, base_delay=run.retry_delay)
        except (NotADirectoryError, FileExistsError, IsADirectoryError):
            raise
        except Exception as e:
            raise incomplete(key, e) from e

    return retried


def _plan_all(
    h: DraftHierarchy, src_ref: StoreRef, dst_ref: StoreRef, opts: Options, report: MigrationReport, *, skip_damaged: bool
) -> list[ArrayPlan]:
    """Every array's plan; damaged and untranslatable arrays raise (nothing is written yet)
    or, with ``skip_damaged``, go into the report."""
    for path, error in h.damaged.items():
        if not skip_damaged:
            raise damage_error(error, path, f"nothing was written; {SKIP_HINT}")
        report.skip(path, "damaged", error)
    plans = []
    for node in h.arrays():
        lost = lost_transformer(h, node)
        if lost is None:
            try:  # an array copied as it is (a codec chain we cannot decode), an undeclared index decided
                node = replace(node, meta=decide_index(h.inner, h.copy_meta(node), other_prefixes(h, node.path)))
            except DAMAGE_ERRORS as e:
                lost = e
        if lost is not None:
            if not skip_damaged:
                raise damage_error(lost, node.path, f"nothing was written; {SKIP_HINT}")
            report.skip(node.path, "damaged", lost)
            continue
        try:
            plan, warnings = plan_array(node, src_ref, dst_ref, opts)
        except DraftMetadataError as e:
            if not skip_damaged:
                raise MigrationError(f"{e} (nothing was written; --skip-damaged leaves such arrays out)", key=e.key) from e
            report.skip(node.path, "untranslatable", e)
            continue
        plans.append(plan)
        report.warnings += warnings
        report.arrays.append(plan.report)
    return plans


def _check_named_arrays(h: DraftHierarchy, names: Mapping[str, Any] | None) -> None:
    """Every path given dimension names is an array of the source (before anything is written)."""
    arrays = {n.path for n in h.arrays()}
    unknown = sorted(set(names or ()) - arrays)
    if unknown:
        raise UsageError(f"--dimension-names: no array at {', '.join(repr('/' + p) for p in unknown)} in the source")


@overload
def migrate(
    src: Any,
    dst: Any,
    options: MigrateOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    in_place: Literal[False] = False,
    **legacy: Any,
) -> MigrationReport: ...


@overload
def migrate(
    src: Any,
    dst: None = None,
    options: UpgradeOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    in_place: Literal[True],
    **legacy: Any,
) -> InPlaceReport: ...


def migrate(
    src: Any,
    dst: Any = None,
    options: MigrateOptions | UpgradeOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    in_place: bool = False,
    **legacy: Any,
) -> MigrationReport | InPlaceReport:
    """Migrate the draft-era hierarchy at ``src`` into a new Zarr v3 hierarchy at ``dst``
    (a copy; ``src`` is only read) and return its :class:`MigrationReport`.

    ``src``/``dst`` are paths or fsspec URLs (or, without an executor, store objects).
    ``options``: what is written (:class:`~sharding_store.ops.options.MigrateOptions`:
    chunks per shard, shard index, ``portable``, ``overwrite``/``resume``, ``dry_run``,
    ``verify``, ``skip_damaged``, ``assume_chunks_per_shard``, ``dimension_names``,
    ``consolidate``); ``run``: jobs, retries, progress, an executor (e.g.
    ``distributed.Client(...).get_executor()``) instead of a pool of threads;
    ``stores``: each side's store options. The keywords of 0.1.0 (``resume=True,
    jobs=4, storage_options={...}``, ``skip_untranslatable``) still work
    (:func:`~sharding_store.ops.options.legacy_options`). Raises the damage's own error class
    (e.g. :class:`ShardCorruptError`) naming the array, :class:`UsageError` (the
    destination is the source, inside it or contains it), :class:`DestinationExistsError`
    (not empty, or another migration claimed it), :class:`MigrationError` (untranslatable
    array; an unfinished in-place reshard in the source; or a unit failed after retries:
    rerun with ``resume=True``), :class:`StoreIOError` (a write failed in a way no retry
    helps) or :class:`VerificationError` (``verify=True``, the default).

    ``in_place=True`` (no ``dst``) is :func:`sharding_store.ops.upgrade.upgrade_in_place`
    (``options``: :class:`~sharding_store.ops.options.UpgradeOptions`) and returns its
    :class:`~sharding_store.ops.upgrade.InPlaceReport`, as the overloads say.
    """
    if in_place or legacy.get("undo"):
        return _upgrade_instead(src, dst, options, run, stores, in_place, legacy)
    legacy.pop("undo", None)  # undo=False: nothing to undo
    if isinstance(options, UpgradeOptions):
        raise UsageError("migrate: UpgradeOptions are for in_place=True (or upgrade_in_place)")
    if isinstance(dst, (MigrateOptions, UpgradeOptions)):
        raise TypeError("migrate(): the destination is an options record: pass it as options=...")
    if dst is None:
        raise UsageError("migrate: give a destination (or in_place=True for a 2023-generation store)")
    options, run, stores = legacy_options("migrate", options or MigrateOptions(), legacy, run, stores)
    return _copy(src, dst, options, run, stores)


#: keywords of 0.1.0 that only a copy migration takes, and when a value asks for something
#: (``migrate(path, in_place=True, index_location="end")`` asks for nothing and runs)
_COPY_ONLY: dict[str, Callable[[Any], bool]] = {
    "chunks_per_shard": lambda v: v is not None, "index_location": lambda v: v not in (None, "end"),
    "portable": bool, "overwrite": bool, "assume_chunks_per_shard": bool, "dimension_names": bool,
    "executor": lambda v: v is not None, "dst_storage_options": lambda v: v is not None,
    "consolidate": lambda v: False,  # the upgrade adds no consolidated metadata either way
}


def _upgrade_instead(src: Any, dst: Any, options: Any, run: RunOptions | None, stores: StoreOptions | None,
                     in_place: bool, legacy: dict[str, Any]) -> InPlaceReport:
    """``migrate(path, in_place=True, ...)``: :func:`~sharding_store.ops.upgrade.upgrade_in_place`;
    what only a copy takes is refused by name (the upgrade would silently not do it)."""
    from .upgrade import upgrade_in_place

    if not in_place:
        raise UsageError("undo applies to an in-place upgrade only: give in_place=True")
    if isinstance(options, MigrateOptions):
        raise UsageError("in-place upgrade: not with MigrateOptions (give UpgradeOptions, or a destination)")
    given = (["dst"] if dst is not None else []) + [k for k, asks in _COPY_ONLY.items() if k in legacy and asks(legacy[k])]
    if given:
        raise UsageError(f"in-place upgrade: not with {', '.join(given)} (it rewrites the documents of the store "
                         "and nothing else)")
    rest = {k: v for k, v in legacy.items() if k not in _COPY_ONLY}
    return upgrade_in_place(src, options, run=run, stores=stores, **rest)


def _check_addressable(src: Inner, name: str) -> None:
    """A virtual migration refers to the source's objects by URL: a source without URLs (a
    mapping, a memory store), whose path is no UTF-8 text (a reference file, a commit
    message hold it as text), or whose objects' URLs lie outside the prefix its location
    spells (an S3 prefix with ``//`` or ``/./``: checks and Icechunk's container go by that
    prefix) is refused (:class:`UsageError`) before anything is written."""
    key = dm.ENTRY_POINT_KEY
    ref = src.reference_to(key, 0, 0)
    if ref is None and src.exists(key):
        raise UsageError(f"{name}: --virtual needs a source another process can read by URL (a local directory or "
                         "s3://); this store has no URL for its objects", key=name)
    prefix = objects_url_prefix(src.location()) or ""
    if not all(_is_text(text) for text in (name, prefix)):
        raise UsageError(f"{dm.escape_name(name)}: --virtual names the source and its objects by URL, as text, and "
                         "this path (as given or resolved) is no UTF-8 text; rename it, or migrate with a copy "
                         "instead", key=name)
    if ref is not None and prefix and not ref.url.startswith(prefix):  # S3 keys may hold '//' and '/./' as such
        raise UsageError(f"{name}: its objects' URLs ({ref.url}) lie outside the prefix the source's location "
                         f"spells ({prefix}): a prefix with an empty or '.' segment; the references could not be "
                         "checked, nor Icechunk find them; migrate with a copy instead", key=name)


def _is_text(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a local path that is not decodes to lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def commit_message(src: str, kind: str) -> str:
    """The message of the commit that finishes a destination: the source and this tool (its
    version as ``--version`` prints it: asking the installed package's metadata cost every
    migration ~15 M instructions, a scan of the installed distributions)."""
    from .._version import __version__

    return f"sharding-store {__version__}: {kind} migration of {dm.escape_name(src)}"


@dataclass(frozen=True)
class _Sides:
    """The two stores of a migration, opened (DST by what it is) and checked apart."""

    src_ref: StoreRef
    dst_ref: StoreRef
    src: Inner
    dst: Inner
    kind: str = "copy"
    target: str = "zarr"
    virtual: bool = False

    @classmethod
    def open(cls, src: Any, dst: Any, o: MigrateOptions, run: RunOptions, stores: StoreOptions,
             held: contextlib.ExitStack) -> _Sides:
        """Both sides opened and checked apart; an Icechunk DST's lock entered into ``held``
        (unless a dry run) before it is opened, once it is known to be apart."""
        src_ref, dst_ref = StoreRef.of(src, stores.src), StoreRef.of(dst, stores.dst)
        target = resolve_target(dst, o.target, o.virtual, stores.dst or {})
        virtual = o.virtual or target == "references"
        kind = DESTINATION_KINDS.get((target, virtual))
        if kind is None:
            raise UsageError(f"--virtual: a Zarr store holds bytes, not references ({dst_ref.describe()}); give an "
                             "Icechunk repository or a reference file (DST ending .json)")
        if run.executor is not None and virtual:
            raise UsageError("--virtual with --scheduler/an executor: references are collected in this process "
                             "(they are small: no cluster is needed)")
        src_inner = src_ref.open()
        if virtual and not o.dry_run:
            _check_addressable(src_inner, src_ref.describe())
        if target == "references":  # opening a reference file reads it (if any), writes nothing
            dst_ref = StoreRef(dst_ref.url, dst_ref.storage_options,
                               open_destination(dst, target, virtual, stores, src_inner, dry_run=o.dry_run))
        if target == "icechunk" and not o.dry_run:  # opening writes its configuration: locked first, once apart
            check_apart(src_inner, dst_ref.open(), src_ref.describe(), dst_ref.describe())
            _lock(dst, dst_ref, target, stores, run, held)
        if target == "icechunk":  # opened once the source qualifies and DST is locked: opening may create it
            opened = open_destination(dst, target, virtual, stores, src_inner, dry_run=o.dry_run)
            dst_ref = StoreRef(dst_ref.url, dst_ref.storage_options, opened)
        if run.executor is not None:
            check_picklable(src_ref, dst_ref)
        sides = cls(src_ref, dst_ref, src_inner, dst_ref.open(), kind, target, virtual)
        check_apart(sides.src, sides.dst, src_ref.describe(), dst_ref.describe())
        return sides


def _lock(dst: Any, dst_ref: StoreRef, target: str, stores: StoreOptions, run: RunOptions,
          held: contextlib.ExitStack) -> None:
    """DST's lock (:func:`~.destination.destination_lock`, where :func:`~.destination.lock_site`
    puts it) taken and entered into ``held``: from before anything of DST is created, emptied
    or written (the source checked and planned first: a refusal there leaves nothing) to the
    run's end, verification included."""
    site = lock_site(dst, dst_ref.open(), target, stores)
    held.enter_context(destination_lock(*site, dst_ref.describe(), "migrate", _retried(run)))


def _copy(src: Any, dst: Any, o: MigrateOptions, run: RunOptions, stores: StoreOptions) -> MigrationReport:
    """The copy migration (:func:`migrate` without ``in_place``), on checked options, DST's
    lock held to the end (:func:`_lock`)."""
    with contextlib.ExitStack() as held:
        return _copy_held(src, dst, o, run, stores, held)


def _copy_held(src: Any, dst: Any, o: MigrateOptions, run: RunOptions, stores: StoreOptions,
               held: contextlib.ExitStack) -> MigrationReport:
    """:func:`_copy`, DST's lock entered into ``held`` (not by a dry run: it writes nothing)."""
    started = time.perf_counter()
    sides = _Sides.open(src, dst, o, run, stores, held)
    root_raw = sides.src.get(dm.ENTRY_POINT_KEY)
    detected = detect(ReadCache(sides.src), root_raw)  # the one detection (and walk) the model is built from
    if detected.per_node:  # an in-place upgrade (of a per-node store only) left half done: one get
        refuse_interrupted_upgrade(sides.src, sides.src_ref.describe())
    refuse_interrupted_reshards(sides.src, sides.src_ref.describe())
    run = replace(run, jobs=jobs_for(run.jobs, sides.src, sides.dst, run.executor))
    h = node_model(sides.src, root_raw, location=sides.src_ref.describe(), detected=detected)
    h.assume_sharded(o.assume_chunks_per_shard)
    if o.assume_chunks_per_shard:  # a guess the evidence contradicts is refused (the inspector loads only then)
        from ..api.evidence import check_assumed_layouts

        check_assumed_layouts(h, o.assume_chunks_per_shard)
    report = MigrationReport(sides.src_ref.describe(), sides.dst_ref.describe(), dry_run=o.dry_run,
                             copied_by=copy_words(sides.dst), destination=sides.kind)
    # a virtual destination keeps the source's index as it is: no checksum added
    opts = Options(o.chunks_per_shard, o.index_checksum and not sides.virtual, o.index_location, o.portable, o.names,
                   key_separator="/" if sides.target == "icechunk" else None)  # Icechunk's one key spelling
    plans = _plan_all(h, sides.src_ref, sides.dst_ref, opts, report, skip_damaged=o.skip_damaged)
    if sides.virtual:
        _refuse_new_bytes(plans)
    _check_named_arrays(h, o.names)
    report.groups = len(list(h.groups()))
    current = destination.record(h.label, sides.src_ref.describe(), sides.src.location(), {
        **opts.recorded(), "assume_chunks_per_shard": assume_marker(o.assume_chunks_per_shard),
        "consolidate": o.consolidate, "target": sides.target, "virtual": sides.virtual})
    if sides.target != "icechunk" and not o.dry_run:  # (an Icechunk DST's was taken before it was opened)
        _lock(dst, sides.dst_ref, sides.target, stores, run, held)
    _prepare(sides.dst_ref, sides.dst, current, report, overwrite=o.overwrite, resume=o.resume, dry_run=o.dry_run,
             retries=run.retries, delay=run.retry_delay)
    # the reference check after a virtual migration takes the units this one listed
    log = UnitLog() if sides.virtual and o.verify and not o.dry_run else None
    try:
        if o.dry_run:
            _list_all(plans, h, sides.src, report)
        else:
            _write_all(h, plans, sides, report, o, run, json_bytes(current), log)
        report.seconds = time.perf_counter() - started
        if o.verify and not o.dry_run:
            _verify_after(sides, o, run, stores, report, log)
            report.seconds = time.perf_counter() - started
    finally:
        if log is not None:
            log.close()
    return report


def _verify_after(sides: _Sides, o: MigrateOptions, run: RunOptions, stores: StoreOptions, report: MigrationReport,
                  log: UnitLog | None) -> None:
    """The verification after a complete migration: a virtual destination's references and
    documents read back, no chunk read (``verify SRC DST`` reads every chunk through them),
    against the units this migration listed (``log``: the source is not listed again)."""
    from .verification import verify as run_verify  # here: --no-verify and a dry run load no checker

    with _verifying():
        report.verification = run_verify(
            sides.src_ref, sides.dst_ref, VerifyOptions(assume_chunks_per_shard=o.assume_chunks_per_shard,
                                                        skip_arrays=report.skipped_paths,
                                                        references_only=sides.virtual),
            run=run, stores=stores, listed=log)


def _refuse_new_bytes(plans: list[ArrayPlan]) -> None:
    """A virtual migration whose options would need new bytes for an array: :class:`UsageError`
    (one line, naming the option and why), before anything is written."""
    for plan in plans:
        reason = virtual_refusal(plan.job)
        if reason is not None:
            raise UsageError(reason, key=plan.node.path)


def _list_all(plans: list[ArrayPlan], h: DraftHierarchy, src: Inner, report: MigrationReport) -> None:
    """A dry run: every array's units counted as listed, never held."""
    for plan in plans:
        units, listed = array_units(plan, h, src)
        for _ in units:
            pass
        report.warnings += listed.warnings(plan.node.path)


def _write_all(h: DraftHierarchy, plans: list[ArrayPlan], sides: _Sides, report: MigrationReport, o: MigrateOptions,
               run: RunOptions, marker: bytes, log: UnitLog | None = None) -> None:
    """Claim the destination, copy every array's units, then the groups' documents (the
    root last), then delete the marker: a killed run never leaves an array reading wrong.
    ``log``: where every unit planned is recorded."""
    driver = _Driver(h, plans, sides.src, sides.dst, report, resume=o.resume, attempts=run.retries,
                     delay=run.retry_delay, progress=run.progress, skip_damaged=o.skip_damaged,
                     documents_first=sides.kind != "copy", log=log)
    if o.resume:
        sides.dst.tidy()  # temporary files of writes the interrupted run left unfinished
    fault_point("claim")  # the destination was found empty (or resumable); nothing written yet
    driver.claim(marker, sides.dst_ref.describe())
    driver.run(run.jobs_or(1), run.executor)
    driver.remove_damaged()
    docs = {p.node.path: p.doc for p in plans if p.node.path not in driver.damaged}
    for node in sorted(h.groups(), key=lambda n: (n.path == "", -n.path.count("/"))):  # the root last
        doc = docs[node.path] = v3_group_document(node.attributes)
        if node.path == "" and o.consolidate:
            doc = {**doc, "consolidated_metadata": consolidated_metadata(docs)}
        driver.set(node_key(node.path), json_bytes(doc))
    if driver.root_doc is not None:
        driver.set(node_key(""), json_bytes(driver.root_doc))
    driver.retried(sides.dst.delete, MARKER_KEY)
    driver.retried(sides.dst.commit, commit_message(sides.src_ref.describe(), sides.kind))


@contextlib.contextmanager
def _verifying() -> Iterator[None]:
    """The verification after a complete migration: an interruption there is
    :class:`Interrupted` ``("verify")``: what remains is to verify, not to resume."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("verify") from None
