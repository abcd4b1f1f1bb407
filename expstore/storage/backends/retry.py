"""Retries of storage requests: one policy, one error classification, one retry loop.

:func:`retrying` is the only loop. Asynchronous callers (requests issued on an fsspec
event loop) await it; synchronous callers run it with :func:`run_blocking`, which drives
the same coroutine without an event loop (the call is made directly, waits use
``time.sleep``).

Transient failures (connection refused or reset, timeouts, HTTP 5xx, throttling) are
retried with exponential backoff and jitter; after the last attempt a
:class:`~expstore.errors.StorageError` names the object and the last error. Permanent
failures (access denied, missing bucket) raise it at once, saying they were not retried.
``FileNotFoundError``, :class:`~expstore.errors.PreconditionFailed`,
:class:`~expstore.errors.ObjectChanged` and an already raised ``StorageError`` pass through;
a server's "precondition failed" (HTTP 412) becomes ``PreconditionFailed``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ...errors import ObjectChanged, PreconditionFailed, StorageError

T = TypeVar("T")

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
_PASS_THROUGH = (FileNotFoundError, PreconditionFailed, ObjectChanged, StorageError)


@dataclass
class RetryPolicy:
    """Retries of transient storage errors: ``attempts`` tries at most, waits growing from
    ``base`` by ``factor`` up to ``max_delay`` seconds (with jitter), never past ``deadline``
    seconds after the first try. An asynchronous request (S3) taking longer than ``timeout``
    seconds is abandoned and counts as a transient failure."""

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


class Retrying(Protocol):
    """What :func:`retrying` needs of a backend."""

    url: str
    retry: RetryPolicy
    requests: Counter[str]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def error_code(exc: BaseException) -> tuple[str | None, int | None]:
    """(S3 error code, HTTP status) of the first botocore ``ClientError`` in the chain."""
    for e in _chain(exc):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict) and ("Error" in resp or "ResponseMetadata" in resp):
            code = resp.get("Error", {}).get("Code")
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None), status
    return None, None


def is_precondition(exc: BaseException) -> bool:
    """The server refused a conditional request (HTTP 412 or an S3 conflict code)."""
    code, status = error_code(exc)
    return isinstance(exc, PreconditionFailed) or code in _PRECONDITION_CODES or status == 412


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: lost connections, timeouts, 5xx and throttling (not 4xx, not missing,
    not 501 "not implemented")."""
    code, status = error_code(exc)
    if code == "NotImplemented" or status == 501:
        return False
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


def failure(url: str, what: str, key: str, exc: BaseException, attempts: int | None,
            t0: float) -> StorageError:
    """The error naming the object, the request and the last error (``attempts=None``: a
    permanent error, not retried); ``t0`` is ``time.monotonic()`` of the first try."""
    tried = ("(a permanent error: not retried)" if attempts is None else
             f"after {attempts} attempt(s) in {time.monotonic() - t0:.1f} s")
    return StorageError(f"{url}/{key}: {what} failed {tried}: {type(exc).__name__}: {exc}")


async def retrying(owner: Retrying, what: str, key: str, fn: Callable[..., Any], *args: Any,
                   blocking: bool = False) -> Any:
    """``fn(*args)`` with ``owner.retry``'s retries; ``what``/``key`` name it in errors.

    ``blocking=False``: ``fn`` returns an awaitable, abandoned after ``retry.timeout`` s.
    ``blocking=True``: ``fn`` is a plain call; run this with :func:`run_blocking`.
    Each retry adds one to ``owner.requests["retried"]``.
    """
    t0 = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            if blocking:
                return fn(*args)
            return await asyncio.wait_for(fn(*args), owner.retry.timeout)
        except _PASS_THROUGH:
            raise
        except Exception as e:
            if is_precondition(e):
                raise PreconditionFailed(f"{owner.url}/{key}: {what}: the object changed "
                                         "(precondition failed)") from e
            if not is_transient(e):
                raise failure(owner.url, what, key, e, None, t0) from e
            policy = owner.retry
            wait = policy.delay(attempt)
            if attempt >= policy.attempts or time.monotonic() - t0 + wait > policy.deadline:
                raise failure(owner.url, what, key, e, attempt, t0) from e
            owner.requests["retried"] += 1
            if blocking:
                time.sleep(wait)
            else:
                await asyncio.sleep(wait)


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (``retrying(..., blocking=True)``) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("run_blocking: the coroutine awaited asynchronous work")
