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
from .local import LocalBackend, write_all
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
    "write_all",
    "MemoryBackend",
    "RetryPolicy",
    "S3Backend",
    "VersionedBackend",
    "backend_for",
    "canonical_url",
    "check_then_put",
    "content_tag",
    "fsspec_options",
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
#: storage option naming a local read-through cache of shard objects
#: (:class:`~expstore.storage.backends.shard_cache.ShardCache`): a folder, or a dict with ``path``,
#: ``max_bytes`` and ``max_object_bytes``; not passed on to fsspec
SHARD_CACHE = "shard_cache"
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
    writes survive power loss, not only process crashes. The storage option
    ``shard_cache`` wraps it in a local shard cache (see ``SHARD_CACHE``)."""
    url = os.fspath(url)
    cls = _resolve(known_backends.get(_scheme(url), DEFAULT_BACKEND))
    cache = (storage_options or {}).get(SHARD_CACHE)
    backend = cls.from_url(url, fsspec_options(storage_options), fsync)
    if cache is None:
        return backend
    from .shard_cache import ShardCache

    return ShardCache.from_options(backend, cache)


def canonical_url(url: str | os.PathLike) -> str:
    """The URL a store's backend names it by (``Backend.url``, what errors and the CLI
    print): ``file:///absolute/path`` for a path or ``file://`` URL, other URLs as given."""
    url = os.fspath(url)
    if _scheme(url) in ("", "file"):
        return "file://" + os.path.abspath(url.removeprefix("file://"))
    return url


def _scheme(url: str) -> str:
    """The scheme that picks ``url``'s backend (``""``: a plain path, drive letters too)."""
    scheme = urlparse(url).scheme.lower()
    return "" if len(scheme) == 1 and os.name == "nt" else scheme


def fsspec_options(storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """``storage_options`` without the ones expstore reads itself (``shard_cache``)."""
    if not storage_options or SHARD_CACHE not in storage_options:
        return storage_options
    return {k: v for k, v in storage_options.items() if k != SHARD_CACHE}
