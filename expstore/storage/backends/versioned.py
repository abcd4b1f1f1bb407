"""Object stores whose objects carry a server version tag (GCS generations, Azure ETags).

:class:`VersionedBackend` builds the whole :class:`~.base.Backend` contract on two
primitives a subclass implements, one HTTP request each: a (ranged) GET that returns the
bytes and the version tag the server served, optionally only if the object is still at a
given version, and a PUT that may carry a precondition (create only / replace only this
version), decided by the server. Listing, sizes and deletes go through the fsspec
filesystem as in :class:`~.fsspec.FsspecBackend`.

Handles pin the version their first read saw: later reads ask the server for that version
only, and a served tag that differs (a server ignoring the condition) is caught on the
client too; a replaced object raises :class:`~expstore.errors.ObjectChanged`.

Not every server honours preconditions (several emulators accept any conditional write).
The provider's own endpoints are trusted; any other endpoint (an emulator, a gateway) is
probed once per process with a scratch object under the store root (create-only twice,
then a replace with a wrong version, then a read back; requests retried as any other; an
endpoint still unreachable raises :class:`~expstore.errors.StorageError`, a probe refused
otherwise, e.g. without write permission, claims nothing and is re-run after
``probe_retry_after`` seconds), and a server that accepts a write
it should have refused gets ``atomic_conditional_writes = False`` (lane leases are then
refused; ``put_if`` falls back to read, compare, write), a server whose reads name no
version gets ``pins_versions = False`` (readers re-check shard headers instead).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from ...errors import PreconditionFailed, StorageError
from .base import content_tag
from .fsspec import FsspecBackend, RemoteObject, Span, collect_pinned
from .retry import is_transient, retrying


class ServerBusy(ConnectionError):
    """An HTTP 5xx / 408 / 429 answer: transient, retried by :mod:`.retry`."""


class Capabilities:
    """What an endpoint honours: ``atomic`` (conditional writes decided by the server) and
    ``pins`` (reads name the version served)."""

    __slots__ = ("atomic", "failed", "pins", "reason")

    def __init__(self, atomic: bool, pins: bool, reason: str = "", failed: bool = False
                 ) -> None:
        self.atomic = atomic
        self.pins = pins
        self.reason = reason
        self.failed = failed  # the probe could not run (claims nothing; re-run later)

    def __repr__(self) -> str:
        return f"Capabilities(atomic={self.atomic}, pins={self.pins}, reason={self.reason!r})"


#: create-only / unconditional markers for :meth:`VersionedBackend._vput`
ANY = object()
PROBE_PREFIX = ".expstore-probe"


class VersionedBackend(FsspecBackend):
    """Shared logic of object stores with server version tags; subclasses implement
    :meth:`_vget`, :meth:`_vput` and :meth:`_endpoint` (and may override
    :meth:`_trusted_endpoint`)."""

    #: endpoint -> what it honours, learnt once per process (see the module doc)
    _probed: ClassVar[dict[str, Capabilities]] = {}
    #: seconds after which a probe the server refused (no write permission) is re-run
    probe_retry_after: ClassVar[float] = 30.0

    # -- what subclasses implement ----------------------------------------------------------
    async def _vget(self, key: str, start: int | None = None, end: int | None = None,
                    tag: str | None = None) -> tuple[bytes, str | None]:
        """Bytes ``[start, end)`` (whole object when ``None``) and the version tag served.

        With ``tag``: only that version (the server answers "precondition failed" ->
        :class:`PreconditionFailed`). Missing: ``FileNotFoundError``. Transient server
        errors: :class:`ServerBusy`.
        """
        raise NotImplementedError

    async def _vput(self, key: str, data: bytes, match: Any = ANY) -> str | None:
        """Write ``key``: unconditionally (``ANY``), only if missing (``None``), or only if
        at version ``match``; returns the new version tag. A refused condition raises
        :class:`PreconditionFailed`."""
        raise NotImplementedError

    def _endpoint(self) -> str:
        """The service endpoint (scheme and host) requests go to."""
        raise NotImplementedError

    def _trusted_endpoint(self) -> bool:
        """The provider's own service (honours preconditions as documented): not probed."""
        return False

    # -- capabilities -----------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """What this endpoint honours (probed once per process for untrusted endpoints)."""
        if self._trusted_endpoint():
            return Capabilities(True, True, "the provider's endpoint")
        ep = self._endpoint()
        caps = self._probed.get(ep)
        if caps is not None:
            return caps
        failed = getattr(self, "_failed_probe", None)  # per backend: its credentials failed
        if failed is not None and time.monotonic() - failed[1] < self.probe_retry_after:
            return failed[0]
        caps = self._probe()
        if caps.failed:
            self._failed_probe = (caps, time.monotonic())
        else:
            self._probed[ep] = caps
        return caps

    @property
    def atomic_conditional_writes(self) -> bool:  # type: ignore[override]
        """The server decides conditional writes (see :meth:`capabilities`)."""
        return self.capabilities().atomic

    @property
    def pins_versions(self) -> bool:  # type: ignore[override]
        """Reads name the version served, so handles pin one version."""
        return self.capabilities().pins

    def _probe(self) -> Capabilities:
        """Scratch object under the root: create-only twice, replace naming a wrong version,
        read back. Atomic only if both conditional writes were refused *and* reads name the
        version (conditions need the tags reads give)."""
        key = f"{PROBE_PREFIX}/{uuid.uuid4().hex}"
        problems: list[str] = []
        written = False

        def call(what: str, fn: Any, *args: Any) -> Any:
            return self._sync(retrying, self, f"probe {what}", key, fn, key, *args)

        try:
            first = call("PUT", self._vput, b"1", None)
            written = True
            for data, match, what in ((b"2", None, "a create-only write over an object"),
                                      (b"3", self._wrong_tag(first),
                                       "a write naming a wrong version")):
                try:
                    call("PUT", self._vput, data, match)
                    problems.append(f"accepted {what}")
                except PreconditionFailed:
                    pass
            got, tag = call("GET", self._vget, 0, 1, None)
        except StorageError as e:
            if e.__cause__ is not None and is_transient(e.__cause__):  # unreachable: say so
                raise StorageError(f"{self.url}: cannot tell whether the endpoint honours "
                                   f"conditional writes: {e}") from e
            return Capabilities(False, False, f"probe failed: {e}", True)
        except Exception as e:  # no write permission, odd server: claim nothing
            return Capabilities(False, False, f"probe failed: {type(e).__name__}: {e}", True)
        finally:
            if written:
                try:
                    self.delete(key)
                except Exception:
                    pass
        # refused writes leave version ``first``, which a read must name; after an accepted
        # write there is a newer version, and a read naming any version is all one can ask
        pins = bool(tag) and (bool(problems) or (got == b"1" and tag == first))
        if not pins:
            problems.append("reads name no version")
        return Capabilities(not problems, pins, "; ".join(problems) or
                            "honoured create-only and version preconditions")

    def _wrong_tag(self, tag: str | None) -> str:
        """A version tag the object does not have."""
        return "0x1" if not tag else tag + "1"

    # -- reads ------------------------------------------------------------------------------
    async def _aget_range(self, h: RemoteObject, start: int, end: int
                          ) -> tuple[bytes, str | None]:
        self.requests["range_get"] += 1
        data, tag = await self._vget(h.key, start, end, h.tag)
        if h.tag is not None and tag is not None and tag != h.tag:
            raise PreconditionFailed(f"{self.url}/{h.key}: served version {tag}, "
                                     f"pinned {h.tag}")  # the server ignored the condition
        return data, tag

    def _collect(self, spans: list[Span], got: list[Any]) -> list[bytes | None]:
        """Pins each handle to the tag its first read saw (where reads name versions); a
        refused or mismatched version, or two tags within this call, raise
        :class:`ObjectChanged` naming the handles."""
        return collect_pinned(spans, got, self.pins_versions)

    def get(self, key: str) -> bytes | None:
        got = self.get_tagged(key)
        return None if got is None else got[0]

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        self.requests["get"] += 1
        try:
            data, tag = self._sync(retrying, self, "GET", key, self._vget, key)
        except FileNotFoundError:
            return None
        if not self.pins_versions:  # the server's tags cannot be relied on: content tags
            return bytes(data), content_tag(data)
        if not tag:
            raise StorageError(f"{self.url}/{key}: the server named no version of the object")
        return bytes(data), tag

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.requests["get"] += len(keys)
        return [None if r is None else bytes(r[0]) for r in self._each(keys, self._vget)]

    # -- writes -----------------------------------------------------------------------------
    def _put(self, key: str, data: bytes) -> None:
        self.requests["put"] += 1
        self._sync(retrying, self, "PUT", key, self._vput, key, data)

    async def _aput(self, key: str, data: bytes) -> None:
        """One unconditional PUT through this backend's own upload (:meth:`put_many` runs
        up to ``max_uploads`` of them at once)."""
        self.requests["put"] += 1
        await self._vput(key, data)

    def put_if(self, key: str, data: bytes, match: str | None) -> str:
        """Create-only (``match=None``) or replace-only-version-``match``, decided by the
        server; read, compare, write where the endpoint does not honour preconditions."""
        if self.atomic_conditional_writes:
            self.requests["put"] += 1
            tag = self._sync(retrying, self, "conditional PUT", key, self._vput, key,
                             bytes(data), match)
        else:  # NOT atomic: two writers can both pass the check (leases are refused)
            cur = self.get_tagged(key)
            if (cur[1] if cur else None) != match:
                raise PreconditionFailed(f"{self.url}/{key}: expected version {match}, "
                                         f"found {cur[1] if cur else 'no object'}")
            self.requests["put"] += 1
            tag = self._sync(retrying, self, "PUT", key, self._vput, key, bytes(data))
            if not self.pins_versions:
                return content_tag(data)
        if not tag:
            got = self.get_tagged(key)
            raise StorageError(f"{self.url}/{key}: the server named no version of the "
                               f"written object (now {got[1] if got else 'missing'})")
        return tag

    async def _aput_if(self, key: str, data: bytes, match: str | None) -> str:
        """One conditional PUT decided by the server (create-only or this version only)."""
        self.requests["put"] += 1
        tag = await self._vput(key, data, match)
        if not tag:
            raise StorageError(f"{self.url}/{key}: the server named no version of the "
                               "written object")
        return tag

    def tag_of(self, key: str) -> str | None:
        """The object's version from a one-byte read (``None``: missing)."""
        if not self.pins_versions:
            return super().tag_of(key)
        self.requests["range_get"] += 1
        try:
            _, tag = self._sync(retrying, self, "GET", key, self._vget, key, 0, 1)
        except FileNotFoundError:
            return None
        return tag

    def delete(self, key: str) -> None:
        super().delete(key)
        self.fs.invalidate_cache(self._path(key))

    # -- metadata ---------------------------------------------------------------------------
    def _find(self, prefix: str, detail: bool) -> Any:
        base = self._path(prefix).rstrip("/")
        self.fs.invalidate_cache()
        self.requests["list"] += 1
        try:  # keywords: gcsfs's find() orders its positional parameters differently
            return self._call("LIST", prefix or "/", lambda: self.fs.find(
                base, maxdepth=None, withdirs=False, detail=detail))
        except FileNotFoundError:
            return {} if detail else []

    def size(self, key: str) -> int | None:
        self.fs.invalidate_cache(self._path(key))  # another process may have replaced it
        return super().size(key)
