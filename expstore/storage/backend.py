"""Where bytes live: one small abstract spec, a local and an fsspec implementation.

Keys are ``/``-separated paths relative to the store root (``obs/c/3/0/0``). Writes replace
whole objects atomically (local: temp file + fsync + rename; object stores: one PUT).
Reads go through *handles*: a local handle is an open file descriptor, so every range read
through it sees the same version of the object, even if a writer replaces it meanwhile.
"""

from __future__ import annotations

import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

Handle = Any


class Backend(ABC):
    """Object access for one store root."""

    url: str
    is_local: bool = False

    @abstractmethod
    def open_object(self, key: str) -> Handle | None:
        """A handle pinned to the current version of ``key``; ``None`` when it is missing."""

    def close_object(self, handle: Handle) -> None:  # noqa: B027 - optional hook
        """Release a handle from :meth:`open_object`."""

    @abstractmethod
    def read_ranges(self, requests: Sequence[tuple[Handle, int, int]]) -> list[bytes]:
        """Bytes ``[start, end)`` of each ``(handle, start, end)``, batched."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """Whole object, or ``None`` when missing."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Atomically create or replace ``key``."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """Bytes of ``key`` or ``None``."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursive), relative to the root."""

    def total_bytes(self, prefix: str = "") -> int:
        """Bytes of all objects under ``prefix``."""
        return sum(self.size(k) or 0 for k in self.list(prefix))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release cached resources."""


class LocalBackend(Backend):
    """A directory on local disk; reads with ``os.pread`` on cached descriptors."""

    is_local = True

    def __init__(self, root: str, fsync: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root
        self.fsync = fsync
        _raise_fd_limit()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def open_object(self, key: str) -> int | None:
        try:
            return os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            return None

    def close_object(self, handle: int) -> None:
        os.close(handle)

    def read_ranges(self, requests: Sequence[tuple[int, int, int]]) -> list[bytes]:
        pread = os.pread
        return [pread(fd, end - start, start) for fd, start, end in requests]

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def sync_dir(self, key: str) -> None:
        """fsync the folder holding ``key`` so a rename survives power loss."""
        if not self.fsync:
            return
        fd = os.open(os.path.dirname(self._path(key)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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
        base = self._path(prefix)
        out = []
        for folder, _, files in os.walk(base):
            for f in files:
                out.append(os.path.relpath(os.path.join(folder, f), self.root))
        return sorted(out)

    def total_bytes(self, prefix: str = "") -> int:
        total = 0
        for folder, _, files in os.walk(self._path(prefix)):
            for f in files:
                total += os.stat(os.path.join(folder, f)).st_blocks * 512
        return total


class FsspecBackend(Backend):
    """Any fsspec filesystem (``s3://``, ``memory://``, ...): ranged gets, whole-object puts."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.root = self.root.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def open_object(self, key: str) -> str | None:
        return self._path(key) if self.fs.exists(self._path(key)) else None

    def read_ranges(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        if not requests:
            return []
        paths = [r[0] for r in requests]
        starts = [r[1] for r in requests]
        ends = [r[2] for r in requests]
        return list(self.fs.cat_ranges(paths, starts, ends, on_error="raise"))

    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), bytes(data))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def size(self, key: str) -> int | None:
        try:
            return int(self.fs.size(self._path(key)))
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix).rstrip("/")
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        n = len(self.root) + 1
        return sorted(p[n:] if p.startswith(self.root) else p for p in found)

    def total_bytes(self, prefix: str = "") -> int:
        base = self._path(prefix).rstrip("/")
        try:
            return int(sum(d.get("size", 0) for d in self.fs.find(base, detail=True).values()))
        except FileNotFoundError:
            return 0


def backend_for(url: str, storage_options: dict[str, Any] | None = None,
                fsync: bool = True) -> Backend:
    """Backend for a path or URL: local paths and ``file://`` get :class:`LocalBackend`."""
    url = os.fspath(url)
    scheme = urlparse(url).scheme
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        return LocalBackend(url[len("file://"):] if url.startswith("file://") else url, fsync)
    return FsspecBackend(url, storage_options)


def _raise_fd_limit() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass
