"""Exceptions raised by expstore. Each names the field or file it is about."""


class ExpstoreError(Exception):
    """Base class of expstore's errors."""


class SpecError(ExpstoreError, ValueError):
    """A spec is malformed, or a store was opened with a spec it was not created with."""


class ValidationError(ExpstoreError, ValueError):
    """A value given to ``add``/``extend`` does not fit its field; nothing was stored."""


class StoreCorruptError(ExpstoreError):
    """A state file or shard is missing, truncated or fails its checks."""


class StoreLockedError(ExpstoreError):
    """Another live writer holds the lane's lease."""


class StorageError(ExpstoreError, OSError):
    """Storage kept failing (after retries) or refused a request; names the object and why."""


class WriteFailedError(StorageError):
    """Writing a shard or lane state failed (disk full, read-only storage). Committed rows
    are intact and uncommitted rows stay staged in RAM: the next ``flush()`` retries."""


class ReadOnlyError(ExpstoreError):
    """A write on a store opened with ``mode="r"``."""
