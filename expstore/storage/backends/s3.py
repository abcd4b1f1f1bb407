"""``s3://`` (s3fs): version-pinned ranged reads and server-side conditional writes.

Every GET after a handle's first carries ``If-Match: <ETag seen first>``: a handle reads a
single version of its object, as a local file descriptor does, and a replaced object
raises :class:`~expstore.errors.ObjectChanged` instead of returning other bytes.
Conditional writes (lane leases) send ``If-None-Match: *`` / ``If-Match: <ETag>`` and the
server decides them atomically (AWS since 2024, moto, recent MinIO). A server that answers
501 to them switches this backend to read-compare-write, and
``atomic_conditional_writes`` becomes ``False`` from then on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import PreconditionFailed, StorageError
from .base import content_tag
from .fsspec import FsspecBackend, RemoteObject, Span, collect_pinned
from .retry import error_code, is_precondition, retrying


class S3Backend(FsspecBackend):
    """S3 through s3fs's botocore client: one HTTP request per primitive, all retried by
    :class:`~expstore.storage.backends.retry.RetryPolicy`.

    botocore's own retries default to none (``config_kwargs["retries"] =
    {"total_max_attempts": 1}``) so that the policy alone paces retries, and its connection
    pool to ``max(max_concurrency, max_uploads)`` connections (botocore's default of 10
    would cap the requests in flight); set either in ``storage_options`` to override.
    """

    pins_versions = True

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self._cas = True  # the server honours conditional writes (until it says otherwise)
        super().__init__(url, storage_options, **kwargs)

    @property
    def atomic_conditional_writes(self) -> bool:  # type: ignore[override]
        """True unless the server answered 501 to a conditional write."""
        return self._cas

    def _fs_options(self) -> dict[str, Any]:
        opts = super()._fs_options()
        ck = dict(opts.get("config_kwargs") or {})
        ck.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        # botocore's pool (10 connections by default) would cap the requests in flight
        ck.setdefault("max_pool_connections", max(self.max_concurrency, self.max_uploads))
        opts["config_kwargs"] = ck
        return opts

    # -- S3 primitives (one HTTP request each) ----------------------------------------------
    async def _s3_get(self, path: str, start: int | None = None, end: int | None = None,
                      if_match: str | None = None) -> tuple[bytes, str | None]:
        fs = self.fs
        bucket, key, _ = fs.split_path(path)
        kw: dict[str, Any] = {}
        if start is not None and end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        if if_match:
            kw["IfMatch"] = if_match
        self.requests["get" if start is None else "range_get"] += 1
        try:
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
        except Exception as e:
            code, _ = error_code(e)
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

    async def _put_cond(self, path: str, data: bytes, cond: dict[str, str]) -> str | None:
        try:
            return await self._s3_put(path, data, **cond)
        except Exception as e:
            code, _ = error_code(e)
            if isinstance(e, FileExistsError) or is_precondition(e):
                raise PreconditionFailed(f"{path}: conditional PUT refused ({cond})") from e
            if "IfMatch" in cond and (isinstance(e, FileNotFoundError) or code == "NoSuchKey"):
                raise PreconditionFailed(f"{path}: If-Match on a missing object") from e
            raise

    # -- reads ------------------------------------------------------------------------------
    async def _aget_range(self, h: RemoteObject, start: int, end: int
                          ) -> tuple[bytes, str | None]:
        return await self._s3_get(h.path, start, end, h.tag)

    def _collect(self, spans: list[Span], got: list[Any]) -> list[bytes | None]:
        """Pins each handle to the ETag its first read saw; a 412 (If-Match failed) or two
        ETags within this call raise :class:`ObjectChanged` naming the handles."""
        return collect_pinned(spans, got)

    def get(self, key: str) -> bytes | None:
        got = self.get_tagged(key)
        return None if got is None else got[0]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        got = self._each(keys, lambda k: self._s3_get(self._path(k)))
        return [None if r is None else r[0] for r in got]

    def get_tagged_many(self, keys: Sequence[str]) -> list[tuple[bytes, str] | None]:
        """Whole objects and their ETags (``None`` where missing), fetched concurrently."""
        got = self._each(keys, lambda k: self._s3_get(self._path(k)))
        return [None if r is None else (r[0], r[1] or content_tag(r[0])) for r in got]

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        try:
            data, tag = self._sync(retrying, self, "GET", key, self._s3_get, self._path(key))
        except FileNotFoundError:
            return None
        return data, tag or content_tag(data)

    # -- writes -----------------------------------------------------------------------------
    def _put(self, key: str, data: bytes) -> None:
        self._sync(retrying, self, "PUT", key, self._s3_put, self._path(key), data)

    async def _aput(self, key: str, data: bytes) -> None:
        """One PUT (:meth:`put_many` runs up to ``max_uploads`` of them at once)."""
        await self._s3_put(self._path(key), data)

    async def _aput_if(self, key: str, data: bytes, match: str | None) -> str:
        """One conditional PUT (``If-None-Match: *`` / ``If-Match``), decided by the server."""
        cond = {"IfNoneMatch": "*"} if match is None else {"IfMatch": match}
        tag = await self._put_cond(self._path(key), data, cond)
        return tag or content_tag(data)

    def tag_of(self, key: str) -> str | None:
        """The object's ETag from one HEAD (``None``: missing)."""
        async def head() -> str | None:
            fs = self.fs
            bucket, k, _ = fs.split_path(self._path(key))
            self.requests["head"] += 1
            try:
                out = await fs._call_s3("head_object", Bucket=bucket, Key=k)
            except Exception as e:
                code, _ = error_code(e)
                if isinstance(e, FileNotFoundError) or code in ("NoSuchKey", "404"):
                    return None
                raise
            return out.get("ETag")

        return self._sync(retrying, self, "HEAD", key, head)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """``If-None-Match: *`` / ``If-Match``, atomic on the server. Servers that answer
        501 to conditions get read, compare, write from then on (not atomic)."""
        if self._cas:
            cond = {"IfNoneMatch": "*"} if match is None else {"IfMatch": match}
            try:
                tag = self._sync(retrying, self, "conditional PUT", key, self._put_cond,
                                 self._path(key), bytes(data), cond)
                return tag or content_tag(data)
            except StorageError as e:
                code, status = error_code(e)
                if code != "NotImplemented" and status != 501:
                    raise
                self._cas = False
        cur = self.get_tagged(key)
        if (cur[1] if cur else None) != match:
            raise PreconditionFailed(f"{self.url}/{key}: expected version {match}, found "
                                     f"{cur[1] if cur else 'no object'}")
        tag = self._sync(retrying, self, "PUT", key, self._s3_put, self._path(key),
                         bytes(data))
        return tag or content_tag(data)
