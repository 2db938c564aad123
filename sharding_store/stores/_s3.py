"""S3 through s3fs: ETag versions, ``If-Match`` range reads, conditional PUTs.

s3fs's ``cat_ranges`` cannot send request headers, so reads that carry or learn a version
call ``GetObject`` through s3fs's own async client (``_s3fs_adapter.call_s3``: its session, retries and
error translation), all requests of a call concurrently on s3fs's event loop — the same
one request per range as ``cat_ranges``:

* a tail is ``GetObject(Range="bytes=-n")``: the bytes, the object size (from
  ``Content-Range``) and the ETag (the version) in one request;
* a range given a version is ``GetObject(Range=..., IfMatch=etag)``: S3 answers 412 when
  the object was replaced, which becomes :class:`~sharding_store.errors.ObjectChangedError`
  naming the key; a missing object raises it too.

A streamed write (:func:`s3_set_streamed`) is s3fs's buffered file: a multipart upload,
visible only when completed at the end. s3fs's file *commits* what was written when a
``with`` block ends by an exception (tested), so the upload is aborted here explicitly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ObjectChangedError
from ._s3fs_adapter import call_s3, exists
from .base import RangeRequest, Tail, Version

if TYPE_CHECKING:
    from .fsspec_store import FsspecInner

#: concurrent requests of one call (s3fs's own default batch for cat_ranges is similar)
MAX_CONCURRENT = 64


def _changed(key: str) -> ObjectChangedError:
    return ObjectChangedError(f"{key}: the object changed between two reads of it (read it again)", key=key)


def _run(inner: FsspecInner, coros: list[Any]) -> list[Any]:
    """Run coroutines on s3fs's loop, at most :data:`MAX_CONCURRENT` at a time; results in
    order (exceptions returned, not raised)."""
    import asyncio  # here: a local migration never needs it (~14 ms of start-up)

    from fsspec.asyn import sync

    async def gather() -> list[Any]:
        gate = asyncio.Semaphore(MAX_CONCURRENT)

        async def one(coro: Any) -> Any:
            async with gate:
                return await coro

        return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)

    return sync(inner.fs.loop, gather)


def _size_from(response: dict[str, Any]) -> int | None:
    content_range = response.get("ContentRange") or ""
    total = content_range.rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = response.get("ContentLength")
    return int(length) if length is not None and not content_range else None


async def _get(inner: FsspecInner, key: str, header: str | None, etag: Version | None) -> tuple[bytes, dict[str, Any]]:
    bucket, obj, _ = inner.fs.split_path(inner._path(key))
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": obj}
    if header is not None:
        kwargs["Range"] = header
    if etag is not None:
        kwargs["IfMatch"] = etag
    response = await call_s3(inner.fs, "get_object", **kwargs)
    body = response["Body"]
    try:
        data = await body.read()
    finally:
        body.close()
    return data, response


async def _head(inner: FsspecInner, key: str, etag: Version | None) -> dict[str, Any]:
    bucket, obj, _ = inner.fs.split_path(inner._path(key))
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": obj}
    if etag is not None:
        kwargs["IfMatch"] = etag
    return await call_s3(inner.fs, "head_object", **kwargs)


def _header(start: int, end: int | None) -> str | None:
    """The HTTP Range of a request; None when it asks for no bytes."""
    if start < 0:
        return f"bytes={start}" if end is None else None
    if end is None:
        return f"bytes={start}-"
    return f"bytes={start}-{end - 1}" if end > start else None


def _unsatisfiable(error: BaseException) -> bool:
    text = str(error)
    return "not satisfiable" in text or "InvalidRange" in text or "416" in text


def s3_tails(inner: FsspecInner, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
    """Each tail in one GET, with the object's size and ETag."""
    async def one(key: str, n: int) -> Tail | None:
        try:
            if n <= 0:
                head = await _head(inner, key, None)
                return Tail(b"", int(head["ContentLength"]), head.get("ETag"))
            try:
                data, response = await _get(inner, key, f"bytes=-{n}", None)
            except OSError as e:
                if not _unsatisfiable(e):
                    raise
                head = await _head(inner, key, None)  # an empty object: no range of it exists
                size = int(head["ContentLength"])
                if size:
                    raise
                return Tail(b"", 0, head.get("ETag"))
        except FileNotFoundError:
            return None
        return Tail(data, _size_from(response), response.get("ETag"))

    out = _run(inner, [one(k, n) for k, n in requests])
    for value in out:
        if isinstance(value, BaseException):
            raise value
    return out


