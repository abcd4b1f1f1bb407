"""A store root on local disk: plain paths and ``file://`` URLs.

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
within one lap extends the one before (``shard.ShardImage``): the bytes an older index
points at never change, and the index and header are written last; a reader that reads
them while they are rewritten sees a crc32c mismatch and reads again (so does a reader
of a lane state that raced its rewrite). Where renames cannot exchange, or hard links
are refused, the plain put is used.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import faults
from .base import Backend, check_then_put


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
    """A :meth:`LocalBackend.put` payload: the object's new version is ``buf[:size]``,
    of which the first ``prefix`` bytes (index and header) change in place, written
    through ``lineage``."""

    buf: Any  # bytes-like
    size: int
    prefix: int
    lineage: Lineage

    def __len__(self) -> int:
        return self.size


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
_SEQ = itertools.count()  # temp file names: unique within the process


class LocalBackend(Backend):
    """A directory on local disk; reads with ``os.pread`` on open descriptors (handles),
    so a handle keeps reading the version it opened. Conditional writes hold ``flock`` on
    the object's folder: atomic between the processes and threads of this host."""

    is_local = True
    atomic_conditional_writes = True

    def __init__(self, root: str, fsync: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root
        self.fsync = fsync
        self.exchange = _EXCHANGE is not None  # renames can swap two names (Rewrite puts)
        self._made: set[str] = set()  # folders known to exist
        _raise_fd_limit()

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> LocalBackend:
        """A path or ``file://`` URL (``storage_options`` do not apply)."""
        return cls(url[len("file://"):] if url.startswith("file://") else url, fsync)

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def open_object(self, key: str) -> int | None:
        try:
            return os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            return None

    def close_object(self, handle: int) -> None:
        os.close(handle)

    def read_ranges(self, requests: Sequence[tuple[int, int, int]],
                    missing_ok: bool = False) -> list[bytes | None]:
        pread = os.pread
        return [pread(fd, end - start, start) for fd, start, end in requests]

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes | Rewrite) -> None:
        """Temp file, fsync (when ``fsync``), rename: readers see the old or the new bytes.
        A :class:`Rewrite` goes through its lineage (see the module docstring)."""
        if isinstance(data, Rewrite):
            if self.exchange and data.lineage.current >= 0:
                return self._rewrite(key, data)
            return self._replace(key, data, keep=self.exchange)
        self._replace(key, data)

    def _folder(self, path: str) -> str:
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        return folder

    def _replace(self, key: str, data: Any, keep: bool = False) -> None:
        """A new file renamed over ``key``; ``keep``: its descriptor starts ``data``'s
        lineage (``data`` is then a :class:`Rewrite`)."""
        path = self._path(key)
        folder = self._folder(path)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{next(_SEQ)}.tmp")
        rw = data if isinstance(data, Rewrite) else None
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                if rw is not None:
                    _write_all(fd, rw.buf, 0, rw.size, 0)
                else:
                    _write_all(fd, data, 0, len(data), 0)
                if self.fsync:
                    os.fsync(fd)
            finally:
                if not keep:
                    os.close(fd)
            if faults.ARMED:
                faults.hit("put.rename")
            os.replace(tmp, path)
        except BaseException:
            if keep:
                os.close(fd)
            with contextlib.suppress(OSError):  # a failed write leaves no partial temp file
                os.remove(tmp)
            raise
        if keep:
            lin = rw.lineage
            lin.close()
            lin.fds[0], lin.written[0], lin.current = fd, rw.size, 0

    def _rewrite(self, key: str, rw: Rewrite) -> None:
        lin = rw.lineage
        t = 1 - lin.current
        spare = self._path(lin.spare)
        fd = lin.fds[t]
        if fd is None:  # the second version: its inode is new
            self._folder(spare)
            fd = lin.fds[t] = os.open(spare, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            lin.written[t] = 0
        start = lin.written[t] if lin.append else 0
        if start:  # what an older index points at is there: the new bytes, then the head
            _write_all(fd, rw.buf, start, rw.size, start)
            _write_all(fd, rw.buf, 0, rw.prefix, 0)
        else:
            _write_all(fd, rw.buf, 0, rw.size, 0)
            if not lin.append:
                os.ftruncate(fd, rw.size)
        if self.fsync:
            os.fsync(fd)
        if faults.ARMED:
            faults.hit("put.rename")
        path = self._path(key)
        try:
            _EXCHANGE(spare, path)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
                raise
            self.exchange = False  # not here: new files renamed over from now on
            lin.close()
            return self._replace(key, rw)
        lin.written[t] = rw.size
        lin.current = t

    def remove_tree(self, prefix: str) -> None:
        """Delete everything under ``prefix`` (a folder), if it exists."""
        root = self._path(prefix)
        self._made = {f for f in self._made if f != root and not f.startswith(root + os.sep)}
        shutil.rmtree(root, ignore_errors=True)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """Conditional write, atomic between processes of this host (``flock`` on the folder)."""
        import fcntl

        folder = os.path.dirname(self._path(key))
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return check_then_put(self, key, data, match)
        finally:
            os.close(fd)  # releases the lock

    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass

    def size(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        out = []
        for folder, _, files in os.walk(self._path(prefix)):
            for f in files:
                out.append(os.path.relpath(os.path.join(folder, f), self.root))
        return sorted(out)

    def total_bytes(self, prefix: str = "") -> int:
        """Bytes allocated on disk (blocks), which is what a full disk runs out of; a file
        with several links (a shard and its writer's spare) counts once."""
        total = 0
        seen = set()
        for folder, _, files in os.walk(self._path(prefix)):
            for f in files:
                st = os.stat(os.path.join(folder, f))
                if st.st_nlink > 1:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += st.st_blocks * 512
        return total


def _write_all(fd: int, data: Any, start: int, end: int, offset: int) -> None:
    """Write ``data[start:end]`` at ``offset``. The views are released even on errors, so
    a ``bytearray`` passed in can grow again while a traceback is still around."""
    with memoryview(data) as whole:
        while start < end:
            with whole[start:end] as part:
                n = os.pwrite(fd, part, offset)
            start, offset = start + n, offset + n


def _raise_fd_limit() -> None:
    """Readers keep many shard files open: lift the soft descriptor limit (up to 65536)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass
