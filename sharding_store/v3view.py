"""A read-only zarr-python 3 view of a draft-era hierarchy: v3.0 without copying.

:class:`DraftV3Store` is a ``zarr.abc.store.Store`` whose key space is the final v3
layout of a draft-era store: a synthesised ``zarr.json`` for every node (from
:mod:`sharding_store.v3_metadata`, the one translation) and default v3 chunk keys
(``a/c/1/0``, ``a/c.1.0``) mapped onto the draft objects (``data/root/a/c1/0``).

Why this works without rewriting anything: a draft shard *is* a v1.0
``sharding_indexed`` shard with ``index_codecs=[bytes little]`` at the end, so a v3
chunk of a sharded array is a whole draft shard object, and a v3 chunk of an unsharded
array is the draft chunk object.

One read path: chunks are served through the same checks as
:func:`~sharding_store.array.open_draft` — the shard engine
(:mod:`sharding_store.engine`: full index validation, consistent reads) and a bounded
check-decode of every payload served (:mod:`sharding_store.chunk_codec`), so damage
surfaces as :class:`~sharding_store.errors.ShardCorruptError` or
:class:`~sharding_store.errors.ChunkDecodeError` naming the key, never as zarr's bare
errors or wrong values; an unsharded array whose objects are really shards (the
zarr-python 2.x ``resize()`` defect) is refused. zarr's sharding codec reads a shard's
index with one suffix read: the view answers with the validated index whose offsets
*name* the chunks (``CHUNK_TOKEN + n`` for the shard's n-th chunk) instead of locating
them, so the range read that follows asks for a chunk, which the engine reads (one range
read, checked against the index's version) from the shard as it is now — a writer
replacing the shard in between cannot make it serve another chunk's bytes. A shard read
whole is one request (one snapshot), validated and returned as it is; so is any byte
range that does not name a chunk.

The draft metadata is read once (:func:`sharding_store.hierarchy.open_hierarchy`) and
cached; :meth:`DraftV3Store.refresh` forgets it. Every write raises
:class:`~sharding_store.errors.ReadOnlyError`.

A store of the 2023 intermediate generation (per-node ``zarr.json`` spelled as before v1.0)
is served by :class:`Draft2023V3Store`: its keys are already final, so only the documents
change (normalised by :mod:`sharding_store.meta2023`, the one translation; implicit groups
get a group document); data objects are served byte for byte, and every shard index zarr
reads is checked first (an undeclared index is decided from the bytes, never guessed).
:func:`open_v3` tells the generation from the documents and picks the view.
"""

from __future__ import annotations

import asyncio
import builtins
import itertools
import json
import math
import os
import threading
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from . import _native
from . import draft_metadata as dm
from . import meta2023
from .chunk_codec import ChunkCodec, codec_for
from .engine import ArrayLayout, ChunkRange, ShardEngine
from .errors import ChunkDecodeError, DraftMetadataError, ReadOnlyError, ShardCorruptError, StoreNotFoundError
from .hierarchy import (
    _UNREAD,
    DraftHierarchy,
    Generation,
    V3Walk,
    detect_generation,
    draft_entry_point,
    inner_of,
    walk_v3_nodes,
)
from .inspect import decide_reading, refuse_lost_transformer
from .keys import Coords, local_to_global, parse_chunk_suffix
from .shard_index import ENTRY_NBYTES, MAX_UINT64, ShardIndex, index_nbytes, index_reading
from .stores import Inner, RangeRequest, slice_range
from .v3_metadata import v3_array_document, v3_chunk_key, v3_group_document

__all__ = ["DraftV3Store", "Draft2023V3Store", "open_v3"]

ZARR_JSON = "zarr.json"
#: offsets of the shard indices the view serves are ``CHUNK_TOKEN + n`` for a shard's n-th
#: chunk (C order): far beyond any object, so a range naming a chunk is never a real range
CHUNK_TOKEN = 2**62
#: shard indices kept per array between zarr's index read and its chunk reads
INDEX_CACHE_SIZE = 1024
#: per thread, a check-decode buffer up to this size is kept for the next shard
SCRATCH_KEEP = 64 * 2**20
_SCRATCH = threading.local()


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


def _check_zarr_reads(meta: dm.DraftArrayMeta, document: dict[str, Any]) -> None:
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


