"""Any ``MutableMapping[str, bytes]`` as a store (a ``dict``, a zarr-python 2 store, ...).

Versions: a plain mapping has no object identity, so a tail read returns as its version
the object's length and the tail bytes themselves (``(size, tail)``), and a range read
given versions reads the whole object once (as it does anyway: one get per key) and
checks that its length and tail still match. A rewrite that changes the index (every
shard rewrite does: the offsets move, or the payload sizes change) is caught; one that
rewrites payloads with identical sizes *and* an identical index is not, which is harmless
for shard reads (the index still describes the bytes read). Mappings with
``get_partial_values`` (no whole reads) give no version.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence

from .base import (
    BaseInner,
    ForkSafeLock,
    Location,
    RangeRequest,
    Tail,
    Version,
    check_versions,
    list_dir_from_keys,
    slice_range,
)

__all__ = ["MappingInner"]

#: serialises create_exclusive and put_if_unchanged on plain mappings within this process (fresh in a forked child)
_CREATE_LOCK = ForkSafeLock()


class MappingInner(BaseInner):
    """A ``MutableMapping[str, bytes]``; uses its ``get_partial_values`` if it has one.

    zarr-python 2 v3 stores (and many hand-written ones) have
    ``get_partial_values([(key, (start, length))])``; otherwise a range read is one
    full get and a slice, done once per key per call.
    """

    def __init__(self, mapping: MutableMapping[str, bytes]) -> None:
        self.mapping = mapping
        self._partial = getattr(mapping, "get_partial_values", None)

    def __repr__(self) -> str:
        return f"MappingInner({type(self.mapping).__name__})"

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(self.mapping[key])
        except KeyError:
            return None

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        checked = versions is not None and any(v is not None for v in versions)
        if self._partial is not None and not checked:
            ranges = [(k, (s, None if e is None else e - s)) for k, s, e in requests]
            try:
                out = self._partial(ranges)
            except KeyError:
                out = None
            if out is not None:
                return [None if v is None else bytes(v) for v in out]
        cache: dict[str, bytes | None] = {}
        result: list[bytes | None] = []
        for i, (key, start, end) in enumerate(requests):
            if key not in cache:
                cache[key] = self.get(key)
            data = cache[key]
            if checked and versions[i] is not None:  # type: ignore[index]
                expected = versions[i]  # type: ignore[index]
                check_versions(key, expected, None if data is None else _version(data, len(expected[1])))  # type: ignore[index]
            result.append(None if data is None else slice_range(data, start, end))
        return result

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        if self._partial is not None:
            out = self.get_ranges([(k, -max(n, 1), None) for k, n in requests])  # -0 would be all of it
            return [None if v is None else Tail(v if n > 0 else b"", None, None) for v, (_, n) in zip(out, requests)]
        tails: list[Tail | None] = []
        for key, n in requests:
            data = self.get(key)
            if data is None:
                tails.append(None)
                continue
            tail = data[max(0, len(data) - n) :]
            tails.append(Tail(tail, len(data), (len(data), tail)))
        return tails

    def set(self, key: str, value: bytes) -> None:
        self.mapping[key] = value

    def delete(self, key: str) -> None:
        try:
            del self.mapping[key]
        except KeyError:
            pass

    def _keys(self, prefix: str) -> Iterator[str]:
        """The keys under ``prefix`` as a stream, in the mapping's order: its own
        ``list_prefix``, else its keys filtered (:func:`_key_stream`)."""
        lister = getattr(self.mapping, "list_prefix", None)
        return lister(prefix) if lister is not None else (k for k in _key_stream(self.mapping) if k.startswith(prefix))

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return iter(sorted(self._keys(prefix)))

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """The children of ``prefix``, from the keys below it as a stream (never sorted
        whole): what is held is the children, not every key below them."""
        return list_dir_from_keys(self._keys(prefix), prefix)

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """Sorted ``(key, size)``. A mapping with its own ``list_sized`` (sorted pairs, e.g. a
        generated store too large to list into memory) is listed through it, lazily."""
        own = getattr(self.mapping, "list_sized", None)
        return iter(own(prefix)) if own is not None else super().list_sized(prefix)

    def list_unordered(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        """``(key, None)`` in the mapping's own order, streamed: nothing sorted, nothing
        held per key (a store of a million generated keys lists in constant memory). A
        mapping with its own ``list_sized`` or ``list_prefix`` is listed through it."""
        if getattr(self.mapping, "list_sized", None) is not None:
            return self.list_sized(prefix)
        return ((k, None) for k in self._keys(prefix))

    def exists(self, key: str) -> bool:
        return key in self.mapping

    def size(self, key: str) -> int | None:
        value = self.get(key)
        return None if value is None else len(value)

    def create_exclusive(self, key: str, value: bytes) -> bool:
        """Check and set under one lock of this process: exclusive among ``create_exclusive``
        callers of this process (an in-memory mapping has no others); a mapping backed by
        something other processes write is not protected (documented limit)."""
        with _CREATE_LOCK:
            if key in self.mapping:
                return False
            self.mapping[key] = value
            return True

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """Compare and replace under the lock of :meth:`create_exclusive` (the same limit)."""
        with _CREATE_LOCK:
            if self.get(key) != expected:
                return False
            if value is None:
                self.delete(key)
            else:
                self.mapping[key] = value
            return True

    def location(self) -> Location:
        return Location("mapping", str(id(self.mapping)), "")

    def describe(self) -> str:
        return f"{type(self.mapping).__name__} object"


#: the type of a dict's key iterator (a ``dict``'s, a ``UserDict``'s): its listing can be copied atomically
_DICT_KEY_ITERATOR: type = type(iter({}))


def _key_stream(mapping: MutableMapping[str, bytes]) -> Iterator[str]:
    """A mapping's keys, for a listing. A ``dict``'s (or a wrapper whose iterator is a
    dict's, e.g. ``UserDict``) are copied first, in one step no other thread can interleave
    with (its writers cannot break the listing), at 8 bytes a key: the dict holds the keys
    anyway. Any other mapping's iterator runs Python code, where a copy would be no safer
    and would hold every key it makes at once (a generated store's): it is streamed."""
    it = iter(mapping)
    return iter(list(it)) if type(it) is _DICT_KEY_ITERATOR else it


def _version(data: bytes, n: int) -> tuple[int, bytes]:
    return len(data), data[max(0, len(data) - n) :]
