"""``verify``: is a migrated Zarr v3 hierarchy exactly its draft-era source?

Checks, for every node of the source: the destination ``zarr.json`` equals the shared
translation of the source metadata (with the layout options read back from the
destination document: chunks per shard, index checksum and location, a portable
recompression); every target shard's index parses and checksums; every inner chunk is
present with the same bytes (verbatim arrays) or the same decoded values (recompressed
ones); no target object exists where the source has no chunk, and no node document where
the source has no node (:func:`destination.extra_nodes`). Documents are compared as JSON
with their types (:func:`~sharding_store.formats.v3_documents.same_json`: ``false`` is not ``0``,
``-0.0`` is not ``0.0``); ``dimension_names`` only as the source has them or as DST's
record says ``--dimension-names`` gave them. The work units are the
migration's own (:mod:`.migrate_units`), run the same way (:mod:`.jobs`: threads or an
executor).

A destination that is missing, empty, or not a final Zarr v3 hierarchy at all (a
draft-era or a Zarr v2 store) is refused (:class:`StoreNotFoundError`) rather than
reported as differences; one with content but no root ``zarr.json`` (an interrupted
migration) is compared, and every missing document is a difference.

A shard built exactly as the migrator builds it is recognised with one comparison of
whole objects (on local disk, of the two files block by block); anything else is
compared chunk by chunk, so the first bad key can be named.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Container, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Executor  # a type only: concurrent.futures loads with a pool

from ..api.hierarchy import DraftHierarchy, Generation, Node, detect_generation, node_model, require_final_v3
from ..codec.buffers import io_buffer
from ..errors import (
    DraftMetadataError,
    LinkOutsideStoreError,
    ShardCorruptError,
    ShardingStoreError,
    StoreNotFoundError,
    VerificationError,
)
from ..formats import draft_metadata as dm
from ..formats.reshard_journal import refuse_interrupted_reshards
from ..formats.shard_index import CHECKSUM_NBYTES, encode_shard, index_nbytes, live_entries, read_index
from ..formats.v3_documents import consolidated_metadata, document_difference, same_json
from ..stores import Inner
from .destination import (
    extra_node_key,
    extra_nodes,
    open_destination,
    read_record,
    recorded_dimension_names,
    resolve_target,
)
from .jobs import (
    StoreRef,
    check_apart,
    check_picklable,
    damage_error,
    jobs_for,
    lost_transformer,
    other_prefixes,
    run_units,
    with_retries,
)
from .options import MAX_KEPT, RunOptions, StoreOptions, VerifyOptions, legacy_options
from .progress import NullBar, object_noun, plural, progress_bar
from .units import (
    DAMAGE_ERRORS,
    ArrayJob,
    ArrayPlan,
    Options,
    Present,
    SourceChunks,
    Unit,
    UnitLog,
    array_units,
    decide_index,
    node_key,
    node_prefix,
    plan_array,
    read_source_chunks,
    read_whole,
    virtual_refusal,
)

if TYPE_CHECKING:  # the reference check (and sqlite3) loads with a virtual destination only
    from .reference_check import Back

Problem = tuple[str, str]  # (key, what is wrong)


@dataclass
class UnitCheck:
    objects: int = 0
    chunks: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    n_problems: int = 0
    keep: int = MAX_KEPT

    def problem(self, key: str, message: str) -> None:
        self.n_problems += 1
        if len(self.problems) < self.keep:
            self.problems.append((key, message))

    def add(self, other: UnitCheck) -> None:
        self.objects += other.objects
        self.chunks += other.chunks
        self.bytes += other.bytes
        for key, message in other.problems:
            self.problem(key, message)
        self.n_problems += other.n_problems - len(other.problems)


@dataclass
class VerifyReport:
    src: str
    dst: str
    arrays: int = 0
    groups: int = 0
    check: UnitCheck = field(default_factory=UnitCheck)
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # damaged/untranslatable arrays: path -> reason
    #: every object checked is a shard (the summary and the bar say shards, else objects)
    all_shards: bool = True
    #: a reference check (``VerifyOptions.references_only``): what DST is and what its
    #: references were found to do, in words; None: every chunk was compared
    references: tuple[str, str] | None = None

    def skip(self, path: str, reason: str, dst: Inner) -> None:
        """Leave an array out; it must then be absent from the destination. A path that is
        no legal node path (a damaged key) cannot have been migrated and is not probed."""
        self.skipped[path] = reason
        try:
            dm.normalize_path(path)
        except ShardingStoreError:
            return
        key = node_key(path)
        if dst.get(key) is not None:
            self.check.problem(key, f"{key}: exists, but array '{path or '/'}' cannot be migrated: {reason}")

    @property
    def ok(self) -> bool:
        return self.check.n_problems == 0

    def to_dict(self) -> dict[str, Any]:
        c = self.check
        return {
            "source": self.src, "destination": self.dst, "ok": self.ok, "arrays": self.arrays, "groups": self.groups,
            "objects": c.objects, "chunks": c.chunks, "bytes": c.bytes, "seconds": round(self.seconds, 3),
            "differences": c.n_problems, "first": [{"key": k, "problem": m} for k, m in c.problems],
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped.items()],
            "checked": "chunks" if self.references is None else "references",
        } | ({} if self.references is None else {"chunks": None, "references": c.objects})

    def summary(self) -> str:
        c = self.check
        state = "identical" if self.ok else plural(c.n_problems, "difference")
        skipped = f", {plural(len(self.skipped), 'damaged array')} skipped" if self.skipped else ""
        if self.references is not None:
            kind, did = self.references
            what = (f"{plural(c.objects, 'reference')} {did}; documents identical" if self.ok else
                    f"{plural(c.objects, 'reference')} right, {state}")
            return (f"{plural(self.arrays, 'array')}, {kind}: {what}{skipped}; no chunk read (`sharding-store verify "
                    f"SRC DST` reads every chunk) ({self.seconds:.1f} s)")
        return (f"{plural(self.arrays, 'array')}, {c.objects} {object_noun(self.all_shards, c.objects)}, "
                f"{plural(c.chunks, 'chunk')}: "
                f"{state}{skipped} ({self.seconds:.1f} s)")

    def error(self) -> VerificationError:
        key, message = self.check.problems[0]
        return VerificationError(
            f"{self.dst} differs from {self.src}: {plural(self.check.n_problems, 'difference')}; first: {message}", key=key
        )


# --------------------------------------------------------------------------- metadata


def _load(dst: Inner, key: str) -> dict[str, Any] | None:
    raw = dst.get(key)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return {"<invalid JSON>": True}
    return doc if isinstance(doc, dict) else {"<not an object>": True}


def options_from_doc(doc: Mapping[str, Any]) -> Options:
    """The migration options a v3 array document was written with."""
    codecs = doc.get("codecs") or [{}]
    first = codecs[0] if isinstance(codecs[0], dict) else {}
    if first.get("name") != "sharding_indexed" or len(codecs) > 1:  # > 1: whole shards encoded, copied as they are
        return Options(None, True, None, portable=_ends_in_zstd(codecs))
    cfg = first.get("configuration", {})
    grid = doc["chunk_grid"]["configuration"]["chunk_shape"]
    cps = tuple(g // c for g, c in zip(grid, cfg["chunk_shape"]))
    checksum = any(c.get("name") == "crc32c" for c in cfg.get("index_codecs", []))
    return Options(cps, checksum, cfg.get("index_location", "end"), portable=_ends_in_zstd(cfg.get("codecs", [])))


def _ends_in_zstd(codecs: list[Any]) -> bool:
    return bool(codecs) and isinstance(codecs[-1], dict) and codecs[-1].get("name") == "zstd"


def _first_difference(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> str:
    return document_difference(expected, actual) or "documents differ"


def _array_plan(h: DraftHierarchy, node: Any, src: StoreRef, dst: StoreRef, doc: dict[str, Any], check: UnitCheck,
                names: Mapping[str, tuple[Any, ...]], key_separator: str | None = None) -> ArrayPlan | None:
    """The migration plan the destination document implies, or None (a problem is
    recorded). ``names``: the dimension names the destination's record says were given;
    ``key_separator``: the one key spelling of the destination (an Icechunk repository's, as
    its record says), else None."""
    key = node_key(node.path)
    try:
        opts = replace(options_from_doc(doc), key_separator=key_separator)
        if node.meta.is_sharded and opts.chunks_per_shard is None:
            raise ValueError("the source is sharded, the destination is not")
        if node.path in names:  # given to migrate (--dimension-names), as its record says
            opts = replace(opts, dimension_names={node.path: names[node.path]})
        plan, _ = plan_array(node, src, dst, opts)
        if not same_json(plan.doc, doc):  # the last codec does not tell whether --portable was given
            other, _ = plan_array(node, src, dst, replace(opts, portable=not opts.portable))
            plan = other if same_json(other.doc, doc) else plan
    except (KeyError, TypeError, AttributeError, ValueError, ZeroDivisionError, ShardingStoreError) as e:
        check.problem(key, f"{key}: cannot be matched to the source metadata ({e})")
        return None
    if not same_json(plan.doc, doc):
        check.problem(key, f"{key}: not the translation of the source metadata: {_first_difference(plan.doc, doc)}")
        return None
    return plan


def _check_destination(dst: Inner, name: str) -> None:
    """Refuse (exit 7) a destination that cannot be a migration's: missing or empty, a
    draft-era or Zarr v2 store, a ``zarr.json`` of no known version. One with objects
    but no root document (an interrupted migration) is compared: its gaps are differences."""
    generation, _ = detect_generation(dst, deep=False)  # every node is compared below
    if generation is Generation.FINAL_V3:
        return
    # nothing, or node documents without a root one (an implicit root): as interrupted
    if generation is not Generation.ZARR_V2 and not dst.exists(dm.ENTRY_POINT_KEY):
        keys, prefixes = dst.list_dir("")
        if keys or prefixes:
            return
        raise StoreNotFoundError(
            f"{name}: not a Zarr v3 hierarchy: nothing there (missing or empty); nothing was migrated to it",
            key=dm.ENTRY_POINT_KEY,
        )
    require_final_v3(dst, name, deep=False)  # raises, saying what the destination is instead


# --------------------------------------------------------------------------- units


def _same_values(job: ArrayJob, expected: bytes | memoryview, actual: bytes | memoryview, key: str) -> bool:
    """Equal payloads, or (recompressed arrays) payloads that decode to the same bits."""
    import numpy as np  # noqa: PLC0415 - numpy only where used (start-up)
    if job.target is None:
        return bytes(expected) == bytes(actual)
    from ..codec.chunk_codec import decode_chunk_payload

    assert job.meta is not None
    a = decode_chunk_payload(job.meta, expected, key=key)
    b = decode_chunk_payload(job.target, actual, key=key)
    return a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _as_migrated(job: ArrayJob, got: SourceChunks, blob: bytes) -> bool:
    """True when ``blob`` (whose index parsed and checksummed) is byte for byte what the
    migrator copies (the source shard, then its index CRC) or builds; one comparison."""
    if job.target is not None:
        return False
    if got.blob is not None and job.can_copy_shards and len(blob) == len(got.blob) + (CHECKSUM_NBYTES if job.appends else 0):
        if blob.startswith(got.blob):
            return True
    assert job.dst_cps is not None
    return blob == encode_shard(got.chunks, job.dst_cps, checksum=job.checksum, index_location=job.index_location)


BLOCK = 1 << 20  # bytes compared at a time by the local fast path
_buffers = threading.local()


def _same_contents(fd_a: int, fd_b: int, nbytes: int) -> bool:
    """Whether the first ``nbytes`` of two open files are equal: read into two reused
    per-thread buffers and compared with libc ``memcmp`` (:func:`_native.same_bytes`, which
    releases the GIL; a Python comparison without it). Fresh ``bytes`` per read cost page
    faults that double the time of a verify."""
    from ..codec import _native  # noqa: PLC0415 - ctypes and the bindings only where used (start-up)

    bufs = getattr(_buffers, "pair", None)
    if bufs is None or len(bufs[0]) != BLOCK:
        a, b = io_buffer(BLOCK), io_buffer(BLOCK)
        bufs = _buffers.pair = (a, b)
    a, b = bufs
    ma, mb = a.data, b.data
    done = 0
    while done < nbytes:
        k = min(BLOCK, nbytes - done)
        if os.preadv(fd_a, [ma[:k]], done) != k or os.preadv(fd_b, [mb[:k]], done) != k:
            return False  # shorter than it said: a changed file; the general path reports it
        if not _native.same_bytes(a, b, k):
            return False
        done += k
    return True


def _open_local(inner: Inner, key: str) -> int | None:
    """A read descriptor of the key's local file, or None (not local, missing, refused)."""
    try:
        return inner.open_local(key)  # by directory descriptors: no link swapped in since is followed
    except (OSError, ShardingStoreError):
        return None


