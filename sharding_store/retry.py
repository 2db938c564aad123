"""Running independent work units: transient-error retries and a bounded window.

Migration and verification are made of many small, idempotent work units (one target
shard each). Two things are shared by both and live here:

* :func:`with_retries` re-runs a unit after a *transient* error (connection resets,
  timeouts, botocore connection errors) with exponential backoff. Errors that will
  not go away by waiting (missing objects, corrupt data, bad arguments) are raised at
  once.
* :func:`run_bounded` feeds units to any ``concurrent.futures.Executor`` (a thread
  pool, or ``distributed.Client.get_executor()``) in small batches, keeping at most
  ``window`` batches in flight, so memory stays bounded by the window whatever the
  number of units.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Any, TypeVar

from .errors import ShardingStoreError

T = TypeVar("T")
R = TypeVar("R")

#: OSError subclasses that describe the data, not the connection: retrying cannot help
_PERMANENT_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def _botocore_transient() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:  # pragma: no cover - botocore comes with s3fs only
        return ()
    return (BotoConnectionError, HTTPClientError)


def is_transient(error: BaseException) -> bool:
    """True for errors worth retrying: I/O hiccups, not facts about the data."""
    if isinstance(error, ShardingStoreError) or isinstance(error, _PERMANENT_OS_ERRORS):
        return False
    return isinstance(error, (OSError, TimeoutError, ConnectionError, *_botocore_transient()))


def with_retries(
    fn: Callable[..., R], *args: Any, attempts: int = 4, base_delay: float = 0.2, **kwargs: Any
) -> R:
    """``fn(*args, **kwargs)``, retried up to ``attempts`` times on transient errors.

    Delays double from ``base_delay`` (0.2 s, 0.4 s, 0.8 s by default); the last
    error is re-raised when every attempt failed.
    """
    for attempt in range(max(1, attempts)):
        try:
            return fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - filtered just below
            if attempt + 1 >= attempts or not is_transient(e):
                raise
            time.sleep(base_delay * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


#: most items per executor task (see :func:`run_bounded`)
MAX_BATCH = 16


def run_bounded(
    executor: Executor,
    fn: Callable[..., R],
    items: Iterable[tuple[Any, ...]],
    *,
    window: int,
    max_batch: int = MAX_BATCH,
) -> Iterator[tuple[tuple[Any, ...], Future[R]]]:
    """Run ``fn(*item)`` for each item with at most ``window`` batches pending.

    Yields ``(item, future)`` as items complete (``future.result()`` may raise: each
    item fails alone). Items travel in batches, one executor task each, growing from 1
    to ``max_batch`` items: handing a task to a worker and its result back costs a
    thread wake-up each way (a dask round trip on a cluster), which on a busy machine
    costs more than copying a small shard. Memory stays bounded by the window: a worker
    runs its batch's items one after the other. When the consumer stops early (an
    error), the pending batches are cancelled.
    """
    pending: dict[Future[list[tuple[bool, Any]]], list[tuple[Any, ...]]] = {}
    iterator = iter(items)
    exhausted = False
    window = max(1, window)
    submitted = 0
    try:
        while True:
            while not exhausted and len(pending) < window:
                batch = list(itertools.islice(iterator, min(max_batch, 1 + submitted // window)))
                if not batch:
                    exhausted = True
                    break
                pending[executor.submit(_run_batch, fn, batch)] = batch
                submitted += len(batch)
            if not pending:
                return
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in done:
                batch = pending.pop(future)
                try:
                    outcomes = future.result()
                except BaseException as e:  # noqa: BLE001 - the task itself failed (e.g. a lost worker)
                    outcomes = [(False, e)] * len(batch)
                for item, (ok, value) in zip(batch, outcomes):
                    one: Future[R] = Future()
                    if ok:
                        one.set_result(value)
                    else:
                        one.set_exception(value)
                    yield item, one
    finally:
        for future in pending:
            future.cancel()


def _run_batch(fn: Callable[..., R], batch: list[tuple[Any, ...]]) -> list[tuple[bool, Any]]:
    """The executor task: every item of a batch, each one's result or exception."""
    out: list[tuple[bool, Any]] = []
    for item in batch:
        try:
            out.append((True, fn(*item)))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, item by item
            out.append((False, e))
    return out
