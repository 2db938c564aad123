"""Typed options of the operations (issue 23): ``migrate``, ``upgrade_in_place``, ``verify``, ``reshard``.

Each operation takes small frozen records instead of a long keyword list:

- :class:`StoreOptions`: the fsspec/obstore options of each side (source, destination);
- :class:`RunOptions`: how the work runs (jobs, retries, retry delay, progress bar, executor);
- one record per operation: :class:`MigrateOptions`, :class:`UpgradeOptions`,
  :class:`VerifyOptions`, :class:`ReshardOptions`.

Every record checks itself when built (``__post_init__``) and refuses a bad value with
:class:`~sharding_store.errors.UsageError` naming the field, so an operation never starts
with options that contradict each other. The keyword spelling of version 0.1.0
(``migrate(src, dst, resume=True, jobs=4)``) is translated into these records by
:func:`legacy_options`, the one place that knows the old names.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from ..errors import UsageError

if TYPE_CHECKING:  # a type only: concurrent.futures (with logging) loads with a pool, not with the options
    from concurrent.futures import Executor

IndexLocation = Literal["start", "end"]
#: ``assume_chunks_per_shard``: array path -> chunks_per_shard its lost transformer had
AssumeChunksPerShard = Mapping[str, "int | Sequence[int]"]
#: one number for every dimension, one per dimension, or None (one object per chunk)
ChunksPerShard = "int | tuple[int, ...] | None"
#: attempts of a work unit on transient errors, and the first delay between two (doubling)
RETRY_ATTEMPTS = 4
RETRY_DELAY = 0.2
#: differences a verification keeps in full (all are counted)
MAX_KEPT = 20

__all__ = ["MigrateOptions", "ReshardOptions", "RunOptions", "StoreOptions", "UpgradeOptions", "VerifyOptions",
           "legacy_options"]


# --------------------------------------------------------------------------- checks shared by the records


def _set(record: Any, name: str, value: Any) -> None:
    """Store a normalized value in a frozen record (only from its ``__post_init__``)."""
    object.__setattr__(record, name, value)


def _check_bools(record: Any, *names: str) -> None:
    for name in names:
        value = getattr(record, name)
        if not isinstance(value, bool):
            raise UsageError(f"{type(record).__name__}.{name}: True or False, got {value!r}")


def _check_mapping(record: Any, name: str) -> None:
    value = getattr(record, name)
    if value is not None and not isinstance(value, Mapping):
        raise UsageError(f"{type(record).__name__}.{name}: a mapping or None, got {type(value).__name__}")


def _positive_int(value: Any) -> bool:
    """An integer >= 1 (numpy's too), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1


def _chunks_per_shard(record: Any, name: str = "chunks_per_shard") -> None:
    """``int``, a sequence of ints (kept as a tuple) or None; every number >= 1."""
    value = getattr(record, name)
    if value is None:
        return
    if _positive_int(value):
        _set(record, name, int(value))
        return
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value and all(map(_positive_int, value)):
        _set(record, name, tuple(int(v) for v in value))
        return
    raise UsageError(f"{type(record).__name__}.{name}: a number >= 1 or one per dimension, got {value!r}")


def dimension_names_option(given: Mapping[str, Any] | None) -> dict[str, tuple[str | None, ...]] | None:
    """``dimension_names`` with normalised paths ("/a/b/" -> "a/b") and tuples of names. A
    path that is no node path, a name given twice for one array, or two spellings of one
    path with different names are refused (:class:`UsageError`, exit 2, naming them):
    never silently one of them."""
    if not given:
        return None
    from ..errors import DraftMetadataError
    from ..formats import draft_metadata as dm  # numpy: not loaded for the CLI's start-up

    out: dict[str, tuple[str | None, ...]] = {}
    for path, names in given.items():
        shown = dm.escape_name(str(path))
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or \
                not all(n is None or isinstance(n, str) for n in names):
            raise UsageError(f"dimension names for '{shown}': a list of names, got {names!r}")
        try:
            norm = dm.normalize_path(path)
        except DraftMetadataError as e:
            raise UsageError(f"--dimension-names {shown}: {e}", key=str(path)) from None
        twice = sorted({n for n in names if n is not None and list(names).count(n) > 1}, key=str)
        if twice:
            raise UsageError(f"--dimension-names {shown}: {', '.join(map(repr, twice))} given twice "
                             f"({','.join(map(str, names))}): each dimension needs its own name", key=norm)
        if norm in out and out[norm] != tuple(names):
            raise UsageError(f"--dimension-names: '/{norm}' given twice with different names "
                             f"({list(out[norm])} and {list(names)})", key=norm)
        out[norm] = tuple(names)
    return out


# --------------------------------------------------------------------------- shared records


@dataclass(frozen=True)
class StoreOptions:
    """fsspec/obstore options per side: ``src`` for the source, ``dst`` for the destination
    (``StoreOptions.both(x)`` gives both sides the same). None: the store's defaults."""

    src: Mapping[str, Any] | None = None
    dst: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("src", "dst"):
            _check_mapping(self, name)
            value = getattr(self, name)
            if value is not None:
                _set(self, name, dict(value))  # a copy: the caller's dict may change later

    @classmethod
    def both(cls, options: Mapping[str, Any] | None) -> StoreOptions:
        return cls(options, options)


@dataclass(frozen=True)
class RunOptions:
    """How an operation's work runs. ``jobs``: work units at once (None: the operation's
    default for its stores); ``retries``: attempts of a unit on transient errors, delays
    doubling from ``retry_delay`` seconds; ``progress``: a progress bar (None: on a
    terminal); ``executor``: e.g. ``distributed.Client(...).get_executor()`` instead of a
    pool of ``jobs`` threads (operations that cannot use one refuse it)."""

    jobs: int | None = None
    retries: int = RETRY_ATTEMPTS
    retry_delay: float = RETRY_DELAY
    progress: bool | None = None
    executor: Executor | None = None

    def __post_init__(self) -> None:
        if self.jobs is not None and not _positive_int(self.jobs):
            raise UsageError(f"RunOptions.jobs: a number >= 1 (or None), got {self.jobs!r}")
        if not _positive_int(self.retries):
            raise UsageError(f"RunOptions.retries: attempts, a number >= 1, got {self.retries!r}")
        _set(self, "jobs", None if self.jobs is None else int(self.jobs))
        _set(self, "retries", int(self.retries))
        delay = self.retry_delay
        if isinstance(delay, bool) or not isinstance(delay, numbers.Real) or not math.isfinite(delay) or delay < 0:
            raise UsageError(f"RunOptions.retry_delay: seconds >= 0, got {delay!r}")
        if self.progress is not None:
            _check_bools(self, "progress")

    def jobs_or(self, default: int) -> int:
        return default if self.jobs is None else self.jobs

    def one_store(self, operation: str, stores: StoreOptions) -> Mapping[str, Any] | None:
        """The options of the one store an in-place operation works on: ``stores.src``
        (``stores.dst`` only as the same options, as ``storage_options=`` gives both)."""
        if stores.dst is not None and stores.dst != stores.src:
            raise UsageError(f"{operation}: StoreOptions.dst does not apply (one store, changed where it is)")
        return stores.src

    def refuse_executor(self, operation: str) -> None:
        """Operations that run on this machine only (they hold locks or journals here)."""
        if self.executor is not None:
            raise UsageError(f"{operation}: RunOptions.executor does not apply (it runs on this machine)")


# --------------------------------------------------------------------------- one record per operation


#: what a migration's destination is (``MigrateOptions.target``)
Target = Literal["zarr", "icechunk", "references"]
TARGETS: tuple[str, ...] = ("zarr", "icechunk", "references")


@dataclass(frozen=True)
class MigrateOptions:
    """What a copy migration writes (:func:`sharding_store.ops.migration.migrate`).

    ``chunks_per_shard`` reshards every array (one number applies to every dimension);
    ``index_checksum``/``index_location``: the v1.0 shard index (location None: where the
    source has it, the end for a 2022 draft shard); ``portable``: only codecs
    every v3 reader knows; ``overwrite`` empties a non-empty destination, ``resume``
    finishes an interrupted migration into it (the two contradict each other);
    ``dry_run`` writes nothing; ``verify`` compares the result with the source;
    ``skip_damaged`` leaves out (and reports) damaged or untranslatable arrays;
    ``assume_chunks_per_shard`` (path -> chunks per shard) migrates arrays whose metadata
    lost its storage transformer as the shards they are; ``dimension_names`` (path ->
    names) names the dimensions of arrays without; ``consolidate``: zarr-python 3's
    inline consolidated metadata in the root group. ``virtual`` (issue 24): the destination
    refers to the source's objects instead of holding copies of them; ``target`` what DST
    is: ``"zarr"`` (a store of bytes), ``"icechunk"`` (a repository: virtual references, or
    the bytes in one transaction), ``"references"`` (an fsspec reference file, always
    virtual); None: decided from DST (a name ending ``.json``: a reference file; an
    existing Icechunk repository; else Zarr).
    """

    chunks_per_shard: int | tuple[int, ...] | None = None
    index_checksum: bool = True
    index_location: IndexLocation | None = None
    portable: bool = False
    overwrite: bool = False
    resume: bool = False
    dry_run: bool = False
    verify: bool = True
    skip_damaged: bool = False
    assume_chunks_per_shard: AssumeChunksPerShard | None = None
    dimension_names: Mapping[str, Sequence[str | None]] | None = None
    consolidate: bool = True
    virtual: bool = False
    target: Target | None = None

    def __post_init__(self) -> None:
        _check_bools(self, "index_checksum", "portable", "overwrite", "resume", "dry_run", "verify", "skip_damaged",
                     "consolidate", "virtual")
        _check_target(self)
        if self.overwrite and self.resume:
            raise UsageError("overwrite and resume contradict each other: resume keeps what the destination holds")
        if self.index_location not in (None, "start", "end"):
            raise UsageError(f"index_location must be 'start' or 'end', got {self.index_location!r}")
        _chunks_per_shard(self)
        _check_mapping(self, "assume_chunks_per_shard")
        _check_mapping(self, "dimension_names")
        _set(self, "dimension_names", dimension_names_option(self.dimension_names))

    @property
    def names(self) -> dict[str, tuple[str | None, ...]] | None:
        """``dimension_names`` as ``__post_init__`` normalised them (paths, tuples)."""
        return cast("dict[str, tuple[str | None, ...]] | None", self.dimension_names)


def _check_target(o: MigrateOptions) -> None:
    """``target`` is one of :data:`TARGETS`; a reference file is always virtual; a Zarr store
    holds no references; ``portable`` re-encodes chunks, which a virtual copy cannot."""
    if o.target not in (None, *TARGETS):
        raise UsageError(f"MigrateOptions.target: one of {', '.join(TARGETS)} or None, got {o.target!r}")
    if o.target == "references":
        _set(o, "virtual", True)
    if o.virtual and o.target == "zarr":
        raise UsageError("--virtual: a Zarr store holds bytes, not references; give an Icechunk repository "
                         "(--virtual=icechunk) or a reference file (DST ending .json)")
    if o.virtual and o.portable:
        raise UsageError("--portable with --virtual: re-encoding chunks writes new bytes, and a virtual "
                         "migration refers to the source's bytes as they are")


@dataclass(frozen=True)
class UpgradeOptions:
    """What an in-place upgrade of a 2023-generation store does
    (:func:`sharding_store.ops.upgrade.upgrade_in_place`): ``resume`` finishes an interrupted
    one, ``undo`` rolls it back (the two contradict each other; the journal then decides
    what is written, so ``index_checksum`` and ``skip_damaged`` do not apply);
    ``take_over``: a recovery may take over the journal of a run on another host;
    ``dry_run`` writes nothing; ``verify`` reads the upgraded store back."""

    index_checksum: bool = True
    resume: bool = False
    undo: bool = False
    dry_run: bool = False
    verify: bool = True
    skip_damaged: bool = False
    take_over: bool = False

    def __post_init__(self) -> None:
        _check_bools(self, "index_checksum", "resume", "undo", "dry_run", "verify", "skip_damaged", "take_over")
        if self.resume and self.undo:
            raise UsageError("--resume and --undo contradict each other: finish the upgrade or roll it back")


@dataclass(frozen=True)
class VerifyOptions:
    """What a verification compares (:func:`sharding_store.ops.verification.verify`).

    ``raise_on_error=False`` returns the report instead of raising
    :class:`~sharding_store.errors.VerificationError`; the report keeps the first
    ``max_differences`` differences in full and counts all. ``skip_damaged``: arrays a
    ``migrate(skip_damaged)`` leaves out must be absent; ``skip_arrays`` (path -> reason):
    arrays known to be left out; ``assume_chunks_per_shard`` as given to the migration.
    ``references_only``: of a virtual destination (a reference file, a virtual Icechunk
    repository), check its references and documents and read no chunk
    (:mod:`~sharding_store.ops.reference_check`; what a virtual ``migrate`` verifies).
    """

    raise_on_error: bool = True
    skip_damaged: bool = False
    assume_chunks_per_shard: AssumeChunksPerShard | None = None
    skip_arrays: Mapping[str, str] | None = None
    max_differences: int = MAX_KEPT
    references_only: bool = False

    def __post_init__(self) -> None:
        _check_bools(self, "raise_on_error", "skip_damaged", "references_only")
        _check_mapping(self, "assume_chunks_per_shard")
        _check_mapping(self, "skip_arrays")
        if not _positive_int(self.max_differences):
            raise UsageError(f"VerifyOptions.max_differences: a number >= 1, got {self.max_differences!r}")


@dataclass(frozen=True)
class ReshardOptions:
    """The layout a reshard gives (:func:`sharding_store.ops.resharding.reshard`).

    ``chunks_per_shard``: one number for every dimension, one per dimension, or None to
    unshard; ``only_unsharded`` leaves sharded arrays as they are (``shard()``); ``arrays``:
    the paths to repack (None: all); ``resume`` completes interrupted in-place runs first
    (False refuses such a store); ``overwrite`` replaces a non-empty destination.
    """

    chunks_per_shard: int | tuple[int, ...] | None
    arrays: tuple[str, ...] | None = None
    only_unsharded: bool = False
    resume: bool = True
    overwrite: bool = False

    def __post_init__(self) -> None:
        _check_bools(self, "only_unsharded", "resume", "overwrite")
        _chunks_per_shard(self)
        if self.only_unsharded and self.chunks_per_shard is None:
            raise UsageError("shard(): chunks_per_shard is required (use unshard() to remove sharding)")
        if self.arrays is not None:
            if isinstance(self.arrays, (str, bytes)) or not isinstance(self.arrays, Iterable):
                raise UsageError(f"ReshardOptions.arrays: a list of array paths, got {self.arrays!r}")
            _set(self, "arrays", tuple(self.arrays))


# --------------------------------------------------------------------------- the keywords of 0.1.0

#: old keyword -> field of :class:`RunOptions`
_RUN_KEYWORDS = frozenset(f.name for f in fields(RunOptions))
#: old keyword -> its current name in the operation's record
_RENAMED = {"skip_untranslatable": "skip_damaged"}
_STORE_KEYWORDS = frozenset({"storage_options", "src_storage_options", "dst_storage_options"})

Op = TypeVar("Op", MigrateOptions, UpgradeOptions, VerifyOptions, ReshardOptions)


def legacy_options(
    operation: str,
    options: Op,
    legacy: Mapping[str, Any],
    run: RunOptions | None = None,
    stores: StoreOptions | None = None,
) -> tuple[Op, RunOptions, StoreOptions]:
    """The records an operation runs with: ``options``/``run``/``stores`` with the keywords
    of version 0.1.0 (``legacy``, e.g. ``resume=True, jobs=4, storage_options={...}``)
    applied on top. The one translation of the old names; an unknown keyword is refused as
    Python refuses one (:class:`TypeError`), naming it."""
    op_fields = {f.name for f in fields(options)}
    known = op_fields | _RUN_KEYWORDS | _STORE_KEYWORDS | {old for old, new in _RENAMED.items() if new in op_fields}
    unknown = [k for k in legacy if k not in known]
    if unknown:
        raise TypeError(f"{operation}() got an unexpected keyword argument {unknown[0]!r}")
    op = {k: v for k, v in legacy.items() if k in op_fields}
    for old, new in _RENAMED.items():  # an older name: either spelling sets the option
        if old in legacy:
            op[new] = bool(legacy[old] or op.get(new, False))
    run = run or RunOptions()
    run_kw = {k: v for k, v in legacy.items() if k in _RUN_KEYWORDS}
    stores = stores or StoreOptions()
    if _STORE_KEYWORDS & set(legacy):
        shared = legacy.get("storage_options")
        src, dst = legacy.get("src_storage_options"), legacy.get("dst_storage_options")
        stores = StoreOptions(src if src is not None else shared if shared is not None else stores.src,
                              dst if dst is not None else shared if shared is not None else stores.dst)
    return (replace(options, **op) if op else options), (replace(run, **run_kw) if run_kw else run), stores