def _check_local_copy(job: ArrayJob, unit: Unit, src: Inner, dst: Inner, key: str) -> UnitCheck | None:
    """A shard the migrator copied (the source shard, then its index CRC) checked in one
    pass on local disk: the destination's index parses and checksums, and its bytes up
    to the CRC are the source's. None: not such a shard, or not two local files
    (:meth:`Inner.local_path`); the general check decides."""
    if unit.dst_size is None:
        return None
    assert job.dst_cps is not None
    (_, src_key, _), = unit.sources
    fd_s = _open_local(src, src_key)
    if fd_s is None:
        return None
    try:
        fd_d = _open_local(dst, key)
        if fd_d is None:
            return None
        try:
            s_size, d_size = os.fstat(fd_s).st_size, os.fstat(fd_d).st_size
            n = index_nbytes(job.dst_cps, job.checksum)
            if d_size != s_size + (CHECKSUM_NBYTES if job.appends else 0) or d_size < n:
                return None
            try:
                live = live_entries(os.pread(fd_d, n, d_size - n), job.dst_cps, checksum=job.checksum, key=key,
                                    payload_limit=d_size - n)
            except ShardCorruptError:
                return None
            if not live or not _same_contents(fd_s, fd_d, s_size):
                return None
        finally:
            os.close(fd_d)
    finally:
        os.close(fd_s)
    # the source's index is the same bytes (so it parses with the same bounds): every
    # live chunk is byte for byte the source's
    return UnitCheck(objects=1, chunks=len(live), bytes=d_size)


