"""Directory descriptors of a local store: no swap of a directory for a link redirects a read,
a write or a delete (issue 25 items 3 and 4).

Every open, create, rename and delete below a store's root is made relative to a directory
descriptor (``openat``, ``renameat``, ``unlinkat``, ``mkdirat``), and every such descriptor
was opened ``O_DIRECTORY|O_NOFOLLOW`` from its parent's, component by component from the
root's: a directory replaced by a link after it was opened is never entered through that
link, because the descriptor names the directory itself, not its path.

:class:`DirFds` keeps those descriptors per store object, keyed by their *canonical* path
below the root (names of real directories, no link, ``.`` or ``..``), at most
:data:`DIR_FDS_MAX` of them (the oldest is closed first; one still in use by another thread
is closed when that thread is done). A key whose directory is cached costs one dictionary
look-up and one ``openat``, no more than opening its path. A link met on the way is read
(``readlinkat``) and its target walked the same way from the descriptors, so a link that
stays inside the store still works; a target outside raises
:class:`~sharding_store.errors.LinkOutsideStoreError` naming the key.

A cached directory removed by another process is noticed when a name is missing in it
(``fstat``: no links left) and the cache is emptied and walked again; a forked child starts
with an empty cache, and :meth:`DirFds.close` closes every descriptor.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator

from ..codec import _native
from ..errors import LinkOutsideStoreError, ObjectChangedError
from .base import renew_after_fork

__all__ = ["DIR_FDS_MAX", "MAX_LINKS", "O_DIR", "O_DIR_NOFOLLOW", "DirFd", "DirFds", "post_order", "refusal", "scan", "scan_sized"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
O_DIR_NOFOLLOW = O_DIR | getattr(os, "O_NOFOLLOW", 0)
#: directory descriptors cached per store object (a process has ~1024 by default)
DIR_FDS_MAX = 64
#: links followed while resolving one key (Linux's own limit)
MAX_LINKS = 40
#: what opening a link (or a file) ``O_DIRECTORY|O_NOFOLLOW`` says
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)


class DirFd:
    """A cached directory descriptor: ``path`` is its canonical path below the root."""

    __slots__ = ("dead", "fd", "path", "refs")

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path, self.refs, self.dead = fd, path, 0, False


class _Stale(Exception):
    """A cached directory was removed meanwhile: empty the cache and walk again."""


def refusal(root: str, key: str, real: str) -> LinkOutsideStoreError:
    """The error for ``key`` of the store at ``root``, which leads to ``real``, outside it."""
    return LinkOutsideStoreError(
        f"{key}: resolves to {real}, outside the store {root} (through a symbolic link or '..'); "
        "refusing to follow it",
        key=key,
    )


class DirFds:
    """The directory descriptors of the store rooted at ``root`` (see the module docstring).
    Nothing here refers back to the store object: dropping the last reference to it closes
    them (no cycle waits for the garbage collector)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.real_root = ""
        self._lock = threading.Lock()
        self._cache: dict[str, DirFd] = {}
        renew_after_fork(self)  # a forked child forgets the parent's descriptors

    # ------------------------------------------------------------------ the cache
    def acquire(self, path: str) -> DirFd | None:
        """The cached descriptor of canonical ``path`` (held until :meth:`release`), or None."""
        with self._lock:
            d = self._cache.get(path)
            if d is not None:
                d.refs += 1
        return d

    def release(self, d: DirFd) -> None:
        with self._lock:
            d.refs -= 1
            dead = d.dead and d.refs == 0
        if dead:  # out of the cache and unused: nobody else can reach it
            os.close(d.fd)

    def _insert(self, fd: int, path: str) -> DirFd:
        """(lock held) A new entry, held once; the oldest entry but the root's goes when full."""
        cache = self._cache
        if len(cache) >= DIR_FDS_MAX:
            for old in cache:
                if old:
                    self._kill(cache.pop(old))
                    break
        d = cache[path] = DirFd(fd, path)
        d.refs = 1
        return d

    def _kill(self, d: DirFd) -> None:
        d.dead = True
        if d.refs == 0:
            os.close(d.fd)

    def clear(self) -> None:
        """Forget every descriptor (each is closed once no thread uses it)."""
        with self._lock:
            for d in self._cache.values():
                self._kill(d)
            self._cache.clear()

    close = clear

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock, every inherited descriptor closed."""
        self._lock = threading.Lock()
        for d in self._cache.values():
            try:
                os.close(d.fd)
            except OSError:
                pass
        self._cache.clear()

    def stale(self, d: DirFd) -> bool:
        """Whether ``d``'s directory was removed (then the cache is emptied)."""
        try:
            gone = os.fstat(d.fd).st_nlink == 0
        except OSError:
            gone = True
        if gone:
            self.clear()
        return gone

    # ------------------------------------------------------------------ resolving
    def resolve(self, spelled: str, key: str, *, create: bool = False) -> tuple[DirFd, bool] | None:
        """``(descriptor, through a link)`` of the directory ``spelled`` (below the root, as a
        key spells it: ``.``, ``..`` and links inside the store allowed), held until
        :meth:`release`; None when it is missing (``create``: made, as ``makedirs`` would).
        Raises :class:`LinkOutsideStoreError` naming ``key`` when it leads outside."""
        d = self.acquire(spelled)
        if d is not None:
            return d, False
        for _ in range(3):
            try:
                with self._lock:
                    return self._walk(spelled, key, create)
            except _Stale:
                self.clear()
        raise FileNotFoundError(errno.ENOENT, f"{key}: its directory keeps being removed", spelled)

    def _root(self, create: bool) -> DirFd | None:
        """(lock held) The root's entry, held once; None when the root is missing."""
        d = self._cache.get("")
        if d is not None:
            d.refs += 1
            return d
        try:
            fd = os.open(self.root, O_DIR)
        except (FileNotFoundError, NotADirectoryError):
            if not create:
                return None
            os.makedirs(self.root, exist_ok=True)
            fd = os.open(self.root, O_DIR)
        self.real_root = os.path.realpath(self.root)
        return self._insert(fd, "")

    def _walk(self, spelled: str, key: str, create: bool) -> tuple[DirFd, bool] | None:
        """(lock held) :meth:`resolve`'s walk: a stack of held entries from the root."""
        root = self._root(create)
        if root is None:
            return None
        stack, todo, links = [root], spelled.split("/")[::-1], 0
        own = len(todo)  # the bottom ``own`` of ``todo`` are the key's own components (links' above)
        try:
            while todo:
                name = todo.pop()
                if len(todo) < own:
                    own = len(todo)
                if name in ("", "."):
                    continue
                if name == "..":
                    if len(stack) > 1:
                        self._drop(stack.pop())
                        continue
                    up = os.path.dirname(self.real_root)
                    if len(todo) == own:  # the key itself climbs above the root
                        raise refusal(self.root, key, up)
                    # a link's target climbing out: where it leads, if back inside
                    todo = todo[:own] + self._inside(up + "/" + "/".join(todo[own:][::-1]), key)
                    self._unwind(stack)
                    links += 1  # a way out and back in counts as a link (a bound on loops)
                    continue
                top = stack[-1]
                path = f"{top.path}/{name}" if top.path else name
                d = self._cache.get(path)
                if d is not None:
                    d.refs += 1
                else:
                    got = self._open_child(top, name, path, create)
                    if got is None:
                        return None
                    if isinstance(got, str):  # a link: walk its target instead
                        links += 1
                        if links > MAX_LINKS:
                            raise OSError(errno.ELOOP, f"{key}: too many levels of symbolic links")
                        if got.startswith("/"):
                            todo += self._inside(got, key)
                            self._unwind(stack)
                        else:
                            todo += got.split("/")[::-1]
                        continue
                    d = got
                stack.append(d)
            return stack.pop(), links > 0
        finally:
            for d in stack:
                self._drop(d)

    def _drop(self, d: DirFd) -> None:
        """(lock held) :meth:`release`."""
        d.refs -= 1
        if d.dead and d.refs == 0:
            os.close(d.fd)

    def _unwind(self, stack: list[DirFd]) -> None:
        """(lock held) Back to the root's entry alone."""
        while len(stack) > 1:
            self._drop(stack.pop())

    def _inside(self, absolute: str, key: str) -> list[str]:
        """The components (reversed, for the walk's stack) of ``absolute`` below the real
        root, every link resolved (``realpath`` only tells where: the walk goes by
        descriptors); raises when it lies outside."""
        real, top = os.path.realpath(absolute), self.real_root
        if real == top:
            return []
        if top == "/" or real.startswith(top + "/"):
            return real[len(top) :].split("/")[::-1]
        raise refusal(self.root, key, real)

    def _open_child(self, top: DirFd, name: str, path: str, create: bool) -> DirFd | str | None:
        """(lock held) The entry of directory ``name`` in ``top`` (held once), a link's
        target, or None when missing (or a file). ``create``: a missing one is made."""
        for _ in range(8):
            try:
                return self._insert(os.open(name, O_DIR_NOFOLLOW, dir_fd=top.fd), path)
            except FileNotFoundError:
                if _removed(top):
                    raise _Stale from None
                if not create:
                    return None
                try:
                    os.mkdir(name, 0o777, dir_fd=top.fd)
                except FileExistsError:
                    pass
                except FileNotFoundError:  # ``top`` itself was removed meanwhile
                    raise _Stale from None
            except OSError as e:
                if e.errno not in _NOT_A_DIR:
                    raise
                try:
                    return os.readlink(name, dir_fd=top.fd)
                except FileNotFoundError:
                    continue  # removed meanwhile: look again
                except OSError as e2:
                    if e2.errno != errno.EINVAL or create:  # EINVAL: no link, a file
                        raise NotADirectoryError(errno.ENOTDIR, "a file where a directory should be", path) from None
                    return None
        raise FileNotFoundError(errno.ENOENT, "a directory keeps being removed", path)

    def forget(self, path: str) -> None:
        """Drop canonical ``path``'s descriptor (its directory was removed)."""
        with self._lock:
            d = self._cache.pop(path, None)
            if d is not None:
                self._kill(d)

    def follow(self, d: DirFd, name: str, key: str) -> tuple[DirFd, str] | None:
        """The directory (held) and name a link ``name`` in ``d`` points to, inside the store
        (raises for a target outside); None when a directory on the way is missing. Where it
        points is told by ``realpath`` (only links pay for it); the way there is walked by
        descriptors like any other."""
        top = self.real_root.rstrip("/")
        comps = self._inside(f"{top}/{d.path}/{name}" if d.path else f"{top}/{name}", key)[::-1]
        if not comps:  # the root itself: a directory, no object
            got = self.resolve("", key)
            return None if got is None else (got[0], ".")
        got = self.resolve("/".join(comps[:-1]), key)
        return None if got is None else (got[0], comps[-1])


