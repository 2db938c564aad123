"""Option parsing shared by the command modules (``cli.info``, ``cli.migrate``,
``cli.reshard``). A leaf of the ``cli`` package: it imports nothing from it, so the
command modules and ``cli/__init__`` (which loads them) import in one direction."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from ..errors import UsageError

__all__ = ["add_assume_option", "add_progress_option", "assume_item", "assumed", "command_again", "int_tuple",
           "named_dimensions", "storage_options"]


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


def named_dimensions(items: list[tuple[str, list[str]]] | None) -> dict[str, list[str]] | None:
    """The repeatable ``--dimension-names PATH=NAME,...`` as the API's ``dimension_names``: a
    path given twice must name the same dimensions (else :class:`UsageError`, exit 2, naming
    both), never the last one silently; ``migrate`` checks the paths and the names."""
    if not items:
        return None
    out: dict[str, list[str]] = {}
    for path, names in items:
        key = path.strip("/")
        if out.get(key, names) != names:
            raise UsageError(f"--dimension-names: '/{key}' given twice with different names ({','.join(out[key])} "
                             f"and {','.join(names)})", key=key)
        out[key] = names
    return out


def add_progress_option(p: argparse.ArgumentParser) -> None:
    """``--progress/--no-progress``: ``args.progress`` is True, False, or None (a bar only
    when stderr is a terminal), what the drivers' ``progress`` takes."""
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show progress bars on stderr (default: only when stderr is a terminal); --no-progress: never",
    )


def _spells(word: str, flag: str) -> bool:
    """Whether a command-line word is ``flag`` or an abbreviation argparse accepted for it."""
    return word.startswith("--") and len(word) > 2 and flag.startswith(word)


def command_again(args: argparse.Namespace, *, add: str = "", drop: str = "") -> str:
    """The command the user ran (``args.argv``, which ``main`` records), shell-quoted, without
    the flag ``drop`` and with the flag ``add`` (unless given already): e.g. the same
    ``migrate`` with ``--resume`` instead of ``--overwrite``."""
    words = [w for w in getattr(args, "argv", []) if not (drop and _spells(w, drop))]
    if add and not any(_spells(w, add) for w in words):
        words.append(add)
    return shlex.join(["sharding-store", *words])
