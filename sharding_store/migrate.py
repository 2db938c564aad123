"""``migrate``: a draft-era hierarchy becomes a final Zarr v3 hierarchy.

Every array gets the v1.0 ``zarr.json`` of the shared translation
(:func:`~sharding_store.v3_metadata.v3_array_document`), every group (explicit or
implicit) an explicit group document. Inner chunk payloads are copied verbatim; only
shard indices are rebuilt (checksummed, compacted). See :mod:`.migrate_units` for
the work units and how each is read and written.

Order of writes, so that a killed migration never leaves an array that reads wrong
values: an array's shards, then its ``zarr.json`` (zarr cannot open it before); groups
after all arrays; the root ``zarr.json`` last. A marker object records the options
so that ``resume=True`` continues with the same ones, skipping target shards whose
index parses (and checksums).

Damaged sources. An array whose metadata does not parse, or whose objects are shards
under metadata that lost its storage transformer (zarr-python 2.x ``resize()``), is
found while planning, as is one a v3 translation cannot express: the migration stops
before writing anything, or with ``skip_damaged`` leaves it out and reports why. A
damaged shard is found when its unit reads it: the array's ``zarr.json`` is then never
written (other arrays may be complete), and with ``skip_damaged`` the rest goes on and
the array's partial objects are removed. Payloads are copied verbatim, not decoded,
so a chunk whose payload cannot be decoded is carried over as it is (and fails in the
reader, as in the source).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numcodecs
from numcodecs.abc import Codec

from . import draft_metadata as dm
from .errors import (
    ChunkDecodeError,
    ChunkKeyError,
    DestinationExistsError,
    DraftMetadataError,
    MigrationError,
    ShardCorruptError,
    ShardingStoreError,
    UsageError,
)
from .hierarchy import DraftHierarchy, Node
from .inner import Inner
from .migrate_units import (
    ArrayJob,
    IndexLocation,
    StoreRef,
    Unit,
    UnitResult,
    check_picklable,
    list_sized,
    local_pair,
    plan_units,
    remove_temp_files,
    run_unit,
)
from .progress import progress_bar
from .reshard import fault_point
from .retry import run_bounded, with_retries
from .store import ArrayLayout
from .v3_metadata import portability_problems, v3_array_document, v3_group_document

MARKER_KEY = ".sharding-store-migration.json"
#: compressors that exist only as zarr-python's ``numcodecs.*`` codecs
NON_PORTABLE_COMPRESSORS = frozenset({"zlib", "bz2", "lz4", "lzma"})
#: what ``portable=True`` recompresses them to (zstd's own default level)
PORTABLE_COMPRESSOR: Codec = numcodecs.Zstd(level=3)
#: test hook: after this many completed work units the driver stops (to be killed)
PAUSE_ENV = "SHARDING_STORE_TEST_PAUSE_AFTER"
RETRY_ATTEMPTS = 4
RETRY_DELAY = 0.2
MiB = 1 << 20
#: errors that describe the source data (not the connection): the array is damaged
DAMAGE_ERRORS = (ShardCorruptError, ChunkDecodeError, ChunkKeyError, DraftMetadataError)
#: ``assume_chunks_per_shard``: array path -> chunks_per_shard its lost transformer had
AssumeChunksPerShard = Mapping[str, "int | Sequence[int]"]


def default_jobs(local: bool = False) -> int:
    """Work units run at once when the caller does not say. Between local paths a unit
    is system calls and memory copies that keep a core busy, so one thread per core:
    more only contend (on 2 cores, verifying 512 local shards took ~150 ms with 4
    threads, ~105 ms with 2). Remote stores wait on the network: twice the cores. At most 8."""
    cores = os.cpu_count() or 1
    return min(8, cores if local else 2 * cores)


def jobs_for(jobs: int | None, src: Inner, dst: Inner, executor: Executor | None) -> int:
    """``jobs`` when the caller gave it, else the default for these two stores. With an
    executor (a dask cluster) the remote default stays: its window follows the cluster,
    not this machine's cores."""
    return jobs or default_jobs(local=executor is None and local_pair(src, dst) is not None)