class _ArrayReader:
    """How the view serves one array's chunk keys: shards through the shard engine, every
    payload served check-decoded (bounded) so that damage is named, not passed to zarr."""

    def __init__(self, inner: Inner, meta: dm.DraftArrayMeta) -> None:
        self.inner = inner
        self.meta = meta
        self.layout = ArrayLayout.from_meta(meta)
        self.engine: ShardEngine | None = None
        if meta.is_sharded:
            self.engine = ShardEngine(inner, self.layout, index_cache_size=INDEX_CACHE_SIZE)
        self._codec: ChunkCodec | None = None

    def check(self, payload: Any, shard_key: str, local: Coords | None) -> None:
        """Decode ``payload`` into scratch memory (bounded by the chunk's size): raises
        :class:`~sharding_store.errors.ChunkDecodeError` naming the chunk's draft key when it
        is not one chunk (``local``: its coordinates in shard ``shard_key``; ``None``: the
        object is the chunk)."""
        if self._codec is None:
            self._codec = codec_for(self.meta)
        nbytes = self._codec.nbytes
        buf = getattr(_SCRATCH, "buf", None)
        if buf is None or buf.nbytes < nbytes:
            buf = _SCRATCH.buf = np.empty(max(nbytes, 1 << 16), dtype=np.uint8)
        row = buf[:nbytes]
        try:
            self._codec.decode_into(payload, row)
        except ChunkDecodeError:  # again, naming the chunk (its key is made only when needed)
            key = shard_key if local is None else self.chunk_key(shard_key, local)
            self._codec.decode_into(payload, row, key=key)

    def check_shard(self, blob: bytes, shard_key: str, live: list[tuple[Coords, int, int]]) -> None:
        """:meth:`check` for every live chunk ``(local, offset, nbytes)`` of a whole shard object,
        decoded in one call (:meth:`~sharding_store.chunk_codec.ChunkCodec.decode_many`)."""
        if not live:
            return
        if self._codec is None:
            self._codec = codec_for(self.meta)
        nbytes = self._codec.nbytes
        need = nbytes * len(live)
        buf = getattr(_SCRATCH, "buf", None)
        if buf is None or buf.nbytes < need:
            buf = np.empty(max(need, 1 << 16), dtype=np.uint8)
            if need <= SCRATCH_KEEP:
                _SCRATCH.buf = buf
        data = np.frombuffer(blob, dtype=np.uint8)
        self._codec.decode_many(
            data, _native.data_address(data), range(len(live)), [o for _, o, _ in live], [n for _, _, n in live],
            _native.data_address(buf), key_of=lambda i: self.chunk_key(shard_key, live[i][0]),
        )

    def chunk_key(self, shard_key: str, local: Coords) -> str:
        """The draft key of a shard's chunk (what errors name, as ``open_draft``'s do)."""
        if self.layout.ndim == 0:
            return shard_key
        shard = self.layout.parse(shard_key)
        assert shard is not None and self.layout.chunks_per_shard is not None
        return self.layout.chunk_key(local_to_global(shard, local, self.layout.chunks_per_shard))

    def serve(self, key: str, byte_range: RangeRequest | None) -> bytes | None:
        """The bytes of draft object ``key`` (``byte_range``: a range of it) as zarr may ask."""
        engine = self.engine
        if engine is None:  # unsharded: one object per chunk
            if byte_range is not None:
                return self.inner.get_ranges([byte_range])[0]  # a part of a chunk: as it is
            value = self.inner.get(key)
            if value is not None:
                self.check(value, key, None)
            return value
        if byte_range is None:  # a whole shard: one snapshot, validated, every chunk checked
            contents = engine.read_shard(key)
            if contents is None:
                return None
            self.check_shard(contents.blob, key, list(contents.index.live()))
            return contents.blob
        _, start, end = byte_range
        if start < 0 and end is None and -start == engine.index_nbytes:  # zarr reads the index
            found = engine.read_index(key, use_cache=False)  # the cache only links it to the chunk reads
            return None if found.index is None else _naming_index(found.index.entries)
        if end is not None and start >= CHUNK_TOKEN:  # zarr reads a chunk our index named
            n = start - CHUNK_TOKEN
            if n >= engine.n_entries:
                return None
            local = _unravel(n, engine.cps)
            payload = engine.read_ranges([ChunkRange(key, local)])[0]
            if payload is not None:  # None: erased since the index was read (zarr fills it)
                self.check(payload, key, local)
            return payload
        return self.inner.get_ranges([byte_range])[0]  # any other range: the object's bytes


def _unravel(n: int, shape: Coords) -> Coords:
    """``np.unravel_index(n, shape)`` (C order) as a tuple of ints, without numpy's overhead."""
    out = []
    for extent in reversed(shape):
        n, c = divmod(n, extent)
        out.append(c)
    return tuple(reversed(out))


