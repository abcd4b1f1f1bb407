"""Test helpers for the write path: count a method's calls, fill a store's disk."""

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


def disk_full(store: Any) -> list[bool]:
    """Make ``store.backend.put`` fail with ENOSPC for every object but lane states while
    the returned switch holds ``True`` (set ``switch[0] = False`` to free the disk)."""
    real = store.backend.put
    full = [True]

    def put(key: str, blob: Any) -> None:
        if full[0] and "_state" not in key:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)
        real(key, blob)

    store.backend.put = put
    return full
