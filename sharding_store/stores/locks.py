"""Locks for several *processes* writing one draft store.

A shard rewrite is read-modify-write: two unlocked writers to the same shard can each
read the old index and the later ``set`` silently drops the other's chunks — true of
every sharded format, and of zarr-python 2.x's transformer. Threads sharing one
``ShardingStore`` are already serialised per shard; processes need this::

    store = ShardingStore("/data/x.zr3", lock=file_lock("/data/x.zr3.locks"))

``file_lock`` uses POSIX advisory locks (``fcntl.flock``), one lock file per shard,
kept *outside* the store so no stray keys appear in it. It works for processes on
one machine (and on NFS only where flock is honoured). Object stores have no such
primitive: coordinate writers so that each shard has one writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager


def file_lock(directory: str | os.PathLike[str]) -> Callable[[str], AbstractContextManager[None]]:
    """A ``lock=`` argument for :class:`~sharding_store.ShardingStore` backed by lock files."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)

    @contextlib.contextmanager
    def lock(shard_key: str) -> Iterator[None]:
        name = hashlib.sha1(shard_key.encode()).hexdigest()[:20] + ".lock"
        fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    return lock
