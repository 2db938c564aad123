"""A remote fsspec filesystem (S3, GCS, memory, HTTP, ...) below a root path.

Ranged reads go through ``cat_ranges`` (concurrent on async filesystems); an object
store's PUT is atomic already. Local filesystems never come here: an fsspec
``LocalFileSystem`` is mapped to :class:`~sharding_store.stores.local.LocalInner`.

Versions (consistent reads): on S3 (s3fs) a tail read returns the object's ETag, and range
reads given versions are sent with ``If-Match`` (HTTP 412 ->
:class:`~sharding_store.errors.ObjectChangedError`), concurrently on s3fs's event loop.
Other backends have no version (``None``): callers fall back to re-reading and comparing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import ObjectChangedError, StoreIOError, UsageError
from . import _s3fs_adapter
from ._fsspec_adapter import strip_protocol
from ._s3 import precondition_failed, s3_create_exclusive, s3_head, s3_put_if_unchanged, s3_ranges, s3_set_streamed, s3_tails, s3_whole
from .base import BaseInner, ChunkRef, Inner, Location, RangeRequest, Tail, Version
from .local import is_temp
from .location import fs_location, is_local_fs, protocol_of

__all__ = ["FsspecInner", "S3_COPY_LIMIT", "S3_UPLOAD_PART"]

S3_COPY_LIMIT = 5 * 2**30
#: the part size of a streamed upload (:meth:`FsspecInner.set_streamed`): about what it holds
#: in memory; S3's minimum is 5 MiB (but for the last part), its maximum 10000 parts
S3_UPLOAD_PART = 16 * 2**20
#: objects taken from a streamed S3 listing at a time (one LIST request returns up to 1000)
S3_LIST_PAGE = 1000
#: sizes and ETags of listed objects kept for :meth:`FsspecInner.reference_to` (then forgotten)
LISTED_ETAGS = 1 << 16


def _no_bytes(request: RangeRequest) -> bool:
    """A forward range that asks for no bytes (``end <= start``)."""
    _, start, end = request
    return end is not None and 0 <= start and end <= start


_is_s3 = _s3fs_adapter.is_s3


def _connection_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = []
    try:
        from botocore.exceptions import EndpointConnectionError, NoCredentialsError

        errors += [EndpointConnectionError, NoCredentialsError]
    except ImportError:  # pragma: no cover - botocore comes with s3fs only
        pass
    try:
        from aiohttp import ClientConnectorError

        errors.append(ClientConnectorError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


_CONNECTION_ERRORS: tuple[type[BaseException], ...] | None = None


def _translate(method: Any) -> Any:
    """Run a request; an endpoint that cannot be reached becomes a
    :class:`~sharding_store.errors.StoreIOError` naming the store (exit 12; ``transient``:
    worth retrying), not a backend's exception class."""
    @functools.wraps(method)
    def run(self: FsspecInner, *args: Any, **kwargs: Any) -> Any:
        global _CONNECTION_ERRORS
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            if isinstance(e, (StoreIOError, ObjectChangedError)):
                raise
            if _CONNECTION_ERRORS is None:
                _CONNECTION_ERRORS = _connection_errors()
            if _CONNECTION_ERRORS and isinstance(e, _CONNECTION_ERRORS):
                error = StoreIOError(f"{self.describe()}: cannot reach the store ({type(e).__name__}: {e})")
                error.transient = type(e).__name__ != "NoCredentialsError"  # type: ignore[attr-defined]
                raise error from e
            raise

    return run