def check_unit(job: ArrayJob, unit: Unit) -> UnitCheck:
    """Compare one unit's target objects with the source (the worker function)."""
    src, dst = job.src.open(), job.dst.open()
    if unit.target is not None and job.can_copy_shards:
        fast = _check_local_copy(job, unit, src, dst, job.dst_key(unit.target))
        if fast is not None:
            return fast
    out = UnitCheck()
    if unit.target is None:
        for (coords, src_key, size), dst_size in zip(unit.sources, unit.dst_sizes):
            key = job.dst_key(coords)
            expected = read_whole(src, src_key, size)
            actual = None if dst_size is None else read_whole(dst, key, dst_size)
            out.objects += 1
            if expected is None:
                continue
            if actual is None:
                out.problem(key, f"{key}: missing (source chunk {src_key})")
            elif not _same_values(job, expected, actual, key):
                out.problem(key, f"{key}: differs from source chunk {src_key}")
            out.chunks += 1
            out.bytes += len(actual or b"")
        return out
    key = job.dst_key(unit.target)
    got = read_source_chunks(job, unit, src)
    blob = None if unit.dst_size is None else read_whole(dst, key, unit.dst_size)
    out.objects += 1
    if not got.chunks:
        kept = job.keeps_keys and job.can_copy_shards and got.blob is not None  # copied as it is, empty or not
        if kept and blob is None:
            out.problem(key, f"{key}: missing (a shard of the source without a chunk, copied as it is)")
        elif blob is not None and not (kept and _as_migrated(job, got, blob)):
            out.problem(key, f"{key}: exists, but the source has no chunk in this shard")
        return out
    if blob is None:
        out.problem(key, f"{key}: missing ({len(got.chunks)} chunks in the source)")
        return out
    assert job.dst_cps is not None
    try:
        index = read_index(blob, job.dst_cps, checksum=job.checksum, index_location=job.index_location, key=key)
    except ShardCorruptError as e:
        out.problem(key, str(e))
        return out
    out.bytes += len(blob)
    out.chunks += len(got.chunks)
    if _as_migrated(job, got, blob):
        return out
    view = memoryview(blob)
    live = {c: (o, n) for c, o, n in index.live()}
    for c in sorted(set(live) | set(got.chunks)):
        where = f"{key} chunk {c}"
        if c not in live:
            out.problem(key, f"{where}: missing")
        elif c not in got.chunks:
            out.problem(key, f"{where}: present, but the source has no such chunk")
        else:
            o, n = live[c]
            if not _same_values(job, got.chunks[c], view[o : o + n], where):
                out.problem(key, f"{where}: differs from the source")
    return out


