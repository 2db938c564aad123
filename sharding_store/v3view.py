"""A read-only zarr-python 3 view of a draft-era hierarchy: v3.0 without copying.

:class:`DraftV3Store` is a ``zarr.abc.store.Store`` whose key space is the final v3
layout of a draft-era store: a synthesised ``zarr.json`` for every node (from
:mod:`sharding_store.v3_metadata`, the one translation) and default v3 chunk keys
(``a/c/1/0``, ``a/c.1.0``) mapped onto the draft objects (``data/root/a/c1/0``).

Why this works without rewriting anything: a draft shard *is* a v1.0
``sharding_indexed`` shard with ``index_codecs=[bytes little]`` at the end, so a v3
chunk of a sharded array is a whole draft shard object, and a v3 chunk of an unsharded
array is the draft chunk object. Byte ranges are passed straight to the store below,
so zarr's sharding codec reads a shard index with one suffix read and each inner
chunk with one range read, served verbatim.

The draft metadata is read once (:func:`sharding_store.hierarchy.open_hierarchy`) and
cached; :meth:`DraftV3Store.refresh` forgets it. Every write raises
:class:`~sharding_store.errors.ReadOnlyError`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import warnings
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from . import draft_metadata as dm
from .errors import DraftMetadataError, ReadOnlyError
from .hierarchy import DraftHierarchy, inner_of
from .inner import FsspecInner, Inner, RangeRequest, ZarrStoreInner, _slice
from .keys import Coords, parse_chunk_suffix
from .store import ArrayLayout
from .v3_metadata import v3_array_document, v3_chunk_key, v3_group_document

__all__ = ["DraftV3Store", "open_v3"]

ZARR_JSON = "zarr.json"


def _node_prefix(path: str) -> str:
    """Where a node's v3 keys start: ``""`` for the root, ``"a/b/"`` otherwise."""
    return f"{path}/" if path else ""


def _as_range(key: str, byte_range: ByteRequest | None) -> RangeRequest | None:
    """A zarr ``ByteRequest`` as an inner ``(key, start, end)`` request (None: whole object)."""
    if byte_range is None:
        return None
    if isinstance(byte_range, RangeByteRequest):
        return (key, byte_range.start, byte_range.end)
    if isinstance(byte_range, OffsetByteRequest):
        return (key, byte_range.offset, None)
    if isinstance(byte_range, SuffixByteRequest):
        # "the last 0 bytes" is empty, not (start=-0) the whole object
        return (key, -byte_range.suffix, None) if byte_range.suffix > 0 else (key, 0, 0)
    raise TypeError(f"Unexpected byte_range, got {byte_range}.")


def _check_zarr_reads(meta: dm.DraftArrayMeta, document: dict) -> None:
    """Refuse, naming the array, what zarr-python 3 would open but fail to read.

    zarr's sharding codec hashes the chunk spec, fill value included; a structured
    fill value (``numpy.void``) is unhashable, so every read of a sharded structured
    array dies with a bare TypeError (seen in zarr 3.1.6, also for arrays zarr writes
    itself). Probing the parsed fill value keeps this right if zarr changes.
    """
    if not meta.is_sharded:
        return
    import zarr
    from zarr.core.metadata.v3 import ArrayV3Metadata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fill = ArrayV3Metadata.from_dict(document).fill_value
    try:
        hash(fill)
    except TypeError as e:
        key = dm.array_meta_key(meta.path)
        raise DraftMetadataError(
            f"{key}: zarr-python {zarr.__version__} cannot read sharded arrays of data type "
            f"{meta.dtype} (its sharding codec hashes the fill value: {e})",
            key=key,
        ) from None


