"""``sharding-store materialize DST``: an Icechunk repository's virtual chunks become copies of
their bytes, in one commit (issue 24: after ``migrate --virtual``, when the source is to go)."""

from __future__ import annotations

import argparse
from typing import Any

from .options import storage_options
from .output import print_result


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "materialize",
        help="copy the bytes of an Icechunk repository's virtual chunks into it (one commit)",
        description=("Replace every virtual chunk reference of the Icechunk repository DST (written by migrate "
                     "--virtual) with a copy of the bytes it refers to, in one commit: the repository then no longer "
                     "needs its source. Each chunk is read through Icechunk's checksum: a source object changed "
                     "since the migration stops it (exit 14) and nothing is committed."),
    )
    p.add_argument("dst", metavar="DST", help="Icechunk repository (local path or s3:// URL)")
    p.add_argument("--storage-options", metavar="JSON", help="fsspec-style options of DST (s3: key, secret, endpoint)")
    p.add_argument("--src-storage-options", metavar="JSON",
                   help="options the source's objects are read with (s3 credentials of the virtual chunk container)")
    p.add_argument("--jobs", type=int, default=4, metavar="N", help="chunks copied at once (default 4)")
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON report")
    p.set_defaults(func=run_materialize, interrupted=lambda args, phase: "nothing was committed: run it again")


def run_materialize(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..stores.icechunk_store import materialize

    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be >= 1")
    done = materialize(args.dst, storage_options(args.storage_options), jobs=args.jobs,
                       source_options=storage_options(args.src_storage_options, "--src-storage-options"))
    print_result(args, done.to_dict(), done.summary())
    return 0