def node_key(path: str) -> str:
    """The v3 metadata key of the node at ``path`` (``zarr.json`` for the root)."""
    return f"{path}/zarr.json" if path else "zarr.json"


def node_prefix(path: str) -> str:
    return f"{path}/" if path else ""


def json_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


def is_v3_chunk_key(rest: str, separator: str, ndim: int) -> bool:
    """True when ``rest`` (relative to the array prefix) is a default-encoded chunk key."""
    parts = rest.split(separator)
    return parts[0] == "c" and len(parts) == ndim + 1 and all(p.isdigit() for p in parts[1:])


def damage_error(error: ShardingStoreError, path: str, consequence: str) -> ShardingStoreError:
    """The same error class (so the CLI exits with the same code), naming the array and the way out."""
    return type(error)(f"{error}; array '{path or '/'}' is damaged: {consequence}", key=error.key)


SKIP_HINT = "--skip-damaged migrates the other arrays and lists the damaged ones"


def lost_transformer(h: DraftHierarchy, node: Node) -> ShardingStoreError | None:
    """The error for an unsharded array whose objects are shards (one listing, one or two
    reads), or None: such an array must never be migrated as unsharded."""
    if node.meta is None or node.meta.is_sharded:
        return None
    from .inspect import detect_lost_transformer  # only unsharded arrays need the inspector

    others = other_prefixes(h, node.path)
    keys = [k for k, _ in list_sized(h.inner, dm.data_prefix(node.path)) if not (others and k.startswith(others))]
    found = detect_lost_transformer(h.inner, node.meta, sorted(keys))
    return None if found is None else found.error()


def assume_marker(assume: AssumeChunksPerShard | None) -> dict[str, list[int]] | None:
    """``assume_chunks_per_shard`` as the migration marker records it (None when empty)."""
    if not assume:
        return None
    return {dm.normalize_path(p): [c] if isinstance(c, int) else list(c) for p, c in sorted(assume.items())}


# --------------------------------------------------------------------------- report


@dataclass
class ArrayReport:
    path: str
    shards: int = 0  # target objects (shards, or chunks of an unsharded array)
    bytes: int = 0  # source bytes listed
    chunks_per_shard: list[int] | None = None
    recompressed: bool = False
    portable: bool = True


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

    def to_dict(self) -> dict[str, Any]:
        t = self.totals
        return {
            "src": self.src,
            "dst": self.dst,
            "dry_run": self.dry_run,
            "arrays": [asdict(a) for a in self.arrays],
            "groups": self.groups,
            "shards": self.shards,
            "bytes": self.bytes,
            "written": t.written,
            "copied": t.copied,
            "empty": t.empty,
            "chunks": t.chunks,
            "bytes_read": t.bytes_read,
            "bytes_written": t.bytes_written,
            "bytes_copied": t.bytes_copied,
            "dead_bytes_dropped": t.dead_bytes,
            "seconds": round(self.seconds, 3),
            "throughput_mib_s": round(self.bytes / MiB / self.seconds, 1) if self.seconds > 0 else None,
            "warnings": list(self.warnings),
            "skipped": {"shards": t.skipped, "arrays": list(self.skipped_arrays)},
            "verified": None if self.verification is None else self.verification.to_dict(),
        }

    def summary(self) -> str:
        """A few human lines."""
        head = f"{len(self.arrays)} arrays, {self.groups} groups: {self.shards} shards, {self.bytes / MiB:.1f} MiB"
        if self.dry_run:
            lines = [f"dry run: would migrate {head} from {self.src} to {self.dst}"]
            for a in self.arrays:
                cps = "unsharded" if a.chunks_per_shard is None else "x".join(map(str, a.chunks_per_shard)) + " chunks/shard"
                extra = ", recompressed to zstd" if a.recompressed else ""
                lines.append(f"  {a.path or '/'}: {a.shards} shards, {a.bytes / MiB:.1f} MiB, {cps}{extra}")
        else:
            t = self.totals
            rate = f" ({self.bytes / MiB / self.seconds:.0f} MiB/s)" if self.seconds > 0 else ""
            lines = [
                f"migrated {head} in {self.seconds:.1f} s{rate}",
                f"  {t.written} written, {t.copied} copied by the filesystem, {t.skipped} already done"
                + (f", {t.dead_bytes / MiB:.1f} MiB dead bytes dropped" if t.dead_bytes else ""),
            ]
            if self.verification is not None:
                lines.append(f"  verified: {self.verification.summary()}")
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"skipped {s['path'] or '/'} ({s['kind']}, {s['error']}): {s['reason']}" for s in self.skipped_arrays]
        return "\n".join(lines)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Options:
    chunks_per_shard: int | tuple[int, ...] | None = None
    index_checksum: bool = True
    index_location: IndexLocation = "end"
    portable: bool = False

    def marker(self, src: str) -> dict[str, Any]:
        cps = self.chunks_per_shard
        return {
            "migration": "sharding-store",
            "src": src,
            "chunks_per_shard": list(cps) if isinstance(cps, tuple) else cps,
            "index_checksum": self.index_checksum,
            "index_location": self.index_location,
            "portable": self.portable,
        }


