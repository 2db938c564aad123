"""S3 reads through obstore (Rust ``object_store``), writes and listings through s3fs.

Creating the s3fs/aiobotocore client costs ~150 ms (botocore parses its service models) and
s3fs reads bodies in Python; obstore's client starts in a few milliseconds and reads in
native threads. :class:`ObstoreInner` is an :class:`~sharding_store.stores.fsspec_store.FsspecInner`
whose *reads* — ``get``, ``get_ranges`` (with ``If-Match`` versions), ``get_tails``,
``read_into``, ``exists``, ``size`` — go through obstore; everything else (writes,
conditional puts, listings, server-side copies, moves) is the s3fs code, on an s3fs
filesystem created on first use from the same URL and storage options. So a read-only
open never imports s3fs or builds its client.

What stays with s3fs, and why:

* listings: object_store cannot represent a directory marker (``dir/`` is listed as an
  object ``dir``) and refuses a whole listing that holds one key with an empty, ``.`` or
  ``..`` segment; s3fs lists every key as S3 spells it;
* keys object_store would spell differently (an empty, ``.`` or ``..`` segment, a trailing
  ``/``: ``Path`` strips or refuses them): such a call goes to s3fs whole, so no key is
  ever read under another name.

:func:`obstore_options` is the one place that decides whether an ``s3://`` URL with given
storage options can be read through obstore *with the same meaning* as through s3fs: only
the options it can express (``key``/``secret``/``token``, ``anon``, ``endpoint_url``,
``client_kwargs.endpoint_url``/``region_name``, and s3fs-only cache settings), only where no
``AWS_*`` environment variable could make object_store read something botocore would not
(object_store reads its configuration from the environment too), and only when obstore and
s3fs are both installed; everything else is s3fs as before (to have s3fs read too, pass any
option only s3fs knows, e.g. ``config_kwargs``). :data:`CLIENT` chooses for a whole process.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlsplit

from ..errors import ObjectChangedError, StoreIOError, UsageError
from .base import ForkSafeLock, Location, RangeRequest, Tail, Version
from .fsspec_store import FsspecInner
from .location import endpoint_location

__all__ = ["ObstoreInner", "obstore_options", "CLIENT"]

#: ``"auto"``: obstore where :func:`obstore_options` allows; ``"s3fs"``: s3fs for every s3:// URL
CLIENT = "auto"
#: requests of one call in flight at once (as s3fs's batches)
MAX_CONCURRENT = 32
#: storage options whose meaning obstore can express (the others only tune s3fs's caches)
_EXPRESSIBLE = frozenset({"key", "secret", "token", "anon", "endpoint_url", "client_kwargs"})
_S3FS_ONLY = frozenset({"use_listings_cache", "listings_expiry_time", "skip_instance_cache", "max_paths"})
_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})
#: AWS_* variables that cannot make obstore read other than botocore: each is overridden by an
#: explicit setting or is no object_store key (and ``AWS_CA_BUNDLE``, botocore's TLS roots, does
#: not matter to a plain-http endpoint)
_HARMLESS_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION",
                           "AWS_EC2_METADATA_DISABLED"})
#: object_store retries (botocore's default: 4 retries, then the error)
_RETRY: Any = {"max_retries": 4, "retry_timeout": timedelta(seconds=60),
          "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=4), "base": 2}}
#: connect within botocore's connect timeout; no limit on a whole (large) object's transfer,
#: but a read that stalls for a minute fails (botocore's read timeout)
_CLIENT = {"connect_timeout": "60s", "read_timeout": "60s", "timeout": "24h"}


def _plain_path(path: str) -> bool:
    """A bucket path object_store's ``Path`` keeps exactly as spelled (no empty, ``.`` or
    ``..`` segment, no leading or trailing ``/``)."""
    return bool(path) and all(part not in ("", ".", "..") for part in path.split("/"))


def obstore_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The obstore ``S3Store`` settings that read ``url`` with these storage options as s3fs
    would, or None when s3fs must (see the module docstring)."""
    if CLIENT == "s3fs":
        return None
    if importlib.util.find_spec("obstore") is None or importlib.util.find_spec("s3fs") is None:
        return None
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("s3", "s3a"):
        return None
    bucket, _, prefix = rest.rstrip("/").partition("/")
    if not bucket or not all(c.isalnum() or c in ".-_" for c in bucket) or (prefix and not _plain_path(prefix)):
        return None
    so = dict(storage_options or {})
    if not set(so) <= _EXPRESSIBLE | _S3FS_ONLY:
        return None
    client = so.get("client_kwargs") or {}
    if not isinstance(client, Mapping) or not set(client) <= _CLIENT_KWARGS:
        return None
    endpoint = so.get("endpoint_url") or client.get("endpoint_url")
    harmless = _HARMLESS_ENV | ({"AWS_CA_BUNDLE"} if isinstance(endpoint, str) and endpoint.startswith("http:") else set())
    if any(k.startswith("AWS_") and k not in harmless for k in os.environ):
        return None
    region = client.get("region_name")
    config: dict[str, Any] = {"virtual_hosted_style_request": False}
    client_options: dict[str, Any] = dict(_CLIENT)
    if endpoint is not None:
        if not isinstance(endpoint, str):
            return None
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
                or parts.query or parts.fragment or parts.username or parts.password:
            return None
        config["endpoint"] = endpoint.rstrip("/")
        client_options["allow_http"] = parts.scheme == "http"
    if region is None:
        region = os.environ.get("AWS_DEFAULT_REGION")
    if region is None:
        if endpoint is None or os.path.exists(os.path.expanduser("~/.aws/config")) \
                or os.environ.get("AWS_CONFIG_FILE"):
            return None  # botocore would find the region elsewhere, or the bucket's region
        region = "us-east-1"
    if not isinstance(region, str) or not region:
        return None
    config["region"] = region
    anon = so.get("anon", False)
    if anon not in (True, False):
        return None
    key, secret, token = so.get("key"), so.get("secret"), so.get("token")
    if anon:
        config["skip_signature"] = True
    else:
        if key is None and secret is None and token is None:
            # botocore's chain starts with these variables; files, profiles and instance
            # roles it would try next are s3fs's
            key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
            return None
        config["access_key_id"], config["secret_access_key"] = key, secret
        if token is not None:
            if not isinstance(token, str):
                return None
            config["session_token"] = token
    return {"bucket": bucket, "prefix": prefix, "config": config, "client_options": client_options}


