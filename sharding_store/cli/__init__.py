"""The ``sharding-store`` command line.

Each command lives in its own module exposing ``register(subparsers)``; this module
owns what they share: option parsing helpers and the error policy. Errors print one
line to stderr and exit with the code of their class (see README, "Exit codes"); no
traceback unless ``SHARDING_STORE_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import ShardingStoreError, UsageError

COMMAND_MODULES = ("info", "migrate", "reshard")
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_IO = 12
EXIT_INTERNAL = 70


def storage_options(text: str | None, option: str = "--storage-options") -> dict[str, Any]:
    """Parse a JSON object given on the command line."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{option}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{option}: expected a JSON object, got {type(value).__name__}")
    return value


def int_tuple(text: str) -> tuple[int, ...]:
    """``"4"`` or ``"4,4,1"`` -> a tuple of positive ints (for argparse ``type=``)."""
    try:
        values = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,N,...: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every entry must be >= 1: {text!r}")
    return values


def assume_item(text: str) -> tuple[str, tuple[int, ...]]:
    """``PATH=N[,N...]`` -> ``(path, chunks_per_shard)`` (for argparse ``type=``)."""
    path, sep, cps = text.rpartition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected PATH=N[,N...]: {text!r}")
    return path.strip("/"), int_tuple(cps)


def add_assume_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--assume-chunks-per-shard", type=assume_item, action="append", metavar="PATH=N[,N...]", default=[],
        help="treat array PATH as sharded with these chunks per shard although its metadata has no storage "
             "transformer (the zarr-python 2.x resize()/append() defect; info suggests the value); repeatable",
    )


def assumed(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """The ``--assume-chunks-per-shard`` options as the API's ``assume_chunks_per_shard``."""
    out: dict[str, tuple[int, ...]] = {}
    for path, cps in args.assume_chunks_per_shard:
        if out.get(path, cps) != cps:
            raise UsageError(f"--assume-chunks-per-shard: '{path or '/'}' given twice with different values", key=path)
        out[path] = cps
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="sharding-store", description="Read, migrate and reshard draft-era sharded Zarr v3 data.")
    parser.add_argument("--version", action="version", version=f"sharding-store {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:  # a command still being built
            if e.name != f"{__name__}.{name}":
                raise
            continue
        module.register(sub)
    return parser


def _one_blas_thread() -> None:
    """Start numpy's OpenBLAS with one thread in a fresh CLI process, unless the user
    chose a number. No command does linear algebra, but importing numpy starts a BLAS
    thread per core that spins for ~0.1 s: on a 2-core machine that is a core taken
    from the copy and verify threads (~10 % of a migration's time). Child processes
    inherit the setting; an already-imported numpy (the CLI called in-process) is left
    as it is."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    debug = os.environ.get("SHARDING_STORE_DEBUG") == "1"
    _one_blas_thread()
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except ShardingStoreError as e:
        if debug:
            raise
        print(f"sharding-store: error: {_one_line(e)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # e.g. `sharding-store ls ... | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("sharding-store: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        if debug:
            raise
        print(f"sharding-store: I/O error: {_one_line(e)}", file=sys.stderr)
        return EXIT_IO
    except Exception as e:  # noqa: BLE001 - the CLI never shows a traceback
        if debug:
            raise
        print(
            f"sharding-store: internal error: {type(e).__name__}: {_one_line(e)} "
            "(run with SHARDING_STORE_DEBUG=1 for a traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def run() -> NoReturn:
    """The ``sharding-store`` executable: :func:`main`, then leave without tearing the
    interpreter down. When ``main`` returns, every command has closed what it wrote and
    joined its threads; what the teardown would add is ~40 ms (5 % of migrating 128 MiB)
    of freeing numpy's and numcodecs' objects, which the OS frees anyway.
    ``SHARDING_STORE_DEBUG=1`` exits the usual way."""
    code = main()
    if os.environ.get("SHARDING_STORE_DEBUG") == "1":
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader left before the last line
            code = code or EXIT_BROKEN_PIPE
        except (OSError, ValueError):  # closed: nothing more can be said
            pass
    os._exit(code)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":  # pragma: no cover
    run()