def _naming_index(entries: np.ndarray) -> bytes:
    """A validated shard index as the view serves it: each live entry's offset names the chunk
    (``CHUNK_TOKEN + n``), its length is the real one; absent chunks keep the sentinel."""
    flat = entries.reshape(-1, 2)
    out = np.full(flat.shape, MAX_UINT64, dtype="<u8")
    live = np.flatnonzero(flat[:, 0] != MAX_UINT64)
    out[live, 0] = live.astype(np.uint64) + np.uint64(CHUNK_TOKEN)
    out[live, 1] = flat[live, 1]
    return out.tobytes()


class _View:
    """What the draft metadata says about the v3 key space (immutable once built)."""

    def __init__(self, hierarchy: DraftHierarchy) -> None:
        self.hierarchy = hierarchy
        self.nodes = hierarchy.nodes
        self.layouts: dict[str, ArrayLayout] = {
            n.path: ArrayLayout.from_meta(n.meta) for n in hierarchy.arrays() if n.meta is not None
        }
        self.readers: dict[str, _ArrayReader] = {
            n.path: _ArrayReader(hierarchy.inner, n.meta) for n in hierarchy.arrays() if n.meta is not None
        }
        self._documents: dict[str, bytes] = {}

    def document(self, path: str) -> bytes:
        """The v3 ``zarr.json`` of a node, translated on first use (so one array that
        v3 cannot express fails alone, with a DraftMetadataError naming it). An unsharded
        array whose objects are really shards is refused here, as ``open_draft`` refuses it
        (one tail read, once): serving its shards as chunks would give wrong values."""
        doc = self._documents.get(path)
        if doc is None:
            node = self.nodes[path]
            if node.meta is not None:
                d = v3_array_document(node.meta, index_codecs_checksum=False, index_location="end")
                _check_zarr_reads(node.meta, d)
                refuse_lost_transformer(self.hierarchy.inner, node.meta)
            else:
                d = v3_group_document(node.attributes)
            doc = self._documents[path] = json.dumps(d, indent=2).encode()
        return doc

    def cached_document(self, path: str) -> bytes | None:
        return self._documents.get(path)

    def metadata_path(self, key: str) -> str | None:
        """The node whose ``zarr.json`` ``key`` is, if any."""
        if key == ZARR_JSON:
            path = ""
        elif key.endswith("/" + ZARR_JSON):
            path = key[: -len(ZARR_JSON) - 1]
        else:
            return None
        return path if path in self.nodes else None

    def draft_keys(self, key: str) -> tuple[str, tuple[str, ...]] | None:
        """The array and the draft object(s) behind a v3 chunk key, most likely first; None if none.

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
                return path, (layout.prefix + "c0", layout.prefix + "c")
            return path, (layout.shard_key(coords),)
        return None

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


class _Pickled:
    """An object with a ``_lock`` that pickles without it (a new lock after unpickling)."""

    _lock: threading.Lock

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class _ReadOnlyView(_Pickled, Store):
    """What both views share: construction from anything :func:`~sharding_store.hierarchy.inner_of`
    accepts, equality by location, pickling, and refusing every write."""

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
        self._inner: Inner = inner_of(store_or_url, storage_options)
        self._view: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def _describe(store_or_url: Any) -> str:
        if isinstance(store_or_url, (str, os.PathLike)):
            return os.fspath(store_or_url)
        return type(store_or_url).__name__

    def refresh(self) -> None:
        """Forget the cached metadata (after someone changed the draft store)."""
        with self._lock:
            self._view = None

    # ------------------------------------------------------------- zarr plumbing
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._identity() == other._identity()

    __hash__ = None  # type: ignore[assignment]  # mutable cache; equality is by location

    def _identity(self) -> Any:
        """Two views are equal when they read the same objects (the store's canonical
        location: not the fs object, since fsspec caches instances per thread and zarr
        builds stores on its own loop thread, so equal locations hold unequal instances)."""
        return self._inner.location()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source!r})"

    def with_read_only(self, read_only: bool = False) -> Any:
        """A new (unopened) view of the same data; only ``read_only=True`` is possible."""
        if not read_only:
            raise ReadOnlyError(f"{self._source}: a draft-era v3 view cannot be made writable")
        clone = object.__new__(type(self))
        clone.__setstate__({**self.__getstate__(), "_is_open": False})
        return clone

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
        raise NotImplementedError

    async def list(self) -> AsyncIterator[str]:
        for key in await self._list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._list_prefix(prefix):
            yield key

    async def _list_prefix(self, prefix: str) -> builtins.list[str]:  # ``list``: the method above
        raise NotImplementedError


class DraftV3Store(_ReadOnlyView):
    """A draft-era hierarchy presented as final Zarr v3 (read-only, nothing copied).

    ``store_or_url`` is anything :func:`sharding_store.hierarchy.inner_of` accepts: a
    path/URL (with ``storage_options``), an ``fsspec.FSMap``, a mapping, an inner
    adapter, a :class:`~sharding_store.ShardingStore`, or a zarr-python 3 ``Store``.
    Reads go through the store interface (and the shard engine) in worker threads
    (``asyncio.to_thread``), so concurrent chunk reads overlap and the loop never blocks.

    The store pickles (for dask) when the store below does: fsspec filesystems
    pickle by their storage options; the cached metadata travels along.
    """

    # ------------------------------------------------------------ metadata cache
    def _load_view(self) -> _View:
        """Read the draft metadata once (synchronous: call from a thread or sync code)."""
        with self._lock:
            if self._view is None:
                raw = self.__dict__.pop("_entry_point", _UNREAD)  # read by open_v3 already: used once
                self._view = _View(DraftHierarchy(self._inner, location=self._source, strict=False, entry_point=raw))
            return self._view

    async def _get_view(self) -> _View:
        view = self._view
        if view is None:
            view = await asyncio.to_thread(self._load_view)
        return view

    def hierarchy(self) -> DraftHierarchy:
        """The draft hierarchy behind this view (loaded on first use, then cached)."""
        return self._load_view().hierarchy

    async def _open(self) -> None:
        await super()._open()
        await self._get_view()  # a store without a draft hierarchy fails here, clearly

    async def _read(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """Metadata from the cache, chunks through the array's reader (in a worker thread)."""
        view = await self._get_view()
        out: list[bytes | None] = [None] * len(requests)
        pending: list[tuple[int, str, tuple[str, ...], RangeRequest | None]] = []
        for i, (key, byte_range) in enumerate(requests):
            path = view.metadata_path(key)
            if path is not None:
                doc = await self._document(view, path)
                r = _as_range(key, byte_range)
                out[i] = doc if r is None else slice_range(doc, r[1], r[2])
                continue
            found = view.draft_keys(key)
            if found is not None:
                array, draft_keys = found
                pending.append((i, array, draft_keys, _as_range(draft_keys[0], byte_range)))
        if pending:
            values = await asyncio.to_thread(self._serve, view, pending)
            for (i, _, _, _), value in zip(pending, values):
                out[i] = value
        return out

    @staticmethod
    async def _document(view: _View, path: str) -> bytes:
        doc = view.cached_document(path)
        if doc is None:  # translating an array may read (the lost-transformer probe): off the loop
            doc = await asyncio.to_thread(view.document, path)
        return doc

    @staticmethod
    def _serve(view: _View, pending: Sequence[tuple[int, str, tuple[str, ...], RangeRequest | None]]) -> list[bytes | None]:
        """Each chunk request through its array's reader; a 0-d array's second spelling of
        its only key is tried when the first is missing."""
        out: list[bytes | None] = []
        for _, array, draft_keys, r in pending:
            reader = view.readers[array]
            value = None
            for draft_key in draft_keys:
                value = reader.serve(draft_key, None if r is None else (draft_key, r[1], r[2]))
                if value is not None:
                    break
            out.append(value)
        return out

    async def exists(self, key: str) -> bool:
        view = await self._get_view()
        if view.metadata_path(key) is not None:
            return True
        found = view.draft_keys(key)
        for draft_key in () if found is None else found[1]:
            if await asyncio.to_thread(self._inner.exists, draft_key):
                return True
        return False

    async def getsize(self, key: str) -> int:
        view = await self._get_view()
        path = view.metadata_path(key)
        if path is not None:
            return len(await self._document(view, path))
        found = view.draft_keys(key)
        for draft_key in () if found is None else found[1]:
            size = await asyncio.to_thread(self._inner.size, draft_key)
            if size is not None:
                return size
        raise FileNotFoundError(key)

    # ------------------------------------------------------------------- listing
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
        draft = await asyncio.to_thread(lambda: list(self._inner.list_prefix(prefix)))
        v3 = (view.v3_chunk_key_of(path, k) for k in draft)
        return [k for k in v3 if k is not None]