class _View:
    """What the draft metadata says about the v3 key space (immutable once built)."""

    def __init__(self, hierarchy: DraftHierarchy) -> None:
        self.hierarchy = hierarchy
        self.nodes = hierarchy.nodes
        self.layouts: dict[str, ArrayLayout] = {
            n.path: ArrayLayout.from_meta(n.meta) for n in hierarchy.arrays() if n.meta is not None
        }
        self._documents: dict[str, bytes] = {}

    def document(self, path: str) -> bytes:
        """The v3 ``zarr.json`` of a node, translated on first use (so one array that
        v3 cannot express fails alone, with a DraftMetadataError naming it)."""
        doc = self._documents.get(path)
        if doc is None:
            node = self.nodes[path]
            if node.meta is not None:
                d = v3_array_document(node.meta, index_codecs_checksum=False, index_location="end")
                _check_zarr_reads(node.meta, d)
            else:
                d = v3_group_document(node.attributes)
            doc = self._documents[path] = json.dumps(d, indent=2).encode()
        return doc

    def metadata_path(self, key: str) -> str | None:
        """The node whose ``zarr.json`` ``key`` is, if any."""
        if key == ZARR_JSON:
            path = ""
        elif key.endswith("/" + ZARR_JSON):
            path = key[: -len(ZARR_JSON) - 1]
        else:
            return None
        return path if path in self.nodes else None

    def draft_keys(self, key: str) -> tuple[str, ...]:
        """The draft object(s) behind a v3 chunk key, most likely first; () if none.

        A 0-d array has two spellings of its only draft key (``c0`` as zarr 2.x wrote
        it, ``c`` as the spec draft said); either may exist.
        """
        for path, rest in self._splits(key):
            layout = self.layouts.get(path)
            if layout is None:
                continue
            coords = self._v3_coords(rest, layout)
            if coords is None or not self._in_grid(path, coords):
                continue
            if layout.ndim == 0:
                return (layout.prefix + "c0", layout.prefix + "c")
            return (layout.shard_key(coords),)
        return ()

    @staticmethod
    def _splits(key: str) -> Iterable[tuple[str, str]]:
        """``(node path, rest)`` splits of a key, deepest node first."""
        pos = key.rfind("/")
        while pos != -1:
            yield key[:pos], key[pos + 1 :]
            pos = key.rfind("/", 0, pos)
        yield "", key

    @staticmethod
    def _v3_coords(rest: str, layout: ArrayLayout) -> Coords | None:
        """``c/1/0`` (or ``c.1.0``; ``c`` for 0-d) -> ``(1, 0)``, reusing the draft parser."""
        if layout.ndim == 0:
            return () if rest == "c" else None
        if not rest.startswith("c" + layout.separator):
            return None
        return parse_chunk_suffix("c" + rest[2:], layout.separator, layout.ndim)

    def _in_grid(self, path: str, coords: Coords) -> bool:
        meta = self.nodes[path].meta
        assert meta is not None
        return all(0 <= c < n for c, n in zip(coords, meta.shard_grid_shape))

    def v3_chunk_key_of(self, path: str, draft_key: str) -> str | None:
        """Inverse of :meth:`draft_keys` for one listed draft object (None: not a chunk)."""
        layout = self.layouts[path]
        coords = parse_chunk_suffix(draft_key[len(layout.prefix) :], layout.separator, layout.ndim)
        if coords is None or not self._in_grid(path, coords):
            return None
        return _node_prefix(path) + v3_chunk_key(coords, layout.separator)

    def metadata_keys(self) -> list[str]:
        return [_node_prefix(p) + ZARR_JSON for p in self.nodes]

    def arrays_touching(self, prefix: str) -> list[str]:
        """Arrays that may hold chunk keys starting with ``prefix``."""
        return [
            p for p in self.layouts
            if _node_prefix(p).startswith(prefix) or prefix.startswith(_node_prefix(p))
        ]


