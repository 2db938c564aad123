"""Jobs: many small, idempotent work units over a pair of stores.

The machinery the three drivers (:mod:`~sharding_store.ops.migration`,
:mod:`~sharding_store.ops.verification`, :mod:`~sharding_store.ops.resharding`) share, one of each:

* **Stores for workers** — :class:`StoreRef`: how a worker reaches a store (a URL and
  storage options, picklable for a dask cluster; or, on threads, the store object),
  opened once per process (a small cache keyed by process id).
* **Planning** — which source objects each unit reads: :func:`plan_units` (one unit
  per target object, or per ``lcm`` block of both layouts), and the refusals every
  driver makes the same way (:func:`damage_error`, :func:`lost_transformer`,
  :func:`resolve_chunks_per_shard`).
* **Running** — :func:`run_units` runs a driver's units inline (one job: no thread, no
  future), on a pool of threads or on an executor; :func:`run_bounded` feeds them to any ``concurrent.futures.Executor``
  (a thread pool or ``distributed.Client.get_executor()``) in batches with a bounded
  window; :func:`run_all` is the thread-pool form that stops at the first error;
  :func:`cancelling` shuts a driver's thread pool down so that an interruption (Ctrl-C,
  SIGTERM) or an error leaves promptly: work not started is cancelled.
* **Retries** — :func:`with_retries` re-runs a unit after a *transient* error
  (:func:`is_transient`); a full disk or a permission error is not one.
* **Fault points** — :func:`fault_point` marks where a crash must be survivable. In
  production it does nothing; tests install a hook through
  :mod:`sharding_store.testing` to crash, kill or pause the process there.

Layers: this module imports the stores, the format and the hierarchy; the drivers
import it; it imports no driver.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import json
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from ..api.hierarchy import DraftHierarchy, Node
from ..errors import DraftMetadataError, LinkOutsideStoreError, ShardingStoreError, UsageError
from ..formats import draft_metadata as dm
from ..formats.keys import Coords, parse_chunk_suffix
from ..stores import Inner, as_inner, in_memory

if TYPE_CHECKING:  # concurrent.futures (with logging, ~8 ms) loads where a pool or an executor is used
    from concurrent.futures import Executor, Future, ThreadPoolExecutor

R = TypeVar("R")

# --------------------------------------------------------------------------- stores for workers

#: stores opened per process (URL stores only; see :meth:`StoreRef.open`)
MAX_OPENED = 16
_OPENED: dict[tuple[int, str, tuple[tuple[str, str], ...]], Inner] = {}


@dataclass(frozen=True)
class StoreRef:
    """How a worker reaches a store: a URL and storage options, or (threads only) an object."""

    url: str | None
    storage_options: tuple[tuple[str, str], ...] = ()  # JSON-encoded values: hashable, picklable
    obj: Any = None

    @classmethod
    def of(cls, store: Any, storage_options: Mapping[str, Any] | None = None) -> StoreRef:
        if isinstance(store, StoreRef):
            return store
        if isinstance(store, os.PathLike):
            store = os.fspath(store)
        opts = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in (storage_options or {}).items()))
        if isinstance(store, str):
            return cls(store, opts)
        return cls(None, opts, store)

    @property
    def picklable(self) -> bool:
        return self.url is not None and self.obj is None

    def describe(self) -> str:
        return self.url if self.url is not None else type(self.obj).__name__

    def open(self) -> Inner:
        """The store's adapter. A URL is opened once per process and reused by every unit
        of this process (a worker of a dask cluster opens it on its first unit). The cache
        is keyed by process id, so a forked child never uses its parent's connections, and
        holds at most :data:`MAX_OPENED` stores. No lock: two threads opening the same URL
        at once both open it and one adapter is kept."""
        if self.obj is not None or self.url is None:  # adapted once: a unit of a small shard costs less than adapting a mapping
            # (a URL beside an object: the destination opened by kind, e.g. a reference file, named by its URL)
            inner = self.__dict__.get("_inner")
            if inner is None:
                inner = as_inner(self.obj)
                object.__setattr__(self, "_inner", inner)
            return inner
        url = self.url
        if "://" not in url and "::" not in url:  # a local path: relative to this cwd, this ~
            url = os.path.abspath(os.path.expanduser(url))
        key = (os.getpid(), url, self.storage_options)
        inner = _OPENED.get(key)
        if inner is None:
            inner = as_inner(self.url, storage_options={k: json.loads(v) for k, v in self.storage_options})
            while len(_OPENED) >= MAX_OPENED:
                try:
                    del _OPENED[next(iter(_OPENED))]  # the oldest
                except (KeyError, RuntimeError, StopIteration):  # another thread changed it meanwhile
                    break
            inner = _OPENED.setdefault(key, inner)
        return inner


def check_picklable(*refs: StoreRef) -> None:
    """Work sent to another process must open its stores from a URL."""
    for ref in refs:
        if not ref.picklable:
            raise UsageError(
                f"{ref.describe()}: an executor runs work in other processes, which need a store "
                "URL (path, file://, s3://...), not a store object"
            )


def both_local(src: Inner, dst: Inner) -> bool:
    """Whether both stores are local directories (work is then CPU-bound: one thread per core)."""
    return src.location().kind == "file" and dst.location().kind == "file"


def copy_words(dst: Inner) -> str:
    """What a copy the stores make themselves (:meth:`Inner.copy_to`, :meth:`Inner.compose`)
    is called in reports: between local directories the kernel copies (``copy_file_range``,
    ``sendfile``), on an object store the server does."""
    return "kernel copy" if dst.location().kind == "file" else "server-side copy"


def default_jobs(local: bool = False) -> int:
    """Work units run at once when the caller does not say. Between local paths a unit
    is system calls and memory copies that keep a core busy, so one thread per core:
    more only contend (on 2 cores, verifying 512 local shards took ~150 ms with 4
    threads, ~105 ms with 2). Remote stores wait on the network: twice the cores. At most 8."""
    cores = os.cpu_count() or 1
    return min(8, cores if local else 2 * cores)


def jobs_for(jobs: int | None, src: Inner, dst: Inner, executor: Executor | None) -> int:
    """``jobs`` when the caller gave it, else the default for these two stores: one (the
    units run inline, :func:`run_units`) between two in-memory stores (:func:`in_memory`).
    With an executor (a dask cluster) the remote default stays: its window follows the
    cluster, not this machine's cores."""
    if jobs:
        return jobs
    if executor is None and in_memory(src) and in_memory(dst):
        return 1
    return default_jobs(local=executor is None and both_local(src, dst))


