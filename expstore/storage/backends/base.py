"""Where bytes live: the one small abstract :class:`Backend` every storage plug-in implements.

Keys are ``/``-separated paths relative to the store root (``obs/c/3/0/0``). Writes replace
whole objects atomically (local: temp file + fsync + rename; object stores: one PUT).
Reads go through *handles*: a local handle is an open file descriptor, so every range read
through it sees the same version of the object, even if a writer replaces it meanwhile.
Remote handles pin the version seen by their first read where the store can (S3 ETags): a
later read of a replaced object raises :class:`~expstore.errors.ObjectChanged`.
Small objects (lane state, leases) also have conditional writes (:meth:`Backend.put_if`);
a backend says whether they are atomic in :attr:`Backend.atomic_conditional_writes`.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ...errors import PreconditionFailed

Handle = Any


def content_tag(data: bytes) -> str:
    """Version tag of an object's bytes where the store has none of its own (md5 hex)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class Backend(ABC):
    """Object access for one store root (``url``)."""

    url: str
    #: objects are files of this host (``os`` calls work on ``root``)
    is_local: bool = False
    #: handles see one version of an object for their lifetime (else readers re-check)
    pins_versions: bool = True
    #: :meth:`put_if` is decided atomically (no check-then-write window), so two writers
    #: racing for one object cannot both win; lane leases need it
    atomic_conditional_writes: bool = False

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> Backend:
        """The backend of ``url`` (how :func:`~expstore.storage.backends.backend_for`
        builds registered backends); ``fsync`` matters to local disks only."""
        return cls(url, storage_options)  # type: ignore[call-arg]

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
        """Bytes ``[start, end)`` of each ``(handle, start, end)``, batched, in order.

        ``None`` for requests on a missing object when ``missing_ok`` (else
        ``FileNotFoundError``); :class:`~expstore.errors.ObjectChanged` when a pinned
        version is gone.
        """

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """Whole object, or ``None`` when missing."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Several whole objects in the order of ``keys`` (``None`` where missing); remote
        backends fetch them concurrently."""
        return [self.get(k) for k in keys]

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Atomically create or replace ``key``."""

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Atomically create or replace each ``(key, data)``; remote backends write them
        concurrently (all written when it returns; on failure some may be)."""
        for key, data in items:
            self.put(key, data)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """Whole object and its version tag, or ``None`` when missing."""
        data = self.get(key)
        return None if data is None else (data, content_tag(data))

    @abstractmethod
    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """Write ``key`` only if its tag (as :meth:`get_tagged` gives it) is ``match``
        (``None``: only if it is missing); returns the new tag.

        Raises :class:`~expstore.errors.PreconditionFailed` otherwise. Atomic only where
        :attr:`atomic_conditional_writes` says so; backends declaring ``False`` may use
        :func:`check_then_put`.
        """

    def put_many_if(self, items: Sequence[tuple[str, bytes, str | None]]
                    ) -> list[str | PreconditionFailed]:
        """:meth:`put_if` of each ``(key, data, match)`` (remote backends: concurrently);
        per item the new tag, or the :class:`PreconditionFailed` refusing it. Other
        errors raise (after every write finished)."""
        out: list[str | PreconditionFailed] = []
        for key, data, match in items:
            try:
                out.append(self.put_if(key, data, match))
            except PreconditionFailed as e:
                out.append(e)
        return out

    def tag_of(self, key: str) -> str | None:
        """Version tag of ``key`` as :meth:`get_tagged` names it (``None``: missing);
        remote backends ask without downloading the object."""
        got = self.get_tagged(key)
        return None if got is None else got[1]

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """Bytes of ``key``, or ``None`` when missing."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Sorted keys under the folder ``prefix`` (recursive), relative to the root."""

    def total_bytes(self, prefix: str = "") -> int:
        """Bytes of all objects under ``prefix`` (local disks: bytes allocated)."""
        return sum(self.size(k) or 0 for k in self.list(prefix))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release cached resources (idempotent)."""


def check_then_put(backend: Backend, key: str, data: bytes, match: str | None) -> str:
    """:meth:`Backend.put_if` by reading the tag, then writing: NOT atomic by itself.

    The fallback of backends declaring ``atomic_conditional_writes = False``; others call it
    only while holding a lock that excludes every other conditional writer of ``key``.
    """
    cur = backend.get_tagged(key)
    if (cur[1] if cur else None) != match:
        raise PreconditionFailed(f"{backend.url}/{key}: expected version {match}, found "
                                 f"{cur[1] if cur else 'no object'}")
    backend.put(key, data)
    return content_tag(data)