class DraftV3Store(Store):
    """A draft-era hierarchy presented as final Zarr v3 (read-only, nothing copied).

    ``store_or_url`` is anything :func:`sharding_store.hierarchy.inner_of` accepts: a
    path/URL (with ``storage_options``), an ``fsspec.FSMap``, a mapping, an inner
    adapter, a :class:`~sharding_store.ShardingStore`, or a zarr-python 3 ``Store``.
    A zarr-3 store is awaited directly on zarr's event loop; every other store is
    synchronous and is called in worker threads (``asyncio.to_thread``) so that
    concurrent chunk reads overlap and the loop never blocks.

    The store pickles (for dask) when the store below does: fsspec filesystems
    pickle by their storage options; the cached metadata travels along.
    """

    def __init__(
        self,
        store_or_url: Any,
        *,
        storage_options: Mapping[str, Any] | None = None,
        read_only: bool = True,
    ) -> None:
        if not read_only:
            raise ReadOnlyError(f"{self._describe(store_or_url)}: a draft-era v3 view is read-only")
        super().__init__(read_only=True)
        self._source = self._describe(store_or_url)
        self._async_store: Store | None = None
        self._inner: Inner | None = None
        if isinstance(store_or_url, Store):
            self._async_store = store_or_url
        else:
            inner = inner_of(store_or_url, storage_options)
            if isinstance(inner, ZarrStoreInner):
                self._async_store = inner.store
            else:
                self._inner = inner
        self._view: _View | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _describe(store_or_url: Any) -> str:
        if isinstance(store_or_url, (str, os.PathLike)):
            return os.fspath(store_or_url)
        return type(store_or_url).__name__

    # ------------------------------------------------------------ metadata cache
    def _load_view(self) -> _View:
        """Read the draft metadata once (synchronous: call from a thread or sync code)."""
        with self._lock:
            if self._view is None:
                inner = self._inner if self._inner is not None else ZarrStoreInner(self._async_store)
                self._view = _View(DraftHierarchy(inner, location=self._source, strict=False))
            return self._view

    async def _get_view(self) -> _View:
        view = self._view
        if view is None:
            view = await asyncio.to_thread(self._load_view)
        return view

    def hierarchy(self) -> DraftHierarchy:
        """The draft hierarchy behind this view (loaded on first use, then cached)."""
        return self._load_view().hierarchy

    def refresh(self) -> None:
        """Forget the cached draft metadata (after someone changed the draft store)."""
        with self._lock:
            self._view = None

    # ------------------------------------------------------------- zarr plumbing
    def __eq__(self, other: object) -> bool:
        return isinstance(other, DraftV3Store) and self._identity() == other._identity()

    __hash__ = None  # type: ignore[assignment]  # mutable cache; equality is by location

    def _identity(self) -> tuple:
        """Two views are equal when they read the same objects."""
        if self._async_store is not None:
            return ("zarr", self._async_store)
        if isinstance(self._inner, FsspecInner):
            # not the fs object: fsspec caches instances per thread, and zarr builds
            # stores on its own loop thread, so equal locations hold unequal instances
            fs = self._inner.fs
            options = json.dumps(fs.storage_options, sort_keys=True, default=repr)
            return ("fsspec", type(fs), options, self._inner.root)
        return ("object", id(self._inner))

    def __repr__(self) -> str:
        return f"DraftV3Store({self._source!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def with_read_only(self, read_only: bool = False) -> DraftV3Store:
        """A new (unopened) view of the same data; only ``read_only=True`` is possible."""
        if not read_only:
            raise ReadOnlyError(f"{self._source}: a draft-era v3 view cannot be made writable")
        clone = object.__new__(type(self))
        clone.__setstate__({**self.__getstate__(), "_is_open": False})
        return clone

    async def _open(self) -> None:
        await super()._open()
        await self._get_view()  # a store without a draft hierarchy fails here, clearly

    @property
    def supports_writes(self) -> bool:
        return False

    @property
    def supports_deletes(self) -> bool:
        return False

    @property
    def supports_listing(self) -> bool:
        return True

    @property
    def supports_consolidated_metadata(self) -> bool:
        return False

    # --------------------------------------------------------------------- reads
    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        _as_range(key, byte_range)  # refuse a malformed byte_range before any I/O
        (value,) = await self._read([(key, byte_range)])
        if value is None:
            return None
        return (prototype or default_buffer_prototype()).buffer.from_bytes(value)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        requests = list(key_ranges)
        for key, byte_range in requests:
            _as_range(key, byte_range)
        values = await self._read(requests)
        proto = prototype or default_buffer_prototype()
        return [None if v is None else proto.buffer.from_bytes(v) for v in values]

    async def _read(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """Metadata from the cache, chunks from the store below (all inner I/O at once)."""
        view = await self._get_view()
        out: list[bytes | None] = [None] * len(requests)
        pending: list[tuple[int, tuple[str, ...], ByteRequest | None]] = []
        for i, (key, byte_range) in enumerate(requests):
            path = view.metadata_path(key)
            if path is not None:
                doc = view.document(path)
                r = _as_range(key, byte_range)
                out[i] = doc if r is None else _slice(doc, r[1], r[2])
                continue
            draft_keys = view.draft_keys(key)
            if draft_keys:
                pending.append((i, draft_keys, byte_range))
        # a 0-d array's first spelling may be missing: try the next, as a second round
        while pending:
            values = await self._inner_read([(dk[0], br) for _, dk, br in pending])
            retry = []
            for (i, dk, br), value in zip(pending, values):
                if value is not None:
                    out[i] = value
                elif len(dk) > 1:
                    retry.append((i, dk[1:], br))
            pending = retry
        return out

    async def _inner_read(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        if self._async_store is not None:
            proto = default_buffer_prototype()
            bufs = await asyncio.gather(
                *(self._async_store.get(k, proto, byte_range=br) for k, br in requests)
            )
            return [None if b is None else b.to_bytes() for b in bufs]
        return await asyncio.to_thread(self._sync_read, requests)

    def _sync_read(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """Whole objects with ``get``, ranges with one batched ``get_ranges`` call."""
        assert self._inner is not None
        out: list[bytes | None] = [None] * len(requests)
        ranged: list[tuple[int, RangeRequest]] = []
        for i, (key, byte_range) in enumerate(requests):
            r = _as_range(key, byte_range)
            if r is None:
                out[i] = self._inner.get(key)
            else:
                ranged.append((i, r))
        if ranged:
            for (i, _), value in zip(ranged, self._inner.get_ranges([r for _, r in ranged])):
                out[i] = value
        return out

    async def exists(self, key: str) -> bool:
        view = await self._get_view()
        if view.metadata_path(key) is not None:
            return True
        for draft_key in view.draft_keys(key):
            if self._async_store is not None:
                found = await self._async_store.exists(draft_key)
            else:
                found = await asyncio.to_thread(self._inner.exists, draft_key)  # type: ignore[union-attr]
            if found:
                return True
        return False

    async def getsize(self, key: str) -> int:
        view = await self._get_view()
        path = view.metadata_path(key)
        if path is not None:
            return len(view.document(path))
        for draft_key in view.draft_keys(key):
            size = await self._inner_size(draft_key)
            if size is not None:
                return size
        raise FileNotFoundError(key)

    async def _inner_size(self, draft_key: str) -> int | None:
        if self._async_store is not None:
            try:
                return await self._async_store.getsize(draft_key)
            except FileNotFoundError:
                return None
        sizer = getattr(self._inner, "size", None)
        if sizer is not None:
            return await asyncio.to_thread(sizer, draft_key)
        (value,) = await self._inner_read([(draft_key, None)])
        return None if value is None else len(value)

    # ------------------------------------------------------------------- listing
    async def list(self) -> AsyncIterator[str]:
        for key in await self._list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """Names directly below ``prefix``: metadata gives the nodes; chunk keys are
        listed only for an array whose own key space ``prefix`` is in."""
        view = await self._get_view()
        prefix = prefix.rstrip("/")
        base = _node_prefix(prefix)
        names = {k[len(base) :].split("/")[0] for k in view.metadata_keys() if k.startswith(base)}
        for path in view.layouts:
            if base.startswith(_node_prefix(path)):
                keys = await self._array_chunk_keys(view, path)
                names.update(k[len(base) :].split("/")[0] for k in keys if k.startswith(base))
        for name in sorted(names):
            yield name

    async def _list_prefix(self, prefix: str) -> list[str]:
        view = await self._get_view()
        keys = [k for k in view.metadata_keys() if k.startswith(prefix)]
        for path in view.arrays_touching(prefix):
            keys += [k for k in await self._array_chunk_keys(view, path) if k.startswith(prefix)]
        return sorted(set(keys))

    async def _array_chunk_keys(self, view: _View, path: str) -> list[str]:
        """The v3 chunk keys of one array's existing draft objects."""
        prefix = view.layouts[path].prefix
        if self._async_store is not None:
            draft = [k async for k in self._async_store.list_prefix(prefix)]
        else:
            draft = await asyncio.to_thread(lambda: list(self._inner.list_prefix(prefix)))  # type: ignore[union-attr]
        v3 = (view.v3_chunk_key_of(path, k) for k in draft)
        return [k for k in v3 if k is not None]

    # -------------------------------------------------------------------- writes
    def _refuse(self, what: str, key: str | None = None) -> ReadOnlyError:
        where = f"{key!r} in " if key is not None else ""
        return ReadOnlyError(f"cannot {what} {where}{self!r}: a draft-era v3 view is read-only", key=key)

    def _check_writable(self) -> None:
        raise self._refuse("write")

    async def set(self, key: str, value: Buffer) -> None:
        raise self._refuse("set", key)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        raise self._refuse("set", key)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        raise self._refuse("set keys")

    async def delete(self, key: str) -> None:
        raise self._refuse("delete", key)

    async def delete_dir(self, prefix: str) -> None:
        raise self._refuse("delete", prefix)

    async def clear(self) -> None:
        raise self._refuse("clear")


def open_v3(store_or_url: Any, path: str = "", *, storage_options: Mapping[str, Any] | None = None) -> Any:
    """Open the node at ``path`` of a draft-era store as a read-only zarr-python 3
    ``Array`` or ``Group``, reading the draft objects in place (see :class:`DraftV3Store`).

    Raises StoreNotFoundError if there is no draft hierarchy or no node at ``path``,
    and DraftMetadataError (naming the array) for an array v3 cannot express.
    """
    import zarr

    store = store_or_url if isinstance(store_or_url, DraftV3Store) else DraftV3Store(
        store_or_url, storage_options=storage_options
    )
    hierarchy = store.hierarchy()
    damaged = hierarchy.damaged.get(dm.normalize_path(path))
    if damaged is not None:  # an unreadable document: say why, rather than "not found"
        raise damaged
    node = hierarchy.node(path)
    if node.kind == "array":
        return zarr.open_array(store=store, path=node.path, mode="r", zarr_format=3)
    return zarr.open_group(store=store, path=node.path, mode="r", zarr_format=3, use_consolidated=False)