def _removed(d: DirFd) -> bool:
    try:
        return os.fstat(d.fd).st_nlink == 0
    except OSError:
        return True


#: ``ss_list_dir``'s kind bytes as :func:`scan_sized` spells them
_KINDS = {ord("f"): "f", ord("d"): "d", ord("l"): "l", ord("o"): "o"}


def scan(fd: int) -> list[tuple[str, str]]:
    """``(name, kind)`` of every entry of the directory open as ``fd`` (a descriptor of the
    caller's own: reading it moves its offset): kind ``d`` a directory, ``l`` a link, ``f`` a
    regular file, ``o`` anything else; from ``d_type`` where the filesystem gives it."""
    return [(name, kind) for name, kind, _ in scan_sized(fd, sizes=False)]


def scan_sized(fd: int, *, sizes: bool = True) -> list[tuple[str, str, int | None]]:
    """:func:`scan` with each regular file's size (``fstatat`` of its name, not following a
    link: None when it was removed meanwhile) where ``sizes``, else None. A file is asked
    first, the commonest entry (the kinds do not overlap: no ``follow_symlinks``). With our
    loops' library, one C call lists the directory (:func:`_native.list_dir`); without it, or
    when that call cannot read it, ``os.scandir`` does (and raises what it raises)."""
    reader = _native.tail_reader()
    got = None if reader is None else _native.list_dir(reader, fd, sizes)
    if got is not None:  # one C call (``ss_list_dir``): no ``DirEntry`` or ``stat_result`` an entry
        names, kinds, listed = got
        return [(name, _KINDS[kind], None if size < 0 else size) for name, kind, size in zip(names, kinds, listed)]
    out: list[tuple[str, str, int | None]] = []
    with os.scandir(fd) as it:
        for e in it:
            size = None
            try:
                if e.is_file(follow_symlinks=False):
                    kind = "f"
                    if sizes:
                        try:
                            size = e.stat(follow_symlinks=False).st_size
                        except OSError:
                            pass
                else:
                    kind = "d" if e.is_dir(follow_symlinks=False) else "l" if e.is_symlink() else "o"
            except OSError:
                continue
            out.append((e.name, kind, size))
    return out


