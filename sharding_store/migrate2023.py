"""``migrate`` and ``verify`` for a store of the 2023 intermediate generation (copy mode).

A 2023 store already has the final layout: per-node ``zarr.json`` documents, chunk keys as
the array's ``chunk_key_encoding`` says, shards in the v1.0 binary format. Migrating it:

* every node's document is rewritten in the final spelling (:func:`meta2023.normalise_node`);
  an implicit group (no document, nodes below it; the root included) gets an explicit group
  document with no attributes;
* chunk and shard objects are copied verbatim under the same keys, by the stores when they
  can (:meth:`Inner.copy_to`: a kernel copy locally, a server-side copy on S3), else read
  and written. Only objects whose key is a chunk key of the array are copied; anything else
  in an array's directory is left out with a warning;
* a ``sharding_indexed`` without ``index_codecs``: every shard's tail is read and
  :func:`shard_index.index_reading` decides (all shards of an array must agree, else the
  array is refused naming two shards, :class:`ShardCorruptError`). ``crc32c-hidden``:
  ``index_codecs = [bytes little, crc32c]`` is declared and the shards are copied verbatim;
  ``plain``: the CRC32C of each index is appended to its shard and declared, unless
  ``index_checksum=False`` (then ``[bytes little]`` is declared, shards verbatim). An array
  without any shard declares the checksum (nothing to append);
* the destination is claimed exclusively (the migration marker and record of
  :mod:`.destination`, as the 2022 path does); an
  array's ``zarr.json`` is written after its objects, groups after every array, deepest
  first, the root's document last, then the marker is removed. The source is only read.

Verification compares the destination with the source object by object: each document
equal to the normalised one (with the reading the shards decide), each chunk object equal
byte for byte to the source's (plus the CRC32C of its index where one was appended), no
chunk object missing or extra.

``resume``: see :func:`migrate_copy`. Not yet for this generation: ``chunks_per_shard``, ``index_location="start"``,
``portable``, ``assume_chunks_per_shard``, an executor (the drivers refuse them with a
:class:`UsageError`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from crc32c import crc32c

from . import meta2023
from .destination import MARKER_KEY, RECORD_KEY, check_resume, extra_node_key, extra_nodes
from .draft_metadata import escape_name
from .errors import (
    DestinationExistsError,
    DraftMetadataError,
    LinkOutsideStoreError,
    MigrationError,
    ShardCorruptError,
    ShardingStoreError,
    StoreIOError,
    UsageError,
)
from .hierarchy import V3Walk, walk_v3_nodes
from .inspect import _batches, decide_reading
from .jobs import cancelling, fault_point, with_retries
from .migrate_units import ArrayReport, UnitResult, json_bytes, node_key
from .progress import object_noun, progress_bar
from .shard_index import CHECKSUM_NBYTES, ENTRY_NBYTES, entry_lists, index_nbytes, read_index
from .stores import Inner
from .v3_metadata import consolidated_metadata, document_difference, same_json

SKIP_HINT = "--skip-damaged migrates the other nodes and lists the damaged ones"
GROUP_DOCUMENT = {"zarr_format": 3, "node_type": "group", "attributes": {}}
#: "declared": the document declares its index codecs (nothing to decide or append)
Reading = str  # "declared" | "plain" | "crc32c-hidden" | "none" (no shard to read)


def _prefix(path: str) -> str:
    return f"{path}/" if path else ""


def chunk_key_pattern(doc: dict[str, Any]) -> re.Pattern[str]:
    """The chunk keys (relative to the array's directory) of a final array document."""
    cke = doc["chunk_key_encoding"]
    name = cke["name"]
    ndim = len(doc["shape"])
    sep = (cke.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    s = re.escape(sep)
    coords = s.join([r"(0|[1-9][0-9]*)"] * ndim)
    if name == "default":
        return re.compile("c" + (s + coords if ndim else ""))
    return re.compile(coords if ndim else "0")


def sharding_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The ``sharding_indexed`` configuration of a final array document (None: unsharded)."""
    for c in doc.get("codecs", []):
        if isinstance(c, dict) and c.get("name") == "sharding_indexed":
            return c["configuration"]
    return None


_sharding = sharding_of


def index_readable(doc: dict[str, Any]) -> bool:
    """Whether a sharded document's shard objects end (or start) with their index as stored:
    ``sharding_indexed`` is the last codec. A bytes->bytes codec after it (valid v1.0: the
    whole shard is compressed or checksummed) hides the index; such objects are copied and
    compared verbatim, their readers decode them."""
    codecs = doc.get("codecs") or []
    return bool(codecs) and isinstance(codecs[-1], dict) and codecs[-1].get("name") == "sharding_indexed"


@dataclass
class ArrayPlan2023:
    path: str
    normalised: meta2023.Normalised
    objects: list[tuple[str, int | None]]  # chunk keys (full) and sizes
    reading: Reading = "declared"
    n_entries: int = 0

    def document(self, index_checksum: bool) -> dict[str, Any]:
        """The final document once the reading is known."""
        if self.reading == "declared":
            return self.normalised.document
        if self.reading == "crc32c-hidden" or (self.reading in ("plain", "none") and index_checksum):
            return self.normalised.document_for("crc32c-hidden")
        return self.normalised.document_for("plain")

    def appends(self, index_checksum: bool) -> bool:
        """Whether each shard gets the CRC32C of its index appended."""
        return self.reading == "plain" and index_checksum


@dataclass
class Plan2023:
    groups: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (path, final document)
    arrays: list[ArrayPlan2023] = field(default_factory=list)
    damaged: dict[str, ShardingStoreError] = field(default_factory=dict)  # path -> error
    warnings: list[str] = field(default_factory=list)
    #: what a migration changes, per node path (for ``info``); empty: nothing
    changes: dict[str, list[str]] = field(default_factory=dict)
    #: node path -> "array" | "group" | "implicit group" (damaged nodes are in ``damaged``)
    kinds: dict[str, str] = field(default_factory=dict)


READING_TEXT = {
    "crc32c-hidden": "every shard index is followed by an undeclared CRC32C (zarrita, 2023-05 to 2023-07): "
                     "declared as index_codecs [bytes little, crc32c], shards copied verbatim",
    "plain": "the shard indices have no checksum: the CRC32C of each index is appended and declared "
             "(--no-index-checksum: declared as [bytes little], shards copied verbatim)",
    "none": "no shard stored: index_codecs [bytes little, crc32c] declared",
}


def shard_grid(doc: dict[str, Any]) -> tuple[int, ...]:
    """Chunks per shard of a sharded final array document."""
    cfg = _sharding(doc)
    assert cfg is not None  # a sharded document (the callers' precondition)
    grid = doc["chunk_grid"]["configuration"]["chunk_shape"]
    return tuple(g // c for g, c in zip(grid, cfg["chunk_shape"]))


def check_declared_indices(src: Inner, doc: dict[str, Any], objects: list[tuple[str, int | None]]) -> None:
    """Validate the declared index of every shard (one tail or head read each) when its
    ``index_codecs`` are the plain little-endian entries (with or without a CRC32C): a shard
    whose index is corrupt is refused (:class:`ShardCorruptError`), never copied as valid."""
    cfg = _sharding(doc)
    if cfg is None or not index_readable(doc):
        return  # the index is inside an encoded object: copied verbatim, the reader checks it
    codecs = cfg["index_codecs"]
    names = [c.get("name") for c in codecs]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        return  # another index chain: copied verbatim, the reader checks it
    if (codecs[0].get("configuration") or {}).get("endian", "little") != "little":
        return
    checksum = names[-1] == "crc32c"
    cps = shard_grid(doc)
    nbytes = index_nbytes(cps, checksum)
    if cfg["index_location"] == "end":
        for (key, size), tail in _bounded_tails(src, objects, nbytes):
            if tail is None:
                raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
            total = tail.size if tail.size is not None else size
            if total is None or total < nbytes or len(tail.data) < nbytes:
                raise ShardCorruptError(f"{key}: shorter than its {nbytes}-byte shard index", key=key)
            # the checks (and the error) of ShardIndex.from_bytes, without numpy's per-call cost
            entry_lists(tail.data[-nbytes:], cps, checksum=checksum, key=key, payload_limit=total - nbytes)
        return
    for key, _ in objects:
        data = src.get(key)
        if data is None:
            raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
        read_index(data, cps, checksum=checksum, index_location="start", key=key)


def _bounded_tails(src: Inner, objects: list[tuple[str, int | None]], nbytes: int) -> Iterator[tuple[tuple[str, int | None], Any]]:
    """Each object with its last ``nbytes``, read in batches of bounded bytes: a caller that
    stops at the first bad shard reads no further, and never holds every tail at once."""
    for batch in _batches(objects, nbytes=nbytes):
        yield from zip(batch, src.get_tails([(k, nbytes) for k, _ in batch]))


def _plan_array(src: Inner, path: str, key: str, norm: meta2023.Normalised, plan: Plan2023,
                left_out: str) -> ArrayPlan2023:
    """One array of :func:`plan_hierarchy`: its chunk objects listed, its undeclared index
    decided (or its declared one checked). Raises what damages this array only: a bad
    shard index, shards that disagree, an object that links out of the store."""
    prefix = _prefix(path)
    pattern = chunk_key_pattern(norm.document)
    objects = []
    for k, size in sorted(src.list_sized(prefix)):
        rest = k[len(prefix):]
        if rest == meta2023.NODE_KEY:
            continue
        if pattern.fullmatch(rest):
            objects.append((k, size))
        else:
            plan.warnings.append(f"{escape_name(k)}: not a chunk key of array '{path or '/'}': {left_out}")
    a = ArrayPlan2023(path, norm, objects)
    if norm.hidden_checksum is None:
        cfg = _sharding(norm.document)
        if cfg is None or cfg.get("index_location") != "end" or not index_readable(norm.document):
            raise DraftMetadataError(
                f"{key}: an undeclared shard index must be at the end to be decided from the bytes", key=key)
        a.n_entries = math.prod(shard_grid(norm.document))
        a.reading = decide_reading(src, path, objects, a.n_entries)
        plan.changes[path].append(f"shard index: {READING_TEXT[a.reading]}")
    elif _sharding(norm.document) is not None:
        check_declared_indices(src, norm.document, objects)
    return a


def plan_hierarchy(src: Inner, walk: V3Walk | None = None, *, left_out: str = "not copied") -> Plan2023:
    """Every node of the 2023 hierarchy in ``src``: documents normalised, each array's chunk
    objects listed and its undeclared index decided. Damage is recorded, not raised.
    ``left_out``: what the warning about a key that is no chunk key says happens to it."""
    walk = walk if walk is not None else walk_v3_nodes(src)
    plan = Plan2023()
    plan.damaged.update(walk.damaged)  # nodes with illegal names
    documented = {n.path for n in walk.nodes}
    for path in walk.implicit:
        if path not in documented:
            plan.groups.append((path, dict(GROUP_DOCUMENT)))
            plan.kinds[path] = "implicit group"
            plan.changes[path] = ["no zarr.json (an implicit group): an explicit group document is written"]
    for node in walk.nodes:
        try:
            norm = meta2023.normalise_node(node.raw, node.key)
        except DraftMetadataError as e:
            plan.damaged[node.path] = e
            continue
        plan.kinds[node.path] = norm.node_type
        plan.changes[node.path] = list(norm.changes)
        if norm.node_type == "group":
            plan.groups.append((node.path, norm.document))
            continue
        try:
            a = _plan_array(src, node.path, node.key, norm, plan, left_out)
        except (DraftMetadataError, ShardCorruptError, LinkOutsideStoreError) as e:
            plan.damaged[node.path] = e
            continue
        plan.arrays.append(a)
    _leave_out_below_damage(plan)
    plan.groups.sort(key=lambda g: (g[0] == "", -g[0].count("/"), g[0]))  # deepest first, the root last
    return plan


def _below(path: str, root: str) -> bool:
    return path != root and (root == "" or path.startswith(root + "/"))


def _leave_out_below_damage(plan: Plan2023) -> None:
    """Nodes below a damaged node (a group whose document is damaged) are left out too: the
    destination would otherwise hold them under a group without a document, which final v3
    does not have. Each is reported as damaged, naming the group."""
    roots = sorted(plan.damaged, key=lambda p: (p.count("/"), p))
    if not roots:
        return

    def top(path: str) -> str | None:
        return next((r for r in roots if _below(path, r)), None)

    for path, _ in list(plan.groups):
        r = top(path)
        if r is not None:
            plan.damaged[path] = DraftMetadataError(
                f"{node_key(path)}: below the damaged node '{r or '/'}' ({plan.damaged[r].key})", key=node_key(path))
    for a in plan.arrays:
        r = top(a.path)
        if r is not None:
            plan.damaged[a.path] = DraftMetadataError(
                f"{node_key(a.path)}: below the damaged node '{r or '/'}' ({plan.damaged[r].key})", key=node_key(a.path))
    plan.groups = [g for g in plan.groups if g[0] not in plan.damaged]
    plan.arrays = [a for a in plan.arrays if a.path not in plan.damaged]
    for path in list(plan.kinds):
        if path in plan.damaged:
            del plan.kinds[path]


# --------------------------------------------------------------------------- migrate


def _copy_object(src: Inner, dst: Inner, key: str, size: int | None, n_entries: int, append_crc: bool) -> UnitResult:
    if append_crc:
        tail = src.get_tails([(key, ENTRY_NBYTES * n_entries)])[0]
        if tail is None:
            raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
        if len(tail.data) < ENTRY_NBYTES * n_entries:
            raise ShardCorruptError(f"{key}: shorter than its index", key=key)
        suffix = crc32c(tail.data).to_bytes(CHECKSUM_NBYTES, "little")
        if src.can_copy_to(dst, append=True) and src.copy_to(key, dst, key, size=tail.size, append=suffix,
                                                               version=tail.version):
            return UnitResult(copied=1, bytes_copied=tail.size or 0, bytes_written=CHECKSUM_NBYTES)
        data = src.get(key)
        if data is None:
            raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
        if crc32c(data[len(data) - ENTRY_NBYTES * n_entries:]).to_bytes(CHECKSUM_NBYTES, "little") != suffix:
            raise ShardCorruptError(f"{key}: changed while the migration read it", key=key)
        dst.set(key, bytes(data) + suffix)
        return UnitResult(written=1, bytes_read=len(data), bytes_written=len(data) + CHECKSUM_NBYTES)
    if src.can_copy_to(dst) and src.copy_to(key, dst, key, size=size):
        return UnitResult(copied=1, bytes_copied=size or 0)
    data = src.get(key)
    if data is None:
        raise ShardCorruptError(f"{key}: vanished while the migration read it", key=key)
    dst.set(key, bytes(data))
    return UnitResult(written=1, bytes_read=len(data), bytes_written=len(data))


def refuse_options(location: str, **given: Any) -> None:
    """:class:`UsageError` naming the options given (true) that a 2023 copy migration does not take yet."""
    refused = [name for name, value in given.items() if value]
    if refused:
        raise UsageError(f"{location}: a 2023-generation store is migrated by copy only; "
                         f"not supported for it yet: {', '.join(refused)}")


def refuse_damage(plan: Plan2023, skip_damaged: bool, consequence: str) -> None:
    """Raise the first damage (its own class, naming its key) unless ``skip_damaged``."""
    if plan.damaged and not skip_damaged:
        path, error = next(iter(plan.damaged.items()))
        raise type(error)(f"{error} (node '{escape_name(path) or '/'}'; {consequence}; {SKIP_HINT})", key=error.key)


def migrate_copy(
    src: Inner, dst: Inner, report: Any, current: dict[str, Any], *, dst_name: str, index_checksum: bool = True, dry_run: bool = False,
    skip_damaged: bool = False, jobs: int = 4, retries: int = 4, retry_delay: float = 0.2,
    walk: V3Walk | None = None, resume: bool = False, consolidate: bool = True, progress: bool | None = None,
) -> Plan2023:
    """Copy-migrate the 2023 hierarchy in ``src`` into ``dst`` (found empty or emptied by the
    caller), filling ``report`` (a :class:`~sharding_store.migrate.MigrationReport`).

    ``current``: the marker's and the record's content (:func:`destination.record`).
    ``resume``: continue an interrupted migration into ``dst`` (its marker and record must
    say the same source and options, :func:`destination.check_resume`): an object already
    there with the size it must have is kept (the verification that follows compares every
    byte), every document is written again. A destination with neither but not empty is
    refused (nothing to resume).
    ``progress``: a bar of the objects (shards, or chunk objects) and bytes written."""
    plan = plan_hierarchy(src, walk)
    refuse_damage(plan, skip_damaged, "nothing was written")
    for path, error in plan.damaged.items():
        report.skipped_arrays.append({"path": path, "kind": "damaged", "error": type(error).__name__, "reason": str(error)})
    report.warnings += plan.warnings
    report.groups = len(plan.groups)
    for a in plan.arrays:
        cfg = _sharding(a.document(index_checksum))
        cps = None
        if cfg is not None:
            grid = a.normalised.document["chunk_grid"]["configuration"]["chunk_shape"]
            cps = [g // c for g, c in zip(grid, cfg["chunk_shape"])]
        report.arrays.append(ArrayReport(a.path, shards=len(a.objects), bytes=sum(s or 0 for _, s in a.objects),
                                         chunks_per_shard=cps))
    if dry_run:
        return plan

    def retried(fn: Any, *args: Any) -> Any:
        return with_retries(fn, *args, attempts=retries, base_delay=retry_delay)

    marker = json_bytes(current)
    existing: dict[str, int | None] | None = None
    if resume:
        existing = _resumable(dst, dst_name, current, retried)
        dst.tidy()  # temporary files of writes the interrupted run left unfinished
    # created again under resume when the finished run removed it: DST is claimed while written
    if not retried(dst.create_exclusive, MARKER_KEY, marker) and existing is None:
        raise DestinationExistsError(
            f"{dst_name}: another migration is writing into this destination (its {MARKER_KEY} appeared "
            "after the destination was found empty); wait for it, or use another destination", key=MARKER_KEY)
    retried(dst.set, RECORD_KEY, marker)  # outlives the marker: what DST was migrated from, and how
    try:
        _write_all(plan, src, dst, report, index_checksum=index_checksum, jobs=jobs, retried=retried,
                   existing=existing, consolidate=consolidate, progress=progress)
    except Exception as e:
        raise incomplete(e) from e
    return plan


def _resumable(dst: Inner, dst_name: str, current: dict[str, Any], retried: Any) -> dict[str, int | None] | None:
    """The objects of the migration into ``dst`` being continued (key -> size) when its
    marker and record match ``current`` (:func:`destination.check_resume`, which raises
    naming what differs); None when ``dst`` is empty (a fresh start)."""
    if not check_resume(dst, dst_name, current, retried):
        return None
    return dict(dst.list_sized(""))


def incomplete(error: BaseException) -> ShardingStoreError:
    """The error a copy migration stops with once it has written: the destination is
    incomplete; ``--resume`` finishes it."""
    again = "the destination is incomplete: run again with --resume"
    if isinstance(error, ShardingStoreError):
        return type(error)(f"{error}; {again}", key=error.key)
    if isinstance(error, OSError):
        cause = error.strerror or str(error) or type(error).__name__
        name = error.filename or "a write"
        return StoreIOError(f"{name}: {type(error).__name__}: {cause}; {again}", key=str(name))
    return MigrationError(f"{type(error).__name__}: {error}; {again}")


def _write_all(plan: Plan2023, src: Inner, dst: Inner, report: Any, *, index_checksum: bool, jobs: int,
               retried: Any, existing: dict[str, int | None] | None = None, consolidate: bool = True,
               progress: bool | None = None) -> None:
    root_doc: dict[str, Any] | None = None
    docs: dict[str, dict[str, Any]] = {}  # what the root group's consolidated metadata lists
    total = sum(len(a.objects) for a in plan.arrays)
    with progress_bar(total, "migrate", object_noun(report.all_shards, 1), progress) as bar, \
            cancelling(ThreadPoolExecutor(max(1, jobs), thread_name_prefix="migrate2023")) as pool:
        for a in plan.arrays:
            append = a.appends(index_checksum)
            todo = []
            for key, size in a.objects:
                have = None if existing is None else existing.get(key)
                if have is not None and size is not None and have == size + (CHECKSUM_NBYTES if append else 0):
                    report.totals.add(UnitResult(skipped=1))  # resume: copied by the interrupted run
                    bar.advance(1)
                else:
                    todo.append((key, size))
            futures = [pool.submit(retried, _copy_object, src, dst, key, size, a.n_entries, append)
                       for key, size in todo]
            for f in futures:
                result = f.result()
                report.totals.add(result)
                bar.advance(1, result.bytes_now)
                fault_point("unit")
            doc = a.document(index_checksum)
            if a.path == "":
                root_doc = doc
            else:
                docs[a.path] = doc
                retried(dst.set, node_key(a.path), json_bytes(doc))
    for path, doc in plan.groups:  # deepest first, the root last
        if path == "" and consolidate:
            doc = {**doc, "consolidated_metadata": consolidated_metadata(docs)}
        docs[path] = doc
        retried(dst.set, node_key(path), json_bytes(doc))
    if root_doc is not None:
        retried(dst.set, node_key(""), json_bytes(root_doc))
    retried(dst.delete, MARKER_KEY)


# --------------------------------------------------------------------------- verify


def _load(dst: Inner, key: str) -> Any:
    raw = dst.get(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return {"<invalid JSON>": True}


def _difference(expected: dict[str, Any], actual: Any) -> str:
    """The first field in which a destination document differs, in words."""
    if not isinstance(actual, dict):
        return "not a JSON object"
    return document_difference(expected, actual) or "documents differ"


def live_chunks(doc: dict[str, Any], data: bytes) -> int:
    """The chunks one object of a final array document holds: 1 unsharded, else the live
    entries of its index (0 when the index is not the plain little-endian one)."""
    cfg = _sharding(doc)
    if cfg is None:
        return 1
    if not index_readable(doc):
        return 0
    names = [c.get("name") for c in cfg["index_codecs"]]
    endian = (cfg["index_codecs"][0].get("configuration") or {}).get("endian", "little") if names else None
    if names not in (["bytes"], ["bytes", "crc32c"]) or endian != "little":
        return 0
    n = math.prod(shard_grid(doc))
    nbytes = ENTRY_NBYTES * n + (CHECKSUM_NBYTES if names[-1] == "crc32c" else 0)
    if len(data) < nbytes:
        return 0
    raw = data[:nbytes] if cfg["index_location"] == "start" else data[len(data) - nbytes:]
    table = np.frombuffer(raw[: ENTRY_NBYTES * n], dtype="<u8").reshape(-1, 2)
    return int(np.count_nonzero(~((table[:, 0] == EMPTY) & (table[:, 1] == EMPTY))))


EMPTY = 2**64 - 1


def _check_object(src: Inner, dst: Inner, key: str, n_entries: int, appended: bool,
                  doc: dict[str, Any]) -> tuple[int, int, list[tuple[str, str]]]:
    """(bytes, chunks, problems) of one destination object against its source."""
    a = src.get(key)
    b = dst.get(key)
    if a is None:
        return 0, 0, [(key, f"{key}: vanished from the source while it was verified")]
    if b is None:
        return 0, 0, [(key, f"{key}: missing")]
    expected = bytes(a)
    if appended:
        expected += crc32c(expected[len(expected) - ENTRY_NBYTES * n_entries:]).to_bytes(CHECKSUM_NBYTES, "little")
    if bytes(b) != expected:
        if len(b) != len(expected):
            return len(b), 0, [(key, f"{key}: {len(b)} bytes, expected {len(expected)}")]
        at = next(i for i, (x, y) in enumerate(zip(bytes(b), expected)) if x != y)
        return len(b), 0, [(key, f"{key}: differs from the source at byte {at}")]
    return len(b), live_chunks(doc, expected), []


def verify_copy(src: Inner, dst: Inner, report: Any, *, skip_damaged: bool = False,
                skip_arrays: dict[str, str] | None = None, jobs: int = 4, walk: V3Walk | None = None,
                progress: bool | None = None) -> None:
    """Compare the migrated ``dst`` with the 2023 hierarchy in ``src``, filling ``report`` (a
    :class:`~sharding_store.verify.VerifyReport`); ``progress``: a bar of the objects checked."""
    plan = plan_hierarchy(src, walk)
    known = dict(skip_arrays or {})
    refuse_damage(plan, skip_damaged or set(plan.damaged) <= set(known), "it was not migrated")
    check = report.check
    for path, error in plan.damaged.items():
        report.skip(path, known.get(path, str(error)), dst)
    found: dict[str, Any] = {}  # documents found right: what consolidated metadata must list
    nodes = {p for p, _ in plan.groups} | {a.path for a in plan.arrays} | set(plan.damaged)
    for key in extra_nodes(dst, (p for p, _ in plan.groups), nodes):
        check.problem(key, f"{key}: a node the source does not have")
    consolidated: Any = None
    for path, expected in plan.groups:
        report.groups += 1
        key = node_key(path)
        actual = _load(dst, key)
        if path == "" and isinstance(actual, dict) and "consolidated_metadata" in actual:
            actual = dict(actual)
            consolidated = actual.pop("consolidated_metadata")
        if actual is None or not same_json(expected, actual):
            check.problem(key, f"{key}: missing" if actual is None else
                          f"{key}: not the normalised group document: {_difference(expected, actual)}")
        elif path:
            found[path] = actual
    sharded = all(_sharding(a.normalised.document) is not None for a in plan.arrays)
    total = sum(len(a.objects) for a in plan.arrays if a.path not in known)
    report.all_shards = sharded
    with progress_bar(total, "verify", object_noun(sharded, 1), progress) as bar, \
            cancelling(ThreadPoolExecutor(max(1, jobs), thread_name_prefix="verify2023")) as pool:
        for a in plan.arrays:
            report.arrays += 1
            key = node_key(a.path)
            if a.path in known:
                report.skip(a.path, known[a.path], dst)
                continue
            actual = _load(dst, key)
            if actual is None:
                check.problem(key, f"{key}: missing (array '{a.path or '/'}' was not migrated)")
                continue
            candidates = [True, False] if a.reading in ("plain", "none") else [True]
            match = [c for c in candidates if same_json(a.document(c), actual)]
            if not match:
                check.problem(key, f"{key}: not the normalised document of the source array: "
                                   f"{_difference(a.document(candidates[0]), actual)}")
                continue
            if a.path:
                found[a.path] = actual
            appended = a.appends(match[0])
            results = [pool.submit(_check_object, src, dst, k, a.n_entries, appended, actual) for k, _ in a.objects]
            for f in results:
                nbytes, chunks, problems = f.result()
                check.objects += 1
                check.bytes += nbytes
                check.chunks += chunks
                bar.advance(1, nbytes)
                for k, m in problems:
                    check.problem(k, m)
            pattern = chunk_key_pattern(actual)
            prefix = _prefix(a.path)
            src_keys = {k for k, _ in a.objects}
            for k, _ in dst.list_sized(prefix):
                if k not in src_keys and pattern.fullmatch(k[len(prefix):]):
                    check.problem(k, f"{k}: not in the source")
                elif extra_node_key(k, prefix, nodes):
                    check.problem(k, f"{k}: a node the source does not have")
    if consolidated is not None:
        bad = {p for p, _ in plan.groups if p and p not in found} | {a.path for a in plan.arrays if a.path not in found}
        listed = consolidated.get("metadata") if isinstance(consolidated, dict) else None
        if isinstance(listed, dict):
            consolidated = {**consolidated, "metadata": {p: d for p, d in listed.items() if p not in bad}}
        if not same_json(consolidated_metadata(found), consolidated):
            key = node_key("")
            check.problem(key, f"{key}: consolidated_metadata is not the destination's documents")


__all__: Sequence[str] = ["migrate_copy", "verify_copy", "plan_hierarchy", "decide_reading", "chunk_key_pattern", "live_chunks"]
