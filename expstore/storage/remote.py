"""Object storage through fsspec: ``s3://`` (s3fs), ``memory://``, ``gcs://``, ...

Reads: the ranges one batch needs are grouped per object and ranges closer than
``max_gap`` bytes are merged into one span, so a batch costs one ranged GET per shard
object it touches (with the default gap), all spans fetched concurrently. On S3 every GET
after a handle's first carries ``If-Match: <ETag seen first>``: a handle reads a single
version of its object, as a local file descriptor does, and a replaced object raises
:class:`~expstore.storage.backend.ObjectChanged` instead of returning other bytes.
Other fsspec stores cannot pin versions; the reader re-checks shard headers after reading.

Writes are whole objects, one PUT each. Conditional writes (lane leases) use S3's
``If-None-Match: *`` / ``If-Match: <ETag>``. Transient failures (connection refused or
reset, timeouts, HTTP 5xx, throttling) are retried with exponential backoff and jitter
(:class:`RetryPolicy`); after the last attempt a :class:`~expstore.errors.StorageError`
names the object and the last error. Permanent failures (access denied, bad bucket) raise
it at once. ``requests`` counts the HTTP requests issued, by kind.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import StorageError
from .backend import Backend, ObjectChanged, PreconditionFailed, content_tag

T = TypeVar("T")

#: merge ranges of one object whose gap is at most this (bytes): at ~100 MB/s per stream
#: 2 MiB cost about one request's first-byte latency on S3 (20-30 ms)
MAX_GAP = 2 << 20

_TRANSIENT_NAMES = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "HTTPClientError", "ClientPayloadError",
    "ServerDisconnectedError", "ClientConnectorError", "ClientOSError", "IncompleteRead",
    "ResponseParserError", "FSTimeoutError", "ProtocolError", "ServerTimeoutError",
    "ResponseStreamingError",
}
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
    "InternalError", "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequests",
    "BadDigest", "XAmzContentSHA256Mismatch",
}
_PRECONDITION_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


@dataclass
class RetryPolicy:
    """Retries of transient storage errors: ``attempts`` tries at most, waits growing from
    ``base`` by ``factor`` up to ``max_delay`` seconds (with jitter), never past ``deadline``
    seconds after the first try. An S3 request taking longer than ``timeout`` seconds is
    abandoned and counts as a transient failure."""

    attempts: int = 12
    base: float = 0.05
    factor: float = 2.0
    max_delay: float = 5.0
    deadline: float = 60.0
    timeout: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number ``attempt`` (1-based)."""
        d = min(self.max_delay, self.base * self.factor ** (attempt - 1))
        return d * (0.5 + 0.5 * random.random())


def _chain(exc: BaseException):
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _error_code(exc: BaseException) -> tuple[str | None, int | None]:
    """(S3 error code, HTTP status) of the first botocore ``ClientError`` in the chain."""
    for e in _chain(exc):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict) and ("Error" in resp or "ResponseMetadata" in resp):
            code = resp.get("Error", {}).get("Code")
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None), status
    return None, None


