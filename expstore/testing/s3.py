"""A local S3-protocol endpoint for tests, benchmarks and examples (needs ``moto[server]``).

:class:`MotoServer` runs moto's server (``moto_atomic.py``: its conditional writes atomic, as
S3's are) as a subprocess on loopback.
:class:`TcpProxy` sits in front of it: it counts HTTP requests and can *cut* the endpoint
(refuse new connections, drop open ones) and restore it, which is what a client sees when
an S3 server restarts — while moto, behind it, keeps its in-memory objects.
"""

from __future__ import annotations

import re
import socket
import struct
import sys
import threading
import urllib.request
from typing import Any

from .server import ServerProcess, free_port

_REQUEST_LINE = re.compile(rb"(?:GET|PUT|HEAD|POST|DELETE) /[^ \r\n]* HTTP/1\.[01]\r\n")


def s3_options(endpoint: str) -> dict[str, Any]:
    """``storage_options`` for s3fs against a local endpoint with moto's fake credentials."""
    return {"key": "testing", "secret": "testing", "endpoint_url": endpoint,
            "client_kwargs": {"region_name": "us-east-1"}}


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the endpoint (one PUT, no SDK needed)."""
    req = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


class MotoServer(ServerProcess):
    """moto's S3 server (``python -m expstore.testing.moto_atomic``) on ``host:port`` (a
    free port by default)."""

    name = "moto server"
    install_hint = " (is moto[server] installed?)"

    @property
    def storage_options(self) -> dict[str, Any]:
        return s3_options(self.endpoint)

    def command(self) -> list[str]:
        # (moto's server, its conditional writes atomic as S3's are: moto_atomic.py)
        return [sys.executable, "-m", "expstore.testing.moto_atomic", "-H", self.host,
                "-p", str(self.port)]

    def probe_url(self) -> str:
        return f"{self.endpoint}/moto-api/"

    def create_bucket(self, bucket: str) -> str:
        create_bucket(self.endpoint, bucket)
        return bucket


def _drop(sock: socket.socket, reset: bool = True) -> None:
    """Close a connection (``reset``: with RST, as a dying server's would); wakes any
    thread blocked on it."""
    if reset:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class TcpProxy:
    """Loopback TCP proxy to ``target_port`` that counts HTTP requests (``requests``) and
    bytes sent back to clients (``bytes_down``), and can be cut."""

    def __init__(self, target_port: int, port: int | None = None,
                 host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = port or free_port(host)
        self.requests = 0
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._up = False

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return s3_options(self.endpoint)

    def start(self) -> TcpProxy:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self.port))
        ls.listen(128)
        self._listener = ls
        self._up = True
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()
        return self

    def cut(self) -> None:
        """The endpoint goes away: new connections are refused, open ones are reset."""
        self._up = False
        ls, self._listener = self._listener, None
        if ls is not None:
            try:
                ls.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            ls.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            _drop(c)

    def restore(self) -> None:
        """The endpoint is back on the same port."""
        if not self._up:
            self.start()

    def stop(self) -> None:
        self.cut()

    def reset_count(self) -> int:
        """Requests since the last reset (``bytes_down`` restarts too)."""
        with self._lock:
            n, self.requests, self.bytes_down = self.requests, 0, 0
        return n

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            if not self._admit(client):
                continue
            try:
                upstream = socket.create_connection((self.host, self.target_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                _drop(client)
                continue
            with self._lock:
                if not self._up:  # cut while we were connecting
                    _drop(client)
                    _drop(upstream)
                    continue
                self._conns.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _admit(self, client: socket.socket) -> bool:
        """Whether to serve a new connection (a refused one is closed here)."""
        if not self._up:
            client.close()
            return False
        return True

    def _sent(self, data: bytes, requests: int) -> None:
        """Client-to-server ``data`` holding the starts of ``requests`` HTTP requests, about
        to be forwarded: counted."""
        if requests:
            with self._lock:
                self.requests += requests

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        """Forward ``src`` to ``dst``; client-to-server (``count``) data goes through
        :meth:`_sent` first, with the HTTP requests it starts."""
        tail = b""
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if count:
                    buf = tail + data
                    n = sum(1 for m in _REQUEST_LINE.finditer(buf) if m.end() > len(tail))
                    tail = buf[-64:]
                    self._sent(data, n)
                else:
                    with self._lock:
                        self.bytes_down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _drop(src, reset=False)
            _drop(dst, reset=False)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
