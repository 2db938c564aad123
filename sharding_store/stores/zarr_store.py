"""A zarr-python 3 ``Store`` (async) driven synchronously on zarr's own event loop.

Versions: zarr's store API exposes no object identity, so tails carry none (``None``);
callers fall back to re-reading and comparing.

A zarr ``LocalStore`` follows symbolic links out of its root; its objects are read (and,
unless it is read-only, written) through a :class:`~.local.LocalInner` of the same
directory instead, with that store's guarantees (no link out of the root, atomic writes,
versions).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .. import _zarr_adapter
from .base import BaseInner, Location, RangeRequest, Tail, Version
from .local import LocalInner

__all__ = ["ZarrStoreInner"]


class ZarrStoreInner(BaseInner):
    def __init__(self, store: Any) -> None:
        from zarr.buffer import default_buffer_prototype

        self.store = store
        self._proto = default_buffer_prototype()
        root = getattr(store, "root", None)
        #: reads (and writes, unless read-only) of a zarr LocalStore: never through a link out
        self._local: LocalInner | None = None
        self._local_writes = False
        if root is not None and type(store).__name__ == "LocalStore":
            import os

            self._local = LocalInner(os.fspath(root))
            self._local_writes = getattr(store, "read_only", True) is False

    def __repr__(self) -> str:
        return f"ZarrStoreInner({self.store!r})"

    def _sync(self, coro: Any) -> Any:
        return _zarr_adapter.sync(coro)

    def get(self, key: str) -> bytes | None:
        if self._local is not None:
            return self._local.get(key)
        buf = self._sync(self.store.get(key, self._proto))
        return None if buf is None else buf.to_bytes()

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        if self._local is not None:
            return self._local.get_ranges(requests, versions)
        from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

        def req(start: int, end: int | None) -> Any:
            if start < 0:
                return SuffixByteRequest(-start)
            if end is None:
                return OffsetByteRequest(start)
            return RangeByteRequest(start, end)

        async def run() -> list[Any]:
            import asyncio

            return await asyncio.gather(
                *(self.store.get(k, self._proto, byte_range=req(s, e)) for k, s, e in requests)
            )

        return [None if b is None else b.to_bytes() for b in self._sync(run())]

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        if self._local is not None:
            return self._local.get_tails(requests)
        out = self.get_ranges([(k, -max(n, 1), None) for k, n in requests])  # -0 would be all of it
        return [None if v is None else Tail(v if n > 0 else b"", None, None) for v, (_, n) in zip(out, requests)]

    def set(self, key: str, value: bytes) -> None:
        if self._local_writes:
            self._local.set(key, value)  # type: ignore[union-attr]
            return
        self._sync(self.store.set(key, self._proto.buffer.from_bytes(bytes(value))))

    def delete(self, key: str) -> None:
        if self._local_writes:
            self._local.delete(key)  # type: ignore[union-attr]
            return
        self._sync(self.store.delete(key))

    def list_prefix(self, prefix: str) -> Iterator[str]:
        if self._local is not None:
            return self._local.list_prefix(prefix)
        async def run() -> list[str]:
            return [k async for k in self.store.list_prefix(prefix)]

        return iter(sorted(self._sync(run())))

    def exists(self, key: str) -> bool:
        if self._local is not None:
            return self._local.exists(key)
        return bool(self._sync(self.store.exists(key)))

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """zarr's ``set_if_not_exists`` (atomic where the store's is)."""
        if self._local_writes:
            return self._local.create_exclusive(key, value)  # type: ignore[union-attr]
        if self.exists(key):
            return False
        self._sync(self.store.set_if_not_exists(key, self._proto.buffer.from_bytes(bytes(value))))
        return self.get(key) == bytes(value)

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """A writable zarr ``LocalStore``: the local compare-and-swap; else the generic one."""
        if self._local_writes:
            return self._local.put_if_unchanged(key, value, expected)  # type: ignore[union-attr]
        return super().put_if_unchanged(key, value, expected)

    def temp_leftovers(self, key: str) -> list[str]:
        return [] if self._local is None else self._local.temp_leftovers(key)

    def remove_temp_leftovers(self, key: str) -> int:
        return self._local.remove_temp_leftovers(key) if self._local_writes else 0  # type: ignore[union-attr]

    def location(self) -> Location:
        from .location import zarr_location

        return zarr_location(self.store)

    def describe(self) -> str:
        return repr(self.store)
