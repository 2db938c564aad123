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

__all__ = ["print_result", "warn"]


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