def _check_with_retries(job: ArrayJob, unit: Unit, attempts: int, delay: float) -> UnitCheck:
    return with_retries(check_unit, job, unit, attempts=attempts, base_delay=delay)


def _extra_object(job: ArrayJob, check: UnitCheck, nodes: Container[str]) -> Callable[[str], None]:
    """What the merge with the destination's listing calls for each listed key no unit
    accounts for: a chunk/shard key among them is reported (it would read as data), and a
    node document where the source (``nodes``: its node paths) has none."""

    def other(key: str) -> None:
        if job.is_dst_key(key[len(job.dst_prefix) :]):
            check.problem(key, f"{key}: unexpected object (the source has no chunk there)")
        elif extra_node_key(key, job.dst_prefix, nodes):
            check.problem(key, f"{key}: a node the source does not have")

    return other


SKIP_HINT = "--skip-damaged checks the other arrays"


def _unmigrated_reason(h: DraftHierarchy, node: Node) -> ShardingStoreError | None:
    """Why an array missing from the destination could not be migrated (a damaged shard
    index, or a translation v3 cannot express), or None: then it is simply missing.
    Costs one tail read per shard, and only for missing arrays."""
    from ..api.evidence import first_shard_damage

    if node.meta is None:
        return None
    try:
        damage = first_shard_damage(h.inner, node.meta, other_prefixes(h, node.path))
    except LinkOutsideStoreError as e:  # one of its objects links out of the store
        return e
    if damage is not None:
        return damage
    try:
        plan_array(node, StoreRef(None), StoreRef(None), Options())
    except DraftMetadataError as e:
        return e
    return None


