"""The writer's in-place rewrite of an object on local disk.

Replacing an object is a temp file + rename. On some file systems (ext4 mounted with
``discard`` here) a rename over a file frees the old inode, and that costs ~150 µs of
the ~200 µs of a small put. The writer's flushes of a partly filled shard (one put per
field, and the lane state, at every flush) avoid it with :class:`Rewrite`: each such
object alternates between two inodes of a :class:`Lineage`. The new version is written
*in place* into the inode the object held one version before (kept as a hidden spare
name, with its descriptor open), then swapped with the object's name in one atomic
``renameat2(RENAME_EXCHANGE)``. No inode is created or freed, and for a shard only the
bytes appended since that version are written: ~10 µs per object instead of ~200.

This is safe for readers holding the older inode open because every version of a shard
within one lap extends the one before (``format.shard.ShardImage``): the bytes an older
index points at never change, and the index and header are written last; a reader that
reads them while they are rewritten sees a crc32c mismatch and reads again (so does a
reader of a lane state that raced its rewrite). Where renames cannot exchange, or hard
links are refused, the plain put is used.

A :class:`Rewrite` is a put payload: it travels through whatever wraps the backend (a
lease check) like bytes, and :meth:`LocalBackend.put <expstore.storage.backends.LocalBackend.put>`
hands it the backend (:meth:`Rewrite.put_into`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from typing import Any

from .. import faults
from ..backends import LocalBackend, write_all

_RENAME_EXCHANGE = 2


def _exchanger() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_uint]
    except (OSError, AttributeError):
        return None

    def exchange(a: str, b: str) -> None:
        if fn(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), b)

    return exchange


_EXCHANGE = _exchanger()
#: store roots whose file system refused an exchange: plain puts there from then on
_NO_EXCHANGE: set[str] = set()


def can_exchange(backend: LocalBackend) -> bool:
    """Whether renames under ``backend``'s root can swap two names (as far as known)."""
    return _EXCHANGE is not None and backend.root not in _NO_EXCHANGE


class Lineage:
    """The two inodes one object alternates between while it is rewritten in place (one
    lap of a shard, or a writer's lane state). ``spare``: key of the hidden name of the
    inode not linked to the object. ``append``: each version extends the one before
    beyond ``prefix`` bytes, so only the new bytes are written (else: all, truncated).
    Owned by one writer; :meth:`close` once the object is replaced another way."""

    def __init__(self, spare: str, append: bool = True) -> None:
        self.spare = spare
        self.append = append
        self.fds: list[int | None] = [None, None]
        self.written = [0, 0]  # bytes of each inode holding this lineage's content
        self.current = -1  # which inode the object's name links to (-1: neither)

    def close(self) -> None:
        for i, fd in enumerate(self.fds):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                self.fds[i] = None
        self.current = -1


@dataclass
class Rewrite:
    """A put payload: the object's new version is ``buf[:size]``, of which the first
    ``prefix`` bytes (index and header) change in place, written through ``lineage``."""

    buf: Any  # bytes-like
    size: int
    prefix: int
    lineage: Lineage

    def __len__(self) -> int:
        return self.size

    def put_into(self, backend: LocalBackend, key: str) -> None:
        """Replace object ``key`` of ``backend`` (called by ``LocalBackend.put``)."""
        if can_exchange(backend) and self.lineage.current >= 0:
            self._rewrite(backend, key)
        else:
            self._replace(backend, key)

    def _replace(self, backend: LocalBackend, key: str) -> None:
        """A new file renamed over ``key``; where exchanges work, its descriptor starts the
        lineage."""
        keep = can_exchange(backend)
        fd = backend.replace(key, self.buf, self.size, keep=keep)
        if keep:
            lin = self.lineage
            lin.close()
            lin.fds[0], lin.written[0], lin.current = fd, self.size, 0

    def _rewrite(self, backend: LocalBackend, key: str) -> None:
        lin = self.lineage
        t = 1 - lin.current
        spare = backend.path(lin.spare)
        fd = lin.fds[t]
        if fd is None:  # the second version: its inode is new
            backend.make_folder(spare)
            fd = lin.fds[t] = os.open(spare, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            lin.written[t] = 0
        start = lin.written[t] if lin.append else 0
        if start:  # what an older index points at is there: the new bytes, then the head
            write_all(fd, self.buf, start, self.size, start)
            write_all(fd, self.buf, 0, self.prefix, 0)
        else:
            write_all(fd, self.buf, 0, self.size, 0)
            if not lin.append:
                os.ftruncate(fd, self.size)
        if backend.fsync:
            os.fsync(fd)
        if faults.ARMED:
            faults.hit("put.rename")
        try:
            _EXCHANGE(spare, backend.path(key))
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
                raise
            _NO_EXCHANGE.add(backend.root)  # not here: new files renamed over from now on
            lin.close()
            self._replace(backend, key)
            return
        lin.written[t] = self.size
        lin.current = t


class RewritingPuts:
    """``backend`` whose puts (of a small object such as a lane state) go through one
    :class:`Lineage`, rewritten in place; everything else passes through."""

    def __init__(self, backend: Any, lineage: Lineage) -> None:
        self._backend = backend
        self._lineage = lineage

    def put(self, key: str, data: bytes) -> None:
        self._backend.put(key, Rewrite(data, len(data), 0, self._lineage))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
