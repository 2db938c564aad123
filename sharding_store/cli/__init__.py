"""The ``sharding-store`` command line.

Each command lives in its own module exposing ``register(subparsers)``; this module
owns what they share: option parsing helpers and the error policy. Errors print one
line to stderr and exit with the code of their class (see README, "Exit codes"); no
traceback unless ``SHARDING_STORE_DEBUG=1``.

Interruptions (:func:`interrupted_line`): Ctrl-C, and SIGTERM (turned into the same
:class:`~sharding_store.errors.Interrupted` in the main thread while a command runs), exit
130 with one line saying how to finish what was cut short: each command registers its
advice (``set_defaults(interrupted=...)``), this module alone formats the line.

The error policy (:func:`exit_status`): our own errors carry their exit code; an
``OSError`` from a store (no space, permission denied, connection refused, ...) is exit 12;
an exception *class* of a storage backend (botocore's ``NoCredentialsError``, ...) is
exit 12 too, and a backend that is not installed is exit 2 naming what to install. Exit
70 is left for what can only be a bug of ours.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ..errors import Interrupted, ShardingStoreError, UsageError
from .options import add_assume_option, assume_item, assumed, int_tuple, storage_options  # noqa: F401 - re-exported
from .output import error_message, print_json_error
from .output import one_line as _one_line

PROG = "sharding-store"
COMMAND_MODULES = ("info", "migrate", "reshard", "materialize")
#: command -> the module of :data:`COMMAND_MODULES` that registers it: a command line naming
#: one loads and builds that module's parser alone (the others, and what they import, are not
#: needed); no command, ``--help`` or an unknown word builds them all
COMMANDS = {"info": "info", "ls": "info", "migrate": "migrate", "verify": "migrate", "reshard": "reshard",
            "materialize": "materialize"}
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_IO = 12
EXIT_INTERNAL = 70

#: Top-level packages of storage backends: an exception of a class defined there (not a
#: builtin one it re-raises) means the store could not be used, never a bug of ours.
BACKEND_PACKAGES = frozenset(
    {"botocore", "aiobotocore", "boto3", "s3fs", "aiohttp", "gcsfs", "google", "adlfs", "azure",
     "requests", "urllib3", "paramiko", "sshfs", "fsspec", "ocifs", "huggingface_hub"}
)
#: Backend modules that are optional, and what to install to get them.
BACKEND_INSTALL = {
    "s3fs": "pip install 'sharding-store[s3]'",
    "aiobotocore": "pip install 'sharding-store[s3]'",
    "botocore": "pip install 'sharding-store[s3]'",
    "gcsfs": "pip install gcsfs",
    "adlfs": "pip install adlfs",
    "sshfs": "pip install sshfs",
    "paramiko": "pip install paramiko",
    "aiohttp": "pip install aiohttp",
    "requests": "pip install requests",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser with our error policy: one line (``sharding-store: error: migrate:
    ...``, the program named once), exit 2, and a "did you mean" for a mistyped option or
    command (the closest spelling, :func:`difflib.get_close_matches`), as git does."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            message = message.replace("argument COMMAND: invalid choice:", "unknown command") + _did_you_mean(
                choice[1], re.findall(r"'([^']*)'", choice[2]))
        raise UsageError(f"{command}: {message}" if command else message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, with the unrecognized words reported by the command they were given to."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(getattr(parsed, "command", None))
            spellings = list(command._option_string_actions)
            first = next((w.partition("=")[0] for w in extras if w.startswith("-")), "")
            command.error(f"unrecognized arguments: {' '.join(extras)}" + (_did_you_mean(first, spellings) if first else ""))
        return parsed

    def _command_parser(self, name: str | None) -> argparse.ArgumentParser:
        """The parser of the subcommand ``name`` (this one when there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                return action.choices[name]
        return self


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the candidate closest to a mistyped ``word``; "" when none is close."""
    import difflib  # here: only a mistyped command line needs it (~5 M instructions of every start-up)

    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: with a ``command`` of :data:`COMMANDS`, the parser of its
    module only; else every command's."""
    from .. import __version__

    parser = _Parser(prog=PROG, description="Read, migrate and reshard draft-era sharded Zarr v3 data.")
    parser.add_argument("--version", action="version", version=f"sharding-store {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for name in (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES:
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
    words = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        with _sigterm_interrupts():
            if not words:  # bare `sharding-store`: what it can do
                print(build_parser().format_help(), end="", file=sys.stderr)
                return EXIT_USAGE
            args = build_parser(_command_word(words)).parse_args(words)
            args.argv = words  # what the advice after an interruption repeats
            return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `sharding-store ls ... | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Interrupted)
        print(interrupted_line(args, e), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the CLI never shows a traceback
        if debug:
            raise
        command = getattr(args, "command", None) or next((w for w in words if not w.startswith("-")), "")
        code, line = exit_status(e, command)
        if _wants_json(args, words):  # every failure answers, as docs/commands.md promises
            print_json_error(command or "", e, code, line.removeprefix("error: "))
        print(f"sharding-store: {line}", file=sys.stderr)
        return code


def _command_word(words: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the program's
    own options, ``--version`` and ``--help``, take no value)."""
    return next((w for w in words if not w.startswith("-")), None)


def _wants_json(args: argparse.Namespace | None, words: list[str]) -> bool:
    """Whether the command was given ``--json`` (before its arguments were parsed: in its words)."""
    return bool(getattr(args, "json", False)) if args is not None else "--json" in words


def interrupted_line(args: argparse.Namespace | None, e: BaseException) -> str:
    """The one line an interrupted command prints: "interrupted", then how to finish what it
    was doing when the command knows (its ``interrupted(args, phase)`` advice)."""
    advise: Any = getattr(args, "interrupted", None)
    advice = advise(args, getattr(e, "phase", "")) if advise is not None else ""
    return "sharding-store: interrupted" + (f"; {advice}" if advice else "")


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM interrupts the main thread as Ctrl-C does (the threads of
    a command's pool are then shut down, the rest of its work cancelled); the previous
    handler after. Only the main thread can set a handler: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def exit_status(e: BaseException, command: str | None = None) -> tuple[int, str]:
    """The exit code and the one line (after ``sharding-store: ``) for an error (worded for
    ``command`` where that matters: :func:`~sharding_store.cli.output.error_message`)."""
    if isinstance(e, ShardingStoreError):
        return e.exit_code, f"error: {_one_line(error_message(e, command))}"
    install = _missing_backend(e)
    if install is not None:
        return EXIT_USAGE, f"error: {_one_line(e)} ({install})"
    if isinstance(e, OSError):
        return EXIT_IO, f"I/O error: {_one_line(e)}"
    if _from_backend(e):
        return EXIT_IO, f"I/O error: {type(e).__name__}: {_one_line(e)}"
    return EXIT_INTERNAL, (
        f"internal error: {type(e).__name__}: {_one_line(e)} "
        "(run with SHARDING_STORE_DEBUG=1 for a traceback, and please report it)"
    )


def _missing_backend(e: BaseException) -> str | None:
    """What to install, when ``e`` says an optional storage backend is not installed
    (fsspec re-raises the ImportError with its own message, the original as its cause)."""
    for err in (e, e.__cause__):
        if isinstance(err, ImportError) and err.name:
            top = err.name.partition(".")[0]
            if top in BACKEND_INSTALL:
                return BACKEND_INSTALL[top]
    if isinstance(e, ImportError) and e.__cause__ is not None and _from_fsspec_registry(e):
        return "install the package it names"
    return None


def _from_fsspec_registry(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "") == "fsspec.registry"


def _from_backend(e: BaseException) -> bool:
    """True for an exception whose class a storage backend package defines."""
    return any(
        getattr(cls, "__module__", "").partition(".")[0] in BACKEND_PACKAGES for cls in type(e).__mro__[:-1]
        if cls.__module__ != "builtins"
    )


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


if __name__ == "__main__":  # pragma: no cover
    run()