def is_precondition(exc: BaseException) -> bool:
    code, status = _error_code(exc)
    return isinstance(exc, PreconditionFailed) or code in _PRECONDITION_CODES or status == 412


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: lost connections, timeouts, 5xx and throttling (not 4xx, not missing)."""
    code, status = _error_code(exc)
    if code is not None or status is not None:
        return code in _TRANSIENT_CODES or (status is not None and status >= 500) or \
            status == 429
    for e in _chain(exc):
        if isinstance(e, (FileNotFoundError, PermissionError, PreconditionFailed)):
            return False
        if isinstance(e, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if type(e).__name__ in _TRANSIENT_NAMES:
            return True
    return False


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
    """Any fsspec filesystem: coalesced concurrent ranged GETs, whole-object PUTs, retries.

    ``storage_options`` go to fsspec unchanged, except that for S3 botocore's own retries
    default to none (``config_kwargs["retries"] = {"total_max_attempts": 1}``) so that
    :class:`RetryPolicy` alone paces retries; set it yourself to override.
    """

    is_local = False

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None, max_gap: int = MAX_GAP,
                 max_concurrency: int = 64) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.max_gap = int(max_gap)
        self.max_concurrency = int(max_concurrency)
        self.requests: Counter[str] = Counter()
        self._fs: Any = None
        self._pid = -1
        self._cas = True  # server honours conditional writes (until it says otherwise)
        self.fs  # noqa: B018 - connect now: bad URLs / options fail here

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The filesystem, re-created in a forked child (fsspec's async ones are not fork-safe)."""
        if self._fs is None or self._pid != os.getpid():
            import fsspec

            opts = dict(self.storage_options)
            protocol = self.url.split("://", 1)[0]
            if protocol in ("s3", "s3a"):
                ck = dict(opts.get("config_kwargs") or {})
                ck.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
                opts["config_kwargs"] = ck
            self._fs, root = fsspec.core.url_to_fs(self.url, **opts)
            self.root = root.rstrip("/")
            self._pid = os.getpid()
        return self._fs

    @property
    def is_s3(self) -> bool:
        return hasattr(self.fs, "_call_s3")

    @property
    def pins_versions(self) -> bool:  # type: ignore[override]
        return self.is_s3

    def _path(self, key: str) -> str:
        self.fs  # noqa: B018 - sets root
        return f"{self.root}/{key}"

    def _fail(self, what: str, key: str, exc: BaseException, attempts: int | None,
              t0: float) -> StorageError:
        """``attempts=None``: a permanent error, not retried."""
        tried = ("(a permanent error: not retried)" if attempts is None else
                 f"after {attempts} attempt(s) in {time.monotonic() - t0:.1f} s")
        return StorageError(f"{self.url}/{key}: {what} failed {tried}: "
                            f"{type(exc).__name__}: {exc}")

    def _backoff(self, what: str, key: str, exc: Exception, attempt: int, t0: float) -> float:
        """Seconds to wait before retrying after ``exc``; raises when it must not be retried."""
        if is_precondition(exc):
            raise PreconditionFailed(key) from exc
        if not is_transient(exc):
            raise self._fail(what, key, exc, None, t0) from exc
        wait = self.retry.delay(attempt)
        if attempt >= self.retry.attempts or \
                time.monotonic() - t0 + wait > self.retry.deadline:
            raise self._fail(what, key, exc, attempt, t0) from exc
        self.requests["retried"] += 1
        return wait

    def _retry(self, what: str, key: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` with retries; FileNotFoundError/PreconditionFailed pass through."""
        t0 = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(*args)
            except (FileNotFoundError, PreconditionFailed, ObjectChanged):
                raise
            except Exception as e:
                time.sleep(self._backoff(what, key, e, attempt, t0))

    async def _aretry(self, what: str, key: str,
                      fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        t0 = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.wait_for(fn(*args), self.retry.timeout)
            except (FileNotFoundError, PreconditionFailed):
                raise
            except Exception as e:
                await asyncio.sleep(self._backoff(what, key, e, attempt, t0))

    def _sync(self, coro_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args)

    # -- S3 primitives (one HTTP request each) ----------------------------------------------
    async def _s3_get(self, path: str, start: int | None = None, end: int | None = None,
                      if_match: str | None = None) -> tuple[bytes, str | None]:
        fs = self.fs
        bucket, key, _ = fs.split_path(path)
        kw: dict[str, Any] = {}
        if start is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        if if_match:
            kw["IfMatch"] = if_match
        self.requests["get" if start is None else "range_get"] += 1
        try:
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        except Exception as e:
            code, _ = _error_code(e)
            if isinstance(e, FileNotFoundError) or code in ("NoSuchKey", "404"):
                raise FileNotFoundError(path) from e
            raise
        try:
            body = await resp["Body"].read()
        finally:
            resp["Body"].close()
        return body, resp.get("ETag")

    async def _s3_put(self, path: str, data: bytes, **cond: str) -> str | None:
        fs = self.fs
        bucket, key, _ = fs.split_path(path)
        self.requests["put"] += 1
        out = await fs._call_s3("put_object", Bucket=bucket, Key=key, Body=data, **cond)
        fs.invalidate_cache(path)
        return out.get("ETag")

    # -- Backend ----------------------------------------------------------------------------
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

    def _spans(self, requests: Sequence[tuple[RemoteObject, int, int]]
               ) -> list[tuple[RemoteObject, int, int, list[int]]]:
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

    def _fetch(self, spans: list[tuple[RemoteObject, int, int, list[int]]]
               ) -> list[bytes | None]:
        if self.is_s3:
            return self._sync(self._s3_fetch, spans)
        return self._generic_fetch(spans)

    async def _s3_fetch(self, spans: list[tuple[RemoteObject, int, int, list[int]]]
                        ) -> list[bytes | None]:
        sem = asyncio.Semaphore(self.max_concurrency)

        async def one(h: RemoteObject, s: int, e: int) -> tuple[bytes, str | None]:
            if e <= s:
                return b"", h.tag
            async with sem:
                return await self._aretry("ranged GET", h.key, self._s3_get, h.path, s, e, h.tag)

        got = await asyncio.gather(*(one(h, s, e) for h, s, e, _ in spans),
                                   return_exceptions=True)
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
                out.append(r[0])
                if h.tag is None:
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

    def _generic_fetch(self, spans: list[tuple[RemoteObject, int, int, list[int]]]
                       ) -> list[bytes | None]:
        out: list[Any] = [None] * len(spans)
        todo = list(range(len(spans)))
        t0 = time.monotonic()
        attempt = 0
        while todo:
            attempt += 1
            fs = self.fs
            self.requests["range_get"] += len(todo)
            got = fs.cat_ranges([spans[i][0].path for i in todo], [spans[i][1] for i in todo],
                                [spans[i][2] for i in todo], on_error="return")
            retry = []
            for i, r in zip(todo, got):
                if isinstance(r, FileNotFoundError):
                    out[i] = None
                elif isinstance(r, BaseException):
                    if not is_transient(r):
                        raise self._fail("ranged GET", spans[i][0].key, r, None, t0) from r
                    retry.append(i)
                    last = r
                else:
                    out[i] = bytes(r)
            if retry:
                wait = self.retry.delay(attempt)
                if attempt >= self.retry.attempts or \
                        time.monotonic() - t0 + wait > self.retry.deadline:
                    raise self._fail("ranged GET", spans[retry[0]][0].key, last, attempt, t0)
                self.requests["retried"] += len(retry)
                time.sleep(wait)
            todo = retry
        return out

    def get(self, key: str) -> bytes | None:
        try:
            if self.is_s3:
                return self._sync(self._aretry, "GET", key, self._s3_get, self._path(key))[0]
            self.requests["get"] += 1
            return self._retry("GET", key, self.fs.cat_file, self._path(key))
        except FileNotFoundError:
            return None

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not self.is_s3:
            return [self.get(k) for k in keys]

        async def all_() -> list[Any]:
            sem = asyncio.Semaphore(self.max_concurrency)

            async def one(k: str) -> Any:
                async with sem:
                    try:
                        return (await self._aretry("GET", k, self._s3_get, self._path(k)))[0]
                    except FileNotFoundError:
                        return None

            return await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)

        got = self._sync(all_)
        for r in got:
            if isinstance(r, BaseException):
                raise r
        return list(got)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        if not self.is_s3:
            return super().get_tagged(key)
        try:
            data, tag = self._sync(self._aretry, "GET", key, self._s3_get, self._path(key))
        except FileNotFoundError:
            return None
        return data, tag or content_tag(data)

    def put(self, key: str, data: bytes) -> None:
        data = bytes(data)
        try:
            if self.is_s3:
                self._sync(self._aretry, "PUT", key, self._s3_put, self._path(key), data)
                return
            self.requests["put"] += 1
            self._retry("PUT", key, self.fs.pipe_file, self._path(key), data)
        except FileNotFoundError as e:
            raise StorageError(f"{self.url}/{key}: PUT failed (a permanent error: not "
                               f"retried): the bucket or path does not exist ({e})") from e

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """S3: ``If-None-Match: *`` / ``If-Match``, atomic on the server. Others (and S3
        servers that answer 501 to conditions): check, then write (not atomic)."""
        if not (self.is_s3 and self._cas):
            return super().put_if(key, data, match)
        cond = {"IfNoneMatch": "*"} if match is None else {"IfMatch": match}
        try:
            tag = self._sync(self._aretry, "conditional PUT", key, self._put_cond,
                             self._path(key), bytes(data), cond)
        except StorageError as e:
            code, status = _error_code(e)
            if code == "NotImplemented" or status == 501:
                self._cas = False
                return super().put_if(key, data, match)
            raise
        return tag or content_tag(data)

    async def _put_cond(self, path: str, data: bytes, cond: dict[str, str]) -> str | None:
        try:
            return await self._s3_put(path, data, **cond)
        except Exception as e:
            if isinstance(e, FileExistsError) or is_precondition(e):
                raise PreconditionFailed(path) from e
            raise

    def delete(self, key: str) -> None:
        self.requests["delete"] += 1
        try:
            self._retry("DELETE", key, self.fs.rm_file, self._path(key))
        except FileNotFoundError:
            pass

    def size(self, key: str) -> int | None:
        self.requests["head"] += 1
        try:
            return int(self._retry("HEAD", key, self.fs.size, self._path(key)))
        except FileNotFoundError:
            return None

    def _find(self, prefix: str, detail: bool) -> Any:
        base = self._path(prefix).rstrip("/")
        self.fs.invalidate_cache()
        self.requests["list"] += 1
        try:
            return self._retry("LIST", prefix or "/", self.fs.find, base, None, False, detail)
        except FileNotFoundError:
            return {} if detail else []

    def list(self, prefix: str) -> list[str]:
        n = len(self.root) + 1
        return sorted(p[n:] if p.startswith(self.root) else p
                      for p in self._find(prefix, False))

    def total_bytes(self, prefix: str = "") -> int:
        return int(sum(d.get("size", 0) for d in self._find(prefix, True).values()))
