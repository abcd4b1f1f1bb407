"""Any fsspec filesystem (``sftp://``, ``hdfs://``, ``local://``, ...): the generic backend.

Reads: the ranges one batch needs are grouped per object and ranges closer than
``max_gap`` bytes are merged into one span, so a batch costs one ranged GET per object it
touches (with the default gap); on asynchronous filesystems all spans are fetched
concurrently. Generic filesystems cannot pin versions: the reader re-checks shard headers
after reading. Writes are whole objects, one PUT each; :meth:`FsspecBackend.put_many`
(a flush's shard objects) runs up to ``max_uploads`` PUTs at once. Conditional writes are
read, compare, then write: NOT atomic (``atomic_conditional_writes = False``), so stores
here refuse lane leases (one writer, ``lease_ttl=None``). Every request goes through the
retry core (:mod:`.retry`); ``requests`` counts the requests issued, by kind.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ...errors import ObjectChanged, PreconditionFailed, StorageError
from .. import faults
from .base import Backend, check_then_put, content_tag
from .retry import RetryPolicy, retrying, run_blocking

T = TypeVar("T")

#: merge ranges of one object whose gap is at most this (bytes): at ~100 MB/s per stream
#: 2 MiB cost about one request's first-byte latency on S3 (20-30 ms)
MAX_GAP = 2 << 20

#: one span of a batched read: (handle, start, end, indices of the requests it serves)
Span = tuple["RemoteObject", int, int, list[int]]


class RemoteObject:
    """Handle of one remote object: its path and, once read, the version tag it pinned."""

    __slots__ = ("key", "path", "tag")

    def __init__(self, key: str, path: str) -> None:
        self.key = key
        self.path = path
        self.tag: str | None = None

    def __repr__(self) -> str:
        return f"RemoteObject({self.key!r}, tag={self.tag!r})"


class FsspecBackend(Backend):
    """Any fsspec filesystem: coalesced ranged GETs, whole-object PUTs, retries.

    ``storage_options`` go to fsspec unchanged. ``retry`` paces retries of transient
    errors, ``max_gap`` (bytes; -1: never merge) and ``max_concurrency`` (requests in
    flight) shape batched reads; ``max_uploads``: PUTs in flight in :meth:`put_many`.
    """

    is_local = False
    pins_versions = False
    atomic_conditional_writes = False

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None, max_gap: int = MAX_GAP,
                 max_concurrency: int = 64, max_uploads: int = 16) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.max_gap = int(max_gap)
        self.max_concurrency = int(max_concurrency)
        if int(max_uploads) < 1:
            raise ValueError(f"max_uploads: expected at least 1 PUT in flight, got {max_uploads}")
        self.max_uploads = int(max_uploads)
        self.requests: Counter[str] = Counter()
        self._fs: Any = None
        self._pid = -1
        self.fs  # noqa: B018 - connect now: bad URLs / options fail here

    # -- plumbing ---------------------------------------------------------------------------
    def _fs_options(self) -> dict[str, Any]:
        """Options the filesystem is created with (subclasses add defaults)."""
        return dict(self.storage_options)

    @property
    def fs(self) -> Any:
        """The filesystem, re-created in a forked child (fsspec's async ones are not fork-safe)."""
        if self._fs is None or self._pid != os.getpid():
            import fsspec

            self._fs, root = fsspec.core.url_to_fs(self.url, **self._fs_options())
            self.root = root.rstrip("/")
            self._pid = os.getpid()
        return self._fs

    def _path(self, key: str) -> str:
        self.fs  # noqa: B018 - sets root
        return f"{self.root}/{key}"

    def _call(self, what: str, key: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a plain call) with retries."""
        return run_blocking(retrying(self, what, key, fn, *args, blocking=True))

    def _sync(self, coro_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``coro_fn(*args)`` on the filesystem's event loop and wait for it."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args)

    # -- reads ------------------------------------------------------------------------------
    def open_object(self, key: str) -> RemoteObject:
        """Free: no round trip. A missing object shows up when the handle is first read."""
        return RemoteObject(key, self._path(key))

    def read_ranges(self, requests: Sequence[tuple[RemoteObject, int, int]],
                    missing_ok: bool = False) -> list[bytes | None]:
        if not requests:
            return []
        spans = self._spans(requests)
        blobs = self._fetch(spans)
        out: list[bytes | None] = [None] * len(requests)
        for (h, s0, _e0, ids), blob in zip(spans, blobs):
            if blob is None:
                if not missing_ok:
                    raise FileNotFoundError(f"{self.url}/{h.key}: object is missing")
                continue
            mv = memoryview(blob)
            for i in ids:
                _, s, e = requests[i]
                out[i] = bytes(mv[s - s0 : e - s0])
        return out

    def _spans(self, requests: Sequence[tuple[RemoteObject, int, int]]) -> list[Span]:
        """Merge each object's ranges whose gap is <= ``max_gap`` into spans."""
        by_obj: dict[int, list[int]] = {}
        for i, (h, _, _) in enumerate(requests):
            by_obj.setdefault(id(h), []).append(i)
        spans = []
        for ids in by_obj.values():
            ids.sort(key=lambda i: requests[i][1])
            h, s0, e0 = requests[ids[0]]
            cur = [ids[0]]
            for i in ids[1:]:
                _, s, e = requests[i]
                if s - e0 <= self.max_gap:
                    e0 = max(e0, e)
                    cur.append(i)
                else:
                    spans.append((h, s0, e0, cur))
                    h, s0, e0, cur = requests[i][0], s, e, [i]
            spans.append((h, s0, e0, cur))
        return spans

    def _fetch(self, spans: list[Span]) -> list[bytes | None]:
        """Bytes of each span (``None``: object missing): concurrent on async filesystems."""
        if self.fs.async_impl:
            return self._sync(self._afetch, spans)
        out: list[bytes | None] = []
        for h, s, e, _ in spans:
            try:
                out.append(b"" if e <= s else bytes(
                    self._call("ranged GET", h.key, self._counted_range, h.path, s, e)))
            except FileNotFoundError:
                out.append(None)
        return out

    def _counted_range(self, path: str, start: int, end: int) -> bytes:
        self.requests["range_get"] += 1
        return self.fs.cat_file(path, start, end)

    async def _afetch(self, spans: list[Span]) -> list[bytes | None]:
        sem = asyncio.Semaphore(self.max_concurrency)

        async def one(h: RemoteObject, s: int, e: int) -> Any:
            if e <= s:
                return b"", h.tag
            async with sem:
                return await retrying(self, "ranged GET", h.key, self._aget_range, h, s, e)

        got = await asyncio.gather(*(one(h, s, e) for h, s, e, _ in spans),
                                   return_exceptions=True)
        return self._collect(spans, got)

    async def _aget_range(self, h: RemoteObject, start: int, end: int
                          ) -> tuple[bytes, str | None]:
        """One ranged GET on an async filesystem: (bytes, version tag or ``None``)."""
        self.requests["range_get"] += 1
        return await self.fs._cat_file(h.path, start=start, end=end), None

    def _collect(self, spans: list[Span], got: list[Any]) -> list[bytes | None]:
        """Results of :meth:`_afetch` (``(bytes, tag)`` or an exception) -> bytes or None;
        backends whose reads name versions pin handles (:func:`collect_pinned`)."""
        out: list[bytes | None] = []
        for r in got:
            if isinstance(r, FileNotFoundError):
                out.append(None)
            elif isinstance(r, BaseException):
                raise r
            else:
                out.append(bytes(r[0]))
        return out

    def get_tagged_many(self, keys: Sequence[str]) -> list[tuple[bytes, str] | None]:
        """Whole objects and their version tags (``None`` where missing), fetched
        concurrently on async filesystems (up to ``max_concurrency``)."""
        if not self.fs.async_impl or len(keys) <= 1:
            return [self.get_tagged(k) for k in keys]

        return self._each(keys, lambda k: self._aget_tagged(self._path(k)))

    def _each(self, keys: Sequence[str], fetch: Callable[[str], Awaitable[T]]
              ) -> list[T | None]:
        """``fetch(key)`` for every key, up to ``max_concurrency`` at once, each retried;
        ``None`` where the object is missing; the first other error is raised (after all
        finished)."""
        async def all_() -> list[Any]:
            sem = asyncio.Semaphore(self.max_concurrency)

            async def one(k: str) -> Any:
                async with sem:
                    try:
                        return await retrying(self, "GET", k, fetch, k)
                    except FileNotFoundError:
                        return None

            return await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)

        got = self._sync(all_)
        for r in got:
            if isinstance(r, BaseException):
                raise r
        return list(got)

    async def _aget_tagged(self, path: str) -> tuple[bytes, str]:
        self.requests["get"] += 1
        data = bytes(await self.fs._cat_file(path))
        return data, content_tag(data)

    def get(self, key: str) -> bytes | None:
        self.requests["get"] += 1
        try:
            return self._call("GET", key, self.fs.cat_file, self._path(key))
        except FileNotFoundError:
            return None

    # -- writes -----------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        try:
            self._put(key, bytes(data))
        except FileNotFoundError as e:
            raise StorageError(f"{self.url}/{key}: PUT failed (a permanent error: not "
                               f"retried): the bucket or path does not exist ({e})") from e

    def _put(self, key: str, data: bytes) -> None:
        self.requests["put"] += 1
        self._call("PUT", key, self.fs.pipe_file, self._path(key), data)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Write several whole objects, up to ``max_uploads`` at once, each atomically.

        Returns once all are written; on a failure, raises the first one (as :meth:`put`
        does) after the others finished, so some objects may be written and others not.
        """
        items = [(k, bytes(d)) for k, d in items]
        if len(items) <= 1 or self.max_uploads == 1:
            for k, d in items:
                self.put(k, d)
                _upload_done()
            return
        if self.fs.async_impl:
            got = self._sync(self._aput_many, items)
        else:
            from concurrent.futures import ThreadPoolExecutor

            def one(item: tuple[str, bytes]) -> BaseException | None:
                try:
                    self.put(*item)
                    _upload_done()
                except BaseException as e:  # noqa: BLE001 - re-raised below
                    return e
                return None

            with ThreadPoolExecutor(min(self.max_uploads, len(items))) as pool:
                got = list(pool.map(one, items))
        for r in got:
            if isinstance(r, BaseException):
                raise r

    async def _aput_many(self, items: list[tuple[str, bytes]]) -> list[Any]:
        sem = asyncio.Semaphore(self.max_uploads)

        async def one(key: str, data: bytes) -> None:
            async with sem:
                try:
                    await retrying(self, "PUT", key, self._aput, key, data)
                except FileNotFoundError as e:
                    raise StorageError(f"{self.url}/{key}: PUT failed (a permanent error: "
                                       f"not retried): the bucket or path does not exist "
                                       f"({e})") from e
            _upload_done()

        return await asyncio.gather(*(one(k, d) for k, d in items), return_exceptions=True)

    async def _aput(self, key: str, data: bytes) -> None:
        """One PUT of ``key`` on an async filesystem (the path :meth:`_put` takes too:
        subclasses with their own upload override both)."""
        self.requests["put"] += 1
        path = self._path(key)
        await self.fs._pipe_file(path, data)
        self.fs.invalidate_cache(path)

    async def _aput_if(self, key: str, data: bytes, match: str | None) -> str:
        """One conditional PUT decided by the server (backends with atomic conditional
        writes implement it; :meth:`put_many_if` then runs them concurrently)."""
        raise NotImplementedError

    def put_many_if(self, items: Sequence[tuple[str, bytes, str | None]]
                    ) -> list[str | PreconditionFailed]:
        """Conditional writes, up to ``max_uploads`` at once where the server decides them
        (each one goes through the retry core; ``put.upload`` after each)."""
        if (len(items) <= 1 or self.max_uploads == 1 or not self.atomic_conditional_writes
                or type(self)._aput_if is FsspecBackend._aput_if):
            out = super().put_many_if(items)
            for _ in items:
                _upload_done()
            return out
        got = self._sync(self._aput_many_if, [(k, bytes(d), m) for k, d, m in items])
        for r in got:
            if isinstance(r, BaseException) and not isinstance(r, PreconditionFailed):
                raise r
        return got

    async def _aput_many_if(self, items: list[tuple[str, bytes, str | None]]) -> list[Any]:
        sem = asyncio.Semaphore(self.max_uploads)

        async def one(key: str, data: bytes, match: str | None) -> Any:
            async with sem:
                try:
                    tag = await retrying(self, "conditional PUT", key, self._aput_if, key,
                                         data, match)
                except PreconditionFailed as e:
                    return e
                except FileNotFoundError as e:
                    raise StorageError(f"{self.url}/{key}: PUT failed (a permanent error: "
                                       f"not retried): the bucket or path does not exist "
                                       f"({e})") from e
            _upload_done()
            return tag

        return await asyncio.gather(*(one(*it) for it in items), return_exceptions=True)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """Read, compare, write: not atomic (two writers can both pass the check)."""
        return check_then_put(self, key, data, match)

    def delete(self, key: str) -> None:
        self.requests["delete"] += 1
        try:
            self._call("DELETE", key, self.fs.rm_file, self._path(key))
        except FileNotFoundError:
            pass

    # -- metadata ---------------------------------------------------------------------------
    def size(self, key: str) -> int | None:
        self.requests["head"] += 1
        try:
            return int(self._call("HEAD", key, self.fs.size, self._path(key)))
        except FileNotFoundError:
            return None

    def _find(self, prefix: str, detail: bool) -> Any:
        base = self._path(prefix).rstrip("/")
        self.fs.invalidate_cache()
        self.requests["list"] += 1
        try:
            return self._call("LIST", prefix or "/", self.fs.find, base, None, False, detail)
        except FileNotFoundError:
            return {} if detail else []

    def list(self, prefix: str) -> list[str]:
        n = len(self.root) + 1
        return sorted(p[n:] if p.startswith(self.root) else p
                      for p in self._find(prefix, False))

    def total_bytes(self, prefix: str = "") -> int:
        return int(sum(d.get("size", 0) for d in self._find(prefix, True).values()))


def collect_pinned(spans: list[Span], got: list[Any], pins: bool = True
                   ) -> list[bytes | None]:
    """Results of a batched read on a store whose reads name the version served: bytes per
    span (``None`` for a missing object); each handle is pinned to the tag its first read
    saw (where ``pins``). A refused version (:class:`PreconditionFailed`: the object was
    replaced) or two tags for one handle within the call raise :class:`ObjectChanged`
    naming the handles."""
    out: list[bytes | None] = []
    changed: dict[int, RemoteObject] = {}
    seen: dict[int, set] = {}
    for (h, _, _, _), r in zip(spans, got):
        if isinstance(r, FileNotFoundError):
            out.append(None)
        elif isinstance(r, PreconditionFailed):
            changed[id(h)] = h
            out.append(None)
        elif isinstance(r, BaseException):
            raise r
        else:
            out.append(bytes(r[0]))
            if h.tag is None and r[1] is not None and pins:  # (an empty span reads nothing)
                seen.setdefault(id(h), set()).add(r[1])
    for hid, tags in seen.items():
        h = next(sp[0] for sp in spans if id(sp[0]) == hid)
        if len(tags) == 1:
            h.tag = tags.pop()  # pinned: later reads must see this version
        else:
            changed[hid] = h  # replaced between two spans of this call
    if changed:
        raise ObjectChanged(list(changed.values()))
    return out


def _upload_done() -> None:
    """After each object of a :meth:`FsspecBackend.put_many`: the ``put.upload`` crash point
    (a flush's uploads partly done)."""
    if faults.ARMED:
        faults.hit("put.upload")
