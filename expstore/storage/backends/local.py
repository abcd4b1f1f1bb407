"""A store root on local disk: plain paths and ``file://`` URLs.

Replacing an object is a temp file + rename, so readers see the old or the new bytes. A
payload that knows a faster way to replace an object on local disk (the writer's in-place
rewrite, ``storage/write/rewrite.py``) brings it along: :meth:`LocalBackend.put` hands such
a payload the backend and the key (``data.put_into(backend, key)``) instead of writing it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Sequence
from typing import Any

from .. import faults
from ..native import write_kernel
from .base import Backend, check_then_put

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
        self._made: set[str] = set()  # folders known to exist
        _raise_fd_limit()

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> LocalBackend:
        """A path or ``file://`` URL (``storage_options`` do not apply)."""
        return cls(url[len("file://"):] if url.startswith("file://") else url, fsync)

    def open_object(self, key: str) -> int | None:
        try:
            return os.open(self.path(key), os.O_RDONLY)
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
            with open(self.path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: Any) -> None:
        """Temp file, fsync (when ``fsync``), rename: readers see the old or the new bytes.
        ``data``: bytes-like, or a payload with ``put_into(backend, key)`` that replaces
        the object its own way (the writer's in-place rewrite)."""
        put_into = getattr(data, "put_into", None)
        if put_into is not None:
            put_into(self, key)
            return
        self.replace(key, data, len(data))

    def put_many(self, items: Sequence[tuple[str, Any]], temp_folder: str | None = None
                 ) -> None:
        """Create or replace each ``(key, data)`` (bytes-like), each atomically: a shard's
        objects, in one call of the write kernel without the GIL (every temp file written
        and synced before the first rename; ``replace_files`` in ``native/_write.c``).
        ``temp_folder``: a folder (key) to make the temp files in instead of beside each
        object, one the caller clears after a crash (a lane writer's own: its lane's next
        writer removes it), so a process killed mid-call leaves nothing behind.
        One by one through :meth:`put` where the kernel was not built, a payload brings
        its own way of replacing (``put_into``), or a crash point is armed (they sit
        between one object's steps). Raises ``OSError`` naming the key that failed, and
        leaves no temp file: a failed write leaves every object as it was (none is renamed
        before all are written and synced), a failed rename those after it."""
        kernel = write_kernel()
        if (kernel is None or faults.ARMED or len(items) < 2
                or any(hasattr(data, "put_into") for _, data in items)):
            super().put_many(items)
            return
        paths = [self.path(key) for key, _ in items]
        folder = None if temp_folder is None else self.path(temp_folder)
        tmps = [self._temp_for(p, folder) for p in paths]  # (folders made by the kernel)
        failed = kernel.replace_files(tmps, paths, [data for _, data in items], self.fsync)
        if failed is not None:
            i, err = failed
            raise OSError(err, os.strerror(err), items[i][0])

    def path(self, key: str) -> str:
        """The file that holds object ``key``."""
        return os.path.join(self.root, key)

    def make_folder(self, path: str) -> str:
        """Create the folder of file ``path`` (once per folder); returns it."""
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        return folder

    def _temp_for(self, path: str, folder: str | None = None) -> str:
        """A new temp file's name for file ``path``, in ``folder`` (default: beside it)."""
        folder = os.path.dirname(path) if folder is None else folder
        return os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{next(_SEQ)}.tmp")

    def replace(self, key: str, buf: Any, size: int, keep: bool = False) -> int | None:
        """Write ``buf[:size]`` to a new file, fsync it (when ``fsync``) and rename it over
        ``key``. ``keep``: return the new file's descriptor, open, instead of closing it."""
        path = self.path(key)
        self.make_folder(path)
        tmp = self._temp_for(path)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                write_all(fd, buf, 0, size, 0)
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
        return fd if keep else None

    def remove_temp_files(self, prefix: str) -> int:
        """Remove the temp files (``.<name>.<pid>.<n>.tmp``, :meth:`replace`) a process
        killed mid-put left in folder ``prefix`` (not below it); only for a folder no
        live process writes (a lane's, by its lane's writer). Returns how many."""
        try:
            names = os.listdir(self.path(prefix))
        except (FileNotFoundError, NotADirectoryError):
            return 0
        removed = 0
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.path(prefix), name))
                    removed += 1
        return removed

    def remove_tree(self, prefix: str) -> None:
        """Delete everything under ``prefix`` (a folder), if it exists."""
        root = self.path(prefix)
        self._made = {f for f in self._made if f != root and not f.startswith(root + os.sep)}
        shutil.rmtree(root, ignore_errors=True)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """Conditional write, atomic between processes of this host (``flock`` on the folder)."""
        import fcntl

        folder = os.path.dirname(self.path(key))
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return check_then_put(self, key, data, match)
        finally:
            os.close(fd)  # releases the lock

    def delete(self, key: str) -> None:
        try:
            os.remove(self.path(key))
        except FileNotFoundError:
            pass

    def size(self, key: str) -> int | None:
        try:
            return os.stat(self.path(key)).st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        out = []
        for folder, _, files in os.walk(self.path(prefix)):
            for f in files:
                out.append(os.path.relpath(os.path.join(folder, f), self.root))
        return sorted(out)

    def total_bytes(self, prefix: str = "") -> int:
        """Bytes allocated on disk (blocks), which is what a full disk runs out of; a file
        with several links (a shard and its writer's spare) counts once."""
        total = 0
        seen = set()
        for folder, _, files in os.walk(self.path(prefix)):
            for f in files:
                st = os.stat(os.path.join(folder, f))
                if st.st_nlink > 1:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += st.st_blocks * 512
        return total


def write_all(fd: int, data: Any, start: int, end: int, offset: int) -> None:
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
