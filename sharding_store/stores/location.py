"""Canonical store locations (issue 12: "is DST the same store as SRC, or inside it?").

One spelling per place: a local directory is its ``realpath`` (so ``file://``, ``~``,
``..``, a trailing slash, relative paths and symlinks to the directory all agree); an
fsspec filesystem is its normalised protocol, its endpoint (for object stores) and its
stripped path; an in-process object is its identity. :meth:`Location.relation` then
answers the question once for migrate, reshard and verify.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from ._fsspec_adapter import can_strip_protocol, strip_protocol
from .base import Location, Relation

__all__ = ["Location", "Relation", "endpoint_location", "objects_url_prefix",
           "fs_location", "is_local_fs", "protocol_of", "relation", "resolves_below", "zarr_location"]


def protocol_of(fs: Any) -> str:
    """The filesystem's first protocol name, normalised (``s3a`` -> ``s3``, ``local`` -> ``file``)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return {"s3a": "s3", "local": "file", "gs": "gcs", "abfss": "abfs", "az": "abfs"}.get(protocol, protocol)


def is_local_fs(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else tuple(fs.protocol)
    names = {protocol} if isinstance(protocol, str) else set(protocol)
    return bool(names & {"file", "local"})


def _endpoint(fs: Any) -> str:
    """An object store's endpoint, normalised (``scheme://host[:port]``, lower case, the
    default port dropped); "" for the provider's default."""
    return _options_endpoint(getattr(fs, "storage_options", {}) or {}, fs)


def _options_endpoint(options: Any, fs: Any = None) -> str:
    """The endpoint storage options name (else the filesystem's own), normalised."""
    client = options.get("client_kwargs") or getattr(fs, "client_kwargs", None) or {}
    url = options.get("endpoint_url") or client.get("endpoint_url") or getattr(fs, "endpoint_url", None) or ""
    if not url:
        return ""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    scheme = (parts.scheme or "https").lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    if port is None or (scheme, port) in (("http", 80), ("https", 443)):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def fs_location(fs: Any, root: str) -> Location:
    """The location of ``root`` on an fsspec filesystem."""
    path = strip_protocol(fs, root)
    if is_local_fs(fs):
        return Location("file", "", os.path.realpath(path) if path else os.getcwd())
    kind = protocol_of(fs)
    path = "/".join(p for p in path.split("/") if p not in ("", "."))
    if kind == "memory":
        path = "/" + path
    return Location(kind, _endpoint(fs), path)


def endpoint_location(kind: str, storage_options: Any, root: str) -> Location:
    """The location of ``root`` (``bucket/prefix``, stripped) on an object store given by
    storage options: what :func:`fs_location` says of the fsspec filesystem made from them."""
    path = "/".join(p for p in root.split("/") if p not in ("", "."))
    return Location(kind, _options_endpoint(storage_options or {}), path)


def zarr_location(store: Any) -> Location:
    """The location of a zarr-python 3 store (local and fsspec stores by where they point)."""
    root = getattr(store, "root", None)
    if root is not None and type(store).__name__ == "LocalStore":
        return Location("file", "", os.path.realpath(os.fspath(root)))
    fs = getattr(store, "fs", None)
    if fs is not None and can_strip_protocol(fs):
        return fs_location(fs, getattr(store, "path", ""))
    data = getattr(store, "_store_dict", None)
    if data is not None:
        return Location("mapping", str(id(data)), "")
    return Location("zarr", str(id(store)), "")


def relation(a: Any, b: Any) -> Relation:
    """How store ``a`` relates to store ``b`` (anything with ``location()``, or Locations)."""
    la = a if isinstance(a, Location) else a.location()
    lb = b if isinstance(b, Location) else b.location()
    return la.relation(lb)


def objects_url_prefix(location: Location) -> str | None:
    """The URL every object of the store at ``location`` has and no other store's has
    (``file:///abs/dir/``, ``s3://bucket/prefix/``); None for other kinds: what a virtual
    reference into the store starts with."""
    if location.kind == "file":
        return f"file://{location.path.rstrip('/')}/"
    if location.kind == "s3":
        return f"s3://{location.path.strip('/')}/"
    return None


def resolves_below(path: str, root: str, dirs: dict[str, bool], *, follow_last: bool = False) -> bool:
    """Whether the local ``path`` still lies below the directory ``root`` (resolved, ending in
    ``/``) once the links of its directories are followed (``follow_last``: and a link in its
    own place, for a reader that follows it): a URL that lies below a source's prefix as text
    can still lead out of it through a link (the source's own store never follows one).
    ``dirs``: the answer by directory, kept by the caller (one ``realpath`` a directory)."""
    directory = path.rpartition("/")[0]
    inside = dirs.get(directory)
    if inside is None:
        if len(dirs) >= 4096:
            dirs.clear()
        inside = dirs[directory] = (os.path.realpath(directory or "/").rstrip("/") + "/").startswith(root)
    if inside and follow_last and os.path.islink(path):
        return os.path.realpath(path).startswith(root)
    return inside