@dataclass
class ArrayPlan:
    node: Node
    doc: dict[str, Any]
    job: ArrayJob
    report: ArrayReport


def portable_compressor(meta: dm.DraftArrayMeta) -> Codec | None:
    """The codec ``portable=True`` recompresses this array with, or None to keep its own."""
    if meta.compressor is not None and meta.compressor.codec_id in NON_PORTABLE_COMPRESSORS:
        return PORTABLE_COMPRESSOR
    return None


def plan_array(node: Node, src: StoreRef, dst: StoreRef, opts: Options) -> tuple[ArrayPlan, list[str]]:
    """Translate one array's metadata and describe its job; returns warnings too."""
    from .reshard import resolve_chunks_per_shard

    meta = node.meta
    assert meta is not None
    target = meta.chunks_per_shard
    if opts.chunks_per_shard is not None and meta.ndim == 0:
        target = ()  # a 0-d array's one chunk, whatever was asked for the others
    elif opts.chunks_per_shard is not None:
        target = resolve_chunks_per_shard(meta, opts.chunks_per_shard)
    compressor = portable_compressor(meta) if opts.portable else None
    doc = v3_array_document(
        meta,
        chunks_per_shard=target,
        index_codecs_checksum=opts.index_checksum,
        index_location=opts.index_location,
        compressor_override=compressor,
    )
    problems = portability_problems(meta, compressor) if compressor is not None else portability_problems(meta)
    warnings = []
    if problems:
        hint = "; --portable recompresses it to zstd" if portable_compressor(meta) and not opts.portable else ""
        warnings.append(f"{node.path or '/'}: only zarr-python will read it ({'; '.join(problems)}){hint}")
    job = ArrayJob(
        path=node.path,
        src=src,
        dst=dst,
        src_layout=ArrayLayout.from_meta(meta),
        dst_prefix=node_prefix(node.path),
        dst_cps=target,
        checksum=opts.index_checksum,
        index_location=opts.index_location,
        meta=meta if compressor is not None else None,
        compressor=compressor,
    )
    report = ArrayReport(node.path, chunks_per_shard=None if target is None else list(target),
                         recompressed=compressor is not None, portable=not problems)
    return ArrayPlan(node, doc, job, report), warnings


def other_prefixes(h: DraftHierarchy, path: str) -> tuple[str, ...]:
    """Data prefixes of the other arrays below this array's data prefix (not stray keys)."""
    own = dm.data_prefix(path)
    return tuple(p for p in (dm.data_prefix(n.path) for n in h.arrays() if n.path != path) if p.startswith(own))


