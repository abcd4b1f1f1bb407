"""The checksummed JSON envelope of the store's small state objects (lane states, the
quarantine): ``{"<kind>": body, "crc32": crc}``, where ``body`` holds a ``version`` and
``crc`` is the zlib crc32 of ``body`` dumped with sorted keys. A torn or flipped object
fails its checksum and is reported, never trusted.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ...errors import StoreCorruptError


def _crc(body: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def seal(kind: str, version: int, body: dict[str, Any]) -> bytes:
    """``body`` with ``version`` in it, wrapped under ``kind`` with its checksum."""
    body = {"version": version, **body}
    return json.dumps({kind: body, "crc32": _crc(body)}).encode()


def unseal(raw: bytes, kind: str, version: int, where: str, what: str) -> dict[str, Any]:
    """The body of an envelope, without its ``version``. Raises ``StoreCorruptError``
    naming ``where`` and ``what`` (e.g. "lane state file") when ``raw`` is not an envelope
    of ``kind``, fails its checksum, or is of a format version newer than ``version``."""
    try:
        doc = json.loads(raw)
        body = doc[kind]
        crc = _crc(body)
    except (ValueError, KeyError, TypeError) as e:
        raise StoreCorruptError(f"{where}: {what} is not valid ({e})") from e
    if crc != doc.get("crc32"):
        raise StoreCorruptError(f"{where}: {what} fails its checksum")
    body = dict(body)
    found = body.pop("version", 0)
    if not isinstance(found, int) or found > version:
        raise StoreCorruptError(f"{where}: {what.removesuffix(' file')} format version "
                                f"{found} is newer than this expstore supports ({version})")
    return body