# --------------------------------------------------------------------------- the 2023 generation


@dataclass(frozen=True)
class _IndexCheck:
    """How the view checks the shard indices of one sharded array of the 2023 generation.

    ``checksum``: whether the served document declares a CRC32C after the index; ``reading``:
    for an index the source document did not declare, the reading the shard bytes decided
    (every shard served must read the same way), else None (declared: the index is
    validated as declared)."""

    path: str
    cps: Coords
    checksum: bool
    reading: str | None

    @property
    def n(self) -> int:
        return math.prod(self.cps)

    @property
    def served_nbytes(self) -> int:
        """The index size zarr asks for (what the served document declares)."""
        return index_nbytes(self.cps, self.checksum)

    @property
    def tail_nbytes(self) -> int:
        """The bytes read from a shard's end to check its index (an undeclared index: enough
        for both readings)."""
        return index_nbytes(self.cps, True) if self.reading is not None else self.served_nbytes

    def validate(self, tail: bytes, size: int, key: str) -> None:
        """Raise :class:`ShardCorruptError` naming ``key`` unless the end ``tail`` of the shard
        (``size`` bytes in all) holds a valid index read as the served document says."""
        if self.reading is None:
            nbytes = self.served_nbytes
            if size < nbytes or len(tail) < nbytes:
                raise ShardCorruptError(f"{key}: shorter ({size} bytes) than its {nbytes}-byte shard index", key=key)
            ShardIndex.from_bytes(tail[len(tail) - nbytes:], self.cps, checksum=self.checksum, key=key,
                                  payload_limit=size - nbytes)
            return
        found = index_reading(tail, self.cps, size, key=key)  # neither reading: ShardCorruptError
        if found == self.reading:
            return
        if self.reading == "plain" and found == "crc32c-hidden":
            body = ENTRY_NBYTES * self.n  # both readings hold with the same chunks: the plain one is right
            try:
                ShardIndex.from_bytes(tail[len(tail) - body:], self.cps, key=key, payload_limit=size - body)
                return
            except ShardCorruptError:
                pass
        raise ShardCorruptError(
            f"{key}: array '{self.path or '/'}' declares no index_codecs and its shards disagree: this shard's index "
            f"reads as {found!r}, the array's first shard as {self.reading!r}; refusing to guess",
            key=key,
        )


