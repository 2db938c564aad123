"""An inner-store wrapper that counts requests and bytes.

Request counts are how tests prove the sharding logic does the I/O it should, and how
benchmarks report the cost of a read. Wrap any store: ``CountingInner(as_inner(x))``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from .inner import Inner, RangeRequest, Tail, as_inner


class CountingInner:
    """Counts calls (``calls[name]``), ranges requested, and bytes read and written."""

    def __init__(self, inner: Any) -> None:
        self.inner: Inner = as_inner(inner)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.calls: Counter[str] = Counter()
        self.ranges = 0  # individual byte ranges requested through get_ranges
        self.bytes_read = 0
        self.bytes_written = 0
        self.log: list[tuple[str, Any]] = []

    def _count(self, name: str, detail: Any, nread: int = 0, nwritten: int = 0) -> None:
        with self._lock:
            self.calls[name] += 1
            self.bytes_read += nread
            self.bytes_written += nwritten
            self.log.append((name, detail))

    @property
    def reads(self) -> int:
        """Requests that fetch bytes: whole gets plus individual ranges."""
        return self.calls["get"] + self.ranges

    @property
    def writes(self) -> int:
        return self.calls["set"]

    def get(self, key: str) -> bytes | None:
        value = self.inner.get(key)
        self._count("get", key, len(value or b""))
        return value

    def get_ranges(self, requests: Sequence[RangeRequest]) -> list[bytes | None]:
        out = self.inner.get_ranges(requests)
        with self._lock:
            self.ranges += len(requests)
        self._count("get_ranges", list(requests), sum(len(v) for v in out if v is not None))
        return out

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        out = self.inner.get_tails(requests)
        with self._lock:
            self.ranges += len(requests)
        self._count("get_ranges", [(k, -n, None) for k, n in requests], sum(len(t[0]) for t in out if t is not None))
        return out

    def set(self, key: str, value: bytes) -> None:
        self.inner.set(key, value)
        self._count("set", key, nwritten=len(value))

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self._count("delete", key)

    def delete_prefix(self, prefix: str) -> None:
        self.inner.delete_prefix(prefix)
        self._count("delete_prefix", prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        self._count("list_prefix", prefix)
        return self.inner.list_prefix(prefix)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        self._count("list_dir", prefix)
        return self.inner.list_dir(prefix)

    def exists(self, key: str) -> bool:
        self._count("exists", key)
        return self.inner.exists(key)

    def __getattr__(self, name: str) -> Any:  # size(), fs, ... of the wrapped adapter
        return getattr(self.inner, name)