# --------------------------------------------------------------------------- the API


def verify(
    src: Any,
    dst: Any,
    options: VerifyOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    listed: UnitLog | None = None,
    **legacy: Any,
) -> VerifyReport:
    """Compare the migrated hierarchy ``dst`` with its draft-era source ``src``
    (:class:`~sharding_store.ops.options.VerifyOptions`; ``run``: jobs, retries, progress,
    executor; ``stores``: each side's store options). The keywords of 0.1.0
    (``raise_on_error=False, jobs=4, storage_options={...}``) still work.

    Raises :class:`VerificationError` naming the first bad key and the number of
    differences (or returns the report with ``raise_on_error=False``; it keeps the first
    ``max_differences`` in full and counts all). A damaged source array raises its own
    error class, unless ``skip_damaged``: then arrays that ``migrate(skip_damaged=True)``
    leaves out must be absent from ``dst`` and are listed in ``report.skipped``.
    ``skip_arrays`` (path -> reason): arrays known to be left out.
    ``assume_chunks_per_shard``: as given to :func:`~sharding_store.ops.migration.migrate`.
    ``listed``: what a virtual migration just listed of ``src`` (the units it planned),
    handed over by :func:`~sharding_store.ops.migration.migrate` to its reference check: the
    source is then not listed again (each object is still looked at as it is now); an array
    it did not list whole is listed here.
    Raises :class:`StoreNotFoundError` when ``dst`` is missing, empty or not a Zarr v3
    hierarchy, :class:`UsageError` when it is the source itself, and
    :class:`MigrationError` when the source has an unfinished in-place reshard.
    """
    options, run, stores = legacy_options("verify", options or VerifyOptions(), legacy, run, stores)
    if not options.references_only:
        return _verify(src, dst, options, run, stores, listed)
    from .reference_check import collections_paused

    with collections_paused():
        return _verify(src, dst, options, run, stores, listed)


