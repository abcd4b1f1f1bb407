"""A loopback TCP proxy that adds a fixed latency to every HTTP request, for tests and
benchmarks of object storage as a learner sees it on another host.

:class:`LatencyProxy` forwards ``127.0.0.1:<port>`` to a local server (moto, an emulator)
and holds each HTTP request ``delay`` seconds before passing it on, so every request costs
at least one ``delay`` of wall time, as a same-region object store's first-byte latency
(10-50 ms) does. Requests on different connections are delayed independently (a client
with 16 connections has 16 requests in flight); a request body that follows an
``Expect: 100-continue`` answer is not delayed again. It counts requests and bytes both
ways like :class:`~expstore.testing.s3.TcpProxy`, and it is bounded: at most
``max_connections`` open at once (more are refused), and it stops by itself after
``lifetime`` seconds.
"""

from __future__ import annotations

import socket
import threading
import time

from .s3 import TcpProxy, _drop

#: a same-region object store's time to first byte (seconds)
DEFAULT_DELAY = 0.020


class LatencyProxy(TcpProxy):
    """:class:`TcpProxy` that delays each HTTP request by ``delay`` seconds.

    ``lifetime``: seconds after :meth:`start` when it stops by itself (``None``: never);
    ``max_connections``: client connections open at once, more are closed at once.
    ``delayed`` counts the requests held, ``bytes_up`` the bytes clients sent.
    """

    def __init__(self, target_port: int, delay: float = DEFAULT_DELAY,
                 port: int | None = None, host: str = "127.0.0.1",
                 lifetime: float | None = 900.0, max_connections: int = 512) -> None:
        if delay < 0:
            raise ValueError(f"LatencyProxy: delay must be >= 0 seconds, got {delay}")
        super().__init__(target_port, port, host)
        self.delay = float(delay)
        self.lifetime = lifetime
        self.max_connections = int(max_connections)
        self.delayed = 0
        self.bytes_up = 0
        self._timer: threading.Timer | None = None

    def start(self) -> LatencyProxy:
        super().start()
        if self.lifetime is not None and self._timer is None:
            self._timer = threading.Timer(self.lifetime, self.stop)
            self._timer.daemon = True
            self._timer.start()
        return self

    def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        super().stop()

    def stats(self) -> dict[str, int]:
        """Requests, bytes up and bytes down since the last :meth:`reset_count`."""
        with self._lock:
            return {"requests": self.requests, "bytes_up": self.bytes_up,
                    "bytes_down": self.bytes_down}

    def reset_count(self) -> int:
        with self._lock:
            self.bytes_up = 0
        return super().reset_count()

    def _admit(self, client: socket.socket) -> bool:
        """Up and under ``max_connections`` connection pairs (a refused one is reset)."""
        with self._lock:
            full = len(self._conns) >= 2 * self.max_connections
        if not self._up or full:
            _drop(client)
            return False
        return True

    def _sent(self, data: bytes, requests: int) -> None:
        """Counted; data that starts new HTTP requests waits ``delay`` first."""
        with self._lock:
            self.requests += requests
            self.delayed += requests
            self.bytes_up += len(data)
        if requests and self.delay:
            time.sleep(self.delay)