class FsspecInner(BaseInner):
    """An fsspec filesystem below ``root`` (see the module docstring).

    Constructed with a local filesystem it gives a
    :class:`~sharding_store.stores.local.LocalInner` of that directory instead.
    """

    def __new__(cls, fs: Any, root: str) -> Any:
        if is_local_fs(fs):
            from .local import LocalInner

            return LocalInner(strip_protocol(fs, root))
        return super().__new__(cls)

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = strip_protocol(fs, root).rstrip("/")
        self._s3 = _is_s3(fs)
        self.url: str | None = None  # as the user spelled it, for messages

    def check_options(self) -> None:
        """Make the backend build its client now (no request), so that storage options it
        rejects are a :class:`~sharding_store.errors.UsageError` naming the URL, at open."""
        if not self._s3:
            return
        try:
            self.fs.connect()
        except (TypeError, ValueError) as e:
            raise UsageError(f"{self.describe()}: storage options not accepted by s3fs: {e}") from None

    def __repr__(self) -> str:
        return f"FsspecInner({protocol_of(self.fs)!r}, {self.root!r})"

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _key(self, path: str) -> str:
        path = strip_protocol(self.fs, path)
        return path[len(self.root) + 1 :] if self.root else path

    # ------------------------------------------------------------------ reads
    @_translate
    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    @_translate
    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        if not requests:
            return []
        if versions is not None and any(v is not None for v in versions):
            if self._s3:
                    return s3_ranges(self, requests, versions)
        if any(_no_bytes(r) for r in requests):
            # s3fs's cat_ranges returns the whole object for [0, 0): a request for no bytes is
            # b"" when the object exists (None when not), as every store answers it
            rest = [r for r in requests if not _no_bytes(r)]
            got = iter(self.get_ranges(rest) if rest else [])
            return [(b"" if self.exists(r[0]) else None) if _no_bytes(r) else next(got) for r in requests]
        paths = [self._path(k) for k, _, _ in requests]
        out = self.fs.cat_ranges(
            paths, [s for _, s, _ in requests], [e for _, _, e in requests], on_error="return"
        )
        result: list[bytes | None] = []
        for (key, start, end), value in zip(requests, out):
            if isinstance(value, FileNotFoundError):
                result.append(None)
            elif isinstance(value, BaseException):
                # a suffix longer than the object, or a start past its end, is refused by
                # some servers (HTTP 416): fall back to a size-aware read, else re-raise
                result.append(self._fallback_range(key, start, end, value))
            else:
                result.append(value)
        return result

    @_translate
    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        if self._s3 and requests:
            return s3_tails(self, requests)
        out = self.get_ranges([(k, -max(n, 1), None) for k, n in requests])  # -0 would be all of it
        return [None if v is None else Tail(v if n > 0 else b"", None, None) for v, (_, n) in zip(out, requests)]

    def _fallback_range(self, key: str, start: int, end: int | None, error: BaseException) -> bytes | None:
        try:
            size = self.fs.size(self._path(key))
        except FileNotFoundError:
            return None
        except Exception:
            raise error from None
        lo = max(0, size + start) if start < 0 else min(start, size)
        hi = size if end is None else min(end, size)
        if lo >= hi:
            return b""
        return self.fs.cat_file(self._path(key), start=lo, end=hi)

    @_translate
    def read_into(self, key: str, alloc: Callable[[int], Any]) -> Tail | None:
        """One GET of the whole object (on S3 with its ETag as the version), copied into the
        caller's buffer."""
        if not self._s3:
            return super().read_into(key, alloc)
        got = s3_whole(self, key)
        if got is None:
            return None
        data, etag = got
        buf = alloc(len(data))
        memoryview(buf).cast("B")[: len(data)] = data
        return Tail(buf[: len(data)], len(data), etag)

    @_translate
    def exists(self, key: str) -> bool:
        return self.fs.isfile(self._path(key))

    @_translate
    def size(self, key: str) -> int | None:
        try:
            info = self.fs.info(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return int(info["size"]) if info.get("type", "file") == "file" and info.get("size") is not None else None

    # ------------------------------------------------------------------ writes
    @_translate
    def set(self, key: str, value: bytes) -> None:
        self.fs.pipe_file(self._path(key), bytes(value))

    @_translate
    def set_streamed(self, key: str, pieces: Iterable[bytes]) -> int:
        """On S3 a multipart upload of parts of :data:`S3_UPLOAD_PART` bytes, sent as they fill,
        completed at the end (aborted on an error: ``key`` stays as it was). Elsewhere the
        pieces joined and one ``set`` (see :meth:`BaseInner.set_streamed`)."""
        if self._s3:
            return s3_set_streamed(self, key, pieces, S3_UPLOAD_PART)
        return super().set_streamed(key, pieces)

    @_translate
    def create_exclusive(self, key: str, value: bytes) -> bool:
        """On S3 a conditional PUT (``If-None-Match: *``): atomic against other writers.
        Elsewhere ``exists`` then ``set``, which two writers can race (documented limit)."""
        if self._s3:
            return s3_create_exclusive(self, key, value)
        return super().create_exclusive(key, value)

    @_translate
    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """On S3 a conditional PUT/DELETE (``If-Match`` on the ETag of the object compared):
        atomic against other writers. Elsewhere the generic compare then write, which a
        writer between the two can race (documented limit)."""
        if self._s3 and expected is not None:
            return s3_put_if_unchanged(self, key, value, expected)
        return super().put_if_unchanged(key, value, expected)

    @_translate
    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    @_translate
    def delete_prefix(self, prefix: str) -> None:
        keys = list(self.list_prefix(prefix))
        if not keys:
            return
        try:
            self.fs.rm([self._path(k) for k in keys])
        except FileNotFoundError:
            pass

    @_translate
    def move(self, key: str, dst_key: str) -> None:
        """``fs.mv``: a server-side copy and a delete on object stores."""
        try:
            self.fs.mv(self._path(key), self._path(dst_key))
        except FileNotFoundError:
            if not self.exists(dst_key):
                raise

    # ------------------------------------------------------------------ copies
    def fs_path(self, key: str) -> tuple[Any, str] | None:
        return self.fs, self._path(key)

    def can_copy_to(self, dst: Inner, *, append: bool = False) -> bool:
        target = dst.fs_path("")
        return not append and target is not None and target[0] is self.fs

    @_translate
    def copy_to(
        self, key: str, dst: Inner, dst_key: str, *, size: int | None = None, append: bytes = b"",
        version: Version | None = None,
    ) -> bool:
        """A server-side copy when ``dst`` is on this very filesystem (one endpoint) and
        nothing is appended: on S3 one CopyObject request when the size is known to be below
        its 5 GiB limit (``If-Match`` the version when given), else ``fs.cp_file``."""
        target = dst.fs_path(dst_key)
        if append or target is None or target[0] is not self.fs:
            return False
        src_path, dst_path = self._path(key), target[1]
        fs = self.fs
        if self._s3 and size is not None and size < S3_COPY_LIMIT:
            src_bucket, src_key, _ = fs.split_path(src_path)
            dst_bucket, dst_obj, _ = fs.split_path(dst_path)
            extra = {"CopySourceIfMatch": version} if version is not None else {}
            try:
                response = fs.call_s3("copy_object", Bucket=dst_bucket, Key=dst_obj,
                                      CopySource={"Bucket": src_bucket, "Key": src_key}, **extra)
            except OSError as e:
                if version is not None and precondition_failed(e):
                    raise ObjectChangedError(f"{key}: the object changed before it was copied", key=key) from None
                raise
            fs.invalidate_cache(dst_path)
            copied = (response.get("CopyObjectResult") or {}).get("ETag")
            if version is not None and copied is not None and "-" not in str(version) and copied != version:
                # a server that ignored CopySourceIfMatch (moto does) copied another version:
                # the copy of a single-part object keeps its ETag (its MD5), so this tells
                fs.rm_file(dst_path)
                raise ObjectChangedError(f"{key}: the object changed before it was copied", key=key)
            return True
        if version is not None:
            current = self.get_tails([(key, 1)])[0]
            if current is None or current.version != version:
                raise ObjectChangedError(f"{key}: the object changed before it was copied", key=key)
        fs.cp_file(src_path, dst_path)
        return True

    # ------------------------------------------------------------------ listings
    def list_prefix(self, prefix: str) -> Iterator[str]:
        return (k for k, _ in self.list_sized(prefix))

    @_translate
    def list_sized(self, prefix: str, *, fresh: bool = True) -> Iterator[tuple[str, int | None]]:
        """Sorted ``(key, size)`` of the objects under ``prefix``, from one listing (sizes
        come with it): on S3 page by page as it is read (:meth:`_s3_pages`, never cached),
        elsewhere from one ``find``. ``fresh``: drop fsspec's cached listing first (another
        process may have written)."""
        if _s3fs_adapter.lists_in_pages(self.fs):
            return self._s3_pages(prefix)
        base = prefix.rpartition("/")[0]
        path = self._path(base) if base else self.root
        if fresh:
            self.fs.invalidate_cache(path)
        try:
            listed = self._find(prefix, path)
        except FileNotFoundError:
            listed = {}
        found = ((self._key(p), info.get("size")) for p, info in listed.items())
        return iter(sorted((k, n) for k, n in found if k.startswith(prefix) and not is_temp(k)))

    def _s3_pages(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """S3: the listing one page (one LIST request, up to 1000 objects) at a time, so that
        a prefix of millions of objects is never held. S3 lists keys in UTF-8 byte order,
        which is the order of Python strings: the pairs come sorted. Directory markers
        (keys ending in ``/``) are no objects."""
        from fsspec.asyn import sync

        bucket, _, key_prefix = self._path(prefix).partition("/")
        pages = _s3fs_adapter.iter_objects(self.fs, bucket, key_prefix)

        async def page() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for _ in range(S3_LIST_PAGE):
                try:
                    out.append(await pages.__anext__())
                except StopAsyncIteration:
                    break
            return out

        # a listing abandoned half way is closed by the event loop's async-generator hooks
        fetch = _translate(lambda _self: sync(self.fs.loop, page))
        while True:
            try:
                infos = fetch(self)
            except FileNotFoundError:  # no such bucket: nothing listed, as ``find`` says
                return
            for info in infos:
                name = info.get("name", "")
                if info.get("type") == "directory" or name.endswith("/"):
                    continue
                key = self._key(name)
                if key.startswith(prefix) and not is_temp(key):
                    self._remember(key, info)
                    yield key, info.get("size")
            if len(infos) < S3_LIST_PAGE:
                return

    def _find(self, prefix: str, path: str) -> dict[str, Any]:
        """``fs.find`` below ``prefix``. Where the filesystem filters by prefix on the server
        (s3fs's ``find(..., prefix=)``), the listing starts at the parent of the prefix's last
        component: one LIST whatever the result, where ``find`` of an empty directory costs
        LIST + HEAD + LIST."""
        stripped = prefix.rstrip("/")
        if stripped and self._find_takes_prefix():
            parent, _, last = stripped.rpartition("/")
            partial = last + prefix[len(stripped) :]
            return self.fs.find(self._path(parent) if parent else self.root, prefix=partial, detail=True)
        return self.fs.find(path, detail=True)

    def _find_takes_prefix(self) -> bool:
        takes = self.__dict__.get("_find_prefix")
        if takes is None:
            import inspect

            try:
                takes = "prefix" in inspect.signature(self.fs.find).parameters
            except (TypeError, ValueError):
                takes = False
            self.__dict__["_find_prefix"] = takes
        return takes

    @_translate
    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        if prefix and not prefix.endswith("/"):
            return super().list_dir(prefix)
        keys, prefixes = [], []
        try:
            listed = self.fs.ls(self._path(prefix.rstrip("/")) if prefix else self.root or "", detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        for e in listed:
            k = self._key(e["name"]).rstrip("/")
            if is_temp(k) or not k.startswith(prefix):  # ls of a file lists the file itself
                continue
            if e["type"] == "directory":
                prefixes.append(k + "/")
            else:
                keys.append(k)
        return sorted(keys), sorted(prefixes)

    # ------------------------------------------------------------------ identity
    def location(self) -> Location:
        return fs_location(self.fs, self.root)

    def _remember(self, key: str, info: Mapping[str, Any]) -> None:
        """Keep the size and ETag a listing gave (at most :data:`LISTED_ETAGS` objects), for
        :meth:`reference_to` without a request: a migration refers only to objects it has just
        listed, whose entries that listing renewed."""
        etag, size = info.get("ETag"), info.get("size")
        if etag is None or size is None:
            return
        listed = self.__dict__.setdefault("_listed", {})
        if len(listed) >= LISTED_ETAGS:
            listed.clear()
        listed[key] = (int(size), str(etag))

    @_translate
    def reference_to(self, key: str, offset: int, length: int, version: Version | None = None) -> ChunkRef | None:
        """S3: an ``s3://bucket/key`` reference with the object's ETag. Given a ``version``
        (the ETag a tail read returned, which also told the object's size), no request: the
        reference is to the object up to its end (its size ``offset + length``); else the size
        and ETag the last listing gave (no request), else one HEAD. Other fsspec backends
        (memory, ...): None, no URL another process reads."""
        if not self._s3:
            return None
        url = f"s3://{self._path(key)}"
        if version is not None:
            return ChunkRef(url, offset, length, offset + length, etag=str(version))
        listed = self.__dict__.get("_listed", {}).pop(key, None)
        if listed is not None:  # the listing told its size and ETag: no request (a change since is the guard's)
            return ChunkRef(url, offset, length, listed[0], etag=listed[1])
        head = s3_head(self, key)
        if head is None:
            return None
        size, etag, modified = head
        return ChunkRef(url, offset, length, size, etag=etag, modified=modified)

    def describe(self) -> str:
        return self.url or f"{protocol_of(self.fs)}://{self.root}"