def _verify(src: Any, dst: Any, options: VerifyOptions, run: RunOptions, stores: StoreOptions,
            listed: UnitLog | None) -> VerifyReport:
    """:func:`verify`, its options made."""
    started = time.perf_counter()
    src_ref, dst_ref = StoreRef.of(src, stores.src), StoreRef.of(dst, stores.dst)
    src_inner = src_ref.open()
    back, h = None, None
    if options.references_only:  # DST read back from where it was committed; no chunk is read
        from .reference_check import read_back

        back = read_back(dst, stores, src_inner)
        dst_ref = StoreRef(dst_ref.url, dst_ref.storage_options, back.documents)
    elif (target := resolve_target(dst, None, False, stores.dst or {})) != "zarr":
        # a reference file, an Icechunk repository: read through what it is, refusing at once what leads
        # out of the source (so a SRC that is no draft hierarchy is first said to be that)
        h = _source_model(src_inner, src_ref)
        opened = open_destination(dst, target, False, stores, src_inner, read_only=True)
        dst_ref = StoreRef(dst_ref.url, dst_ref.storage_options, opened)
        if target == "icechunk":  # Icechunk follows links: a chunk through one out of the source is not read
            from ..stores.icechunk_store import inside_source

            inside_source(opened, src_inner.location())
    if run.executor is not None and back is None:  # references are checked in this process
        check_picklable(src_ref, dst_ref)
    dst_inner = dst_ref.open()
    check_apart(src_inner, dst_inner, src_ref.describe(), dst_ref.describe(), allow_nested=True)
    refuse_interrupted_reshards(src_inner, src_ref.describe())
    _check_destination(dst_inner, dst_ref.describe())
    jobs = jobs_for(run.jobs, src_inner, dst_inner, run.executor)
    report = VerifyReport(src_ref.describe(), dst_ref.describe(), check=UnitCheck(keep=options.max_differences))
    if back is not None:
        report.references = (back.kind, back.describe())
    if h is None:
        h = _source_model(src_inner, src_ref)
    _check_arrays(h, src_ref, dst_ref, dst_inner, report, options, replace(run, jobs=jobs), back, listed)
    report.check.problems.sort()  # units finish in any order: report the first keys in key order
    report.seconds = time.perf_counter() - started
    if options.raise_on_error and not report.ok:
        raise report.error()
    return report


def _source_model(src: Inner, ref: StoreRef) -> DraftHierarchy:
    """The source's hierarchy (:class:`StoreNotFoundError` when there is none)."""
    return node_model(src, src.get(dm.ENTRY_POINT_KEY), location=ref.describe())


def _check_arrays(h: DraftHierarchy, src_ref: StoreRef, dst_ref: StoreRef, dst_inner: Inner, report: VerifyReport,
                  options: VerifyOptions, run: RunOptions, back: Back | None = None,
                  listed: UnitLog | None = None) -> None:
    """Every node of the source's model against the destination, the arrays' units on
    ``run``'s executor (or a pool of ``run.jobs`` threads); with ``back`` (a virtual DST
    read back), their references instead, in this thread (the units ``listed`` where given)."""
    assume = options.assume_chunks_per_shard
    h.assume_sharded(assume)
    if assume:  # a guess the evidence contradicts is refused (the inspector loads only then)
        from ..api.evidence import check_assumed_layouts

        check_assumed_layouts(h, assume)
    checker = _Checker(h, src_ref, dst_ref, dst_inner, report, dict(options.skip_arrays or {}), options.skip_damaged,
                       run.retries, run.retry_delay)
    checker.groups()
    checker.plan_arrays()
    checker.extra_nodes()  # the bar counts shards only when every array checked is sharded
    jobs = run.jobs_or(1)
    with progress_bar(None, "verify", "reference" if back else object_noun(report.all_shards, 1), run.progress) as bar:
        checker.bar = bar
        if back is None:
            checker.run(jobs, run.executor)
        else:
            checker.references(back, listed)
    checker.consolidation()


