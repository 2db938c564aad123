"""Change the shard layout of draft-era arrays: ``reshard``, ``unshard``, ``shard``.

Resharding only *repacks*: inner chunk payloads are moved byte for byte from the old
objects (shards, or one object per chunk) into the new ones and are never decoded or
re-encoded, so it runs at copy speed and cannot change a value.

Work units
----------
A source object and a target object each cover a box of the chunk grid. A block of
``lcm(old, new)`` chunks per dimension is covered exactly by whole source objects and
whole target objects, so one block is one task: each of its source objects is read
once, whole, and each of its target objects is built once and written once. When that
block would be much larger than either shard (``7 -> 8`` chunks per shard), each target
shard is a task of its own and reads only its chunks (one index read per source shard,
coalesced ranges): :meth:`ShardEngine.gather`. The tasks are planned by
:func:`~sharding_store.ops.jobs.plan_units` and run on a bounded thread pool
(:func:`~sharding_store.ops.jobs.run_all`).

Where the stores can build an object from ranges of others without the bytes passing
through this process (:meth:`Inner.compose_from_tails`: local disk to local disk, kernel
copies), a task reads only its source objects' indices and builds each target object from
source ranges plus the index it computes (:func:`locate`, :func:`target_parts`): each
contributing source's *payload runs* back to back, a run being chunks that lie back to
back in the source in any order (a zarr-python 2.18 shard holds its chunks in no grid
order, all of them one run), so one kernel copy per run, not per chunk. Each source file
is opened once, as ``cp`` opens it: its index is read from the descriptor its runs are
then copied from. Such a task takes several consecutive lcm blocks of a row
(:func:`merge_blocks`, up to :data:`COMPOSE_SOURCES` sources), written block after block:
the numpy work of locating chunks costs per call, not per chunk. Packing writes the same
chunks in grid order. Elsewhere (object stores, mappings) a task reads as above: whole
source objects, one request each, or one index read per source and one call of coalesced
ranges (one range per source shard unless its chunks lie far apart), then writes each
target with one put.

With a destination
------------------
The whole hierarchy is copied (metadata, groups, other arrays and stray keys verbatim),
the chosen arrays repacked. ``zarr.json`` is written last, so an interrupted copy is not
a hierarchy; run again with ``overwrite``. The source is only read.

In place (the protocol)
-----------------------
Old and new objects share key names (``c0/0`` is a shard key under both layouts, and
an unsharded chunk key under either), so a new object cannot be written beside the old
one and an array must never be readable while its objects are half swapped. Each
array goes through three phases, recorded in a journal object
``__reshard__/journal/<array metadata key>`` that holds the old and new metadata
documents (:mod:`~sharding_store.formats.reshard_journal`; ``info`` reports it, ``migrate`` and
``verify`` refuse a store that holds one). Everything under ``__reshard__/`` is outside ``meta/`` and ``data/``, where
no draft reader looks.

``stage``  The journal is written, then every new object is written to
           ``__reshard__/<its final key>``.
           *Reader:* the old array, untouched.
``swap``   The journal says ``swap``. The array's entry leaves the consolidated
           metadata, then its metadata document is deleted (hidden), then every old
           object whose key is not staged is deleted.
           *Reader:* the array does not exist (it cannot be opened, so it cannot
           read wrong values). Consolidated readers lose it first.
``move``   The journal says ``move``. Each staged object is moved over its final key
           (:meth:`Inner.move`: a rename on local disk, a server-side copy on object stores), then the new
           metadata is written, the consolidated entry restored, the journal deleted.
           *Reader:* no array until the new metadata is written; from then on the
           new array with all its objects in place.

Resuming (automatic on the next in-place run, or ``complete_interrupted``) rolls
*forward* from the journal's phase; every step is idempotent. A ``stage`` journal
whose old metadata no longer matches the store (someone changed the array since) is
rolled back instead: its staged objects are deleted. Staged objects that already
exist are kept (each was written whole), so an interrupted staging is not redone.
Temporary files of staging writes a kill cut short are removed before the journal is
deleted (a later kill cannot strand them); what no journal accounts for under
``__reshard__/`` (:func:`staging_leftovers`) is reported by ``info`` and removed by a
resume.
Not supported: other writers during a reshard, and readers that opened the array
before the switch and keep reading after it (they hold the old metadata).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, cast

import numpy as np

from ..api.hierarchy import DraftHierarchy, inner_of
from ..engine.shard_engine import ArrayLayout, gather, read_objects
from ..errors import DestinationExistsError, DraftMetadataError, MigrationError, ObjectChangedError, UsageError
from ..formats import draft_metadata as dm
from ..formats.keys import Coords, chunk_to_shard, local_to_global
from ..formats.reshard_journal import JOURNAL_PREFIX, STAGING_PREFIX, Journal, interrupted_reshards, staging_leftovers
from ..formats.shard_index import MAX_UINT64, encode_shard, index_nbytes, n_entries, parse_indices
from ..stores import Inner, Part, Tail
from .destination import LOCK_KEY, MARKER_KEY, destination_lock, prepare_plain
from .jobs import (
    Group,
    Source,
    block_shape,
    check_apart,
    copy_words,
    damage_error,
    fault_point,
    group_targets,
    lost_transformer,
    plan_units,
    resolve_chunks_per_shard,
    run_all,
)
from .options import ReshardOptions, RunOptions, StoreOptions, legacy_options
from .progress import NullBar, progress_bar

STAGING = STAGING_PREFIX
#: an lcm block may hold this many times the chunks of the larger shard before each
#: target shard becomes its own task (bounds a task's memory)
MAX_BLOCK_FACTOR = 8
DEFAULT_JOBS = 8
#: whole lcm blocks one kernel-copy task takes together, up to this many source objects
#: and source chunks: locating the chunks and computing the target indices costs a few
#: dozen numpy calls per task whatever its size (~0.4 ms: a block of 4 shards of 8x8
#: chunks alone spent more on them than on its copies' system calls)
COMPOSE_SOURCES = 32
COMPOSE_CHUNKS = 4096

__all__ = ["JOURNAL_PREFIX", "STAGING", "ReshardReport", "complete_interrupted", "reshard", "staging_leftovers", "resolve_chunks_per_shard",
           "shard", "unshard"]


# --------------------------------------------------------------------------- report


@dataclass
class ReshardReport:
    """What a run did (``--json`` prints :meth:`to_dict`)."""

    source: str
    destination: str | None
    arrays_changed: list[str] = field(default_factory=list)
    arrays_skipped: list[str] = field(default_factory=list)
    arrays_resumed: list[str] = field(default_factory=list)
    arrays_damaged: dict[str, str] = field(default_factory=dict)  # left alone: path -> reason
    objects_written: int = 0  # new objects (shards or chunks) of repacked arrays
    objects_removed: int = 0  # old objects deleted (in place)
    objects_copied: int = 0  # verbatim copies (with a destination)
    bytes_read: int = 0  # bytes read into this process (not those a kernel copy moved)
    bytes_written: int = 0  # payload bytes of new objects plus verbatim copies
    #: how the stores built or copied objects themselves, in words ("kernel copy"); "" when none did
    copied_by: str = ""
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        d["in_place"] = self.destination is None
        d["seconds"] = round(self.seconds, 3)
        return d


# --------------------------------------------------------------------------- layouts


def _object_cps(layout: ArrayLayout) -> Coords:
    """Chunks per object: the shard shape, or all ones for one object per chunk."""
    return layout.chunks_per_shard if layout.chunks_per_shard is not None else (1,) * layout.ndim


def list_objects(inner: Inner, layout: ArrayLayout, under: str = "") -> dict[Coords, str]:
    """Object coordinates -> key of the array's chunk/shard objects below ``under`` + its prefix.

    Keys that are not chunk keys of this array (stray keys, other arrays' keys under a
    root array's ``data/root/``) are left out. ``under`` is ``STAGING`` for staged objects.
    """
    return dict(iter_objects(inner, layout, under))


def iter_objects(inner: Inner, layout: ArrayLayout, under: str = "") -> Iterator[tuple[Coords, str]]:
    """:func:`list_objects` as a stream, in key order (the listing's)."""
    prefix = under + layout.prefix
    for key in inner.list_prefix(prefix):
        coords = layout.parse(key[len(under) :])
        if coords is not None:
            yield coords, key[len(under) :]


def _not_staged(old_keys: Iterable[str], staged_keys: Iterable[str]) -> Iterator[str]:
    """The old keys that no staged key replaces: a merge of two sorted streams (the staged
    keys without the staging prefix keep their order), so neither listing is held."""
    staged = iter(staged_keys)
    head = next(staged, None)
    for key in old_keys:
        while head is not None and head < key:
            head = next(staged, None)
        if head != key:
            yield key


def _with_zero_d(layout: ArrayLayout, objects: Mapping[Coords, str]) -> ArrayLayout:
    """A 0-d array keeps the key spelling it has (``c0`` as zarr-python 2.x, or ``c``)."""
    if layout.ndim or () not in objects:
        return layout
    return replace(layout, zero_d=objects[()][len(layout.prefix) :])


def _layouts(journal: Journal) -> tuple[ArrayLayout, ArrayLayout]:
    """The old and the new layout an in-place run moves an array between."""
    old, new = journal.metas()
    return ArrayLayout.from_meta(old), ArrayLayout.from_meta(new)


def _block_shape(src: Coords, dst: Coords) -> Coords | None:
    """``lcm`` of both object shapes per dimension, or ``None`` when it is too large a task."""
    return block_shape(src, dst, MAX_BLOCK_FACTOR)


def plan_tasks(objects: Mapping[Coords, str], src: Coords, dst: Coords) -> list[Group]:
    """Group source objects into tasks (see the module docstring), in key order."""
    return plan_units((Source(c, k) for c, k in objects.items()), src, dst, max_block=MAX_BLOCK_FACTOR)


# --------------------------------------------------------------------------- packing


def pack_objects(chunks: Mapping[Coords, bytes | memoryview], dst: ArrayLayout) -> Iterator[tuple[str, bytes]]:
    """The target objects (key, bytes) holding ``chunks`` (global coords) in layout ``dst``."""
    if dst.chunks_per_shard is None:
        for coords, payload in sorted(chunks.items()):
            yield dst.chunk_key(coords), bytes(payload)
        return
    shards: dict[Coords, dict[Coords, bytes | memoryview]] = defaultdict(dict)
    for coords, payload in chunks.items():
        shard, local = chunk_to_shard(coords, dst.chunks_per_shard)
        shards[shard][local] = payload
    for shard, local_chunks in sorted(shards.items()):
        yield dst.shard_key(shard), encode_shard(local_chunks, dst.chunks_per_shard)


def _progress(total: int, desc: str, enabled: bool | None) -> NullBar:
    """A bar of objects (what the report counts: written, or copied verbatim) and their bytes."""
    return progress_bar(total, desc, "object", enabled)


@dataclass(frozen=True)
class _Repack:
    """One array's repacking from ``src`` objects to ``dst`` objects (``dst_under`` + key)."""

    src_inner: Inner
    dst_inner: Inner
    src: ArrayLayout
    dst: ArrayLayout
    dst_under: str = ""

    def run(
        self,
        objects: Mapping[Coords, str],
        report: ReshardReport,
        *,
        jobs: int,
        progress: bool | None,
        skip: AbstractSet[Coords] = frozenset(),
    ) -> None:
        """Write every target object; tasks whose targets are all in ``skip`` are not redone."""
        src_cps, dst_cps = _object_cps(self.src), _object_cps(self.dst)
        tasks = [t for t in plan_tasks(objects, src_cps, dst_cps) if not group_targets(t, src_cps, dst_cps) <= skip]
        # the targets the tasks may write (one without a chunk is not written: the bar may stop short of it)
        targets = sum(len(group_targets(t, src_cps, dst_cps) - skip) for t in tasks)
        task = self._task
        if self.src_inner.can_compose_to(self.dst_inner):
            task, report.copied_by = self._compose_task, copy_words(self.dst_inner)
            block = _block_shape(src_cps, dst_cps)
            if block is not None:
                tasks = merge_blocks(tasks, min(COMPOSE_SOURCES, COMPOSE_CHUNKS // math.prod(src_cps)),
                                     lambda t: tuple(c * a // b for c, a, b in zip(t.sources[0].coords, src_cps, block))[:-1])
        written, nbytes = report.objects_written, report.bytes_written  # before this array
        with _progress(targets, self.src.path or "/", progress) as bar:
            run_all(lambda t: task(t, report), tasks, jobs,
                    lambda _: bar.reach(report.objects_written - written, report.bytes_written - nbytes))

    def _task(self, task: Group, report: ReshardReport) -> None:
        """Read the sources (whole objects, or the target's coalesced ranges), pack, write."""
        if task.target is None:
            chunks, nread = read_objects(self.src_inner, self.src, [(s.coords, s.key) for s in task.sources])
        else:
            dst_cps = _object_cps(self.dst)
            local = gather(self.src_inner, self.src, task.target, dst_cps, sources=[s.key for s in task.sources])
            chunks = {local_to_global(task.target, c, dst_cps): v for c, v in local.items()}
            nread = sum(len(v) for v in chunks.values())
        report.add(bytes_read=nread)
        for key, blob in pack_objects(chunks, self.dst):
            self.dst_inner.set(self.dst_under + key, blob)
            report.add(objects_written=1, bytes_written=len(blob))
            fault_point("stage")

    def _compose_task(self, task: Group, report: ReshardReport) -> None:
        """The same objects, their payload runs in source order, built by
        :meth:`Inner.compose_from_tails` from ranges of the source objects (a kernel copy per
        run on local disk, from the descriptor each source's index was read from: one open
        per source): only the sources' indices are read (one call for the task), each
        target's index is computed; the payloads never pass through this process. A source
        that changes after its index was read makes the copy raise
        :class:`~sharding_store.errors.ObjectChangedError`."""
        cps = self.src.chunks_per_shard
        tail = 0 if cps is None else index_nbytes(cps)

        def plan(tails: list[Tail | None]) -> Iterator[tuple[str, list[Part]]]:
            located, nread = locate(self.src, task.sources, tails)
            report.add(bytes_read=nread)
            for key, parts in target_parts(located, self.dst, task.target):
                yield self.dst_under + key, parts

        def written(key: str, n: int) -> None:
            report.add(objects_written=1, bytes_written=n)
            fault_point("stage")

        self.src_inner.compose_from_tails([(s.key, tail) for s in task.sources], plan, into=self.dst_inner,
                                          done=written)


def merge_blocks(tasks: Sequence[Group], most: int, row: Callable[[Group], Coords]) -> list[Group]:
    """Consecutive whole-block tasks of one ``row`` of blocks (``row(task)``: the block's
    coordinates but the last) joined into tasks of at most ``most`` source objects. Blocks
    cover disjoint targets, so a joined task writes what they would; within one row the
    targets a task numbers (:func:`target_parts`) stay few. Per-target tasks, and blocks
    larger than ``most``, stay as they are."""
    out: list[Group] = []
    for t in tasks:
        last = out[-1] if out else None
        if (t.target is None and last is not None and last.target is None
                and len(last.sources) + len(t.sources) <= most and row(last) == row(t)):
            out[-1] = Group(None, last.sources + t.sources)
        else:
            out.append(t)
    return out


class Located(NamedTuple):
    """Where the chunks of some source objects lie, one row per chunk: global chunk
    ``coords`` (int64, ``(n, ndim)``), source ``keys[src]``, ``offsets`` and ``sizes``
    (uint64) in it. Arrays, not a dict per chunk: a task of 4 shards of 8x8 chunks would
    otherwise spend more time on tuples than the kernel spends copying."""

    keys: list[str]
    src: np.ndarray
    coords: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray


def locate(layout: ArrayLayout, sources: Sequence[Source], tails: Sequence[Tail | None]) -> tuple[Located, int]:
    """Where each chunk of ``sources`` lies (:class:`Located`), from each source's tail as
    read (a shard's index, validated against the object's size; an unsharded chunk's size
    alone), and the bytes read. A listed source that is gone raises
    :class:`ObjectChangedError`."""
    keys = [s.key for s in sources]
    cps = layout.chunks_per_shard
    for key, tail in zip(keys, tails):
        if tail is None:
            raise ObjectChangedError(f"{key}: listed, but gone before it was read (is another process writing?)", key=key)
    found = cast("list[Tail]", tails)  # none is None (checked above)
    origin = np.array([s.coords for s in sources], dtype=np.int64).reshape(len(sources), layout.ndim)
    if cps is None:
        for src, tail in zip(sources, found):
            if tail.size is None:  # pragma: no cover - stores that compose by kernel copies know sizes
                raise MigrationError(f"{src.key}: the store did not report the object's size", key=src.key)
        sizes = np.array([t.size for t in found], dtype=np.uint64)
        rows = np.arange(len(keys), dtype=np.int64)
        return Located(keys, rows, origin, np.zeros(len(keys), np.uint64), sizes), 0
    raws = [t.data for t in found]
    limits = [None if t.size is None else max(0, t.size - len(r)) for r, t in zip(raws, found)]
    table = parse_indices(raws, cps, keys=keys, payload_limits=limits)
    which, flat = np.nonzero(table[:, :, 0] != MAX_UINT64)  # C order, as the index is laid out
    local = np.stack(np.unravel_index(flat, cps), axis=1) if cps else np.zeros((len(flat), 0), np.int64)
    coords = origin[which] * np.array(cps, dtype=np.int64) + local
    located = Located(keys, which, coords, table[which, flat, 0], table[which, flat, 1])
    return located, sum(len(r) for r in raws)


def target_parts(located: Located, dst: ArrayLayout, target: Coords | None) -> Iterator[tuple[str, list[Part]]]:
    """The target objects holding the ``located`` chunks (only ``target``'s, when given), as
    :meth:`Inner.compose` parts: each contributing source's payload runs back to back
    (:func:`payload_runs`: one part per run of its chunks that lie back to back in it, in
    whatever order the source holds them), then the index computed to match. The chunks
    :func:`pack_objects` would write, in another order: a reader sees the same object."""
    keys, src, coords, offsets, sizes = located
    if dst.chunks_per_shard is None:  # source after source (block after block), each in C order
        for row in sorted(range(len(src)), key=lambda i: (int(src[i]), coords[i].tolist())):
            if target is None or tuple(coords[row].tolist()) == target:
                start, end = int(offsets[row]), int(offsets[row] + sizes[row])
                yield dst.chunk_key(tuple(coords[row].tolist())), [(keys[src[row]], start, end)]
        return
    tid, flat, boxes, mine = _number_targets(coords, dst.chunks_per_shard, target)
    if mine is not None:
        src, tid, flat, offsets, sizes = src[mine], tid[mine], flat[mine], offsets[mine], sizes[mine]
    if not len(src):
        return
    # by target, then source, offset and size: a target's chunks of one source in file order.
    # Targets in the order of their first source, then C order: a task of several blocks
    # (:func:`merge_blocks`) writes block after block, so a run killed midway keeps whole
    # blocks for the resume (:meth:`_Repack.run` skips those whose targets are all staged)
    first_source = np.full(math.prod(n for _, n in boxes), len(keys), dtype=np.int64)
    np.minimum.at(first_source, tid, src)
    tid = first_source[tid] * len(first_source) + tid
    order = _file_order(tid * len(keys) + src, offsets, sizes)
    tid, src, flat, offsets, sizes = tid[order], src[order], flat[order], offsets[order], sizes[order]
    first = np.ones(len(src), dtype=bool)  # where each target's rows begin
    first[1:] = tid[1:] != tid[:-1]
    parts, positions, run_bounds = _runs(keys, src, offsets, sizes, first)
    # every target's runs and positions at once (numpy calls cost per call): a loop only to slice
    rows = [*np.flatnonzero(first).tolist(), len(src)]
    entries = n_entries(dst.chunks_per_shard)
    for i, (lo, hi) in enumerate(zip(rows, rows[1:])):
        index = np.full((entries, 2), MAX_UINT64, dtype="<u8")
        index[flat[lo:hi], 0] = positions[lo:hi]
        index[flat[lo:hi], 1] = sizes[lo:hi]
        box_index = np.unravel_index(int(tid[lo]) % len(first_source), [n for _, n in boxes])
        shard = tuple(low + int(c) for (low, _), c in zip(boxes, box_index))
        yield dst.shard_key(shard), [*parts[run_bounds[i] : run_bounds[i + 1]], index.tobytes()]


def _number_targets(
    coords: np.ndarray, cps: Coords, target: Coords | None
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], np.ndarray | None]:
    """Per chunk (global ``coords``) its target shard numbered in C order within the box of
    the targets present, and its entry in that target's index; the box (first coordinate,
    extent) per dimension; with ``target``, which chunks are that target's. One column at
    a time: numpy calls on 1-d arrays, a few per dimension."""
    tid = np.zeros(len(coords), dtype=np.int64)
    flat = np.zeros(len(coords), dtype=np.int64)
    mine = None if target is None else np.ones(len(coords), dtype=bool)
    boxes = []
    for d, n in enumerate(cps):
        column = coords[:, d]
        shard = column // n
        low, high = (int(shard.min()), int(shard.max())) if len(shard) else (0, 0)
        boxes.append((low, high - low + 1))
        tid = tid * (high - low + 1) + (shard - low)
        flat = flat * n + (column - shard * n)
        if mine is not None and target is not None:
            mine &= shard == target[d]
    return tid, flat, boxes, mine


def _file_order(group: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The row order by ``group`` (target and source), then offset and size: each target's
    chunks of one source in file order. One stable sort of the three packed into 64 bits
    where they fit (a ``lexsort`` of the keys is several times slower)."""
    bits = [int(a.max()).bit_length() for a in (group, offsets, sizes)]
    if sum(bits) <= 63:
        key = (group.astype(np.uint64) << np.uint64(bits[1] + bits[2])) | (offsets << np.uint64(bits[2])) | sizes
        return np.argsort(key, kind="stable")
    by_place = np.lexsort((sizes, offsets))
    return by_place[np.argsort(group[by_place], kind="stable")]


def payload_runs(
    keys: Sequence[str], src: np.ndarray, offsets: np.ndarray, sizes: np.ndarray
) -> tuple[list[Part], np.ndarray]:
    """One target shard's payload as compose parts, and each chunk's offset in it. The
    chunks (``keys[src]``, ``offsets``, ``sizes``) come sorted by source and offset; each
    maximal run of chunks that follow each other in their source without a gap is one part
    (one kernel copy), the runs back to back. Chunks that overlap or share bytes in the
    source start a run of their own: each chunk gets its own bytes (un-shared, as
    :mod:`~sharding_store.formats.shard_index` promises on rewrite)."""
    first = np.zeros(len(src), dtype=bool)
    first[:1] = True
    parts, positions, _ = _runs(keys, src, offsets, sizes, first)
    return parts, positions


def _runs(
    keys: Sequence[str], src: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, first: np.ndarray
) -> tuple[list[Part], np.ndarray, list[int]]:
    """:func:`payload_runs` of many targets at once: ``first`` marks the row where each
    target's chunks begin (a run never spans two targets, each target's payload starts at
    0). Also where each target's runs begin in the parts (and their count, last)."""
    if not len(src):
        return [], np.zeros(0, dtype=np.uint64), [0]
    ends = offsets + sizes
    new = first.copy()
    new[1:] |= (src[1:] != src[:-1]) | (offsets[1:] != ends[:-1])
    run = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    run_start = offsets[starts]
    run_end = ends[np.append(starts[1:] - 1, len(src) - 1)]  # a run's last chunk ends it
    lengths = run_end - run_start
    placed = np.cumsum(lengths) - lengths  # where each run starts, all targets back to back
    target_runs = np.flatnonzero(first[starts])  # each target's first run
    placed -= np.repeat(placed[target_runs], np.diff(np.append(target_runs, len(starts))))
    positions = placed[run] + (offsets - run_start[run])
    parts: list[Part] = [(keys[s], a, b) for s, a, b in zip(src[starts].tolist(), run_start.tolist(), run_end.tolist())]
    return parts, positions, [*target_runs.tolist(), len(starts)]


def copy_object(src: Inner, dst: Inner, key: str, size: int | None = None) -> int:
    """Copy one object verbatim; its size. Bytes stay out of this process where the stores
    allow it (:meth:`Inner.copy_to`: a kernel copy on local disk, a server-side copy on
    one object store), else one get and one set."""
    if size is not None and src.copy_to(key, dst, key, size=size):
        return size
    value = src.get(key)
    if value is None:
        raise MigrationError(f"{key}: listed, but gone before it was copied (is another process writing?)", key=key)
    dst.set(key, value)
    return len(value)


def _update_consolidated(inner: Inner, meta_key: str, doc: bytes | None, *, add: bool = False) -> None:
    """Replace (``doc``) or drop (``None``) one array's entry in draft consolidated metadata.

    An entry the document does not list is only added with ``add`` (the in-place
    protocol dropped it itself); a store without consolidated metadata, or with one that
    does not parse, is left alone.
    """
    raw = inner.get(dm.CONSOLIDATED_KEY)
    if raw is None:
        return
    try:
        consolidated = json.loads(raw)
    except (ValueError, RecursionError):
        return  # a damaged document lists nothing (as :func:`_consolidated_lists` says): left alone
    entries = consolidated.get("metadata") if isinstance(consolidated, dict) else None
    if not isinstance(entries, dict) or (meta_key not in entries and (doc is None or not add)):
        return
    if doc is None:
        del entries[meta_key]
    else:
        entries[meta_key] = json.loads(doc)
    inner.set(dm.CONSOLIDATED_KEY, dm._json_dumps(consolidated))


def _consolidated_lists(inner: Inner, meta_key: str) -> bool:
    raw = inner.get(dm.CONSOLIDATED_KEY)
    try:
        entries = None if raw is None else json.loads(raw).get("metadata")
    except (ValueError, AttributeError, RecursionError):
        return False
    return isinstance(entries, dict) and meta_key in entries


# --------------------------------------------------------------------------- in place


@dataclass(frozen=True)
class _Options:
    jobs: int
    progress: bool | None


def _stage(inner: Inner, journal: Journal, report: ReshardReport, opts: _Options) -> None:
    """Phase ``stage``: write every new object under ``__reshard__/`` (keeping those written already)."""
    old, new = _layouts(journal)
    objects = list_objects(inner, old)
    old = _with_zero_d(old, objects)
    new = replace(new, zero_d=old.zero_d)
    staged = set(list_objects(inner, new, STAGING))
    _Repack(inner, inner, old, new, STAGING).run(objects, report, jobs=opts.jobs, progress=opts.progress, skip=staged)


def _rollback(inner: Inner, journal: Journal) -> None:
    """Undo a ``stage`` phase: the array was never touched, only staged objects go."""
    _, new = _layouts(journal)
    for key in list_objects(inner, new, STAGING).values():
        inner.delete(STAGING + key)
    inner.tidy(STAGING + new.prefix, keep_top=False)  # writes a killed run left unfinished: before the journal goes
    inner.delete(journal.key)
    inner.tidy(STAGING, keep_top=False)  # emptied directories


def _swap(inner: Inner, journal: Journal, report: ReshardReport, opts: _Options) -> None:
    """Phase ``swap``: hide the array, then delete old objects that no staged object replaces."""
    _update_consolidated(inner, journal.meta_key, None)
    fault_point("hide")
    inner.delete(journal.meta_key)
    fault_point("hide")
    old, new = _layouts(journal)
    # streamed: each listing is read as the deletions go (a key is deleted after it was listed)
    doomed = _not_staged((k for _, k in iter_objects(inner, old)), (k for _, k in iter_objects(inner, new, STAGING)))

    def delete(key: str) -> None:
        inner.delete(key)
        report.add(objects_removed=1)
        fault_point("clear")

    run_all(delete, doomed, opts.jobs)


def _move(inner: Inner, journal: Journal, report: ReshardReport, opts: _Options) -> None:
    """Phase ``move``: staged objects over their final keys, then the new metadata."""
    _, new = _layouts(journal)
    staged = (k for _, k in iter_objects(inner, new, STAGING))  # streamed: moved after it was listed

    def move(key: str) -> None:
        inner.move(STAGING + key, key)
        fault_point("move")

    run_all(move, staged, opts.jobs)
    inner.set(journal.meta_key, journal.new.encode())
    fault_point("commit")
    if journal.consolidated:
        _update_consolidated(inner, journal.meta_key, journal.new.encode(), add=True)
        fault_point("commit")
    inner.tidy(STAGING + new.prefix, keep_top=False)  # writes a killed run left unfinished: before the journal goes
    inner.delete(journal.key)
    inner.tidy(new.prefix)  # directories the moves and deletes emptied
    inner.tidy(STAGING, keep_top=False)


def _complete(inner: Inner, journal: Journal, report: ReshardReport, opts: _Options) -> bool:
    """Roll an array's journal forward to the end; ``False`` if it was rolled back instead."""
    if journal.phase == "stage":
        if inner.get(journal.meta_key) != journal.old.encode():
            _rollback(inner, journal)
            return False
        _stage(inner, journal, report, opts)
        journal.save(inner, "swap")
    if journal.phase == "swap":
        _swap(inner, journal, report, opts)
        journal.save(inner, "move")
    _move(inner, journal, report, opts)
    return True


def _reshard_in_place(inner: Inner, meta_key: str, target: dm.DraftArrayMeta, report: ReshardReport, opts: _Options) -> None:
    old_raw = inner.get(meta_key)
    if old_raw is None:
        raise MigrationError(f"{meta_key}: array metadata vanished", key=meta_key)
    journal = Journal(
        path=target.path,
        meta_key=meta_key,
        old=old_raw.decode("utf-8"),
        new=dm.encode_array_metadata(target).decode("ascii"),
        phase="stage",
        consolidated=_consolidated_lists(inner, meta_key),
    )
    journal.save(inner, "stage")
    try:
        _stage(inner, journal, report, opts)
    except UsageError:
        raise
    except (DraftMetadataError, MigrationError, ValueError) as e:
        # damaged source data: resuming would fail the same way, so undo the staging
        _rollback(inner, journal)
        raise MigrationError(f"array '{target.path or '/'}': {e}; nothing was changed", key=getattr(e, "key", None)) from e
    journal.save(inner, "swap")
    _swap(inner, journal, report, opts)
    journal.save(inner, "move")
    _move(inner, journal, report, opts)


def complete_interrupted(
    src: Any, *, run: RunOptions | None = None, stores: StoreOptions | None = None, **legacy: Any
) -> ReshardReport:
    """Finish every interrupted in-place reshard found in ``src`` (``reshard --resume``)."""
    started = time.perf_counter()
    if "chunks_per_shard" in legacy or set(legacy) & {f.name for f in fields(ReshardOptions)}:
        raise TypeError(f"complete_interrupted() takes no layout options, got {sorted(legacy)}")
    _, run, stores = legacy_options("complete_interrupted", ReshardOptions(None), legacy, run, stores)
    run.refuse_executor("reshard")
    inner = inner_of(src, stores.src)
    report = ReshardReport(source=_describe(src), destination=None)
    _resume_all(inner, report, _Options(run.jobs_or(DEFAULT_JOBS), run.progress))
    report.seconds = time.perf_counter() - started
    return report


def _resume_all(inner: Inner, report: ReshardReport, opts: _Options) -> None:
    for journal in interrupted_reshards(inner):
        if _complete(inner, journal, report, opts):
            report.arrays_resumed.append(journal.path)
    if staging_leftovers(inner):  # a run killed after its journal went (older versions) left these
        inner.delete_prefix(STAGING)
        inner.tidy(STAGING, keep_top=False)


# --------------------------------------------------------------------------- copying


def _describe(store: Any) -> str:
    return os.fspath(store) if isinstance(store, (str, os.PathLike)) else type(store).__name__


def _copy_hierarchy(
    src_inner: Inner,
    dst_inner: Inner,
    h: DraftHierarchy,
    targets: Mapping[str, dm.DraftArrayMeta],
    report: ReshardReport,
    opts: _Options,
) -> None:
    """Copy everything, repacking ``targets``; data first, then metadata, ``zarr.json`` last."""
    layouts = {p: ArrayLayout.from_meta(h.node(p).meta) for p in targets}  # type: ignore[arg-type]
    repacked_meta = {dm.array_meta_key(p, h.suffix) for p in targets}

    def repacked_chunk(key: str) -> bool:
        return any(lay.parse(key) is not None for lay in layouts.values())

    data: list[tuple[str, int | None]] = []
    meta: list[tuple[str, int | None]] = []
    entry_point: tuple[str, int | None] = (dm.ENTRY_POINT_KEY, None)
    for key, size in src_inner.list_sized(""):
        if key == dm.ENTRY_POINT_KEY:
            entry_point = (key, size)
        if key.startswith(STAGING) or key in (dm.ENTRY_POINT_KEY, LOCK_KEY) or key in repacked_meta or repacked_chunk(key):
            continue  # (a lock in the source is another run's, not the hierarchy's: copied it would replace this run's)
        (meta if key.startswith("meta/") else data).append((key, size))

    def copy(item: tuple[str, int | None]) -> None:
        report.add(objects_copied=1, bytes_written=copy_object(src_inner, dst_inner, *item))

    if data and src_inner.can_copy_to(dst_inner):
        report.copied_by = copy_words(dst_inner)

    copied, nbytes = report.objects_copied, report.bytes_written
    with _progress(len(data), "copy", opts.progress) as bar:
        run_all(copy, data, opts.jobs, lambda _: bar.reach(report.objects_copied - copied, report.bytes_written - nbytes))
    for path, target in targets.items():
        src = layouts[path]
        objects = list_objects(src_inner, src)
        src = _with_zero_d(src, objects)
        dst = replace(ArrayLayout.from_meta(target), zero_d=src.zero_d)
        _Repack(src_inner, dst_inner, src, dst).run(objects, report, jobs=opts.jobs, progress=opts.progress)
    run_all(copy, meta, opts.jobs)
    for path, target in targets.items():
        key = dm.array_meta_key(path, h.suffix)
        doc = dm.encode_array_metadata(target)
        dst_inner.set(key, doc)
        _update_consolidated(dst_inner, key, doc)
    copy(entry_point)


# --------------------------------------------------------------------------- API


def _select(h: DraftHierarchy, arrays: Iterable[str] | None) -> list[dm.DraftArrayMeta]:
    """The arrays to consider; one that was asked for by name and is damaged is refused."""
    if arrays is None:
        return [n.meta for n in h.arrays() if n.meta is not None]
    out = []
    for path in dict.fromkeys(arrays):
        if dm.normalize_path(path) in h.damaged:
            raise damage_error(h.damaged[dm.normalize_path(path)], path, "reshard cannot repack it")
        node = h.node(path)
        if node.kind != "array" or node.meta is None:
            raise UsageError(f"--array {path!r}: '{node.path or '/'}' is a group, not an array", key=node.path)
        out.append(node.meta)
    return out


def _run(src: Any, dst: Any | None, options: ReshardOptions, run: RunOptions, stores: StoreOptions) -> ReshardReport:
    """The one driver of :func:`reshard`, :func:`shard` and :func:`unshard`."""
    started = time.perf_counter()
    run.refuse_executor("reshard")
    opts = _Options(run.jobs_or(DEFAULT_JOBS), run.progress)
    src_inner = inner_of(src, stores.src)
    dst_inner = None if dst is None else inner_of(dst, stores.dst)
    if dst_inner is not None:
        check_apart(src_inner, dst_inner, _describe(src), _describe(dst), hint="omit DST to work in place")
    report = ReshardReport(source=_describe(src), destination=None if dst is None else _describe(dst))
    journals = interrupted_reshards(src_inner)
    if journals and (dst is not None or not options.resume):
        names = ", ".join(f"'{j.path or '/'}' ({j.phase})" for j in journals)
        raise MigrationError(
            f"{_describe(src)}: interrupted in-place reshard of {names}; "
            f"complete it first with `sharding-store reshard {_describe(src)} --resume`",
            key=journals[0].key,
        )
    if dst_inner is None:
        _resume_all(src_inner, report, opts)
    h = DraftHierarchy(src_inner, location=_describe(src), strict=False)
    targets = _targets(h, _wanted(options), options.arrays, report)
    if dst_inner is None:
        for path, target in targets.items():
            _reshard_in_place(src_inner, dm.array_meta_key(path, h.suffix), target, report, opts)
            report.arrays_changed.append(path)
    else:
        with destination_lock(dst_inner, LOCK_KEY, _describe(dst), "reshard"):  # before anything is removed
            prepare_plain(dst_inner, _describe(dst), overwrite=options.overwrite)
            _claim(dst_inner, _describe(src), _describe(dst))
            _copy_hierarchy(src_inner, dst_inner, h, targets, report, opts)
            dst_inner.delete(MARKER_KEY)
        report.arrays_changed.extend(targets)
    report.seconds = time.perf_counter() - started
    return report


def _claim(dst: Inner, source: str, name: str) -> None:
    """Create the marker, exclusively, before anything else is written: of two runs that
    both found DST empty only one copies into it (the other would mix its shards and
    documents with the first's). The marker also keeps an interrupted copy (its zarr.json
    comes last) one that ``--overwrite`` recognises."""
    fault_point("claim")
    if not dst.create_exclusive(MARKER_KEY, json.dumps({"command": "reshard", "source": source}).encode()):
        raise DestinationExistsError(
            f"{name}: another reshard or migration is writing into this destination (its {MARKER_KEY} appeared "
            "after the destination was found empty); wait for it, or use another destination",
            key=MARKER_KEY,
        )


def _wanted(options: ReshardOptions) -> Callable[[dm.DraftArrayMeta], Coords | None | bool]:
    """``want(meta)``: an array's target chunks per shard, or ``False`` to leave it alone."""
    cps = options.chunks_per_shard
    if options.only_unsharded:
        return lambda meta: False if meta.is_sharded else resolve_chunks_per_shard(meta, cps)
    return lambda meta: resolve_chunks_per_shard(meta, cps)


def _targets(
    h: DraftHierarchy, want: Callable[[dm.DraftArrayMeta], Coords | None | bool], arrays: Iterable[str] | None,
    report: ReshardReport,
) -> dict[str, dm.DraftArrayMeta]:
    """The new metadata of each array to repack. Damaged arrays (invalid documents, or
    shards under metadata that lost its transformer, which a repack would scramble) are
    left alone and reported, or refused when asked for by name."""
    if arrays is None:
        report.arrays_damaged.update({p: str(e) for p, e in h.damaged.items()})
    targets: dict[str, dm.DraftArrayMeta] = {}
    for meta in _select(h, arrays):
        cps = want(meta)
        if cps is False or cps == meta.chunks_per_shard:
            report.arrays_skipped.append(meta.path)
            continue
        lost = lost_transformer(h, h.node(meta.path))
        if lost is not None and arrays is not None:
            raise damage_error(lost, meta.path, "reshard cannot repack it")
        if lost is not None:
            report.arrays_damaged[meta.path] = str(lost)
            continue
        targets[meta.path] = meta.with_chunks_per_shard(cps)  # type: ignore[arg-type]
    return targets


def _not_a_destination(dst: Any) -> None:
    """``reshard(src, ReshardOptions(...))`` puts the options where the destination goes."""
    if isinstance(dst, ReshardOptions):
        raise TypeError("reshard(): the destination is a ReshardOptions: pass it as options=... (in place: dst=None)")


def reshard(
    src: Any,
    dst: Any | None = None,
    options: ReshardOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    **legacy: Any,
) -> ReshardReport:
    """Give the chosen arrays (``options.arrays``, default all) ``options.chunks_per_shard``
    chunks per shard (:class:`~sharding_store.ops.options.ReshardOptions`).

    ``chunks_per_shard``: one number for every dimension, one per dimension, or ``None``
    to unshard. Without ``dst`` the store is changed in place, safely (see the module
    docstring); interrupted runs found in it are completed first unless ``resume=False``,
    which refuses such a store. With ``dst`` the hierarchy is copied there (``dst`` must
    be empty unless ``overwrite``; it must not be the source, inside it or contain it,
    however spelled). Arrays already in the layout are skipped without writing anything.
    ``run``: jobs (default 8) and progress (no executor: the journals live here).
    The keywords of 0.1.0 (``chunks_per_shard=4, jobs=2, storage_options={...}``) still
    work (:func:`~sharding_store.ops.options.legacy_options`).
    """
    _not_a_destination(dst)
    if options is None:
        if "chunks_per_shard" not in legacy:
            raise TypeError("reshard() missing the layout: give ReshardOptions(chunks_per_shard=...) "
                            "or chunks_per_shard=...")
        options = ReshardOptions(legacy.pop("chunks_per_shard"))
    return _run(src, dst, *legacy_options("reshard", options, legacy, run, stores))


def unshard(src: Any, dst: Any | None = None, options: ReshardOptions | None = None, **kwargs: Any) -> ReshardReport:
    """One object per chunk again (for readers without sharding); a no-op on unsharded arrays."""
    return reshard(src, dst, replace(options or ReshardOptions(None), chunks_per_shard=None), **kwargs)


def shard(
    src: Any,
    dst: Any | None = None,
    options: ReshardOptions | None = None,
    *,
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
    **legacy: Any,
) -> ReshardReport:
    """Add sharding to the *unsharded* chosen arrays; sharded ones are left as they are
    (:func:`reshard` with ``only_unsharded=True``)."""
    _not_a_destination(dst)
    if options is None:
        options = ReshardOptions(legacy.pop("chunks_per_shard", None), only_unsharded=True)
    options, run, stores = legacy_options("shard", replace(options, only_unsharded=True), legacy, run, stores)
    return _run(src, dst, options, run, stores)
