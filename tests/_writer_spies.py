"""Test helpers for the write path: count a method's calls, fill a store's disk, route a
backend's object writes through a test double."""

from __future__ import annotations

import errno
import os
from typing import Any


def count_calls(monkeypatch: Any, cls: type, name: str) -> list:
    """Calls of ``cls.name`` (still made), one entry each."""
    calls, real = [], getattr(cls, name)

    def spy(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(cls, name, spy)
    return calls


def route_puts(backend: Any, put: Any) -> None:
    """Send every object write of ``backend`` through ``put(key, data)`` (a double that
    fails or stalls): ``put`` and ``put_many`` (a full shard's objects at once, which a
    local backend otherwise writes in one kernel call that ``put`` never sees)."""

    def put_many(items: Any, temp_folder: str | None = None) -> None:
        for key, data in items:
            put(key, data)

    backend.put, backend.put_many = put, put_many


def unroute_puts(backend: Any) -> None:
    """Undo :func:`route_puts`: the backend's own ``put`` and ``put_many`` again."""
    del backend.put, backend.put_many


def disk_full(store: Any) -> list[bool]:
    """Make ``store.backend.put`` fail with ENOSPC for every object but lane states while
    the returned switch holds ``True`` (set ``switch[0] = False`` to free the disk)."""
    real = store.backend.put
    full = [True]

    def put(key: str, blob: Any) -> None:
        if full[0] and "_state" not in key:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)
        real(key, blob)

    route_puts(store.backend, put)
    return full
