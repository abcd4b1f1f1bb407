"""Shared pytest fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# the conformance suites' asserts say what they compared, as in test modules
pytest.register_assert_rewrite("expstore.testing.backend", "expstore.testing.sampler")

# SB3's logger makes an empty folder in the system's temp folder for every model built
# without a log folder (SB3-<date>): this test process's models share one, removed at exit
_SB3_LOGS = tempfile.mkdtemp(prefix="expstore-tests-sb3-logs-")
os.environ.setdefault("SB3_LOGDIR", _SB3_LOGS)
atexit.register(shutil.rmtree, _SB3_LOGS, True)

# --- S3: a real S3-protocol server (moto's server mode) on loopback -------------------------


@pytest.fixture
def general_reads(monkeypatch):
    """Plans read the general way (``read_columns`` in ``assemble_batches``): a count."""
    from expstore.loading import execute

    calls = [0]
    real = execute.read_columns

    def counting(*args, **kw):
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(execute, "read_columns", counting)
    return calls


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server (``MotoServer``: conditional writes atomic, as S3's are) as a
    subprocess for the whole session: an object with
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


# --- GCS and Azure: local emulators, started by the tests ------------------------------------
def _bucket_name(request) -> str:
    import re
    import uuid

    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _gcs_server(flavour: str):
    pytest.importorskip("gcsfs")
    from expstore.testing import GCSEmulator

    try:
        server = GCSEmulator(flavour).start()
    except RuntimeError as e:
        pytest.skip(f"{flavour} cannot run here: {e}")
    return server


@pytest.fixture(scope="session")
def gcs_server():
    """``gcp-storage-emulator`` (ignores generation preconditions) for the session."""
    server = _gcs_server("gcp-storage-emulator")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fake_gcs_server():
    """``fake-gcs-server`` (honours ``ifGenerationMatch`` on uploads) for the session."""
    server = _gcs_server("fake-gcs-server")
    yield server
    server.stop()


@pytest.fixture
def gcs_url(gcs_server, request):
    """A fresh bucket on gcp-storage-emulator: ``(url, storage_options)``."""
    return f"gs://{gcs_server.create_bucket(_bucket_name(request))}/store.zarr", \
        dict(gcs_server.storage_options)


@pytest.fixture
def fake_gcs_url(fake_gcs_server, request):
    """A fresh bucket on fake-gcs-server: ``(url, storage_options)``."""
    return f"gs://{fake_gcs_server.create_bucket(_bucket_name(request))}/store.zarr", \
        dict(fake_gcs_server.storage_options)


@pytest.fixture(scope="session")
def azurite():
    """azurite's blob service in memory for the session (installed with npm if missing)."""
    pytest.importorskip("adlfs")
    from expstore.testing import Azurite

    try:
        server = Azurite().start()
    except (RuntimeError, OSError) as e:
        pytest.skip(f"azurite cannot run here: {e}")
    yield server
    server.stop()


@pytest.fixture
def az_url(azurite, request):
    """A fresh container on azurite: ``(url, storage_options)``."""
    name = _bucket_name(request)[:63].rstrip("-")
    return f"az://{azurite.create_container(name)}/store.zarr", dict(azurite.storage_options)


def pytest_sessionfinish(session, exitstatus):
    """Close the clients fsspec filesystems (adlfs, gcsfs) left to finalizers while fsspec's
    event loop still runs: run at interpreter exit, they fail with 'Loop is not running'."""
    import weakref

    try:
        from fsspec.asyn import sync
    except ImportError:
        return
    for fin in list(weakref.finalize._registry):  # noqa: SLF001 - no public listing
        info = weakref.finalize._registry.get(fin)
        if info is not None and info.func is sync:
            try:
                fin()
            except Exception:  # noqa: BLE001 - a client already gone: nothing to close
                pass
