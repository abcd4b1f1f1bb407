"""moto's S3 server with its conditional writes decided atomically, as S3 decides them.

Run as ``python -m expstore.testing.moto_atomic -H host -p port`` (moto's own arguments):
:class:`~expstore.testing.s3.MotoServer` starts it so. moto checks ``If-None-Match`` /
``If-Match`` and then stores the object as two steps, on the server's request threads, so
two racing conditional PUTs can both pass the check (the S3 backend's race test once
saw two creators of one key under CI's load). S3 itself decides a conditional write
atomically, and the lease tests are there to test the backend against that, not moto's
race: here every ``PutObject`` and every object ``POST`` (``CompleteMultipartUpload``,
which takes the same conditions) runs under one lock. Everything else is moto as is.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.RLock()


def _atomic(method: Callable[..., Any]) -> Callable[..., Any]:
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return method(self, *args, **kwargs)

    locked.__wrapped__ = method  # type: ignore[attr-defined]
    return locked


def patch() -> None:
    """Make moto's conditional writes atomic in this process (idempotent)."""
    from moto.s3.responses import S3Response

    for name in ("put_object", "_key_response_post"):
        method = getattr(S3Response, name)
        if not hasattr(method, "__wrapped__"):
            setattr(S3Response, name, _atomic(method))


def main(argv: list[str] | None = None) -> None:
    from moto import server

    patch()
    server.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
