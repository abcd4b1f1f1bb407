"""Storage backends as plug-ins, found by URL scheme (like fsspec's ``known_implementations``).

``known_backends`` maps a scheme to a :class:`Backend` subclass or to ``"module:Class"``,
imported on first use: importing expstore imports no remote backend (S3, GCS, Azure,
fsspec) until a URL of its scheme is opened. Paths without a scheme and ``file://`` are
local disk; a scheme with no entry goes to the generic :class:`FsspecBackend`. Adding a
backend is one module with a ``Backend`` subclass and one :func:`register_backend` call
(or one entry below). A backend whose optional dependency is missing fails with an
``ImportError`` naming the scheme and the install command (``install_hints``).

Each backend declares ``atomic_conditional_writes``: whether :meth:`Backend.put_if` is
decided atomically. Lane leases (many writers) are refused where it is ``False``.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from .base import Backend, Handle, check_then_put, content_tag
from .local import LocalBackend, write_all

if TYPE_CHECKING:
    from .azure import AzureBackend
    from .fsspec import FsspecBackend
    from .gcs import GCSBackend
    from .memory import MemoryBackend
    from .retry import RetryPolicy
    from .s3 import S3Backend
    from .versioned import VersionedBackend

#: public name -> submodule defining it, imported on first use (module ``__getattr__``)
_LAZY_NAMES = {
    "AzureBackend": "azure",
    "FsspecBackend": "fsspec",
    "GCSBackend": "gcs",
    "MemoryBackend": "memory",
    "RetryPolicy": "retry",
    "S3Backend": "s3",
    "VersionedBackend": "versioned",
}

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
    "install_hints",
    "known_backends",
    "register_backend",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
#: scheme -> how to install what its backend needs (pyproject.toml's extras), said when
#: the backend or its filesystem fails to import
install_hints: dict[str, str] = {
    **dict.fromkeys(("s3", "s3a"), 'pip install "expstore[s3]"'),
    **dict.fromkeys(("gs", "gcs"), 'pip install "expstore[gcs]"'),
    **dict.fromkeys(("az", "abfs", "abfss"), 'pip install "expstore[azure]"'),
}
#: storage option naming a local read-through cache of shard objects
#: (:class:`~expstore.storage.backends.shard_cache.ShardCache`): a folder, or a dict with ``path``,
#: ``max_bytes`` and ``max_object_bytes``; not passed on to fsspec
SHARD_CACHE = "shard_cache"
#: backend of every scheme without an entry in ``known_backends``
DEFAULT_BACKEND = "expstore.storage.backends.fsspec:FsspecBackend"


def _name(entry: type[Backend] | str) -> str:
    """An entry of ``known_backends`` as ``"module:Class"`` (a class and its path are one)."""
    return entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"


def register_backend(scheme: str, cls: type[Backend] | str, clobber: bool = False,
                     install_hint: str | None = None) -> None:
    """Serve URLs ``<scheme>://...`` with ``cls`` (a :class:`Backend` subclass, or
    ``"module:Class"`` imported when first needed). A scheme already served by another
    class raises ``ValueError`` unless ``clobber``; registering the same one again is a
    no-op. ``install_hint``: what to tell when the backend fails to import (e.g.
    ``'pip install "mypackage[mybackend]"'``)."""
    if not isinstance(cls, str) and not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"register_backend({scheme!r}): expected a Backend subclass or "
                        f"'module:Class', got {cls!r}")
    scheme = scheme.lower()
    old = known_backends.get(scheme)
    if old is not None and _name(old) != _name(cls):
        if not clobber:
            raise ValueError(f"register_backend({scheme!r}): {scheme}:// is already served by "
                             f"{_name(old)}; pass clobber=True to replace it with {_name(cls)}")
        install_hints.pop(scheme, None)  # the old backend's hint does not apply
    known_backends[scheme] = cls
    if install_hint is not None:
        install_hints[scheme] = install_hint


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
    """The backend of a path or URL, by scheme (see ``known_backends``), imported on first
    use. ``fsync``: local writes survive power loss, not only process crashes. The storage
    option ``shard_cache`` wraps it in a local shard cache (see ``SHARD_CACHE``). Raises
    ``ImportError`` naming the scheme and how to install what it needs when the backend or
    its filesystem library is missing."""
    url = os.fspath(url)
    scheme = _scheme(url)
    entry = known_backends.get(scheme, DEFAULT_BACKEND)
    try:
        cls = _resolve(entry)
        backend = cls.from_url(url, fsspec_options(storage_options), fsync)
    except ImportError as e:
        raise _missing_dependency(url, scheme, entry, e) from e
    cache = (storage_options or {}).get(SHARD_CACHE)
    if cache is None:
        return backend
    from .shard_cache import ShardCache

    return ShardCache.from_options(backend, cache)


def _missing_dependency(url: str, scheme: str, entry: type[Backend] | str,
                        error: ImportError) -> ImportError:
    """The error telling which scheme's backend could not be imported and how to fix it."""
    hint = install_hints.get(scheme)
    fix = f"; install it with: {hint}" if hint else ""
    return ImportError(f"{url}: the {scheme or 'file'}:// backend ({_name(entry)}) needs a "
                       f"package that failed to import ({error}){fix}", name=error.name)


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
