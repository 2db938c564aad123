"""Test helpers (not used by the package itself): a store wrapper that counts requests.

Request counts are how tests prove the sharding logic does the I/O it should, and how
benchmarks report the cost of a read. Wrap any store: ``CountingInner(x)`` (``x``: anything
:func:`~sharding_store.stores.as_inner` takes). It delegates *every* method of the store
interface, capabilities included, so production code takes the same branch through it as
without it (a kernel copy stays a kernel copy; the copy is counted as ``copy_to``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from .stores import BaseInner, ChunkRef, ComposePlan, Inner, Location, Part, RangeRequest, Tail, Version, as_inner

__all__ = ["PAUSE_LINE", "CountingInner", "fault_hook", "kill_at", "pause_after", "rendezvous"]


class CountingInner:
    """Counts calls (``calls[name]``), ranges requested, and bytes read and written.

    ``calls`` keys: ``get``, ``get_ranges`` (also tail reads, as they are range requests),
    ``set``, ``create_exclusive``, ``put_if_unchanged``, ``delete``, ``delete_prefix``, ``list_prefix``,
    ``list_sized``, ``list_unordered``, ``list_dir``, ``exists``, ``size``, ``read_into``, ``copy_to``, ``compose``
    (kernel copies only; the generic way counts as the reads and the ``set`` it does), ``move``,
    ``tidy``. ``log`` holds ``(name, detail)`` in call order.
    """

    def __init__(self, inner: Any) -> None:
        self.inner: Inner = as_inner(inner)
        self._lock = threading.Lock()
        self.reset()

    def __repr__(self) -> str:
        return f"CountingInner({self.inner!r})"

    def reset(self) -> None:
        self.calls: Counter[str] = Counter()
        self.ranges = 0  # individual byte ranges requested through get_ranges / get_tails
        self.bytes_read = 0
        self.bytes_written = 0
        self.log: list[tuple[str, Any]] = []

    def _count(self, name: str, detail: Any, nread: int = 0, nwritten: int = 0, ranges: int = 0) -> None:
        with self._lock:
            self.calls[name] += 1
            self.ranges += ranges
            self.bytes_read += nread
            self.bytes_written += nwritten
            self.log.append((name, detail))

    @property
    def reads(self) -> int:
        """Requests that fetch bytes: whole gets (``get``, ``read_into``) plus individual ranges."""
        return self.calls["get"] + self.calls["read_into"] + self.ranges

    @property
    def writes(self) -> int:
        """Requests that write an object: ``set``, ``create_exclusive``, ``put_if_unchanged``, ``copy_to``,
        ``compose``, ``move``."""
        return sum(self.calls[name] for name in ("set", "create_exclusive", "put_if_unchanged", "copy_to", "compose", "move"))

    # ------------------------------------------------------------------ core
    def get(self, key: str) -> bytes | None:
        value = self.inner.get(key)
        self._count("get", key, len(value or b""))
        return value

    def get_ranges(
        self, requests: Sequence[RangeRequest], versions: Sequence[Version | None] | None = None
    ) -> list[bytes | None]:
        try:
            out = self.inner.get_ranges(requests, versions) if versions is not None else self.inner.get_ranges(requests)
        except BaseException:
            self._count("get_ranges", list(requests), ranges=len(requests))
            raise
        self._count("get_ranges", list(requests), sum(len(v) for v in out if v is not None), ranges=len(requests))
        return out

    def get_tails(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        return self._counted_tails(self.inner.get_tails, requests)

    def tails_to_refer(self, requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        """Counted as :meth:`get_tails` (the same reads; a local store's ``lstat`` with them)."""
        return self._counted_tails(self.inner.tails_to_refer, requests)

    def _counted_tails(self, read: Callable[[Sequence[tuple[str, int]]], list[Tail | None]],
                       requests: Sequence[tuple[str, int]]) -> list[Tail | None]:
        out = read(requests)
        self._count("get_ranges", [(k, -n, None) for k, n in requests],
                    sum(len(t[0]) for t in out if t is not None), ranges=len(requests))
        return out

    def set(self, key: str, value: bytes) -> None:
        self.inner.set(key, value)
        self._count("set", key, nwritten=len(value))

    def set_streamed(self, key: str, pieces: Iterable[bytes]) -> int:
        """Counted as one ``set`` of the whole size, once written."""
        n = self.inner.set_streamed(key, pieces)
        self._count("set", key, nwritten=n)
        return n

    def create_exclusive(self, key: str, value: bytes) -> bool:
        done = self.inner.create_exclusive(key, value)
        self._count("create_exclusive", key, nwritten=len(value) if done else 0)
        return done

    def put_if_unchanged(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        done = self.inner.put_if_unchanged(key, value, expected)
        self._count("put_if_unchanged", key, nwritten=len(value or b"") if done else 0)
        return done

    def temp_leftovers(self, key: str) -> list[str]:
        return self.inner.temp_leftovers(key)

    def remove_temp_leftovers(self, key: str) -> int:
        return self.inner.remove_temp_leftovers(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self._count("delete", key)

    def delete_prefix(self, prefix: str) -> None:
        self.inner.delete_prefix(prefix)
        self._count("delete_prefix", prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        self._count("list_prefix", prefix)
        return self.inner.list_prefix(prefix)

    def list_sized(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        self._count("list_sized", prefix)
        return self.inner.list_sized(prefix)

    def list_unordered(self, prefix: str) -> Iterator[tuple[str, int | None]]:
        self._count("list_unordered", prefix)
        return self.inner.list_unordered(prefix)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        self._count("list_dir", prefix)
        return self.inner.list_dir(prefix)

    def exists(self, key: str) -> bool:
        self._count("exists", key)
        return self.inner.exists(key)

    # ------------------------------------------------------------------ capabilities
    def size(self, key: str) -> int | None:
        self._count("size", key)
        return self.inner.size(key)

    def read_into(self, key: str, alloc: Callable[[int], Any]) -> Tail | None:
        got = self.inner.read_into(key, alloc)
        self._count("read_into", key, 0 if got is None else len(got.data))
        return got

    def local_path(self, key: str) -> str | None:
        return self.inner.local_path(key)

    def open_local(self, key: str) -> int | None:
        return self.inner.open_local(key)

    def create_local(self, key: str) -> AbstractContextManager[int] | None:
        """Not counted: the copy that writes through it is (``copy_to``, ``compose``)."""
        return self.inner.create_local(key)

    def fs_path(self, key: str) -> tuple[Any, str] | None:
        return self.inner.fs_path(key)

    def can_copy_to(self, dst: Inner, *, append: bool = False) -> bool:
        return self.inner.can_copy_to(dst, append=append)

    def copy_to(
        self, key: str, dst: Inner, dst_key: str, *, size: int | None = None, append: bytes = b"",
        version: Version | None = None,
    ) -> bool:
        done = self.inner.copy_to(key, dst, dst_key, size=size, append=append, version=version)
        if done:
            self._count("copy_to", (key, dst_key), nwritten=len(append))
        return done

    def can_compose_to(self, dst: Inner) -> bool:
        return self.inner.can_compose_to(dst)

    def compose(
        self, key: str, parts: Sequence[Part], *, into: Inner | None = None,
        versions: Mapping[str, Version | None] | None = None,
    ) -> int:
        """A kernel copy of the wrapped store is counted as one ``compose`` (no byte read);
        otherwise the generic way runs through this wrapper, so its reads and its ``set`` count."""
        dst = self if into is None else into
        if not self.inner.can_compose_to(dst):
            return BaseInner.compose(self, key, parts, into=dst, versions=versions)  # type: ignore[arg-type]
        n = self.inner.compose(key, parts, into=dst, versions=versions)
        self._count("compose", (key, len(parts)), nwritten=n)
        return n

    def compose_from_tails(
        self, sources: Sequence[tuple[str, int]], plan: ComposePlan, *, into: Inner | None = None,
        done: Callable[[str, int], None] | None = None,
    ) -> None:
        """Kernel copies of the wrapped store: the tails count as :meth:`get_tails` does, each
        object as one ``compose``; otherwise the generic way runs through this wrapper."""
        dst = self if into is None else into
        if not self.inner.can_compose_to(dst):
            return BaseInner.compose_from_tails(self, sources, plan, into=dst, done=done)  # type: ignore[arg-type]

        n_parts: dict[str, int] = {}

        def counted_plan(tails: list[Tail | None]) -> Iterator[tuple[str, Sequence[Part]]]:
            self._count("get_ranges", [(k, -n, None) for k, n in sources],
                        sum(len(t[0]) for t in tails if t is not None), ranges=len(sources))
            for key, parts in plan(tails):
                n_parts[key] = len(parts)
                yield key, parts

        def counted_done(key: str, n: int) -> None:
            self._count("compose", (key, n_parts.pop(key)), nwritten=n)
            if done is not None:
                done(key, n)

        self.inner.compose_from_tails(sources, counted_plan, into=dst, done=counted_done)
        return None

    def move(self, key: str, dst_key: str) -> None:
        self.inner.move(key, dst_key)
        self._count("move", (key, dst_key))

    def tidy(self, prefix: str = "", *, keep_top: bool = True) -> None:
        self.inner.tidy(prefix, keep_top=keep_top)
        self._count("tidy", prefix)

    def location(self) -> Location:
        return self.inner.location()

    def describe(self) -> str:
        return self.inner.describe()

    def reference_to(self, key: str, offset: int, length: int, version: Version | None = None) -> ChunkRef | None:
        """Counted as ``reference_to`` (a HEAD or an ``fstat``, never the object's bytes)."""
        self._count("reference_to", key)
        return self.inner.reference_to(key, offset, length, version)

    def takes_references(self) -> bool:
        return self.inner.takes_references()

    def put_reference(self, key: str, ref: ChunkRef) -> None:
        self.inner.put_reference(key, ref)
        self._count("put_reference", key)

    def put_references(self, array: str, refs: Sequence[tuple[str, tuple[int, ...], ChunkRef]]) -> None:
        """Counted once per call, with its keys."""
        self.inner.put_references(array, refs)
        self._count("put_references", (array, [key for key, _, _ in refs]))

    def commit(self, message: str) -> str:
        self._count("commit", message)
        return self.inner.commit(message)


# ====================================================================== fault injection
# Hooks for :func:`sharding_store.ops.jobs.fault_point`, the points where a crash must be
# survivable (migrate: ``unit``, ``meta``; in-place reshard: ``stage``, ``hide``, ``clear``,
# ``move``, ``commit``). The package never installs one; tests do, in process
# (``with fault_hook(hook): ...``) or in a subprocess through ``python -m
# tests.run_with_fault`` (which installs :func:`kill_at` or :func:`pause_after` and runs
# the CLI).


@contextlib.contextmanager
def fault_hook(hook: Callable[[str], None] | None) -> Iterator[None]:
    """Install ``hook(phase)`` at every fault point for the block (the previous one after)."""
    from .ops.jobs import install_fault_hook

    previous = install_fault_hook(hook)
    try:
        yield
    finally:
        install_fault_hook(previous)


def _counter(spec: str) -> Callable[[str], bool]:
    """``"N"`` (any phase) or ``"PHASE:N"``: a function of the phase that is True exactly at
    the N-th fault point counted (thread-safe)."""
    wanted, _, n = spec.rpartition(":")
    target, seen, lock = int(n), [0], threading.Lock()

    def reached(phase: str) -> bool:
        if wanted and phase != wanted:
            return False
        with lock:
            seen[0] += 1
            return seen[0] == target

    return reached


def kill_at(spec: str) -> Callable[[str], None]:
    """A hook that SIGKILLs this process at the N-th fault point (``"N"`` or ``"PHASE:N"``),
    as a power cut would stop it: other threads may be mid-write."""
    reached = _counter(spec)

    def hook(phase: str) -> None:
        if reached(phase):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


#: what :func:`pause_after` prints to stderr when it parks the process
PAUSE_LINE = "sharding-store: test pause after {n} work units"


def pause_after(n: int, phase: str = "unit", seconds: float = 3600.0) -> Callable[[str], None]:
    """A hook that parks the process (prints :data:`PAUSE_LINE`, then sleeps) after the
    ``n``-th fault point of ``phase``, for a test to kill it there."""
    reached = _counter(f"{phase}:{n}")

    def hook(p: str) -> None:
        if reached(p):
            print(PAUSE_LINE.format(n=n), file=sys.stderr, flush=True)
            time.sleep(seconds)

    return hook


def rendezvous(phase: str, directory: str, parties: int, timeout: float = 60.0) -> Callable[[str], None]:
    """A hook that, at the first fault point of ``phase``, waits until ``parties``
    processes (each with this hook, sharing ``directory``) have reached it: two
    migrations then race from exactly that point."""
    reached = _counter(f"{phase}:1")

    def hook(p: str) -> None:
        if not reached(p):
            return
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, str(os.getpid())), "w"):
            pass
        deadline = time.monotonic() + timeout
        while len(os.listdir(directory)) < parties and time.monotonic() < deadline:
            time.sleep(0.005)

    return hook


#: what :func:`slow_units` prints to stderr when the first slowed work item starts
SLOW_LINE = "sharding-store: test: work units slowed, the first one is running"


@contextlib.contextmanager
def slow_units(seconds: float) -> Iterator[None]:
    """For the block, every work item run through :func:`sharding_store.ops.jobs.run_bounded`
    (a unit of ``migrate`` or ``verify``, a task of ``reshard`` on threads) sleeps ``seconds``
    in its worker before it runs: a long job, for a test to interrupt it mid-way (prints
    :data:`SLOW_LINE` when the first one starts)."""
    from .ops import jobs

    real, started = jobs._run_batch, threading.Event()

    def slowed(fn: Callable[..., Any], batch: list[tuple[Any, ...]], stop: Any = None) -> list[tuple[bool, Any]]:
        def slow(*item: Any) -> Any:
            if not started.is_set():
                started.set()
                print(SLOW_LINE, file=sys.stderr, flush=True)
            time.sleep(seconds)
            return fn(*item)

        return real(slow, batch, stop)

    jobs._run_batch = slowed
    try:
        yield
    finally:
        jobs._run_batch = real
