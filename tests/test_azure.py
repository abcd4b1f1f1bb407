"""expstore on Azure Blob Storage: azurite (npm), started by the tests.

azurite honours ``If-None-Match: *`` and ``If-Match``: leases work, and of N processes
racing for a lane exactly one wins, every round.
"""

from __future__ import annotations

import pytest
from _object_store_cases import ObjectStoreCases

import expstore as es
from expstore.errors import PreconditionFailed
from expstore.storage.backends import AzureBackend, backend_for
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

    @pytest.fixture
    def remote(self, az_url):
        return az_url

    @pytest.fixture
    def server(self, azurite):
        return azurite

    def options_for(self, endpoint):
        return azure_options(endpoint)