def check_apart(
    src: Inner, dst: Inner, src_name: str, dst_name: str, *, allow_nested: bool = False, hint: str = ""
) -> None:
    """Refuse (:class:`UsageError`) a destination that is the source, lies inside it or
    contains it, however either is spelled (relative, ``file://``, ``~``, ``..``, a
    trailing slash, a symbolic link to it or into it, two URLs of one bucket): decided
    once, on the stores' canonical locations (:meth:`Location.relation`), before anything
    is read or written. ``allow_nested``: only the very same store is refused (reading
    both sides, as ``verify`` does, cannot harm either)."""
    relation = src.location().relation(dst.location())
    if relation is None or (allow_nested and relation != "same"):
        return
    where = {"same": "it is", "inside": "it contains", "contains": "it lies inside"}[relation]
    raise UsageError(
        f"{dst_name}: the destination is the source, inside it, or contains it ({where} {src_name})"
        + (f"; {hint}" if hint else ""),
        key=dst_name,
    )


# --------------------------------------------------------------------------- refusals every driver shares


def damage_error(error: ShardingStoreError, path: str, consequence: str) -> ShardingStoreError:
    """The same error class (so the CLI exits with the same code), naming the array and the way out."""
    return type(error)(f"{error}; array '{path or '/'}' is damaged: {consequence}", key=error.key)


def other_prefixes(h: DraftHierarchy, path: str) -> tuple[str, ...]:
    """Data prefixes of the other arrays below this array's data prefix (not stray keys)."""
    own = dm.data_prefix(path)
    return tuple(p for p in (dm.data_prefix(n.path) for n in h.arrays() if n.path != path) if p.startswith(own))