def s3_ranges(inner: FsspecInner, requests: Sequence[RangeRequest], versions: Sequence[Version | None]) -> list[bytes | None]:
    """Each range in one GET, ``If-Match`` its version when given (412 or a missing object:
    :class:`~sharding_store.errors.ObjectChangedError`)."""
    async def one(key: str, start: int, end: int | None, etag: Version | None) -> bytes | None:
        header = _header(start, end)
        try:
            if header is None:
                if etag is not None:
                    await _head(inner, key, etag)
                    return b""
                return b"" if await exists(inner.fs, inner._path(key)) else None
            try:
                data, _ = await _get(inner, key, header, etag)
                return data
            except OSError as e:
                if not _unsatisfiable(e):
                    raise
                head = await _head(inner, key, etag)  # past the end: the clamped (empty) range
                size = int(head["ContentLength"])
                lo = max(0, size + start) if start < 0 else min(start, size)
                hi = size if end is None else min(end, size)
                if lo >= hi:
                    return b""
                data, _ = await _get(inner, key, f"bytes={lo}-{hi - 1}", etag)
                return data
        except FileNotFoundError:
            if etag is not None:
                raise _changed(key) from None
            return None
        except OSError as e:
            if etag is not None and precondition_failed(e):
                raise _changed(key) from None
            raise

    out = _run(inner, [one(k, s, e, v) for (k, s, e), v in zip(requests, versions)])
    for value in out:
        if isinstance(value, BaseException):
            raise value
    return out


def s3_create_exclusive(inner: FsspecInner, key: str, value: bytes) -> bool:
    """``PutObject(IfNoneMatch="*")``: S3 (and moto) refuse it with 412 when the key exists,
    atomically; s3fs reports that as FileExistsError."""
    bucket, obj, _ = inner.fs.split_path(inner._path(key))
    try:
        inner.fs.call_s3("put_object", Bucket=bucket, Key=obj, Body=bytes(value), IfNoneMatch="*")
    except FileExistsError:
        return False
    except OSError as e:
        if precondition_failed(e) or "ConditionalRequestConflict" in str(e) or "409" in str(e):
            return False
        raise
    inner.fs.invalidate_cache(inner._path(key))
    return True


def s3_set_streamed(inner: FsspecInner, key: str, pieces: Iterable[bytes], part: int) -> int:
    """Write ``key`` from ``pieces`` through s3fs's buffered file with ``block_size=part``:
    one ``PutObject`` if it all fits in a part, else a multipart upload of parts of about
    ``part`` bytes, each sent once it is full (memory: about one part), completed at the
    end. On any error (from ``pieces`` or a request) the upload is aborted and the file
    marked closed, so nothing is committed: ``key`` stays as it was. Returns the size."""
    f = inner.fs.open(inner._path(key), "wb", block_size=part)
    n = 0
    try:
        for piece in pieces:
            f.write(piece)
            n += len(piece)
        f.close()  # the last part and CompleteMultipartUpload (or the one PutObject)
    except BaseException:
        with contextlib.suppress(Exception):
            f.discard()  # AbortMultipartUpload of the parts sent; nothing else was
        f.closed = True  # never committed by a later close() or the garbage collector
        raise
    finally:
        inner.fs.invalidate_cache(inner._path(key))
    return n


def s3_put_if_unchanged(inner: FsspecInner, key: str, value: bytes | None, expected: bytes) -> bool:
    """One GET (bytes and ETag), compared with ``expected``, then ``PutObject`` (or
    ``DeleteObject``) with ``If-Match`` on that ETag: S3 (and moto) refuse it with 412 when
    another writer replaced the object since the GET, atomically. False when either says so."""
    got = s3_whole(inner, key)
    if got is None or got[0] != expected:
        return False
    bucket, obj, _ = inner.fs.split_path(inner._path(key))
    try:
        if value is None:
            inner.fs.call_s3("delete_object", Bucket=bucket, Key=obj, IfMatch=got[1])
        else:
            inner.fs.call_s3("put_object", Bucket=bucket, Key=obj, Body=bytes(value), IfMatch=got[1])
    except FileNotFoundError:
        return False  # gone since the GET
    except OSError as e:
        if precondition_failed(e) or "ConditionalRequestConflict" in str(e) or "409" in str(e):
            return False
        raise
    finally:
        inner.fs.invalidate_cache(inner._path(key))
    return True


def s3_whole(inner: FsspecInner, key: str) -> tuple[bytes, Version] | None:
    """A whole object and its ETag in one GET (None when missing)."""

    async def one() -> tuple[bytes, Version] | None:
        try:
            data, response = await _get(inner, key, None, None)
        except FileNotFoundError:
            return None
        return data, response.get("ETag")

    value = _run(inner, [one()])[0]
    if isinstance(value, BaseException):
        raise value
    return value


def s3_head(inner: FsspecInner, key: str) -> tuple[int, str | None, Any] | None:
    """``(size, ETag, LastModified)`` of an object from one HEAD (None when missing)."""

    async def one() -> tuple[int, str | None, Any] | None:
        try:
            head = await _head(inner, key, None)
        except FileNotFoundError:
            return None
        return int(head["ContentLength"]), head.get("ETag"), head.get("LastModified")

    value = _run(inner, [one()])[0]
    if isinstance(value, BaseException):
        raise value
    return value


def precondition_failed(error: BaseException) -> bool:
    """An s3fs/botocore error that says HTTP 412 (a conditional request did not hold)."""
    seen: BaseException | None = error
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            meta = response.get("ResponseMetadata", {})
            code = response.get("Error", {}).get("Code")
            if meta.get("HTTPStatusCode") == 412 or code in ("PreconditionFailed", "412"):
                return True
        if "PreconditionFailed" in str(seen) or "412" in str(seen).split(":")[0]:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
