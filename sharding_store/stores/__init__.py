"""Stores: uniform synchronous access to where the objects live (the layer below the engine).

:func:`as_inner` adapts what a user passes — a path or URL, an ``fsspec.FSMap``, a
zarr-python 3 ``Store``, a mapping, or a store object — to the :class:`Inner` interface
(:mod:`.base`): :class:`LocalInner` for every local spelling (:mod:`.local`),
:class:`FsspecInner` for remote fsspec filesystems (:mod:`.fsspec`; on S3, where
:func:`~._obstore.obstore_options` allows, :class:`ObstoreInner`: reads through obstore),
:class:`ZarrStoreInner` (:mod:`.zarr`), :class:`MappingInner` (:mod:`.mapping`).
Store identity (same store? nested?) is :class:`Location` (:mod:`.location`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from ..errors import LinkOutsideStoreError, ObjectChangedError, StoreIOError, UsageError
from .base import (
    BaseInner,
    ChunkRef,
    CompletedInner,
    ComposePlan,
    CoreInner,
    Inner,
    Location,
    Part,
    RangeRequest,
    Relation,
    Tail,
    Version,
    in_memory,
    list_dir_from_keys,
    slice_range,
)
from .local import FILE_MODE, TEMP_MARKER, LocalInner, atomic_local_file, is_temp, write_all, write_local_atomic
from .location import relation

if TYPE_CHECKING:
    from ._obstore import ObstoreInner
    from .fsspec_store import FsspecInner
    from .mapping import MappingInner
    from .zarr_store import ZarrStoreInner


def __getattr__(name: str) -> Any:
    """The adapters a local path never needs, imported on first use (a command on a local
    store loads none of them: ~6 M instructions of its start-up)."""
    value: Any
    if name == "ObstoreInner":
        from ._obstore import ObstoreInner as value
    elif name == "FsspecInner":
        from .fsspec_store import FsspecInner as value
    elif name == "MappingInner":
        from .mapping import MappingInner as value
    elif name == "ZarrStoreInner":
        from .zarr_store import ZarrStoreInner as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "FILE_MODE",
    "TEMP_MARKER",
    "BaseInner",
    "ChunkRef",
    "ComposePlan",
    "CoreInner",
    "FsspecInner",
    "Inner",
    "LinkOutsideStoreError",
    "LocalInner",
    "Location",
    "MappingInner",
    "ObstoreInner",
    "ObjectChangedError",
    "Part",
    "RangeRequest",
    "Relation",
    "StoreIOError",
    "Tail",
    "Version",
    "ZarrStoreInner",
    "as_inner",
    "atomic_local_file",
    "in_memory",
    "is_temp",
    "list_dir_from_keys",
    "open_url",
    "relation",
    "slice_range",
    "write_all",
    "write_local_atomic",
]

#: the pip extra that installs each protocol's fsspec backend
EXTRAS = {"s3": "s3", "s3a": "s3"}
#: protocols whose backend the user installs separately (named in the error)
BACKENDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
            "abfss": "adlfs", "adl": "adlfs", "http": "aiohttp", "https": "aiohttp", "sftp": "paramiko",
            "ssh": "paramiko", "hf": "huggingface_hub"}


def _is_local_url(url: str) -> bool:
    return "://" not in url and "::" not in url or url.startswith(("file://", "local://"))


def open_url(url: str, storage_options: Mapping[str, Any] | None = None) -> Inner:
    """A store for a path or URL; setup errors become errors of ours naming the URL:
    an unknown protocol, a missing backend (naming what to install) and storage options
    the backend rejects are :class:`~sharding_store.errors.UsageError` (exit 2)."""
    if not storage_options and _is_local_url(url):
        return LocalInner(url)  # no fsspec import on the local read path
    protocol = url.split("://", 1)[0].split("::")[-1] if "://" in url else "file"
    if protocol in ("s3", "s3a"):
        from ._obstore import ObstoreInner, obstore_options

        settings = obstore_options(url, storage_options)
        if settings is not None:  # reads through obstore, the rest through s3fs (see _obstore)
            store = ObstoreInner(url, storage_options, settings)
            store.check_options()
            return store
    import fsspec

    from .fsspec_store import FsspecInner

    try:
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as e:
        backend = BACKENDS.get(protocol, "its fsspec backend")
        extra = EXTRAS.get(protocol)
        hint = f"pip install 'sharding-store[{extra}]'" if extra else f"pip install {backend}"
        raise UsageError(f"{url}: the {protocol}:// protocol needs {backend}, which is not installed ({hint})") from e
    except ValueError as e:
        if "Protocol not known" in str(e):
            raise UsageError(f"{url}: unknown protocol {protocol}:// (known: a local path, file://, "
                             f"s3://, gs://, memory://, ... as fsspec knows them)") from None
        raise UsageError(f"{url}: {e}") from None
    except TypeError as e:
        raise UsageError(f"{url}: storage options not accepted by the {protocol}:// backend: {e}") from None
    inner = FsspecInner(fs, root)
    if isinstance(inner, FsspecInner):
        inner.url = url
        inner.check_options()
    return inner


def as_inner(store: Any, *, storage_options: Mapping[str, Any] | None = None) -> Inner:
    """Adapt ``store`` (path/URL, ``FSMap``, zarr-3 ``Store``, mapping, or a store) to :class:`Inner`."""
    if isinstance(store, BaseInner):
        return store
    if isinstance(store, str):  # the usual case first: Protocol checks below cost ~20 µs each
        return open_url(store, storage_options)
    if not isinstance(store, Mapping):
        if isinstance(store, Inner):
            return store
        if isinstance(store, CoreInner):  # a hand-written wrapper with the core methods only
            return CompletedInner(store)
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if isinstance(store, str):
        return open_url(store, storage_options)
    if isinstance(store, MutableMapping) and type(store).__module__.startswith("fsspec"):
        fs = getattr(store, "fs", None)
        if fs is not None:  # an fsspec FSMap
            from .fsspec_store import FsspecInner

            return FsspecInner(fs, store.root)  # type: ignore[attr-defined]  # an FSMap's
    if _is_zarr_store(store):
        from .zarr_store import ZarrStoreInner

        return ZarrStoreInner(store)
    if isinstance(store, MutableMapping):
        from .mapping import MappingInner

        return MappingInner(store)
    raise UsageError(
        f"cannot use {type(store).__name__} as a store: expected a path/URL, a mapping or a zarr Store"
    )


def _is_zarr_store(store: Any) -> bool:
    """Whether ``store`` is a zarr-python 3 ``Store``. An instance of that class can only
    exist once its module ran, so zarr is not imported to answer no (importing it costs a
    command ~0.1 s: a virtual migration's check hands a dict of documents here)."""
    module = sys.modules.get("zarr.abc.store")
    return module is not None and isinstance(store, module.Store)


def unique_suffix() -> str:
    import uuid

    return uuid.uuid4().hex[:12]