def lost_transformer(h: DraftHierarchy, node: Node) -> ShardingStoreError | None:
    """The error for an unsharded array whose objects are shards (one listing, one or two
    reads), or None: such an array must never be copied or repacked as unsharded."""
    if node.meta is None or node.meta.is_sharded or node.meta.declares_codecs:
        return None  # a document that declares its codecs in full has lost nothing
    from ..api.evidence import detect_lost_transformer  # only unsharded arrays need the inspector

    others = other_prefixes(h, node.path)
    prefix = dm.data_prefix(node.path)

    def keys() -> Iterator[str]:
        # any order: the least coordinates are looked for, and the keys held are sorted below
        return (k for k, _ in h.inner.list_unordered(prefix) if not (others and k.startswith(others)))

    # the object the detection looks at first: the least coordinates (then key: a 0-d array's "c" before "c0")
    first: tuple[Coords, str] | None = None
    for key in keys():
        coords = parse_chunk_suffix(key[len(prefix) :], node.meta.separator, node.meta.ndim)
        if coords is not None and (first is None or (coords, key) < first):
            first = coords, key
    try:
        # that object decides (a shard or not): only a shard's array is listed again and
        # held, to rank the candidate shapes; a sound array's listing is never held
        if first is None or detect_lost_transformer(h.inner, node.meta, [first[1]]) is None:
            return None
        found = detect_lost_transformer(h.inner, node.meta, sorted(keys()))
    except LinkOutsideStoreError as e:  # one of its objects links out of the store: damaged
        return e
    return None if found is None else found.error()


ChunksPerShard = int | Sequence[int] | None


def resolve_chunks_per_shard(meta: dm.DraftArrayMeta, requested: ChunksPerShard) -> Coords | None:
    """The target ``chunks_per_shard`` of one array; ``None`` = unsharded.

    One number (or a one-entry list) applies to every dimension, as in the model
    conversion API (``8`` on a 3-d array is ``8x8x8``); a list must have one entry per
    dimension. Raises :class:`UsageError` naming the array otherwise.
    """
    if requested is None:
        return None
    values = (requested,) if isinstance(requested, int) else tuple(requested)
    where = f"array '{meta.path or '/'}'"
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise UsageError(f"{where}: chunks_per_shard {list(values)}: every entry must be an integer >= 1")
    if len(values) == 1:
        values = values * meta.ndim
    elif len(values) != meta.ndim:
        raise UsageError(f"{where}: chunks_per_shard {list(values)} has {len(values)} entries, the array has {meta.ndim} dimensions")
    try:
        return meta.with_chunks_per_shard(values).chunks_per_shard
    except DraftMetadataError as e:
        raise UsageError(f"{where}: {e}", key=meta.path) from None


# --------------------------------------------------------------------------- planning units


class Source(NamedTuple):
    """A listed source object: its coordinates in the object grid, key and size (if listed)."""

    coords: Coords
    key: str
    size: int | None = None


class Group(NamedTuple):
    """The source objects one unit reads and what it builds: ``target`` is one target
    object's coordinates, or None for a whole ``lcm`` block (every target object the
    sources cover)."""

    target: Coords | None
    sources: tuple[Source, ...]


