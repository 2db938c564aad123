"""``sharding-store migrate SRC DST`` and ``sharding-store verify SRC DST``."""

from __future__ import annotations

import argparse
import contextlib
import shlex
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..errors import UsageError
from ..ops.options import MigrateOptions, RunOptions, StoreOptions, UpgradeOptions, VerifyOptions
from .options import add_assume_option, add_progress_option, assumed, command_again, int_tuple, named_dimensions, storage_options
from .output import one_line, print_result


def _store_options(p: argparse.ArgumentParser, dst_optional: bool = False) -> None:
    p.add_argument("src", metavar="SRC", help="draft-era hierarchy (path or fsspec URL)")
    p.add_argument("dst", metavar="DST", nargs="?" if dst_optional else None,
                   help="Zarr v3 hierarchy (path or fsspec URL)" + ("; none with --in-place" if dst_optional else ""))
    p.add_argument("--storage-options", metavar="JSON", help="fsspec options for SRC and DST")
    p.add_argument("--src-storage-options", metavar="JSON", help="fsspec options for SRC (overrides --storage-options)")
    p.add_argument("--dst-storage-options", metavar="JSON", help="fsspec options for DST (overrides --storage-options)")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="parallel work units (default: one per CPU between local paths, else 2 per CPU; at most 8)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run the work units on this dask scheduler")
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON report")
    p.add_argument("--skip-damaged", "--skip-untranslatable", dest="skip_damaged", action="store_true",
                   help="leave out arrays that are damaged (invalid metadata, corrupt shard index, lost storage "
                        "transformer) or that Zarr v3 cannot express, and list them with the reason, instead of "
                        "failing (--skip-untranslatable is an older name)")
    add_assume_option(p)
    add_progress_option(p)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "migrate",
        help="migrate a draft-era hierarchy to Zarr v3 (sharding_indexed v1.0), payloads verbatim unless --portable",
        description=(
            "Write a Zarr v3 hierarchy at DST that zarr-python 3 and tensorstore read with the values of the "
            "draft-era hierarchy at SRC. Chunk payloads are copied verbatim (except with --portable, which "
            "re-encodes the arrays another v3 reader could not decode, and names them); shard indices are rebuilt "
            "(crc32c-checked, compacted). SRC is only read. DST is verified afterwards unless --no-verify. "
            "`migrate PATH --in-place` upgrades a 2023-generation store where it is, rewriting only its "
            "zarr.json documents (crash-safe: --resume finishes, --undo rolls back an interrupted run)."
        ),
    )
    _store_options(p, dst_optional=True)
    p.add_argument("--chunks-per-shard", type=int_tuple, metavar="N[,N...]",
                   help="shard every array with N chunks per shard (one number for every dimension, or one per dimension)")
    p.add_argument("--no-index-checksum", action="store_true",
                   help="no crc32c after the shard index: compact draft shards are then copied byte for byte")
    p.add_argument("--index-location", choices=("start", "end"), default=None,
                   help="where the shard index goes (default: where the source has it; the end for a 2022 store)")
    p.add_argument("--portable", action="store_true",
                   help="make every numeric array readable by every v3 reader (zarr-python 3, tensorstore, zarrs): "
                        "filters they do not know (delta, fixedscaleoffset, quantize...) are applied and dropped, "
                        "zlib/bz2/lz4/lzma chunks are recompressed to zstd: those arrays' chunks are decoded and re-encoded, "
                        "not copied verbatim (the report names them)")
    p.add_argument("--dimension-names", action="append", type=dimension_names_arg, metavar="PATH=NAME,NAME...",
                   help="name the dimensions of the array at PATH (for arrays without _ARRAY_DIMENSIONS; repeatable)")
    p.add_argument("--no-consolidate", action="store_true",
                   help="no consolidated metadata in the root zarr.json (written by default, as zarr-python 3 does)")
    p.add_argument("--overwrite", action="store_true",
                   help="empty DST first, when it holds a Zarr hierarchy or an earlier migration's record (else "
                        "exit 8 naming what is there); with --dry-run: list what it would remove")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted migration into DST (with --in-place: an interrupted in-place upgrade)")
    p.add_argument("--in-place", action="store_true",
                   help="upgrade the 2023-generation store SRC where it is: only its zarr.json documents are "
                        "rewritten (refused when a data object would have to change)")
    p.add_argument("--undo", action="store_true",
                   help="with --in-place: roll back an interrupted in-place upgrade (every original document restored)")
    p.add_argument("--take-over", action="store_true",
                   help="with --in-place --resume/--undo: take over a journal held by a run this host cannot check "
                        "(another host); only when that run is known to be dead")
    p.add_argument("--virtual", nargs="?", const="", type=virtual_kind, metavar="KIND",
                   help="move no byte: DST refers to SRC's objects (issue 24): --virtual=references (DST.json: an "
                        "fsspec reference file) or --virtual=icechunk (an Icechunk repository); bare --virtual: a "
                        "reference file when DST ends in .json, else Icechunk. SRC must stay as it is")
    p.add_argument("--icechunk", action="store_true",
                   help="DST is an Icechunk repository (created when absent): the bytes copied in one commit "
                        "(with --virtual: references to SRC's objects)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (arrays, shards, bytes); write nothing")
    p.add_argument("--no-verify", action="store_true", help="skip the verification of DST against SRC")
    p.set_defaults(func=run_migrate, interrupted=interrupted_advice)

    v = subparsers.add_parser(
        "verify",
        help="check that a migrated Zarr v3 hierarchy holds exactly its draft-era source",
        description="Compare every inner chunk, shard index checksum and metadata document of DST with SRC.",
    )
    _store_options(v)
    v.add_argument("--max-differences", type=int, default=20, metavar="N",
                   help="differences listed, one line each (--json: in the report's \"first\"); all are "
                        "counted (default 20); the exit code is 9 when there are any")
    v.add_argument("--references-only", action="store_true",
                   help="of a virtual DST (a reference file, a virtual Icechunk repository): check that every "
                        "reference names its source object whole and unchanged, and the documents, reading no "
                        "chunk (what `migrate --virtual` verifies; by default every chunk is read and compared)")
    v.set_defaults(func=run_verify)


