"""``az://`` / ``abfs://`` / ``abfss://`` (Azure Blob Storage through adlfs): ETag
preconditions.

Conditional writes are one Put Blob carrying ``If-None-Match: *`` (create only) or
``If-Match: <ETag>`` (replace only that version), decided by the service. Ranged reads
after a handle's first carry ``If-Match`` of the ETag it pinned, and the served ETag is
compared too. Requests go through adlfs's ``BlobServiceClient`` with the SDK's own
retries off (``retry_total=0``), so :mod:`.retry` alone paces retries; listing, sizes and
deletes go through adlfs.

``*.blob.core.*`` endpoints are trusted to honour preconditions; another endpoint
(azurite, a gateway) is probed once per process (see :mod:`.versioned`). azurite 3
honours them.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from ...errors import PreconditionFailed
from .versioned import ANY, ServerBusy, VersionedBackend

_PROVIDER_HOST = re.compile(r"\.blob\.core\.(windows\.net|chinacloudapi\.cn|usgovcloudapi\.net)$")


class AzureBackend(VersionedBackend):
    """Azure Blob Storage: ETag-pinned ranged reads, service-decided conditional writes.
    ``storage_options`` go to ``adlfs.AzureBlobFileSystem`` (``connection_string``,
    ``account_name``/``account_key``, ``sas_token``, ``credential``, ...)."""

    def _endpoint(self) -> str:
        return str(self.fs.service_client.url).rstrip("/")

    def _trusted_endpoint(self) -> bool:
        u = urlparse(self._endpoint())
        return u.scheme == "https" and bool(_PROVIDER_HOST.search(u.hostname or ""))

    def _wrong_tag(self, tag: str | None) -> str:
        return '"0x1"' if tag != '"0x1"' else '"0x2"'

    def _blob(self, key: str) -> Any:
        container, _, name = self._path(key).partition("/")
        return self.fs.service_client.get_blob_client(container, name)

    def _translate(self, key: str, e: Exception, match: Any = ANY) -> Exception:
        """The SDK's exception as the backend contract names it."""
        from azure.core.exceptions import (
            HttpResponseError,
            ResourceExistsError,
            ResourceModifiedError,
            ResourceNotFoundError,
            ServiceRequestError,
            ServiceResponseError,
        )

        code = str(getattr(e, "error_code", "") or "")
        if isinstance(e, ResourceModifiedError) or getattr(e, "status_code", None) == 412:
            return PreconditionFailed(f"{self.url}/{key}: ETag precondition failed ({code})")
        if isinstance(e, ResourceExistsError) and match is None:
            return PreconditionFailed(f"{self.url}/{key}: exists already ({code})")
        if isinstance(e, ResourceNotFoundError):
            if match is not ANY and match is not None and code == "BlobNotFound":
                return PreconditionFailed(f"{self.url}/{key}: If-Match on a missing blob")
            return FileNotFoundError(f"{self.url}/{key}: {code or 'not found'}")
        if isinstance(e, (ServiceRequestError, ServiceResponseError)):
            return ServerBusy(f"{type(e).__name__}: {e}")
        status = getattr(e, "status_code", None)
        if isinstance(e, HttpResponseError) and status is not None and \
                (status >= 500 or status in (408, 429)):
            return ServerBusy(f"HTTP {status} {code}: {str(e).splitlines()[0]}")
        return e

    async def _vget(self, key: str, start: int | None = None, end: int | None = None,
                    tag: str | None = None) -> tuple[bytes, str | None]:
        from azure.core import MatchConditions

        kw: dict[str, Any] = {"retry_total": 0}
        if start is not None and end is not None:
            kw.update(offset=start, length=end - start)
        if tag is not None:
            kw.update(etag=tag, match_condition=MatchConditions.IfNotModified)
        try:
            d = await self._blob(key).download_blob(**kw)
            data = await d.readall()
        except Exception as e:
            raise self._translate(key, e) from e
        return bytes(data), d.properties.etag

    async def _vput(self, key: str, data: bytes, match: Any = ANY) -> str | None:
        from azure.core import MatchConditions

        kw: dict[str, Any] = {"retry_total": 0, "overwrite": match is not None}
        if match is not None and match is not ANY:
            kw.update(etag=match, match_condition=MatchConditions.IfNotModified)
        try:
            out = await self._blob(key).upload_blob(data, **kw)
        except Exception as e:
            raise self._translate(key, e, match) from e
        finally:
            self.fs.invalidate_cache(self._path(key))
        return out.get("etag")