def target_range(coords: Coords, src_cps: Coords, dst_cps: Coords, grid: Coords | None = None) -> Iterator[Coords]:
    """Target objects overlapping source object ``coords`` (clipped to the chunk ``grid``
    when given: an object wholly outside the array overlaps nothing readable)."""
    ranges = []
    for d, (c, a, b) in enumerate(zip(coords, src_cps, dst_cps)):
        lo, hi = c * a, (c + 1) * a - 1
        if grid is not None:
            hi = min(hi, grid[d] - 1)
            if hi < lo:
                return
        ranges.append(range(lo // b, hi // b + 1))
    yield from itertools.product(*ranges)


def block_shape(src_cps: Coords, dst_cps: Coords, max_factor: int) -> Coords | None:
    """``lcm`` of both object shapes per dimension: a box covered exactly by whole source
    and whole target objects; None when it holds more than ``max_factor`` times the chunks
    of the larger object (a unit's memory is bounded)."""
    block = tuple(math.lcm(a, b) for a, b in zip(src_cps, dst_cps))
    if math.prod(block) > max_factor * max(math.prod(src_cps), math.prod(dst_cps)):
        return None
    return block


def plan_units(
    objects: Iterable[Source], src_cps: Coords, dst_cps: Coords, *, grid: Coords | None = None, max_block: int = 0
) -> list[Group]:
    """Group source objects into units, in the order of their targets.

    ``max_block`` 0: one unit per target object, reading the source objects that overlap
    it (migrate and verify, whose resume and checks go target by target). Otherwise one
    unit per ``lcm`` block when it is at most ``max_block`` times the larger object
    (each source object read once, whole, each target built once), else per target
    (reshard). ``grid`` clips targets to the array's chunk grid.
    """
    block = block_shape(src_cps, dst_cps, max_block) if max_block else None
    groups: dict[Coords, list[Source]] = defaultdict(list)
    for obj in sorted(objects):
        if block is not None:
            groups[tuple(c * a // b for c, a, b in zip(obj.coords, src_cps, block))].append(obj)
        else:
            for target in target_range(obj.coords, src_cps, dst_cps, grid):
                groups[target].append(obj)
    return [Group(None if block is not None else k, tuple(v)) for k, v in sorted(groups.items())]


def group_targets(group: Group, src_cps: Coords, dst_cps: Coords) -> set[Coords]:
    """Every target object a unit may write (it writes those that get a chunk)."""
    if group.target is not None:
        return {group.target}
    return {t for obj in group.sources for t in target_range(obj.coords, src_cps, dst_cps)}


def interleave(units: list[R], directory: Callable[[R], Hashable]) -> list[R]:
    """Units reordered so that consecutive ones write into different directories.

    Creating a file costs far more than copying a small shard's bytes, and a filesystem
    creates files in one directory one at a time (the directory is locked), but in
    different directories in parallel: workers taking units in key order would queue
    on one directory's lock. Round-robin over the target directories instead.
    """
    by_dir: dict[Hashable, list[R]] = {}
    for unit in units:
        by_dir.setdefault(directory(unit), []).append(unit)
    if len(by_dir) < 2:
        return units
    return [u for group in itertools.zip_longest(*by_dir.values()) for u in group if u is not None]


# --------------------------------------------------------------------------- retries

#: OSError subclasses that describe the data, not the connection: retrying cannot help
_PERMANENT_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)
#: errnos no wait fixes: a full disk or quota, a read-only filesystem, permissions, names
PERMANENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENAMETOOLONG", "EFBIG", "ENOTDIR", "EISDIR",
                 "EEXIST", "ENOENT", "ELOOP", "EMLINK", "EXDEV")
    if hasattr(errno, name)
)


def _botocore_transient() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:  # pragma: no cover - botocore comes with s3fs only
        return ()
    return (BotoConnectionError, HTTPClientError)


def is_transient(error: BaseException) -> bool:
    """True for errors worth retrying: I/O hiccups, not facts about the data or the machine
    (a full disk, a permission, a file in the way). An error of ours is transient only
    when it says so (``transient``: e.g. an endpoint that could not be reached)."""
    if isinstance(error, ShardingStoreError):
        return bool(getattr(error, "transient", False))
    if isinstance(error, _PERMANENT_OS_ERRORS):
        return False
    if isinstance(error, OSError) and error.errno in PERMANENT_ERRNOS:
        return False
    return isinstance(error, (OSError, TimeoutError, ConnectionError, *_botocore_transient()))


def with_retries(fn: Callable[..., R], *args: Any, attempts: int = 4, base_delay: float = 0.2, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, retried up to ``attempts`` times on transient errors.

    Delays double from ``base_delay`` (0.2 s, 0.4 s, 0.8 s by default); the last
    error is re-raised when every attempt failed.
    """
    for attempt in range(max(1, attempts)):
        try:
            return fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - filtered just below
            if attempt + 1 >= attempts or not is_transient(e):
                raise
            time.sleep(base_delay * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- running

#: most items per executor task (see :func:`run_bounded`)
MAX_BATCH = 16
#: units per batch of a virtual migration (:meth:`~sharding_store.ops.migration._Driver.run_references`:
#: a reference unit's work is a few microseconds)
INLINE_BATCH = 256


def run_bounded(
    executor: Executor,
    fn: Callable[..., R],
    items: Iterable[tuple[Any, ...]],
    *,
    window: int,
    max_batch: int = MAX_BATCH,
) -> Generator[tuple[tuple[Any, ...], Outcome[R]], None, None]:
    """Run ``fn(*item)`` for each item with at most ``window`` batches pending.

    Yields ``(item, outcome)`` as items complete (``outcome.result()`` may raise: each
    item fails alone; an :class:`Outcome` reads like a done future). Items travel in
    batches, one executor task each, growing from 1 to ``max_batch`` items: handing a task to a worker and its result back costs a
    thread wake-up each way (a dask round trip on a cluster), which on a busy machine
    costs more than copying a small shard. Memory stays bounded by the window: a worker
    runs its batch's items one after the other. When the consumer stops early (an
    error, an interruption), the pending batches are cancelled and, on a thread pool, the
    running ones stop after their current item.
    """
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait  # noqa: PLC0415 - see the imports

    pending: dict[Future[list[tuple[bool, Any]]], list[tuple[Any, ...]]] = {}
    iterator = iter(items)
    exhausted = False
    window = max(1, window)
    submitted = 0
    # threads share this process: a running batch can be told to stop (a cluster's cannot)
    stop = threading.Event() if isinstance(executor, ThreadPoolExecutor) else None
    try:
        while True:
            while not exhausted and len(pending) < window:
                batch = list(itertools.islice(iterator, min(max_batch, 1 + submitted // window)))
                if not batch:
                    exhausted = True
                    break
                pending[executor.submit(_run_batch, fn, batch, stop)] = batch
                submitted += len(batch)
            if not pending:
                return
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in done:
                batch = pending.pop(future)
                try:
                    outcomes = future.result()
                except BaseException as e:  # noqa: BLE001 - the task itself failed (e.g. a lost worker)
                    outcomes = [(False, e)] * len(batch)
                for item, (ok, value) in zip(batch, outcomes):
                    yield item, Outcome(ok, value)
    finally:
        if stop is not None:
            stop.set()
        for future in pending:
            future.cancel()


class Outcome(Generic[R]):
    """One item's finished outcome, read like a done future: :meth:`result` returns its
    value or raises its exception (a ``Future`` per item would cost a condition variable
    and its locks, a visible share of a small unit)."""

    __slots__ = ("_ok", "_value")

    def __init__(self, ok: bool, value: Any) -> None:
        self._ok, self._value = ok, value

    def result(self) -> R:
        if self._ok:
            return self._value
        raise self._value


def _run_batch(fn: Callable[..., R], batch: list[tuple[Any, ...]],
               stop: threading.Event | None = None) -> list[tuple[bool, Any]]:
    """The executor task: every item of a batch, each one's result or exception; once
    ``stop`` is set (the consumer left) the remaining items are not run."""
    out: list[tuple[bool, Any]] = []
    for item in batch:
        if stop is not None and stop.is_set():
            from concurrent.futures import CancelledError  # noqa: PLC0415 - see the imports

            out.append((False, CancelledError()))
            continue
        try:
            out.append((True, fn(*item)))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, item by item
            out.append((False, e))
    return out


def run_inline(fn: Callable[..., R], items: Iterable[tuple[Any, ...]]) -> Generator[tuple[tuple[Any, ...], Outcome[R]], None, None]:
    """:func:`run_bounded`'s protocol in this thread: ``fn(*item)`` for each item as the
    consumer asks for it, yielding ``(item, outcome)`` (each item fails alone). No
    executor, no future, no thread hand-off: for work with no I/O to overlap (one job)."""
    for item in items:
        try:
            outcome: Outcome[R] = Outcome(True, fn(*item))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, item by item
            outcome = Outcome(False, e)
        yield item, outcome


def run_units(
    fn: Callable[..., R], items: Iterable[tuple[Any, ...]], *, jobs: int, executor: Executor | None = None,
    name: str = "units",
) -> Generator[tuple[tuple[Any, ...], Outcome[R]], None, None]:
    """How a driver runs its units, yielding ``(item, outcome)`` as they complete: on
    ``executor`` (a window of ``4 * jobs`` batches), else on ``jobs`` threads (``2 * jobs``)
    shut down with :func:`cancelling`, else (one job) inline (:func:`run_inline`). Closing
    the generator (an error, an interruption in the consumer) cancels what has not started."""
    if executor is not None:
        yield from run_bounded(executor, fn, items, window=4 * jobs)
    elif jobs <= 1:
        yield from run_inline(fn, items)
    else:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - see the imports

        with cancelling(ThreadPoolExecutor(jobs, thread_name_prefix=name)) as pool:
            yield from run_bounded(pool, fn, items, window=2 * jobs)


def run_all(fn: Callable[[Any], Any], items: Iterable[Any], jobs: int,
            on_done: Callable[[Any], Any] = lambda item: None) -> None:
    """``fn(item)`` for every item on ``jobs`` threads (in this thread for one job), at most
    ``2 * jobs`` in flight, one item per task (:func:`run_bounded` with batches of one);
    ``on_done(item)`` in this thread after each.

    The first exception (or an interruption) stops submitting, cancels the items not
    started, waits for those running and is raised: after a failure no further item starts.
    """
    if jobs <= 1:
        for item in items:
            fn(item)
            on_done(item)
        return
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - see the imports

    with cancelling(ThreadPoolExecutor(jobs)) as pool, closing(
        run_bounded(pool, fn, ((item,) for item in items), window=2 * jobs, max_batch=1)
    ) as results:
        for (item,), future in results:
            future.result()
            on_done(item)


@contextlib.contextmanager
def cancelling(pool: ThreadPoolExecutor) -> Iterator[ThreadPoolExecutor]:
    """``pool`` for the block, shut down after it. When the block raises (an error, Ctrl-C,
    SIGTERM) the work not started is cancelled and only the items running are waited for:
    an interrupted command ends within one item's time, leaving no write half done (a plain
    ``with pool:`` would first run everything queued)."""
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


# --------------------------------------------------------------------------- fault points

FaultHook = Callable[[str], None]
_fault_hook: FaultHook | None = None


def fault_point(phase: str) -> None:
    """A point where a crash must be survivable: migrate and reshard's copy before they take
    the destination's lock (``lock``) and before they claim it (``claim``), after each
    completed unit (``unit``) and metadata write (``meta``); reshard after each object
    operation of its in-place protocol (``stage``, ``hide``, ``clear``, ``move``, ``commit``). Does nothing
    unless a test installed a hook (:func:`sharding_store.testing.fault_hook`), which may
    raise, kill the process or pause it there."""
    hook = _fault_hook
    if hook is not None:
        hook(phase)


def install_fault_hook(hook: FaultHook | None) -> FaultHook | None:
    """Install ``hook`` (None: none) for :func:`fault_point`; returns the previous one.
    For :mod:`sharding_store.testing` only."""
    global _fault_hook
    previous, _fault_hook = _fault_hook, hook
    return previous


@contextmanager
def collections_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off for a block (then on again, unless the
    caller had turned it off): a virtual migration's units and the check of its
    destination after it. Both keep their own objects alive to the end (the reference
    file's parse, the unit log's batches, the sink's pending references) and make no
    reference cycles per shard (a 4096-shard migration leaves some 50 objects in cycles:
    the JSON encoder's closures, the stores at the end), so every collection meanwhile finds
    nothing to free and only traverses them again (~3.5k instructions a shard in the check,
    7 %; ~7k in the migration, 5 %). What another thread leaves meanwhile is collected once
    the block ends. Memory: what the block holds anyway."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = [
    "collections_paused",
    "MAX_BATCH",
    "FaultHook",
    "Group",
    "Outcome",
    "Source",
    "StoreRef",
    "block_shape",
    "both_local",
    "cancelling",
    "check_apart",
    "check_picklable",
    "copy_words",
    "damage_error",
    "default_jobs",
    "fault_point",
    "group_targets",
    "interleave",
    "in_memory",
    "is_transient",
    "jobs_for",
    "lost_transformer",
    "other_prefixes",
    "plan_units",
    "resolve_chunks_per_shard",
    "run_all",
    "run_bounded",
    "run_inline",
    "run_units",
    "target_range",
    "with_retries",
]
