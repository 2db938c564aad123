"""Icechunk destinations (issue 24): a migration written into one Icechunk session, committed once.

:func:`open_icechunk` opens (or creates) an Icechunk repository at a local path or an
``s3://`` URL and returns an :class:`IcechunkInner` over one writable session of a branch:

* **materialised** (``virtual=False``): documents and shard/chunk bytes are ``set`` into the
  session (the copy driver's verbatim copy); nothing is visible on the branch before
  :meth:`IcechunkInner.commit`, so a run killed at any point leaves the branch at its
  previous snapshot (bytes already written are unreferenced chunk objects Icechunk's
  garbage collection removes). Icechunk keeps no uncommitted session across processes:
  ``--resume`` starts a new session at the branch tip, i.e. it starts over.
* **virtual** (``virtual=True``): :meth:`IcechunkInner.put_reference` records a reference to
  bytes of the source object with a checksum Icechunk checks on every read: the ETag on
  S3, and locally the ETag Rust ``object_store`` computes for a file (inode, modification
  time in microseconds, size) -- not the last-modified date, which Icechunk keeps to the
  second and compares as "not modified since" only (a rewrite in the same second, or one
  that sets an older time, would pass). A virtual chunk container for the source's prefix is
  added to the repository's configuration.

Objects Icechunk has no key for (the migration's marker and record: root keys starting with
``.``) are kept beside the session and committed in the snapshot's metadata under
``"sharding-store"``; the record is read back from the branch tip's snapshot. Icechunk takes
chunk keys of the ``default`` encoding with the ``/`` separator only (a migration into a
repository respells every array so: ``Options.key_separator``); another key is refused
with :class:`UsageError`, before anything is committed. :func:`materialize` replaces a
repository's virtual chunks with copies of their bytes, in one commit.

Icechunk is an optional dependency (the ``icechunk`` extra): this module imports it only in
its functions.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from urllib.parse import urlsplit

from ..errors import (
    DestinationExistsError,
    LinkOutsideStoreError,
    SourceChangedError,
    StoreIOError,
    StoreNotFoundError,
    UsageError,
)
from ..formats.draft_metadata import escape_name
from .base import ChunkRef, Inner, Location, RangeRequest, Tail, Version
from .location import endpoint_location, objects_url_prefix, resolves_below
from .zarr_store import ZarrStoreInner

__all__ = ["IcechunkInner", "Materialized", "container_prefix", "inside_source", "is_repository", "local_checksum",
           "local_files_only", "materialize", "object_store_etag", "open_icechunk", "stand_in"]

#: the snapshot metadata key holding what the session kept beside the hierarchy
METADATA_KEY = "sharding-store"
#: keys Icechunk stores: a node document, or a chunk key of the default encoding with "/"
ICECHUNK_KEY = re.compile(r"(?:.*/)?(?:zarr\.json|c(?:/\d+)*)")
#: characters a path may hold for Icechunk 1.1 to find a virtual chunk (it percent-encodes
#: the others when it parses a location, and then matches no container)
URL_SAFE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")
DEFAULT_BRANCH = "main"
_RAISE = object()
#: Icechunk's words for a chunk key without an array node
NO_ARRAY = ("there is not an array at", "node not found")


def _icechunk() -> Any:
    try:
        import icechunk
    except ImportError as e:  # pragma: no cover - the extra is installed in the test environment
        raise UsageError("an Icechunk destination needs the icechunk package: pip install 'sharding-store[icechunk]'") from e
    return icechunk


def is_side_key(key: str) -> bool:
    """A root object that is no Zarr key (the migration's marker and record)."""
    return "/" not in key and key.startswith(".")


# --------------------------------------------------------------------------- storage and containers


def _s3_settings(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """s3fs-style storage options as Icechunk's S3 settings (region, endpoint, credentials)."""
    options = dict(options or {})
    client = dict(options.get("client_kwargs") or {})
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    #: None: Icechunk's own default (the environment's region)
    out: dict[str, Any] = {"region": client.get("region_name") or options.get("region_name")}
    if endpoint:
        out.update(endpoint_url=endpoint, allow_http=endpoint.startswith("http://"), force_path_style=True)
    if options.get("anon"):
        out["anonymous"] = True
    elif options.get("key") and options.get("secret"):
        out.update(access_key_id=options["key"], secret_access_key=options["secret"])
        if options.get("token"):
            out["session_token"] = options["token"]
    return out


def _split_s3(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.netloc, parts.path.strip("/")


def _storage(dst: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, Location]:
    """Icechunk's ``Storage`` for ``dst`` (a local path, ``file://`` or ``s3://`` URL) and its location."""
    ic = _icechunk()
    if dst.startswith(("s3://", "s3a://")):
        bucket, prefix = _split_s3(dst)
        settings = _s3_settings(storage_options)
        if not settings.get("anonymous") and "access_key_id" not in settings:
            settings["from_env"] = True
        return (ic.s3_storage(bucket=bucket, prefix=prefix, **settings),
                endpoint_location("s3", storage_options, f"{bucket}/{prefix}"))
    if "://" in dst and not dst.startswith("file://"):
        raise UsageError(f"{dst}: an Icechunk repository is a local path or an s3:// URL", key=dst)
    path = os.path.realpath(os.path.expanduser(dst[len("file://"):] if dst.startswith("file://") else dst))
    # Icechunk logs a warning on stderr for every local repository opened (local commits are not
    # safe across processes); the command line prints one line per error: only errors are logged
    ic.set_logs_filter("icechunk=error")
    return ic.local_filesystem_storage(path), Location("file", "", path)


def container_prefix(source: Location) -> str:
    """The URL prefix of the virtual chunk container for a source store's objects."""
    prefix = objects_url_prefix(source)
    if prefix is not None:
        return prefix
    raise UsageError(f"{source}: an Icechunk repository can reference only local or s3:// sources "
                     f"(this one is {source.kind})")


def _container(source: Location, source_options: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """``(VirtualChunkContainer, credentials)`` for ``source`` (credentials None: from the environment)."""
    ic = _icechunk()
    prefix = container_prefix(source)
    if not URL_SAFE.fullmatch(prefix[len("file://"):] if source.kind == "file" else prefix[len("s3://"):]):
        raise UsageError(f"{source}: Icechunk 1.1 cannot address virtual chunks under a path with spaces, '%', '#', "
                         "'?' or non-ASCII characters; migrate with a copy instead", key=str(source))
    if source.kind == "file":
        return ic.VirtualChunkContainer(prefix, ic.local_filesystem_store(source.path.rstrip("/") + "/")), None
    settings = _s3_settings(source_options)
    store = ic.s3_store(region=settings["region"], endpoint_url=settings.get("endpoint_url"),
                        allow_http=settings.get("allow_http", False), anonymous=bool(settings.get("anonymous")),
                        s3_compatible="endpoint_url" in settings, force_path_style=settings.get("force_path_style", False))
    return ic.VirtualChunkContainer(prefix, store), _credentials(prefix, source_options)


def _exists(storage: Any, location: Location) -> bool:
    """Whether a repository is there (a local path that is missing is not looked at: Icechunk's
    own check creates the directory)."""
    if location.kind == "file" and not os.path.isdir(location.path):
        return False
    return bool(_icechunk().Repository.exists(storage))


def _credentials(prefix: str, source_options: Mapping[str, Any] | None) -> Any:
    """What authorises an existing container: an S3 one with ``source_options``' credentials
    when they give some, anything else with None (the environment's, or none needed)."""
    if not prefix.startswith("s3://") or not source_options:
        return None
    settings = _s3_settings(source_options)
    ic = _icechunk()
    if settings.get("anonymous"):
        return ic.s3_anonymous_credentials()
    if "access_key_id" in settings:
        return ic.s3_static_credentials(access_key_id=settings["access_key_id"],
                                        secret_access_key=settings["secret_access_key"],
                                        session_token=settings.get("session_token"))
    return None


def is_repository(dst: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``dst`` holds an Icechunk repository (False also when icechunk is not installed)."""
    try:
        storage, location = _storage(dst, storage_options)
        return _exists(storage, location)
    except (UsageError, ValueError):
        return False


def _open_repository(storage: Any, location: Location, source: Location | None,
                     source_options: Mapping[str, Any] | None, configure: bool) -> Any:
    """The repository at ``storage`` (created when absent): with a ``source``, its container
    alone authorised (with ``source_options``), without one every container of the
    configuration; ``configure``: the
    source's container added to the configuration (saved) first."""
    ic = _icechunk()
    exists = _exists(storage, location)
    if not exists and location.kind == "file" and os.path.isdir(location.path) and os.listdir(location.path):
        exists = _exists(storage, location)  # a repository another run made meanwhile
    if not exists and location.kind == "file" and os.path.isdir(location.path) and os.listdir(location.path):
        raise DestinationExistsError(f"{location.path}: not an Icechunk repository and not empty; choose another "
                                     "destination", key=location.path)
    config = (ic.Repository.fetch_config(storage) if exists else None) or ic.RepositoryConfig.default()
    containers = config.virtual_chunk_containers or {}
    # with a source (a migration, verify): its container alone is authorised, so no virtual
    # chunk of another store (another container of a hostile or older configuration) is read
    authorise: dict[str, Any] = {} if source is not None else {p: _credentials(p, source_options) for p in containers}
    known = source is not None and source.kind in ("file", "s3") and container_prefix(source) in containers
    if source is not None and (configure or known):
        container, credentials = _container(source, source_options)
        if configure:
            config.set_virtual_chunk_container(container)
        authorise[container.url_prefix] = credentials
    grants = ic.containers_credentials(authorise) if authorise else None
    if not exists:
        try:
            return ic.Repository.create(storage, config=config, authorize_virtual_chunk_access=grants)
        except ic.IcechunkError:
            if not _exists(storage, location):
                raise
            # another run created it meanwhile: open it (of two sessions only one commits)
    repo = ic.Repository.open(storage, config=config, authorize_virtual_chunk_access=grants)
    if source is not None and configure:
        repo.save_config()
    return repo


def open_icechunk(dst: str, storage_options: Mapping[str, Any] | None = None, *, virtual: bool = False,
                  message: str = "", source: Location | None = None, source_options: Mapping[str, Any] | None = None,
                  branch: str = DEFAULT_BRANCH, create: bool = True) -> IcechunkInner:
    """An :class:`IcechunkInner` over a new writable session of ``branch`` of the repository at
    ``dst`` (created when absent). ``source``: the location of the store whose objects virtual
    references point into (with ``virtual``, its container is added to the configuration;
    ``source_options`` its storage options, for the credentials that read it); ``virtual``:
    whether the destination takes references; ``message``: what :meth:`IcechunkInner.commit`
    says when given none; ``create=False`` (a dry run, verify): an absent repository is not
    created, an empty one in memory stands for it."""
    storage, location = _storage(dst, storage_options)
    if not create and not _exists(storage, location):
        storage = _icechunk().in_memory_storage()
    try:
        repo = _open_repository(storage, location, source, source_options, configure=virtual)
    except _icechunk().IcechunkError as e:
        raise StoreIOError(f"{dst}: cannot open or create an Icechunk repository there: {_first_line(e)}",
                           key=dst) from e
    try:
        session = repo.writable_session(branch)
    except _icechunk().IcechunkError as e:
        raise UsageError(f"{dst}: no branch {branch!r} in this Icechunk repository ({_first_line(e)})", key=dst) from e
    inner = IcechunkInner(repo, session, url=dst, location=location, virtual=virtual)
    inner.message = message
    return inner


# --------------------------------------------------------------------------- checksums


def _url_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def local_checksum(url: str, size: int, modified: datetime | int | None, inode: int | None = None) -> str:
    """Icechunk's checksum of a local file: the ETag Rust ``object_store`` gives it
    (``{inode:x}-{mtime in µs:x}-{size:x}``), which it compares on every read. Refuses
    (:class:`SourceChangedError`) a file whose size or modification time is no longer what the
    reference was taken with (``modified``: a datetime to the microsecond, or ``st_mtime_ns``),
    or, where ``inode`` is given, another file put in its place."""
    path = _url_path(url)
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        raise SourceChangedError(f"{url}: gone since its reference was taken", key=url) from e
    mtime_us = st.st_mtime_ns // 1000
    expected = modified // 1000 if isinstance(modified, int) else None if modified is None else _micros(modified)
    if st.st_size != size or (expected is not None and expected != mtime_us):
        raise SourceChangedError(f"{url}: changed since its reference was taken (size {st.st_size}, was {size})",
                                 key=url)
    if inode is not None and st.st_ino != inode:
        raise SourceChangedError(f"{url}: replaced by another file since its reference was taken (inode {st.st_ino}, "
                                 f"was {inode})", key=url)
    return object_store_etag(st)


def object_store_etag(st: os.stat_result) -> str:
    """The ETag Rust ``object_store`` gives a local file, from its ``stat``: the one place it is spelled."""
    return f"{st.st_ino:x}-{st.st_mtime_ns // 1000:x}-{st.st_size:x}"


def _micros(when: datetime) -> int:
    """Microseconds since the epoch of an aware datetime, exactly (no float rounding)."""
    delta = when - datetime.fromtimestamp(0, when.tzinfo)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _source_cause(text: str) -> str:
    """The innermost cause Icechunk's report of a failed virtual read gives (its last ``->`` line)."""
    causes = [line.split("->", 1)[1].strip() for line in text.splitlines() if "->" in line]
    return causes[-1] if causes else ""


def _first_line(error: BaseException) -> str:
    for line in str(error).splitlines():
        line = line.strip().lstrip("x").strip()
        if line:
            return line
    return type(error).__name__


def stand_in(document: bytes) -> bytes | None:
    """A short array document with ``document``'s shape, data type, chunk grid, chunk key
    encoding, fill value and dimension names, and the one ``bytes`` codec, compact: what
    Icechunk needs of an array to take references into its chunk grid
    (:meth:`IcechunkInner.put_references`); None when ``document`` is no v3 array's or is no
    longer than it."""
    try:
        doc = json.loads(document)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
        return None
    keep = ("zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value",
            "dimension_names")
    lean = {k: doc[k] for k in keep if k in doc}
    lean["codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    out = json.dumps(lean, separators=(",", ":")).encode()
    return out if len(out) < len(document) else None


# --------------------------------------------------------------------------- the store


class IcechunkInner(ZarrStoreInner):
    """One writable Icechunk session as a migration's destination (see the module docstring)."""

    def __init__(self, repo: Any, session: Any, *, url: str, location: Location, virtual: bool) -> None:
        super().__init__(session.store)
        self.repo, self.session, self.url, self._location, self.virtual = repo, session, url, location, virtual
        self.branch = session.branch or DEFAULT_BRANCH
        self._lock = threading.RLock()
        #: objects kept beside the session (None: deleted in this session)
        self._side: dict[str, bytes | None] = {}
        self._snapshot_objects: tuple[str, dict[str, str]] | None = None
        #: array documents set in this session, by key (what :meth:`put_references` stands aside)
        self._docs: dict[str, bytes] = {}
        #: documents standing aside for their :func:`stand_in` now, by key (:meth:`_put_back`)
        self._aside: dict[str, bytes] = {}
        #: the commit's message when :meth:`commit` is given none
        self.message = ""

    def __repr__(self) -> str:
        return f"IcechunkInner({self.url!r}, virtual={self.virtual})"

    # ------------------------------------------------------------------ errors
    def _call(self, key: str, fn: Any, *args: Any, missing: Any = _RAISE) -> Any:
        """``fn(*args)`` on the session; Icechunk's errors as ours, naming ``key``. Icechunk
        raises ``KeyError`` for a key of a node the session does not hold: ``missing`` is
        returned then (by default it is an error: a chunk needs its array's document first)."""
        ic = _icechunk()
        try:
            return fn(*args)
        except KeyError as e:
            if missing is not _RAISE:
                return missing
            raise UsageError(f"{key}: no array holds this chunk in the session (Icechunk needs an array's zarr.json "
                             "before its chunks)", key=key) from e
        except ic.IcechunkError as e:
            if any(m in str(e) for m in NO_ARRAY) and missing is not _RAISE:
                return missing  # a chunk key of no node, or below a group
            raise self._error(key, e) from e

    def _error(self, key: str, e: BaseException) -> Exception:
        text = str(e)
        what = _first_line(e)
        if any(m in text for m in NO_ARRAY):
            return UsageError(f"{key}: no array holds this chunk in the session ({what})", key=key)
        # a read of a virtual chunk in a container not authorised (with a source: any but the
        # source's, _open_repository) or in none (a location Icechunk normalised out of them)
        outside = (re.search(r"resolves to the url prefix (\S+?),? to be able to fetch", text)
                   or re.search(r"no virtual chunk container can handle the chunk location \((\S+?)\)", text))
        if outside:
            return LinkOutsideStoreError(f"{key}: a virtual chunk of another store than the source "
                                         f"({outside.group(1)}): not read", key=key)
        if "invalid zarr key" in text or "invalid chunk location" in text or "no virtual chunk container" in text:
            return UsageError(f"{key}: Icechunk cannot store this ({what}); Icechunk takes chunk keys of the default "
                              "encoding with '/' only: migrate into a directory instead", key=key)
        fetching = "error fetching virtual reference" in text
        gone = ("not found" in text or "NoSuchKey" in text or "does not exist" in text)
        if "checksum of the object" in text or "not enough data" in text or (fetching and gone):
            return SourceChangedError(f"{key}: the source object of this virtual chunk changed, shrank or is gone since "
                                      f"the migration ({what})", key=key)
        if fetching:  # the source could not be read (a network error, a permission): not a change
            return StoreIOError(f"{key}: Icechunk could not read the source object of this virtual chunk: "
                                f"{_source_cause(text) or what}", key=key)
        return StoreIOError(f"{key}: Icechunk: {what}", key=key)

    # ------------------------------------------------------------------ side objects
    def _recorded(self) -> dict[str, str]:
        """The side objects the session's snapshot recorded (looked up once per snapshot)."""
        snapshot = self.session.snapshot_id
        cached = self._snapshot_objects
        if cached is not None and cached[0] == snapshot:
            return cached[1]
        info = self.repo.lookup_snapshot(snapshot)
        kept = (info.metadata or {}).get(METADATA_KEY) or {}
        objects = kept.get("objects") if isinstance(kept, dict) else None
        found = {k: v for k, v in (objects or {}).items() if isinstance(k, str) and isinstance(v, str)}
        self._snapshot_objects = (snapshot, found)
        return found

    def _side_get(self, key: str) -> bytes | None:
        with self._lock:
            if key in self._side:
                return self._side[key]
        value = self._recorded().get(key)
        return None if value is None else value.encode()

    def _side_keys(self) -> list[str]:
        keys = set(self._recorded())
        with self._lock:
            keys |= {k for k, v in self._side.items() if v is not None}
            keys -= {k for k, v in self._side.items() if v is None}
        return sorted(keys)

    def _check_key(self, key: str) -> None:
        if not ICECHUNK_KEY.fullmatch(key):
            raise UsageError(f"{key}: Icechunk takes node documents and chunk keys of the default encoding with "
                             "separator '/' only (…/c/0/1); this key is spelled otherwise: migrate into a directory "
                             "instead", key=key)

    # ------------------------------------------------------------------ core
    def get(self, key: str) -> bytes | None:
        if is_side_key(key):
            return self._side_get(key)
        if not ICECHUNK_KEY.fullmatch(key):
            return None
        if key.endswith("zarr.json"):
            with self._lock:
                self._put_back()
                return self._call(key, super().get, key, missing=None)
        return self._call(key, super().get, key, missing=None)

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key, start, end in requests:  # one at a time: each error names its key
            if is_side_key(key) or not ICECHUNK_KEY.fullmatch(key):
                whole = self.get(key)
                out.append(None if whole is None else (whole[start:end] if start >= 0 else whole[start:]))
            elif key.endswith("zarr.json"):
                with self._lock:
                    self._put_back()
                    out.append(self._call(key, super().get_ranges, [(key, start, end)], missing=[None])[0])
            else:
                out.append(self._call(key, super().get_ranges, [(key, start, end)], missing=[None])[0])
        return out

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        tails: list[Tail | None] = []
        for key, n in requests:
            size = self.size(key)
            if size is None:
                tails.append(None)
                continue
            data = self.get_ranges([(key, max(0, size - n), None)])[0] if n > 0 else b""
            tails.append(None if data is None else Tail(data, size, None))
        return tails

    def set(self, key: str, value: bytes) -> None:
        if is_side_key(key):
            with self._lock:
                self._side[key] = bytes(value)
            return
        self._check_key(key)
        with self._lock:
            self._put_back()
            self._docs.pop(key, None)
            try:
                self._call(key, super().set, key, value)
            except StoreIOError as e:
                if not (key.endswith("zarr.json") and "node already exists" in str(e.__cause__)):
                    raise
                self.delete(key)  # a node of the other type (array <-> group) is replaced, as a file would be
                self._call(key, super().set, key, value)
            if self.virtual and key.endswith("zarr.json"):
                self._docs[key] = bytes(value)

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """Atomic within this process (one session); across processes Icechunk's commit refuses
        the second of two sessions of one branch (:meth:`commit`)."""
        with self._lock:
            if self.exists(key):
                return False
            self.set(key, value)
            return True

    def delete(self, key: str) -> None:
        if is_side_key(key):
            with self._lock:
                self._side[key] = None
            return
        if ICECHUNK_KEY.fullmatch(key):
            with self._lock:
                self._put_back()
                self._docs.pop(key, None)
                self._call(key, super().delete, key, missing=None)  # a chunk of a deleted node: gone with it

    def delete_prefix(self, prefix: str) -> None:
        """Every node and chunk under ``prefix`` (Icechunk's ``delete_dir``), and the side objects there."""
        with self._lock:
            self._put_back()
            self._docs = {k: v for k, v in self._docs.items() if not k.startswith(prefix)}
            self._call(prefix, self._sync, self.store.delete_dir(prefix), missing=None)
        for key in self._side_keys():
            if key.startswith(prefix):
                self.delete(key)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Sorted keys under ``prefix``, the side objects among them. Icechunk lists only below
        a node (or everything): any other prefix is a filter of the whole listing."""
        try:
            keys = list(self._call(prefix, lambda: list(super(IcechunkInner, self).list_prefix(prefix))))
        except StoreIOError as e:
            if "bad key prefix" not in str(e):
                raise
            keys = [k for k in self._call("", lambda: list(super(IcechunkInner, self).list_prefix(""))) if
                    k.startswith(prefix)]
        keys += [k for k in self._side_keys() if k.startswith(prefix)]
        return iter(sorted(keys))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """``(keys, prefixes)`` one level below ``prefix`` (ending ``/``, or the root) through
        Icechunk's own listing of a node (no chunk of another level is listed; the generic
        way lists every key below); the side objects at the root. An entry other than a
        node's ``zarr.json`` is a prefix unless it is a key (a 0-d array's one chunk ``c``)."""
        if prefix and not prefix.endswith("/"):
            return super().list_dir(prefix)

        async def entries() -> list[str]:
            return [str(e) async for e in self.store.list_dir(prefix)]

        try:
            names = self._call(prefix, lambda: self._sync(entries()), missing=[])
        except StoreIOError:  # a prefix Icechunk lists only as a filter of everything
            return super().list_dir(prefix)
        keys = [prefix + n for n in names if n == "zarr.json" or self.exists(prefix + n)]
        prefixes = [prefix + n + "/" for n in names if prefix + n not in keys]
        keys += [k for k in self._side_keys() if not prefix]
        return sorted(keys), sorted(prefixes)

    def exists(self, key: str) -> bool:
        if is_side_key(key):
            return self._side_get(key) is not None
        if not ICECHUNK_KEY.fullmatch(key):
            return False
        return bool(self._call(key, super().exists, key, missing=False))

    def size(self, key: str) -> int | None:
        if is_side_key(key) or not ICECHUNK_KEY.fullmatch(key):
            value = self.get(key)
            return None if value is None else len(value)
        with self._lock:
            self._put_back()
            if not self.exists(key):
                return None
            return int(self._call(key, lambda: self._sync(self.store.getsize(key))))

    def location(self) -> Location:
        return self._location

    def describe(self) -> str:
        kind = "virtual" if self.virtual else "materialised"
        return f"Icechunk repository {self.url} (branch {self.branch}, {kind})"

    def kind(self) -> str:
        """Which kind of destination this is, in the report's words."""
        return "Icechunk virtual" if self.virtual else "Icechunk materialised"

    # ------------------------------------------------------------------ references read back (verify)
    def chunk_keys(self, array_path: str) -> list[str]:
        """The sorted keys of the chunks the session holds for the array at ``array_path``
        ("": the root), from its manifest (no chunk read; none for a path of no array)."""
        prefix = f"{array_path}/c" if array_path else "c"

        async def coordinates() -> list[tuple[int, ...]]:
            return [tuple(c) async for c in self.session.chunk_coordinates("/" + array_path)]

        got = self._call(prefix, lambda: self._sync(coordinates()), missing=[])
        return sorted(prefix + "".join(f"/{i}" for i in c) for c in got)

    def virtual_locations(self) -> list[str]:
        """The URL of every virtual chunk of the session, one per chunk, in no order: Icechunk
        1.1's Python API tells no chunk's location, offset or checksum by its key."""
        return [str(u) for u in self._call("", self.session.all_virtual_chunk_locations)]

    def read_each(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes | Exception]:
        """Bytes ``[start, end)`` of each chunk, read concurrently through Icechunk (which
        checks a virtual chunk's object against its checksum, and clamps ``end`` to the
        chunk's length, as zarr's stores do); a read that fails is its error as ours, naming
        its key, in its place (none is raised)."""
        from zarr.abc.store import RangeByteRequest

        async def one(key: str, start: int, end: int) -> Any:
            try:
                return await self.store.get(key, self._proto, byte_range=RangeByteRequest(start, end))
            except Exception as e:  # noqa: BLE001 - each read's own outcome
                return e

        async def run() -> list[Any]:
            import asyncio

            try:  # one call for all (Icechunk fetches them concurrently); a failure: each alone, to name it
                return list(await self.store.get_partial_values(
                    self._proto, [(k, RangeByteRequest(s, e)) for k, s, e in requests]))
            except Exception:  # noqa: BLE001
                return await asyncio.gather(*(one(k, s, e) for k, s, e in requests))

        out: list[bytes | Exception] = []
        for (key, _, _), got in zip(requests, self._sync(run())):
            if isinstance(got, _icechunk().IcechunkError):
                out.append(self._error(key, got))
            elif isinstance(got, Exception):
                out.append(StoreIOError(f"{key}: Icechunk: {type(got).__name__}: {got}", key=key))
            else:
                out.append(StoreIOError(f"{key}: Icechunk holds no chunk there", key=key) if got is None else got.to_bytes())
        return out

    # ------------------------------------------------------------------ references and commit
    def takes_references(self) -> bool:
        return self.virtual

    def put_reference(self, key: str, ref: ChunkRef) -> None:
        """A virtual chunk: bytes ``[ref.offset, ref.offset + ref.length)`` of ``ref.url``, with the
        checksum Icechunk checks on every read (the ETag; locally :func:`local_checksum`)."""
        checksum = self._checksum(key, ref)
        self._call(key, lambda: self.store.set_virtual_ref(key, ref.url, offset=ref.offset, length=ref.length,
                                                           checksum=checksum))

    def put_references(self, array: str, refs: Sequence[tuple[str, tuple[int, ...], ChunkRef]]) -> None:
        """:meth:`put_reference` of each ``(key, chunk grid coordinates, ref)`` of the array at
        ``array``, checked the same way, with one ``set_virtual_refs`` (a reference whose URL
        no container holds is refused naming its key, as alone).

        Icechunk 1.1 formats the array's node, its whole document included, into a tracing
        span for every reference it sets (``Session::set_node_chunk_ref``; the log filter does
        not switch it off): about half its cost a reference for a 1 KiB document. So while
        the references are set, the array's document set in this session stands aside for
        its :func:`stand_in` (the same shape and chunk grid: the references Icechunk checks
        and keeps are the same), put back (once an array, not once a batch: a document set
        costs ~40 references) by the first read or write of any document, or the commit, which
        all take the lock this holds: no reader and no snapshot sees the stand-in."""
        if not refs:
            return
        spec = _icechunk().VirtualChunkSpec
        specs = [spec(list(coords), ref.url, ref.offset, ref.length, checksum)  # positional: no keyword parsing
                 for (_, coords, ref), checksum in zip(refs, self._checksums(refs))]
        with self._lock:
            self._stand_aside(f"{array}/zarr.json" if array else "zarr.json")
            try:
                failed = self._call(refs[0][0], lambda: self.store.set_virtual_refs(f"/{array}", specs,
                                                                                    validate_containers=True))
            except BaseException:
                self._put_back()
                raise
        if failed:
            at = {tuple(coords): key for key, coords, _ in refs}
            key = at.get(tuple(failed[0]), refs[0][0])
            raise UsageError(f"{key}: Icechunk cannot store this (invalid chunk location, no matching virtual chunk "
                             "container)", key=key)

    def _stand_aside(self, key: str) -> None:
        """The array document ``key`` set in this session replaced by its :func:`stand_in`
        until :meth:`_put_back` (under the lock; nothing when there is none or Icechunk
        refuses it: the references are set all the same)."""
        real = self._docs.get(key)
        lean = None if real is None or key in self._aside else stand_in(real)
        if lean is None:
            return
        try:
            self._call(key, ZarrStoreInner.set, self, key, lean)
        except (StoreIOError, UsageError):
            return  # Icechunk did not take it: the document as set stays
        self._aside[key] = cast(bytes, real)

    def _put_back(self) -> None:
        """Every document standing aside set again as it was (under the lock): called by every
        read or write of a document, and by :meth:`commit`, before anything else."""
        while self._aside:
            key, real = next(iter(self._aside.items()))
            self._call(key, ZarrStoreInner.set, self, key, real)
            del self._aside[key]

    def _checksums(self, refs: Sequence[tuple[str, tuple[int, ...], ChunkRef]]) -> list[str]:
        """:meth:`_checksum` of each reference, the usual one (a local file, its key and path
        storable, its ``st_mtime_ns`` known) inline: the same checks, one ``stat`` and no
        call a reference (a ``VirtualChunkSpec`` a shard: this is per-shard cost); any
        other, or any that fails a check, goes through :meth:`_checksum` (which names what)."""
        if not self.virtual:
            raise NotImplementedError("a materialised Icechunk destination takes bytes, not references")
        key_ok, url_ok, stat_, etag = ICECHUNK_KEY.fullmatch, URL_SAFE.fullmatch, os.stat, object_store_etag
        out: list[str] = []
        for key, _, ref in refs:
            url, modified_ns = ref.url, ref.modified_ns
            if url.startswith("file://") and modified_ns is not None and key_ok(key) and url_ok(url, 7):
                try:
                    st = stat_(url[7:])
                except OSError:
                    st = None
                if (st is not None and st.st_size == ref.object_size and st.st_mtime_ns // 1000 == modified_ns // 1000
                        and (ref.inode is None or st.st_ino == ref.inode)):
                    out.append(etag(st))  # local_checksum's
                    continue
            out.append(self._checksum(key, ref))
        return out

    def _checksum(self, key: str, ref: ChunkRef) -> str:
        """The checksum Icechunk keeps for ``ref``'s object (the ETag; locally
        :func:`local_checksum`), after the key and URL were found storable."""
        if not self.virtual:
            raise NotImplementedError("a materialised Icechunk destination takes bytes, not references")
        self._check_key(key)
        scheme, _, path = ref.url.partition("://")
        if not URL_SAFE.fullmatch(path):
            raise UsageError(f"{ref.url}: Icechunk 1.1 cannot address a virtual chunk whose path holds spaces, '%', "
                             "'#', '?' or non-ASCII characters; migrate with a copy (--icechunk) instead", key=key)
        if scheme == "file":
            when = ref.modified_ns if ref.modified_ns is not None else ref.modified
            return local_checksum(ref.url, ref.object_size, when, ref.inode)
        if ref.etag is not None:
            return ref.etag
        # a last-modified date Icechunk keeps to the second and checks as "not modified since" only
        raise UsageError(f"{ref.url}: no ETag: Icechunk could not tell a changed object from this one; refused",
                         key=key)

    def commit(self, message: str = "") -> str:
        """Commit the session as one snapshot with ``message``; the side objects still present
        go into its metadata. Another writer's commit on the branch since this session began
        is :class:`DestinationExistsError` (nothing of this session is committed). A session that
        changed nothing commits nothing (Icechunk has no empty commit): the tip's id is returned."""
        with self._lock:
            self._put_back()  # the snapshot holds the documents as set, never a stand-in
            return self._commit(message)

    def _commit(self, message: str) -> str:
        ic = _icechunk()
        objects = {k: v.decode("utf-8", "replace") for k in self._side_keys() if (v := self._side_get(k)) is not None}
        if not self.session.has_uncommitted_changes:  # Icechunk commits no empty snapshot
            return str(self.session.snapshot_id)  # the tip already holds this hierarchy
        try:
            snapshot = str(self.session.commit(message or self.message or "sharding-store", metadata={METADATA_KEY: {"objects": objects}}))
        except ic.ConflictError as e:
            raise DestinationExistsError(f"{self.url}: another writer committed to branch {self.branch!r} while this "
                                         f"migration ran ({_first_line(e)}); nothing of it was committed: run it again",
                                         key=self.url) from e
        except ic.IcechunkError as e:
            raise StoreIOError(f"{self.url}: Icechunk commit failed: {_first_line(e)}", key=self.url) from e
        with self._lock:
            self._side.clear()  # now the snapshot's
        return snapshot

    def record(self) -> dict[str, Any] | None:
        """What the branch tip's snapshot recorded beside the hierarchy (parsed JSON objects), if anything."""
        out = {}
        for k, v in self._recorded().items():
            try:
                out[k] = json.loads(v)
            except ValueError:
                out[k] = v
        return out or None


# --------------------------------------------------------------------------- materialize


@dataclass
class Materialized:
    """What :func:`materialize` did: virtual chunks replaced by their bytes, in one snapshot."""

    dst: str
    chunks: int = 0
    bytes: int = 0
    snapshot: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"dst": self.dst, "chunks": self.chunks, "bytes": self.bytes, "snapshot": self.snapshot}

    def summary(self) -> str:
        dst = escape_name(self.dst)
        if not self.chunks:
            return f"{dst}: no virtual chunk: nothing to materialize"
        return f"materialized {self.chunks} virtual chunks ({self.bytes} bytes) of {dst} in snapshot {self.snapshot}"


def _chunk_coords(key: str) -> tuple[str, list[int]] | None:
    """``(array path, coordinates)`` of a chunk key (``a/b/c/0/1``; ``c`` of a 0-d root array);
    None for a document or a side object."""
    if not ICECHUNK_KEY.fullmatch(key) or key.rsplit("/", 1)[-1] == "zarr.json":
        return None
    parts = key.split("/")
    at = len(parts) - 1 - parts[::-1].index("c")  # after the last "c" come the coordinates only
    return "/" + "/".join(parts[:at]), [int(c) for c in parts[at + 1:]]


def virtual_keys(inner: IcechunkInner) -> Iterator[str]:
    """The chunk keys of the session that are virtual references."""
    virtual = _icechunk().ChunkType.VIRTUAL
    for key in inner.list_prefix(""):
        where = _chunk_coords(key)
        if where is not None and inner.session.chunk_type(*where) == virtual:
            yield key


def materialize(dst: str, storage_options: Mapping[str, Any] | None = None, *,
                source_options: Mapping[str, Any] | None = None, message: str = "", jobs: int = 4) -> Materialized:
    """Replace every virtual chunk of the Icechunk repository ``dst`` by a copy of its bytes,
    in one commit (``sharding-store materialize DST``). Each chunk is read through Icechunk's
    checksum: a source object changed since the references were taken is
    :class:`SourceChangedError` and nothing is committed. A migration record in the snapshot's
    metadata says ``"virtual": false`` afterwards. ``source_options``: the S3 credentials the
    containers are read with."""
    if not _exists(*_storage(dst, storage_options)):
        raise StoreNotFoundError(f"{dst}: no Icechunk repository here", key=dst)
    inner = open_icechunk(dst, storage_options, source_options=source_options, create=False)
    source = _recorded_source(inner)
    if source is not None:  # its container alone authorised: no other store's bytes are copied in
        inner = open_icechunk(dst, storage_options, source=source, source_options=source_options, create=False)
    done = Materialized(dst)

    def copy(key: str) -> int:
        value = inner.get(key)
        if value is None:
            raise SourceChangedError(f"{key}: its virtual chunk reads as nothing", key=key)
        inner.set(key, value)
        return len(value)

    local_files_only(inner.virtual_locations())
    if source is not None:
        inside_source(inner, source)
    keys = iter(virtual_keys(inner))
    with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="materialize") as pool:
        while batch := [k for _, k in zip(range(64 * max(1, jobs)), keys)]:
            for size in pool.map(copy, batch):
                done.chunks, done.bytes = done.chunks + 1, done.bytes + size
    if not done.chunks:
        return done
    _record_materialized(inner)
    done.snapshot = inner.commit(message or f"sharding-store: {done.chunks} virtual chunks of {escape_name(dst)} "
                                            "materialized")
    return done


def local_files_only(urls: Iterable[str]) -> None:
    """:class:`SourceChangedError` for the first local source that is no longer a regular
    file (one ``lstat`` each, before any read): Icechunk would wait for ever, deaf to
    SIGTERM, on a FIFO put in a file's place."""
    for url in set(urls):
        if not url.startswith("file://"):
            continue
        try:
            mode = os.lstat(url[len("file://"):]).st_mode
        except FileNotFoundError:
            continue  # Icechunk's read says it is gone (exit 14)
        if not stat.S_ISREG(mode):
            raise SourceChangedError(f"{url}: no longer a regular file since the migration", key=url)


def inside_source(inner: Inner, source: Location) -> None:
    """:class:`LinkOutsideStoreError` for the first virtual chunk of the repository ``inner``
    (an :class:`IcechunkInner`) whose URL lies in the local ``source``'s container but leads
    out of it through a link (of a directory, or in the object's place): Icechunk follows
    links, so it would read another store's object, where the source's own store refuses the
    link. ``verify`` and ``materialize`` read none of it."""
    if source.kind != "file":
        return
    prefix = container_prefix(source)
    root = prefix[len("file://"):]
    dirs: dict[str, bool] = {}
    for url in set(cast(IcechunkInner, inner).virtual_locations()):
        if url.startswith(prefix) and not resolves_below(url[len("file://"):], root, dirs, follow_last=True):
            raise LinkOutsideStoreError(f"{url}: a virtual chunk leading out of the source {prefix} through a link: "
                                        "not read", key=url)


def _recorded_source(inner: IcechunkInner) -> Location | None:
    """The local or S3 source a virtual migration's record (a side object) names, else None
    (a repository not migrated by us: every container of its configuration is read)."""
    for key in inner._side_keys():
        try:
            doc = json.loads(inner.get(key) or b"")
        except ValueError:
            continue
        where = doc.get("source") if isinstance(doc, dict) and doc.get("virtual") is True else None
        if (isinstance(where, list) and len(where) == 3 and all(isinstance(x, str) for x in where)
                and where[0] in ("file", "s3")):
            return Location(*where)
    return None


def _record_materialized(inner: IcechunkInner) -> None:
    """Side objects (the migration's record) saying ``"virtual": true`` say false."""
    for key in inner._side_keys():
        raw = inner.get(key)
        try:
            doc = json.loads(raw or b"")
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("virtual") is True:
            inner.set(key, json.dumps({**doc, "virtual": False}).encode())