# --------------------------------------------------------------------------- the store

_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()
#: the process whose obstore runtime exists (0: none yet). obstore's runtime threads do not
#: survive a fork, and its calls in a forked child wait forever: there, reads go to s3fs
_RUNTIME_PID = 0


#: this process's obstore clients by their settings (bucket, config, client options): building
#: one loads the system's TLS root certificates (rustls parses every file of /etc/ssl/certs:
#: 15-50 ms on the benchmark machine, most of a cold open's client time), so every store of
#: one bucket with the same settings in a process shares one client (each has its own prefix)
_CLIENTS: dict[str, Any] = {}
#: clients kept at most (the least recently used goes first): a process that renews its session
#: token keeps no client, and its connections, per token it ever had
MAX_CLIENTS = 8
_CLIENTS_PID = 0
_CLIENTS_LOCK = ForkSafeLock()


def _shared_client(settings: Mapping[str, Any]) -> Any:
    """The obstore ``S3Store`` for these settings, built once per process."""
    global _CLIENTS_PID
    key = repr((settings["bucket"], sorted(settings["config"].items()), sorted(settings["client_options"].items())))
    with _CLIENTS_LOCK:
        if _CLIENTS_PID != os.getpid():  # a forked child: the parent's clients do not work here
            _CLIENTS.clear()
            _CLIENTS_PID = os.getpid()
        store = _CLIENTS.pop(key, None)
        if store is None:
            from obstore.store import S3Store

            store = S3Store(settings["bucket"], config=settings["config"], client_options=settings["client_options"],
                            retry_config=_RETRY)
        _CLIENTS[key] = store  # the most recently used last
        while len(_CLIENTS) > MAX_CLIENTS:
            del _CLIENTS[next(iter(_CLIENTS))]
        return store


def _native() -> bool:
    """Whether obstore can be used in this process (not a fork of one that used it)."""
    global _RUNTIME_PID
    pid = os.getpid()
    if _RUNTIME_PID == 0:
        _RUNTIME_PID = pid
    return _RUNTIME_PID == pid


def _pool() -> ThreadPoolExecutor:
    """The threads that wait on obstore's requests (which release the GIL); one per process."""
    global _POOL, _POOL_PID, _POOL_LOCK
    if _POOL_PID != os.getpid():  # a forked child: the parent's threads do not exist here
        _POOL, _POOL_PID, _POOL_LOCK = None, os.getpid(), threading.Lock()
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(MAX_CONCURRENT, thread_name_prefix="sharding-store-s3")
        return _POOL


