"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

# --- S3: a real S3-protocol server (moto's server mode) on loopback -------------------------


@pytest.fixture(scope="session")
def s3_server():
    """``python -m moto.server`` as a subprocess for the whole session: an object with
    ``endpoint``, ``port``, ``storage_options`` and ``create_bucket(name)``."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from expstore.testing import MotoServer

    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_server, request):
    """A fresh bucket on the session's moto server: ``(url, storage_options)``."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/store.zarr", dict(s3_server.storage_options)


@pytest.fixture
def s3_proxy(s3_server):
    """A loopback TCP proxy in front of the moto server that counts HTTP requests and can
    ``cut()`` / ``restore()`` the endpoint (moto keeps its objects meanwhile)."""
    from expstore.testing import TcpProxy

    proxy = TcpProxy(s3_server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