def array_units(
    plan: ArrayPlan, h: DraftHierarchy, src: Inner, existing: Mapping[str, int | None] | None = None
) -> tuple[list[Unit], list[str]]:
    """The units of one array; ``existing``: the destination listing (key -> size)."""
    units, stray, nbytes = plan_units(
        plan.job, list_sized(src, plan.job.src_layout.prefix), existing=existing, ignore=other_prefixes(h, plan.node.path)
    )
    plan.report.bytes = nbytes
    plan.report.shards = len(units) if plan.job.dst_cps is not None else sum(len(u.sources) for u in units)
    warnings = [f"{plan.node.path or '/'}: {len(stray)} stray key(s) under its data prefix not migrated, e.g. {stray[0]}"] if stray else []
    return units, warnings


# --------------------------------------------------------------------------- running


def _run_with_retries(job: ArrayJob, unit: Unit, attempts: int, delay: float) -> UnitResult:
    """The function every worker runs: one unit, retried on transient errors."""
    return with_retries(run_unit, job, unit, attempts=attempts, base_delay=delay)


def _unit_name(job: ArrayJob, unit: Unit) -> str:
    return job.dst_key(unit.target) if unit.target is not None else unit.sources[0][1]


def _pause_after() -> int | None:
    value = os.environ.get(PAUSE_ENV)
    return int(value) if value else None


class _Driver:
    """Feeds every array's units to the executor and writes metadata as arrays complete."""

    def __init__(self, h: DraftHierarchy, plans: list[ArrayPlan], src: Inner, dst: Inner, report: MigrationReport,
                 *, resume: bool, attempts: int, delay: float, progress: bool | None, skip_damaged: bool) -> None:
        self.h, self.plans, self.src, self.dst, self.report = h, plans, src, dst, report
        self.resume, self.attempts, self.delay, self.skip_damaged = resume, attempts, delay, skip_damaged
        self.damaged: dict[str, ShardingStoreError] = {}
        self.remaining: dict[str, int] = {}
        self.root_doc: dict[str, Any] | None = None
        self.by_path = {p.node.path: p for p in plans}
        self.bar = progress_bar(0, "migrate", "shard", progress)

    def items(self) -> Iterator[tuple[Any, ...]]:
        for plan in self.plans:
            existing = dict(list_sized(self.dst, plan.job.dst_prefix)) if self.resume else None
            units, warnings = array_units(plan, self.h, self.src, existing)
            self.report.warnings += warnings
            self.remaining[plan.node.path] = len(units)
            self.bar.total += len(units)
            self.bar.refresh()
            if not units:
                self.finish(plan)
            for unit in units:
                if plan.node.path not in self.damaged:
                    yield plan.job, unit, self.attempts, self.delay

    def retried(self, fn: Any, key: str, *args: Any) -> Any:
        """``fn(key, *args)`` on the destination, retried like a unit; when the retries run
        out, a :class:`MigrationError` that says the destination is resumable."""
        try:
            return with_retries(fn, key, *args, attempts=self.attempts, base_delay=self.delay)
        except ShardingStoreError:
            raise
        except Exception as e:
            raise MigrationError(
                f"{key}: {type(e).__name__}: {e}; the destination is incomplete: run again with --resume", key=key
            ) from e

    def set(self, key: str, value: bytes) -> None:
        """A metadata write (as idempotent as a unit)."""
        self.retried(self.dst.set, key, value)
        fault_point("meta")

    def finish(self, plan: ArrayPlan) -> None:
        if plan.node.path == "":
            self.root_doc = plan.doc  # a root array's zarr.json is the hierarchy's: written last
        else:
            self.set(node_key(plan.node.path), json_bytes(plan.doc))

    def failed(self, job: ArrayJob, unit: Unit, e: Exception) -> None:
        """A unit gave up: its array is skipped as damaged (or named); anything else stops the run."""
        name = _unit_name(job, unit)
        if not isinstance(e, DAMAGE_ERRORS):
            raise MigrationError(
                f"{name}: {type(e).__name__}: {e}; the destination is incomplete: run again with --resume", key=name
            ) from e
        if not self.skip_damaged:
            raise damage_error(e, job.path, f"its zarr.json was not written; {SKIP_HINT}") from e
        if job.path not in self.damaged:
            self.damaged[job.path] = e
            self.report.skip(job.path, "damaged", e)

    def remove_damaged(self) -> None:
        """Delete what the completed units of damaged arrays wrote (their zarr.json never was)."""
        for path in self.damaged:
            job = self.by_path[path].job
            for key, _ in list(list_sized(self.dst, job.dst_prefix)):
                if is_v3_chunk_key(key[len(job.dst_prefix) :], job.src_layout.separator, job.src_layout.ndim):
                    self.retried(self.dst.delete, key)

    def run(self, executor: Executor, window: int) -> None:
        pause, done = _pause_after(), 0
        with self.bar:
            for (job, unit, *_), future in run_bounded(executor, _run_with_retries, self.items(), window=window):
                try:
                    result = future.result()
                except Exception as e:
                    self.failed(job, unit, e)
                    continue
                if job.path in self.damaged:
                    continue
                self.report.totals.add(result)
                self.bar.update(1)
                self.bar.set_postfix_str(f"{(result.bytes_read + result.bytes_copied) / MiB:.1f} MiB", refresh=False)
                self.remaining[job.path] -= 1
                if self.remaining[job.path] == 0:
                    self.finish(self.by_path[job.path])
                done += 1
                fault_point("unit")
                if pause is not None and done == pause:
                    print(f"sharding-store: test pause after {done} work units", file=sys.stderr, flush=True)
                    time.sleep(3600)


