"""Run the ``sharding-store`` CLI with a fault hook installed (the kill tests' subprocess).

    python -m tests.run_with_fault --kill-at PHASE:N -- migrate SRC DST ...
    python -m tests.run_with_fault --pause-after N -- migrate SRC DST ...
    python -m tests.run_with_fault --rendezvous PHASE DIR N -- migrate SRC DST ...
    python -m tests.run_with_fault --slow SECONDS -- migrate SRC DST ...

``--kill-at``: SIGKILL at the N-th fault point (of PHASE, or of any phase for a bare N);
``--pause-after``: print a line to stderr after N completed work units and sleep, to be
killed there; ``--rendezvous``: at the first fault point of PHASE wait until N processes
sharing DIR are there (two runs then race from that point); ``--slow``: every work unit
sleeps SECONDS in its worker thread first (a long job to interrupt; a line on stderr when the
first starts). The hooks come from :mod:`sharding_store.testing`; the package itself has
no way to kill, park or slow itself.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from sharding_store.cli import main
from sharding_store.testing import fault_hook, kill_at, pause_after, rendezvous, slow_units


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.run_with_fault")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--kill-at", metavar="[PHASE:]N")
    group.add_argument("--pause-after", type=int, metavar="N")
    group.add_argument("--rendezvous", nargs=3, metavar=("PHASE", "DIR", "N"))
    parser.add_argument("--slow", type=float, metavar="SECONDS")
    parser.add_argument("cli", nargs=argparse.REMAINDER, help="-- then the sharding-store arguments")
    args = parser.parse_args(argv)
    cli = args.cli[1:] if args.cli[:1] == ["--"] else args.cli
    if args.kill_at:
        hook = kill_at(args.kill_at)
    elif args.rendezvous:
        phase, directory, parties = args.rendezvous
        hook = rendezvous(phase, directory, int(parties))
    elif args.pause_after is not None:
        hook = pause_after(args.pause_after)
    elif args.slow is None:
        parser.error("give a hook: --kill-at, --pause-after, --rendezvous or --slow")
    else:
        hook = None
    slowed = slow_units(args.slow) if args.slow is not None else contextlib.nullcontext()
    with fault_hook(hook), slowed:
        return main(cli)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
