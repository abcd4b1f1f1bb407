"""A store root on local disk: plain paths and ``file://`` URLs."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from typing import Any

from .. import faults
from .base import Backend, check_then_put


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

    def put(self, key: str, data: bytes) -> None:
        """Temp file, fsync (when ``fsync``), rename: readers see the old or the new bytes."""
        path = self._path(key)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if faults.ARMED:
                faults.hit("put.rename")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):  # a failed write leaves no partial temp file
                os.remove(tmp)
            raise

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
        """Bytes allocated on disk (blocks), which is what a full disk runs out of."""
        total = 0
        for folder, _, files in os.walk(self._path(prefix)):
            for f in files:
                total += os.stat(os.path.join(folder, f)).st_blocks * 512
        return total


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
