"""expstore on local Google Cloud Storage servers, started by the tests.

``fake-gcs-server`` honours ``ifGenerationMatch``: leases work, and of N processes racing
for a lane exactly one wins. ``gcp-storage-emulator`` ignores it: the backend finds that
out and refuses leases (one writer with ``lease_ttl=None``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from _object_store_cases import SPEC, ObjectStoreCases

import expstore as es
from expstore.errors import LeaseUnsupportedError, PreconditionFailed
from expstore.storage.backends import GCSBackend, backend_for
from expstore.testing.gcs import gcs_options

pytest.importorskip("gcsfs")


def _upload(endpoint: str, bucket: str, name: str, body: bytes, generation: str | None,
            multipart: bool = True) -> int:
    """One upload with ``ifGenerationMatch`` straight over HTTP: the HTTP status."""
    cond = "" if generation is None else f"&ifGenerationMatch={generation}"
    if multipart:
        meta = json.dumps({"name": name}).encode()
        data = (b"--b\r\nContent-Type: application/json\r\n\r\n" + meta +
                b"\r\n--b\r\nContent-Type: application/octet-stream\r\n\r\n" + body +
                b"\r\n--b--")
        url = f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=multipart{cond}"
        headers = {"Content-Type": 'multipart/related; boundary="b"'}
    else:
        data = body
        url = f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}{cond}"
        headers = {"Content-Type": "application/octet-stream"}
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _generation(endpoint: str, bucket: str, name: str) -> str:
    with urllib.request.urlopen(f"{endpoint}/storage/v1/b/{bucket}/o/{name}", timeout=10) as r:
        return json.loads(r.read())["generation"]


# -- what each emulator honours, asked directly over HTTP ----------------------------------------
def test_fake_gcs_server_honours_generation_preconditions(fake_gcs_server):
    ep, bucket = fake_gcs_server.endpoint, fake_gcs_server.create_bucket("direct-preconditions")
    assert _upload(ep, bucket, "k", b"1", "0") == 200
    assert _upload(ep, bucket, "k", b"2", "0") == 412  # exists: create-only refused
    gen = _generation(ep, bucket, "k")
    assert _upload(ep, bucket, "k", b"3", str(int(gen) + 1)) == 412  # wrong generation
    assert _upload(ep, bucket, "k", b"4", gen) == 200
    assert _upload(ep, bucket, "k", b"5", gen) == 412  # stale generation


def test_gcp_storage_emulator_ignores_generation_preconditions(gcs_server):
    ep, bucket = gcs_server.endpoint, gcs_server.create_bucket("direct-preconditions")
    assert _upload(ep, bucket, "k", b"1", "0") == 200
    for multipart in (True, False):
        assert _upload(ep, bucket, "k", b"2", "0", multipart) == 200  # not refused
        assert _upload(ep, bucket, "k", b"3", "12345", multipart) == 200


def test_the_probe_finds_out_which_server_honours_preconditions(gcs_url, fake_gcs_url):
    ignoring = backend_for(*gcs_url)
    caps = ignoring.capabilities()
    assert not caps.atomic and not caps.pins and not caps.failed
    assert "accepted a create-only write" in caps.reason
    assert ignoring.list("") == []  # the probe's scratch object is gone
    honouring = backend_for(*fake_gcs_url)
    caps = honouring.capabilities()
    assert caps.atomic and caps.pins, caps
    assert honouring.list("") == []
    with pytest.raises(PreconditionFailed):
        honouring.put_if("x", b"1", "123")  # If-Match on a missing object


def test_leases_on_an_emulator_without_preconditions_say_why(gcs_url):
    url, so = gcs_url
    with pytest.raises(LeaseUnsupportedError, match=r"gs://.*GCSBackend.*no atomic "
                       r"conditional writes.*accepted a create-only write.*lease_ttl=None"):
        es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so)


def test_the_provider_endpoint_is_trusted_without_a_probe(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    b = GCSBackend("gs://some-bucket/store.zarr", {"token": "anon"})  # no request made
    assert b._trusted_endpoint() and b.atomic_conditional_writes and b.pins_versions
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9")
    assert not b._trusted_endpoint()
    assert not GCSBackend("gs://b/s.zarr", gcs_options("http://127.0.0.1:9"))._trusted_endpoint()


def test_a_missing_bucket_is_a_clear_permanent_error(fake_gcs_server):
    b = backend_for("gs://no-such-bucket-expstore/s.zarr", fake_gcs_server.storage_options)
    with pytest.raises(es.StorageError, match=r"no-such-bucket-expstore/s.zarr/x.*"
                       r"(bucket|not exist)"):
        b.put("x", b"1")
    assert b.requests["retried"] == 0


class TestStoreOnFakeGcsServer(ObjectStoreCases):
    backend_cls = GCSBackend
    atomic = True
    remote_fixture, server_fixture = "fake_gcs_url", "fake_gcs_server"
    options = staticmethod(gcs_options)


# ~150 s: the second GCS emulator (pure Python); fake-gcs-server runs the same cases
@pytest.mark.slow
class TestStoreOnGcpStorageEmulator(ObjectStoreCases):
    backend_cls = GCSBackend
    atomic = False
    loader_methods = ("fork",)
    remote_fixture, server_fixture = "gcs_url", "gcs_server"
    options = staticmethod(gcs_options)
