"""The one place that uses s3fs's private API (issue 23: one adapter per library).

s3fs has no public asynchronous call of its own client, existence check or paged listing,
so the async S3 paths go through these, written against s3fs 2024.6 to 2026.x
(``S3FileSystem._call_s3(method, *akwarglist, **kwargs)``, ``_exists(path)``,
``_iterdir(bucket, max_items=None, delimiter="/", prefix="", versions=False)``).
``tests/unit/stores/test_adapters.py`` fails when one of them changes name or signature; a newer
s3fs that moves them needs only this module changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

__all__ = ["PRIVATE_API", "call_s3", "exists", "is_s3", "iter_objects", "lists_in_pages"]

#: the private attributes of ``s3fs.S3FileSystem`` this module uses, and their parameters
PRIVATE_API = {
    "_call_s3": ("self", "method", "akwarglist", "kwargs"),
    "_exists": ("self", "path"),
    "_iterdir": ("self", "bucket", "max_items", "delimiter", "prefix", "versions"),
}


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is an s3fs filesystem with the async client call used here."""
    return hasattr(fs, "call_s3") and hasattr(fs, "_call_s3")


async def call_s3(fs: Any, method: str, **kwargs: Any) -> Any:
    """``method`` of the S3 API (``"get_object"``, ``"head_object"``, ...) through s3fs's own
    async client: its session, credentials, retries and error translation."""
    return await fs._call_s3(method, **kwargs)


async def exists(fs: Any, path: str) -> bool:
    """Whether the object (or prefix) ``bucket/key`` exists."""
    return bool(await fs._exists(path))


def lists_in_pages(fs: Any) -> bool:
    """Whether ``fs`` can list a prefix page by page (:func:`iter_objects`)."""
    return is_s3(fs) and hasattr(fs, "_iterdir")


def iter_objects(fs: Any, bucket: str, prefix: str) -> AsyncIterator[dict[str, Any]]:
    """Every object under ``prefix`` of ``bucket`` (no delimiter), one LIST page at a time."""
    pages: AsyncIterator[dict[str, Any]] = fs._iterdir(bucket, delimiter="", prefix=prefix)
    return pages