# --------------------------------------------------------------------------- the API


def _check_marker(driver: _Driver, current: Mapping[str, Any]) -> None:
    raw = driver.retried(driver.dst.get, MARKER_KEY)
    if raw is None:
        return
    previous = json.loads(raw)
    diff = [k for k in current if k != "src" and previous.get(k) != current[k]]
    if diff:
        raise UsageError(
            f"{MARKER_KEY}: the interrupted migration used other options ({', '.join(f'{k}={previous.get(k)!r}' for k in diff)}); "
            "resume with the same options, or start again with --overwrite",
            key=MARKER_KEY,
        )


def _prepare(src_ref: StoreRef, dst_ref: StoreRef, dst: Inner, *, overwrite: bool, resume: bool, dry_run: bool) -> None:
    from .reshard import _prepare_destination, _same_or_nested

    if src_ref.url is not None and dst_ref.url is not None and _same_or_nested(src_ref.url, dst_ref.url):
        raise UsageError(f"{dst_ref.describe()}: the destination is the source, inside it, or contains it", key=dst_ref.describe())
    if src_ref.url is None and src_ref.obj is dst_ref.obj:
        raise UsageError("the destination is the source store", key=dst_ref.describe())
    keys, prefixes = dst.list_dir("")
    if not (keys or prefixes) or resume:
        return
    if not overwrite:
        raise DestinationExistsError(
            f"{dst_ref.describe()}: destination exists and is not empty (use --overwrite, or --resume to finish an interrupted migration)",
            key=dst_ref.describe(),
        )
    if not dry_run:
        _prepare_destination(dst, dst_ref.describe(), True)


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