def dimension_names_arg(text: str) -> tuple[str, list[str]]:
    """``PATH=t,y,x`` -> ("PATH", ["t", "y", "x"])."""
    path, sep, names = text.partition("=")
    parts = names.split(",")
    if not sep or not names or any(not n.strip() for n in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected PATH=NAME,NAME... (e.g. images/raw=t,y,x)")
    return path.strip(), [n.strip() for n in parts]


def virtual_kind(text: str) -> str:
    """``--virtual``'s value: "" (bare: decided from DST), ``icechunk`` or ``references``."""
    if text not in ("", "icechunk", "references"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected icechunk or references (--virtual=KIND; SRC and DST "
                                         "go before a bare --virtual)")
    return text


def _target(args: argparse.Namespace) -> tuple[bool, str | None]:
    """``(virtual, target)`` from ``--virtual[=KIND]`` and ``--icechunk``."""
    virtual = args.virtual is not None
    if args.icechunk and args.virtual == "references":
        raise UsageError("--icechunk with --virtual=references: one destination kind (a reference file is no "
                         "Icechunk repository)")
    target = "icechunk" if args.icechunk else (args.virtual or None)
    return virtual, target


def interrupted_advice(args: argparse.Namespace, phase: str) -> str:
    """What finishes an interrupted ``migrate`` (the CLI prints it after "interrupted"): the
    same command with ``--resume`` (never with ``--overwrite``, which would throw the work
    away); after everything was written (``phase`` "verify"), the ``verify`` command (of a
    virtual migration, its reference check: ``--references-only``); for an
    in-place upgrade its ``--resume``/``--undo`` pair; nothing after a dry run."""
    from ..formats.upgrade_journal import resume_upgrade_command, undo_upgrade_command

    if args.dry_run:
        return ""
    if args.in_place or args.undo:
        return (f"finish it with `{resume_upgrade_command(args.src)}` or roll it back with "
                f"`{undo_upgrade_command(args.src)}`")
    if phase == "verify":
        return f"the migration itself is complete; check it with `{verify_command(args)}`"
    return f"run `{command_again(args, add='--resume', drop='--overwrite')}` to finish (nothing written so far is lost)"


def verify_command(args: argparse.Namespace) -> str:
    """The ``verify`` of a ``migrate``'s SRC and DST, with its store options."""
    words = ["sharding-store", "verify", args.src, args.dst]
    for option, value in (("--storage-options", args.storage_options), ("--src-storage-options", args.src_storage_options),
                          ("--dst-storage-options", args.dst_storage_options)):
        if value:
            words += [option, value]
    words += ["--skip-damaged"] if args.skip_damaged else []
    for path, cps in args.assume_chunks_per_shard:
        words += ["--assume-chunks-per-shard", f"{path}={','.join(map(str, cps))}"]
    if getattr(args, "virtual", None) is not None or (args.dst or "").rstrip("/").endswith(".json"):
        words += ["--references-only"]  # what a virtual migration verifies (no chunk read)
    return shlex.join(words)


def _check_jobs(args: argparse.Namespace) -> None:
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be >= 1")


def _stores(args: argparse.Namespace) -> StoreOptions:
    """``--storage-options`` for both sides, ``--src-/--dst-storage-options`` for one."""
    shared = storage_options(args.storage_options)
    src = storage_options(args.src_storage_options, "--src-storage-options") if args.src_storage_options else shared
    dst = storage_options(args.dst_storage_options, "--dst-storage-options") if args.dst_storage_options else shared
    return StoreOptions(src, dst)


@contextlib.contextmanager
def _executor(address: str | None) -> Iterator[Any]:
    """A dask executor for ``--scheduler``, else None (the built-in thread pool)."""
    if address is None:
        yield None
        return
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler needs the 'distributed' package (pip install 'sharding-store[dask]')") from None
    with Client(address) as client:
        yield client.get_executor()


def upgrade_options(args: argparse.Namespace) -> tuple[UpgradeOptions, RunOptions, StoreOptions]:
    """The one mapping of ``migrate PATH --in-place [--resume|--undo]``'s arguments onto
    :func:`~sharding_store.ops.upgrade.upgrade_in_place`'s options; those that do not apply
    are refused by name."""
    if not args.in_place:
        raise UsageError("--undo applies to an in-place upgrade: give --in-place")
    given = [opt for opt, value in (
        ("DST", args.dst), ("--chunks-per-shard", args.chunks_per_shard), ("--index-location start",
        args.index_location == "start"), ("--portable", args.portable), ("--overwrite", args.overwrite),
        ("--scheduler", args.scheduler), ("--assume-chunks-per-shard", args.assume_chunks_per_shard),
        ("--dst-storage-options", args.dst_storage_options), ("--dimension-names", args.dimension_names),
        ("--virtual", args.virtual is not None), ("--icechunk", args.icechunk)) if value]
    _check_jobs(args)
    if given:
        raise UsageError(f"--in-place: not with {', '.join(given)} (the upgrade rewrites the zarr.json documents "
                         "of SRC and nothing else)")
    options = UpgradeOptions(index_checksum=not args.no_index_checksum, resume=args.resume, undo=args.undo,
                             skip_damaged=args.skip_damaged, dry_run=args.dry_run, verify=not args.no_verify,
                             take_over=args.take_over)
    return options, RunOptions(jobs=args.jobs, progress=args.progress), StoreOptions(src=_stores(args).src)


def run_in_place(args: argparse.Namespace) -> int:
    """``migrate PATH --in-place [--resume|--undo]``."""
    from ..ops.upgrade import upgrade_in_place

    options, run, stores = upgrade_options(args)
    report = upgrade_in_place(args.src, options, run=run, stores=stores)
    print_result(args, report.to_dict(), report.summary(), report.warnings)
    return 0


def migrate_options(args: argparse.Namespace) -> tuple[MigrateOptions, RunOptions, StoreOptions]:
    """The one mapping of ``migrate SRC DST``'s arguments onto :func:`~sharding_store.ops.migration.migrate`'s
    options (``--scheduler`` adds the executor once it is connected)."""
    if args.dst is None:
        raise UsageError("migrate: give DST (or --in-place to upgrade a 2023-generation store where it is)")
    _check_jobs(args)
    virtual, target = _target(args)
    if args.scheduler and (virtual or target == "references" or (args.dst or "").rstrip("/").endswith(".json")):
        raise UsageError("--scheduler with a virtual migration: references are collected in this process "
                         "(they are small: no cluster is needed)")
    options = MigrateOptions(
        virtual=virtual, target=target,  # type: ignore[arg-type]  # checked by MigrateOptions
        chunks_per_shard=args.chunks_per_shard, index_checksum=not args.no_index_checksum,
        index_location=args.index_location, portable=args.portable, overwrite=args.overwrite, resume=args.resume,
        dry_run=args.dry_run, verify=not args.no_verify, skip_damaged=args.skip_damaged,
        assume_chunks_per_shard=assumed(args), dimension_names=named_dimensions(args.dimension_names),
        consolidate=not args.no_consolidate,
    )
    return options, RunOptions(jobs=args.jobs, progress=args.progress), _stores(args)


def run_migrate(args: argparse.Namespace) -> int:
    from ..ops.migration import migrate

    if args.in_place or args.undo:
        return run_in_place(args)
    options, run, stores = migrate_options(args)
    with _executor(args.scheduler) as executor:
        report = migrate(args.src, args.dst, options, run=replace(run, executor=executor), stores=stores)
    print_result(args, report.to_dict(), report.summary(), report.warnings)
    return 0


def verify_options(args: argparse.Namespace) -> tuple[VerifyOptions, RunOptions, StoreOptions]:
    """The one mapping of ``verify``'s arguments onto :func:`~sharding_store.ops.verification.verify`'s
    options (``--scheduler`` adds the executor once it is connected)."""
    if args.max_differences < 1:
        raise UsageError(f"--max-differences {args.max_differences}: must be >= 1")
    _check_jobs(args)
    options = VerifyOptions(raise_on_error=False, skip_damaged=args.skip_damaged,
                            assume_chunks_per_shard=assumed(args), max_differences=args.max_differences,
                            references_only=args.references_only)
    return options, RunOptions(jobs=args.jobs, progress=args.progress), _stores(args)


def run_verify(args: argparse.Namespace) -> int:
    """Exit 0 when identical. Differences (exit 9): the report on stdout with the first
    ``--max-differences`` of them, one line each (``--json``: in ``first``), and in text
    mode one error line naming the first on stderr."""
    from ..errors import VerificationError
    from ..ops.verification import verify

    options, run, stores = verify_options(args)
    with _executor(args.scheduler) as executor:
        report = verify(args.src, args.dst, options, run=replace(run, executor=executor), stores=stores)
    print_result(args, report.to_dict(), "\n".join([f"verified: {report.summary()}", *verify_listing(report)]))
    if not report.ok and not args.json:
        raise report.error()
    return 0 if report.ok else VerificationError.exit_code


def verify_listing(report: Any) -> list[str]:
    """The differences a verify report kept (``--max-differences``), one printable line each,
    then how many more there are."""
    check = report.check
    lines = [f"  {one_line(message)}" for _, message in check.problems]
    more = check.n_problems - len(check.problems)
    return lines + ([f"  … (+{more} more; --max-differences N lists more)"] if more > 0 else [])