def post_order(
    fd: int, lead: str, descend: Callable[[str], bool]
) -> Iterator[tuple[int, str, str, bool]]:
    """``(parent descriptor, name, key, is a directory)`` of every entry below the directory
    open as ``fd`` (taken over and closed), a directory after everything in it; ``descend``
    says which directories (their key, ending in ``/``) to enter. Each directory is opened
    ``O_NOFOLLOW`` from its parent's descriptor (a link is an entry, never entered), and only
    one descriptor is open at a time: the way back up is ``..``, checked to be the very
    directory left (device and inode), else :class:`ObjectChangedError` (a directory moved
    while being walked). No recursion: any depth."""
    stack: list[tuple[str, tuple[int, int], Iterator[tuple[str, str]], str]] = []
    try:
        st = os.fstat(fd)
        it = iter(scan(fd))
        while True:
            for name, kind in it:
                key = lead + name
                if kind != "d":
                    yield fd, name, key, False
                    continue
                if not descend(key + "/"):
                    continue
                try:
                    child = os.open(name, O_DIR_NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue  # gone, or swapped for a link since it was listed: not entered
                stack.append((name, (st.st_dev, st.st_ino), it, lead))
                os.close(fd)
                fd, lead = child, key + "/"
                st = os.fstat(fd)
                it = iter(scan(fd))
                break
            else:
                if not stack:
                    return
                name, ident, it, lead = stack.pop()
                parent = os.open("..", O_DIR_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = parent
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != ident:
                    raise ObjectChangedError(f"{lead}{name}: moved while being walked (left alone)", key=lead + name)
                yield fd, name, lead + name, True
    finally:
        os.close(fd)
