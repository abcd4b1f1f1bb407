"""Where bytes live: one small abstract spec, a local and an fsspec implementation.

Keys are ``/``-separated paths relative to the store root (``obs/c/3/0/0``). Writes replace
whole objects atomically (local: temp file + fsync + rename; object stores: one PUT).
Reads go through *handles*: a local handle is an open file descriptor, so every range read
through it sees the same version of the object, even if a writer replaces it meanwhile.
Remote handles (``storage.remote``) pin the version seen by their first read where the
store can (S3 ETags): a later read of a replaced object raises :class:`ObjectChanged`.
Small objects (lane state, leases) also have conditional writes (:meth:`Backend.put_if`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from . import faults

Handle = Any


class PreconditionFailed(Exception):
    """A conditional write found the object in another version than expected."""


class ObjectChanged(Exception):
    """Objects were replaced after their handle pinned a version; ``handles`` lists them."""

    def __init__(self, handles: Sequence[Handle]) -> None:
        super().__init__(f"{len(handles)} object(s) changed since they were opened")
        self.handles = list(handles)


def content_tag(data: bytes) -> str:
    """Version tag of an object's bytes where the store has none of its own."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class Backend(ABC):
    """Object access for one store root."""

    url: str
    is_local: bool = False
    #: handles see one version of an object for their lifetime (else readers re-check)
    pins_versions: bool = True

    @abstractmethod
    def open_object(self, key: str) -> Handle | None:
        """A handle pinned to the current version of ``key``; ``None`` when it is missing.

        Remote backends return a handle without a round trip; a missing object then
        shows up on the first read through it.
        """

    def close_object(self, handle: Handle) -> None:  # noqa: B027 - optional hook
        """Release a handle from :meth:`open_object`."""

    @abstractmethod
    def read_ranges(self, requests: Sequence[tuple[Handle, int, int]],
                    missing_ok: bool = False) -> list[bytes | None]:
        """Bytes ``[start, end)`` of each ``(handle, start, end)``, batched.

        ``None`` for requests on a missing object when ``missing_ok`` (else
        ``FileNotFoundError``); :class:`ObjectChanged` when a pinned version is gone.
        """

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """Whole object, or ``None`` when missing."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Several whole objects (``None`` where missing); remote backends fetch concurrently."""
        return [self.get(k) for k in keys]

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Atomically create or replace ``key``."""

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """Whole object and its version tag, or ``None`` when missing."""
        data = self.get(key)
        return None if data is None else (data, content_tag(data))

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """Write ``key`` only if its tag is ``match`` (``None``: only if it is missing).

        Returns the new tag; raises :class:`PreconditionFailed` otherwise. This generic
        version checks, then writes: not atomic (backends override it where they can).
        """
        cur = self.get_tagged(key)
        if (cur[1] if cur else None) != match:
            raise PreconditionFailed(key)
        self.put(key, data)
        return content_tag(data)

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
            return super().put_if(key, data, match)
        finally:
            os.close(fd)  # releases the lock

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


def backend_for(url: str, storage_options: dict[str, Any] | None = None,
                fsync: bool = True) -> Backend:
    """Backend for a path or URL: local paths and ``file://`` get :class:`LocalBackend`."""
    url = os.fspath(url)
    scheme = urlparse(url).scheme
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        return LocalBackend(url[len("file://"):] if url.startswith("file://") else url, fsync)
    from .remote import FsspecBackend

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


def __getattr__(name: str) -> Any:  # ``backend.FsspecBackend`` lives in ``storage.remote``
    if name == "FsspecBackend":
        from .remote import FsspecBackend

        return FsspecBackend
    raise AttributeError(name)
