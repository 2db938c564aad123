"""``sharding-store reshard SRC [DST]``: change (or remove, or add) the shard layout of draft arrays."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from ..ops.options import ReshardOptions, RunOptions, StoreOptions
from ..ops.progress import plural
from .options import add_progress_option, command_again, int_tuple, storage_options
from .output import print_result


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "reshard",
        help="repack draft-era arrays into another shard layout (payloads copied verbatim)",
        description=(
            "Repack the chosen arrays of a draft-era store into N chunks per shard (or one object per "
            "chunk with --unshard). Without DST the store is changed in place, safely and resumably; "
            "with DST the whole hierarchy is copied there."
        ),
    )
    p.add_argument("src", metavar="SRC", help="draft-era store (path or fsspec URL)")
    p.add_argument("dst", metavar="DST", nargs="?", help="copy the hierarchy here instead of working in place")
    layout = p.add_mutually_exclusive_group()
    layout.add_argument(
        "--chunks-per-shard", type=int_tuple, metavar="N[,N...]",
        help="chunks per shard: one number for every dimension, or one per dimension",
    )
    layout.add_argument("--unshard", action="store_true", help="one object per chunk (no sharding)")
    p.add_argument(
        "--only-unsharded", action="store_true",
        help="with --chunks-per-shard: shard only arrays that are not sharded yet",
    )
    p.add_argument("--array", action="append", metavar="PATH", help="only this array (repeatable; default all)")
    p.add_argument("--resume", action="store_true", help="finish an interrupted in-place run (alone, or before a new layout)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")
    p.add_argument("--storage-options", metavar="JSON", help="fsspec options for SRC")
    p.add_argument("--dst-storage-options", metavar="JSON", help="fsspec options for DST")
    p.add_argument("--jobs", type=int, default=8, metavar="N", help="parallel target shards (default 8)")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    add_progress_option(p)
    p.set_defaults(func=run, interrupted=interrupted_advice)


def options(args: argparse.Namespace) -> tuple[ReshardOptions, RunOptions, StoreOptions]:
    """The one mapping of ``reshard``'s arguments onto the typed options of :func:`~sharding_store.ops.resharding.reshard`."""
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be >= 1")
    if args.only_unsharded and args.chunks_per_shard is None:
        raise UsageError("--only-unsharded needs --chunks-per-shard")
    layout = ReshardOptions(None if args.unshard else args.chunks_per_shard, arrays=args.array,
                            only_unsharded=args.only_unsharded, overwrite=args.overwrite)
    stores = StoreOptions(storage_options(args.storage_options),
                          storage_options(args.dst_storage_options, "--dst-storage-options"))
    return layout, RunOptions(jobs=args.jobs, progress=args.progress), stores


def run(args: argparse.Namespace) -> int:
    from ..ops.resharding import complete_interrupted, reshard

    layout, run_options, stores = options(args)
    if args.chunks_per_shard is None and not args.unshard:
        if not args.resume or args.dst:
            raise UsageError("give --chunks-per-shard N[,N...] or --unshard (or --resume alone, without DST)")
        report = complete_interrupted(args.src, run=run_options, stores=stores)
    else:
        report = reshard(args.src, args.dst, layout, run=run_options, stores=stores)
    print_result(args, report.to_dict(), _summary(report))
    return 0


def interrupted_advice(args: argparse.Namespace, phase: str) -> str:
    """What ends an interrupted ``reshard``: in place, ``--resume`` completes it from its
    journal; a copy into DST is made again with ``--overwrite``."""
    from ..formats.reshard_journal import resume_command

    if args.dst is None:
        return f"complete it with `{resume_command(args.src)}` (nothing written so far is lost)"
    return f"{args.dst} is incomplete: copy it again with `{command_again(args, add='--overwrite')}`"


def _summary(report: Any) -> str:
    where = report.destination or f"{report.source} (in place)"
    parts = [
        f"{plural(len(report.arrays_changed), 'array')} repacked",
        f"{len(report.arrays_skipped)} already in layout",
    ]
    if report.arrays_resumed:
        parts.append(f"{plural(len(report.arrays_resumed), 'interrupted run')} completed")
    parts.append(f"{plural(report.objects_written, 'object')} written, {report.objects_removed} removed")
    if report.objects_copied:
        parts.append(f"{report.objects_copied} copied verbatim")
    if report.copied_by and (report.objects_written or report.objects_copied):
        parts.append(f"bytes moved by {report.copied_by}")
    lines = [f"{where}: " + ", ".join(parts) + f" in {report.seconds:.2f} s"]
    lines += [f"left alone {path or '/'} (damaged): {reason}" for path, reason in report.arrays_damaged.items()]
    return "\n".join(lines)
