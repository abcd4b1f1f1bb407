"""``gs://`` / ``gcs://`` (Google Cloud Storage through gcsfs): generation preconditions.

Every object version has a *generation* number, the version tag here. Conditional writes
are one multipart upload carrying ``ifGenerationMatch=0`` (create only) or
``ifGenerationMatch=<generation>`` (replace only that version), decided by the server.
Ranged reads after a handle's first carry ``ifGenerationMatch`` of the version it pinned,
and the served ``x-goog-generation`` is compared too. Requests are made on gcsfs's HTTP
session and credentials, with :mod:`.retry` alone pacing retries; listing, sizes and
deletes go through gcsfs.

``storage.googleapis.com`` is trusted to honour preconditions; another endpoint
(``endpoint_url`` or ``STORAGE_EMULATOR_HOST``: an emulator) is probed once per process
(see :mod:`.versioned`). ``gcp-storage-emulator`` ignores ``ifGenerationMatch``, so stores
there refuse lane leases; ``fake-gcs-server`` honours it on uploads and names the served
generation on reads.

The filesystem is gcsfs's JSON-API ``GCSFileSystem`` (not its gRPC-probing extension):
zonal ("Rapid") buckets are not supported.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from ...errors import PreconditionFailed
from .versioned import ANY, ServerBusy, VersionedBackend

_BOUNDARY = "==expstore-0=="


class GCSError(OSError):
    """A GCS answer that is not worth retrying (4xx other than 404, 408, 412, 429)."""


class GCSBackend(VersionedBackend):
    """Google Cloud Storage: generation-pinned ranged reads, server-decided conditional
    writes. ``storage_options`` go to ``gcsfs.GCSFileSystem`` (``token``, ``project``,
    ``endpoint_url``, ...)."""

    @property
    def fs(self) -> Any:
        """gcsfs's JSON-API filesystem, re-created in a forked child."""
        if self._fs is None or self._pid != os.getpid():
            from gcsfs.core import GCSFileSystem

            self._fs = GCSFileSystem(**self._fs_options())
            self.root = GCSFileSystem._strip_protocol(self.url).rstrip("/")
            if not self.root:
                raise ValueError(f"{self.url}: expected gs://<bucket>[/<path>]")
            self._pid = os.getpid()
        return self._fs

    def _endpoint(self) -> str:
        return str(self.fs._location)

    def _trusted_endpoint(self) -> bool:
        emulator = os.getenv("STORAGE_EMULATOR_HOST", "")
        return self.fs._endpoint is None and emulator in ("", "default")

    def _wrong_tag(self, tag: str | None) -> str:
        return str(int(tag) + 1) if tag and tag.isdigit() else "1"

    def _object(self, key: str) -> tuple[str, str]:
        bucket, _, name = self._path(key).partition("/")
        return bucket, name

    async def _http(self, method: str, url: str, params: dict[str, str],
                    headers: dict[str, str] | None = None, data: bytes | None = None
                    ) -> tuple[int, Any, bytes]:
        fs = self.fs
        session = await fs._set_session()
        async with session.request(method, url, params=fs._get_params(params), data=data,
                                   headers=fs._get_headers(headers),
                                   timeout=fs.requests_timeout) as r:
            return r.status, r.headers, await r.read()

    def _check(self, key: str, status: int, body: bytes) -> None:
        if status < 300:
            return
        if status == 404:
            raise FileNotFoundError(f"{self.url}/{key}")
        if status == 412:
            raise PreconditionFailed(f"{self.url}/{key}: generation precondition failed")
        msg = body[:300].decode("utf-8", "replace")
        if status >= 500 or status in (408, 429):
            raise ServerBusy(f"HTTP {status}: {msg}")
        raise GCSError(f"HTTP {status}: {msg}")

    async def _vget(self, key: str, start: int | None = None, end: int | None = None,
                    tag: str | None = None) -> tuple[bytes, str | None]:
        bucket, name = self._object(key)
        url = f"{self.fs._location}/download/storage/v1/b/{quote(bucket, safe='')}/o/" \
              f"{quote(name, safe='')}"
        params = {"alt": "media"}
        if tag is not None:
            params["ifGenerationMatch"] = tag
        headers = {"Range": f"bytes={start}-{end - 1}"} if start is not None else None
        status, h, body = await self._http("GET", url, params, headers)
        self._check(key, status, body)
        return body, h.get("x-goog-generation")

    async def _vput(self, key: str, data: bytes, match: Any = ANY) -> str | None:
        bucket, name = self._object(key)
        params = {"uploadType": "multipart"}
        if match is None:
            params["ifGenerationMatch"] = "0"
        elif match is not ANY:
            if not (isinstance(match, str) and match.isdigit()):
                raise PreconditionFailed(f"{self.url}/{key}: {match!r} is no generation")
            params["ifGenerationMatch"] = match
        meta = json.dumps({"name": name}).encode()
        body = b"".join((
            f"--{_BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            meta, f"\r\n--{_BOUNDARY}\r\nContent-Type: application/octet-stream\r\n\r\n"
            .encode(), data, f"\r\n--{_BOUNDARY}--".encode()))
        url = f"{self.fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        status, _, out = await self._http(
            "POST", url, params, {"Content-Type": f'multipart/related; boundary="{_BOUNDARY}"'},
            body)
        self.fs.invalidate_cache(self._path(key))
        if status == 404:  # the bucket is missing (an upload never 404s on the object)
            raise FileNotFoundError(f"{self.url}/{key}: bucket {bucket!r} not found")
        self._check(key, status, out)
        gen = json.loads(out).get("generation")
        return None if gen is None else str(gen)
