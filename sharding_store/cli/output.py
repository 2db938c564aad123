"""Where a command's words go: results on stdout (text, or one JSON document with
``--json``), warnings on stderr, so that ``2>/dev/null`` hides them and a ``--json``
consumer reads stdout as it is. A leaf of the ``cli`` package, like ``cli.options``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import OtherGenerationError

__all__ = ["SCHEMA", "error_message", "one_line", "print_json", "print_json_error", "print_result", "warn"]

#: the name and version of the JSON documents every command prints with ``--json``
SCHEMA = "sharding-store/1"

#: what a command that does not migrate says to a store of another generation (the error's
#: own advice, "nothing to migrate", is ``migrate``'s, and ``info``'s and ``ls``'s)
OTHER_GENERATION_ADVICE = {
    "reshard": "nothing to reshard: `reshard` repacks draft-era stores (zarr-python 3 writes Zarr v3 shards "
               "itself, `shards=`)",
    "verify": "nothing to verify: `verify` compares a draft-era SRC with the Zarr v3 DST migrated from it",
}


def warn(warnings: Iterable[str]) -> None:
    """Each warning as one ``warning: ...`` line on stderr."""
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)


def print_result(args: argparse.Namespace, doc: Mapping[str, Any], text: str, warnings: Iterable[str] = ()) -> None:
    """A command's result: the JSON document ``doc`` with ``--json`` (:func:`print_json`),
    else ``text``, on stdout; its ``warnings`` on stderr (they stay in ``doc`` too)."""
    sys.stdout.flush()
    warn(warnings)
    if getattr(args, "json", False):
        print_json(args.command, doc)
    elif text:
        print(text)


def print_json(command: str, doc: Mapping[str, Any]) -> None:
    """One JSON document on stdout, in the schema every command shares: ``schema``
    (:data:`SCHEMA`), ``command``, ``ok`` (False for an error, or differences found), then
    the command's own keys (``source``, ``destination``, ``objects_written``, ...)."""
    json.dump({"schema": SCHEMA, "command": command, "ok": True, **doc}, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_json_error(command: str, e: BaseException, code: int, message: str) -> None:
    """A command's ``--json`` answer when it fails: ``ok`` false, the exit code, the error's
    class, message and key; for a store of another generation (not draft-era data), its
    ``source`` and ``generation`` ("Zarr v3", "Zarr v2"). The error line stays on stderr."""
    doc: dict[str, Any] = {"ok": False, "exit_code": code,
                           "error": {"class": type(e).__name__, "message": message, "key": getattr(e, "key", None)}}
    if isinstance(e, OtherGenerationError):
        doc.update(source=e.location, generation=e.generation, draft=False)
    print_json(command, doc)


def error_message(e: BaseException, command: str | None) -> str:
    """The error's message as ``command`` words it: a store of another generation gets the
    advice of the command that was given (:data:`OTHER_GENERATION_ADVICE`)."""
    if isinstance(e, OtherGenerationError) and command in OTHER_GENERATION_ADVICE:
        return f"{e.location}: {e.what}, not draft-era: {OTHER_GENERATION_ADVICE[command]}"
    return str(e)


def one_line(e: BaseException | str) -> str:
    """The error's message on one line of printable text: a line break in a name cannot forge
    a line, a terminal escape is shown escaped (``\\x1b``), never sent to the terminal."""
    text = " ".join(str(e).split()) or type(e).__name__
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
