"""A sampler's priorities saved in a store: ``_index/<name>.bin`` (``storage/format``
encodes it), written and read back for :meth:`Store.save_priorities` /
:meth:`Store.load_priorities`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ReadOnlyError, StoreCorruptError
from .storage.backends import Backend
from .storage.format import decode_priorities, encode_priorities, priority_key


def save_priority_file(backend: Backend, mode: str, name: str,
                       payload: Mapping[str, Any]) -> None:
    """Write ``payload`` (``PriorityIndex.payload()``) as ``_index/<name>.bin``, replacing
    the last one atomically; ``ReadOnlyError`` where the store is open with ``mode="r"``."""
    if mode == "r":
        raise ReadOnlyError(f"{backend.url}: store opened read-only; priorities cannot be "
                            "saved (open with mode='r+')")
    backend.put(priority_key(name), encode_priorities({"name": name, **payload}))


def load_priority_file(backend: Backend, name: str, capacity: int, lanes: int
                       ) -> dict[str, Any] | None:
    """The payload saved as ``name`` (``None`` if there is none), with ``source`` naming
    where it came from. ``StoreCorruptError`` if it is damaged or was saved for another
    ``capacity`` (rows) or number of ``lanes``."""
    key = priority_key(name)
    raw = backend.get(key)
    if raw is None:
        return None
    where = f"{backend.url}/{key}"
    saved = decode_priorities(raw, where)
    if saved["capacity"] != capacity or saved["lanes"] != lanes:
        raise StoreCorruptError(
            f"{where}: saved for capacity {saved['capacity']} / {saved['lanes']} lanes, "
            f"the store has {capacity} / {lanes}")
    saved["source"] = where
    return saved
