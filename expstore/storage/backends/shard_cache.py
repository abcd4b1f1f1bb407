"""A bounded read-through cache of whole shard objects on local disk, in front of any
remote backend.

:class:`ShardCache` wraps a :class:`~expstore.storage.backends.Backend` and serves the
reader's ranged reads of shard objects from local files, so a hot shard costs no request:

- **Versions are checked by header.** The reader's first read through a handle is the
  shard's head (index, crc32c and the 32-byte header with ``first_step`` and ``n_rows``).
  That read always goes to the remote store. When a cached copy of the object exists and
  its head bytes are the same (and, where the remote pins versions, its version tag, an
  S3 ETag, is the same too), the handle is bound to the cached copy and every later read
  through it is a local ``pread``. Otherwise the whole object is fetched (one GET) and
  replaces the cached copy. A cold shard thus costs one GET, a cached shard one small
  ranged GET per handle (the reader keeps handles open, so a warm reader sends none).
- **One version per handle.** A bound handle reads an open file descriptor of one cached
  copy, which a concurrent replacement or eviction does not change (the file is replaced
  by rename, unlinked by eviction), as a local store's handles do.
- **Bounded, LRU, shared.** Copies live in ``path`` (one file per object, named by a hash
  of the store URL and key), written to a temporary file and renamed. After each insert
  the folder is trimmed to ``max_bytes`` by dropping the copies used least recently (the
  file's mtime, touched when a handle binds to it). Processes on one host (DataLoader
  workers, several learners) can share one folder; each trims it.
- Only reads through handles (shard objects) are cached; lane states, leases and every
  write go to the wrapped backend unchanged.

Enable it with the storage option ``shard_cache`` (see
:func:`~expstore.storage.backends.backend_for`)::

    es.open("s3://bucket/run.zarr", storage_options={
        **s3_options, "shard_cache": {"path": "/nvme/expstore-cache", "max_bytes": 20 << 30}})
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from collections.abc import Sequence
from typing import Any

from ...errors import StorageError
from .base import Backend, Handle

#: file layout of a cached copy: magic, tag length (u16), tag (utf-8), the object's bytes
MAGIC = b"ESC1"
_TAGLEN = struct.Struct("<H")
#: default bound of the cache folder (bytes)
DEFAULT_MAX_BYTES = 4 << 30


class CachedHandle:
    """Handle of one object through the cache: the wrapped backend's handle and, once bound
    to a cached copy, that copy's file descriptor and where the object's bytes start."""

    __slots__ = ("data_start", "fd", "inner", "key")

    def __init__(self, key: str, inner: Handle) -> None:
        self.key = key
        self.inner = inner
        self.fd = -1
        self.data_start = 0

    def __repr__(self) -> str:
        return f"CachedHandle({self.key!r}, bound={self.fd >= 0})"


class ShardCache(Backend):
    """Read-through cache of whole shard objects in folder ``path``, at most ``max_bytes``
    bytes on disk; objects larger than ``max_object_bytes`` (default: an eighth of
    ``max_bytes``) are read through without being kept.

    ``stats`` counts ``hits`` (handles bound to a copy whose head matched), ``fetches``
    (whole objects fetched), ``bytes_fetched``, ``local_reads`` (ranges served from
    copies) and ``evicted`` (copies dropped to stay under the bound).
    """

    is_local = False

    def __init__(self, inner: Backend, path: str | os.PathLike,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_object_bytes: int | None = None) -> None:
        if isinstance(inner, ShardCache):
            raise TypeError("ShardCache: the wrapped backend is already a ShardCache")
        max_bytes = int(max_bytes)
        if max_bytes <= 0:
            raise ValueError(f"shard_cache: max_bytes must be a positive number of bytes, "
                             f"got {max_bytes}")
        self.inner = inner
        self.url = inner.url
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.max_object_bytes = int(max_object_bytes or max(1, max_bytes // 8))
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"shard_cache: cannot create the cache folder {self.path!r} "
                               f"({e})") from e
        self._prefix = hashlib.sha1(self.url.encode(), usedforsecurity=False).hexdigest()[:16]
        self.stats = {"hits": 0, "fetches": 0, "bytes_fetched": 0, "local_reads": 0,
                      "evicted": 0}

    @classmethod
    def from_options(cls, inner: Backend, options: Any) -> ShardCache:
        """The cache a ``shard_cache`` storage option asks for: a folder (``str`` / path)
        or a dict with ``path`` and optionally ``max_bytes``, ``max_object_bytes``."""
        if isinstance(options, (str, os.PathLike)):
            return cls(inner, options)
        if not isinstance(options, dict) or "path" not in options:
            raise ValueError(f"storage option shard_cache: expected a folder path or a dict "
                             f"with 'path' (and optionally 'max_bytes', 'max_object_bytes'), "
                             f"got {options!r}")
        unknown = set(options) - {"path", "max_bytes", "max_object_bytes"}
        if unknown:
            raise ValueError(f"storage option shard_cache: unknown keys {sorted(unknown)}; "
                             f"expected 'path', 'max_bytes', 'max_object_bytes'")
        return cls(inner, options["path"], options.get("max_bytes", DEFAULT_MAX_BYTES),
                   options.get("max_object_bytes"))

    # -- what the wrapped backend says ------------------------------------------------------
    @property
    def pins_versions(self) -> bool:  # type: ignore[override]
        return self.inner.pins_versions

    @property
    def atomic_conditional_writes(self) -> bool:  # type: ignore[override]
        return self.inner.atomic_conditional_writes

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- cached copies ----------------------------------------------------------------------
    def _file(self, key: str) -> str:
        h = hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()
        return os.path.join(self.path, f"{self._prefix}-{h}")

    def _open_copy(self, key: str) -> tuple[int, int, str] | None:
        """(fd, where the object's bytes start, tag) of the cached copy of ``key``."""
        try:
            fd = os.open(self._file(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            head = os.pread(fd, 6, 0)
            if len(head) == 6 and head[:4] == MAGIC:
                n = _TAGLEN.unpack(head[4:6])[0]
                tag = os.pread(fd, n, 6)
                if len(tag) == n:
                    return fd, 6 + n, tag.decode()
        except OSError:
            pass
        os.close(fd)
        return None

    def _store(self, key: str, data: bytes, tag: str | None) -> tuple[int, int] | None:
        """Write a copy of ``key`` (atomically: temp file, rename); its (fd, data start)."""
        if len(data) > self.max_object_bytes:
            return None
        t = (tag or "").encode()[:65535]
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
        try:
            os.write(fd, MAGIC + _TAGLEN.pack(len(t)) + t)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.replace(tmp, self._file(key))
        except OSError:  # a full disk costs the cache, never the read
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return None
        self._trim()
        return fd, 6 + len(t)

    def _trim(self) -> None:
        """Drop the least recently used copies until the folder holds <= ``max_bytes``."""
        entries = []
        total = 0
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_size
                    if not e.name.startswith(".tmp-"):
                        entries.append((st.st_mtime_ns, st.st_size, e.path))
        except OSError:
            return
        if total <= self.max_bytes:
            return
        entries.sort()
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
                self.stats["evicted"] += 1
            except OSError:
                pass
            total -= size

    # -- reads ------------------------------------------------------------------------------
    def open_object(self, key: str) -> CachedHandle | None:
        inner = self.inner.open_object(key)
        return None if inner is None else CachedHandle(key, inner)

    def close_object(self, handle: CachedHandle) -> None:
        if handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1
        self.inner.close_object(handle.inner)

    def read_ranges(self, requests: Sequence[tuple[CachedHandle, int, int]],
                    missing_ok: bool = False) -> list[bytes | None]:
        if not requests:
            return []
        out: list[bytes | None] = [None] * len(requests)
        unbound: dict[int, list[int]] = {}
        for i, (h, s, e) in enumerate(requests):
            if h.fd >= 0:
                out[i] = os.pread(h.fd, e - s, h.data_start + s)
            else:
                unbound.setdefault(id(h), []).append(i)
        self.stats["local_reads"] += len(requests) - sum(map(len, unbound.values()))
        if not unbound:
            return out
        # handles whose reads include the head (offset 0) are checked against, or fill,
        # the cache; others read through the wrapped backend
        checks, through = [], []
        for ids in unbound.values():
            (checks if any(requests[i][1] == 0 for i in ids) else through).append(ids)
        copies = {}
        for ids in checks:
            h = requests[ids[0]][0]
            copy = self._open_copy(h.key)
            copies[id(h)] = copy  # None: no copy, fetched whole below
        remote = [i for ids in checks if copies[id(requests[ids[0]][0])] is not None
                  for i in ids]
        remote += [i for ids in through for i in ids]
        got = self.inner.read_ranges([(requests[i][0].inner, requests[i][1], requests[i][2])
                                      for i in remote], missing_ok=True)
        for i, blob in zip(remote, got):
            out[i] = blob
        fetch: list[list[int]] = []
        for ids in checks:
            h = requests[ids[0]][0]
            copy = copies[id(h)]
            if copy is None:
                fetch.append(ids)
            elif not self._bind(h, copy, [(requests[i][1], requests[i][2], out[i])
                                          for i in ids]):
                fetch.append(ids)
        if fetch:
            self._fetch_whole(requests, fetch, out)
        if not missing_ok:
            for i, blob in enumerate(out):
                if blob is None:
                    raise FileNotFoundError(f"{self.url}/{requests[i][0].key}: object is missing")
        return out

    def _bind(self, h: CachedHandle, copy: tuple[int, int, str],
              remote: list[tuple[int, int, bytes | None]]) -> bool:
        """Bind ``h`` to the cached copy when the remote head read matches it (bytes, and
        the version tag where the remote pins versions); else close the copy."""
        fd, start, tag = copy
        inner_tag = getattr(h.inner, "tag", None)
        same = all(blob is not None and os.pread(fd, e - s, start + s) == blob
                   for s, e, blob in remote)
        if same and inner_tag is not None and tag and tag != inner_tag:
            same = False
        if not same:
            os.close(fd)
            return False
        h.fd, h.data_start = fd, start
        self.stats["hits"] += 1
        try:
            os.utime(self._file(h.key))  # recently used
        except OSError:
            pass
        return True

    def _fetch_whole(self, requests: Sequence[tuple[CachedHandle, int, int]],
                     groups: list[list[int]], out: list[bytes | None]) -> None:
        """Fetch the objects of ``groups`` whole (concurrently where the backend can),
        serve their requests from those bytes and keep copies."""
        handles = [requests[ids[0]][0] for ids in groups]
        got = get_tagged_many(self.inner, [h.key for h in handles])
        for h, ids, item in zip(handles, groups, got):
            if item is None:
                for i in ids:
                    out[i] = None
                continue
            data, tag = item
            self.stats["fetches"] += 1
            self.stats["bytes_fetched"] += len(data)
            if hasattr(h.inner, "tag") and getattr(self.inner, "pins_versions", False):
                h.inner.tag = tag  # reads through the wrapped handle see this version
            mv = memoryview(data)
            for i in ids:
                _, s, e = requests[i]
                out[i] = bytes(mv[s:e])
            stored = self._store(h.key, data, tag if self.inner.pins_versions else None)
            if stored is not None:
                h.fd, h.data_start = stored

    # -- everything else goes to the wrapped backend ----------------------------------------
    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return self.inner.get_many(keys)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.get_tagged(key)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        self.inner.put_many(items)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        return self.inner.put_if(key, data, match)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def size(self, key: str) -> int | None:
        return self.inner.size(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def total_bytes(self, prefix: str = "") -> int:
        return self.inner.total_bytes(prefix)

    def close(self) -> None:
        self.inner.close()


def get_tagged_many(backend: Backend, keys: Sequence[str]) -> list[tuple[bytes, str] | None]:
    """Whole objects and their version tags, concurrently where ``backend`` can."""
    many = getattr(backend, "get_tagged_many", None)
    if many is not None:
        return many(keys)
    return [backend.get_tagged(k) for k in keys]