def migrate(
    src: Any,
    dst: Any,
    *,
    storage_options: Mapping[str, Any] | None = None,
    src_storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    chunks_per_shard: int | Sequence[int] | None = None,
    index_checksum: bool = True,
    index_location: IndexLocation = "end",
    portable: bool = False,
    overwrite: bool = False,
    resume: bool = False,
    dry_run: bool = False,
    verify: bool = True,
    skip_damaged: bool = False,
    skip_untranslatable: bool = False,
    assume_chunks_per_shard: AssumeChunksPerShard | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
    progress: bool | None = None,
    retries: int = RETRY_ATTEMPTS,
    retry_delay: float = RETRY_DELAY,
) -> MigrationReport:
    """Migrate the draft-era hierarchy at ``src`` into a new Zarr v3 hierarchy at ``dst``.

    ``src``/``dst`` are paths or fsspec URLs (or, without ``executor``, store objects).
    ``chunks_per_shard`` reshards every array (one number applies to every dimension);
    ``executor`` (e.g. ``distributed.Client(...).get_executor()``) runs the work units
    instead of a pool of ``jobs`` threads. ``skip_damaged`` leaves out (and reports)
    arrays that are damaged or that v3 cannot express instead of failing;
    ``skip_untranslatable`` is its older name. ``assume_chunks_per_shard`` (path ->
    chunks per shard) migrates arrays whose metadata lost its storage transformer as
    the shards they are. Raises the damage's own error class (e.g.
    :class:`ShardCorruptError`) naming the array, :class:`DestinationExistsError`,
    :class:`MigrationError` (untranslatable array; or a unit failed after retries:
    rerun with ``resume=True``) or :class:`VerificationError` (``verify=True``, the default).
    """
    started = time.perf_counter()
    skip_damaged = skip_damaged or skip_untranslatable
    if overwrite and resume:
        raise UsageError("overwrite and resume contradict each other: resume keeps what the destination holds")
    if index_location not in ("start", "end"):
        raise UsageError(f"index_location must be 'start' or 'end', got {index_location!r}")
    cps = tuple(chunks_per_shard) if isinstance(chunks_per_shard, Sequence) else chunks_per_shard
    opts = Options(cps, index_checksum, index_location, portable)
    src_ref = StoreRef.of(src, src_storage_options if src_storage_options is not None else storage_options)
    dst_ref = StoreRef.of(dst, dst_storage_options if dst_storage_options is not None else storage_options)
    if executor is not None:
        check_picklable(src_ref, dst_ref)
    src_inner, dst_inner = src_ref.open(), dst_ref.open()
    jobs = jobs_for(jobs, src_inner, dst_inner, executor)
    h = DraftHierarchy(src_inner, location=src_ref.describe(), strict=False)
    h.assume_sharded(assume_chunks_per_shard)
    report = MigrationReport(src_ref.describe(), dst_ref.describe(), dry_run=dry_run)
    plans = _plan_all(h, src_ref, dst_ref, opts, report, skip_damaged=skip_damaged)
    groups = [n for n in h.groups()]
    report.groups = len(groups)
    _prepare(src_ref, dst_ref, dst_inner, overwrite=overwrite, resume=resume, dry_run=dry_run)
    if dry_run:
        for plan in plans:
            report.warnings += array_units(plan, h, src_inner)[1]
        report.seconds = time.perf_counter() - started
        return report
    marker = {**opts.marker(src_ref.describe()), "assume_chunks_per_shard": assume_marker(assume_chunks_per_shard)}
    driver = _Driver(h, plans, src_inner, dst_inner, report, resume=resume, attempts=retries, delay=retry_delay,
                     progress=progress, skip_damaged=skip_damaged)
    if resume:
        _check_marker(driver, marker)
        remove_temp_files(dst_inner)
    driver.set(MARKER_KEY, json_bytes(marker))
    if executor is None:
        with ThreadPoolExecutor(jobs, thread_name_prefix="migrate") as pool:
            driver.run(pool, window=2 * jobs)
    else:
        driver.run(executor, window=4 * jobs)
    driver.remove_damaged()
    for node in sorted(groups, key=lambda n: (n.path == "", -n.path.count("/"))):  # the root last
        driver.set(node_key(node.path), json_bytes(v3_group_document(node.attributes)))
    if driver.root_doc is not None:
        driver.set(node_key(""), json_bytes(driver.root_doc))
    driver.retried(dst_inner.delete, MARKER_KEY)
    report.seconds = time.perf_counter() - started
    if verify:
        from .verify import verify as run_verify

        report.verification = run_verify(
            src_ref, dst_ref, jobs=jobs, executor=executor, progress=progress, retries=retries, retry_delay=retry_delay,
            assume_chunks_per_shard=assume_chunks_per_shard, skip_arrays=report.skipped_paths,
        )
        report.seconds = time.perf_counter() - started
    return report