def _each(fn: Callable[..., Any], items: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``fn(*item)`` for every item, concurrently; results in order, the first error raised."""
    if len(items) == 1:
        return [fn(*items[0])]
    return list(_pool().map(lambda item: fn(*item), items))


def _status(error: BaseException) -> int | None:
    """The HTTP status an obstore error reports, if any."""
    text = str(error)
    marker = "status code: "
    at = text.find(marker)
    if at < 0:
        return None
    digits = text[at + len(marker) : at + len(marker) + 3]
    return int(digits) if digits.isdigit() else None


class ObstoreInner(FsspecInner):
    """An S3 prefix read through obstore, written and listed through s3fs (module docstring)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(cls)

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None, settings: Mapping[str, Any]) -> None:
        # no FsspecInner.__init__: the s3fs filesystem is made on first use (``fs``)
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.settings = dict(settings)
        bucket, prefix = self.settings["bucket"], self.settings["prefix"]
        self.root = f"{bucket}/{prefix}" if prefix else bucket
        self._s3 = True
        self._store_pid = 0
        self._store: Any = None
        self._fs_pid = 0
        self._fs: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"], state["_store_pid"], state["_fs"], state["_fs_pid"] = None, 0, None, 0
        return state

    def __repr__(self) -> str:
        return f"ObstoreInner({self.root!r})"

    # ------------------------------------------------------------------ clients
    @property
    def fs(self) -> Any:
        """The s3fs filesystem for writes, listings and copies, made on first use in each
        process (s3fs refuses to be used in a forked child: the child makes its own)."""
        pid = os.getpid()
        if self._fs is None or self._fs_pid != pid:
            import fsspec

            self._fs, _ = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._fs_pid = pid
        return self._fs

    def client(self) -> Any:
        """The obstore ``S3Store`` of this process (shared with every store of the same bucket
        and settings: :func:`_shared_client`)."""
        if self._store is None or self._store_pid != os.getpid():
            self._store = _shared_client(self.settings)
            self._store_pid = os.getpid()
        return self._store

    def check_options(self) -> None:
        """Build the obstore client now (no request): settings it refuses are a UsageError."""
        if not _native():
            return super().check_options()
        try:
            self.client()
        except Exception as e:  # obstore reports bad settings as its own error classes
            raise UsageError(f"{self.describe()}: storage options not accepted by obstore: {e}") from None

    def _obj(self, key: str) -> str:
        prefix = self.settings["prefix"]
        return f"{prefix}/{key}" if prefix else key

    def _plain(self, keys: Iterable[str]) -> bool:
        """Whether obstore reads these keys: each spelled as object_store keeps it, and this
        process not a fork of one that used obstore (else the call is s3fs's)."""
        return _native() and all(_plain_path(self._obj(k)) for k in keys)

    def _error(self, key: str, error: BaseException) -> BaseException:
        """An obstore error as ours, naming the key (missing objects are handled by callers)."""
        if isinstance(error, (ObjectChangedError, StoreIOError, UsageError)):
            return error
        status = _status(error)
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        if status is None and "non-partial response" in first:
            out = StoreIOError(f"{self.describe()}: {key}: the server answered a range request with the whole "
                               f"object ({first})", key=key)
        elif status is None:
            out = StoreIOError(f"{self.describe()}: cannot reach the store ({type(error).__name__}: {first})", key=key)
            out.transient = True  # type: ignore[attr-defined]
        else:
            what = {401: "not authenticated", 403: "access denied"}.get(status, f"HTTP {status}")
            out = StoreIOError(f"{self.describe()}: {key}: {what} ({first})", key=key)
            out.transient = status >= 500 or status in (408, 429)  # type: ignore[attr-defined]
        out.__cause__ = error
        return out

    def _get(self, key: str, options: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]] | None:
        """One GET (or HEAD with ``options["head"]``): the bytes and the object's metadata;
        None when missing. Other errors raised as obstore's."""
        import obstore

        try:
            result = obstore.get(self.client(), self._obj(key), options=cast(Any, options))
            data = b"" if options and options.get("head") else bytes(result.bytes())
        except FileNotFoundError:
            return None
        return data, cast("dict[str, Any]", result.meta)  # a TypedDict: a dict

    # ------------------------------------------------------------------ reads
    def get(self, key: str) -> bytes | None:
        if not self._plain([key]):
            return super().get(key)
        try:
            got = self._get(key)
        except Exception as e:
            raise self._error(key, e)  # noqa: B904 - the cause is set by _error
        return None if got is None else got[0]

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        if not requests:
            return []
        if not self._plain(k for k, _, _ in requests):
            return super().get_ranges(requests, versions)
        etags = list(versions) if versions is not None else [None] * len(requests)
        return _each(self._range, [(k, s, e, v) for (k, s, e), v in zip(requests, etags)])

    def _range(self, key: str, start: int, end: int | None, etag: Version | None) -> bytes | None:
        """One range as ``_s3.s3_ranges`` reads it: clamped to the object, ``If-Match`` its
        version when given (412 or a missing object: ObjectChangedError)."""
        from obstore.exceptions import PreconditionError

        cond: dict[str, Any] = {} if etag is None else {"if_match": str(etag)}
        if start < 0:
            rng: Any = {"suffix": -start} if end is None else None
        elif end is None:
            rng = {"offset": start} if start else "whole"
        else:
            rng = (start, end) if end > start else None
        try:
            if rng is None:  # no bytes asked: whether the object (of that version) is there
                got = self._get(key, {"head": True, **cond})
                if got is None and etag is None:
                    return None
            else:
                try:
                    got = self._get(key, cond if rng == "whole" else {"range": rng, **cond})
                except Exception as e:
                    if not _unsatisfiable(e):
                        raise
                    got = self._clamped(key, start, end, cond)
            if got is None:
                if etag is not None:
                    raise _changed(key)
                return None
            return got[0] if rng is not None else b""
        except PreconditionError as e:
            if etag is None:  # no condition was sent: not ours to explain
                raise self._error(key, e)  # noqa: B904 - the cause is set by _error
            raise _changed(key) from None
        except ObjectChangedError:
            raise
        except Exception as e:
            raise self._error(key, e)  # noqa: B904 - the cause is set by _error

    def _clamped(self, key: str, start: int, end: int | None, cond: dict[str, Any]) -> tuple[bytes, dict[str, Any]] | None:
        """A range the server refused (past the end, or of an empty object): the object's size
        (one HEAD, of the version), then the range clamped to it."""
        head = self._get(key, {"head": True, **cond})
        if head is None:
            return None
        size = int(head[1]["size"])
        lo = max(0, size + start) if start < 0 else min(start, size)
        hi = size if end is None else min(end, size)
        if lo >= hi:
            return b"", head[1]
        return self._get(key, {"range": (lo, hi), **cond})

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        if not requests:
            return []
        if not self._plain(k for k, _ in requests):
            return super().get_tails(requests)
        return _each(self._tail, list(requests))

    def _tail(self, key: str, n: int) -> Tail | None:
        """The last ``n`` bytes in one GET, with the object's size and ETag."""
        try:
            if n <= 0:
                got = self._get(key, {"head": True})
            else:
                try:
                    got = self._get(key, {"range": {"suffix": n}})
                except Exception as e:
                    if not _unsatisfiable(e):
                        raise
                    got = self._get(key, {"head": True})  # an empty object: no range of it exists
                    if got is not None and int(got[1]["size"]):
                        raise
        except Exception as e:
            raise self._error(key, e)  # noqa: B904 - the cause is set by _error
        if got is None:
            return None
        data, meta = got
        return Tail(data, int(meta["size"]), meta.get("e_tag"))

    def read_into(self, key: str, alloc: Callable[[int], Any]) -> Tail | None:
        """One GET of the whole object with its ETag, copied into the caller's buffer."""
        if not self._plain([key]):
            return super().read_into(key, alloc)
        import obstore

        try:
            result = obstore.get(self.client(), self._obj(key))
            data = result.bytes()
        except FileNotFoundError:
            return None
        except Exception as e:
            raise self._error(key, e)  # noqa: B904 - the cause is set by _error
        n = len(data)
        buf = alloc(n)
        memoryview(buf).cast("B")[:n] = memoryview(data)
        return Tail(buf[:n], n, result.meta.get("e_tag"))

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        if not self._plain([key]):
            return super().size(key)
        try:
            got = self._get(key, {"head": True})
        except Exception as e:
            raise self._error(key, e)  # noqa: B904 - the cause is set by _error
        return None if got is None else int(got[1]["size"])

    # ------------------------------------------------------------------ identity
    def location(self) -> Location:
        return endpoint_location("s3", self.storage_options, self.root)

    def describe(self) -> str:
        return self.url or f"s3://{self.root}"


def _changed(key: str) -> ObjectChangedError:
    return ObjectChangedError(f"{key}: the object changed between two reads of it (read it again)", key=key)


def _unsatisfiable(error: BaseException) -> bool:
    """A range the server cannot serve: 416, or (an empty object) a whole-object answer to a
    range request, which object_store refuses."""
    return _status(error) == 416 or "non-partial response" in str(error)
