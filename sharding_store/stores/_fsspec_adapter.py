"""The one place that uses fsspec's private API (issue 23: one adapter per library).

``AbstractFileSystem._strip_protocol(path)`` (a classmethod, fsspec 2024.6 to 2026.x) turns
a URL or path into the filesystem's own path spelling; fsspec's public
``fsspec.core.strip_protocol(url)`` picks the filesystem class from the URL instead of
taking ours (a bare ``bucket/key`` would become a local absolute path).
``tests/unit/stores/test_adapters.py`` fails when it changes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRIVATE_API", "can_strip_protocol", "strip_protocol"]

#: the private attributes of ``fsspec.AbstractFileSystem`` this module uses, and their parameters
PRIVATE_API = {"_strip_protocol": ("path",)}


def strip_protocol(fs: Any, path: str) -> str:
    """``path`` (a URL or a path) as ``fs`` spells its paths: no protocol, no trailing slash."""
    stripped: str = fs._strip_protocol(path)
    return stripped


def can_strip_protocol(fs: Any) -> bool:
    """Whether ``fs`` looks like an fsspec filesystem (:func:`strip_protocol` applies)."""
    return hasattr(fs, "_strip_protocol")
