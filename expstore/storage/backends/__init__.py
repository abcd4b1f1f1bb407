"""Storage backends as plug-ins, found by URL scheme (like fsspec's ``known_implementations``).

``known_backends`` maps a scheme to a :class:`Backend` subclass or to ``"module:Class"``,
imported on first use. Paths without a scheme and ``file://`` are local disk; a scheme with
no entry goes to the generic :class:`FsspecBackend`. Adding a backend is one module with a
``Backend`` subclass and one :func:`register_backend` call (or one entry below).

Each backend declares ``atomic_conditional_writes``: whether :meth:`Backend.put_if` is
decided atomically. Lane leases (many writers) are refused where it is ``False``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any
from urllib.parse import urlparse

from .azure import AzureBackend
from .base import Backend, Handle, check_then_put, content_tag
from .fsspec import FsspecBackend
from .gcs import GCSBackend
from .local import LocalBackend
from .memory import MemoryBackend
from .retry import RetryPolicy
from .s3 import S3Backend
from .versioned import VersionedBackend

__all__ = [
    "AzureBackend",
    "Backend",
    "FsspecBackend",
    "GCSBackend",
    "Handle",
    "LocalBackend",
    "MemoryBackend",
    "RetryPolicy",
    "S3Backend",
    "VersionedBackend",
    "backend_for",
    "check_then_put",
    "content_tag",
    "known_backends",
    "register_backend",
]

#: scheme -> backend class or ``"module:Class"`` (imported on first use)
known_backends: dict[str, type[Backend] | str] = {
    "": "expstore.storage.backends.local:LocalBackend",
    "file": "expstore.storage.backends.local:LocalBackend",
    "memory": "expstore.storage.backends.memory:MemoryBackend",
    "s3": "expstore.storage.backends.s3:S3Backend",
    "s3a": "expstore.storage.backends.s3:S3Backend",
    "gs": "expstore.storage.backends.gcs:GCSBackend",
    "gcs": "expstore.storage.backends.gcs:GCSBackend",
    "az": "expstore.storage.backends.azure:AzureBackend",
    "abfs": "expstore.storage.backends.azure:AzureBackend",
    "abfss": "expstore.storage.backends.azure:AzureBackend",
}
#: backend of every scheme without an entry in ``known_backends``
DEFAULT_BACKEND = "expstore.storage.backends.fsspec:FsspecBackend"


def register_backend(scheme: str, cls: type[Backend] | str) -> None:
    """Serve URLs ``<scheme>://...`` with ``cls`` (a :class:`Backend` subclass, or
    ``"module:Class"`` imported when first needed), replacing any earlier entry."""
    if not isinstance(cls, str) and not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"register_backend({scheme!r}): expected a Backend subclass or "
                        f"'module:Class', got {cls!r}")
    known_backends[scheme.lower()] = cls


def _resolve(entry: type[Backend] | str) -> type[Backend]:
    if not isinstance(entry, str):
        return entry
    module, _, name = entry.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"{entry}: not a Backend subclass")
    return cls


def backend_for(url: str | os.PathLike, storage_options: dict[str, Any] | None = None,
                fsync: bool = True) -> Backend:
    """The backend of a path or URL, by scheme (see ``known_backends``). ``fsync``: local
    writes survive power loss, not only process crashes."""
    url = os.fspath(url)
    scheme = urlparse(url).scheme.lower()
    if len(scheme) == 1 and os.name == "nt":
        scheme = ""  # a drive letter
    cls = _resolve(known_backends.get(scheme, DEFAULT_BACKEND))
    return cls.from_url(url, storage_options, fsync)
