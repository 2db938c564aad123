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

__all__ = ["error_message", "one_line", "print_result", "warn"]

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
    """A command's result: the JSON document ``doc`` with ``--json``, else ``text``, on
    stdout; its ``warnings`` on stderr (they stay in ``doc`` too, for scripts)."""
    sys.stdout.flush()
    warn(warnings)
    if getattr(args, "json", False):
        json.dump(dict(doc), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif text:
        print(text)


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