class _Checker:
    """Checks the documents of every node and feeds every array's units to the executor."""

    def __init__(self, h: DraftHierarchy, src: StoreRef, dst: StoreRef, dst_inner: Inner, report: VerifyReport,
                 known: dict[str, str], skip_damaged: bool, retries: int, retry_delay: float) -> None:
        self.h, self.src, self.dst, self.dst_inner, self.report = h, src, dst, dst_inner, report
        self.check = report.check
        self.known, self.skip_damaged, self.retries, self.retry_delay = known, skip_damaged, retries, retry_delay
        self.consolidated: Any = None  # the root group's consolidated metadata, if it has one
        #: documents found right (path -> document) and paths whose document is not: what the
        #: consolidated metadata is compared with, without reading any document twice
        self.docs: dict[str, Any] = {}
        self.bad: set[str] = set()
        self.bar: NullBar = NullBar()  # counts target objects checked, and their bytes
        self.plans: list[ArrayPlan] = []  # the arrays whose units are checked (:meth:`plan_arrays`)
        #: the dimension names migrate was given, as DST's record says (none: none were)
        record = read_record(dst_inner)
        self.names = recorded_dimension_names(record)
        #: an Icechunk repository takes chunk keys of one spelling (``default``, ``/``): migrate wrote those
        self.key_separator = "/" if (record or {}).get("target") == "icechunk" else None
        #: every node path of the source, damaged ones included: any other node in DST is extra
        self.nodes = set(h.nodes) | set(h.damaged)
        for path, error in h.damaged.items():
            if path not in known and not skip_damaged:
                raise damage_error(error, path, SKIP_HINT)
            report.skip(path, known.get(path, str(error)), dst_inner)

    def groups(self) -> None:
        """Every group document is the translation of the source group's."""
        for node in self.h.groups():
            if node.path == "" and any(n.path == "" for n in self.h.arrays()):
                continue
            self.report.groups += 1
            key = node_key(node.path)
            expected = {"zarr_format": 3, "node_type": "group", "attributes": dict(node.attributes)}
            actual = _load(self.dst_inner, key)
            if node.path == "" and actual is not None and "consolidated_metadata" in actual:
                actual = dict(actual)
                self.consolidated = actual.pop("consolidated_metadata")
            if actual is None or not same_json(expected, actual):
                self.bad.add(node.path)
                self.check.problem(key, f"{key}: missing" if actual is None else f"{key}: {_first_difference(expected, actual)}")
            elif node.path:
                self.docs[node.path] = actual

    def extra_nodes(self) -> None:
        """A node document in DST where the source has no node is a difference (another
        source's nodes merged in, or a node added): outside the arrays here, below an
        array by its listing (:func:`_extra_object`)."""
        groups = (n.path for n in self.h.groups())
        for key in extra_nodes(self.dst_inner, groups, self.nodes):
            self.check.problem(key, f"{key}: a node the source does not have")

    def consolidation(self) -> None:
        """The root's consolidated metadata is exactly the documents the destination holds
        (each of which the other checks compare with the source)."""
        if self.consolidated is None:
            return
        expected = consolidated_metadata(self.docs)
        actual = self.consolidated if isinstance(self.consolidated, dict) else {"<not an object>": True}
        got = actual.get("metadata")
        if isinstance(got, dict) and self.bad:  # those documents are reported already
            actual = {**actual, "metadata": {p: d for p, d in got.items() if p not in self.bad}}
            got = actual["metadata"]
        if not same_json(expected, actual):
            key = node_key("")
            want = expected["metadata"]
            where = ""
            if isinstance(got, dict):
                for path in sorted(set(got) | set(want)):
                    if path not in got or path not in want or not same_json(want[path], got[path]):
                        a, b = got.get(path), want.get(path)
                        what = _first_difference(b, a) if isinstance(a, dict) and isinstance(b, dict) else (
                            "missing" if a is None else "not a node of the destination")
                        where = f"its entry for '{path}': {what}"
                        break
            self.check.problem(key, f"{key}: consolidated_metadata is not the destination's documents: "
                                    f"{where or _first_difference(expected, actual)}")

    def plan(self, node: Node) -> ArrayPlan | None:
        """The plan of one array, or None when it is left out (skipped, damaged, missing:
        what is wrong is recorded)."""
        self.report.arrays += 1
        if node.path in self.known:
            self.report.skip(node.path, self.known[node.path], self.dst_inner)
            return None
        lost = lost_transformer(self.h, node)
        if lost is None:
            try:  # as migrate plans it: copied as it is where we cannot decode, an undeclared index decided
                node = replace(node, meta=decide_index(self.h.inner, self.h.copy_meta(node),
                                                       other_prefixes(self.h, node.path)))
            except DAMAGE_ERRORS as e:
                lost = e
        if lost is not None:
            if not self.skip_damaged:
                raise damage_error(lost, node.path, SKIP_HINT)
            self.report.skip(node.path, str(lost), self.dst_inner)
            return None
        key = node_key(node.path)
        doc = _load(self.dst_inner, key)
        why = _unmigrated_reason(self.h, node) if doc is None else None
        if why is not None and not self.skip_damaged:
            raise damage_error(why, node.path, f"it was not migrated; {SKIP_HINT}")
        if why is not None:
            self.report.skipped[node.path] = str(why)
            return None
        if doc is None:
            self.check.problem(key, f"{key}: missing (array '{node.path or '/'}' was not migrated)")
            return None
        try:
            plan = _array_plan(self.h, node, self.src, self.dst, doc, self.check, self.names, self.key_separator)
        except DraftMetadataError as e:  # an array migrate could not translate (skipped there)
            self.check.problem(key, f"{key}: {e}")
            plan = None
        if plan is None:
            self.bad.add(node.path)
        elif node.path:
            self.docs[node.path] = doc
        return plan

    def plan_arrays(self) -> None:
        """Every array's plan (its destination document read and checked), before any unit runs."""
        self.plans = [plan for plan in map(self.plan, self.h.arrays()) if plan is not None]
        self.report.all_shards = all(plan.job.dst_cps is not None for plan in self.plans)

    def items(self) -> Iterator[tuple[Any, ...]]:
        for plan in self.plans:
            # the destination's listing is merged with the units as both arrive (never held)
            present = Present(self.dst_inner.list_sized(plan.job.dst_prefix),
                              other=_extra_object(plan.job, self.check, self.nodes),
                              probe=self.dst_inner.size)
            units, _ = array_units(plan, self.h, self.h.inner, present)
            for unit in units:
                self.bar.grow(unit.objects)
                yield plan.job, unit, self.retries, self.retry_delay
            present.close()
        self.bar.planned()  # every array listed: the bar's total is known

    def run(self, jobs: int, executor: Executor | None) -> None:
        """Every unit (:func:`~sharding_store.ops.jobs.run_units`: inline for one job)."""
        results = run_units(_check_with_retries, self.items(), jobs=jobs, executor=executor, name="verify")
        with closing(results):  # closed: pending units cancelled, on error or interruption
            for (job, *_), future in results:
                self._collect(job, future)

    def references(self, back: Back, listed: UnitLog | None = None) -> None:
        """Every array's references read back and checked against its source objects
        (:mod:`.reference_check`), then what no unit accounts for: no chunk is read. An
        array's units are those a migration just ``listed`` where it listed that array
        whole and each object's state is learnt one by one anyway (locally), else the
        source's listing."""
        from .reference_check import SourceObjects, check_references

        src, objects, problem = self.h.inner, SourceObjects(self.h.inner), self.check.problem
        for plan in self.plans:
            reason = virtual_refusal(plan.job)
            if reason is not None:  # a layout of new bytes: no reference can be the source's object
                key = node_key(plan.node.path)
                problem(key, f"{key}: not what a virtual migration writes: {reason}")
                self.bad.add(plan.node.path)
                continue
            units = None if listed is None or objects.listing_tells_state else listed.units(plan.node.path)
            if units is None:  # in the listing's order: nothing is created, no directory to spread over
                units, _ = array_units(plan, self.h, src, spread=False)
            for n, nbytes in check_references(back, plan.job, units, objects, src, problem):
                self.bar.grow(n)
                self.check.objects += n
                self.check.bytes += nbytes
                self.bar.advance(n, nbytes)
        self.bar.planned()
        back.extras(self.plans, self.nodes, {node_prefix(p) for p in self.bad}, objects, problem)
        back.finish(not self.bad, objects, problem)

    def _collect(self, job: ArrayJob, future: Any) -> None:
        """One unit's outcome into the report and the bar."""
        try:
            result = future.result()
        except DAMAGE_ERRORS as e:  # the source is damaged under a migrated array
            if not self.skip_damaged:
                raise damage_error(e, job.path, SKIP_HINT) from e
            self.check.problem(e.key or node_key(job.path), f"{e} (array '{job.path or '/'}' was migrated)")
            return
        self.check.add(result)
        self.bar.advance(result.objects, result.bytes)


__all__ = ["VerifyReport", "options_from_doc", "verify"]
