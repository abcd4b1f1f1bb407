"""A local server run as a subprocess on loopback, for tests and benchmarks.

:class:`ServerProcess` starts the command a subclass names, in a scratch folder, waits until
its probe URL answers, and stops it (terminate, then kill after 10 s); it is a context
manager. :class:`~expstore.testing.s3.MotoServer`, :class:`~expstore.testing.gcs.GCSEmulator`
and :class:`~expstore.testing.azure.Azurite` are such servers.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """One server subprocess on ``host:port`` (a free port by default).

    Subclasses implement :meth:`command` and :meth:`probe_url`, and may override
    :meth:`prepare` (runs before the process starts) and :attr:`name`.
    """

    #: what error messages call the server
    name = "server"
    #: hint added when the process exits at once (what to install)
    install_hint = ""
    #: an HTTP error status from the probe URL also means the server is up
    http_error_is_up = False

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The server's command line."""
        raise NotImplementedError

    def probe_url(self) -> str:
        """A URL the server answers once it is up."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Runs before the process starts (install, configure clients)."""

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.probe_url(), timeout=2) as r:
                r.read()
            return True
        except urllib.error.HTTPError:
            return self.http_error_is_up
        except OSError:
            return False

    def start(self, timeout: float = 30.0) -> Any:
        """Start the process in a scratch folder; wait up to ``timeout`` seconds for it to
        answer (``RuntimeError`` if it exits or stays silent). Returns ``self``."""
        self.prepare()
        cmd = self.command()
        self._tmp = tempfile.TemporaryDirectory(prefix=f"expstore-{self.name}-")
        self.proc = subprocess.Popen(cmd, cwd=self._tmp.name, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"{self.name} exited with code {code}{self.install_hint}")
            if self._answers():
                return self
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"{self.name} on {self.endpoint} did not answer within "
                                   f"{timeout:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Terminate the process (kill it after 10 s) and remove its scratch folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