def _sharding_config(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The configuration of a ``sharding_indexed`` whose index the stored objects carry as
    they are: the only codec. After a bytes->bytes codec the index is inside an encoded
    object (valid v1.0): its objects are passed through and zarr decodes and checks them."""
    codecs = doc.get("codecs") or []
    first = codecs[0] if len(codecs) == 1 else None
    if isinstance(first, dict) and first.get("name") == "sharding_indexed":
        return first["configuration"]
    return None


def _origin_key(doc: dict[str, Any]) -> str:
    """The key (relative to the array) of the first chunk of the grid of a final array document."""
    cke = doc["chunk_key_encoding"]
    ndim = len(doc["shape"])
    default = cke["name"] == "default"
    sep = (cke.get("configuration") or {}).get("separator", "/" if default else ".")
    coords = sep.join("0" * ndim)
    if default:
        return "c" + (sep + coords if ndim else "")
    return coords if ndim else "0"


def _checkable_index(cfg: dict[str, Any]) -> bool | None:
    """Whether a declared index chain is the plain little-endian table (with a CRC32C: True,
    without: False) at the end of the shard, which the view validates; None otherwise (zarr
    reads it as declared)."""
    codecs = cfg.get("index_codecs") or []
    names = [c if isinstance(c, str) else c.get("name") for c in codecs]
    if cfg.get("index_location", "end") != "end" or names not in (["bytes"], ["bytes", "crc32c"]):
        return None
    first = codecs[0]
    if not isinstance(first, dict) or (first.get("configuration") or {}).get("endian") != "little":
        return None
    return names[-1] == "crc32c"


class _View2023(_Pickled):
    """What the node documents of a 2023 hierarchy say (one walk; documents normalised once)."""

    def __init__(self, inner: Inner, walk: V3Walk) -> None:
        self.inner = inner
        self.normalised: dict[str, meta2023.Normalised] = {}
        self.damaged: dict[str, DraftMetadataError] = {}
        for node in walk.nodes:
            try:
                self.normalised[node.path] = meta2023.normalise_node(node.raw, node.key)
            except DraftMetadataError as e:
                self.damaged[node.path] = e
        self.implicit = [p for p in walk.implicit if p not in self.normalised and p not in self.damaged]
        self.arrays = {p: n for p, n in self.normalised.items() if n.node_type == "array"}
        self.doc_keys = {_node_prefix(p) + ZARR_JSON: p for p in [*self.normalised, *self.implicit]}
        self._documents: dict[str, bytes] = {}
        self._checks: dict[str, _IndexCheck | None] = {}
        self._lock = threading.Lock()

    def document(self, path: str) -> bytes:
        """The final ``zarr.json`` of a node (an undeclared shard index decided on first use)."""
        doc = self._documents.get(path)
        if doc is not None:
            return doc
        with self._lock:
            doc = self._documents.get(path)
            if doc is None:
                norm = self.normalised.get(path)
                if norm is None:  # an implicit group
                    d: dict[str, Any] = {"zarr_format": 3, "node_type": "group", "attributes": {}}
                    self._checks[path] = None
                else:
                    d = self._decide(path, norm)
                doc = self._documents[path] = json.dumps(d, indent=2).encode()
        return doc

    def _decide(self, path: str, norm: meta2023.Normalised) -> dict[str, Any]:
        """The served document of a node, and how its shard indices are checked."""
        doc = norm.document
        cfg = _sharding_config(doc) if norm.node_type == "array" else None
        if cfg is None:
            if norm.hidden_checksum is None:  # undeclared index inside an encoded shard: undecidable
                key = _node_prefix(path) + ZARR_JSON
                raise DraftMetadataError(f"{key}: a shard index without index_codecs behind another codec cannot "
                                         "be decided from the bytes", key=key)
            self._checks[path] = None
            return doc
        grid = doc["chunk_grid"]["configuration"]["chunk_shape"]
        cps = tuple(g // c for g, c in zip(grid, cfg["chunk_shape"]))
        if norm.hidden_checksum is not None:
            checksum = _checkable_index(cfg)
            self._checks[path] = None if checksum is None else _IndexCheck(path, cps, checksum, None)
            return doc
        if cfg.get("index_location") != "end":
            key = _node_prefix(path) + ZARR_JSON
            raise DraftMetadataError(f"{key}: an undeclared shard index must be at the end to be decided from the bytes",
                                     key=key)
        reading = self._first_reading(path, doc, math.prod(cps))
        served = "plain" if reading == "plain" else "crc32c-hidden"  # no shard yet: as migrate declares
        self._checks[path] = _IndexCheck(path, cps, served == "crc32c-hidden", served)
        return norm.document_for(served)  # type: ignore[arg-type]

    def _first_reading(self, path: str, doc: dict[str, Any], n: int) -> str:
        """The reading of the first shard whose tail decides (``"none"``: no shard): the grid's
        first shard if it exists (no listing), else the array's objects as listed. Objects that
        decide nothing are passed over (at most :data:`DECIDE_TRIES`); every other shard is
        checked when it is served. ShardCorruptError (the first one's) when none decides."""
        prefix = _node_prefix(path)
        origin = prefix + _origin_key(doc)

        def listed() -> Iterator[str]:  # listed only if the grid's first shard decides nothing
            yield from (k for k in self.inner.list_prefix(prefix) if k not in (prefix + ZARR_JSON, origin))

        first_error: ShardCorruptError | None = None
        tries = 0
        for key in itertools.chain([origin], listed()):
            try:
                reading = decide_reading(self.inner, path, [(key, None)], n, skip_absent=True)
            except ShardCorruptError as e:
                first_error = first_error or e
                tries += 1
                if tries >= DECIDE_TRIES:
                    break
                continue
            if reading != "none":  # "none": the object is absent
                return reading
        if first_error is not None:
            raise first_error
        return "none"

    def check(self, path: str) -> _IndexCheck | None:
        if path not in self._checks:
            self.document(path)
        return self._checks[path]

    def array_of(self, key: str) -> str | None:
        """The array whose directory holds data key ``key`` (None: no array's)."""
        for path, rest in _View._splits(key):
            if path in self.arrays:
                return path if rest and rest != ZARR_JSON else None
            if path in self.damaged:
                return None
        return None

    def serve(self, key: str, byte_range: RangeRequest | None) -> bytes | None:
        """The bytes of data object ``key`` (or a range of it), as they are; an index that zarr
        reads (a suffix read of its declared size) and a shard read whole are checked first."""
        path = self.array_of(key)
        if path is None:
            return None
        check = self.check(path)
        inner = self.inner
        if check is None:
            return inner.get(key) if byte_range is None else inner.get_ranges([byte_range])[0]
        if byte_range is None:  # a whole shard: one snapshot, its index checked
            blob = inner.get(key)
            if blob is not None:
                check.validate(blob[max(0, len(blob) - check.tail_nbytes):], len(blob), key)
            return blob
        _, start, end = byte_range
        if end is None and start == -check.served_nbytes:  # zarr reads the index
            tail = inner.get_tails([(key, check.tail_nbytes)])[0]
            if tail is None:
                return None
            size = tail.size if tail.size is not None else inner.size(key)
            if size is None:
                return None
            check.validate(tail.data, size, key)
            return tail.data[len(tail.data) - check.served_nbytes:] if len(tail.data) >= check.served_nbytes else tail.data
        return inner.get_ranges([byte_range])[0]


#: objects an undeclared shard index is decided from at most, before the view gives up
DECIDE_TRIES = 4


class _ReadCache:
    """Remembers what the generation check reads (documents, listings), so that the walk that
    follows is served from memory: every node document is read once."""

    def __init__(self, inner: Inner) -> None:
        self._inner = inner
        self._gets: dict[str, bytes | None] = {}
        self._dirs: dict[str, tuple[list[str], list[str]]] = {}

    def get(self, key: str) -> bytes | None:
        if key not in self._gets:
            self._gets[key] = self._inner.get(key)
        return self._gets[key]

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        if prefix not in self._dirs:
            self._dirs[prefix] = self._inner.list_dir(prefix)
        return self._dirs[prefix]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _walk_2023(inner: Inner, raw: bytes | None) -> V3Walk | None:
    """The walk of a 2023-generation hierarchy in ``inner`` (``raw``: its root ``zarr.json``,
    None: absent), or None when the store is of another generation (a mixed one raises
    :class:`DraftMetadataError` naming the first node of the other generation)."""
    cached = _ReadCache(inner)
    generation, _ = detect_generation(cached, raw)
    if generation is not Generation.DRAFT_2023:
        return None
    return walk_v3_nodes(cached, raw)


class Draft2023V3Store(_ReadOnlyView):
    """A store of the 2023 intermediate generation presented as final Zarr v3 (read-only).

    Every node's ``zarr.json`` is served in the v1.0 spelling (:func:`meta2023.normalise_node`,
    the one translation); a group without a document (the root included) is served a group
    document; data objects are served byte for byte under their own keys (they already are
    v1.0 binary). A ``sharding_indexed`` codec whose document declares no ``index_codecs`` is
    decided from the bytes of the array's first shard (:func:`~sharding_store.inspect.decide_reading`):
    zarrita's undeclared CRC32C after each index (May-July 2023) is declared as
    ``index_codecs [bytes little, crc32c]``, a plain index as ``[bytes little]``. Every shard
    index zarr reads through the view (a suffix read, or a shard read whole) is checked first:
    an index that fits neither reading, or reads otherwise than the first shard's, raises
    :class:`ShardCorruptError` naming the key (never a guess); a declared plain little-endian
    index is validated against the object's size. Chunk payloads are not decoded by the view
    (zarr decodes them).

    The node documents are read once (one walk: :func:`~sharding_store.hierarchy.walk_v3_nodes`)
    and kept; listing keys reads no data object. A damaged node document is left out of the
    view (:func:`open_v3` on it raises its :class:`DraftMetadataError`); the other nodes read.
    """

    def _load_view(self) -> _View2023:
        with self._lock:
            if self._view is None:
                walk = self.__dict__.pop("_walk", None)  # the walk open_v3 made: used once
                if walk is None:
                    walk = _walk_2023(self._inner, self._inner.get(ZARR_JSON))
                if walk is None:  # another generation: say which, as the 2022 view does
                    draft_entry_point(self._inner, self._inner.get(ZARR_JSON), self._source)
                    raise StoreNotFoundError(f"{self._source}: not a hierarchy of the 2023 generation", key=ZARR_JSON)
                self._view = _View2023(self._inner, walk)
            return self._view

    async def _get_view(self) -> _View2023:
        view = self._view
        if view is None:
            view = await asyncio.to_thread(self._load_view)
        return view

    def node_kind(self, path: str) -> str:
        """``"array"`` or ``"group"`` for the node at ``path``; its error when it is damaged,
        StoreNotFoundError when there is none."""
        view = self._load_view()
        path = dm.normalize_path(path)
        if path in view.damaged:
            raise view.damaged[path]
        if path in view.arrays:
            return "array"
        if path in view.normalised or path in view.implicit:
            return "group"
        raise StoreNotFoundError(f"no array or group at '{path or '/'}'", key=path)

    def document(self, path: str) -> dict[str, Any]:
        """The final ``zarr.json`` the view serves for the node at ``path``."""
        self.node_kind(path)
        return json.loads(self._load_view().document(dm.normalize_path(path)))

    async def _open(self) -> None:
        await super()._open()
        await self._get_view()

    async def _read(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        view = await self._get_view()
        out: list[bytes | None] = [None] * len(requests)
        pending: list[tuple[int, str, RangeRequest | None]] = []
        for i, (key, byte_range) in enumerate(requests):
            r = _as_range(key, byte_range)
            path = view.doc_keys.get(key)
            if path is not None:
                doc = view._documents.get(path)
                if doc is None:  # deciding an undeclared index reads a shard: off the loop
                    doc = await asyncio.to_thread(view.document, path)
                out[i] = doc if r is None else slice_range(doc, r[1], r[2])
            else:  # a data key (array_of: None for a key in no array's directory)
                pending.append((i, key, r))
        if pending:
            values = await asyncio.to_thread(lambda: [view.serve(k, r) for _, k, r in pending])
            for (i, _, _), value in zip(pending, values):
                out[i] = value
        return out

    async def exists(self, key: str) -> bool:
        view = await self._get_view()
        if key in view.doc_keys:
            return True
        if view.array_of(key) is None:
            return False
        return await asyncio.to_thread(self._inner.exists, key)

    async def getsize(self, key: str) -> int:
        view = await self._get_view()
        path = view.doc_keys.get(key)
        if path is not None:
            return len(await asyncio.to_thread(view.document, path))
        size = None if view.array_of(key) is None else await asyncio.to_thread(self._inner.size, key)
        if size is None:
            raise FileNotFoundError(key)
        return size

    async def _list_prefix(self, prefix: str) -> list[str]:
        view = await self._get_view()
        keys = [k for k in view.doc_keys if k.startswith(prefix)]
        for path in view.arrays:
            base = _node_prefix(path)
            if base.startswith(prefix) or prefix.startswith(base):
                listed = await asyncio.to_thread(lambda: list(self._inner.list_prefix(base)))
                keys += [k for k in listed if k.startswith(prefix) and view.array_of(k) == path]
        return sorted(set(keys))

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """Names directly below ``prefix``: the documents give the nodes (no listing); an
        array's own directory is listed from the store."""
        view = await self._get_view()
        base = _node_prefix(prefix.rstrip("/"))
        names = {k[len(base):].split("/")[0] for k in view.doc_keys if k.startswith(base)}
        for path in view.arrays:
            if base.startswith(_node_prefix(path)):
                keys, prefixes = await asyncio.to_thread(self._inner.list_dir, base)
                names.update(k[len(base):] for k in keys if view.array_of(k) == path)
                names.update(p[len(base):].rstrip("/") for p in prefixes)
        for name in sorted(names):
            yield name

def open_v3(store_or_url: Any, path: str = "", *, storage_options: Mapping[str, Any] | None = None) -> Any:
    """Open the node at ``path`` of a draft-era store as a read-only zarr-python 3
    ``Array`` or ``Group``, reading the objects in place: a 2022 store through
    :class:`DraftV3Store`, a store of the 2023 intermediate generation through
    :class:`Draft2023V3Store` (the generation is told from the documents).

    Raises StoreNotFoundError if there is no draft hierarchy or no node at ``path``,
    DraftMetadataError (naming the node) for a damaged document, a hierarchy mixing
    generations or an array v3 cannot express, and ShardCorruptError for a 2023 shard index
    that cannot be decided.
    """
    import zarr

    if isinstance(store_or_url, (DraftV3Store, Draft2023V3Store)):
        store: Any = store_or_url
    else:
        store = _view_of(store_or_url, storage_options)
    if isinstance(store, Draft2023V3Store):
        if store.node_kind(path) == "array":
            store.document(path)  # an undecidable index fails here, naming its shard
            return zarr.open_array(store=store, path=dm.normalize_path(path), mode="r", zarr_format=3)
        return zarr.open_group(store=store, path=dm.normalize_path(path), mode="r", zarr_format=3,
                               use_consolidated=False)
    hierarchy = store.hierarchy()
    damaged = hierarchy.damaged.get(dm.normalize_path(path))
    if damaged is not None:  # an unreadable document: say why, rather than "not found"
        raise damaged
    node = hierarchy.node(path)
    if node.kind == "array":
        store._load_view().document(node.path)  # refuses what open_draft refuses, naming it
        return zarr.open_array(store=store, path=node.path, mode="r", zarr_format=3)
    return zarr.open_group(store=store, path=node.path, mode="r", zarr_format=3, use_consolidated=False)


def _view_of(store_or_url: Any, storage_options: Mapping[str, Any] | None) -> DraftV3Store | Draft2023V3Store:
    """The view for the store's generation, reading its root ``zarr.json`` once (and, for a
    per-node hierarchy, each node document once)."""
    inner = inner_of(store_or_url, storage_options)
    raw = inner.get(ZARR_JSON)
    walk = None
    if raw is None or meta2023.classify_node(raw) in ("final", "2023"):
        walk = _walk_2023(inner, raw)
    cls = Draft2023V3Store if walk is not None else DraftV3Store
    store = cls(inner)
    store._source = _ReadOnlyView._describe(store_or_url)
    if walk is not None:
        store._walk = walk  # type: ignore[union-attr]
    else:
        store._entry_point = raw  # type: ignore[union-attr]
    return store
