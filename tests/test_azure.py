"""expstore on Azure Blob Storage: azurite (npm), started by the tests.

azurite honours ``If-None-Match: *`` and ``If-Match``: leases work, and of N processes
racing for a lane exactly one wins, every round.
"""

from __future__ import annotations

import pytest
from _object_store_cases import ObjectStoreCases

import expstore as es
from expstore.errors import LeaseUnsupportedError, PreconditionFailed
from expstore.storage.backends import AzureBackend, RetryPolicy, backend_for
from expstore.storage.ownership import acquire_all
from expstore.testing import TcpProxy
from expstore.testing.azure import azure_options, connection_string

pytest.importorskip("adlfs")


def test_azurite_honours_etag_preconditions(azurite):
    """Asked directly with the SDK, without expstore."""
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceExistsError, ResourceModifiedError
    from azure.storage.blob import BlobServiceClient

    with BlobServiceClient.from_connection_string(connection_string(azurite.endpoint)) as c:
        c.create_container("direct-preconditions")
        blob = c.get_blob_client("direct-preconditions", "k")
        tag = blob.upload_blob(b"1", overwrite=False)["etag"]
        with pytest.raises(ResourceExistsError):  # If-None-Match: * on an existing blob
            blob.upload_blob(b"2", overwrite=False)
        new = blob.upload_blob(b"3", overwrite=True, etag=tag,
                               match_condition=MatchConditions.IfNotModified)["etag"]
        with pytest.raises(ResourceModifiedError):  # If-Match with a stale ETag
            blob.upload_blob(b"4", overwrite=True, etag=tag,
                             match_condition=MatchConditions.IfNotModified)
        with pytest.raises(ResourceModifiedError):  # a ranged read pinned to a stale ETag
            blob.download_blob(offset=0, length=1, etag=tag,
                               match_condition=MatchConditions.IfNotModified).readall()
        assert blob.download_blob(etag=new, match_condition=MatchConditions.IfNotModified
                                  ).readall() == b"3"


def test_the_probe_finds_preconditions_honoured(az_url):
    b = backend_for(*az_url)
    caps = b.capabilities()
    assert caps.atomic and caps.pins and not caps.failed, caps
    assert b.list("") == []  # the probe's scratch object is gone
    with pytest.raises(PreconditionFailed):
        b.put_if("x", b"1", '"0x8D0000000000000"')  # If-Match on a missing blob
    assert b.get("x") is None


def test_the_provider_endpoint_is_trusted_without_a_probe():
    b = AzureBackend("az://c/store.zarr", {"account_name": "someaccount", "anon": True})
    assert b._trusted_endpoint() and b.atomic_conditional_writes and b.pins_versions
    local = AzureBackend("az://c/s.zarr", azure_options("http://127.0.0.1:9"))
    assert not local._trusted_endpoint()


def test_schemes(azurite):
    so = azurite.storage_options
    for scheme in ("az", "abfs"):
        assert type(backend_for(f"{scheme}://c/store.zarr", so)) is AzureBackend


def test_a_missing_container_is_a_clear_permanent_error(azurite):
    b = backend_for("az://no-such-container/s.zarr", azurite.storage_options)
    with pytest.raises(es.StorageError, match=r"no-such-container/s.zarr/x.*"
                       r"(bucket|not exist)"):
        b.put("x", b"1")
    assert b.requests["retried"] == 0


class TestStoreOnAzurite(ObjectStoreCases):
    backend_cls = AzureBackend
    atomic = True
    remote_fixture, server_fixture = "az_url", "azurite"
    options = staticmethod(azure_options)


def test_the_probe_rides_through_an_outage_or_says_it_cannot_tell(azurite, az_url):
    url, _ = az_url
    with TcpProxy(azurite.port) as proxy:
        so = azure_options(proxy.endpoint)
        proxy.cut()
        b = AzureBackend(url, so, retry=RetryPolicy(attempts=3, base=0.01, deadline=3))
        with pytest.raises(es.StorageError, match=r"az://.*cannot tell whether the endpoint "
                           r"honours conditional writes.*after 3 attempt"):
            b.atomic_conditional_writes  # noqa: B018
        proxy.restore()
        assert b.atomic_conditional_writes and b.pins_versions  # probed now, and honoured


def test_a_probe_refused_claims_nothing_and_is_re_run(azurite, az_url):
    """Wrong credentials (HTTP 403): no claim, leases refused saying why, and the failure
    stays with that backend: others on the endpoint are unaffected."""
    url, _ = az_url
    with TcpProxy(azurite.port) as proxy:  # an endpoint no backend has probed yet
        good = azure_options(proxy.endpoint)
        bad = {"connection_string": good["connection_string"].replace(
            "AccountKey=Eby8", "AccountKey=AAAA")}
        b = AzureBackend(url, bad)
        caps = b.capabilities()
        assert caps.failed and not caps.atomic and not caps.pins
        assert "probe failed" in caps.reason and b.requests["retried"] == 0  # permanent
        with pytest.raises(LeaseUnsupportedError, match="probe failed"):
            acquire_all(b, [0], 60.0)
        assert b.capabilities() is caps  # kept for probe_retry_after seconds
        b.probe_retry_after = 0.0
        again = b.capabilities()  # re-run, and refused again
        assert again is not caps and again.failed and not again.atomic
        assert AzureBackend(url, good).capabilities().atomic  # not cached for the endpoint
        assert b.capabilities().atomic  # the endpoint's result, once known, holds for all
