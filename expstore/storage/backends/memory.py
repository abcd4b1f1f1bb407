"""``memory://``: objects in this process's RAM (fsspec's memory filesystem, which zarr
reads too). Forked children get a copy, not a shared view: one process per store."""

from __future__ import annotations

import threading

from .base import check_then_put
from .fsspec import FsspecBackend

#: fsspec's memory filesystem is one dict per process: one lock orders all its writes
_LOCK = threading.RLock()


class MemoryBackend(FsspecBackend):
    """In-process objects. Every write holds one process-wide lock, so :meth:`put_if`
    (read, compare, write under the lock) is atomic between the threads of this process."""

    atomic_conditional_writes = True

    def put(self, key: str, data: bytes) -> None:
        with _LOCK:
            super().put(key, data)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        with _LOCK:
            return check_then_put(self, key, data, match)

    def delete(self, key: str) -> None:
        with _LOCK:
            super().delete(key)
