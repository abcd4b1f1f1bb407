"""Exceptions raised by expstore. Each names the field or file it is about."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


class ExpstoreError(Exception):
    """Base class of expstore's errors."""


class SpecError(ExpstoreError, ValueError):
    """A spec is malformed, or a store was opened with a spec it was not created with."""


class ValidationError(ExpstoreError, ValueError):
    """A value given to ``add``/``extend`` does not fit its field; nothing was stored."""


#: what every corruption error tells the user to do (``{url}``: the store's URL)
REPAIR_HINT = ("run 'expstore verify {url}' to list all damage and 'expstore repair {url}' to "
               "rebuild lost metadata and state files and quarantine bad rows; to train on "
               "past bad chunks: make_loader(store, ..., skip_corrupt=True) or any sampler "
               "made with skip_corrupt=True, e.g. UniformSampler(store, skip_corrupt=True)")

# A store's URL at the start of a message naming one of its objects: ``<url>/<key>: ...``
# or ``<url>: ...`` / ``<url> lane 0: ...`` (keys: the group zarr.json, lane states,
# priorities, shards ``<field>/c/<i>/0``; an array's zarr.json is not told from the group's
# of a store one folder up: errors about one pass ``url=``).
_STORE_URL = re.compile(r"^(?P<url>[A-Za-z][A-Za-z0-9+.-]*://\S*?)"
                        r"(?:/(?:zarr\.json|_state/\S*?|_index/\S*?|[^/\s]+/c(?:/\d+)+))?"
                        r"(?=[:\s]|$)")


def store_url_in(message: str) -> str | None:
    """The URL of the store a corruption message starts by naming (``None`` if none)."""
    m = _STORE_URL.match(message)
    return m.group("url") if m else None


class StoreCorruptError(ExpstoreError):
    """A state file or shard is missing, truncated or fails its checks. ``str()`` ends with
    what to do (:data:`REPAIR_HINT`, naming the store: :attr:`url`, given or read from the
    start of the message); :attr:`detail` is the message without it."""

    def __init__(self, message: str = "", url: str | None = None) -> None:
        super().__init__(message)
        self.url = url if url is not None else store_url_in(message)

    @property
    def detail(self) -> str:
        """The message without the verify/repair hint."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        msg = self.detail
        if "expstore repair" in msg:
            return msg
        return f"{msg} ({REPAIR_HINT.format(url=self.url or 'PATH')})"


class StoreNotFoundError(ExpstoreError, FileNotFoundError):
    """No expstore store at a path or URL: it does not exist, is an empty folder, or holds
    something else (the message says which). Nothing there to repair."""


def error_detail(e: BaseException) -> str:
    """An error's message without the verify/repair hint (for reports listing many)."""
    return e.detail if isinstance(e, StoreCorruptError) else str(e)


class StoreLockedError(ExpstoreError):
    """Another live writer holds the lane's lease."""


class StorageError(ExpstoreError, OSError):
    """Storage kept failing (after retries) or refused a request; names the object and why."""


class WriteFailedError(StorageError):
    """Writing a shard or lane state failed (disk full, read-only storage). Committed rows
    are intact and uncommitted rows stay staged in RAM: the next ``flush()`` retries."""


class ReadOnlyError(ExpstoreError):
    """A write on a store opened with ``mode="r"``."""


class LeaseUnsupportedError(ExpstoreError, ValueError):
    """Lane leases were asked for on a backend without atomic conditional writes, where a
    lease cannot keep two writers apart; open with ``lease_ttl=None`` if this process is the
    only writer."""


class PreconditionFailed(ExpstoreError):
    """A conditional write (``Backend.put_if``) found the object in another version than
    expected; the message names the key."""


class ObjectChanged(ExpstoreError):
    """Objects were replaced after their handle pinned a version; ``handles`` lists them."""

    def __init__(self, handles: Sequence[Any]) -> None:
        super().__init__(f"{len(handles)} object(s) changed since they were opened")
        self.handles = list(handles)


class NotEnoughData(ExpstoreError):
    """The store holds too few rows that can serve the sampler's need."""


class StaleBatchError(ExpstoreError):
    """Every sample of a batch was overwritten before it could be read."""


class DatasetFormatError(ExpstoreError, ValueError):
    """A dataset file is malformed or does not hold what its format requires (names it)."""


class ChecksumError(ExpstoreError, ValueError):
    """An inner chunk's bytes do not match the crc32c stored after them (the reader turns
    it into a :class:`StoreCorruptError` naming the shard)."""
